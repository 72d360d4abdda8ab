"""IMEX on multi-node NVLink hosts (GB200 NVL36/NVL72): the service CUDA needs to share memory across the nodes.

Without it (or without an IMEX channel) multi-node NVLink (MNNVL) allocations fail with insufficient
permission; the GB200 recipe mounts /dev/nvidia-caps-imex-channels/channel0 into its engines. Steps, after the
driver role (profiles whose interconnect is ``nvlink-mnnvl`` only):

1. The clique check of preflight again, strictly: every host of the NVLink domain now has a driver that answers,
   and all report one fabric clique (ClusterUUID + CliqueId), else nothing below changes.
2. ``nvidia-imex-<branch>`` at the driver's version (the driver role's apt pin covers it; held with it).
3. IMEX channel 0: the driver role sets ``NVreg_CreateImexChannel0=1`` so the driver creates it whenever it
   loads (every boot); a driver loaded before that option gets it now with mknod (major from /proc/devices).
4. ``/etc/nvidia-imex/nodes_config.cfg``: one address per line, every host of the NVLink domain in inventory
   order (host data ``imex_address``, default the host's ``ssh_hostname``), the same file on every host (IMEX
   compares the maps); config.cfg points IMEX_NODE_CONFIG_FILE at it.
5. nvidia-imex enabled and running, restarted when its nodes config changed (it reads it at start only), and
   healthy (``nvidia-imex-ctl -q`` READY) before any engine starts; engine units get a drop-in ordering them
   after nvidia-imex at boot.

Host data: ``nvlink_domain`` [default]: hosts with the same value form one IMEX/NVLink domain;
``imex_address`` [ssh_hostname]; ``imex_ready_timeout_s`` [120].
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, deploy, operation
from pyinfra.operations import apt, files, systemd

from ironserve.hostdata import DEFAULTS
from roles import nvidia_driver, preflight
from roles.common import assignments, put_text, run_if_changed
from roles.context import DeploymentContext
from roles.desired import DesiredFile, DesiredPackage, RuntimeCheck, present_check, text_file

IMEX_PACKAGE = "nvidia-imex-{branch}"
IMEX_DIR = "/etc/nvidia-imex"
CONFIG = f"{IMEX_DIR}/config.cfg"
NODES_CONFIG = f"{IMEX_DIR}/nodes_config.cfg"
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
CHANNEL0 = f"{CHANNEL_DIR}/channel0"
SERVICE = "nvidia-imex.service"
ENGINE_DROPIN = "/etc/systemd/system/{unit}.service.d/ironserve-imex.conf"


# --------------------------------------------------------------------------- facts


class ImexChannel(FactBase):
    """``{present, major}``: channel 0 is a character device; the major the loaded driver registered for
    nvidia-caps-imex-channels (None when it registered none)."""

    def command(self) -> str:
        return (
            f"if [ -c {CHANNEL0} ]; then echo present=yes; else echo present=no; fi; "
            'echo "major=$(awk \'$2 == "nvidia-caps-imex-channels" {print $1}\' /proc/devices 2>/dev/null)"'
        )

    def process(self, output):
        raw = assignments(output)
        major = raw.get("major", "")
        return {"present": raw.get("present") == "yes", "major": int(major) if major.isdigit() else None}


class ImexStatus(FactBase):
    """What ``nvidia-imex-ctl -q`` answers (READY when the local IMEX serves), None without it."""

    def requires_command(self) -> str:
        return "nvidia-imex-ctl"

    def command(self) -> str:
        return "nvidia-imex-ctl -q 2>&1 || true"

    def process(self, output):
        return "\n".join(output).strip() or None


# --------------------------------------------------------------------------- pure helpers


def imex_address(h) -> str:
    return h.host_data.imex_address or h.address


def nodes_config_text(addresses: list[str]) -> str:
    """One address per line (IMEX's format), the same text on every host of the domain."""
    return "".join(f"{a}\n" for a in addresses)


def channel0_command() -> str:
    """Create channel 0 from the major the loaded driver registered; fail with the fix when there is none."""
    return (
        "m=$(awk '$2 == \"nvidia-caps-imex-channels\" {print $1}' /proc/devices) && "
        'if [ -z "$m" ]; then echo \'the loaded nvidia module registered no nvidia-caps-imex-channels: '
        "reboot so the driver loads with NVreg_CreateImexChannel0=1' >&2; exit 1; fi && "
        f'mkdir -p {CHANNEL_DIR} && mknod -m 666 {CHANNEL0} c "$m" 0'
    )


# --------------------------------------------------------------------------- operations


@operation()
def channel0_present():
    """IMEX channel 0 exists (the driver option creates it at every load; mknod for a driver loaded before)."""
    state = host.get_fact(ImexChannel) or {}
    if state.get("present"):
        host.noop(f"{CHANNEL0} present")
        return
    yield f"[ -c {CHANNEL0} ] || {{ {channel0_command()}; }}"


@operation()
def imex_ready(timeout_s: int = DEFAULTS.imex_ready_timeout_s, restarting: bool = False):
    """The local IMEX answers READY (``nvidia-imex-ctl -q``), waiting up to ``timeout_s`` after a (re)start."""
    if host.get_fact(ImexStatus) == "READY" and not restarting:
        host.noop("nvidia-imex READY")
        return
    yield (
        f'for i in $(seq {int(timeout_s)}); do [ "$(nvidia-imex-ctl -q 2>&1)" = READY ] && exit 0; sleep 1; '
        f'done; echo "nvidia-imex not READY after {int(timeout_s)}s: $(nvidia-imex-ctl -q 2>&1)" >&2; '
        f"journalctl -u {SERVICE} -n 20 --no-pager >&2; exit 1"
    )


# --------------------------------------------------------------------------- role


def wanted(ctx: DeploymentContext) -> bool:
    return ctx.vendor == "nvidia" and nvidia_driver.nvlink_multinode(ctx)


def imex_package(ctx: DeploymentContext) -> str:
    return IMEX_PACKAGE.format(branch=nvidia_driver.branch(ctx))


def domain_addresses(ctx: DeploymentContext) -> list[str]:
    return [imex_address(h) for h in preflight.nvlink_domain(ctx)]


def engine_dropin_text() -> str:
    return (
        "# Managed by ironserve (roles/imex.py): MNNVL engines need IMEX serving first.\n"
        f"[Unit]\nWants={SERVICE}\nAfter={SERVICE}\n"
    )


@deploy("ironserve: IMEX (multi-node NVLink)")
def apply(ctx: DeploymentContext) -> None:
    if not wanted(ctx):
        return
    preflight.check_nvlink_clique(ctx, strict=True)
    version = ctx.host.nvidia_driver_version
    package = imex_package(ctx)
    apt.packages(
        name=f"Install {package}={version}",
        packages=[f"{package}={version}"],
        no_recommends=True,
        extra_install_args="--allow-change-held-packages",
    )
    nvidia_driver.packages_held(name=f"{package} held", packages=[package])
    channel0_present(name=f"IMEX channel 0 ({CHANNEL0})")
    nodes = put_text(
        f"{NODES_CONFIG}: the NVLink domain's {len(domain_addresses(ctx))} hosts",
        nodes_config_text(domain_addresses(ctx)),
        NODES_CONFIG,
    )
    config = files.line(
        name=f"{CONFIG} reads {NODES_CONFIG}",
        path=CONFIG,
        line="^IMEX_NODE_CONFIG_FILE=.*",
        replace=f"IMEX_NODE_CONFIG_FILE={NODES_CONFIG}",
    )
    restart = bool(nodes.changed or config.changed)
    service = systemd.service(
        name=f"{SERVICE} enabled and running", service=SERVICE, running=True, enabled=True, restarted=restart
    )
    imex_ready(
        name="nvidia-imex READY", timeout_s=ctx.host.imex_ready_timeout_s, restarting=restart or bool(service.changed)
    )
    dropins = [
        put_text(f"{p.unit} starts after {SERVICE}", engine_dropin_text(), ENGINE_DROPIN.format(unit=p.unit))
        for p in ctx.processes
        if p.role != "router"
    ]
    run_if_changed(name="systemctl daemon-reload (IMEX drop-ins)", triggers=dropins, command="systemctl daemon-reload")


# --------------------------------------------------------------------------- audit


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    if not wanted(ctx):
        return []
    dropins = [
        text_file(ENGINE_DROPIN.format(unit=p.unit), engine_dropin_text(), gate="service")
        for p in ctx.processes
        if p.role != "router"
    ]
    return [text_file(NODES_CONFIG, nodes_config_text(domain_addresses(ctx)), gate="driver"), *dropins]


def desired_packages(ctx: DeploymentContext) -> list[DesiredPackage]:
    if not wanted(ctx):
        return []
    return [DesiredPackage(imex_package(ctx), ctx.host.nvidia_driver_version)]


def desired_runtime(ctx: DeploymentContext) -> list[RuntimeCheck]:
    if not wanted(ctx):
        return []
    return [
        RuntimeCheck("imex:service-enabled", "enabled", f"systemctl is-enabled {SERVICE} 2>/dev/null || true"),
        RuntimeCheck("imex:ready", "READY", "nvidia-imex-ctl -q 2>&1 || true"),
        present_check("imex:channel0", f"[ -c {shlex.quote(CHANNEL0)} ]"),
    ]
