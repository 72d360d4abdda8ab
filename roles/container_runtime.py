"""Container runtime (docker recipes): Docker + NVIDIA container toolkit, the pinned image, the derived image.

Host data (defaults in brackets):

- ``docker_apt_mirror`` [https://download.docker.com/linux/<distro id>]: Docker's apt repository (deb822 source
  /etc/apt/sources.list.d/ironserve-docker.sources); ``docker_apt_suite`` [the distro codename, e.g. noble] and
  ``docker_apt_components`` [stable]; a suite ending in "/" is a flat repository (no components)
- ``nvidia_apt_mirror`` [none]: when set, nvidia-container-toolkit comes from that repository, which
  roles/nvidia_driver.py configured (NVIDIA's CUDA repository and the lab's carry it); unset, from NVIDIA's
  public https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) (ironserve-nvidia-container.sources,
  ``nvidia_apt_suite`` ["/", flat])
- keyrings, as for the other apt roles: ``apt_trusted`` [false] marks the sources ``Trusted: yes`` (the lab's own
  unsigned repository); else ``apt_signed_by`` [none] names a keyring already on the host (mirrors); else the
  vendor's public key is downloaded to /etc/apt/keyrings/ (``docker_apt_key_url`` / ``nvidia_apt_key_url``) and kept
  only when it is exactly the pinned key (``docker_apt_key_fingerprint`` / ``nvidia_container_key_fingerprint``,
  the vendors' published ones by default; roles/apt_keys.py)
- ``docker_packages`` [docker-ce, docker-ce-cli, containerd.io], ``nvidia_container_packages``
  [nvidia-container-toolkit, pinned at ``nvidia_container_toolkit_version``] (NVIDIA hosts only)
- ``pip_index_url`` [none]: passed to the derived image build as PIP_INDEX_URL (air-gapped builds)
- ``docker_registry_mirror`` [none]: host[:port] of an https registry that mirrors Docker Hub (an air-gapped
  cluster's): written to /etc/docker/daemon.json as ``registry-mirrors`` (other keys kept; Docker restarted when
  it changed); ``docker_registry_ca`` [none], a CA file on the controller, goes to
  /etc/docker/certs.d/<mirror>/ca.crt so Docker verifies the mirror (no insecure-registries exception)
- ``docker_image_lock`` [none]: a site lock on the controller naming the digests the site's registry holds in
  place of the recipes' own (applied by roles/context.build_context, see ironserve/imagelock.py)
- ``docker_allow_unpinned`` [false]: see below

Image pinning: a recipe with ``runtime.digest``, or with a lock file beside it (``ironserve lock``, applied when
the recipe loads: ironserve/imagelock.py), runs ``repo@sha256:...`` and pulls it only when absent, so every host
runs the same image. A recipe with neither is refused before any host is touched, unless the inventory sets
``docker_allow_unpinned``: then the tag is resolved ONCE per host: the tag is pulled, its digest recorded in
/etc/ironserve/<recipe>.lock.json and printed (pin it in the recipe); later runs keep the local tag on the
recorded digest, so a tag that moved upstream does not change a deployed host. ``runtime.patches`` build
``ironserve/<recipe>:derived`` from /etc/ironserve/images/<recipe>/Dockerfile (FROM repo@digest + the patch
lines), only when the Dockerfile changed or the image is missing: the image carries the Dockerfile's sha256
in the label ``ironserve.dockerfile.sha256``.

Patch lines are not hash-checked. A ``RUN pip install name==version`` patch runs pip inside the base image, which
installs whatever of that pin's dependencies the image does not already satisfy; pip's hash-checking mode needs
every distribution it installs pinned and hashed, and which ones those are depends on the image's own environment,
which the controller cannot resolve without pulling and running the image (``ironserve lock`` talks to registries
and indexes only). The pins are exact and come from the inventory's index (``pip_index_url``); the base is pinned by
digest. Hashing them means resolving the patches inside the pinned base at lock time (``pip install --dry-run
--report`` in a container of it) and writing a hashed requirements file into the build context: not done yet.

GPU access (NVIDIA, see ironserve.nvidia): the toolkit is pinned (``nvidia_container_toolkit_version``
[1.18.0-1]). From 1.14 on the role enables CDI in Docker (``nvidia-ctk runtime configure --cdi.enabled``) and
generates the CDI spec /etc/cdi/nvidia.yaml (``nvidia-ctk cdi generate``; again whenever it does not name the
installed driver version); the units then ask for ``--device nvidia.com/gpu=all``, which keeps the GPUs across a
``systemctl daemon-reload``. Older toolkits keep ``--gpus`` with the documented /dev/char symlinks (udev rule +
``nvidia-ctk system create-dev-char-symlinks --create-all``).

Containers run under systemd units (``docker run --rm --name <unit>``); drift of a running container against
the rendered unit (image, command, env names) is detected by the fact ``ContainerConfig`` and repaired by the
operation ``container_current`` (called by roles/launch.py, which owns restarts).
"""

