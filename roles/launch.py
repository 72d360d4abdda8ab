"""Launch: the final stage. Nothing starts serving until every host of the deployment converged.

With ``launch=false`` (host data) the stage only says so: everything is prepared and validated, nothing started.
Otherwise, in order (pyinfra runs each operation on every host before the next one):

1. ``launch_gate``: at execution time, fails (stopping the whole run) if any host of the deployment failed
   earlier, so no host starts serving next to a half-provisioned peer; then the launch preflight
   (roles/launch_preflight.py: each rank's NIC leads to rank 0, a gloo rendezvous of every multi-node group,
   memlock, PCIe ACS);
2. rank 0 of each engine group, then the other ranks (prefill/decode groups before the router); single-node
   groups are health-gated right after their start, multi-node groups after all their ranks are started
   (rank 0 only answers /health once the other ranks joined);
3. the router, health-gated.

A unit that passes its gate has its files saved as its last good configuration; one that fails it after this run
started or restarted it is rolled back to that configuration with its whole group (roles/rollback.py), and the
deploy fails saying so. Ranks of multi-node groups get a rank guard unit (files/bin/ironserve-rank-guard,
installed by roles/sglang_service.py) that restarts the whole group when one rank fails after the launch.

Each start is idempotent: a running unit whose unit file, env file and runtime did not change since it
started (file mtimes against systemd's ActiveEnterTimestamp, plus the changed flags of this run's earlier
operations, recorded on the context's ``changes`` by the other roles) and that answers /health is left alone. A running
but stale unit is restarted; a running unit that is not healthy yet is waited for, not restarted.

The health gate polls ``http://127.0.0.1:PORT/health`` on the host itself (or the bind address when the
process binds one address), printing progress every ``health_progress_s``, and fails with the unit's last
journal lines when ``recipe.health_timeout_s`` passes or the unit dies.

Host data (defaults in brackets): ``launch`` [true], ``health_poll_s`` [10], ``health_progress_s`` [60],
``health_journal_lines`` [40].

The helpers the roles share (``truthy``, ``changed``, ``run_if_changed``, the change records, the
``UnitState``/``HttpStatus`` facts) live in roles/common.py.
"""

from __future__ import annotations

import shlex
import time

from pyinfra import context, host
from pyinfra.api import FactBase, FunctionCommand, OperationError, deploy, operation

from ironserve.render import Process
from ironserve.units import ETC_DIR, UNIT_DIR, rank_guard_unit
from roles import launch_preflight, rollback
from roles.common import HttpStatus, UnitState
from roles.container_runtime import container_current
from roles.context import DeploymentContext
from roles.sglang_service import marker_path

HEALTH_POLL_S = 10
HEALTH_PROGRESS_S = 60
HEALTH_JOURNAL_LINES = 40


# --------------------------------------------------------------------------- plan


def start_order(processes: list[Process]) -> list[list[Process]]:
    """[rank-0 engine processes, other ranks, routers]; prefill before decode before server within a wave."""
    order = {"prefill": 0, "decode": 1, "server": 2}
    engines = sorted((p for p in processes if p.role != "router"),
                     key=lambda p: (order.get(p.role, 3), p.group, p.instance, p.node_rank))
    return [[p for p in engines if p.node_rank == 0], [p for p in engines if p.node_rank != 0],
            [p for p in processes if p.role == "router"]]


# --------------------------------------------------------------------------- operations


@operation()
def launch_gate(hosts: list[str]):
    """Fail the launch on every host when any host of the deployment failed an earlier operation.

    Checked while the operation runs (pyinfra runs it after every host finished the prepare stage), so
    the decision sees every host's outcome; OperationError stops the run for all hosts.
    """
    failed = sorted(h.name for h in getattr(context.state, "failed_hosts", ()) if h.name in set(hosts))
    if failed:
        raise OperationError(f"not launching: {len(failed)} host(s) of this deployment did not converge: "
                             f"{', '.join(failed)} (fix them and rerun; nothing was started)")
    host.noop(f"all {len(hosts)} host(s) of the deployment converged")
    return
    yield  # noqa: unreachable - an operation is a generator


def _wants_restart(restart) -> bool:
    return bool(restart() if callable(restart) else restart)


