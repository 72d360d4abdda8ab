"""Rolling changes: one serving group at a time behind the router, the first one the canary.

A deployment with a router and more than one engine group (replicas; prefill and decode groups) changes a group
whose engine is running by moving it, one group after the other in a fixed order (prefill, decode, server; then
group and instance, the ``roll_order`` of every host of the run), through the router's own worker API
(sglang-router's ``GET /workers``, ``DELETE /workers/{id}``, ``POST /workers``):

1. the router is asked for its workers (a router that cannot be reached stops the roll before any engine is
   touched);
2. the group's rank 0 leaves the router; its in-flight requests drain (SGLang's ``GET /v1/loads``, bounded by
   ``drain_timeout_s``; the requests still running then are cut, and said);
3. every rank stops, its staged files become live (systemd reloads when it says so), every rank starts (rank 0
   first): a multi-node group moves as one, never a mix of configurations;
4. the gate: /health (roles/health.py), the listening port held by the unit's own process (its cgroup), not by
   whatever holds the port, and one real generation through the engine (``POST /generate``);
5. the group goes back into the router, then the next group's turn.

The first group that restarts is the canary: a group rolls only once every group before it passed, so a canary that
fails its gate is rolled back to its last good configuration (roles/rollback.py), put back into the router, and
the deploy stops non-zero saying ``CANARY FAILED`` with the journal lines; no other group restarted. A group left
out of the router by a killed run is put back by the rerun (its configuration is then the live one: the rerun
only re-adds it). A group whose unit is not running (a first deploy) is started by the launch's wave instead,
and a deployment with one group restarts in place: the plan names that an outage.

The HTTP calls run on the hosts (files/bin/ironserve-roll, shipped as ``python3 -c``, reading the API key from the
unit's 0600 env file); the worker URLs are the rendered ones, passed as quoted arguments, never as commands.

Host data: ``roll_max_groups`` (groups moved at once; only 1 is implemented: the host data's validation refuses
more), ``drain_timeout_s``.
"""

from __future__ import annotations

import json
import shlex
import time

from pyinfra import context, host
from pyinfra.api import FactBase, FunctionCommand, operation

from ironserve.render import Process, Rendered
from ironserve.resources import files_dir
from ironserve.units import deliberate, env_path, in_container, rank_guard_unit, staged_path
from roles import rollback, undeclared
from roles.common import UnitState, in_run, uses_sudo
from roles.context import DeploymentContext, host_data
from roles.health import _sleep, await_health
from roles.live_config import StagedFiles, install_command, reload_command

ROLL_SCRIPT = (files_dir() / "bin" / "ironserve-roll").read_text()
ROLE_ORDER = {"prefill": 0, "decode": 1, "server": 2}
GROUP_RESTARTS_ALLOWED = 2  # as the launch's gate of a multi-node group (roles/launch.py)


# --------------------------------------------------------------------------- plan (pure)


def roll_groups(rendered: Rendered) -> list[list[Process]]:
    """The engine groups behind the router in roll order, each in rank order; [] when the deployment does not
    roll (no router, or a single group: that one restarts in place)."""
    engines = sorted(
        (p for p in rendered.processes if p.role != "router"),
        key=lambda p: (ROLE_ORDER.get(p.role, 3), p.group, p.instance, p.node_rank),
    )
    groups: dict[str, list[Process]] = {}
    for proc in engines:
        groups.setdefault(proc.group_key, []).append(proc)
    if len(groups) < 2 or not any(p.role == "router" for p in rendered.processes):
        return []
    return list(groups.values())


def worker_url(proc: Process) -> str:
    """The URL the router knows the group by (the render's --worker-urls / --prefill / --decode)."""
    return f"http://{proc.address}:{proc.port}"


def worker_fields(ctx: DeploymentContext, proc: Process) -> dict:
    """What POST /workers needs beyond the URL: a prefill or decode group's type (and its bootstrap port)."""
    if proc.role == "prefill":
        group = ctx.recipe.topology.groups[proc.group]
        return {"worker_type": "prefill", "bootstrap_port": group.bootstrap_port + proc.instance}
    if proc.role == "decode":
        return {"worker_type": "decode"}
    return {}


def group_files(ctx: DeploymentContext, proc: Process, live_files) -> list[list[str]]:
    return [[staged_path(path), path, mode] for path, _, mode in live_files(ctx, proc)]


