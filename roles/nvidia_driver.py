"""NVIDIA driver: NVIDIA's apt repository, the pinned open-kernel-module driver, persistenced, reboots.

Blackwell (sm120, sm100) needs the open kernel modules of branch 580 or later, so the driver is
``nvidia-open-<profile.driver_branch>`` at an exact version, held there by an apt preferences file
(Pin-Priority 1001) so that a routine ``apt upgrade`` cannot move it under a running engine.

Steps:

1. Repository: a deb822 source ``/etc/apt/sources.list.d/nvidia-cuda.sources`` (a flat repo,
   ``Suites: /``) signed by ``/usr/share/keyrings/ironserve-nvidia.gpg``. The keyring is uploaded
   from the controller (``nvidia_apt_key_file``, a binary or ASCII-armored key) or fetched from
   ``<mirror>/<nvidia_apt_key_name>`` and dearmored on the host. With ``apt_trusted=true`` (the
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

Host data (defaults in the constants below):

- ``nvidia_apt_mirror``: repository URL (default: NVIDIA's CUDA repository for the host's OS and
  arch, e.g. ``.../ubuntu2404/x86_64/``, ``.../debian12/sbsa/`` on aarch64)
- ``nvidia_apt_key_file``: keyring on the controller to upload (default: fetch from the mirror)
- ``nvidia_apt_key_name`` (``3bf863cc.pub``): the key's file name in the repository
- ``apt_signed_by``: a keyring already on the hosts for the cluster's mirrors; with
  ``nvidia_apt_mirror`` set it is the Signed-By as it is (nothing uploaded or fetched)
- ``apt_trusted`` (``false``): trust the mirror without a key (lab)
- ``nvidia_driver_version`` (``580.95.05-1``): exact Debian version of the driver package
- ``allow_reboot`` (``false``): reboot when the installed driver is not the loaded one
- ``reboot_timeout`` (``900``): seconds to wait for the host to come back
"""

from __future__ import annotations

import base64
from io import BytesIO, StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FactBase, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.facts.server import Arch, LinuxDistribution
from pyinfra.operations import apt, files, server, systemd

from roles import preflight
from roles.common import deb822_source, truthy
from roles.context import DeploymentContext
from roles.preflight import plain

# The one place NVIDIA's public repository is named; air-gapped clusters set nvidia_apt_mirror.
NVIDIA_CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}/"
NVIDIA_APT_KEY_NAME = "3bf863cc.pub"
SOURCE_FILE = "/etc/apt/sources.list.d/nvidia-cuda.sources"
KEYRING = "/usr/share/keyrings/ironserve-nvidia.gpg"
PREFERENCES_FILE = "/etc/apt/preferences.d/ironserve-nvidia-driver.pref"
DRIVER_PACKAGE = "nvidia-open-{branch}"
DRIVER_VERSION = "580.95.05-1"
PERSISTENCED = "nvidia-persistenced"
REBOOT_TIMEOUT = 900
REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}  # NVIDIA names its arm64 server repos "sbsa"


# --------------------------------------------------------------------------- facts


class AptVersions(FactBase):
    """Versions apt knows for each package (``apt-cache madison``): ``{package: [version, ...]}``."""

    def command(self, packages: list[str]) -> str:
        names = " ".join(packages)
        return (f'for p in {names}; do apt-cache madison "$p" 2>/dev/null '
                "| awk -v p=\"$p\" '{print p\" \"$3}'; done; true")

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

    def command(self, package: str) -> str:
        return (
            'echo "module=$(cat /sys/module/nvidia/version 2>/dev/null)"; '
            'echo "smi=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"; '
            f"echo \"package=$(dpkg-query -W -f='${{db:Status-Abbrev}}|${{Version}}' {package} 2>/dev/null)\"; "
            'if [ -e /var/run/reboot-required ]; then echo reboot_required=yes; else echo reboot_required=no; fi'
        )

    def process(self, output):
        raw = {}
        for line in output:
            key, _, value = line.partition("=")
            raw[key.strip()] = value.strip()
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
    return deb822_source(with_slash(uri), "/", None, keyring, trusted,
                         comment="# Managed by ironserve (roles/nvidia_driver.py): NVIDIA driver and CUDA packages.")


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
    uri = mirror or default_repo_url(plain(host.get_fact(LinuxDistribution)), plain(host.get_fact(Arch)))
    yield from files.put._inner(StringIO(source_text(uri, keyring, trusted)), path, mode="644")


@operation()
def fetched_keyring(key_name: str = NVIDIA_APT_KEY_NAME, mirror: str | None = None, dest: str = KEYRING):
    """Fetch the repository key on the host, dearmored into ``dest`` (once: the file is the state)."""
    if plain(host.get_fact(File, path=dest)):
        host.noop(f"{dest} exists")
        return
    uri = mirror or default_repo_url(plain(host.get_fact(LinuxDistribution)), plain(host.get_fact(Arch)))
    url = with_slash(uri) + key_name
    yield (f"curl -fsSL {url} -o {dest}.tmp && "
           f"if grep -q 'BEGIN PGP' {dest}.tmp; then gpg --dearmor < {dest}.tmp > {dest}; else mv {dest}.tmp {dest}; fi"
           f" && rm -f {dest}.tmp && chmod 644 {dest}")


