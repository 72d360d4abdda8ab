"""Ascend stack: NPU driver (+ firmware), CANN toolkit and NNAL from Huawei's ``.run`` installers.

Huawei ships the Atlas 800I A3 software as self-extracting ``.run`` packages, not apt packages.
They come from a local store (``ascend_package_store``: a URL on the cluster's mirror, or a
directory on the controller) and each is installed only when the installed version (fact
``AscendVersions``) is not the pinned one:

=========  ==================================================  ==================  ====================
component  file (``<arch>`` from the host: x86_64 / aarch64)    flags               version file
=========  ==================================================  ==================  ====================
driver     Ascend-hdk-910c-npu-driver_<v>_linux-<x86-64>.run   --full --quiet      driver/version.info
firmware   Ascend-hdk-910c-npu-firmware_<v>.run                --full --quiet      firmware/version.info
toolkit    Ascend-cann-toolkit_<v>_linux-<x86_64>.run          --install --quiet   ascend-toolkit/latest/*/ascend_toolkit_install.info
nnal       Ascend-cann-nnal_<v>_linux-<x86_64>.run             --install --quiet   nnal/atb/latest/version.info
=========  ==================================================  ==================  ====================

(The driver file writes its arch with a dash, ``x86-64``; ``aarch64`` is the same in both.)
Order matters: driver before toolkit, toolkit before NNAL (NNAL's installer needs the toolkit's
``set_env.sh``). After installing, the versions are read again and both ``set_env.sh`` scripts
must exist: the engine's service units source them (the recipe's ``runtime.source_env``). Then
the device check that preflight deferred on fresh hosts runs strictly (``npu-smi info -l``).

Host data (defaults in ironserve/hostdata.py):

- ``ascend_package_store``: URL or controller directory holding the ``.run`` files (required
  whenever something must be installed)
- ``ascend_package_sha256``: ``{file name: sha256}`` of the ``.run`` files. An installer runs as root
  only after its file on the host has that sha256 (checked right before it runs, the file removed on a
  mismatch); a ``.run`` that must be installed and has no sha256 there is refused before any change, the
  fix naming the file. The sums come from the vendor's download page (or ``sha256sum`` of the files the
  site vetted), never from the store that serves the files.
- ``ascend_driver_version`` (profile ``driver_branch``, 25.2.0), ``ascend_toolkit_version`` and
  ``ascend_nnal_version`` (profile ``toolkit``, 8.3.RC1)
- ``ascend_firmware_version`` (unset: firmware is left as it is; set it to install
  ``Ascend-hdk-910c-npu-firmware_<v>.run``; firmware takes effect after a reboot)
- ``ascend_install_path`` (``/usr/local/Ascend``)
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.facts.server import Arch
from pyinfra.operations import files, server

from ironserve.hostdata import DEFAULTS
from roles import preflight
from roles.common import sha256_checked
from roles.context import DeploymentContext

CACHE_DIR = "/var/cache/ironserve/ascend"
DEFAULT_DRIVER_VERSION = "25.2.0"
DEFAULT_CANN_VERSION = "8.3.RC1"
# Installed in this order; NNAL's installer needs the toolkit in place.
COMPONENTS = ("driver", "firmware", "toolkit", "nnal")
RUN_FILES = {
    "driver": "Ascend-hdk-910c-npu-driver_{version}_linux-{arch_dash}.run",
    "firmware": "Ascend-hdk-910c-npu-firmware_{version}.run",
    "toolkit": "Ascend-cann-toolkit_{version}_linux-{arch}.run",
    "nnal": "Ascend-cann-nnal_{version}_linux-{arch}.run",
}
RUN_FLAGS = {
    "driver": "--full --quiet",
    "firmware": "--full --quiet",
    "toolkit": "--install --quiet",
    "nnal": "--install --quiet",
}
SET_ENV = ("ascend-toolkit/set_env.sh", "nnal/atb/set_env.sh")
# The driver installer runs its services as this user and refuses to install without it.
DRIVER_USER = "HwHiAiUser"


# --------------------------------------------------------------------------- facts


class AscendVersions(FactBase):
    """Installed versions ``{driver, firmware, toolkit, nnal}`` (``None`` when absent) and ``set_env``,
    the list of the ``set_env.sh`` scripts present."""

    def command(self, install_path: str = DEFAULTS.ascend_install_path) -> str:
        p = shlex.quote(install_path)  # data: quoted, and never inside double quotes outside a $(...)
        return (
            'v() { [ -f "$1" ] && sed -n \'s/^[[:space:]]*[Vv]ersion[[:space:]]*[=:][[:space:]]*//p\' "$1" | head -n 1; }; '
            f'echo "driver=$(v {p}/driver/version.info)"; '
            f'echo "firmware=$(v {p}/firmware/version.info)"; '
            f'echo "toolkit=$(for f in {p}/ascend-toolkit/latest/*/ascend_toolkit_install.info; do v "$f"; done | head -n 1)"; '
            f'echo "nnal=$(v {p}/nnal/atb/latest/version.info)"; '
            + "".join(f"[ -f {p}/{s} ] && echo set_env={p}/{s}; " for s in SET_ENV)
            + "true"
        )

    def process(self, output):
        data: dict = {c: None for c in COMPONENTS}
        data["set_env"] = []
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "set_env":
                data["set_env"].append(value)
            elif key in COMPONENTS:
                data[key] = value.strip() or None
        return data


# --------------------------------------------------------------------------- pure helpers


def run_file(component: str, version: str, arch: str) -> str:
    """The installer's file name; the driver writes x86_64 as ``x86-64``."""
    return RUN_FILES[component].format(version=version, arch=arch, arch_dash=arch.replace("_", "-"))