from __future__ import annotations

import json
import shlex
import urllib.parse
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, FunctionCommand, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Sha256File
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, systemd

from ironserve.nvidia import gpu_access
from ironserve.spec import DockerRuntime
from ironserve.units import ETC_DIR, deliberate, image_ref, sha256_text
from roles.apt_keys import pinned_key
from roles.common import LongCommand, deb822_source, run_if_changed
from roles.context import DeploymentContext
from roles.desired import RuntimeCheck, present_check
from roles.nvidia_driver import upstream
from roles.preflight import plain

DOCKER_APT_URL = "https://download.docker.com/linux/{distro}"
DOCKER_APT_KEY_URL = "https://download.docker.com/linux/{distro}/gpg"
NVIDIA_APT_URL = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
NVIDIA_APT_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
KEYRING_DIR = "/etc/apt/keyrings"
SOURCES_DIR = "/etc/apt/sources.list.d"
DAEMON_JSON = "/etc/docker/daemon.json"
IMAGES_DIR = f"{ETC_DIR}/images"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
DEV_CHAR_RULE = "/lib/udev/rules.d/71-nvidia-dev-char.rules"
DEV_CHAR_RULE_TEXT = (
    "# Managed by ironserve (roles/container_runtime.py): /dev/char links for the NVIDIA devices, so\n"
    "# containers keep their GPUs across systemctl daemon-reload (NVIDIA/nvidia-container-toolkit#48)\n"
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n'
)
DOCKERFILE_LABEL = "ironserve.dockerfile.sha256"
CERTS_DIR = "/etc/docker/certs.d"


# --------------------------------------------------------------------------- pure helpers


def split_image(image: str) -> tuple[str, str | None]:
    """'repo:tag' -> ('repo', 'tag'); a registry port ('host:5000/repo') is not a tag."""
    last = image.split("/")[-1]
    if "@" in image:
        return image.split("@", 1)[0], None
    if ":" in last:
        return image.rsplit(":", 1)[0], image.rsplit(":", 1)[1]
    return image, "latest"


def lock_path(recipe_id: str) -> str:
    return f"{ETC_DIR}/{recipe_id}.lock.json"


def lock_text(recipe_id: str, image: str, digest: str) -> str:
    """The lock file: what the tag resolved to on this host, once (sorted keys, one line + newline)."""
    return json.dumps({"digest": digest, "image": image, "recipe": recipe_id}, sort_keys=True) + "\n"


def dockerfile_path(recipe_id: str) -> str:
    return f"{IMAGES_DIR}/{recipe_id}/Dockerfile"


def http_index_host(url: str) -> str | None:
    """The host of a plain-http index (allow_http_index), which pip needs named as trusted; None for https."""
    return urllib.parse.urlsplit(url).hostname if url.startswith("http://") else None


def dockerfile_text(recipe_id: str, base: str, patches: list[str], pip_index_url: str | None = None) -> str:
    """FROM the pinned base + the recipe's patch lines, verbatim and in order."""
    lines = [
        f"# managed by ironserve: recipe {recipe_id} (derived image; rebuilt when this file changes)",
        f"FROM {base}",
    ]
    if pip_index_url:
        # the build runs on the host: an air-gapped host reaches only the mirror (ARG is visible to RUN only)
        lines += ["ARG PIP_INDEX_URL", "ARG UV_INDEX_URL"]
        if http_index_host(pip_index_url):
            lines.append("ARG PIP_TRUSTED_HOST")  # pip ignores a plain-http index it is not told to trust
    lines += list(patches)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- facts


