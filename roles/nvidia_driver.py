"""NVIDIA driver: NVIDIA's apt repository, the pinned open-kernel-module driver, persistenced, reboots.

Blackwell (sm120, sm100) needs the open kernel modules of branch 580 or later, so the driver is
``nvidia-open-<profile.driver_branch>`` at an exact version, held there by an apt preferences file
(Pin-Priority 1001) so that a routine ``apt upgrade`` cannot move it under a running engine.

Steps:

1. Repository: a deb822 source ``/etc/apt/sources.list.d/nvidia-cuda.sources`` (a flat repo,
   ``Suites: /``) signed by ``/usr/share/keyrings/ironserve-nvidia.gpg``. The keyring is uploaded
   from the controller (``nvidia_apt_key_file``, a binary or ASCII-armored key) or fetched from
   ``<mirror>/<nvidia_apt_key_name>`` and dearmored on the host, only when it is exactly the key
   ``nvidia_apt_key_fingerprint`` (NVIDIA's CUDA key by default; roles/apt_keys.py). With ``apt_trusted=true`` (the
   lab's own repository) there is no key: the source says ``Trusted: yes``.
2. ``apt-get update`` only when a pinned version is neither installed nor known to apt (fact
   ``AptVersions``), so a converged host plans no change.
3. Packages: the driver (pinned) and ``nvidia-persistenced`` (same upstream version through the
   pin), persistenced enabled and running.
4. Reboot, said plainly: fact ``NvidiaDriverState`` compares the loaded driver
   (``/sys/module/nvidia/version``; where there is no kernel module, as in containers and the lab,
   the version nvidia-smi answers with) with the installed package, and reads
   ``/var/run/reboot-required``. When a reboot is needed the deploy prints a warning naming the
   host; only with ``allow_reboot=true`` does it reboot (``server.reboot``) and wait for the host.
5. The device check that preflight deferred on fresh hosts runs again, strictly.

Real-host steps around the package (Ubuntu 22.04/24.04 on x86_64 and aarch64/sbsa, 64k-page kernels included,
and Debian 12):

- Kernel modules: with ``nvidia_module_source=dkms`` (default) the headers of the RUNNING kernel
  (``linux-headers-$(uname -r)``, also for ``-nvidia-64k`` kernels) are installed before the driver: Ubuntu's
  dkms only recommends the headers and the role installs without recommends, so without them the module build
  fails (NVIDIA/open-gpu-kernel-modules#441). ``precompiled`` (Ubuntu only) installs Canonical's signed
  ``linux-modules-nvidia-<branch>-open-$(uname -r)`` with ``nvidia-driver-<branch>-open`` instead: the path for
  Secure Boot. Secure Boot (``mokutil --sb-state``) with unsigned DKMS modules is refused by preflight before
  any change, naming both ways out.
- nouveau: blacklisted in /etc/modprobe.d (``options nouveau modeset=0``), the initramfs rebuilt when that file
  (or the nvidia module options) changed; a loaded nouveau is unloaded, or the host is marked for a reboot.
- Held: the driver, the modules/headers of the running kernel and the installed kernel packages are
  ``apt-mark hold``; unattended-upgrades blacklists kernel and NVIDIA packages and never reboots on its own
  (kernel updates break DKMS builds). The deploy itself moves the pin (``--allow-change-held-packages``).
- Persistence mode: a drop-in runs nvidia-persistenced WITH persistence mode (some packaged units pass
  ``--no-persistence-mode``); every GPU must then report Enabled (``nvidia-smi -pm 1`` otherwise).
- NVLink multi-node profiles (GB200): ``options nvidia NVreg_CreateImexChannel0=1`` so the driver creates IMEX
  channel 0 whenever it loads (roles/imex.py creates it now when the module was loaded before), and DCGM
  (``dcgm``, default on for these profiles: ``datacenter-gpu-manager-4-cuda<major>``, nvidia-dcgm enabled).
- NVSwitch boards (HGX/DGX H100, H200, B200: profiles with ``fabric_manager: true``): NVIDIA Fabric Manager,
  installed with the driver at the driver's exact version (``nvidia_driver_version``; Fabric Manager refuses to
  start on any other), pinned and held with it, ``nvidia-fabricmanager.service`` enabled and running. Without it
  CUDA cannot initialise the GPUs of such a board.

Host data (defaults in ironserve/hostdata.py):

- ``nvidia_apt_mirror``: repository URL (default: NVIDIA's CUDA repository for the host's OS and
  arch, e.g. ``.../ubuntu2404/x86_64/``, ``.../debian12/sbsa/`` on aarch64)
- ``nvidia_apt_key_file``: keyring on the controller to upload (default: fetch from the mirror)
- ``nvidia_apt_key_name`` (``3bf863cc.pub``): the key's file name in the repository
- ``nvidia_apt_key_fingerprint`` (NVIDIA's, EB693B30...3BF863CC): the only key a fetched one may be
- ``apt_signed_by``: a keyring already on the hosts for the cluster's mirrors; with
  ``nvidia_apt_mirror`` set it is the Signed-By as it is (nothing uploaded or fetched)
- ``apt_trusted`` (``false``): trust the mirror without a key (lab)
- ``nvidia_driver_version`` (``580.95.05-1``): exact Debian version of the driver package
- ``allow_reboot`` (``false``): reboot when the installed driver is not the loaded one
- ``reboot_timeout`` (``900``): seconds to wait for the host to come back
- ``nvidia_module_source`` (``dkms``): ``dkms`` (headers of the running kernel) or ``precompiled`` (Ubuntu's
  signed modules; required with Secure Boot on)
- ``dcgm`` (on for NVLink multi-node profiles, else off): install and run NVIDIA DCGM
"""