def roll_plan(
    ctx: DeploymentContext, group: list[Process], live_files, config_paths, replaces: list[str] | None = None
) -> dict:
    """Everything the roll of one group needs while it runs, as plain data (fixtures, --dry)."""
    router = next(p for p in ctx.rendered.processes if p.role == "router")
    order = [g[0].group_key for g in roll_groups(ctx.rendered)]
    head = group[0]
    return {
        "group": head.group_key,
        "order": order,
        "unit": head.unit,
        "host": head.host,
        "worker": worker_url(head),
        "worker_fields": worker_fields(ctx, head),
        "health": head.health_url,
        "base": head.local_url(""),
        "env": env_path(head),
        "port": head.port,
        "members": [
            {
                "host": p.host,
                "unit": p.unit,
                "files": group_files(ctx, p, live_files),
                "paths": config_paths(p),
                "guard": rank_guard_unit(p) if p.in_rank_group else None,
            }
            for p in group
        ],
        "router": {"host": router.host, "base": router.local_url(""), "env": env_path(router)},
        # a container's processes are in docker's cgroup, not the unit's: the listener check needs the unit's own
        "own_listener": not in_container(ctx.recipe, head),
        "timeout_s": ctx.recipe.health_timeout_s,
        "drain_timeout_s": ctx.host.drain_timeout_s,
        # a recipe switch: the other recipe's engine on this host that the group takes the place of (port, devices)
        "replaces": list(replaces or []),
    }


def step_name(plan: dict) -> str:
    """The operation's name says the order and the canary (what `--dry` shows per group)."""
    place = plan["order"].index(plan["group"]) + 1
    canary = " (the canary: no other group moves unless it passes)" if place == 1 else ""
    return (
        f"Roll {plan['unit']}: group {place} of {len(plan['order'])}{canary}: out of the router, drained, "
        f"restarted on its staged configuration, gated, back in"
    )


# --------------------------------------------------------------------------- facts


class RouterWorkers(FactBase):
    """The router's workers as its own API lists them: {"urls": [...]} or {"error": why} when it cannot be
    reached (read on the router host, with the router's key from its env file)."""

    def command(self, base, env):
        return roll_script("workers", base, env) + "; true"

    def process(self, output):
        try:
            answer = json.loads(output[-1]) if output else {}
        except ValueError:
            return {"error": output[-1][:300]}
        if "error" in answer:
            return {"error": answer["error"]}
        return {"urls": sorted(w.get("url", "") for w in answer.get("workers", []))}


# --------------------------------------------------------------------------- operation


@operation()
def group_rolled(plan: dict, pending=False, rolls: dict | None = None, workers: dict | None = None):
    """The group's running engine runs its staged configuration and is in the router, moved one group at a time.

    While planning: the staged files of rank 0 (this host) against the live ones (live_config.StagedFiles), a
    live file newer than the unit's start (a run killed between making it live and restarting), ``pending``
    (bool or callable: this run rewrites a staged file or the runtime, the facts predate it), and ``workers``
    (the router's list, RouterWorkers: a group a killed run left out of the router is put back). Nothing to do:
    a no-op. Else the roll runs when the operation executes, in its turn (``rolls``: the run's shared record, see
    roll_group; a group with nothing to do says so there while the run executes, so the groups after it go on)."""
    files = plan["members"][0]["files"]
    sums = host.get_fact(StagedFiles, pairs=[[s, live] for s, live, _ in files])
    differs = [live for s, live, _ in files if sums.get(s) != sums.get(live) or not sums.get(live)]
    state = host.get_fact(UnitState, unit=plan["unit"], paths=[live for _, live, _ in files])
    since = state.get("since")
    stale = [p for p, t in (state.get("mtimes") or {}).items() if since and t > since]
    out = "urls" in (workers or {}) and plan["worker"] not in workers["urls"]
    down = state.get("active") not in ("active", "activating", "reloading")  # a run killed after its stop
    if not (differs or stale or out or down or (pending() if callable(pending) else pending)):
        host.noop(f"{plan['unit']}: runs its staged configuration; stays in the router")
        if rolls is not None and getattr(context.state, "is_executing", False):
            rolls[plan["group"]] = "unchanged"
        return
    yield FunctionCommand(
        roll_group, (plan, rolls if rolls is not None else {}, bool(differs or stale or down) or pending), {}
    )


# --------------------------------------------------------------------------- execution


def roll_script(action: str, *args: str) -> str:
    """The host command of one HTTP step: python3 -c the shipped script, every argument quoted."""
    return " ".join(shlex.quote(a) for a in ("python3", "-c", ROLL_SCRIPT, action, *args))


