"""Preflight: refuse to touch a host that is not the hardware the recipe was written for.

The first role of every deploy. pyinfra runs one operation on every host before the next, so a
mismatch found here stops the deploy before any change is made anywhere.

Checks (custom operations, evaluated from facts at plan time and again at execution time):

- ``check_platform``: CPU arch (``uname -m``) equals the profile's ``cpu_arch``; the OS is Debian or
  Ubuntu (the only OSes the apt-based roles support).
- ``check_devices``: the accelerators the driver reports (``nvidia-smi`` / ``npu-smi``) are
  ``accelerator.count`` devices named exactly ``accelerator.name``, and the recipe needs no more
  devices per node than are present. On a fresh host (no driver yet) the check is deferred: the
  driver role (nvidia_driver / ascend) runs the same operation again, strictly, once it installed
  the driver.

- ``modules_loadable`` (NVIDIA): Secure Boot (``mokutil --sb-state``) with unsigned DKMS modules, or signed
  precompiled modules asked for on an OS that has none, is refused with both ways out named.
- ``same_nvlink_clique`` (multi-node NVLink profiles, GB200): every host of this host's NVLink domain (host data
  ``nvlink_domain``, default one domain of all such hosts) reports one fabric clique (``nvidia-smi -q`` Fabric:
  State Completed, Status Success, one ClusterUUID + CliqueId). Peers' facts are read from the peers while
  planning. A host whose driver does not answer yet defers it; roles/imex.py runs it again strictly after the
  driver install, before IMEX is configured.

- ``uv_env.python_available`` (uv runtimes): the venv's Python can be had on this host without the internet where
  the host has none (roles/uv_env.py).

Every failure raises ``OperationError`` with one line per problem: host, what, expected, found, fix.

Host data:

- ``allow_emulated_arch`` (default ``false``): accept an x86_64 host for a profile of another architecture
  (aarch64: gb200, atlas-800i-a3), for hosts that stand in for it (emulators, test rigs); never set it on
  real servers.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.facts.server import Arch, LinuxDistribution

from ironserve import catalogue
from roles import uv_env
from roles.common import assignments, refuse
from roles.context import DeploymentContext

SUPPORTED_OS = ("debian", "ubuntu")
MODULE_SOURCES = ("dkms", "precompiled")
GPU_QUERY = "index,name,memory.total,driver_version,compute_cap"
# the converged record's one read of the GPUs (roles/converged.py): what GpuDevices, PersistenceMode and the driver
# version nvidia-smi answers with are read from, in one nvidia-smi call (its exit status and errors included)
GPU_STATE_READ = f'nvidia-smi --query-gpu={GPU_QUERY},persistence_mode --format=csv,noheader,nounits 2>&1; echo "rc $?"'


# --------------------------------------------------------------------------- facts


class GpuDevices(FactBase):
    """NVIDIA GPUs as the driver reports them: a list of dicts, ``None`` when nvidia-smi is absent.

    ``[]`` means nvidia-smi exists but no device answered (driver installed, module not loaded:
    typically a reboot is pending). ``|| true``: a failing nvidia-smi must not fail the fact, the
    check says what it means.
    """

    def requires_command(self) -> str:
        return "nvidia-smi"

    @staticmethod
    def light_paths():
        """What its value is read from (roles/converged.py): the GPUs' one read, shared."""
        return {"sh": GPU_STATE_READ}

    def command(self) -> str:
        return f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits || true"

    def process(self, output):
        devices = []
        for line in output:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 5 or not parts[0].isdigit():
                continue  # error text ("NVIDIA-SMI has failed ..."), not a device row
            index, name, memory, driver, cap = parts
            devices.append(
                {
                    "index": int(index),
                    "name": name,
                    "memory_mib": int(memory) if memory.isdigit() else None,
                    "driver_version": driver,
                    "compute_cap": cap,
                }
            )
        return devices