class DockerImageDigests(FactBase):
    """RepoDigests of a local image (['repo@sha256:...']), None when the image is not present."""

    def command(self, ref):
        return f"docker image inspect --format '{{{{json .RepoDigests}}}}' {shlex.quote(ref)} 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return None
        return json.loads(text) or []


class DockerImageLabel(FactBase):
    """The value of one label of a local image ('' when unset), None when the image is not present."""

    def command(self, ref, label):
        fmt = f'{{{{index .Config.Labels "{label}"}}}}'
        return (
            f"docker image inspect --format {shlex.quote(fmt)} {shlex.quote(ref)} 2>/dev/null"
            " && echo ironserve-image-present || true"
        )

    def process(self, output):
        lines = list(output)
        if not lines or lines[-1].strip() != "ironserve-image-present":
            return None
        value = "\n".join(lines[:-1]).strip()
        return "" if value == "<no value>" else value


class DockerRuntimes(FactBase):
    """Runtimes registered in /etc/docker/daemon.json (nvidia-ctk adds 'nvidia'); [] when there is no file."""

    @staticmethod
    def default():
        return []

    def command(self):
        return f"cat {DAEMON_JSON} 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return []
        try:
            data = json.loads(text)
        except ValueError:
            return []
        return sorted((data.get("runtimes") or {}).keys())


class DockerDaemonConfig(FactBase):
    """/etc/docker/daemon.json as a dict ({} when there is none; None when it is not JSON)."""

    @staticmethod
    def default():
        return {}

    def command(self):
        return f"cat {DAEMON_JSON} 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return {}
        try:
            data = json.loads(text)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None


class DockerCdiEnabled(FactBase):
    """Docker's daemon.json enables CDI (``features.cdi``)."""

    def command(self):
        return f"cat {DAEMON_JSON} 2>/dev/null || true"

    def process(self, output):
        try:
            data = json.loads("\n".join(output).strip() or "{}")
        except ValueError:
            return False
        return bool((data.get("features") or {}).get("cdi"))


class CdiSpec(FactBase):
    """``{devices, current}``: the NVIDIA CDI devices nvidia-ctk resolves, and whether the spec file names the
    installed driver version (a spec of an older driver mounts libraries that are gone)."""

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


class ImageLock(FactBase):
    """The recorded tag resolution of a recipe: {digest, image, recipe}, None without a lock file."""

    def command(self, path):
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None


CONTAINER_FORMAT = "\n".join(
    [
        "image_id={{.Image}}",
        "image={{.Config.Image}}",
        "running={{.State.Running}}",
        "cmd={{json .Config.Cmd}}",
        # names only: the values include the API key and the HF token
        'env={{range .Config.Env}}{{index (split . "=") 0}} {{end}}',
    ]
)


class ContainerConfig(FactBase):
    """The running container of a unit against the current id of the image it should run.

    {image_id, image, running, cmd, env_names, want_image_id}; None when there is no such container.
    """

    def command(self, container, image):
        return (
            f"docker container inspect --format {shlex.quote(CONTAINER_FORMAT)} {shlex.quote(container)} "
            f"2>/dev/null && echo want_image_id=$(docker image inspect --format '{{{{.Id}}}}' "
            f"{shlex.quote(image)} 2>/dev/null) || true"
        )

    def process(self, output):
        data = {}
        for line in output:
            key, _, value = line.partition("=")
            data[key.strip()] = value.strip()
        if "image_id" not in data:
            return None
        return {
            "image_id": data["image_id"],
            "image": data.get("image", ""),
            "running": data.get("running") == "true",
            "cmd": json.loads(data["cmd"]) if data.get("cmd") not in (None, "", "null") else [],
            "env_names": sorted(set(data.get("env", "").split())),
            "want_image_id": data.get("want_image_id") or None,
        }


