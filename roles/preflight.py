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

from roles.common import truthy
from roles.context import DeploymentContext

SUPPORTED_OS = ("debian", "ubuntu")
GPU_QUERY = "index,name,memory.total,driver_version,compute_cap"


# --------------------------------------------------------------------------- facts


class GpuDevices(FactBase):
    """NVIDIA GPUs as the driver reports them: a list of dicts, ``None`` when nvidia-smi is absent.

    ``[]`` means nvidia-smi exists but no device answered (driver installed, module not loaded:
    typically a reboot is pending). ``|| true``: a failing nvidia-smi must not fail the fact, the
    check says what it means.
    """

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits || true"

    def process(self, output):
        devices = []
        for line in output:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 5 or not parts[0].isdigit():
                continue  # error text ("NVIDIA-SMI has failed ..."), not a device row
            index, name, memory, driver, cap = parts
            devices.append({
                "index": int(index),
                "name": name,
                "memory_mib": int(memory) if memory.isdigit() else None,
                "driver_version": driver,
                "compute_cap": cap,
            })
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


# --------------------------------------------------------------------------- pure helpers


def plain(value):
    """A fact value as plain data. Real facts are plain already; pyinfra-testing hands them to
    operations wrapped (``FakeFact.data``), where ``is None`` / ``len()`` / ``or`` misbehave."""
    return getattr(value, "data", value)


def devices_needed(processes) -> int:
    """Accelerators the rendered engine processes of one host use together: each process's devices on its node
    (ironserve.spec.devices_per_node); several processes on one host (replicas) need their own, so they add up."""
    return sum(p.devices for p in processes if p.role != "router")


def platform_problems(host_name: str, cpu_arch: str, arch: str | None, distro: dict | None,
                      allow_emulated_arch: bool = False) -> list[str]:
    problems = []
    if arch != cpu_arch and not (allow_emulated_arch and arch == "x86_64"):
        problems.append(f"{host_name}: CPU architecture: expected {cpu_arch}, found {arch}. Fix: use a host of "
                        f"the profile's architecture or another hardware profile (host data 'hardware')")
    os_id = ((distro or {}).get("release_meta") or {}).get("ID", "").lower()
    if os_id not in SUPPORTED_OS:
        found = (distro or {}).get("name") or os_id or "unknown"
        problems.append(f"{host_name}: operating system: expected Debian or Ubuntu, found {found}. "
                        f"Fix: reinstall the host with Debian 12 or Ubuntu 24.04")
    return problems


def device_problems(host_name: str, vendor: str, name: str, count: int, needed: int,
                    devices: list[dict]) -> list[str]:
    """What is wrong with the devices found (a list from GpuDevices / NpuDevices), as messages."""
    tool = "nvidia-smi" if vendor == "nvidia" else "npu-smi"
    if vendor == "huawei":
        found_count = sum(int(d.get("chip_count") or 1) for d in devices)
    else:
        found_count = len(devices)
    names = sorted({str(d.get("name")) for d in devices})
    problems = []
    if not devices:
        return [f"{host_name}: accelerators: expected {count} x {name}, found none ({tool} answers without "
                f"devices). Fix: the driver is installed but not loaded; reboot the host (or rerun with "
                f"--data allow_reboot=true), then check `{tool}` on the host"]
    if found_count != count:
        problems.append(f"{host_name}: accelerator count: expected {count}, found {found_count}. Fix: check the "
                        f"cards are seated and visible in `{tool}`, or pick the hardware profile of this host")
    if names != [name]:
        problems.append(f"{host_name}: accelerator name: expected {name}, found {', '.join(names)}. Fix: set host "
                        f"data 'hardware' to the profile of these cards")
    if needed > found_count:
        problems.append(f"{host_name}: devices for the recipe: expected at least {needed} per node, found "
                        f"{found_count}. Fix: pick a recipe with a smaller TP x PP or spread it over more nodes")
    return problems


# --------------------------------------------------------------------------- operations


@operation()
def check_platform(cpu_arch: str, allow_emulated_arch: bool = False):
    """Fail unless the host's CPU arch and OS are what the hardware profile and the roles expect."""
    problems = platform_problems(host.name, cpu_arch, host.get_fact(Arch), host.get_fact(LinuxDistribution),
                                 allow_emulated_arch)
    if problems:
        raise OperationError("\n".join(problems))
    host.noop(f"platform matches: {cpu_arch}, Debian/Ubuntu")
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
    devices = plain(devices)
    if devices is None or (not devices and defer_if_absent):
        if defer_if_absent:
            host.noop("accelerator driver not installed (or not loaded) yet: devices are checked after the driver role")
            return
        if not host.state.is_executing:
            # Planning: the driver install planned just before has not run yet.
            host.noop("devices are checked once the driver is installed")
            return
        tool = "nvidia-smi" if vendor == "nvidia" else "npu-smi"
        raise OperationError(f"{host.name}: accelerators: expected {count} x {device_name}, found no {tool} after the "
                             f"driver install. Fix: check the driver packages installed and `{tool}` runs on the host")
    problems = device_problems(host.name, vendor, device_name, count, needed, devices)
    if problems:
        raise OperationError("\n".join(problems))
    host.noop(f"devices match: {count} x {device_name}")
    return
    yield


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
    check_platform(ctx.profile.cpu_arch, allow_emulated_arch=truthy(ctx.get("allow_emulated_arch"), False))
    if ctx.vendor != "none":
        check_devices_of(ctx, defer_if_absent=True)
