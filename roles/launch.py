"""Launch: the final stage. Nothing starts serving until every host of the deployment converged.

Staged configurations: the prepare stage only writes the next unit, env and guard files beside the live ones
(roles/sglang_service.py, under /etc/ironserve/staged); this stage alone makes them live. So a crash or guard
restart always starts the live configuration, and with ``launch=false`` (host data) the stage only says so:
everything is prepared and validated, nothing live changed, nothing started. Otherwise, in order (pyinfra runs
each operation on every host before the next one):

1. ``launch_gate``: at execution time, fails (stopping the whole run) if any host of the deployment failed
   earlier, so no host starts serving next to a half-provisioned peer; then the launch preflight
   (roles/launch_preflight.py: each rank's NIC leads to rank 0, a gloo rendezvous of every multi-node group,
   PCIe ACS);
2. the engines' staged files become live (``config_live``), every rank of every group in one wave before any of
   them restarts, so a restart from then on starts the new configuration on every rank, never a mix; systemd
   reloads when its own ``NeedDaemonReload`` says so (``daemon_reloaded``: a run killed between writing and
   reloading is finished by the next one, whatever its change flags); the units are enabled; memlock is judged;
3. rank 0 of each engine group, then the other ranks (prefill/decode groups before the router); single-node
   groups are health-gated right after their start, multi-node groups after all their ranks are started
   (rank 0 only answers /health once the other ranks joined); a rank whose rank 0 is outside the run
   (``--limit``, e.g. a rebuilt host) is gated on its own /health (it joined its group);
4. the router's staged files become live, then the router starts, health-gated.

Before the wave, the change plan is printed once per run (roles/rolling.py ``plan_lines``, ``--dry`` too): per
engine group, whether a change rolls it (its step, the canary) or restarts it in place (an outage), and the units
of ironserve's naming each host loses. Running groups of a deployment that rolls move after the wave, a step at a
time (roles/rolling.py).

A unit that passes its gate has its files saved as its last good configuration; one that fails it after this run
started or restarted it is rolled back to that configuration with its whole group (roles/rollback.py), and the
deploy fails saying so. Ranks of multi-node groups get a rank guard unit (files/bin/ironserve_rank_guard.py,
staged by roles/sglang_service.py) that restarts the whole group when one rank fails after the launch.

Each start is idempotent: a running unit whose live files did not change since it started (their mtimes
against its ActiveEnterTimestamp, both on its own host; judged again when the operation runs if a file became
live in this run) and whose runtime this run did not change (the change flags recorded on the context's
``changes`` by the runtime roles), and that answers /health, is left alone. A running but stale unit is
restarted; a running unit that is not healthy yet is waited for, not restarted. Group identity is systemd's:
rank 0's engine InvocationID is the group's generation, and a rank > 0 whose guard records that its engine
follows it is not restarted again (clocks of two hosts are never compared).

The health gate polls ``http://127.0.0.1:PORT/health`` on the host itself (or the bind address when the
process binds one address), printing progress every ``health_progress_s``, and fails with the unit's last
journal lines when ``recipe.health_timeout_s`` passes or the unit dies.

Host data (typed, with defaults, in ironserve/hostdata.py): ``launch``, ``health_poll_s``, ``health_progress_s``,
``health_journal_lines``.

The helpers the roles share (``changed``, ``run_if_changed``, the change records, the
``UnitState``/``HttpStatus`` facts) live in roles/common.py.
"""

from __future__ import annotations

import functools
import json
import shlex
import time

from pyinfra import context, host
from pyinfra.api import FactBase, FunctionCommand, OperationError, deploy, operation
from pyinfra.operations import systemd

from ironserve.render import Process
from ironserve.units import ETC_DIR, RANK_FOLLOW_S, UNIT_DIR, deliberate, following_path, rank_guard_unit, staged_path
from roles import deploy_clock, launch_preflight, live_config, rollback, rolling, undeclared
from roles.common import HttpStatus, UnitState, changed, in_run, run_if_changed, uses_sudo
from roles.container_drift import container_current
from roles.context import DeploymentContext
from roles.health import _sleep, await_health, wait_healthy  # noqa: F401 - the launch's gates wait with them
from roles.host_state import run_unread
from roles.live_config import install_command, reload_command
from roles.sglang_service import live_files, marker_path