# --------------------------------------------------------------------------- operations


@operation()
def nvidia_runtime_configured(cdi: bool = False):
    """Register the nvidia runtime with Docker (nvidia-ctk), CDI enabled when asked, and restart Docker."""
    if "nvidia" in host.get_fact(DockerRuntimes) and (not cdi or plain(host.get_fact(DockerCdiEnabled))):
        host.noop("docker already has the nvidia runtime" + (" and CDI" if cdi else ""))
        return
    yield "nvidia-ctk runtime configure --runtime=docker" + (" --cdi.enabled" if cdi else "")
    # dockerd reads daemon.json at start only
    yield "systemctl restart docker"


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


@operation()
def cdi_spec(driver_version: str, path: str = CDI_SPEC):
    """The NVIDIA CDI spec exists, names nvidia.com/gpu=all and the installed driver (else: generate it)."""
    spec = plain(host.get_fact(CdiSpec, path=path, driver=driver_version)) or {}
    if "nvidia.com/gpu=all" in (spec.get("devices") or []) and spec.get("current"):
        host.noop(f"{path}: nvidia.com/gpu=all for driver {driver_version}")
        return
    yield f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && nvidia-ctk cdi generate --output={shlex.quote(path)}"


@operation()
def image_pinned(image: str, digest: str | None = None, recipe_id: str | None = None):
    """The image is on the host at a pinned digest; pull only what is absent.

    With ``digest``: pull repo@digest when absent. Without: the tag is resolved once and recorded in the
    recipe's lock file; later runs keep the local tag on the recorded digest (a moved tag changes nothing).
    """
    repo, tag = split_image(image)
    if digest:
        pinned = f"{repo}@{digest}"
        if pinned in (host.get_fact(DockerImageDigests, ref=pinned) or []):
            host.noop(f"image {pinned} is present")
            return
        yield LongCommand(f"docker pull {shlex.quote(pinned)}", f"pulling {pinned}")
        return
    if not recipe_id:
        raise ValueError("image_pinned: an image without a digest needs recipe_id (for its lock file)")
    path = lock_path(recipe_id)
    lock = host.get_fact(ImageLock, path=path)
    if lock and lock.get("image") == image and lock.get("digest"):
        pinned = f"{repo}@{lock['digest']}"
        if pinned in (host.get_fact(DockerImageDigests, ref=image) or []):
            host.noop(
                f"image {image} is locked to {lock['digest']} ({path}); pin it in the recipe: "
                f"runtime.digest: {lock['digest']}"
            )
            return
        # the local tag is missing or points elsewhere (someone pulled): put it back on the locked digest
        yield LongCommand(f"docker pull {shlex.quote(pinned)}", f"pulling {pinned}")
        yield f"docker tag {shlex.quote(pinned)} {shlex.quote(image)}"
        return
    # first resolution on this host: pull the tag, record the digest it had, print it
    q_image, q_path = shlex.quote(image), shlex.quote(path)
    yield LongCommand(f"docker pull {q_image}", f"pulling {image}")
    yield (
        f"d=$(docker image inspect --format '{{{{range .RepoDigests}}}}{{{{println .}}}}{{{{end}}}}' {q_image}"
        f" | grep -m1 {shlex.quote(f'^{repo}@sha256:')}) && d=${{d#*@}} && mkdir -p {ETC_DIR} && "
        f'printf \'{{"digest": "%s", "image": "%s", "recipe": "%s"}}\\n\' "$d" {q_image} '
        f"{shlex.quote(recipe_id)} > {q_path} && "
        # the names are data: through printf's %s, never inside an echo's double quotes
        f"printf 'ironserve: %s: %s resolved to %s (recorded in %s); pin it in the recipe: runtime.digest: %s\\n' "
        f'{shlex.quote(recipe_id)} {q_image} "$d" {q_path} "$d"'
    )
    yield FunctionCommand(_print_lock, (path,), {})