from __future__ import annotations

import base64
import shlex
from io import BytesIO, StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Arch, KernelVersion, LinuxDistribution
from pyinfra.operations import apt, files, server, systemd

from ironserve.hostdata import DEFAULTS
from roles import preflight
from roles.apt_keys import pinned_key
from roles.common import assignments, deb822_source, put_text, run_if_changed
from roles.context import DeploymentContext
from roles.desired import DesiredFile, DesiredPackage, RuntimeCheck, present_check, text_file

# The one place NVIDIA's public repository is named; air-gapped clusters set nvidia_apt_mirror.
NVIDIA_CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}/"
SOURCE_FILE = "/etc/apt/sources.list.d/nvidia-cuda.sources"
KEYRING = "/usr/share/keyrings/ironserve-nvidia.gpg"
PREFERENCES_FILE = "/etc/apt/preferences.d/ironserve-nvidia-driver.pref"
DRIVER_PACKAGE = "nvidia-open-{branch}"
PERSISTENCED = "nvidia-persistenced"
# what apt-cache answers from: its lists, its sources and its settings (the converged record's read, roles/converged.py)
APT_READS = ["/var/lib/apt/lists/*", "/etc/apt/sources.list", "/etc/apt/sources.list.d/*", "/etc/apt/apt.conf.d/*"]
REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}  # NVIDIA names its arm64 server repos "sbsa"
NOUVEAU_CONF = "/etc/modprobe.d/ironserve-blacklist-nouveau.conf"
NOUVEAU_TEXT = (
    "# Managed by ironserve (roles/nvidia_driver.py): nouveau must not bind the GPUs first.\n"
    "blacklist nouveau\noptions nouveau modeset=0\n"
)
NVIDIA_OPTIONS_CONF = "/etc/modprobe.d/ironserve-nvidia.conf"
UNATTENDED_CONF = "/etc/apt/apt.conf.d/51ironserve-hold-kernel-and-nvidia"
# unattended-upgrades reads these as regular expressions over package names
UNATTENDED_TEXT = """// Managed by ironserve (roles/nvidia_driver.py): a kernel or driver update breaks the NVIDIA modules
// under a running engine; they move only with a deploy.
Unattended-Upgrade::Package-Blacklist {
    "linux-image-";
    "linux-headers-";
    "linux-modules-";
    "linux-generic";
    "linux-nvidia";
    "nvidia-";
    "libnvidia-";
    "datacenter-gpu-manager";
};
Unattended-Upgrade::Automatic-Reboot "false";
"""
PERSISTENCED_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/ironserve-persistence-mode.conf"
PERSISTENCED_TEXT = (
    "# Managed by ironserve (roles/nvidia_driver.py): persistence mode ON (some packaged units pass\n"
    "# --no-persistence-mode): the driver stays initialised between engine restarts.\n"
    "[Service]\nExecStart=\n"
    "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --persistence-mode --verbose\n"
)
# kernel packages held with the running kernel's (where installed): the metapackages that would pull a new one
KERNEL_METAPACKAGES = (
    "linux-generic",
    "linux-image-generic",
    "linux-headers-generic",
    "linux-image-amd64",
    "linux-image-arm64",
    "linux-headers-amd64",
    "linux-headers-arm64",
    "linux-nvidia-64k",
    "linux-image-nvidia-64k",
    "linux-headers-nvidia-64k",
    "linux-generic-hwe-22.04",
    "linux-generic-hwe-24.04",
)
DCGM_PACKAGE = "datacenter-gpu-manager-4-cuda{major}"
# NVIDIA's CUDA repositories name Fabric Manager per branch up to 575 (nvidia-fabricmanager-570, 570.172.08-1) and
# without the branch from 580 on (nvidia-fabricmanager, 580.65.06-1). Its version follows the driver's; the pin's
# /nvidia/ line and the unattended-upgrades blacklist ("nvidia-") already cover it.
FABRIC_MANAGER = "nvidia-fabricmanager"
FABRIC_MANAGER_UNBRANCHED_FROM = 580
FABRIC_MANAGER_SERVICE = "nvidia-fabricmanager.service"