def same_version(installed: str | None, want: str) -> bool:
    return bool(installed) and installed.strip().lower() == want.strip().lower()


def version_problems(
    installed: dict | None, wants: dict, install_path: str = DEFAULTS.ascend_install_path
) -> list[str]:
    installed = installed or {}
    problems = [
        f"{component}: expected {want}, found {installed.get(component) or 'nothing'}"
        for component, want in wants.items()
        if not same_version(installed.get(component), want)
    ]
    present = set(installed.get("set_env") or [])
    problems += [
        f"{install_path}/{s}: expected (sourced by the service units), found missing"
        for s in SET_ENV
        if f"{install_path}/{s}" not in present
    ]
    return problems


def run_command(component: str, dest: str, install_path: str = DEFAULTS.ascend_install_path) -> str:
    """The installer's command line: every word quoted (the install path is host data)."""
    argv = [dest, *RUN_FLAGS[component].split()]
    if install_path != DEFAULTS.ascend_install_path:
        argv.append(f"--install-path={install_path}")
    return shlex.join(argv)


def store_location(store: str, filename: str) -> str:
    return (store if store.endswith("/") else store + "/") + filename


# --------------------------------------------------------------------------- operations


@operation()
def run_package(
    component: str,
    version: str,
    store: str | None = None,
    install_path: str = DEFAULTS.ascend_install_path,
    sha256: dict[str, str] | None = None,
):
    """Install one ``.run`` package from the store unless ``version`` is already installed; it runs as root only
    when its file's sha256 is the one ``sha256`` ({file name: sha256}, host data ascend_package_sha256) gives."""
    installed = (host.get_fact(AscendVersions, install_path=install_path) or {}).get(component)
    if same_version(installed, version):
        host.noop(f"{component} {version} installed")
        return
    filename = run_file(component, version, host.get_fact(Arch))
    if not store:
        raise OperationError(
            f"{host.name}: {component} {version} must be installed ({filename}) but no "
            "ascend_package_store is set. Fix: --data ascend_package_store=<URL or directory>"
        )
    want = (sha256 or {}).get(filename)
    if not want:
        raise OperationError(
            f"{host.name}: {component} {version} must be installed ({filename}) but no sha256 is "
            "known for it, and an installer runs as root only when its file is the one vetted. "
            f'Fix: add "{filename}": "<its sha256>" to host data ascend_package_sha256 (the sum '
            "from the vendor's download page, or `sha256sum` of the file you vetted)"
        )
    dest = f"{CACHE_DIR}/{filename}"
    if store.startswith(("http://", "https://")):
        yield from files.directory._inner(CACHE_DIR)
        yield from files.download._inner(store_location(store, filename), dest, mode="755")
    else:
        local = Path(store).expanduser() / filename
        if not local.is_file():
            raise OperationError(f"{host.name}: {local} not found on the controller (ascend_package_store)")
        yield from files.put._inner(str(local), dest, mode="755", add_deploy_dir=False)
    yield (
        f"{sha256_checked(dest, want, f'Ascend {component} installer', host.name)} && "
        f"{run_command(component, dest, install_path)}"
    )


@operation()
def check_versions(wants: dict, install_path: str = DEFAULTS.ascend_install_path):
    """After the installers: every pinned version installed and both set_env.sh scripts present."""
    problems = version_problems(host.get_fact(AscendVersions, install_path=install_path), wants, install_path)
    if not problems:
        host.noop(f"Ascend {', '.join(f'{c} {v}' for c, v in wants.items())} installed")
        return
    if not host.state.is_executing:
        host.noop("Ascend versions are checked after the installers ran")
        return
    raise OperationError(
        "\n".join(
            f"{host.name}: Ascend {p}. Fix: check the installer's log under "
            "/var/log/ascend_seclog/ and the files in ascend_package_store"
            for p in problems
        )
    )
    yield


# --------------------------------------------------------------------------- role


def pinned_versions(ctx: DeploymentContext) -> dict[str, str]:
    wants = {"driver": ctx.host.ascend_driver_version or ctx.profile.driver_branch or DEFAULT_DRIVER_VERSION}
    if ctx.host.ascend_firmware_version:
        wants["firmware"] = ctx.host.ascend_firmware_version
    wants["toolkit"] = ctx.host.ascend_toolkit_version or ctx.profile.toolkit or DEFAULT_CANN_VERSION
    wants["nnal"] = ctx.host.ascend_nnal_version or ctx.profile.toolkit or DEFAULT_CANN_VERSION
    return wants


@deploy("ironserve: Ascend driver and CANN")
def apply(ctx: DeploymentContext) -> None:
    install_path = ctx.host.ascend_install_path
    store = ctx.host.ascend_package_store
    wants = pinned_versions(ctx)
    server.group(name=f"{DRIVER_USER} group (Ascend driver)", group=DRIVER_USER)
    server.user(
        name=f"{DRIVER_USER} user (Ascend driver)",
        user=DRIVER_USER,
        group=DRIVER_USER,
        home=f"/home/{DRIVER_USER}",
        shell="/sbin/nologin",
        create_home=True,
    )
    for component in COMPONENTS:
        if component in wants:
            run_package(
                name=f"Ascend {component} {wants[component]}",
                component=component,
                version=wants[component],
                store=store,
                install_path=install_path,
                sha256=dict(ctx.host.ascend_package_sha256),
            )
    check_versions(name="Ascend versions and set_env.sh", wants=wants, install_path=install_path)
    # On a fresh host preflight could not see the NPUs; now the driver is there, check strictly.
    preflight.check_devices_of(ctx, defer_if_absent=False)