def _print_lock(state, host, path):
    # the resolved digest belongs in the recipe: say it where the user reads, not only in the host's file
    status, output = host.run_shell_command(f"cat {shlex.quote(path)}")
    if status:
        host.log_styled(f"image lock {path}: {output.stdout.strip()} -- pin runtime.digest in the recipe", fg="yellow")
    return status


@operation()
def derived_image(recipe_id: str, image: str, digest: str | None, patches: list[str], pip_index_url: str | None = None):
    """Build ironserve/<recipe>:derived from the pinned base + patches when the Dockerfile changed or the
    image is missing (the image's label holds the sha256 of the Dockerfile it was built from)."""
    repo, _ = split_image(image)
    if not digest:
        # tag-only recipe: the base is whatever this host locked (read at execution, after image_pinned)
        lock = host.get_fact(ImageLock, path=lock_path(recipe_id)) or {}
        digest = lock.get("digest") if lock.get("image") == image else None
    base = f"{repo}@{digest}" if digest else image
    text = dockerfile_text(recipe_id, base, patches, pip_index_url)
    want = sha256_text(text)
    path = dockerfile_path(recipe_id)
    tag = f"ironserve/{recipe_id}:derived"
    changed = False
    if host.get_fact(Sha256File, path=path) != want:
        yield f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}"
        yield FileUploadCommand(StringIO(text), path)
        yield f"chmod 644 {shlex.quote(path)}"
        changed = True
    if host.get_fact(DockerImageLabel, ref=tag, label=DOCKERFILE_LABEL) == want and not changed:
        host.noop(f"image {tag} is built from the current Dockerfile ({want[:12]})")
        return
    build = ["docker", "build", "--network", "host", "--label", f"{DOCKERFILE_LABEL}={want}", "-t", tag, "-f", path]
    if pip_index_url:
        build += ["--build-arg", f"PIP_INDEX_URL={pip_index_url}", "--build-arg", f"UV_INDEX_URL={pip_index_url}"]
        trusted = http_index_host(pip_index_url)
        if trusted:
            build += ["--build-arg", f"PIP_TRUSTED_HOST={trusted}"]
    yield LongCommand(" ".join(shlex.quote(a) for a in build + [path.rsplit("/", 1)[0]]), f"building {tag}")


@operation()
def container_current(unit: str, image: str, cmd: list[str], env_names: list[str]):
    """Restart a unit whose running container differs from the rendered one (image, command, env names).

    docker.container in pyinfra compares nothing of this; the unit owns the container (docker run --rm), so
    the repair is a unit restart. A unit that is not running is left to the launch stage.
    """
    have = host.get_fact(ContainerConfig, container=unit, image=image)
    if not have or not have.get("running"):
        host.noop(f"no running container {unit}")
        return
    why = drift(have, image, cmd, env_names)
    if not why:
        host.noop(f"container {unit} runs the rendered configuration")
        return
    yield deliberate("restart", unit)


def drift(have: dict, image: str, cmd: list[str], env_names: list[str]) -> list[str]:
    """What differs between a running container and the rendered unit ([] when nothing)."""
    why = []
    if have.get("image") != image:
        why.append(f"image {have.get('image')} != {image}")
    if have.get("want_image_id") and have.get("image_id") != have.get("want_image_id"):
        why.append("the image was rebuilt or re-pulled since the container started")
    if list(have.get("cmd") or []) != list(cmd):
        why.append("command line differs")
    missing = sorted(set(env_names) - set(have.get("env_names") or []))
    if missing:
        why.append(f"env lacks {', '.join(missing)}")
    return why


# --------------------------------------------------------------------------- deploy


def toolkit_version(ctx: DeploymentContext) -> str:
    return ctx.host.nvidia_container_toolkit_version