@operation()
def unit_started(unit: str, url: str | None = None, timeout_s: int = 3600, paths: list[str] | None = None,
                 restart=False, wait: bool = True, members: list | None = None, rank0: list | None = None,
                 gate_results: dict | None = None):
    """The unit runs its current configuration and (with ``url`` and ``wait``) answers /health.

    Starts a stopped unit; restarts a running one when a file it was started from is newer than its start
    (``paths``) or ``restart`` says this run changed it; waits for health after either. A running, fresh
    unit is only checked: healthy = no-op; not healthy yet = wait (not restart). A failed gate rolls ``members``
    (host, unit, config paths) back to their last good configuration (roles/rollback.py). The gate's outcome goes
    into ``gate_results`` (the deployment context's, shared by every host of the run).

    ``rank0`` ([host, unit], ranks > 0 of a multi-node group): the rank's guard restarts it by itself when rank 0
    restarts, so a running rank is restarted only if it has not started since rank 0 did (checked when the
    operation runs); a second restart would break the group rank 0 is forming.
    """
    state = host.get_fact(UnitState, unit=unit, paths=list(paths or []))
    running = state["active"] in ("active", "activating", "reloading")
    gate = url is not None and wait
    if not running:
        yield f"systemctl start {shlex.quote(unit)}.service"
    else:
        since = state.get("since")
        stale = sorted(p for p, t in (state.get("mtimes") or {}).items() if since and t > since)
        if (stale or _wants_restart(restart)) and rank0:
            yield FunctionCommand(restart_unless_following, (unit, list(rank0)), {})
        elif stale or _wants_restart(restart):
            yield f"systemctl restart {shlex.quote(unit)}.service"
        elif gate and host.get_fact(HttpStatus, url=url) == 200:
            host.noop(f"{unit} is running, unchanged and healthy")
            return
        elif not gate:
            host.noop(f"{unit} is running and unchanged")
            return
    if gate:
        yield FunctionCommand(gate_or_roll_back, (unit, url, timeout_s, members or [], gate_results), {})


def _since(run, unit: str) -> float:
    _, out = run(f"systemctl show -p ActiveEnterTimestamp --timestamp=unix {shlex.quote(unit)}.service")
    text = "".join(out.stdout_lines).partition("=@")[2].strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def restart_unless_following(state, host, unit: str, rank0: list[str]) -> bool:
    """Restart a rank > 0 unless it (re)started after rank 0's current start (its guard already followed)."""
    head = state.inventory.get_host(rank0[0])
    mine, theirs = _since(host.run_shell_command, unit), _since(head.run_shell_command, rank0[1])
    if theirs and mine >= theirs:
        host.log(f"{unit}: already restarted after rank 0 ({rank0[0]}) did: its rank guard followed")
        return True
    status, _ = host.run_shell_command(f"systemctl restart {shlex.quote(unit)}.service",
                                       _sudo=bool(host.data.get("_sudo")))
    return bool(status)


@operation()
def health_gate(unit: str, url: str, timeout_s: int = 3600, members: list | None = None,
                gate_results: dict | None = None):
    """Wait until the unit answers /health (after the ranks of its multi-node group were started)."""
    if host.get_fact(HttpStatus, url=url) == 200:
        host.noop(f"{unit} is healthy")
        return
    yield FunctionCommand(gate_or_roll_back, (unit, url, timeout_s, members or [], gate_results), {})


def gate_or_roll_back(state, host, unit: str, url: str, timeout_s: int, members: list,
                      gate_results: dict | None = None) -> bool:
    """The health gate; when it fails, the rollback of ``members`` to their last good configuration. A gate
    that failed fails the operation even when the rollback healed the service: the deploy did not converge.
    The outcome is recorded in ``gate_results`` [(host, unit)]: ranks > 0 save their last good configuration
    only when their rank 0's gate passed."""
    ok, why = await_health(state, host, unit, url, timeout_s)
    if gate_results is not None:
        gate_results[(host.name, unit)] = ok
    if not ok and members:
        rollback.roll_back(state, host, unit, url, timeout_s, members, why, wait_healthy)
    return ok


def wait_healthy(state, host, unit: str, url: str, timeout_s: int, poll_s: float | None = None) -> bool:
    return await_health(state, host, unit, url, timeout_s, poll_s)[0]


def await_health(state, host, unit: str, url: str, timeout_s: int, poll_s: float | None = None) -> tuple[bool, str]:
    """Poll the unit's /health from the host until 200; (False, why) with the journal on timeout or death."""
    poll_s = float(poll_s if poll_s is not None else _setting(host, "health_poll_s", HEALTH_POLL_S))
    progress_s = float(_setting(host, "health_progress_s", HEALTH_PROGRESS_S))
    sudo = bool(host.data.get("_sudo"))
    start = last = time.monotonic()
    probe = (f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' {shlex.quote(url)}; echo; "
             f"systemctl show -p ActiveState -p SubState {shlex.quote(unit)}.service")
    host.log(f"{unit}: waiting for {url} (up to {timeout_s}s)")
    while True:
        _, out = host.run_shell_command(probe)
        code, active, sub = _parse_probe(out.stdout_lines)
        elapsed = int(time.monotonic() - start)
        if code == 200:
            host.log_styled(f"{unit}: healthy after {elapsed}s", fg="green")
            return True, ""
        dead = active in ("failed", "inactive") or sub == "auto-restart"
        if dead or elapsed >= timeout_s:
            why = (f"the unit died ({active}/{sub})" if dead else f"no healthy answer within {timeout_s}s")
            lines = int(_setting(host, "health_journal_lines", HEALTH_JOURNAL_LINES))
            _, journal = host.run_shell_command(
                f"journalctl -u {shlex.quote(unit)}.service -n {lines} --no-pager", _sudo=sudo)
            host.log_styled(f"{unit}: {why} ({url}); last journal lines:\n{journal.stdout}", fg="red")
            return False, why
        if time.monotonic() - last >= progress_s:
            last = time.monotonic()
            host.log(f"{unit}: still waiting for {url}: {elapsed}s of {timeout_s}s, unit {active}/{sub}, "
                     f"http {code or 'no answer'}")
        _sleep(poll_s)


