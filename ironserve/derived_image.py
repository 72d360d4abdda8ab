"""A docker recipe's derived image (``runtime.patches``): its Dockerfile, and its name in the site's registry.

Without a registry each host builds ``ironserve/<recipe>:derived`` from the Dockerfile on its own (roles/recipe_image.py):
N hosts pay N builds and their images differ (two builds of one Dockerfile give two image IDs). With host data
``docker_derived_registry`` (``HOST[:PORT][/PREFIX]``) the deployment's image is built once, pushed as
``HOST[:PORT]/PREFIX/<recipe id>:dockerfile-<sha256 of the Dockerfile>`` (content-addressed: a new Dockerfile is a
new tag, never a moved one), and every host pulls and runs it by the manifest digest the registry gives that tag:
the units, the parse check and the audit name ``REPOSITORY@sha256:...``, so every container of the deployment runs
one image ID.

The digest is read from the registry while the deploy plans (``pushed_digest``); when the registry does not hold
the tag yet, the run builds and pushes it, and until then the image is named by a placeholder
(``REPOSITORY@to-be-pushed:TAG``: what the plan shows; not a reference Docker accepts) which the operations
replace with the pushed digest when they execute (roles/common.py ``with_pushed_images``).
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import stat
import urllib.error
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass, replace

from .imagelock import split_reference
from .problems import SpecError
from .registry import DOCKER_HUB, Registry, RegistryError
from .spec import IMAGE_COMPONENT, DockerRuntime, Recipe
from .units import sha256_text

PENDING = "@to-be-pushed:"  # placeholder of a digest this run pushes: REPOSITORY@to-be-pushed:TAG
TAG_PREFIX = "dockerfile-"
LOOKUP_TIMEOUT_S = 30
KEY = "docker_derived_registry"


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
        # the build runs on a host: an air-gapped host reaches only the mirror (ARG is visible to RUN only)
        lines += ["ARG PIP_INDEX_URL", "ARG UV_INDEX_URL"]
        if http_index_host(pip_index_url):
            lines.append("ARG PIP_TRUSTED_HOST")  # pip ignores a plain-http index it is not told to trust
    lines += list(patches)
    return "\n".join(lines) + "\n"


def build_args(pip_index_url: str | None) -> list[str]:
    """``docker build`` arguments that point the patches' pip at the inventory's index (none without one)."""
    if not pip_index_url:
        return []
    out = ["--build-arg", f"PIP_INDEX_URL={pip_index_url}", "--build-arg", f"UV_INDEX_URL={pip_index_url}"]
    trusted = http_index_host(pip_index_url)
    return out + (["--build-arg", f"PIP_TRUSTED_HOST={trusted}"] if trusted else [])


def placeholder(repository: str, tag: str) -> str:
    """How the plan names the digest of an image this run pushes (replaced by it when the operations execute)."""
    return f"{repository}{PENDING}{tag}"


@dataclass(frozen=True)
class DerivedImage:
    """The deployment's derived image in the site's registry (one for every host of the deployment)."""

    registry: str  # HOST[:PORT]: the https registry, its CA the inventory's docker_registry_ca
    repository: str  # HOST[:PORT]/PREFIX/<recipe id>
    tag: str  # dockerfile-<sha256 of the Dockerfile>
    dockerfile: str
    pip_index_url: str | None = None  # the build's index (build arguments, not in the Dockerfile)
    ca_file: str | None = None  # the registry's CA on the controller (docker_registry_ca)
    auth_file: str | None = None  # USER:PASSWORD, 0600 on the controller (docker_derived_registry_auth_file)
    digest: str | None = None  # the manifest digest the registry gives the tag; None until pushed
    base_source: str | None = None  # PATH@sha256:... of the base in this registry (base_source()), or None

    @property
    def tagged(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def ref(self) -> str:
        """What every host pulls and runs: REPOSITORY@sha256:..., or the placeholder until this run pushed it."""
        return f"{self.repository}@{self.digest}" if self.digest else placeholder(self.repository, self.tag)

    def pushed(self, digest: str) -> DerivedImage:
        return replace(self, digest=digest)


def derived_image(
    recipe: Recipe,
    registry: str,
    pip_index_url: str | None = None,
    ca_file: str | None = None,
    auth_file: str | None = None,
    mirror: str | None = None,
) -> DerivedImage:
    """The derived image of a docker recipe with patches and a pinned base, in ``registry`` (HOST[:PORT][/PREFIX],
    validated by ironserve.hostdata; ``mirror``: the hosts' docker_registry_mirror); its digest unknown.
    ValueError when the recipe id cannot name a repository."""
    runtime = recipe.runtime
    assert isinstance(runtime, DockerRuntime) and runtime.patches and runtime.digest
    if not re.fullmatch(IMAGE_COMPONENT, recipe.id):
        raise ValueError(f"recipe id {recipe.id!r} is not a repository name (lowercase letters, digits, . _ -)")
    text = dockerfile_text(recipe.id, runtime.pinned_ref, list(runtime.patches), pip_index_url)
    return DerivedImage(
        registry=registry.split("/", 1)[0],
        repository=f"{registry.rstrip('/')}/{recipe.id}",
        tag=TAG_PREFIX + sha256_text(text),
        dockerfile=text,
        pip_index_url=pip_index_url,
        ca_file=ca_file,
        auth_file=auth_file,
        base_source=base_source(runtime.pinned_ref, registry.split("/", 1)[0], mirror),
    )


def base_source(base: str, registry: str, mirror: str | None) -> str | None:
    """Where ``registry`` (HOST[:PORT], the derived image's) holds the pinned ``base`` (REPO@sha256:...) as
    ``PATH@sha256:...``: the base named in that registry, or a Docker Hub name when that registry is the hosts'
    Docker Hub mirror; None when the base comes from another registry (the push then uploads its layers, once)."""
    name, _, digest = base.partition("@")
    if not digest:
        return None
    domain, path, _ = split_reference(name)
    held = domain == registry or (domain == DOCKER_HUB and mirror == registry)
    return f"{path}@{digest}" if held else None


def mount_base(repository: str, source: str, ca_file: str | None, auth_file: str | None) -> tuple[int, int]:
    """The layers of the base ``source`` (PATH@sha256:..., base_source()) linked into the derived image's
    ``repository`` (HOST[:PORT]/PATH) by cross-repository mounts: the registry links blobs it holds, no byte moves.
    Done before the builder's ``docker push``, which then finds every base layer in the repository and neither
    compresses nor uploads it again (it gzips each layer it must upload: GBs of an engine image, minutes of a core,
    and a recompressed copy of the base for every host to pull). (layers mounted or already there, layers); a
    RegistryError when the registry cannot be asked."""
    registry, _, target = repository.partition("/")
    path, _, digest = source.partition("@")
    with _asking(registry, ca_file, auth_file) as client:
        layers = client.layers(path, digest)
        there = [d for d in layers if client.has_blob(target, d) or client.mount_blob(target, d, path)]
    return len(there), len(layers)


@contextmanager
def _asking(registry: str, ca_file: str | None, auth_file: str | None):
    """A client of the derived images' registry, with its credentials; a RegistryError when they are unusable or
    the registry cannot be reached (TLS not verified with the CA included)."""
    try:
        credentials = registry_credentials(auth_file) if auth_file else None
    except ValueError as exc:
        raise RegistryError(f"docker_derived_registry_auth_file {exc}") from None
    try:
        yield Registry(registry, ca_file, timeout=LOOKUP_TIMEOUT_S, credentials=credentials)
    except (urllib.error.URLError, ssl.SSLError, OSError) as exc:
        raise RegistryError(f"https://{registry}/v2/ unreachable: {getattr(exc, 'reason', exc)}") from None


def registry_credentials(path: str) -> tuple[str, str]:
    """(user, password) from a controller file of one line USER:PASSWORD, readable by its owner only (0600 or
    stricter: a password others can read is refused, not used); ValueError saying what is wrong, never the value."""
    file = os.path.expanduser(path)
    try:
        mode = os.stat(file).st_mode
        text = open(file).read().strip() if stat.S_ISREG(mode) else ""
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from None
    if stat.S_IMODE(mode) & 0o077:
        raise ValueError(f"{path}: mode {stat.S_IMODE(mode):04o} lets others read the password (chmod 600 it)")
    user, _, password = text.partition(":")
    if not user or not password or "\n" in text:
        raise ValueError(f"{path}: not one line USER:PASSWORD")
    return user, password


def docker_config_text(registry: str, credentials: tuple[str, str]) -> str:
    """A Docker client configuration (``docker --config DIR``'s config.json) holding the registry's credentials."""
    auth = base64.b64encode(":".join(credentials).encode()).decode()
    return json.dumps({"auths": {registry: {"auth": auth}}}, indent=1, sort_keys=True) + "\n"


def registry_digest(repository: str, tag: str, ca_file: str | None, auth_file: str | None = None) -> str | None:
    """The manifest digest the registry of ``repository`` (HOST[:PORT]/PATH) gives ``tag`` (None: not there); a
    RegistryError that says why the registry could not be asked (unreachable, TLS not verified with the CA, the
    credentials refused or unreadable, an unexpected answer)."""
    registry, _, path = repository.partition("/")
    with _asking(registry, ca_file, auth_file) as client:
        return client.digest(path, tag)


_LOOKED_UP: dict[tuple[str, str, str | None], str | None] = {}


def pushed_digest(image: DerivedImage, where: str = "inventory") -> str | None:
    """``registry_digest``, asked once per process for each image (every host of a run shares the answer); a
    registry that cannot be asked stops the command before any host is touched (SpecError naming the key)."""
    key = (image.repository, image.tag, image.ca_file)
    if key not in _LOOKED_UP:
        try:
            _LOOKED_UP[key] = registry_digest(image.repository, image.tag, image.ca_file, image.auth_file)
        except RegistryError as exc:
            raise SpecError.one(
                where,
                KEY,
                f"cannot read {image.tagged} from the registry: {exc}",
                "make the registry reachable over https from this machine, its certificate verified by "
                "docker_registry_ca (and its credentials in docker_derived_registry_auth_file, 0600), or unset "
                "docker_derived_registry (each host then builds on its own)",
            ) from None
    return _LOOKED_UP[key]


def pending_images(value) -> list[str]:
    """The placeholders (images this run pushes) named anywhere in ``value`` (strings, lists, tuples, dicts)."""
    if isinstance(value, str):
        return re.findall(rf"[A-Za-z0-9.:/_-]+{re.escape(PENDING)}{TAG_PREFIX}[0-9a-f]{{64}}", value)
    if isinstance(value, dict):
        return [p for v in value.values() for p in pending_images(v)]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in pending_images(v)]
    return []


def substitute(value, refs: dict[str, str]):
    """``value`` with every placeholder of ``refs`` replaced by its pushed reference (same shape). A container that
    names none is returned itself, not a copy: an operation's shared records (dicts it fills) stay shared."""
    if isinstance(value, str):
        for pending, ref in refs.items():
            if pending in value:
                value = value.replace(pending, ref)
        return value
    if isinstance(value, dict):
        items = {k: substitute(v, refs) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    if isinstance(value, (list, tuple)):
        items = [substitute(v, refs) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    return value
