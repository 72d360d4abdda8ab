"""CUDA toolkit: ``cuda-toolkit-<major>-<minor>`` from NVIDIA's repository, pinned.

The repository (source, key) belongs to the driver role, which runs first. The toolkit is
``cuda-toolkit-13-0`` for ``profile.toolkit = "13.0"``, installed at an exact version and held
there by an apt preferences file, like the driver. It lands in ``/usr/local/cuda-<major>.<minor>``
(``/usr/local/cuda`` links to it); the engine's runtime finds it there.

Host data (defaults in ironserve/hostdata.py):

- ``cuda_toolkit_version`` (``13.0.2-1``): exact Debian version of the toolkit package
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt

from roles.common import put_text
from roles.context import DeploymentContext
from roles.desired import DesiredPackage
from roles.nvidia_driver import apt_pin_text, apt_refresh

TOOLKIT_PACKAGE = "cuda-toolkit-{dashed}"
DEFAULT_TOOLKIT = "13.0"
PREFERENCES_FILE = "/etc/apt/preferences.d/ironserve-cuda.pref"


def toolkit_package(toolkit: str | None) -> str:
    """``13.0`` -> ``cuda-toolkit-13-0``."""
    return TOOLKIT_PACKAGE.format(dashed=(toolkit or DEFAULT_TOOLKIT).replace(".", "-"))


@deploy("ironserve: CUDA toolkit")
def apply(ctx: DeploymentContext) -> None:
    package = toolkit_package(ctx.profile.toolkit)
    version = ctx.host.cuda_toolkit_version
    put_text(f"Pin {package} {version}", apt_pin_text([(package, version)], "roles/cuda.py"), PREFERENCES_FILE)
    apt_refresh(name="apt-get update for the CUDA toolkit", packages={package: version})
    apt.packages(name=f"Install {package}={version}", packages=[f"{package}={version}"], no_recommends=True)


def desired_packages(ctx: DeploymentContext) -> list[DesiredPackage]:
    """The pinned toolkit, for `ironserve audit`."""
    if ctx.vendor != "nvidia":
        return []
    return [DesiredPackage(toolkit_package(ctx.profile.toolkit), ctx.host.cuda_toolkit_version)]