# --------------------------------------------------------------------------- facts


class AptVersions(FactBase):
    """Versions apt knows for each package (``apt-cache madison``): ``{package: [version, ...]}``."""

    @staticmethod
    def light_paths(packages):
        """What madison answers from (roles/converged.py): apt's lists, its sources and settings, dpkg's status."""
        return {"paths": [*APT_READS, "/var/lib/dpkg/status"]}

    def command(self, packages: list[str]) -> str:
        names = shlex.join(packages)
        return (
            f'for p in {names}; do apt-cache madison "$p" 2>/dev/null | awk -v p="$p" \'{{print p" "$3}}\'; done; true'
        )

    def process(self, output):
        versions: dict[str, list[str]] = {}
        for line in output:
            package, _, version = line.strip().partition(" ")
            if package and version and version not in versions.setdefault(package, []):
                versions[package].append(version)
        return versions

    @staticmethod
    def default():
        return {}


class NvidiaDriverState(FactBase):
    """Loaded vs installed driver: ``{module, smi, package, reboot_required}``.

    ``module``: /sys/module/nvidia/version (absent without the kernel module: containers, lab);
    ``smi``: the driver version nvidia-smi answers with; ``package``: the installed version of the
    driver package (``None`` unless dpkg says installed); ``reboot_required``: the OS asks for one.
    """

    @staticmethod
    def light_paths(package):
        """What its value is read from (roles/converged.py): the module's version, the GPUs' one read (shared),
        dpkg's status and the reboot flag."""
        return {
            "sh": preflight.GPU_STATE_READ,
            "sums": ["/sys/module/nvidia/version"],
            "paths": ["/var/lib/dpkg/status", "/var/run/reboot-required"],
        }

    def command(self, package: str) -> str:
        return (
            'echo "module=$(cat /sys/module/nvidia/version 2>/dev/null)"; '
            'echo "smi=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"; '
            f"echo \"package=$(dpkg-query -W -f='${{db:Status-Abbrev}}|${{Version}}' {shlex.quote(package)} 2>/dev/null)\"; "
            "if [ -e /var/run/reboot-required ]; then echo reboot_required=yes; else echo reboot_required=no; fi"
        )

    def process(self, output):
        raw = assignments(output)
        status, _, version = raw.get("package", "").partition("|")
        smi = raw.get("smi") or None
        if smi and not smi[0].isdigit():
            smi = None  # "NVIDIA-SMI has failed ..." on stdout
        return {
            "module": raw.get("module") or None,
            "smi": smi,
            "package": version.strip() if status.startswith("ii") and version.strip() else None,
            "reboot_required": raw.get("reboot_required") == "yes",
        }


class AptHolds(FactBase):
    """Packages on hold (``apt-mark showhold``)."""

    @staticmethod
    def light_paths():
        """What its value is read from (roles/converged.py): holds are dpkg's selections."""
        return ["/var/lib/dpkg/status"]

    def command(self) -> str:
        return "apt-mark showhold 2>/dev/null || true"

    def process(self, output):
        return sorted({line.strip() for line in output if line.strip()})

    @staticmethod
    def default():
        return []