class NpuDevices(FactBase):
    """Ascend NPUs from ``npu-smi info -l``: a list of ``{npu_id, name, chip_count}``.

    A3 cards carry two dies each (``Chip Count : 2``); the profile counts dies, so the check sums
    ``chip_count``. ``None`` when npu-smi is absent, ``[]`` when it answers without devices.
    """

    def requires_command(self) -> str:
        return "npu-smi"

    def command(self) -> str:
        return "npu-smi info -l || true"

    def process(self, output):
        devices: list[dict] = []
        for line in output:
            key, sep, value = line.partition(":")
            if not sep:
                continue
            key, value = key.strip(), value.strip()
            if key == "NPU ID" and value.isdigit():
                devices.append({"npu_id": int(value), "name": None, "chip_count": 1})
            elif devices and key == "Product Name":
                devices[-1]["name"] = value
            elif devices and key == "Chip Count" and value.isdigit():
                devices[-1]["chip_count"] = int(value)
        return devices


class KernelState(FactBase):
    """What the NVIDIA modules need from the running kernel.

    ``{release, headers, nouveau, secure_boot}``: ``uname -r``; whether /lib/modules/<release>/build exists
    (what DKMS builds against); whether nouveau is loaded (/proc/modules); Secure Boot from
    ``mokutil --sb-state``: ``True``/``False``, ``None`` when unknown (no mokutil, no EFI: legacy boot).
    """

    def command(self) -> str:
        return (
            'r=$(uname -r); echo "release=$r"; '
            'if [ -e "/lib/modules/$r/build" ]; then echo headers=yes; else echo headers=no; fi; '
            "if grep -q '^nouveau ' /proc/modules 2>/dev/null; then echo nouveau=yes; else echo nouveau=no; fi; "
            'echo "sb=$(mokutil --sb-state 2>/dev/null | head -n 1)"'
        )

    def process(self, output):
        raw = assignments(output)
        sb = raw.get("sb", "").lower()
        return {
            "release": raw.get("release") or None,
            "headers": raw.get("headers") == "yes",
            "nouveau": raw.get("nouveau") == "yes",
            "secure_boot": True if "enabled" in sb else False if "disabled" in sb else None,
        }


class FabricInfo(FactBase):
    """The NVLink fabric each GPU reports (``nvidia-smi -q``, section Fabric): a list of
    ``{gpu, state, status, clique_id, cluster_uuid}``; ``None`` when nvidia-smi is absent or fails."""

    def command(self) -> str:
        return "nvidia-smi -q 2>/dev/null || true"

    def process(self, output):
        gpus: list[dict] = []
        fabric_indent = None
        seen_log = False
        for line in output:
            text = line.rstrip()
            stripped = text.strip()
            indent = len(text) - len(text.lstrip())
            if stripped.startswith("Attached GPUs"):
                seen_log = True
            if text.startswith("GPU ") and indent == 0:
                gpus.append(
                    {"gpu": stripped[4:], "state": None, "status": None, "clique_id": None, "cluster_uuid": None}
                )
                fabric_indent = None
                continue
            if stripped == "Fabric" and gpus:
                fabric_indent = indent
                continue
            if fabric_indent is not None:
                if indent <= fabric_indent:
                    fabric_indent = None
                    continue
                key, sep, value = stripped.partition(":")
                field = {
                    "State": "state",
                    "Status": "status",
                    "CliqueId": "clique_id",
                    "ClusterUUID": "cluster_uuid",
                }.get(key.strip())
                if sep and field and gpus[-1][field] is None:
                    gpus[-1][field] = value.strip()
        return gpus if seen_log else None


# --------------------------------------------------------------------------- pure helpers


def devices_needed(processes) -> int:
    """Accelerators the rendered engine processes of one host use together: each process's devices on its node
    (ironserve.spec.devices_per_node); several processes on one host (replicas) need their own, so they add up."""
    return sum(p.devices for p in processes if p.role != "router")


def platform_problems(
    host_name: str, cpu_arch: str, arch: str | None, distro: dict | None, allow_emulated_arch: bool = False
) -> list[str]:
    problems = []
    if arch != cpu_arch and not (allow_emulated_arch and arch == "x86_64"):
        problems.append(
            f"{host_name}: CPU architecture: expected {cpu_arch}, found {arch}. Fix: use a host of "
            f"the profile's architecture or another hardware profile (host data 'hardware')"
        )
    os_id = ((distro or {}).get("release_meta") or {}).get("ID", "").lower()
    if os_id not in SUPPORTED_OS:
        found = (distro or {}).get("name") or os_id or "unknown"
        problems.append(
            f"{host_name}: operating system: expected Debian or Ubuntu, found {found}. "
            f"Fix: reinstall the host with Debian 12 or Ubuntu 24.04"
        )
    return problems