def gpu_devices(ctx: DeploymentContext) -> None:
    """GPUs in containers that survive daemon-reload: CDI, or /dev/char links on a toolkit older than CDI."""
    cdi = gpu_access(toolkit_version(ctx)) == "cdi"
    nvidia_runtime_configured(name="Docker knows the nvidia runtime" + (" (CDI enabled)" if cdi else ""), cdi=cdi)
    if cdi:
        cdi_spec(name=f"CDI spec {CDI_SPEC}", driver_version=upstream(ctx.host.nvidia_driver_version))
        return
    rule = files.put(
        name="udev rule: /dev/char links for NVIDIA devices",
        src=StringIO(DEV_CHAR_RULE_TEXT),
        dest=DEV_CHAR_RULE,
        mode="644",
    )
    run_if_changed(
        name="/dev/char links for NVIDIA devices",
        triggers=[rule],
        command="nvidia-ctk system create-dev-char-symlinks --create-all",
    )


def _keyring(ctx: DeploymentContext, name: str, url: str, fingerprint: str) -> tuple[str | None, bool]:
    """(Signed-By path, trusted) for one vendor repository; downloads the public key when nothing else says, and
    keeps it only when it is exactly the key ``fingerprint`` (roles/apt_keys.py)."""
    if ctx.host.apt_trusted:
        return None, True
    if ctx.host.apt_signed_by:
        return ctx.host.apt_signed_by, False
    path = f"{KEYRING_DIR}/{name}.asc"  # armored keys are fine for Signed-By when named *.asc
    files.directory(name="Keyring directory", path=KEYRING_DIR, mode="755")
    apt.packages(
        name="Tools to fetch and check apt keys", packages=["ca-certificates", "curl", "gpg"], no_recommends=True
    )
    pinned_key(name=f"{name} apt key (pinned by fingerprint)", url=url, dest=path, fingerprint=fingerprint)
    return path, False


def registry_mirror(ctx: DeploymentContext) -> list:
    """The inventory's Docker Hub mirror in daemon.json and its CA in certs.d; the daemon.json change (or [])."""
    mirror = ctx.host.docker_registry_mirror
    if not mirror:
        return []
    if ctx.host.docker_registry_ca:
        files.put(
            name=f"CA of the registry mirror {mirror}",
            src=ctx.host.docker_registry_ca,
            dest=f"{CERTS_DIR}/{mirror}/ca.crt",
            mode="644",
        )
    return [
        daemon_settings(
            name=f"Docker pulls through the mirror {mirror}", settings={"registry-mirrors": [f"https://{mirror}"]}
        )
    ]