class PersistenceMode(FactBase):
    """Persistence mode per GPU: ``{index: "Enabled" | "Disabled"}``; ``None`` without a working nvidia-smi."""

    @staticmethod
    def light_paths():
        """What its value is read from (roles/converged.py): the GPUs' one read, shared."""
        return {"sh": preflight.GPU_STATE_READ}

    def command(self) -> str:
        return "nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader 2>/dev/null || true"

    def process(self, output):
        modes = {}
        for line in output:
            index, _, mode = (p.strip() for p in line.partition(","))
            if index.isdigit() and mode:
                modes[index] = mode
        return modes or None


# --------------------------------------------------------------------------- pure helpers


def repo_distro(distro: dict | None) -> str:
    """``debian12``, ``ubuntu2404``: how NVIDIA names its repositories (os-release ID + VERSION_ID)."""
    meta = (distro or {}).get("release_meta") or {}
    os_id = str(meta.get("ID", "")).lower()
    version = str(meta.get("VERSION_ID", "")).replace(".", "")
    if not os_id or not version:
        raise ValueError(f"cannot name NVIDIA's repository for this OS: {meta}")
    return f"{os_id}{version}"


def default_repo_url(distro: dict | None, arch: str) -> str:
    if arch not in REPO_ARCH:
        raise ValueError(f"no NVIDIA repository for CPU architecture {arch}")
    return NVIDIA_CUDA_REPO.format(distro=repo_distro(distro), arch=REPO_ARCH[arch])


def with_slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def source_text(uri: str, keyring: str | None = KEYRING, trusted: bool = False) -> str:
    """NVIDIA's repository as a flat deb822 source (``Suites: /``, no components), as its CUDA repositories are;
    ``trusted``: the cluster's own unsigned mirror, reached only inside it."""
    return deb822_source(
        with_slash(uri),
        "/",
        None,
        keyring,
        trusted,
        comment="# Managed by ironserve (roles/nvidia_driver.py): NVIDIA driver and CUDA packages.",
    )


def upstream(version: str) -> str:
    """``580.95.05-1`` -> ``580.95.05`` (epoch and Debian revision dropped)."""
    version = version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def apt_pin_text(pins: list[tuple[str, str]], owner: str) -> str:
    """apt preferences: each (package pattern, version pattern) at priority 1001.

    1001 keeps the pinned version through ``apt upgrade`` (and moves back to it after a manual
    upgrade); other versions of the same packages keep their normal priority.
    """
    blocks = [f"# Managed by ironserve ({owner}): pinned so that apt upgrade cannot move them."]
    for package, version in pins:
        blocks.append(f"Package: {package}\nPin: version {version}\nPin-Priority: 1001")
    return "\n\n".join(blocks) + "\n"


def dearmor(data: bytes) -> bytes:
    """ASCII-armored OpenPGP key -> binary keyring (what apt wants in a .gpg Signed-By file)."""
    text = data.decode("ascii", errors="replace")
    if "-----BEGIN PGP" not in text:
        return data
    body = text.split("-----BEGIN PGP", 1)[1].split("\n", 1)[1]
    body = body.split("-----END PGP", 1)[0]
    # Armor headers end at the first empty line; the checksum line starts with "=".
    if "\n\n" in body.replace("\r", ""):
        body = body.replace("\r", "").split("\n\n", 1)[1]
    lines = [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("=")]
    return base64.b64decode("".join(lines))


def module_packages(module_source: str, branch: str, release: str) -> list[str]:
    """What makes the modules loadable on the running kernel: its headers (DKMS) or the signed modules."""
    if module_source == "precompiled":
        return [f"linux-modules-nvidia-{branch}-open-{release}"]
    return [f"linux-headers-{release}"]


def hold_list(driver: str, module_pkgs: list[str], release: str, installed: dict) -> list[str]:
    """Driver, module packages, and the kernel packages installed now (running image and metapackages)."""
    kernel = [p for p in (f"linux-image-{release}", f"linux-modules-{release}", *KERNEL_METAPACKAGES) if p in installed]
    return sorted({driver, *module_pkgs, *kernel})


