"""NVIDIA container toolkit (docker recipes on NVIDIA hosts): the pinned toolkit, Docker's nvidia runtime, and GPU
access that survives a ``systemctl daemon-reload``.

Host data (defaults in brackets):

- ``nvidia_container_toolkit_version`` [ironserve.nvidia.NVIDIA_CONTAINER_TOOLKIT_VERSION], the version of
  ``nvidia-container-toolkit`` among ``nvidia_container_packages`` [nvidia-container-toolkit]
- ``nvidia_apt_mirror`` [none]: when set, the toolkit comes from that repository, which roles/nvidia_driver.py
  configured (NVIDIA's CUDA repository and the lab's carry it); unset, from NVIDIA's public
  https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) (ironserve-nvidia-container.sources,
  ``nvidia_apt_suite`` ["/", flat]), signed as roles/apt_keys.py ``vendor_keyring`` says (``nvidia_apt_key_url``,
  pinned to ``nvidia_container_key_fingerprint``)

GPU access (see ironserve.nvidia): from toolkit 1.14 on the role enables CDI in Docker (``nvidia-ctk runtime
configure --cdi.enabled``) and generates the CDI spec /etc/cdi/nvidia.yaml (``nvidia-ctk cdi generate``; again
whenever it does not name the installed driver version); the units then ask for ``--device nvidia.com/gpu=all``,
which keeps the GPUs across a ``systemctl daemon-reload``. Older toolkits keep ``--gpus`` with the documented
/dev/char symlinks (udev rule + ``nvidia-ctk system create-dev-char-symlinks --create-all``).
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, deploy, operation
from pyinfra.operations import apt

from ironserve.nvidia import gpu_access
from ironserve.spec import DockerRuntime
from roles.apt_keys import vendor_keyring
from roles.common import apt_update_for, deb822_source, json_output, put_text, run_if_changed
from roles.context import DeploymentContext
from roles.desired import RuntimeCheck, present_check
from roles.docker_engine import DAEMON_JSON, SOURCES_DIR, daemon_json_read
from roles.nvidia_driver import upstream

NVIDIA_APT_URL = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
NVIDIA_APT_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
TOOLKIT = "nvidia-container-toolkit"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
CDI_SPEC_DIRS = ["/etc/cdi/*", "/var/run/cdi/*"]  # where nvidia-ctk (and Docker) look for CDI specs
CTK_CONFIG = "/etc/nvidia-container-runtime/config.toml"
DEV_CHAR_RULE = "/lib/udev/rules.d/71-nvidia-dev-char.rules"
DEV_CHAR_RULE_TEXT = (
    "# Managed by ironserve (roles/nvidia_container_toolkit.py): /dev/char links for the NVIDIA devices, so\n"
    "# containers keep their GPUs across systemctl daemon-reload (NVIDIA/nvidia-container-toolkit#48)\n"
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n'
)


# --------------------------------------------------------------------------- facts


class DockerRuntimes(FactBase):
    """Runtimes registered in /etc/docker/daemon.json (nvidia-ctk adds 'nvidia'); [] when there is no file."""

    @staticmethod
    def default():
        return []

    light_paths = staticmethod(daemon_json_read)  # what its value is read from (roles/converged.py)

    def command(self):
        return f"cat {DAEMON_JSON} 2>/dev/null || true"

    def process(self, output):
        return sorted((json_output(output, {}, {}).get("runtimes") or {}).keys())


class DockerCdiEnabled(FactBase):
    """Docker's daemon.json enables CDI (``features.cdi``)."""

    light_paths = staticmethod(daemon_json_read)  # what its value is read from (roles/converged.py)

    def command(self):
        return f"cat {DAEMON_JSON} 2>/dev/null || true"

    def process(self, output):
        return bool((json_output(output, {}, {}).get("features") or {}).get("cdi"))


class CdiSpec(FactBase):
    """``{devices, current}``: the NVIDIA CDI devices nvidia-ctk resolves, and whether the spec file names the
    installed driver version (a spec of an older driver mounts libraries that are gone)."""

    @staticmethod
    def light_paths(path, driver):
        """What its value is read from (roles/converged.py): the CDI spec directories nvidia-ctk lists (the spec
        file among them), its configuration (which may name others) and dpkg's status (nvidia-ctk's own version)."""
        return {"paths": [*CDI_SPEC_DIRS, path, CTK_CONFIG, "/var/lib/dpkg/status"]}

    def command(self, path, driver):
        return (
            f"nvidia-ctk cdi list 2>/dev/null | grep '^nvidia.com/gpu=' || true; "
            f"grep -qF {shlex.quote(driver)} {shlex.quote(path)} 2>/dev/null && echo ironserve-driver-current || true"
        )

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return {
            "devices": [x for x in lines if x.startswith("nvidia.com/gpu=")],
            "current": "ironserve-driver-current" in lines,
        }