@operation()
def apt_refresh(packages: dict):
    """``apt-get update`` when a pinned ``{package: version}`` is neither installed nor known to apt."""
    installed = plain(host.get_fact(DebPackages)) or {}
    known = plain(host.get_fact(AptVersions, packages=sorted(packages))) or {}
    missing = [f"{p}={v}" for p, v in sorted(packages.items())
               if v not in (installed.get(p) or []) and v not in (known.get(p) or [])]
    if missing:
        yield "apt-get update"
    else:
        host.noop(f"installed or known to apt: {', '.join(f'{p}={v}' for p, v in sorted(packages.items()))}")


@operation()
def driver_reboot(package: str, version: str, allow_reboot: bool = False, reboot_timeout: int = REBOOT_TIMEOUT):
    """Reboot (only when allowed) if the installed driver is not the loaded one; else warn."""
    state = plain(host.get_fact(NvidiaDriverState, package=package)) or {}
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
    logger.warning(f"{host.name}: REBOOT NEEDED: {'; '.join(reasons)}. Reboot it in a maintenance window, or "
                   "rerun with --data allow_reboot=true to let ironserve reboot it and wait.")
    host.noop("reboot needed but not allowed (allow_reboot=false)")


# --------------------------------------------------------------------------- role


def driver_package(ctx: DeploymentContext) -> str:
    return DRIVER_PACKAGE.format(branch=ctx.profile.driver_branch or "580")


def repository(ctx: DeploymentContext) -> None:
    """NVIDIA's repository (key, source); cuda.py relies on it, so the driver role owns it."""
    trusted = truthy(ctx.get("apt_trusted"), default=False)
    mirror = ctx.get("nvidia_apt_mirror")
    # A cluster mirror whose keyring the cluster already installs on every host: sign with that one.
    keyring = ctx.get("apt_signed_by") if mirror else None
    if not trusted and not keyring:
        keyring = KEYRING
        key_file = ctx.get("nvidia_apt_key_file")
        if key_file:
            data = dearmor(Path(key_file).expanduser().read_bytes())
            files.put(name="NVIDIA apt keyring (from the controller)", src=BytesIO(data), dest=KEYRING, mode="644")
        else:
            apt.packages(name="Tools to fetch the NVIDIA apt key", packages=["ca-certificates", "curl", "gpg"])
            fetched_keyring(name="NVIDIA apt keyring (from the repository)",
                            key_name=ctx.get("nvidia_apt_key_name", NVIDIA_APT_KEY_NAME), mirror=mirror)
    repo_source(name="NVIDIA apt repository", mirror=mirror, keyring=keyring or KEYRING, trusted=trusted)


@deploy("ironserve: NVIDIA driver")
def apply(ctx: DeploymentContext) -> None:
    package = driver_package(ctx)
    version = ctx.get("nvidia_driver_version", DRIVER_VERSION)
    repository(ctx)
    files.put(
        name=f"Pin {package} {version}",
        src=StringIO(apt_pin_text([(package, version), (PERSISTENCED, f"{upstream(version)}*"),
                                   # the driver's own libraries and tools follow the same upstream version
                                   ("/nvidia/", f"{upstream(version)}*")], "roles/nvidia_driver.py")),
        dest=PREFERENCES_FILE,
        mode="644",
    )
    apt_refresh(name="apt-get update for the NVIDIA driver", packages={package: version})
    apt.packages(name=f"Install {package}={version} and {PERSISTENCED}",
                 packages=[f"{package}={version}", PERSISTENCED], no_recommends=True)
    driver_reboot(name="Reboot if the installed driver is not loaded", package=package, version=version,
                  allow_reboot=truthy(ctx.get("allow_reboot"), default=False),
                  reboot_timeout=int(ctx.get("reboot_timeout", REBOOT_TIMEOUT)))
    # On a fresh host preflight could not see the GPUs; now the driver is there, check strictly.
    preflight.check_devices_of(ctx, defer_if_absent=False)
    systemd.service(name="nvidia-persistenced enabled and running", service=f"{PERSISTENCED}.service",
                    running=True, enabled=True)


# --------------------------------------------------------------------------- audit


def desired_packages(ctx: DeploymentContext) -> list[dict]:
    """The pinned driver, for `ironserve audit`."""
    if ctx.vendor != "nvidia":
        return []
    return [{"name": driver_package(ctx), "version": ctx.get("nvidia_driver_version", DRIVER_VERSION),
             "gate": "driver"}]