def module_problems(host_name: str, kernel: dict | None, module_source: str, os_id: str) -> list[str]:
    """Why the NVIDIA modules could not load on this host as configured (checked before any change)."""
    kernel = kernel or {}
    problems = []
    if module_source not in MODULE_SOURCES:
        return [
            f"{host_name}: nvidia_module_source={module_source!r}: expected one of {', '.join(MODULE_SOURCES)}. "
            f"Fix: set host data nvidia_module_source=dkms (or precompiled on Ubuntu)"
        ]
    if module_source == "precompiled" and os_id != "ubuntu":
        problems.append(
            f"{host_name}: nvidia_module_source=precompiled: only Ubuntu ships signed precompiled NVIDIA "
            f"modules (linux-modules-nvidia-*-open-<kernel>), this host runs {os_id or 'an unknown OS'}. "
            f"Fix: use dkms (with Secure Boot off, or a MOK enrolled for DKMS)"
        )
    if kernel.get("secure_boot") and module_source == "dkms":
        problems.append(
            f"{host_name}: Secure Boot is enabled: DKMS-built NVIDIA modules are unsigned and the kernel will refuse "
            f"them. Fix: on Ubuntu set host data nvidia_module_source=precompiled (Canonical-signed "
            f"linux-modules-nvidia-<branch>-open-{kernel.get('release') or '<kernel>'}), or enroll a MOK for DKMS "
            f"(mokutil --import /var/lib/dkms/mok.pub, confirm at the next boot), or turn Secure Boot off"
        )
    return problems


ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def nvlink_domain(ctx: DeploymentContext) -> list:
    """The inventory hosts in this host's NVLink domain (host data ``nvlink_domain``, default: one domain of all
    hosts on multi-node NVLink profiles), in inventory order."""
    profiles = catalogue.hardware_profiles()
    mine = ctx.host.nvlink_domain
    out = []
    for h in ctx.hosts:
        profile = profiles.get(h.host_data.hardware or "")
        if profile is None or profile.accelerator.interconnect != "nvlink-mnnvl":
            continue
        if h.host_data.nvlink_domain == mine:
            out.append(h)
    return out


def host_clique(gpus: list[dict]) -> tuple[tuple[str, str] | None, list[str]]:
    """((cluster_uuid, clique_id), []) when every GPU registered with one fabric clique, else (None, why)."""
    why = []
    cliques = set()
    for g in gpus:
        if g.get("state") != "Completed" or g.get("status") != "Success":
            why.append(f"GPU {g.get('gpu')} fabric state {g.get('state')}/{g.get('status')}")
        elif not g.get("cluster_uuid") or g.get("cluster_uuid") == ZERO_UUID or g.get("clique_id") in (None, "0"):
            why.append(
                f"GPU {g.get('gpu')} has no clique (ClusterUUID {g.get('cluster_uuid')}, CliqueId {g.get('clique_id')})"
            )
        else:
            cliques.add((g["cluster_uuid"], g["clique_id"]))
    if not gpus:
        why.append("no GPU reports an NVLink fabric")
    if len(cliques) > 1:
        why.append("its GPUs are in different cliques: " + ", ".join(f"{u}/{c}" for u, c in sorted(cliques)))
    return (next(iter(cliques)) if len(cliques) == 1 and not why else None), why


def clique_problems(fabrics: dict[str, list[dict]]) -> list[str]:
    """All hosts of an NVLink domain in one clique (fabric cluster UUID + clique id), one line per problem."""
    problems, seen = [], {}
    for name, gpus in fabrics.items():
        clique, why = host_clique(gpus)
        problems += [f"{name}: {w}" for w in why]
        if clique:
            seen.setdefault(clique, []).append(name)
    if len(seen) > 1:
        groups = sorted(seen.items(), key=lambda kv: -len(kv[1]))
        for (uuid, clique), names in groups[1:]:
            problems.append(
                f"{', '.join(names)}: NVLink clique {uuid}/{clique}, but {', '.join(groups[0][1])} "
                f"report {groups[0][0][0]}/{groups[0][0][1]}"
            )
    if problems:
        problems.append(
            "Fix: the hosts of one NVLink domain must share one clique (nvidia-smi -q, Fabric: "
            "ClusterUUID and CliqueId). Put hosts of another rack/partition in another nvlink_domain "
            "(host data), or repair the fabric (NMX / fabric manager) of the host that differs"
        )
    return problems