# automatic restarts a multi-node group's gate lets pass while the group forms (more: a crash loop, rolled back)
GROUP_RESTARTS_ALLOWED = 2


# --------------------------------------------------------------------------- plan


def start_order(processes: list[Process]) -> list[list[Process]]:
    """[rank-0 engine processes, other ranks, routers]; prefill before decode before server within a wave."""
    order = {"prefill": 0, "decode": 1, "server": 2}
    engines = sorted(
        (p for p in processes if p.role != "router"),
        key=lambda p: (order.get(p.role, 3), p.group, p.instance, p.node_rank),
    )
    return [
        [p for p in engines if p.node_rank == 0],
        [p for p in engines if p.node_rank != 0],
        [p for p in processes if p.role == "router"],
    ]


# --------------------------------------------------------------------------- facts


class NeedDaemonReload(FactBase):
    """Units whose file on disk is not what systemd loaded: {unit: True/False} (systemd's NeedDaemonReload; a
    unit systemd knew as not-found while its file now exists counts as needing the reload too)."""

    def command(self, units):
        return f"systemctl show -p Id -p NeedDaemonReload -p LoadState {' '.join(shlex.quote(u) for u in units)}"

    def process(self, output):
        found, unit = {}, None
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "Id":
                unit = value
                found.setdefault(unit, False)
            elif unit and (key, value) in (("NeedDaemonReload", "yes"), ("LoadState", "not-found")):
                found[unit] = True
        return found


# --------------------------------------------------------------------------- operations


@operation()
def launch_gate(hosts: list[str]):
    """Fail the launch on every host when any host of the deployment failed an earlier operation.

    Checked while the operation runs (pyinfra runs it after every host finished the prepare stage), so
    the decision sees every host's outcome; OperationError stops the run for all hosts.
    """
    failed = sorted(h.name for h in getattr(context.state, "failed_hosts", ()) if h.name in set(hosts))
    if failed:
        raise OperationError(
            f"not launching: {len(failed)} host(s) of this deployment did not converge: "
            f"{', '.join(failed)} (fix them and rerun; nothing was started)"
        )
    host.noop(f"all {len(hosts)} host(s) of the deployment converged")
    return
    yield  # unreachable: an operation is a generator


@operation()
def config_live(unit: str, files: list, changing=False):
    """The staged files of ``unit`` (``files``: [staged, live, mode]) are its live files (the launch stage only).

    While planning, the facts say which differ; ``changing`` (bool or callable) says that the prepare stage of
    this run rewrites a staged file (the facts predate it). Each copy is skipped when the files are already equal.
    """
    sums = host.get_fact(live_config.StagedFiles, pairs=[[staged, live] for staged, live, _ in files])
    pending = [live for staged, live, _ in files if sums.get(staged) != sums.get(live) or not sums.get(live)]
    if not pending and not _wants_restart(changing):
        host.noop(f"{unit}: the staged configuration is the live one")
        return
    for staged, live, mode in files:
        yield install_command(staged, live, mode)


@operation()
def daemon_reloaded(units: list[str], changing=False):
    """systemd runs the unit files on disk: NeedDaemonReload is no for every unit (systemd's own view, not this
    run's change flags: a run killed between writing a unit and reloading is finished by the next one).
    ``changing``: a unit file becomes live in this run (the fact predates it); the reload still happens only if
    systemd then says so."""
    need = sorted(u for u, yes in (host.get_fact(NeedDaemonReload, units=list(units)) or {}).items() if yes)
    if not need and not _wants_restart(changing):
        host.noop(f"systemd loaded the current files of {', '.join(units)}")
        return
    yield reload_command(list(units))


def _wants_restart(restart) -> bool:
    return bool(restart() if callable(restart) else restart)


