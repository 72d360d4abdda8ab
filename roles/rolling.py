"""Rolling changes: the serving groups behind the router move a step at a time, the first one the canary, alone.

A deployment with a router and more than one engine group (replicas; prefill and decode groups) changes a group
whose engine is running by moving it through the router's own worker API (sglang-router's ``GET /workers``,
``DELETE /workers/{id}``, ``POST /workers``), in a fixed order (prefill, decode, server; then group and instance)
cut into steps (``roll_steps``): the first group alone (the canary), then at most ``roll_max_groups`` groups a
step, never every group of one role at once (the router keeps one of each; the only group of its role, a 1P1D
deployment's prefill, moves alone, and the plan names that step an outage). A multi-node group moves as one. Each
group of a step, at once:

1. the router is asked for its workers (a router that cannot be reached stops the roll before any engine is
   touched);
2. the group's rank 0 leaves the router; its in-flight requests drain (SGLang's ``GET /v1/loads``, bounded by
   ``drain_timeout_s``; the requests still running then are cut, and said);
3. every rank stops, its staged files become live (systemd reloads when it says so), every rank starts (rank 0
   first): never a mix of configurations;
4. the gate: /health (roles/health.py), the listening port held by the unit's own process (its cgroup; a
   container's: the running container the unit started, files/bin/ironserve-roll ``owns-port``), not by whatever
   holds the port, and one real generation through the engine (``POST /generate``); the canary with host data
   ``canary_bench``: a short benchmark within ``bench_min_ratio`` of its figures before the change
   (roles/canary_bench.py);
5. the group goes back into the router.

Each step is one operation that every host holding a group's rank 0 runs (pyinfra runs an operation on every host
before the next one), so a step starts once every group of the steps before it is back in the router. The first
group that restarts is the canary: the groups after it wait for its outcome, so a canary that fails is rolled
back to its last good configuration (roles/rollback.py), put back into the router, and the deploy stops non-zero
saying ``CANARY FAILED`` with the journal lines; no other group restarted. A group after a failed one is not
touched (``NOT ROLLED``). A group left out of the router by a killed run is put back by the rerun (its
configuration is then the live one: the rerun only re-adds it). A group whose unit is not running (a first
deploy) is started by the launch's wave instead, and a deployment with one group restarts in place: the plan
(``plan_lines``, printed by the launch, and the operations' names) says which groups roll, in which step, the
canary, which restart in place (an outage), and which units go.

The HTTP calls run on the hosts (files/bin/ironserve-roll, shipped as ``python3 -c``, reading the API key from the
unit's 0600 env file); the worker URLs are the rendered ones, passed as quoted arguments, never as commands.

Host data: ``roll_max_groups`` (the smallest among the deployment's hosts), ``drain_timeout_s``, ``canary_bench``
(on when a host of the deployment asks) and its settings.
"""

from __future__ import annotations

import json
import shlex
import time

from pyinfra import context, host, logger
from pyinfra.api import FactBase, FunctionCommand, operation

from ironserve.render import Process, Rendered
from ironserve.resources import files_dir
from ironserve.units import deliberate, env_path, in_container, rank_guard_unit, staged_path
from roles import canary_bench, rollback, undeclared
from roles.common import UnitState, in_run, uses_sudo
from roles.context import DeploymentContext, host_data
from roles.health import _sleep, await_health
from roles.live_config import StagedFiles, install_command, reload_command

ROLL_SCRIPT = (files_dir() / "bin" / "ironserve-roll").read_text()
ROLE_ORDER = {"prefill": 0, "decode": 1, "server": 2}
GROUP_RESTARTS_ALLOWED = 2  # as the launch's gate of a multi-node group (roles/launch.py)
WORK = "out of the router, drained, restarted on its staged configuration, gated, back in"


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


