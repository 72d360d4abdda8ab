"""Host tuning: CPU governor, sysctls, resource limits and /dev/shm, persistent across reboots.

The seeds tune hosts by hand (``echo performance | tee .../scaling_governor``, ``sysctl -w ...``),
which a reboot undoes. Here every setting is persistent *and* applied now:

- CPU governor (``tuning.governor``): the oneshot unit ``ironserve-cpu-governor.service`` writes it
  to every ``/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor`` at boot; it is enabled, and
  (re)started when the unit changed or the live governor of any CPU (fact ``CpuGovernors``)
  differs. Hosts without cpufreq (VMs) get the unit but nothing to start.
- sysctls (``tuning.sysctls``): ``/etc/sysctl.d/90-ironserve.conf``, applied with ``sysctl -e -p``
  only when the file changed or a live value (fact ``SysctlValues``) differs. Keys the kernel
  does not have (``kernel.sched_migration_cost_ns`` moved to debugfs in Linux 5.13) are reported,
  not retried forever.
- limits (``tuning.limits``): ``/etc/security/limits.d/90-ironserve.conf`` for login sessions
  (``memlock``, ``stack``, ``nofile``); the engine's service units set ``Limit*`` themselves,
  since pam_limits does not apply to systemd services.
- ``/dev/shm`` (``tuning.shm_size``): an fstab line (persistent) and a remount when the live size
  (fact ``ShmSize``, ``df -k``) differs.
- ``SGLANG_SET_CPU_AFFINITY=1`` (``tuning.cpu_affinity``) is engine env, in the recipes' ``env``:
  the service units carry it, nothing to do on the host.

Host data (defaults in ironserve/hostdata.py):

- ``governor_unit`` (``ironserve-cpu-governor.service``)
- ``sysctl_file`` (``/etc/sysctl.d/90-ironserve.conf``)
- ``limits_file`` (``/etc/security/limits.d/90-ironserve.conf``)
"""

from __future__ import annotations

import re
import shlex
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FactBase, deploy, operation
from pyinfra.operations import files, systemd

from ironserve.hostdata import DEFAULTS
from ironserve.spec import control_problem
from ironserve.units import UNIT_DIR
from roles.common import keyed_lines, put_text
from roles.context import DeploymentContext
from roles.desired import DesiredFile, text_file

CPUFREQ_GLOB = "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"
HEADER = "# Managed by ironserve ({}); local edits are overwritten on the next deploy.\n"


# --------------------------------------------------------------------------- facts


class CpuGovernors(FactBase):
    """Live scaling governor per CPU: ``{"cpu0": "performance", ...}``; ``{}`` without cpufreq."""

    def command(self) -> str:
        return (
            f'for f in {CPUFREQ_GLOB}; do [ -r "$f" ] || continue; '
            'c=${f#/sys/devices/system/cpu/}; echo "${c%%/*} $(cat "$f")"; done'
        )

    def process(self, output):
        return keyed_lines(output)

    @staticmethod
    def default():
        return {}


class SysctlValues(FactBase):
    """Live values of the given sysctl keys (``sysctl -n`` each): ``{key: value}``, ``None`` if unknown.

    Multi-value sysctls (``net.ipv4.tcp_rmem``) come back with whitespace collapsed to one space.
    """

    def command(self, keys: list[str]) -> str:
        names = shlex.join(keys)
        return f'for k in {names}; do printf "%s=" "$k"; sysctl -n "$k" 2>/dev/null || echo; done'

    def process(self, output):
        values = {}
        for line in output:
            key, sep, value = line.partition("=")
            if sep:
                value = " ".join(value.split())
                values[key.strip()] = value if value else None
        return values


class ShmSize(FactBase):
    """Size of ``/dev/shm`` in KiB (``df -k``), ``None`` when it is not mounted."""

    def command(self) -> str:
        return "df -k --output=size /dev/shm 2>/dev/null | tail -n 1 || true"

    def process(self, output):
        text = "".join(output).strip()
        return int(text) if text.isdigit() else None


