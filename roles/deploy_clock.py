"""Where the time of a deploy went: per-stage timings, the table the deploy ends with, and each host's ironserve_*
metrics of the run (ironserve.metrics), written through the host's metrics writer (roles/node_exporter.py).

While planning, ``stage(ctx, name)`` marks where the next stage's operations begin (the deploy calls it before each
role and before the launch's waves); every operation planned since the last mark belongs to the stage before it
(one operation is one call site, so its stage is the same on every host). While the run executes, a pyinfra state
callback reads the clock when each operation starts and ends on all hosts: a stage lasts from its first operation's
start to its last one's end, and ``plan`` from the first mark to the first operation (facts, planning).

When the run's last operation ended, each host that converged gets its outcome (success, the stages, its gates, the
configuration generation of its units: the sha256 of each live unit file, read on the host); a host that failed
gets its outcome (failure, the stages so far) the moment it failed. Then the table is printed, and written as JSON
to host data ``deploy_timings_json`` (a controller path). A dry run executes nothing: nothing is written. These
writes are no operations of the deploy: a rerun that changes nothing still plans no change.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from pyinfra import context, logger
from pyinfra.api.state import BaseStateCallback

from ironserve.metrics import DeployOutcome, Sample, deploy_samples, exposition, timing_json, timing_table
from roles.common import uses_sudo
from roles.context import DeploymentContext
from roles.host_state import run_unread
from roles.node_exporter import TEXTFILE

METRICS_FILE = "ironserve_deploy"  # <textfile dir>/ironserve_deploy.prom


class DeployClock(BaseStateCallback):
    """One per pyinfra state: the stage of each operation, their times, the contexts of the hosts."""

    def __init__(self) -> None:
        self.created = time.monotonic()
        self.stage_of: dict[str, str] = {}  # op hash -> stage
        self.current: str | None = None
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.contexts: dict[str, DeploymentContext] = {}
        self.written: set[str] = set()
        self.last_op: str | None = None

    # ------------------------------------------------------------------ planning

    def mark(self, state, name: str | None) -> None:
        for op_hash in state.op_meta:
            if op_hash not in self.stage_of and self.current:
                self.stage_of[op_hash] = self.current
        self.current = name

    # ------------------------------------------------------------------ pyinfra callbacks (instance methods)

    def operation_start(self, state, op_hash) -> None:
        if self.last_op is None:
            self.last_op = state.get_op_order()[-1]
        self.started.setdefault(self.stage_of.get(op_hash, "other"), time.monotonic())

    def operation_end(self, state, op_hash) -> None:
        self.ended[self.stage_of.get(op_hash, "other")] = time.monotonic()
        if op_hash == self.last_op:
            self.finish(state)

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0) -> None:
        if not state.get_op_meta(op_hash).global_arguments.get("_ignore_errors"):
            self.publish(host, success=False)
            if self.written >= {h.name for h in state.activated_hosts}:
                self.report(state, failed=True)  # every host failed: pyinfra stops, no last operation ends

    # ------------------------------------------------------------------ results

    def stages(self) -> dict[str, float]:
        """stage -> seconds, in the order they ran; ``plan`` first (facts and planning before the first operation)."""
        now = time.monotonic()
        order = sorted(self.started, key=self.started.get)
        out = {"plan": round(min(self.started.values(), default=now) - self.created, 3)}
        for stage in order:
            out[stage] = round(self.ended.get(stage, now) - self.started[stage], 3)
        return out

    def outcome(self, host, success: bool) -> DeployOutcome:
        ctx = self.contexts[host.name]
        # the gates this run ran; a unit this run found running, unchanged and healthy passed it too when the host
        # converged (its start was a no-op only because /health answered)
        gates = {
            p.unit: ctx.gate_results.get((host.name, p.unit), success)
            for p in ctx.processes
            if (host.name, p.unit) in ctx.gate_results or (success and p.health_url)
        }
        return DeployOutcome(
            recipe=ctx.recipe.id,
            success=success,
            finished_at=time.time(),
            stages=self.stages(),
            gates=gates,
            units=[(p.unit, p.role) for p in ctx.processes],
        )

    def publish(self, host, success: bool) -> None:
        """Write the host's outcome through its metrics writer (once per run); a host that cannot be written to
        is said, never fails the deploy."""
        if host.name in self.written or host.name not in self.contexts:
            return
        self.written.add(host.name)
        outcome = self.outcome(host, success)
        sudo = uses_sudo(host)
        try:
            samples = deploy_samples(outcome) + self.unit_samples(host, outcome, sudo)
            ok, out = run_unread(
                host, f"printf '%s' {shlex.quote(exposition(samples))} | python3 {TEXTFILE} {METRICS_FILE}", _sudo=sudo
            )
        except Exception as exc:  # noqa: BLE001 - metrics never fail the deploy
            ok, out = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            logger.warning(f"{host.name}: ironserve metrics not written ({getattr(out, 'stderr', out)})")

    @staticmethod
    def unit_samples(host, outcome: DeployOutcome, sudo: bool) -> list[Sample]:
        """ironserve_unit_live_info per unit: the generation is its live unit file's digest, read on the host."""
        paths = {f"/etc/systemd/system/{unit}.service": (unit, role) for unit, role in outcome.units}
        if not paths:
            return []
        _, out = run_unread(host, f"sha256sum {' '.join(shlex.quote(p) for p in paths)} 2>/dev/null; true", _sudo=sudo)
        found = {}
        for line in out.stdout_lines:
            digest, _, path = line.strip().partition("  ")
            if path in paths:
                found[path] = digest[:12]
        return [
            Sample(
                "ironserve_unit_live_info",
                1,
                {"recipe": outcome.recipe, "unit": unit, "role": role, "generation": found.get(path, "none")},
            )
            for path, (unit, role) in paths.items()
        ]

    def finish(self, state) -> None:
        for host in state.inventory.get_active_hosts():
            self.publish(host, success=True)
        self.report(state, failed=bool(state.failed_hosts))

    def report(self, state, failed: bool) -> None:
        """The timing table, and its JSON where host data ``deploy_timings_json`` asks for it."""
        stages = self.stages()
        logger.info(
            f"--> Deploy timings (time to serving){' (some hosts failed)' if failed else ''}:\n{timing_table(stages)}"
        )
        first = next(iter(self.contexts.values()), None)
        target = first.host.deploy_timings_json if first else None
        if target:
            path = Path(target).expanduser()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(timing_json(first.recipe.id, not failed, stages) + "\n")
            logger.info(f"--> Deploy timings written to {path}")


def stage(ctx: DeploymentContext, name: str | None) -> None:
    """While planning: the operations planned from here on belong to stage ``name`` (None: the deploy's end)."""
    state = context.state
    clock = getattr(state, "ironserve_clock", None)
    if clock is None:
        clock = DeployClock()
        state.ironserve_clock = clock
        state.add_callback_handler(clock)
    clock.contexts[ctx.host_name] = ctx
    clock.mark(state, name)