def device_problems(host_name: str, vendor: str, name: str, count: int, needed: int, devices: list[dict]) -> list[str]:
    """What is wrong with the devices found (a list from GpuDevices / NpuDevices), as messages."""
    tool = "nvidia-smi" if vendor == "nvidia" else "npu-smi"
    if vendor == "huawei":
        found_count = sum(int(d.get("chip_count") or 1) for d in devices)
    else:
        found_count = len(devices)
    names = sorted({str(d.get("name")) for d in devices})
    problems = []
    if not devices:
        return [
            f"{host_name}: accelerators: expected {count} x {name}, found none ({tool} answers without "
            f"devices). Fix: the driver is installed but not loaded; reboot the host (or rerun with "
            f"--data allow_reboot=true), then check `{tool}` on the host"
        ]
    if found_count != count:
        problems.append(
            f"{host_name}: accelerator count: expected {count}, found {found_count}. Fix: check the "
            f"cards are seated and visible in `{tool}`, or pick the hardware profile of this host"
        )
    if names != [name]:
        problems.append(
            f"{host_name}: accelerator name: expected {name}, found {', '.join(names)}. Fix: set host "
            f"data 'hardware' to the profile of these cards"
        )
    if needed > found_count:
        problems.append(
            f"{host_name}: devices for the recipe: expected at least {needed} per node, found "
            f"{found_count}. Fix: pick a recipe with a smaller TP x PP or spread it over more nodes"
        )
    return problems


# --------------------------------------------------------------------------- operations


@operation()
def check_platform(cpu_arch: str, allow_emulated_arch: bool = False):
    """Fail unless the host's CPU arch and OS are what the hardware profile and the roles expect."""
    problems = platform_problems(
        host.name, cpu_arch, host.get_fact(Arch), host.get_fact(LinuxDistribution), allow_emulated_arch
    )
    refuse(problems, f"platform matches: {cpu_arch}, Debian/Ubuntu")
    return
    yield  # a generator that changes nothing


@operation()
def check_devices(vendor: str, device_name: str, count: int, needed: int = 0, defer_if_absent: bool = True):
    """Fail unless the driver reports ``count`` devices named ``device_name`` and at least ``needed``.

    ``defer_if_absent``: on a host without the driver (or where it is not loaded yet) say so and
    leave the check to the driver role, which calls this again with ``defer_if_absent=False``.
    """
    if vendor == "none":
        host.noop("no accelerators in this profile")
        return
    devices = host.get_fact(GpuDevices if vendor == "nvidia" else NpuDevices)
    if devices is None or (not devices and defer_if_absent):
        if defer_if_absent:
            host.noop("accelerator driver not installed (or not loaded) yet: devices are checked after the driver role")
            return
        if not host.state.is_executing:
            # Planning: the driver install planned just before has not run yet.
            host.noop("devices are checked once the driver is installed")
            return
        tool = "nvidia-smi" if vendor == "nvidia" else "npu-smi"
        raise OperationError(
            f"{host.name}: accelerators: expected {count} x {device_name}, found no {tool} after the "
            f"driver install. Fix: check the driver packages installed and `{tool}` runs on the host"
        )
    refuse(
        device_problems(host.name, vendor, device_name, count, needed, devices),
        f"devices match: {count} x {device_name}",
    )
    return
    yield


@operation()
def modules_loadable(module_source: str = "dkms"):
    """Refuse, before any change, a host whose kernel would not load the modules as configured."""
    kernel = host.get_fact(KernelState) or {}
    os_id = str(((host.get_fact(LinuxDistribution) or {}).get("release_meta") or {}).get("ID", "")).lower()
    sb = {True: "on", False: "off", None: "unknown (no EFI/mokutil)"}[kernel.get("secure_boot")]
    refuse(
        module_problems(host.name, kernel, module_source, os_id),
        f"kernel {kernel.get('release')}: {module_source} modules, Secure Boot {sb}",
    )
    return
    yield  # unreachable: an operation is a generator