@operation()
def unit_started(
    unit: str,
    url: str | None = None,
    timeout_s: int = 3600,
    paths: list[str] | None = None,
    restart=False,
    wait: bool = True,
    members: list | None = None,
    rank0: list | None = None,
    live_changing=False,
    gate_results: dict | None = None,
):
    """The unit runs its live configuration and (with ``url`` and ``wait``) answers /health.

    Starts a stopped unit; restarts a running one when a file it was started from is newer than its start
    (``paths``; mtimes and ActiveEnterTimestamp of this one host) or ``restart`` says this run changed its runtime;
    ``live_changing``: the launch may make a new file live in this run (the facts predate it), so the staleness
    is judged again when the operation runs. Waits for health after a (re)start. A running, fresh unit is only
    checked: healthy = no-op; not healthy yet = wait (not restart). A failed gate rolls ``members`` (host, unit,
    config paths) back to their last good configuration (roles/rollback.py).

    ``rank0`` ([host, unit], ranks > 0 of a multi-node group): the rank's guard restarts it by itself when rank 0
    restarts, so a running rank is restarted only if its engine does not already follow rank 0's current
    invocation (checked when the operation runs); a second restart would break the group rank 0 is forming.
    The gate's outcome goes into ``gate_results`` (the deployment context's, shared by every host of the run).
    """
    paths = list(paths or [])
    state = host.get_fact(UnitState, unit=unit, paths=paths)
    running = state["active"] in ("active", "activating", "reloading")
    gate = url is not None and wait
    if not running:
        yield deliberate("start", unit)
    else:
        if stale_paths(state) or _wants_restart(restart):
            if rank0:
                yield FunctionCommand(restart_unless_following, (unit, list(rank0), paths), {})
            else:
                yield deliberate("restart", unit)
        elif _wants_restart(live_changing):
            yield FunctionCommand(restart_if_stale, (unit, paths, list(rank0) if rank0 else None), {})
        elif gate and host.get_fact(HttpStatus, url=url) == 200:
            host.noop(f"{unit} is running, unchanged and healthy")
            return
        elif not gate:
            host.noop(f"{unit} is running and unchanged")
            return
    if gate:
        yield FunctionCommand(gate_or_roll_back, (unit, url, timeout_s, members or [], gate_results), {})


def stale_paths(state: dict) -> list[str]:
    """The files (live) written after the unit's current start, on the unit's own host."""
    since = state.get("since")
    return sorted(p for p, t in (state.get("mtimes") or {}).items() if since and t > since)


def _stale_now(host, unit: str, paths: list[str]) -> list[str]:
    _, out = run_unread(host, UnitState().command(unit, paths), _sudo=uses_sudo(host))
    return stale_paths(UnitState().process(out.stdout_lines))


def restart_if_stale(state, host, unit: str, paths: list[str], rank0: list | None) -> bool:
    """Restart the unit if a live file became newer than its start in this run (judged now); else leave it."""
    stale = _stale_now(host, unit, paths)
    if not stale:
        host.log(f"{unit}: its live files did not change: not restarted")
        return True
    if rank0:
        return restart_unless_following(state, host, unit, rank0, paths)
    status, _ = host.run_shell_command(deliberate("restart", unit), _sudo=uses_sudo(host))
    return bool(status)


def _show(run, unit: str) -> dict:
    _, out = run(f"systemctl show -p InvocationID -p ActiveState {shlex.quote(unit)}.service")
    return dict(line.strip().partition("=")[::2] for line in out.stdout_lines if "=" in line)


def _following(run, unit: str) -> dict:
    _, out = run(f"cat {shlex.quote(following_path(unit))} 2>/dev/null || true")
    try:
        return json.loads("".join(out.stdout_lines) or "{}")
    except ValueError:
        return {}


def restart_unless_following(
    state, host, unit: str, rank0: list[str], paths: list[str] | None = None, follow_s: float = RANK_FOLLOW_S
) -> bool:
    """Restart a rank > 0 unless its engine already follows rank 0's current engine invocation (the group's
    generation) and started after its own live files: its guard records which invocation of rank 0 its engine
    joined (ironserve.units.following_path). Rank 0 was just (re)started: the guard follows within a few polls, so
    this waits up to ``follow_s`` for it before restarting the rank itself (a second restart would break the group
    rank 0 is forming). Identity across hosts, never their clocks compared."""
    sudo = uses_sudo(host)
    head = state.inventory.get_host(rank0[0])
    generation = _show(lambda c: run_unread(head, c, _sudo=uses_sudo(head)), rank0[1])
    generation = generation.get("InvocationID", "")
    run = lambda c: run_unread(host, c, _sudo=sudo)  # noqa: E731 - reads only (the restart below is no read)
    deadline = time.monotonic() + follow_s
    while generation:
        mine, follows = _show(run, unit), _following(run, unit)
        if (
            mine.get("ActiveState") in ("active", "activating")
            and follows.get("leader_invocation") == generation
            and follows.get("engine_invocation") == mine.get("InvocationID")
        ):
            if paths and _stale_now(host, unit, paths):
                break  # in rank 0's group, but started before its own new files: the group restarts around it
            host.log(f"{unit}: follows rank 0's invocation {generation} ({rank0[0]}): its rank guard restarted it")
            return True
        if time.monotonic() >= deadline:
            break
        _sleep(2)
    host.log(f"{unit}: not following rank 0's invocation {generation or '(none)'}: restarting it")
    status, _ = host.run_shell_command(deliberate("restart", unit), _sudo=sudo)
    return bool(status)


