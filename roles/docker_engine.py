"""Docker engine (docker recipes): Docker's apt repository and packages, daemon.json's registry mirror, dockerd.

Host data (defaults in brackets):

- ``docker_apt_mirror`` [https://download.docker.com/linux/<distro id>]: Docker's apt repository (deb822 source
  /etc/apt/sources.list.d/ironserve-docker.sources); ``docker_apt_suite`` [the distro codename, e.g. noble] and
  ``docker_apt_components`` [stable]; a suite ending in "/" is a flat repository (no components)
- the keyring, as for the other apt roles (roles/apt_keys.py ``vendor_keyring``): ``apt_trusted`` [false] marks the
  source ``Trusted: yes`` (the lab's own unsigned repository); else ``apt_signed_by`` [none] names a keyring already
  on the host (mirrors); else Docker's public key (``docker_apt_key_url``) is downloaded to /etc/apt/keyrings/ and
  kept only when it is exactly ``docker_apt_key_fingerprint`` (Docker's published one by default)
- ``docker_packages`` [docker-ce, docker-ce-cli, containerd.io]
- ``docker_registry_mirror`` [none]: host[:port] of an https registry that mirrors Docker Hub (an air-gapped
  cluster's): written to /etc/docker/daemon.json as ``registry-mirrors`` (other keys kept; Docker restarted when
  it changed); ``docker_registry_ca`` [none], a CA file on the controller, goes to
  /etc/docker/certs.d/<mirror>/ca.crt so Docker verifies the mirror (no insecure-registries exception), and to
  /etc/docker/certs.d/<registry>/ca.crt of ``docker_derived_registry`` (roles/recipe_image.py) too

The NVIDIA container toolkit (roles/nvidia_container_toolkit.py) and the recipe's image (roles/recipe_image.py) come
after it, in their own roles.
"""

from __future__ import annotations

import json
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, deploy, operation
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, systemd

from roles.apt_keys import vendor_keyring
from roles.common import apt_update_for, deb822_source, json_output, put_text, run_if_changed
from roles.context import DeploymentContext

DOCKER_APT_URL = "https://download.docker.com/linux/{distro}"
DOCKER_APT_KEY_URL = "https://download.docker.com/linux/{distro}/gpg"
SOURCES_DIR = "/etc/apt/sources.list.d"
DAEMON_JSON = "/etc/docker/daemon.json"
CERTS_DIR = "/etc/docker/certs.d"


# --------------------------------------------------------------------------- facts


def daemon_json_read() -> dict:
    """The converged record's read of daemon.json (roles/converged.py), shared by the facts that read it: the file
    as ``cat`` reads it (through a link, as dockerd does), with its exit status."""
    return {"sh": f'cat {shlex.quote(DAEMON_JSON)} 2>&1; echo "rc $?"'}


class DockerDaemonConfig(FactBase):
    """/etc/docker/daemon.json as a dict ({} when there is none; None when it is not JSON)."""

    @staticmethod
    def default():
        return {}

    light_paths = staticmethod(daemon_json_read)  # what its value is read from (roles/converged.py)

    def command(self):
        return f"cat {DAEMON_JSON} 2>/dev/null || true"

    def process(self, output):
        data = json_output(output, {}, None)
        return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------- operations


@operation()
def daemon_settings(settings: dict):
    """These keys of /etc/docker/daemon.json have these values; every other key (nvidia-ctk's runtimes, CDI) is
    kept. The caller restarts Docker when this changed (dockerd reads the file at start only)."""
    have = host.get_fact(DockerDaemonConfig)
    if have is None:
        raise ValueError(f"{DAEMON_JSON} on {host.name} is not JSON: fix or remove it (dockerd would not start)")
    want = {**have, **settings}
    if want == have:
        host.noop(f"{DAEMON_JSON} has {', '.join(sorted(settings))}")
        return
    yield f"mkdir -p {shlex.quote(DAEMON_JSON.rsplit('/', 1)[0])}"
    yield FileUploadCommand(StringIO(json.dumps(want, indent=2, sort_keys=True) + "\n"), DAEMON_JSON)
    yield f"chmod 644 {DAEMON_JSON}"


# --------------------------------------------------------------------------- role


def distro_of_host() -> tuple[str, str]:
    """(os-release ID, codename) of the host: what names Docker's repository and its suite."""
    distro = host.get_fact(LinuxDistribution) or {}
    meta = distro.get("release_meta") or {}
    return (meta.get("ID") or "ubuntu").lower(), meta.get("VERSION_CODENAME") or meta.get("UBUNTU_CODENAME") or "noble"


def registry_mirror(ctx: DeploymentContext) -> list:
    """The inventory's Docker Hub mirror in daemon.json, and the CA in certs.d of each registry Docker reaches (the
    mirror, the registry of derived images); the daemon.json change (or [])."""
    mirror = ctx.host.docker_registry_mirror
    registries = [mirror] if mirror else []
    if ctx.derived and ctx.derived.registry not in registries:
        registries.append(ctx.derived.registry)
    for registry in registries if ctx.host.docker_registry_ca else []:
        files.put(
            name=f"CA of the registry {registry}",
            src=ctx.host.docker_registry_ca,
            dest=f"{CERTS_DIR}/{registry}/ca.crt",
            mode="644",
        )
    if not mirror:
        return []
    return [
        daemon_settings(
            name=f"Docker pulls through the mirror {mirror}", settings={"registry-mirrors": [f"https://{mirror}"]}
        )
    ]


@deploy("Docker engine")
def apply(ctx: DeploymentContext) -> None:
    distro_id, codename = distro_of_host()
    signed_by, trusted = vendor_keyring(
        ctx,
        "docker",
        ctx.host.docker_apt_key_url or DOCKER_APT_KEY_URL.format(distro=distro_id),
        ctx.host.docker_apt_key_fingerprint,
    )
    text = deb822_source(
        ctx.host.docker_apt_mirror or DOCKER_APT_URL.format(distro=distro_id),
        ctx.host.docker_apt_suite or codename,
        ctx.host.docker_apt_components,
        signed_by,
        trusted,
    )
    source = put_text("Docker apt source", text, f"{SOURCES_DIR}/ironserve-docker.sources")
    packages = list(ctx.host.docker_packages)
    apt_update_for("Docker's source changed", [source], packages)
    daemon = registry_mirror(ctx)  # before the install: a first start already pulls through the mirror
    apt.packages(name="Docker", packages=packages, no_recommends=True)
    systemd.service(name="Docker running", service="docker.service", running=True, enabled=True)
    run_if_changed(
        name="Docker restarted (daemon.json changed)", command="systemctl restart docker.service", triggers=daemon
    )
