"""GPU memory clock offset (GDDR7 overclock), Max-Q cards only, set at every boot.

Seed 000: ``nvmlDeviceSetMemClkVfOffset(handle, 4000)`` through pynvml gains several percent of
decode speed on RTX PRO 6000 Max-Q cards. The offset is lost at every reboot or driver reload,
so it is a boot-time oneshot unit, ``ironserve-gpu-clocks.service`` (After=nvidia-persistenced),
running ``files/host/ironserve-gpu-clocks.py`` (installed as ``/usr/local/lib/ironserve/``) with
the offset from ``tuning.gpu_memory_clock_offset_mhz``. The script sets the offset on every GPU,
reads it back and exits non-zero on a mismatch, so a failed overclock fails the unit (and the
deploy), never silently.

pynvml comes from ``nvidia-ml-py`` in a small dedicated venv ``/opt/ironserve/tools`` (pip, pinned;
the engine's environment is not touched). The unit is enabled, and (re)started when the unit or the
script changed or the live offsets (fact ``MemClockOffsets``: the script with ``--read``) differ.

A non-Max-Q profile with an offset set is a configuration error: the deploy fails at once
(the lint rule reports it too).

Host data (defaults in ironserve/hostdata.py):

- ``pip_index_url`` (unset: the host's pip configuration): index for nvidia-ml-py
- ``nvidia_ml_py_version`` (``13.580.82``): nvidia-ml-py version (13.580.x matches driver 580)
- ``tools_venv`` (``/opt/ironserve/tools``)
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.operations import apt, files, pip, systemd

from ironserve.hostdata import DEFAULTS
from ironserve.resources import files_dir
from ironserve.units import UNIT_DIR, systemd_quote
from roles.context import DeploymentContext
from roles.desired import DesiredFile, text_file

UNIT = "ironserve-gpu-clocks.service"
SCRIPT_SOURCE = files_dir() / "host" / "ironserve-gpu-clocks.py"
SCRIPT = "/usr/local/lib/ironserve/ironserve-gpu-clocks.py"


# --------------------------------------------------------------------------- facts


class MemClockOffsets(FactBase):
    """Live memory clock offset per GPU in MHz: ``{"0": 4000, ...}``; ``None`` before the tools exist."""

    def command(self, python: str = f"{DEFAULTS.tools_venv}/bin/python", script: str = SCRIPT) -> str:
        # Never fail the fact: before the first deploy neither the venv nor the script exist.
        read = shlex.join(read_offsets_argv(python, script))
        python, script = shlex.quote(python), shlex.quote(script)
        return f"if [ -x {python} ] && [ -f {script} ]; then {read} 2>/dev/null || true; fi"

    def process(self, output):
        offsets = {}
        for line in output:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].lstrip("-").isdigit():
                offsets[parts[0]] = int(parts[1])
        return offsets or None


# --------------------------------------------------------------------------- pure helpers


def clock_offset(max_q: bool, offset: int | None, profile_id: str = "") -> int | None:
    """The offset to apply, ``None`` for none; an error for an offset on a non-Max-Q card."""
    if offset is None:
        return None
    if not max_q:
        raise OperationError(
            f"gpu_memory_clock_offset_mhz={offset} is set for {profile_id or 'this profile'}, which is not a Max-Q "
            "card: memory clock offsets are supported on Max-Q cards only. Fix: remove the offset from the "
            "recipe's tuning, or set hardware to the Max-Q profile if these are Max-Q cards"
        )
    return offset


def unit_text(offset: int, python: str = f"{DEFAULTS.tools_venv}/bin/python", script: str = SCRIPT) -> str:
    return (
        "# Managed by ironserve (roles/gpu_clocks.py); local edits are overwritten on the next deploy.\n"
        "[Unit]\n"
        f"Description=ironserve: GPU memory clock offset {offset} MHz (Max-Q)\n"
        "# NVML needs the driver loaded; persistenced keeps it initialised between clients.\n"
        "After=nvidia-persistenced.service\n"
        "Wants=nvidia-persistenced.service\n"
        "\n[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart={systemd_quote(python)} {systemd_quote(script)} --offset {int(offset)}\n"
        "\n[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def read_offsets_argv(python: str, script: str = SCRIPT) -> list[str]:
    """What reads the live offsets (``<index> <MHz>`` per GPU): the script, run by the tools venv's python."""
    return [python, script, "--read"]


def index_args(index: str | None) -> str | None:
    """pip's --index-url for pyinfra's pip.packages, which puts it into its shell command as it is: quoted here."""
    return f"--index-url {shlex.quote(index)}" if index else None


def offsets_drift(live: dict | None, offset: int) -> bool:
    return not live or any(int(v) != offset for v in live.values())


# --------------------------------------------------------------------------- operations


@operation()
def clock_unit(offset: int, unit: str = UNIT, python: str = f"{DEFAULTS.tools_venv}/bin/python", script: str = SCRIPT):
    """Install the script and the unit, enable it, (re)start it when they changed or offsets differ."""
    # Uploaded from memory, not by path: the plan (and its fixtures) must not depend on the checkout's location.
    changed = list(files.put._inner(StringIO(SCRIPT_SOURCE.read_text()), script, mode="755"))
    changed += list(files.put._inner(StringIO(unit_text(offset, python, script)), f"{UNIT_DIR}/{unit}", mode="644"))
    yield from changed
    if changed:
        yield "systemctl daemon-reload"
    drift = offsets_drift(host.get_fact(MemClockOffsets, python=python, script=script), offset)
    yield from systemd.service._inner(unit, running=True, restarted=bool(changed or drift), enabled=True)
    if not changed and not drift:
        host.noop(f"memory clock offset {offset} MHz on every GPU")


# --------------------------------------------------------------------------- role


@deploy("ironserve: GPU memory clocks")
def apply(ctx: DeploymentContext) -> None:
    offset = clock_offset(ctx.profile.accelerator.max_q, ctx.tuning.gpu_memory_clock_offset_mhz, ctx.profile.id)
    if offset is None:
        return
    venv = ctx.host.tools_venv
    index = ctx.host.pip_index_url
    apt.packages(name="python3-venv for the ironserve tools venv", packages=["python3-venv"], no_recommends=True)
    pip.venv(name=f"Tools venv {venv}", path=venv, python="python3")
    pip.packages(
        name="nvidia-ml-py (pynvml) in the tools venv",
        packages=[f"nvidia-ml-py=={ctx.host.nvidia_ml_py_version}"],
        # pyinfra joins both into its shell command as they are: quoted here
        pip=shlex.quote(f"{venv}/bin/pip"),
        extra_install_args=index_args(index),
    )
    clock_unit(name=f"GPU memory clock offset {offset} MHz at boot", offset=offset, python=f"{venv}/bin/python")


# --------------------------------------------------------------------------- audit


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    """The boot-time clock unit and its script, for `ironserve audit`."""
    if ctx.vendor != "nvidia":
        return []
    offset = clock_offset(ctx.profile.accelerator.max_q, ctx.tuning.gpu_memory_clock_offset_mhz, ctx.profile.id)
    if offset is None:
        return []
    python = f"{ctx.host.tools_venv}/bin/python"
    return [
        text_file(SCRIPT, SCRIPT_SOURCE.read_text(), 0o755, "driver"),
        text_file(f"{UNIT_DIR}/{UNIT}", unit_text(offset, python, SCRIPT), gate="driver"),
    ]
