"""The recipe's image (docker recipes): pulled by digest, or a tag resolved once per host; the derived image.

Image pinning: a recipe with ``runtime.digest``, or with a lock file beside it (``ironserve lock``, applied when
the recipe loads: ironserve/imagelock.py), runs ``repo@sha256:...`` and pulls it only when absent, so every host
runs the same image. A recipe with neither is refused before any host is touched (roles/context.py
``require_pinned_image``), unless the inventory sets ``docker_allow_unpinned`` [false]: then the tag is resolved
ONCE per host: the tag is pulled, its digest recorded in /etc/ironserve/<recipe>.lock.json and printed (pin it in
the recipe); later runs keep the local tag on the recorded digest, so a tag that moved upstream does not change a
deployed host. ``docker_image_lock`` [none], a site lock on the controller, names the digests the site's registry
holds in place of the recipes' own (applied by roles/context.build_context, see ironserve/imagelock.py).

``runtime.patches`` build ``ironserve/<recipe>:derived`` from /etc/ironserve/images/<recipe>/Dockerfile (FROM
repo@digest + the patch lines), only when the Dockerfile changed or the image is missing: the image carries the
Dockerfile's sha256 in the label ``ironserve.dockerfile.sha256``. ``pip_index_url`` [none] is passed to the build
as PIP_INDEX_URL (air-gapped builds).

Patch lines are not hash-checked. A ``RUN pip install name==version`` patch runs pip inside the base image, which
installs whatever of that pin's dependencies the image does not already satisfy; pip's hash-checking mode needs
every distribution it installs pinned and hashed, and which ones those are depends on the image's own environment,
which the controller cannot resolve without pulling and running the image (``ironserve lock`` talks to registries
and indexes only). The pins are exact and come from the inventory's index (``pip_index_url``); the base is pinned by
digest. Hashing them means resolving the patches inside the pinned base at lock time (``pip install --dry-run
--report`` in a container of it) and writing a hashed requirements file into the build context: not done yet.

A running container's drift from its rendered unit is roles/container_drift.py's.
"""

from __future__ import annotations

import json
import shlex
import urllib.parse
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, FunctionCommand, deploy, operation
from pyinfra.facts.files import Sha256File

from ironserve.spec import DockerRuntime
from ironserve.units import ETC_DIR, image_ref, sha256_text
from roles.common import LongCommand, json_output
from roles.context import DeploymentContext
from roles.desired import RuntimeCheck, present_check

IMAGES_DIR = f"{ETC_DIR}/images"
DOCKERFILE_LABEL = "ironserve.dockerfile.sha256"


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


class ImageLock(FactBase):
    """The recorded tag resolution of a recipe: {digest, image, recipe}, None without a lock file."""

    def command(self, path):
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return json_output(output)


# --------------------------------------------------------------------------- operations


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


# --------------------------------------------------------------------------- role


@deploy("Recipe image")
def apply(ctx: DeploymentContext) -> None:
    runtime = ctx.recipe.runtime
    assert isinstance(runtime, DockerRuntime)
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
    if runtime.patches:
        ref = f"ironserve/{ctx.recipe.id}:derived"
        cmd = f"docker image inspect --format '{{{{index .Config.Labels \"{DOCKERFILE_LABEL}\"}}}}' {shlex.quote(ref)}"
        out.append(present_check(f"derived-image:{ref}", f"{cmd} >/dev/null 2>&1"))
    return out
