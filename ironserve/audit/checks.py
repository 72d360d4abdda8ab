"""Audit checks as data: derived from the same deployment context the deploy applies.

A Check names what is compared on which host, what is expected and how to fix a difference. Its `kind`
selects an evaluator (ironserve.audit.evaluate) that reads the host through testinfra. Nothing here is
per model: every check comes from the recipe, the hardware profile, the rendered processes and the files
ironserve.units renders, so a new recipe is audited without new code.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from ironserve.flags import split_flags
from ironserve.units import UNIT_DIR, env_path, rank_guard_unit, sha256_text, staged_path, unit_files

from . import providers


@dataclass
class Check:
    host: str
    id: str  # stable, e.g. sysctl:vm.swappiness
    kind: str  # evaluator name
    expected: Any
    params: dict = field(default_factory=dict)
    gate: str = "host"  # ordered gates, GPU Operator style: host -> driver -> runtime -> service -> workload
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


GATES = ["host", "driver", "runtime", "service", "workload"]


def _fix(deploy: str, inventory: str, host: str) -> str:
    return f"pyinfra {inventory} {deploy} --limit {host}"


def rendered_args(proc) -> dict:
    """The engine's rendered flags as SGLang's server info names them: {dest: value, True for a switch, [values]}."""
    return {
        name[2:].replace("-", "_"): (True if not values else values[0] if len(values) == 1 else list(values))
        for name, values in split_flags(proc.engine_args)
    }


def derive_checks(ctx, deploy: str, inventory: str) -> list[Check]:
    """All checks for one host, from its DeploymentContext (roles.context.build_context)."""
    host = ctx.host_name
    fix = _fix(deploy, inventory, host)
    checks: list[Check] = []

    def add(check_id: str, kind: str, expected, gate: str, **params):
        checks.append(Check(host, check_id, kind, expected, params, gate, fix))

    tuning = ctx.tuning
    if tuning.governor:
        add("cpu-governor", "governor", tuning.governor, "host")
    for key, value in tuning.sysctls.items():
        add(f"sysctl:{key}", "sysctl", str(value), "host", key=key)
    for item in providers.role_files(ctx):
        add(f"file:{item.path}", "file", item.sha256, item.gate, path=item.path, mode=item.mode, owner="root")
    for pkg in providers.role_packages(ctx):
        add(f"package:{pkg.name}", "package", pkg.version, pkg.gate, name=pkg.name)
    if ctx.vendor == "nvidia":
        accel = ctx.profile.accelerator
        add("gpu-devices", "gpus", {"count": accel.count, "name": accel.name}, "driver")
        # persistence mode on every GPU (roles/nvidia_driver.py), read by the same nvidia-smi run
        add("gpu:persistence-mode", "persistence_mode", "Enabled", "runtime")
        if accel.max_q and tuning.gpu_memory_clock_offset_mhz:
            from roles.gpu_clocks import read_offsets_argv

            read = shlex.join(read_offsets_argv(f"{ctx.host.tools_venv}/bin/python"))
            add("gpu-memory-clock-offset", "clock_offsets", tuning.gpu_memory_clock_offset_mhz, "driver", cmd=read)
    elif ctx.vendor == "huawei":
        add("npu-devices", "npus", {"count": ctx.profile.accelerator.count}, "driver")
    for item in providers.runtime_checks(ctx):
        add(item.id, item.kind, item.expected, "runtime", cmd=item.cmd, **({"item": item.item} if item.item else {}))

    from roles.undeclared import declared_units

    # a stray engine or router unit (another recipe's, one started by hand) is drift, named by unit
    add("units:undeclared", "undeclared_units", [f"{u}.service" for u in declared_units(ctx.processes)], "service")

    for proc in ctx.processes:
        _process_checks(ctx, proc, add)
    return checks


def _process_checks(ctx, proc, add) -> None:
    """The checks of one rendered process: its unit and env files, its units' states, its port, health and
    effective arguments."""
    from roles.rolling import roll_script
    from roles.sglang_service import process_secrets

    tuning = ctx.tuning
    # which secrets exist shapes the unit (an API key runs the engine through ironserve-exec); their values
    # are compared nowhere, the env file check skips them
    files = unit_files(ctx.recipe, proc, tuning, secrets=process_secrets(ctx, proc, read=False))
    # launch=false: the configuration is staged (validated, not live); a launch makes it the live one
    where = (lambda path: path) if ctx.launch else staged_path
    unit_path = where(f"{UNIT_DIR}/{files.unit_name}")
    add(
        f"unit-file:{files.unit_name}",
        "file",
        sha256_text(files.unit_text),
        "service",
        path=unit_path,
        mode=0o644,
        owner="root",
    )
    add(f"env-file:{files.unit_name}", "env_file", files.env_text, "service", path=where(files.env_path), mode=0o600)
    add(f"unit-active:{files.unit_name}", "service_active", ctx.launch, "service", name=files.unit_name)
    units = [files.unit_name]
    if proc.in_rank_group:
        # the guard that restarts the group as a whole runs whenever its engine does
        guard = f"{rank_guard_unit(proc)}.service"
        add(f"unit-active:{guard}", "service_active", ctx.launch, "service", name=guard)
        units.append(guard)
    if not ctx.launch:
        return
    add(f"unit-enabled:{files.unit_name}", "service_enabled", True, "service", name=files.unit_name)
    for name in units:
        # the files on disk are what systemd runs: a run killed between writing and reloading shows here
        add(f"unit-loaded:{name}", "daemon_reloaded", True, "service", name=name)
    if proc.health_url:
        add(f"port:{proc.port}", "listening", True, "workload", port=proc.port)
        add(f"health:{proc.unit}", "http_ok", 200, "workload", url=proc.health_url)
    if proc.health_url and proc.role != "router":
        add(
            f"server-args:{proc.unit}",
            "server_args",
            rendered_args(proc),
            "workload",
            cmd=roll_script("server-info", proc.local_url(""), env_path(proc)),
        )