@operation()
def same_nvlink_clique(peers: dict, strict: bool = False):
    """This host and its NVLink domain's ``peers`` (``{name: FabricInfo}``, read from those hosts) share one clique.

    Not strict (preflight): a host without a working driver yet defers the check; strict (imex role, after the
    driver): every host must answer. Executing, the peers' facts are read again (they were read while planning,
    when a fresh host had no driver yet).
    """
    if host.state.is_executing:
        peers = {name: peer_fabric(name) for name in (peers or {})}
    fabrics = {**(peers or {}), host.name: host.get_fact(FabricInfo)}
    unknown = sorted(n for n, v in fabrics.items() if v is None)
    if unknown and not (strict and host.state.is_executing):
        known = {n: v for n, v in fabrics.items() if v is not None}
        problems = clique_problems(known) if len(known) > 1 or host.name in known else []
        if problems:
            raise OperationError("NVLink clique check failed:\n  " + "\n  ".join(problems))
        host.noop(f"NVLink clique checked once the driver answers on {', '.join(unknown)}")
        return
    if unknown:
        raise OperationError(
            f"NVLink clique: no fabric information from {', '.join(unknown)} (nvidia-smi -q). "
            f"Fix: check the driver is loaded there"
        )
    problems = clique_problems(fabrics)
    if problems:
        raise OperationError("NVLink clique check failed:\n  " + "\n  ".join(problems))
    clique, _ = host_clique(fabrics[host.name])
    host.noop(f"{len(fabrics)} hosts in NVLink clique {clique[0]}/{clique[1]}")
    return
    yield  # unreachable: an operation is a generator


def peer_fabric(name: str):
    """FabricInfo read from another host of this run (None where it does not answer)."""
    peer = host.state.inventory.get_host(name, None)
    try:
        return peer.get_fact(FabricInfo) if peer is not None else None
    except Exception:  # a peer outside this run (--limit) or unreachable: unknown, said by the check
        return None


def domain_fabrics(ctx: DeploymentContext) -> dict:
    """FabricInfo of the other hosts of this host's NVLink domain."""
    return {h.name: peer_fabric(h.name) for h in nvlink_domain(ctx) if h.name != host.name}


def check_nvlink_clique(ctx: DeploymentContext, strict: bool) -> None:
    if ctx.profile.accelerator.interconnect != "nvlink-mnnvl" or len(nvlink_domain(ctx)) < 2:
        return
    same_nvlink_clique(name="NVLink domain: every host in one clique", peers=domain_fabrics(ctx), strict=strict)


# --------------------------------------------------------------------------- role


def check_devices_of(ctx: DeploymentContext, defer_if_absent: bool) -> None:
    """The device check for this context (preflight defers it; the driver roles call it strictly)."""
    acc = ctx.profile.accelerator
    check_devices(
        name=f"Check devices: {acc.count} x {acc.name}",
        vendor=acc.vendor,
        device_name=acc.name,
        count=acc.count,
        needed=devices_needed(ctx.processes),
        defer_if_absent=defer_if_absent,
    )


@deploy("ironserve: preflight")
def apply(ctx: DeploymentContext) -> None:
    check_platform(ctx.profile.cpu_arch, allow_emulated_arch=ctx.host.allow_emulated_arch)
    if ctx.vendor == "nvidia":
        modules_loadable(
            name="NVIDIA modules loadable (Secure Boot, module source)", module_source=ctx.host.nvidia_module_source
        )
    if ctx.vendor != "none":
        check_devices_of(ctx, defer_if_absent=True)
    # a host of another NVLink clique is refused here, before any change (once its driver answers)
    check_nvlink_clique(ctx, strict=False)
    # a uv runtime's interpreter: the OS's, a mirror's, or a refusal now rather than a raw download error later
    for venv, python in uv_env.venvs_of(ctx):
        uv_env.python_available(
            name=f"Python {python} for {venv}",
            recipe_id=ctx.recipe.id,
            python=python,
            venv=venv,
            air_gapped=bool(ctx.host.pip_index_url),
            mirror=bool(uv_env.python_sources(ctx.host)),
        )