@operation()
def health_gate(
    unit: str, url: str, timeout_s: int = 3600, members: list | None = None, gate_results: dict | None = None
):
    """Wait until the unit answers /health (after the ranks of its multi-node group were started)."""
    if host.get_fact(HttpStatus, url=url) == 200:
        host.noop(f"{unit} is healthy")
        return
    yield FunctionCommand(gate_or_roll_back, (unit, url, timeout_s, members or [], gate_results), {})


def gate_or_roll_back(
    state, host, unit: str, url: str, timeout_s: int, members: list, gate_results: dict | None = None
) -> bool:
    """The health gate; when it fails, the rollback of ``members`` to their last good configuration. A gate
    that failed fails the operation even when the rollback healed the service: the deploy did not converge.
    The outcome is recorded in ``gate_results`` [(host, unit)]: ranks > 0 save their last good configuration
    only when their rank 0's gate passed. A multi-node group may restart as a whole while it forms (a rank that
    left the previous group, its guard following rank 0): its gate allows a few restarts, a crash loop fails it."""
    allowed = GROUP_RESTARTS_ALLOWED if len(members) > 1 else 0
    ok, why = await_health(state, host, unit, url, timeout_s, restarts_allowed=allowed)
    if gate_results is not None:
        gate_results[(host.name, unit)] = ok
    if not ok and members:
        rollback.roll_back(
            state, host, unit, url, timeout_s, members, why, functools.partial(wait_healthy, restarts_allowed=allowed)
        )
    return ok


# --------------------------------------------------------------------------- deploy


@operation()
def wave_barrier():
    """Nothing to do: a point of the launch every host of the run passes together (see apply)."""
    host.noop("all hosts reached this point of the launch")
    return
    yield  # unreachable: an operation is a generator


@operation()
def not_launched(reason: str):
    """Say why nothing is started (launch=false): prepared and validated only."""
    host.noop(reason)
    return
    yield  # unreachable: an operation is a generator


def config_paths(proc: Process) -> list[str]:
    """The files a unit is started from, which a rollback restores: unit, env, and a rank's guard files."""
    # the parse marker too: a restored unit needs no new parse check on the next run
    paths = [f"{UNIT_DIR}/{proc.unit}.service", f"{ETC_DIR}/{proc.unit}.env", marker_path(proc.unit)]
    if proc.in_rank_group:
        paths += [f"{UNIT_DIR}/{rank_guard_unit(proc)}.service", f"{ETC_DIR}/{proc.unit}.rank-group.json"]
    return paths


def _unit_paths(ctx: DeploymentContext, proc: Process) -> list[str]:
    return [f"{UNIT_DIR}/{proc.unit}.service", f"{ETC_DIR}/{proc.unit}.env", *ctx.changes.runtime_paths]


def rollback_members(ctx: DeploymentContext, proc: Process) -> list[tuple[str, str, list[str]]]:
    """Who rolls back together when proc's gate fails: its whole multi-node group (rank order), or itself."""
    group = ctx.rendered.rank_group(proc) or [proc]
    return [(p.host, p.unit, config_paths(p)) for p in group]