def run_roll(on_host, action: str, *args: str) -> tuple[bool, dict]:
    ok, out = on_host.run_shell_command(roll_script(action, *map(str, args)), _sudo=uses_sudo(on_host))
    text = "\n".join(out.stdout_lines).strip().splitlines()
    try:
        answer = json.loads(text[-1]) if text else {}
    except ValueError:
        answer = {"error": text[-1][:300]}
    if not ok and "error" not in answer:
        answer["error"] = " ".join(out.stderr_lines)[-300:] or "failed"
    return ok and "error" not in answer, answer


def await_turn(state, host, plan: dict, rolls: dict) -> tuple[str | None, bool]:
    """Wait until every group before this one in the roll order that has a roll in this run (``rolls["groups"]``,
    listed while planning) has an outcome. Returns (the group that failed or None, whether one before rolled).
    A group whose host failed counts as failed; the wait is bounded by the longest the groups before could take."""
    before = plan["order"][: plan["order"].index(plan["group"])]
    groups = [g for g in before if g in rolls.get("groups", ())]
    deadline = time.monotonic() + len(groups) * (plan["timeout_s"] + plan["drain_timeout_s"] + 600)
    for group in groups:
        while group not in rolls:
            failed_hosts = {h.name for h in getattr(state, "failed_hosts", ())}
            if rolls.get(f"host:{group}") in failed_hosts or time.monotonic() > deadline:
                rolls[group] = "failed"
                break
            _sleep(1)
        if rolls[group] == "failed":
            return group, False
    return None, any(rolls.get(g) == "rolled" for g in groups)


def roll_group(state, host, plan: dict, rolls: dict, restart=True) -> bool:
    """Execution of group_rolled: its turn, the roll, the outcome for the groups after it (rolls[group]: rolled,
    readded, unchanged or failed). The canary is the first group that restarts an engine."""
    group = plan["group"]
    failed, rolled_before = await_turn(state, host, plan, rolls)
    if failed:
        host.log_styled(
            f"{plan['unit']}: NOT ROLLED: {failed} before it failed its roll; this group was not "
            f"touched and keeps serving its previous configuration",
            fg="red",
        )
        rolls[group] = "failed"
        return False
    restart = bool(restart() if callable(restart) else restart) or _changed_now(state, plan)
    ok = _roll(state, host, plan, canary=restart and not rolled_before, restart=restart)
    rolls[group] = ("rolled" if restart else "readded") if ok else "failed"
    return ok


def _members(state, plan: dict) -> list:
    return [(state.inventory.get_host(m["host"]), m) for m in plan["members"]]


def _sh(on_host, command: str) -> tuple[bool, str]:
    ok, out = on_host.run_shell_command(command, _sudo=uses_sudo(on_host))
    return ok, "\n".join(out.stdout_lines + out.stderr_lines)


def _changed_now(state, plan: dict) -> bool:
    """Judged when the roll runs: does a staged file of any rank differ from its live one?"""
    for member_host, m in _members(state, plan):
        pairs = [[s, live] for s, live, _ in m["files"]]
        _, text = _sh(member_host, StagedFiles().command(pairs))
        sums = StagedFiles().process(text.splitlines())
        if any(sums.get(s) != sums.get(live) or not sums.get(live) for s, live in pairs):
            return True
    return False


def _roll(state, host, plan: dict, canary: bool, restart: bool = True) -> bool:
    router = state.inventory.get_host(plan["router"]["host"])
    rbase, renv = plan["router"]["base"], plan["router"]["env"]
    ok, answer = run_roll(router, "workers", rbase, renv)
    if not ok:
        host.log_styled(
            f"{plan['unit']}: NOT ROLLED: the router {plan['router']['host']} ({rbase}) cannot be "
            f"reached ({answer['error']}); no engine was touched",
            fg="red",
        )
        return False
    if not restart:
        # a killed run's leftover: the group runs its configuration but is out of the router
        ok, answer = run_roll(router, "add", rbase, renv, plan["worker"], json.dumps(plan["worker_fields"]))
        host.log_styled(
            f"{plan['unit']}: "
            + (
                "put back into the router (a run before left it out)"
                if ok
                else f"NOT BACK IN THE ROUTER: {answer.get('error')}"
            ),
            fg="green" if ok else "red",
        )
        return ok
    out_at = time.monotonic()
    ok, answer = run_roll(router, "remove", rbase, renv, plan["worker"])
    if not ok:
        host.log_styled(
            f"{plan['unit']}: NOT ROLLED: the router did not remove {plan['worker']} "
            f"({answer['error']}); no engine was touched",
            fg="red",
        )
        return False
    _, drained = run_roll(host, "drain", plan["base"], plan["env"], plan["drain_timeout_s"])
    if "error" in drained:
        host.log(f"{plan['unit']}: out of the router; its in-flight requests unknown ({drained['error']})")
    else:
        style = "red" if drained["cut"] else "green"
        host.log_styled(
            f"{plan['unit']}: out of the router; drained {drained['in_flight']} in-flight request(s) in "
            f"{drained['drain_s']}s, {drained['cut']} cut at the {plan['drain_timeout_s']}s drain "
            f"timeout",
            fg=style,
        )
    passed, why = _restart_on_staged(state, host, plan)
    if passed:
        for member_host, m in _members(state, plan):
            _sh(member_host, rollback.save_command(m["unit"], m["paths"]))  # its last good configuration now
        for unit in plan.get("replaces", []):
            _sh(host, undeclared.purge_command(unit))
    else:
        _fail(state, host, plan, why, canary)
        _restore_replaced(state, host, plan)
    ok, answer = run_roll(router, "add", rbase, renv, plan["worker"], json.dumps(plan["worker_fields"]))
    away = time.monotonic() - out_at
    if not ok:
        host.log_styled(
            f"{plan['unit']}: NOT BACK IN THE ROUTER after {away:.0f}s: {answer['error']} (the rerun puts it back)",
            fg="red",
        )
        return False
    host.log_styled(
        f"{plan['unit']}: back in the router after {away:.1f}s out of it"
        + ("" if passed else " (on its last good configuration)"),
        fg="green" if passed else "yellow",
    )
    return passed