def role_counts(groups: list[list[Process]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for group in groups:
        counts[group[0].role] = counts.get(group[0].role, 0) + 1
    return counts


def roll_steps(groups: list[list[Process]], max_groups: int) -> list[list[list[Process]]]:
    """The groups cut into steps, in order: the canary alone; then at most ``max_groups`` a step, and at most all
    but one group of a role, so the router keeps one of each role while a step is out. The only group of its role
    (it leaves the router without any: an outage) moves alone."""
    if not groups:
        return []
    counts = role_counts(groups)
    steps, current = [[groups[0]]], []
    for group in groups[1:]:
        role = group[0].role
        fits = (
            current
            and len(current) < max_groups
            and counts[role] > 1
            and all(counts[g[0].role] > 1 for g in current)
            and sum(1 for g in current if g[0].role == role) < counts[role] - 1
        )
        if not fits and current:
            steps.append(current)
            current = []
        current.append(group)
    return steps + ([current] if current else [])


def is_outage(group: list[Process], groups: list[list[Process]]) -> bool:
    """Does moving this group leave the router without any group of its role (the only prefill of 1P1D)?"""
    return role_counts(groups)[group[0].role] == 1


def clamp_note(groups: list[list[Process]], max_groups: int) -> str:
    """What the plan says when roll_max_groups asks for more than a step may move."""
    counts = role_counts(groups)
    capped = [f"{n - 1} of the {n} {role} groups" for role, n in counts.items() if 1 < n <= max_groups]
    if not capped:
        return ""
    return f"; roll_max_groups={max_groups} clamped to {', '.join(capped)} a step (the router keeps one of each role)"


def group_label(group: list[Process]) -> str:
    """A group as the plan names it: its unit and host(s) (a multi-node group's ranks move as one)."""
    head = group[0]
    if len(group) == 1:
        return f"{head.unit} on {head.host}"
    return f"{head.unit} on {'+'.join(p.host for p in group)} ({len(group)} ranks, moved as one)"


def step_name(groups: list[list[Process]], steps: list[list[list[Process]]], index: int, bench: bool) -> str:
    """The step's operation name, the same on every host (what `--dry` lists): its groups, the canary, an outage."""
    step = steps[index]
    labels = ", ".join(group_label(g) for g in step)
    if index == 0:
        gate = "gated" + (" and benchmarked against its figures before" if bench else "")
        what = f"the canary, alone: {WORK.replace('gated', gate)}; no other group moves unless it passes"
    else:
        what = WORK
    outage = [g[0].role for g in step if is_outage(g, groups)]
    if outage:
        what += f" (the deployment's only {outage[0]} group: an OUTAGE while it is out of the router)"
    return f"Roll step {index + 1} of {len(steps)}: {labels}: {what}"


def plan_lines(
    rendered: Rendered, max_groups: int, bench: bool, removed: dict[str, list[str]] | None = None
) -> list[str]:
    """The change plan in words, per group: rolls (its step, the canary) or restarts in place (an outage), and the
    units of ironserve's naming each host loses (``removed``: host -> units)."""
    recipe = rendered.recipe.id
    groups = roll_groups(rendered)
    if groups:
        router = next(p for p in rendered.processes if p.role == "router")
        steps = roll_steps(groups, max_groups)
        lines = [
            f"Change plan of {recipe}: {len(groups)} engine groups behind the router {router.unit} on {router.host}; "
            f"a running group whose configuration changes rolls, {len(steps)} steps, at most {max_groups} group(s) "
            f"a step after the canary{clamp_note(groups, max_groups)}:"
        ]
        for index, step in enumerate(steps):
            for group in step:
                what = "rolls; the canary, alone" if index == 0 else "rolls"
                if index == 0 and bench:
                    what += ", benchmarked before and after its change"
                if is_outage(group, groups):
                    what += f"; the only {group[0].role} group: an OUTAGE while it is out of the router"
                lines.append(f"  step {index + 1}: {group_label(group)}: {what}")
        lines.append("  a group not running yet starts in the launch's wave; the router restarts in place")
    else:
        engines = sorted({p.unit for p in rendered.processes if p.role != "router"})
        lines = [
            f"Change plan of {recipe}: {', '.join(engines)}: no router with several engine groups, so a change "
            f"restarts in place: an OUTAGE for the length of its restart"
        ]
    for name, units in sorted((removed or {}).items()):
        if units:
            lines.append(
                f"  removed from {name}: {', '.join(units)} (not declared by {recipe}: stopped, disabled, deleted)"
            )
    return lines


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
    ctx: DeploymentContext,
    group: list[Process],
    live_files,
    config_paths,
    replaces: list[str] | None = None,
    steps: list[list[str]] | None = None,
) -> dict:
    """Everything the roll of one group needs while it runs, as plain data (fixtures, --dry). ``steps``: the
    groups' keys of every step (default: one group a step)."""
    router = next(p for p in ctx.rendered.processes if p.role == "router")
    steps = steps or [[g[0].group_key] for g in roll_groups(ctx.rendered)]
    head = group[0]
    return {
        "group": head.group_key,
        "steps": steps,
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
        # who must hold the port: the unit's own processes, or (docker run --name UNIT) the unit's container's
        "listener": "container" if in_container(ctx.recipe, head) else "unit",
        "timeout_s": ctx.recipe.health_timeout_s,
        "drain_timeout_s": ctx.host.drain_timeout_s,
        # a recipe switch: the other recipe's engine on this host that the group takes the place of (port, devices)
        "replaces": list(replaces or []),
        "bench": canary_bench.bench_plan(ctx, head),
    }


def deployment_data(ctx: DeploymentContext) -> tuple[int, bool]:
    """(roll_max_groups, canary_bench) of the deployment, one value for every host of the run: the smallest
    roll_max_groups among its hosts' data, and the canary benchmark when any of them asks for it."""
    if "deployment" not in ctx.rolls:  # shared by the contexts of the run: judged once
        names = {p.host for p in ctx.rendered.processes}
        typed = [h.host_data for h in ctx.hosts if h.name in names] or [ctx.host]
        ctx.rolls["deployment"] = (min(t.roll_max_groups for t in typed), any(t.canary_bench for t in typed))
    return ctx.rolls["deployment"]


# --------------------------------------------------------------------------- facts


class RouterWorkers(FactBase):
    """The router's workers as its own API lists them: {"urls": [...]} or {"error": why} when it cannot be
    reached (read on the router host, with the router's key from its env file)."""

    def command(self, base, env):
        return roll_script("workers", base, env) + "; true"

    def process(self, output):
        if not output:  # no line at all (python3 missing, the host killed it) is no list: nothing is "left out"
            return {"error": "ironserve-roll printed nothing"}
        try:
            answer = json.loads(output[-1])
        except ValueError:
            return {"error": output[-1][:300]}
        if "error" in answer:
            return {"error": answer["error"]}
        return {"urls": sorted(w.get("url", "") for w in answer.get("workers", []))}


# --------------------------------------------------------------------------- operation


@operation()
def step_rolled(step: int, plans: list[dict], pending: list | None = None, rolls: dict | None = None, workers=None):
    """This host's groups of one step (``plans``: their rank 0 runs here) run their staged configuration and are
    in the router, moved one step at a time.

    Per group, while planning: the staged files of rank 0 (this host) against the live ones (StagedFiles), a live
    file newer than the unit's start (a run killed between making it live and restarting), ``pending`` (per
    group, bool or callable: this run rewrites a staged file or the runtime, the facts predate it), and
    ``workers`` (the router's list, RouterWorkers: a group a killed run left out of the router is put back).
    Nothing to do: a no-op. Else the group's roll runs when the operation executes (``rolls``: the run's shared
    record, see roll_group; a group with nothing to do says so there while the run executes)."""
    executing = rolls is not None and getattr(context.state, "is_executing", False)
    for plan, flag in zip(plans, pending or [False] * len(plans), strict=True):
        restart = _needs_restart(plan, flag)
        out = "urls" in (workers or {}) and plan["worker"] not in workers["urls"]
        if not (restart or out):
            host.noop(f"{plan['unit']}: runs its staged configuration; stays in the router")
            if executing:
                rolls[plan["group"]] = "unchanged"
            continue
        yield FunctionCommand(roll_group, (plan, rolls if rolls is not None else {}, restart), {})
    if not plans:
        host.noop(f"no engine group of this host moves in step {step + 1}")


def _needs_restart(plan: dict, pending):
    """A changed staged file, a live file newer than the start, a stopped unit: True; else ``pending`` (this run
    may still change it: judged again when the roll runs)."""
    files = plan["members"][0]["files"]
    sums = host.get_fact(StagedFiles, pairs=[[s, live] for s, live, _ in files])
    differs = [live for s, live, _ in files if sums.get(s) != sums.get(live) or not sums.get(live)]
    state = host.get_fact(UnitState, unit=plan["unit"], paths=[live for _, live, _ in files])
    since = state.get("since")
    stale = [p for p, t in (state.get("mtimes") or {}).items() if since and t > since]
    down = state.get("active") not in ("active", "activating", "reloading")  # a run killed after its stop
    if differs or stale or down:
        return True
    if callable(pending):
        return pending if pending() else False
    return bool(pending)


# --------------------------------------------------------------------------- execution


def roll_script(action: str, *args: str) -> str:
    """The host command of one HTTP step: python3 -c the shipped script, every argument quoted."""
    return shlex.join(("python3", "-c", ROLL_SCRIPT, action, *args))


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
    """Returns (a group before this one that failed, or None; whether a canary passed before it).

    The steps before this one are done (pyinfra ran their operation on every host first): a group of theirs that
    had a roll in this run (``rolls["groups"]``, listed while planning) and failed, or has no outcome (its host
    failed), stops this one. Within this step, while no canary passed yet, the first group that restarts is the
    canary: each group waits, in order, for the ones before it in its step until one of them rolled. A group
    whose host failed counts as failed; the wait is bounded by the longest the groups before could take."""
    planned = set(rolls.get("groups", ()))
    mine = next(i for i, step in enumerate(plan["steps"]) if plan["group"] in step)
    earlier = [g for step in plan["steps"][:mine] for g in step if g in planned]
    failed = next((g for g in earlier if rolls.get(g, "failed") == "failed"), None)
    if failed or any(rolls[g] == "rolled" for g in earlier):
        return failed, not failed
    step = plan["steps"][mine]
    before = [g for g in step[: step.index(plan["group"])] if g in planned]
    bench_s = plan["bench"]["timeout_s"] * 2 if plan.get("bench") else 0
    deadline = time.monotonic() + len(before) * (plan["timeout_s"] + plan["drain_timeout_s"] + bench_s + 600)
    for group in before:
        while group not in rolls:
            failed_hosts = {h.name for h in getattr(state, "failed_hosts", ())}
            if rolls.get(f"host:{group}") in failed_hosts or time.monotonic() > deadline:
                rolls[group] = "failed"
                break
            _sleep(1)
        if rolls[group] in ("failed", "rolled"):
            return (group, False) if rolls[group] == "failed" else (None, True)
    return None, False


def roll_group(state, host, plan: dict, rolls: dict, restart=True) -> bool:
    """Execution of step_rolled for one group: its turn, the roll, the outcome for the groups after it
    (rolls[group]: rolled, readded, unchanged or failed). The canary is the first group that restarts an engine."""
    group = plan["group"]
    failed, canary_passed = await_turn(state, host, plan, rolls)
    if failed:
        host.log_styled(
            f"{plan['unit']}: NOT ROLLED: {failed} before it failed its roll; this group was not "
            f"touched and keeps serving its previous configuration",
            fg="red",
        )
        rolls[group] = "failed"
        return False
    restart = bool(restart() if callable(restart) else restart) or _changed_now(state, plan)
    ok = _roll(state, host, plan, canary=restart and not canary_passed, restart=restart)
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
    """One group's roll, step by step: the router reached, out of it and drained, restarted and gated (the
    canary benchmarked), its outcome settled (last good, or rolled back), back into the router."""
    router = state.inventory.get_host(plan["router"]["host"])
    ok, answer = run_roll(router, "workers", plan["router"]["base"], plan["router"]["env"])
    if not ok:
        host.log_styled(
            f"{plan['unit']}: NOT ROLLED: the router {plan['router']['host']} ({plan['router']['base']}) cannot be "
            f"reached ({answer['error']}); no engine was touched",
            fg="red",
        )
        return False
    if not restart:
        # a killed run's leftover: the group runs its configuration but is out of the router
        return _back_in(router, host, plan, None, True)
    out_at = time.monotonic()
    if not _out_of_router(router, host, plan):
        return False
    benched = canary and plan.get("bench")
    previous = canary_bench.before(host, plan) if benched else None
    passed, why = _restart_on_staged(state, host, plan)
    if passed and benched:
        passed, why = canary_bench.judged(host, plan, previous)
    _settle(state, host, plan, passed, why, canary)
    return _back_in(router, host, plan, out_at, passed)


def _out_of_router(router, host, plan: dict) -> bool:
    """The group leaves the router, then its in-flight requests drain (bounded; what was cut is said)."""
    ok, answer = run_roll(router, "remove", plan["router"]["base"], plan["router"]["env"], plan["worker"])
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
        host.log_styled(
            f"{plan['unit']}: out of the router; drained {drained['in_flight']} in-flight request(s) in "
            f"{drained['drain_s']}s, {drained['cut']} cut at the {plan['drain_timeout_s']}s drain timeout",
            fg="red" if drained["cut"] else "green",
        )
    return True


def _settle(state, host, plan: dict, passed: bool, why: str, canary: bool) -> None:
    """A group that passed: its files are its last good configuration, the unit it replaced goes for good. One
    that failed: rolled back (and the unit it was to replace restored)."""
    if passed:
        for member_host, m in _members(state, plan):
            _sh(member_host, rollback.save_command(m["unit"], m["paths"]))  # its last good configuration now
        for unit in plan.get("replaces", []):
            _sh(host, undeclared.purge_command(unit))
        return
    _fail(state, host, plan, why, canary)
    _restore_replaced(state, host, plan)


def _back_in(router, host, plan: dict, out_at: float | None, passed: bool) -> bool:
    """The group back into the router (``out_at``: when it left, None: a killed run left it out)."""
    ok, answer = run_roll(
        router, "add", plan["router"]["base"], plan["router"]["env"], plan["worker"], json.dumps(plan["worker_fields"])
    )
    if out_at is None:
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
        names = shlex.join(u + ".service" for u in units)
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
    return _gate(state, host, plan, len(members))


def _gate(state, host, plan: dict, ranks: int) -> tuple[bool, str]:
    """Health, the port held by what the unit started (its processes, or its container), one real generation."""
    allowed = GROUP_RESTARTS_ALLOWED if ranks > 1 else 0
    healthy, why = await_health(state, host, plan["unit"], plan["health"], plan["timeout_s"], restarts_allowed=allowed)
    if not healthy:
        return False, why
    ok, answer = run_roll(host, "owns-port", plan["port"], plan["unit"], plan["listener"])
    if not ok:
        return False, f"healthy, but not the unit it started that answers: {answer['error']}"
    ok, answer = run_roll(host, "generate", plan["base"], plan["env"])
    if not ok:
        return False, f"healthy, but no generation through the engine ({answer['error']})"
    owner = "its container's" if plan["listener"] == "container" else "its own"
    host.log_styled(
        f"{plan['unit']}: healthy, {owner} process on port {plan['port']}, one generation answered", fg="green"
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


def _router_of(ctx: DeploymentContext) -> dict:
    router = next(p for p in ctx.rendered.processes if p.role == "router")
    return {"host": router.host, "base": router.local_url(""), "env": env_path(router)}


def replaces(ctx: DeploymentContext, proc: Process) -> list[str]:
    """A recipe switch that rolls: a single-node group whose unit does not run yet, on a host where another
    recipe's engine runs, behind a router that lists the group's URL (the old engine answers there): the group
    takes the old engine's place through that router. Else [] (the launch's wave removes the old, starts the new)."""
    if proc.nnodes > 1 or proc.node_rank:
        return []
    old = undeclared.replaced_units(ctx.processes)
    workers = router_workers(_router_of(ctx))
    return old if old and worker_url(proc) in (workers or {}).get("urls", []) else []


def _left_out(ctx: DeploymentContext, head: Process) -> bool:
    """A stopped group that a reachable router does not list: a roll killed between its stop and its return (the
    rerun finishes the roll, back into the router); a first deploy's router is not up yet, so it starts."""
    workers = router_workers(_router_of(ctx))
    return "urls" in (workers or {}) and worker_url(head) not in workers["urls"]


def apply(ctx: DeploymentContext, procs: list[Process], live_files, config_paths, pending) -> dict:
    """One step_rolled per step of the roll on a host holding rank 0 of one of its groups (``procs``: the ranks
    > 0 move with it); every step on such a host, so that step k is one operation across hosts (pyinfra ties the
    calls of one line by their count). Returns unit -> its step's operation."""
    groups = roll_groups(ctx.rendered)
    mine = [g for g in groups if g[0] in procs]
    if not mine:
        return {}
    max_groups, bench = deployment_data(ctx)
    steps = roll_steps(groups, max_groups)
    layout = [[g[0].group_key for g in step] for step in steps]
    workers = router_workers(_router_of(ctx))
    ops = {}
    for index, step in enumerate(steps):
        plans, flags = [], []
        for group in (g for g in step if g in mine):
            head = group[0]
            running = host.get_fact(UnitState, unit=head.unit, paths=[])["active"] in ("active", "activating")
            plan = roll_plan(ctx, group, live_files, config_paths, [] if running else replaces(ctx, head), layout)
            # while planning (every host of the run, before any executes): the groups that roll, and their hosts
            ctx.rolls.setdefault("groups", []).append(plan["group"])
            ctx.rolls[f"host:{plan['group']}"] = head.host
            plans.append(plan)
            flags.append(pending(head))
        op = step_rolled(
            name=step_name(groups, steps, index, bench),
            step=index,
            plans=plans,
            pending=flags,
            rolls=ctx.rolls,
            workers=workers,
        )
        ops.update({m["unit"]: op for plan in plans for m in plan["members"]})
    return ops


def router_workers(router: dict) -> dict | None:
    """The router's workers, read on the router host while planning (None: that host is not in this run)."""
    if not in_run(router["host"]):
        return None
    return context.inventory.get_host(router["host"]).get_fact(RouterWorkers, base=router["base"], env=router["env"])


def say_plan(ctx: DeploymentContext) -> None:
    """Print the change plan once per run (plan_lines), with the units each host of the run loses."""
    if ctx.rolls.get("plan_said"):
        return
    ctx.rolls["plan_said"] = True
    removed = {}
    for name in sorted({p.host for p in ctx.rendered.processes}):
        if in_run(name):
            found = context.inventory.get_host(name).get_fact(undeclared.IronserveUnits) or {}
            declared = set(undeclared.declared_units(ctx.rendered.for_host(name)))
            removed[name] = sorted(set(found) - declared)
    max_groups, bench = deployment_data(ctx)
    for line in plan_lines(ctx.rendered, max_groups, bench, removed):
        logger.info(line)