def reboot_reasons(state: dict | None, want_version: str) -> list[str]:
    """Why this host must reboot for the driver it has installed (empty: it need not)."""
    state = state or {}
    package = state.get("package")
    reasons = []
    if package:
        loaded = state.get("module") or state.get("smi")
        if not loaded:
            reasons.append(f"driver {package} is installed but no NVIDIA kernel module is loaded")
        elif loaded != upstream(package):
            reasons.append(f"driver {package} is installed but {loaded} is loaded")
        if upstream(package) != upstream(want_version):
            reasons.append(f"installed driver {package} is not the pinned {want_version}")
    if state.get("reboot_required"):
        reasons.append("the OS asks for a reboot (/var/run/reboot-required)")
    return reasons


# --------------------------------------------------------------------------- operations


@operation()
def repo_source(mirror: str | None = None, keyring: str = KEYRING, trusted: bool = False, path: str = SOURCE_FILE):
    """The deb822 source for NVIDIA's repository (or the cluster's mirror of it)."""
    uri = mirror or default_repo_url(host.get_fact(LinuxDistribution), host.get_fact(Arch))
    yield from files.put._inner(StringIO(source_text(uri, keyring, trusted)), path, mode="644")


@operation()
def fetched_keyring(
    key_name: str = DEFAULTS.nvidia_apt_key_name,
    mirror: str | None = None,
    dest: str = KEYRING,
    fingerprint: str = DEFAULTS.nvidia_apt_key_fingerprint,
):
    """Fetch the repository key on the host, dearmored into ``dest`` only when it is exactly the key
    ``fingerprint`` (roles/apt_keys.py): a key fetched from the mirror it verifies proves nothing by itself."""
    uri = mirror or default_repo_url(host.get_fact(LinuxDistribution), host.get_fact(Arch))
    yield from pinned_key._inner(with_slash(uri) + key_name, dest, fingerprint, dearmor=True)


@operation()
def apt_refresh(packages: dict):
    """``apt-get update`` when a pinned ``{package: version}`` is neither installed nor known to apt."""
    installed = host.get_fact(DebPackages) or {}
    known = host.get_fact(AptVersions, packages=sorted(packages)) or {}
    missing = [
        f"{p}={v}"
        for p, v in sorted(packages.items())
        if v not in (installed.get(p) or []) and v not in (known.get(p) or [])
    ]
    if missing:
        yield "apt-get update"
    else:
        host.noop(f"installed or known to apt: {', '.join(f'{p}={v}' for p, v in sorted(packages.items()))}")


@operation()
def driver_reboot(
    package: str, version: str, allow_reboot: bool = False, reboot_timeout: int = DEFAULTS.reboot_timeout
):
    """Reboot (only when allowed) if the installed driver is not the loaded one; else warn."""
    state = host.get_fact(NvidiaDriverState, package=package) or {}
    reasons = reboot_reasons(state, version)
    if not reasons and not state.get("package"):
        host.noop(f"{package} not installed yet: nothing to reboot for")
        return
    if not reasons:
        host.noop(f"driver {version} loaded, no reboot needed")
        return
    if allow_reboot:
        logger.warning(f"{host.name}: rebooting: {'; '.join(reasons)}")
        yield from server.reboot._inner(delay=30, interval=5, reboot_timeout=reboot_timeout)
        return
    logger.warning(
        f"{host.name}: REBOOT NEEDED: {'; '.join(reasons)}. Reboot it in a maintenance window, or "
        "rerun with --data allow_reboot=true to let ironserve reboot it and wait."
    )
    host.noop("reboot needed but not allowed (allow_reboot=false)")


@operation()
def nouveau_unloaded():
    """nouveau loaded now: unload it, or mark the host for a reboot when it is in use (console)."""
    kernel = host.get_fact(preflight.KernelState) or {}
    if not kernel.get("nouveau"):
        host.noop("nouveau is not loaded")
        return
    # in use by the console it cannot go: the blacklist takes effect at the next boot (driver_reboot says so)
    yield "modprobe -r nouveau 2>/dev/null || touch /var/run/reboot-required"


@operation()
def packages_held(packages: list[str]):
    """``apt-mark hold`` what is not held yet."""
    held = set(host.get_fact(AptHolds) or [])
    missing = [p for p in packages if p not in held]
    if not missing:
        host.noop(f"held: {', '.join(packages)}")
        return
    yield "apt-mark hold " + shlex.join(missing)