def _restart_on_staged(state, host, plan: dict) -> tuple[bool, str]:
    """Stop every rank, make its staged files live, start every rank (rank 0 first), gate rank 0."""
    members = _members(state, plan)
    for unit in plan.get("replaces", []):
        ok, out = _sh(host, undeclared.retire_command(unit))
        if not ok:
            return False, f"retiring {unit} (the unit this group replaces) failed: {out[-300:]}"
        host.log(f"{plan['unit']}: {unit} stopped, disabled and set aside (it is put back if this group fails)")
    for member_host, m in reversed(members):
        units = [m["unit"]] + ([m["guard"]] if m["guard"] else [])
        names = " ".join(shlex.quote(u + ".service") for u in units)
        # a unit a switch starts for the first time is not loaded yet: nothing to stop is fine, one left running not
        steps = [
            f"systemctl stop {names} 2>/dev/null || ! systemctl is-active -q {names}",
            *(install_command(s, live, mode) for s, live, mode in m["files"]),
            reload_command([f"{u}.service" for u in units]),
            f"systemctl enable {names}",
        ]
        ok, out = _sh(member_host, " && ".join(f"{{ {s}; }}" for s in steps))
        if not ok:
            return False, f"making the staged configuration live on {member_host.name} failed: {out[-300:]}"
    for member_host, m in members:
        units = [m["unit"]] + ([m["guard"]] if m["guard"] else [])
        for unit in units:
            ok, out = _sh(member_host, deliberate("start", unit))
            if not ok:
                return False, f"starting {unit} on {member_host.name} failed: {out[-300:]}"
    allowed = GROUP_RESTARTS_ALLOWED if len(members) > 1 else 0
    healthy, why = await_health(state, host, plan["unit"], plan["health"], plan["timeout_s"], restarts_allowed=allowed)
    if not healthy:
        return False, why
    # the 200 came from the unit it started: every listener on the port is in the unit's cgroup
    ok, answer = run_roll(host, "owns-port", plan["port"], plan["unit"]) if plan["own_listener"] else (True, {})
    if not ok:
        return False, f"healthy, but not the unit it started that answers: {answer['error']}"
    ok, answer = run_roll(host, "generate", plan["base"], plan["env"])
    if not ok:
        return False, f"healthy, but no generation through the engine ({answer['error']})"
    host.log_styled(
        f"{plan['unit']}: healthy, its own process on port {plan['port']}, one generation answered", fg="green"
    )
    return True, ""


def _fail(state, host, plan: dict, why: str, canary: bool) -> None:
    """The failed gate: journal, rollback of the whole group to its last good configuration, said loudly."""
    lines = host_data(host).health_journal_lines
    _, journal = _sh(host, f"journalctl -u {shlex.quote(plan['unit'] + '.service')} -n {lines} --no-pager")
    label = "CANARY FAILED" if canary else "ROLL FAILED"
    host.log_styled(
        f"{label}: {plan['unit']} on {host.name}: {why}; no group after it is touched. Last journal lines:\n{journal}",
        fg="red",
    )
    members = [(m["host"], m["unit"], m["paths"]) for m in plan["members"]]
    allowed = GROUP_RESTARTS_ALLOWED if len(members) > 1 else 0
    rollback.roll_back(
        state,
        host,
        plan["unit"],
        plan["health"],
        plan["timeout_s"],
        members,
        why,
        lambda st, h, u, url, t: await_health(st, h, u, url, t, restarts_allowed=allowed)[0],
    )