def _start(ctx: DeploymentContext, proc: Process, wait: bool, live: dict) -> None:
    made_live = live.get(proc.unit)
    url = proc.health_url
    if url is None and proc.node_rank and wait:
        url = proc.local_url("/health")  # a rank > 0 answers /health on its own host once it joined its group
    unit_started(
        name=f"Start {proc.unit}" + (f" (rank {proc.node_rank})" if proc.nnodes > 1 else "") + _in_place(ctx, proc),
        unit=proc.unit,
        url=url,
        timeout_s=ctx.recipe.health_timeout_s,
        paths=_unit_paths(ctx, proc),
        restart=ctx.changes.runtime_change_flag(),
        live_changing=lambda: changed(made_live),
        wait=wait,
        gate_results=ctx.gate_results,
        members=rollback_members(ctx, proc),
        rank0=[proc.head, proc.unit] if proc.in_rank_group and proc.node_rank and in_run(proc.head) else None,
    )


def _in_place(ctx: DeploymentContext, proc: Process) -> str:
    """What the plan says of an engine that cannot roll: the deployment's only group restarts in place."""
    if proc.role == "router" or rolling.roll_groups(ctx.rendered):
        return ""
    return " (a change restarts it in place: the deployment's only engine group, an outage for its length)"


def _save_last_good(ctx: DeploymentContext, procs: list[Process], live: dict) -> None:
    for proc in procs:
        # a rank > 0 saves when its rank 0's gate passed; one whose rank 0 is outside the run (--limit) when its own
        # join gate did
        gate = None
        if proc.in_rank_group and proc.node_rank:
            gate = (proc.head, proc.unit) if in_run(proc.head) else (proc.host, proc.unit)
        made_live = live.get(proc.unit)
        flag = ctx.changes.unit_change_flag(proc.unit)
        rollback.last_good_saved(
            name=f"{proc.unit}: last good configuration",
            unit=proc.unit,
            paths=config_paths(proc),
            gate=gate,
            gate_results=ctx.gate_results,
            restart=lambda made_live=made_live, flag=flag: changed(made_live) or flag(),
        )


def make_live(ctx: DeploymentContext, procs: list[Process]) -> dict:
    """The staged configuration of ``procs`` becomes their live one (one call site each: every host of the wave
    together), systemd reloads what it says changed, the units are enabled, the guards pick up new configs.
    Returns unit -> the activation's result, which restarts the unit."""
    if not procs:
        return {}
    live, guards = {}, []
    for proc in procs:
        files = [[staged_path(path), path, mode] for path, _, mode in live_files(ctx, proc)]
        live[proc.unit] = config_live(
            name=f"{proc.unit}: staged configuration made live",
            unit=proc.unit,
            files=files,
            changing=ctx.changes.unit_change_flag(proc.unit),
        )
        if proc.in_rank_group:
            guards.append((proc, live[proc.unit]))
    units = [f"{p.unit}.service" for p in procs] + [f"{rank_guard_unit(p)}.service" for p, _ in guards]
    ops = list(live.values())
    daemon_reloaded(
        name="systemd loaded the live unit files (NeedDaemonReload=no)",
        units=units,
        changing=lambda: any(changed(op) for op in ops),
    )
    for proc in procs:
        systemd.service(name=f"{proc.unit}.service enabled", service=f"{proc.unit}.service", running=None, enabled=True)
    script = ctx.changes.rank_guard_script
    for proc, op in guards:
        # a new guard config or script reaches a running guard without restarting its engine
        run_if_changed(
            name=f"{rank_guard_unit(proc)} picks up its new config",
            triggers=[op, script],
            command=f"systemctl try-restart {rank_guard_unit(proc)}.service",
        )
    return live


@deploy("Launch")
def apply(ctx: DeploymentContext) -> None:
    if not ctx.launch:
        # the checks that need no running peer still validate the prepared hosts; nothing staged becomes live
        launch_preflight.apply(ctx)
        not_launched(name="Launch", reason="prepared and validated; staged, not live, not started: launch=false")
        return
    _gate_and_preflight(ctx)
    # a running engine of a deployment with several groups behind its router rolls (roles/rolling.py); the rest
    # (first starts, a single group: in place, an outage) start in the wave below
    rolls = rolling.rolling_procs(ctx, lambda proc: _unit_paths(ctx, proc))
    rolling.say_plan(ctx)
    _engine_wave(ctx, rolls)
    wave_barrier(name="Launch: the rolling change, one step at a time behind the router (the wave is healthy)")
    rolling.apply(ctx, rolls, live_files, config_paths, lambda proc: ctx.changes.unit_change_flag(proc.unit))
    _routers(ctx)