@operation()
def persistence_mode_on():
    """Every GPU reports persistence mode Enabled (``nvidia-smi -pm 1`` for those that do not)."""
    modes = host.get_fact(PersistenceMode)
    if modes is None:
        if host.state.is_executing:
            raise OperationError(
                f"{host.name}: nvidia-smi does not answer persistence mode. Fix: check that the "
                f"driver is loaded (nvidia-smi) and nvidia-persistenced runs"
            )
        host.noop("persistence mode is checked once the driver answers")
        return
    off = sorted(i for i, mode in modes.items() if mode != "Enabled")
    if not off:
        host.noop(f"persistence mode Enabled on {len(modes)} GPUs")
        return
    yield "nvidia-smi -pm 1"


# --------------------------------------------------------------------------- role


def branch(ctx: DeploymentContext) -> str:
    return ctx.profile.driver_branch or "580"


def module_source(ctx: DeploymentContext) -> str:
    return ctx.host.nvidia_module_source


def driver_package(ctx: DeploymentContext) -> str:
    if module_source(ctx) == "precompiled":
        return f"nvidia-driver-{branch(ctx)}-open"  # Ubuntu's, matching its signed precompiled modules
    return DRIVER_PACKAGE.format(branch=branch(ctx))


def nvlink_multinode(ctx: DeploymentContext) -> bool:
    return ctx.profile.accelerator.interconnect == "nvlink-mnnvl"


def nvidia_module_options(ctx: DeploymentContext) -> str | None:
    """modprobe options of the nvidia module (None: ironserve sets none on this profile)."""
    if not nvlink_multinode(ctx):
        return None
    return (
        "# Managed by ironserve (roles/nvidia_driver.py): IMEX channel 0 is created whenever the driver loads\n"
        "# (multi-node NVLink: the engines' containers get /dev/nvidia-caps-imex-channels/channel0).\n"
        "options nvidia NVreg_CreateImexChannel0=1\n"
    )


def fabric_manager_package(driver_version: str) -> str:
    """The Fabric Manager package of the branch of ``driver_version`` (``580.95.05-1`` -> nvidia-fabricmanager)."""
    driver_branch = upstream(driver_version).split(".")[0]
    if driver_branch.isdigit() and int(driver_branch) < FABRIC_MANAGER_UNBRANCHED_FROM:
        return f"{FABRIC_MANAGER}-{driver_branch}"
    return FABRIC_MANAGER


def fabric_manager_pins(ctx: DeploymentContext) -> dict[str, str]:
    """``{package: version}`` of Fabric Manager on NVSwitch boards (the driver's version), empty elsewhere."""
    if ctx.vendor != "nvidia" or not ctx.profile.fabric_manager:
        return {}
    version = ctx.host.nvidia_driver_version
    if module_source(ctx) == "precompiled":  # Ubuntu's driver: Ubuntu's Fabric Manager of the branch, same version
        return {f"{FABRIC_MANAGER}-{branch(ctx)}": version}
    return {fabric_manager_package(version): version}


def dcgm_wanted(ctx: DeploymentContext) -> bool:
    return ctx.host.dcgm if ctx.host.dcgm is not None else nvlink_multinode(ctx)


def dcgm_package(ctx: DeploymentContext) -> str:
    return DCGM_PACKAGE.format(major=(ctx.profile.toolkit or "13").split(".")[0])


def repository(ctx: DeploymentContext) -> None:
    """NVIDIA's repository (key, source); cuda.py relies on it, so the driver role owns it."""
    trusted = ctx.host.apt_trusted
    mirror = ctx.host.nvidia_apt_mirror
    # A cluster mirror whose keyring the cluster already installs on every host: sign with that one.
    keyring = ctx.host.apt_signed_by if mirror else None
    if not trusted and not keyring:
        keyring = KEYRING
        key_file = ctx.host.nvidia_apt_key_file
        if key_file:
            data = dearmor(Path(key_file).expanduser().read_bytes())
            files.put(name="NVIDIA apt keyring (from the controller)", src=BytesIO(data), dest=KEYRING, mode="644")
        else:
            apt.packages(name="Tools to fetch the NVIDIA apt key", packages=["ca-certificates", "curl", "gpg"])
            fetched_keyring(
                name="NVIDIA apt keyring (from the repository, pinned by fingerprint)",
                key_name=ctx.host.nvidia_apt_key_name,
                mirror=mirror,
                fingerprint=ctx.host.nvidia_apt_key_fingerprint,
            )
    repo_source(name="NVIDIA apt repository", mirror=mirror, keyring=keyring or KEYRING, trusted=trusted)