def _restore_replaced(state, host, plan: dict) -> None:
    """A switch whose new group failed: the new unit stops, the one it replaced comes back on its port."""
    if not plan.get("replaces"):
        return
    _sh(host, f"systemctl disable --now {shlex.quote(plan['unit'] + '.service')}")
    for unit in plan["replaces"]:
        ok, out = _sh(host, undeclared.restore_command(unit))
        healthy = ok and await_health(state, host, unit, plan["health"], plan["timeout_s"])[0]
        host.log_styled(
            f"{plan['unit']}: RESTORED {unit}, the unit it was to replace"
            + (" (healthy)" if healthy else f": NOT healthy ({out[-200:]})"),
            fg="yellow" if healthy else "red",
        )


# --------------------------------------------------------------------------- launch


def rolling_procs(ctx: DeploymentContext, paths) -> list[Process]:
    """This host's engine processes that roll: in a group of a rolling deployment and running now (a stopped
    one has nothing to take out of the router: the launch's wave starts it)."""
    groups = {p.unit: g[0] for g in roll_groups(ctx.rendered) for p in g}
    procs = []
    for proc in ctx.processes:
        if proc.unit in groups:
            state = host.get_fact(UnitState, unit=proc.unit, paths=paths(proc))
            if (
                state["active"] in ("active", "activating", "reloading")
                or _left_out(ctx, groups[proc.unit])
                or replaces(ctx, proc)
            ):
                procs.append(proc)
    return procs


def replaces(ctx: DeploymentContext, proc: Process) -> list[str]:
    """A recipe switch that rolls: a single-node group whose unit does not run yet, on a host where another
    recipe's engine runs, behind a router that lists the group's URL (the old engine answers there): the group
    takes the old engine's place through that router. Else [] (the launch's wave removes the old, starts the new)."""
    if proc.nnodes > 1 or proc.node_rank:
        return []
    old = undeclared.replaced_units(ctx.processes)
    router = next(p for p in ctx.rendered.processes if p.role == "router")
    workers = router_workers({"host": router.host, "base": router.local_url(""), "env": env_path(router)})
    return old if old and worker_url(proc) in (workers or {}).get("urls", []) else []


def _left_out(ctx: DeploymentContext, head: Process) -> bool:
    """A stopped group that a reachable router does not list: a roll killed between its stop and its return (the
    rerun finishes the roll, back into the router); a first deploy's router is not up yet, so it starts."""
    router = next(p for p in ctx.rendered.processes if p.role == "router")
    workers = router_workers({"host": router.host, "base": router.local_url(""), "env": env_path(router)})
    return "urls" in (workers or {}) and worker_url(head) not in workers["urls"]


def apply(ctx: DeploymentContext, procs: list[Process], live_files, config_paths, pending) -> dict:
    """One group_rolled per group whose rank 0 is one of ``procs`` (the ranks > 0 move with it). Returns
    unit -> the operation (its change restarts the unit: the launch saves its last good configuration after)."""
    ops = {}
    for group in roll_groups(ctx.rendered):
        head = group[0]
        if head not in procs:
            continue
        running = host.get_fact(UnitState, unit=head.unit, paths=[])["active"] in ("active", "activating")
        plan = roll_plan(ctx, group, live_files, config_paths, [] if running else replaces(ctx, head))
        # while planning (every host of the run, before any executes): the groups that take turns, and their hosts
        ctx.rolls.setdefault("groups", []).append(plan["group"])
        ctx.rolls[f"host:{plan['group']}"] = head.host
        op = group_rolled(
            name=step_name(plan),
            plan=plan,
            rolls=ctx.rolls,
            pending=pending(head),
            workers=router_workers(plan["router"]),
        )
        for proc in group:
            ops[proc.unit] = op
    return ops


def router_workers(router: dict) -> dict | None:
    """The router's workers, read on the router host while planning (None: that host is not in this run)."""
    if not in_run(router["host"]):
        return None
    return context.inventory.get_host(router["host"]).get_fact(RouterWorkers, base=router["base"], env=router["env"])


def plan_line(rendered: Rendered) -> list[str]:
    """The roll in words, for the plan: the order, the canary; or why the deployment restarts in place."""
    groups = roll_groups(rendered)
    if not groups:
        return ["one engine group (or no router): a change restarts it in place: an outage for its length"]
    return [
        f"{i + 1}. {g[0].unit} ({len(g)} rank(s))" + (": the canary" if i == 0 else "") for i, g in enumerate(groups)
    ]