def _setting(host, key: str, default):
    value = host.data.get(key)
    return default if value is None else value


def _parse_probe(lines: list[str]) -> tuple[int | None, str | None, str | None]:
    code = active = sub = None
    for line in lines:
        line = line.strip()
        if line.isdigit():
            code = int(line) or None
        elif line.startswith("ActiveState="):
            active = line.split("=", 1)[1]
        elif line.startswith("SubState="):
            sub = line.split("=", 1)[1]
    return code, active, sub


def _sleep(seconds: float) -> None:
    # pyinfra runs hosts in gevent greenlets: a gevent sleep lets the other hosts' gates poll meanwhile
    try:
        import gevent

        gevent.sleep(seconds)
    except ImportError:  # pragma: no cover
        time.sleep(seconds)


# --------------------------------------------------------------------------- deploy


@operation()
def wave_barrier():
    """Nothing to do: a point of the launch every host of the run passes together (see apply)."""
    host.noop("all hosts reached this point of the launch")
    return
    yield  # noqa: unreachable - an operation is a generator


@operation()
def not_launched(reason: str):
    """Say why nothing is started (launch=false): prepared and validated only."""
    host.noop(reason)
    return
    yield  # noqa: unreachable - an operation is a generator


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


def _start(ctx: DeploymentContext, proc: Process, wait: bool) -> None:
    unit_started(
        name=f"Start {proc.unit}" + (f" (rank {proc.node_rank})" if proc.nnodes > 1 else ""),
        unit=proc.unit,
        url=proc.health_url,
        timeout_s=ctx.recipe.health_timeout_s,
        paths=_unit_paths(ctx, proc),
        restart=ctx.changes.unit_change_flag(proc.unit),
        wait=wait,
        members=rollback_members(ctx, proc),
        gate_results=ctx.gate_results,
        rank0=[proc.head, proc.unit] if proc.in_rank_group and proc.node_rank else None,
    )


def _save_last_good(ctx: DeploymentContext, procs: list[Process]) -> None:
    for proc in procs:
        rollback.last_good_saved(name=f"{proc.unit}: last good configuration", unit=proc.unit,
                                 paths=config_paths(proc), restart=ctx.changes.unit_change_flag(proc.unit),
                                 gate=(proc.head, proc.unit) if proc.in_rank_group and proc.node_rank else None,
                                 gate_results=ctx.gate_results)


@deploy("Launch")
def apply(ctx: DeploymentContext) -> None:
    if not ctx.launch:
        # the checks that need no running peer still validate the prepared hosts
        launch_preflight.apply(ctx)
        not_launched(name="Launch", reason="prepared and validated; not started: launch=false")
        return
    # the deployment = every host the render placed a process on (inventory names)
    deployment = sorted({p.host for p in ctx.rendered.processes})
    launch_gate(name="Launch gate: every host converged", hosts=deployment)
    for unit, (image, cmd, env_names) in ctx.changes.containers.items():
        container_current(name=f"Container of {unit} matches its unit", unit=unit, image=image, cmd=cmd,
                          env_names=env_names)
    # /dev/shm, memlock, ACS; the NIC of every rank and a gloo rendezvous of each multi-node group
    launch_preflight.apply(ctx)
    ranks0, others, routers = start_order(ctx.processes)
    # pyinfra orders operations per host and ties across hosts by call site; a host with fewer operations
    # before a wave (a router host: no preflight) would reach the next wave early. Barriers, called on every
    # host from one line each, are operations every host shares: no host passes one before all reached it.
    wave_barrier(name="Launch: rank 0 of each group (all hosts passed the preflight)")
    for proc in ranks0:
        _start(ctx, proc, wait=proc.nnodes == 1)
    _save_last_good(ctx, [p for p in ranks0 if p.nnodes == 1])
    wave_barrier(name="Launch: the other ranks (rank 0 of every group started)")
    for proc in others:
        _start(ctx, proc, wait=False)
    for proc in ranks0:
        if proc.nnodes > 1 and proc.health_url:
            # rank 0 answers /health only once every rank of its group joined
            health_gate(name=f"Health of {proc.unit} (all ranks started)", unit=proc.unit, url=proc.health_url,
                        timeout_s=ctx.recipe.health_timeout_s, members=rollback_members(ctx, proc),
                        gate_results=ctx.gate_results)
    # every rank of a healthy group: its files are the group's last good configuration
    _save_last_good(ctx, [p for p in ranks0 + others if p.nnodes > 1])
    wave_barrier(name="Launch: the routers (every engine group healthy)")
    for proc in routers:
        _start(ctx, proc, wait=True)
    _save_last_good(ctx, routers)