# --------------------------------------------------------------------------- pure helpers


def size_kib(size: str) -> int:
    """``8g`` -> 8388608 (KiB), as tmpfs's ``size=`` reads it (no suffix = bytes)."""
    m = re.fullmatch(r"([0-9]+)([kmgKMG]?)", size)
    if not m:
        raise ValueError(f"not a size: {size!r}")
    number, unit = int(m.group(1)), m.group(2).lower()
    factor = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[unit]
    return number * factor // 1024


def governor_unit_text(governor: str) -> str:
    # $$f: systemd expands $f itself; $$ passes a literal $ to the shell.
    return (
        HEADER.format("roles/host_tuning.py") + "[Unit]\n"
        f"Description=ironserve: CPU frequency governor {governor} on every CPU\n"
        "# cpufreq appears once the CPU frequency drivers are loaded.\n"
        "After=systemd-modules-load.service\n"
        "\n[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f'ExecStart=/bin/sh -c \'for f in {CPUFREQ_GLOB}; do [ -e "$$f" ] || continue; '
        f'echo {governor} > "$$f" || exit 1; done\'\n'
        "\n[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def sysctl_text(values: dict) -> str:
    lines = [
        HEADER.format("roles/host_tuning.py").rstrip("\n"),
        "# Host tuning from the hardware profile and the recipe (tuning.sysctls).",
    ]
    for key, value in sorted(values.items()):
        # one line per setting: a line break in a value would be a second setting (kernel.core_pattern=|...)
        if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", key) or control_problem(str(value)):
            raise ValueError(f"sysctl {key}: not a sysctl name, or the value has a control character")
        lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def limits_text(memlock, stack: int | None, nofile: int | None) -> str:
    """limits.conf lines for every user and root ('*' does not match root in pam_limits).

    limits.conf counts memlock and stack in KiB; the tuning gives bytes (stack=67108864 as in
    the seeds' ``docker --ulimit stack=67108864``).
    """
    items = []
    if memlock is not None:
        items.append(("memlock", "unlimited" if memlock == "unlimited" else str(int(memlock) // 1024)))
    if stack is not None:
        items.append(("stack", str(int(stack) // 1024)))
    if nofile is not None:
        items.append(("nofile", str(int(nofile))))
    lines = [
        HEADER.format("roles/host_tuning.py").rstrip("\n"),
        "# Login sessions; the engine's systemd units set Limit* themselves.",
    ]
    for domain in ("*", "root"):
        for item, value in items:
            for kind in ("soft", "hard"):
                lines.append(f"{domain:<5} {kind:<4} {item:<8} {value}")
    return "\n".join(lines) + "\n"


def fstab_shm_line(size: str) -> str:
    return f"tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size={size} 0 0"


def sysctl_drift(values: dict, live: dict) -> tuple[list[str], list[str]]:
    """(keys whose live value differs, keys the kernel does not have)."""
    differ, unknown = [], []
    for key, want in sorted(values.items()):
        have = live.get(key)
        if have is None:
            unknown.append(key)
        elif have != " ".join(str(want).split()):
            differ.append(key)
    return differ, unknown


# --------------------------------------------------------------------------- operations


@operation()
def cpu_governor(governor: str, unit: str = DEFAULTS.governor_unit):
    """Install, enable and (re)start the oneshot unit that sets ``governor`` on every CPU."""
    unit_path = f"{UNIT_DIR}/{unit}"
    put = list(files.put._inner(StringIO(governor_unit_text(governor)), unit_path, mode="644"))
    yield from put
    if put:
        yield "systemctl daemon-reload"
    live = host.get_fact(CpuGovernors) or {}
    if not live:
        # No cpufreq (VM, container): the unit is in place for the day it has one; nothing to run.
        yield from systemd.service._inner(unit, running=None, enabled=True)
        if not put:
            host.noop(f"{unit} enabled; this host has no cpufreq")
        return
    drift = sorted(cpu for cpu, g in live.items() if g != governor)
    yield from systemd.service._inner(unit, running=True, restarted=bool(put or drift), enabled=True)
    if not put and not drift:
        host.noop(f"governor {governor} on all {len(live)} CPUs")


@operation()
def sysctl_file(values: dict, path: str = DEFAULTS.sysctl_file):
    """Write ``values`` to a sysctl.d file; ``sysctl -e -p`` it when it changed or a live value differs."""
    if not values:
        host.noop("no sysctls to set")
        return
    put = list(files.put._inner(StringIO(sysctl_text(values)), path, mode="644"))
    yield from put
    live = host.get_fact(SysctlValues, keys=sorted(values)) or {}
    differ, unknown = sysctl_drift(values, live)
    if put or differ:
        # -e: a key this kernel lacks must not stop the others from being applied.
        yield f"sysctl -e -p {shlex.quote(path)}"
    else:
        host.noop(f"{len(values) - len(unknown)} sysctls set")
    if unknown:
        logger.warning(
            f"{host.name}: kernel has no sysctl {', '.join(unknown)}: written to {path} but not "
            "applied (kernel.sched_* knobs moved to debugfs in Linux 5.13)"
        )


@operation()
def shm_size(size: str):
    """Remount ``/dev/shm`` with ``size`` when its live size differs (the fstab line persists it)."""
    have = host.get_fact(ShmSize)
    want = size_kib(size)
    if have == want:
        host.noop(f"/dev/shm is {size}")
        return
    if have is None:
        yield f"mkdir -p /dev/shm && mount -t tmpfs -o {shlex.quote(f'defaults,nosuid,nodev,size={size}')} tmpfs /dev/shm"
    else:
        yield f"mount -o {shlex.quote(f'remount,size={size}')} /dev/shm"


# --------------------------------------------------------------------------- role


@deploy("ironserve: host tuning")
def apply(ctx: DeploymentContext) -> None:
    tuning = ctx.tuning
    if tuning.governor:
        cpu_governor(
            name=f"CPU governor {tuning.governor} (persistent unit)",
            governor=tuning.governor,
            unit=ctx.host.governor_unit,
        )
    if tuning.sysctls:
        sysctl_file(name="sysctls", values=dict(tuning.sysctls), path=ctx.host.sysctl_file)
    limits = tuning.limits
    if any(v is not None for v in (limits.memlock, limits.stack, limits.nofile)):
        put_text(
            "Login session limits (memlock, stack, nofile)",
            limits_text(limits.memlock, limits.stack, limits.nofile),
            ctx.host.limits_file,
        )
    if tuning.shm_size:
        files.line(
            name=f"/dev/shm size {tuning.shm_size} in fstab",
            path="/etc/fstab",
            line=r"^[^#]*[[:space:]]/dev/shm[[:space:]]",
            replace=fstab_shm_line(tuning.shm_size),
        )
        shm_size(name=f"/dev/shm size {tuning.shm_size} now", size=tuning.shm_size)


# --------------------------------------------------------------------------- audit


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    """What this role writes, for `ironserve audit` (same text functions as the operations above)."""
    tuning = ctx.tuning
    out = []
    if tuning.governor:
        out.append(text_file(f"{UNIT_DIR}/{ctx.host.governor_unit}", governor_unit_text(tuning.governor)))
    if tuning.sysctls:
        out.append(text_file(ctx.host.sysctl_file, sysctl_text(dict(tuning.sysctls))))
    limits = tuning.limits
    if any(v is not None for v in (limits.memlock, limits.stack, limits.nofile)):
        out.append(text_file(ctx.host.limits_file, limits_text(limits.memlock, limits.stack, limits.nofile)))
    return out