def kernel_prerequisites(ctx: DeploymentContext) -> list[str]:
    """nouveau blacklisted (initramfs rebuilt), module options, unattended-upgrades policy; returns the module
    packages of the running kernel (installed with the driver)."""
    release = (host.get_fact(KernelVersion) or "").strip()
    changes = [put_text("nouveau blacklisted", NOUVEAU_TEXT, NOUVEAU_CONF)]
    options = nvidia_module_options(ctx)
    if options:
        changes.append(put_text("nvidia module options (IMEX channel 0)", options, NVIDIA_OPTIONS_CONF))
    # the initramfs carries modprobe.d: without a rebuild nouveau still binds first at boot
    run_if_changed(
        name="initramfs rebuilt (module blacklist and options)",
        triggers=changes,
        command="if command -v update-initramfs >/dev/null && ls /boot/initrd.img-* >/dev/null 2>&1; "
        "then update-initramfs -u -k all; fi",
    )
    nouveau_unloaded(name="nouveau not loaded")
    put_text("unattended-upgrades leaves kernel and NVIDIA packages alone", UNATTENDED_TEXT, UNATTENDED_CONF)
    return module_packages(module_source(ctx), branch(ctx), release)


def driver_installed(ctx: DeploymentContext, package: str, modules: list[str], fabric: dict[str, str]) -> None:
    """The driver pinned at its version (apt preferences), the kernel modules' prerequisites, then the driver with
    persistenced and Fabric Manager in one transaction; driver, modules and kernel held."""
    version = ctx.host.nvidia_driver_version
    pins = [
        (package, version),
        (PERSISTENCED, f"{upstream(version)}*"),
        # the driver's own libraries and tools follow the same upstream version
        ("/nvidia/", f"{upstream(version)}*"),
    ]
    put_text(f"Pin {package} {version}", apt_pin_text(pins, "roles/nvidia_driver.py"), PREFERENCES_FILE)
    apt_refresh(name="apt-get update for the NVIDIA driver", packages={package: version, **fabric})
    # before the driver: its postinst builds (DKMS) against the running kernel's headers
    apt.packages(name=f"Kernel modules prerequisites: {', '.join(modules)}", packages=modules, no_recommends=True)
    # Fabric Manager in the same transaction: driver and Fabric Manager move together or not at all
    apt.packages(
        name=f"Install {package}={version} and {' and '.join([PERSISTENCED, *fabric])}",
        packages=[f"{package}={version}", PERSISTENCED, *(f"{p}={v}" for p, v in fabric.items())],
        no_recommends=True,
        extra_install_args="--allow-change-held-packages",
    )
    installed = host.get_fact(DebPackages) or {}
    release = (host.get_fact(KernelVersion) or "").strip()
    packages_held(
        name="Driver and kernel held (apt-mark hold)",
        packages=sorted({*hold_list(package, modules, release, installed), *fabric}),
    )


def persistence(ctx: DeploymentContext) -> None:
    """nvidia-persistenced with persistence mode (its drop-in), running; every GPU in persistence mode."""
    dropin = put_text("nvidia-persistenced runs with persistence mode", PERSISTENCED_TEXT, PERSISTENCED_DROPIN)
    run_if_changed(
        name="systemctl daemon-reload (persistenced drop-in)", triggers=[dropin], command="systemctl daemon-reload"
    )
    systemd.service(
        name="nvidia-persistenced enabled and running",
        service=f"{PERSISTENCED}.service",
        running=True,
        enabled=True,
        restarted=dropin.changed,
    )
    persistence_mode_on(name="Persistence mode on every GPU")


def fabric_manager_and_dcgm(ctx: DeploymentContext, fabric: dict[str, str]) -> None:
    """Fabric Manager running on NVSwitch boards; DCGM where it is wanted."""
    if fabric:
        # not restarted on an upgrade: the running one matches the loaded driver until the reboot it needs
        systemd.service(
            name="nvidia-fabricmanager enabled and running", service=FABRIC_MANAGER_SERVICE, running=True, enabled=True
        )
    if dcgm_wanted(ctx):
        apt.packages(name=f"DCGM ({dcgm_package(ctx)})", packages=[dcgm_package(ctx)], no_recommends=True)
        systemd.service(
            name="nvidia-dcgm enabled and running", service="nvidia-dcgm.service", running=True, enabled=True
        )