def _gate_and_preflight(ctx: DeploymentContext) -> None:
    """Every host converged; the containers match their units; the launch preflight."""
    # the deployment = every host the render placed a process on (inventory names)
    deployment = sorted({p.host for p in ctx.rendered.processes})
    launch_gate(name="Launch gate: every host converged", hosts=deployment)
    for unit, (image, cmd, env_names) in ctx.changes.containers.items():
        container_current(
            name=f"Container of {unit} matches its unit", unit=unit, image=image, cmd=cmd, env_names=env_names
        )
    # /dev/shm, ACS; the NIC of every rank and a gloo rendezvous of each multi-node group
    launch_preflight.apply(ctx)


def _engine_wave(ctx: DeploymentContext, rolls: list[Process]) -> None:
    """The engines that do not roll: undeclared units leave, every rank made live in one wave, rank 0 of each
    group started and gated, then the other ranks, then each multi-node group's gate; last good saved."""
    ranks0, others, _ = start_order([p for p in ctx.processes if p not in rolls])
    # pyinfra orders operations per host and ties across hosts by call site; a host with fewer operations
    # before a wave (a router host: no preflight) would reach the next wave early. Barriers, called on every
    # host from one line each, are operations every host shares: no host passes one before all reached it.
    deploy_clock.stage(ctx, "engine_start")  # timing: the engines made live, started and gated
    wave_barrier(name="Launch: the engines' staged configurations become live (all hosts passed the preflight)")
    # a unit of another recipe (or group) leaves the host first: the new one takes its port and devices
    # (not an old router, nor an engine a rolling switch replaces: they go when their successor takes over)
    keep = undeclared.routers_kept(ctx.processes) + [u for p in rolls for u in rolling.replaces(ctx, p)]
    undeclared.undeclared_removed(
        name=undeclared.removal_name(ctx.processes, ctx.recipe.id, keep),
        declared=undeclared.declared_units(ctx.processes) + keep,
    )
    # every rank of a group becomes live in this one wave, before any of them restarts: a guard or crash restart
    # from here on starts the new configuration on every rank, never a mix
    live = make_live(ctx, ranks0 + others)
    launch_preflight.memlock_checks(ctx, {unit: (lambda op=op: changed(op)) for unit, op in live.items()})
    wave_barrier(name="Launch: rank 0 of each group")
    for proc in ranks0:
        _start(ctx, proc, wait=proc.nnodes == 1, live=live)
    _save_last_good(ctx, [p for p in ranks0 if p.nnodes == 1], live)
    wave_barrier(name="Launch: the other ranks (rank 0 of every group started)")
    for proc in others:
        # rank 0 outside this run (--limit, e.g. a rebuilt host): the rank is gated on joining its group
        _start(ctx, proc, wait=not in_run(proc.head), live=live)
    for proc in ranks0:
        if proc.nnodes > 1 and proc.health_url:
            # rank 0 answers /health only once every rank of its group joined
            health_gate(
                name=f"Health of {proc.unit} (all ranks started)",
                unit=proc.unit,
                url=proc.health_url,
                timeout_s=ctx.recipe.health_timeout_s,
                members=rollback_members(ctx, proc),
                gate_results=ctx.gate_results,
            )
    # every rank of a healthy group: its files are the group's last good configuration
    _save_last_good(ctx, [p for p in ranks0 + others if p.nnodes > 1], live)


def _routers(ctx: DeploymentContext) -> None:
    """The routers last, every engine group healthy; an old recipe's router leaves right before."""
    routers = start_order(ctx.processes)[2]
    deploy_clock.stage(ctx, "router_start")
    wave_barrier(name="Launch: the routers (every engine group healthy)")
    # an old recipe's router leaves right before the new one starts on its port (the switch's only gap)
    undeclared.undeclared_removed(
        name=undeclared.removal_name(ctx.processes, ctx.recipe.id), declared=undeclared.declared_units(ctx.processes)
    )
    live = make_live(ctx, routers)
    for proc in routers:
        _start(ctx, proc, wait=True, live=live)
    _save_last_good(ctx, routers, live)