@deploy("Container runtime")
def apply(ctx: DeploymentContext) -> None:
    runtime = ctx.recipe.runtime
    assert isinstance(runtime, DockerRuntime)
    distro = host.get_fact(LinuxDistribution) or {}
    meta = distro.get("release_meta") or {}
    distro_id = (meta.get("ID") or "ubuntu").lower()
    codename = meta.get("VERSION_CODENAME") or meta.get("UBUNTU_CODENAME") or "noble"

    signed_by, trusted = _keyring(
        ctx,
        "docker",
        ctx.host.docker_apt_key_url or DOCKER_APT_KEY_URL.format(distro=distro_id),
        ctx.host.docker_apt_key_fingerprint,
    )
    sources = [
        files.put(
            name="Docker apt source",
            src=StringIO(
                deb822_source(
                    ctx.host.docker_apt_mirror or DOCKER_APT_URL.format(distro=distro_id),
                    ctx.host.docker_apt_suite or codename,
                    ctx.host.docker_apt_components,
                    signed_by,
                    trusted,
                )
            ),
            dest=f"{SOURCES_DIR}/ironserve-docker.sources",
            mode="644",
        )
    ]
    packages = list(ctx.host.docker_packages)
    if ctx.vendor == "nvidia" and not ctx.host.nvidia_apt_mirror:
        # public libnvidia-container repository; with nvidia_apt_mirror the toolkit comes from the repository
        # roles/nvidia_driver.py already configured (NVIDIA's CUDA repository and its mirrors carry it), and a
        # second source for the same URI with another Signed-By would make apt refuse both
        signed_by, trusted = _keyring(
            ctx,
            "nvidia-container",
            ctx.host.nvidia_apt_key_url or NVIDIA_APT_KEY_URL,
            ctx.host.nvidia_container_key_fingerprint,
        )
        sources.append(
            files.put(
                name="NVIDIA container toolkit apt source",
                src=StringIO(deb822_source(NVIDIA_APT_URL, ctx.host.nvidia_apt_suite, None, signed_by, trusted)),
                dest=f"{SOURCES_DIR}/ironserve-nvidia-container.sources",
                mode="644",
            )
        )
    if ctx.vendor == "nvidia":
        toolkit = toolkit_version(ctx)
        packages += [
            f"{p}={toolkit}" if p == "nvidia-container-toolkit" else p for p in ctx.host.nvidia_container_packages
        ]
    # also when a package is still missing: a run that failed after writing the sources never updated
    installed = host.get_fact(DebPackages) or {}
    missing = any(p.split("=", 1)[0] not in installed for p in packages)
    run_if_changed(name="apt update (sources changed)", command="apt-get update", triggers=[*sources, missing])
    daemon = registry_mirror(ctx)  # before the install: a first start already pulls through the mirror
    apt.packages(name="Docker and the NVIDIA container toolkit", packages=packages, no_recommends=True)
    systemd.service(name="Docker running", service="docker.service", running=True, enabled=True)
    run_if_changed(
        name="Docker restarted (daemon.json changed)", command="systemctl restart docker.service", triggers=daemon
    )
    if ctx.vendor == "nvidia":
        gpu_devices(ctx)

    changes = [
        image_pinned(
            name=f"Image {runtime.image} (pinned)", image=runtime.image, digest=runtime.digest, recipe_id=ctx.recipe.id
        )
    ]
    if runtime.patches:
        changes.append(
            derived_image(
                name=f"Derived image ironserve/{ctx.recipe.id}:derived",
                recipe_id=ctx.recipe.id,
                image=runtime.image,
                digest=runtime.digest,
                patches=list(runtime.patches),
                pip_index_url=ctx.host.pip_index_url,
            )
        )
    ctx.changes.record_runtime_change(*changes)
    # a unit started before these files last changed runs an older image (see roles/launch.py)
    ctx.changes.record_runtime_paths(
        *([dockerfile_path(ctx.recipe.id)] if runtime.patches else []),
        *([] if runtime.digest else [lock_path(ctx.recipe.id)]),
    )
    ctx.changes.image = image_ref(ctx.recipe)


# --------------------------------------------------------------------------- audit


def desired_runtime(ctx: DeploymentContext) -> list[RuntimeCheck]:
    """The image the units run is present (pinned digest, or the derived image), for `ironserve audit`."""
    runtime = ctx.recipe.runtime
    if not isinstance(runtime, DockerRuntime):
        return []
    out = []
    if runtime.digest:
        repo, _ = split_image(runtime.image)
        cmd = (
            f"docker image inspect --format '{{{{range .RepoDigests}}}}{{{{println .}}}}{{{{end}}}}' "
            f"{shlex.quote(f'{repo}@{runtime.digest}')} 2>/dev/null | grep -cF {shlex.quote('@' + runtime.digest)}"
            " || true"
        )
        out.append(RuntimeCheck(f"image:{repo}@{runtime.digest[:19]}", "1", cmd))
    else:
        out.append(present_check(f"image-lock:{ctx.recipe.id}", f"test -s {shlex.quote(lock_path(ctx.recipe.id))}"))
    if ctx.vendor == "nvidia" and runtime.run.gpus:
        if gpu_access(toolkit_version(ctx)) == "cdi":
            out.append(
                RuntimeCheck(
                    "cdi:nvidia.com/gpu=all",
                    "1",
                    "nvidia-ctk cdi list 2>/dev/null | grep -cx 'nvidia.com/gpu=all' || true",
                )
            )
        else:
            links = "ls /dev/char | xargs -I{} readlink /dev/char/{} 2>/dev/null | grep -q nvidia"
            out.append(present_check("dev-char:nvidia", links))
    if runtime.patches:
        ref = f"ironserve/{ctx.recipe.id}:derived"
        cmd = f"docker image inspect --format '{{{{index .Config.Labels \"{DOCKERFILE_LABEL}\"}}}}' {shlex.quote(ref)}"
        out.append(present_check(f"derived-image:{ref}", f"{cmd} >/dev/null 2>&1"))
    return out