# --------------------------------------------------------------------------- operations


@operation()
def nvidia_runtime_configured(cdi: bool = False):
    """Register the nvidia runtime with Docker (nvidia-ctk), CDI enabled when asked, and restart Docker."""
    if "nvidia" in host.get_fact(DockerRuntimes) and (not cdi or host.get_fact(DockerCdiEnabled)):
        host.noop("docker already has the nvidia runtime" + (" and CDI" if cdi else ""))
        return
    yield "nvidia-ctk runtime configure --runtime=docker" + (" --cdi.enabled" if cdi else "")
    # dockerd reads daemon.json at start only
    yield "systemctl restart docker"


@operation()
def cdi_spec(driver_version: str, path: str = CDI_SPEC):
    """The NVIDIA CDI spec exists, names nvidia.com/gpu=all and the installed driver (else: generate it)."""
    spec = host.get_fact(CdiSpec, path=path, driver=driver_version) or {}
    if "nvidia.com/gpu=all" in (spec.get("devices") or []) and spec.get("current"):
        host.noop(f"{path}: nvidia.com/gpu=all for driver {driver_version}")
        return
    yield f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && nvidia-ctk cdi generate --output={shlex.quote(path)}"


# --------------------------------------------------------------------------- role


def toolkit_packages(ctx: DeploymentContext) -> list[str]:
    """The NVIDIA container packages, the toolkit at its pinned version."""
    toolkit = toolkit_version(ctx)
    return [f"{p}={toolkit}" if p == TOOLKIT else p for p in ctx.host.nvidia_container_packages]


def toolkit_version(ctx: DeploymentContext) -> str:
    return ctx.host.nvidia_container_toolkit_version


def gpu_devices(ctx: DeploymentContext) -> None:
    """GPUs in containers that survive daemon-reload: CDI, or /dev/char links on a toolkit older than CDI."""
    cdi = gpu_access(toolkit_version(ctx)) == "cdi"
    nvidia_runtime_configured(name="Docker knows the nvidia runtime" + (" (CDI enabled)" if cdi else ""), cdi=cdi)
    if cdi:
        cdi_spec(name=f"CDI spec {CDI_SPEC}", driver_version=upstream(ctx.host.nvidia_driver_version))
        return
    rule = put_text("udev rule: /dev/char links for NVIDIA devices", DEV_CHAR_RULE_TEXT, DEV_CHAR_RULE)
    run_if_changed(
        name="/dev/char links for NVIDIA devices",
        triggers=[rule],
        command="nvidia-ctk system create-dev-char-symlinks --create-all",
    )


@deploy("NVIDIA container toolkit")
def apply(ctx: DeploymentContext) -> None:
    sources = []
    if not ctx.host.nvidia_apt_mirror:
        # public libnvidia-container repository; with nvidia_apt_mirror the toolkit comes from the repository
        # roles/nvidia_driver.py already configured (NVIDIA's CUDA repository and its mirrors carry it), and a
        # second source for the same URI with another Signed-By would make apt refuse both
        signed_by, trusted = vendor_keyring(
            ctx,
            "nvidia-container",
            ctx.host.nvidia_apt_key_url or NVIDIA_APT_KEY_URL,
            ctx.host.nvidia_container_key_fingerprint,
        )
        text = deb822_source(NVIDIA_APT_URL, ctx.host.nvidia_apt_suite, None, signed_by, trusted)
        sources.append(
            put_text("NVIDIA container toolkit apt source", text, f"{SOURCES_DIR}/ironserve-nvidia-container.sources")
        )
    packages = toolkit_packages(ctx)
    apt_update_for("the NVIDIA container toolkit's source changed", sources, packages)
    apt.packages(name="NVIDIA container toolkit", packages=packages, no_recommends=True)
    gpu_devices(ctx)


# --------------------------------------------------------------------------- audit


def desired_runtime(ctx: DeploymentContext) -> list[RuntimeCheck]:
    """The units' GPU access: CDI's nvidia.com/gpu=all, or the /dev/char links, for `ironserve audit`."""
    runtime = ctx.recipe.runtime
    if not isinstance(runtime, DockerRuntime) or not runtime.run.gpus:
        return []
    if gpu_access(toolkit_version(ctx)) == "cdi":
        cdi = "nvidia-ctk cdi list 2>/dev/null | grep -cx 'nvidia.com/gpu=all' || true"
        return [RuntimeCheck("cdi:nvidia.com/gpu=all", "1", cdi)]
    links = "ls /dev/char | xargs -I{} readlink /dev/char/{} 2>/dev/null | grep -q nvidia"
    return [present_check("dev-char:nvidia", links)]