@deploy("ironserve: NVIDIA driver")
def apply(ctx: DeploymentContext) -> None:
    package = driver_package(ctx)
    modules = kernel_prerequisites(ctx)
    repository(ctx)
    fabric = fabric_manager_pins(ctx)
    driver_installed(ctx, package, modules, fabric)
    driver_reboot(
        name="Reboot if the installed driver is not loaded",
        package=package,
        version=ctx.host.nvidia_driver_version,
        allow_reboot=ctx.host.allow_reboot,
        reboot_timeout=ctx.host.reboot_timeout,
    )
    # On a fresh host preflight could not see the GPUs; now the driver is there, check strictly.
    preflight.check_devices_of(ctx, defer_if_absent=False)
    persistence(ctx)
    fabric_manager_and_dcgm(ctx, fabric)


# --------------------------------------------------------------------------- audit


def desired_packages(ctx: DeploymentContext) -> list[DesiredPackage]:
    """The pinned driver, for `ironserve audit`."""
    if ctx.vendor != "nvidia":
        return []
    pins = {driver_package(ctx): ctx.host.nvidia_driver_version, **fabric_manager_pins(ctx)}
    return [DesiredPackage(p, v) for p, v in pins.items()]


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    """nouveau blacklist, nvidia module options, unattended-upgrades policy, persistenced drop-in."""
    if ctx.vendor != "nvidia":
        return []
    texts = {NOUVEAU_CONF: NOUVEAU_TEXT, UNATTENDED_CONF: UNATTENDED_TEXT, PERSISTENCED_DROPIN: PERSISTENCED_TEXT}
    if nvidia_module_options(ctx):
        texts[NVIDIA_OPTIONS_CONF] = nvidia_module_options(ctx)
    return [text_file(p, t, gate="driver") for p, t in texts.items()]


HELD = "hold ok installed"  # dpkg's status of a held, installed package


def hold_check(package: str) -> RuntimeCheck:
    """The audit check that ``package`` is on hold and installed: dpkg's status for it is ``hold ok installed`` (the
    selection ``apt-mark hold`` sets and ``apt-mark showhold`` lists), read by the very command testinfra's
    ``is_installed`` sends, so that the audit asks it once, in the one dpkg-query over all of a batch's packages
    (ironserve/audit/fold.py; apt-mark would load apt's cache: 10 ms)."""
    return RuntimeCheck(f"apt-hold:{package}", HELD, f"dpkg-query -f '${{Status}}' -W {shlex.quote(package)}")


def active_check(check_id: str, service: str) -> RuntimeCheck:
    """The audit check that a systemd unit is active."""
    return RuntimeCheck(check_id, "active", f"systemctl is-active {shlex.quote(service)} 2>/dev/null || true")


def fabric_manager_checks(ctx: DeploymentContext) -> list[RuntimeCheck]:
    """Fabric Manager active and held, on NVSwitch boards."""
    checks = []
    for package in fabric_manager_pins(ctx):
        checks += [active_check("fabric-manager:active", FABRIC_MANAGER_SERVICE), hold_check(package)]
    return checks


def desired_runtime(ctx: DeploymentContext) -> list[RuntimeCheck]:
    """Module prerequisites of the running kernel, nouveau not loaded, holds. (Persistence mode is the audit's
    gpu:persistence-mode, read by the same nvidia-smi run as the GPU count: ironserve/audit/checks.py.)"""
    if ctx.vendor != "nvidia":
        return []
    prerequisites = (
        'r=$(uname -r); [ -e "/lib/modules/$r/build" ]'
        if module_source(ctx) == "dkms"
        else f"dpkg-query -W -f='${{db:Status-Abbrev}}' linux-modules-nvidia-{branch(ctx)}-open-$(uname -r) "
        '2>/dev/null | grep -q "^ii"'
    )
    dcgm = [active_check("dcgm:active", "nvidia-dcgm")] if dcgm_wanted(ctx) else []
    return [
        *dcgm,
        *fabric_manager_checks(ctx),
        present_check("kernel:module-prerequisites", prerequisites),
        RuntimeCheck("kernel:nouveau-not-loaded", "no", "grep -q '^nouveau ' /proc/modules && echo yes || echo no"),
        hold_check(driver_package(ctx)),
    ]
