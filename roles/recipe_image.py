"""The recipe's image (docker recipes): pulled by digest, or a tag resolved once per host; the derived image.

Image pinning: a recipe with ``runtime.digest``, or with a lock file beside it (``ironserve lock``, applied when
the recipe loads: ironserve/imagelock.py), runs ``repo@sha256:...`` and pulls it only when absent, so every host
runs the same image. A recipe with neither is refused before any host is touched (roles/context.py
``require_pinned_image``), unless the inventory sets ``docker_allow_unpinned`` [false]: then the tag is resolved
ONCE per host: the tag is pulled, its digest recorded in /etc/ironserve/<recipe>.lock.json and printed (pin it in
the recipe); later runs keep the local tag on the recorded digest, so a tag that moved upstream does not change a
deployed host. ``docker_image_lock`` [none], a site lock on the controller, names the digests the site's registry
holds in place of the recipes' own (applied by roles/context.build_context, see ironserve/imagelock.py).

``runtime.patches`` make a derived image from /etc/ironserve/images/<recipe>/Dockerfile (FROM repo@digest + the
patch lines; ironserve/derived_image.py), built only when the Dockerfile changed or the image is missing (the image
carries the Dockerfile's sha256 in the label ``ironserve.dockerfile.sha256``); ``pip_index_url`` [none] is passed
to the build as PIP_INDEX_URL (air-gapped builds):

- with ``docker_derived_registry`` [none] (HOST[:PORT][/PREFIX], an https registry verified with
  ``docker_registry_ca``): built ONCE per deployment, by its builder (the first host of the deployment, in
  inventory order, that this run includes), tagged ``REGISTRY/PREFIX/<recipe>:dockerfile-<sha256>`` and pushed
  (``derived_pushed``: where that registry holds the base, named there or through it as the hosts' Docker Hub
  mirror, the base's layers are first mounted into the repository, so the push sends only the patches' layers
  instead of gzipping and uploading GBs of base again); the digest the registry then gives the tag, checked
  against the pushed image's own, is what every host pulls and runs (``derived_pulled``: the builder included), so every container of the deployment runs
  one image ID, and the units and the audit name ``REPOSITORY@sha256:...``. pyinfra runs an operation on every
  host before the next one, so the push is done before any host pulls. The registry is asked for the tag while
  the deploy plans: a tag it holds is neither built nor pushed again (a rerun plans no change); a push that fails
  or a digest that differs stops every host before its units change. The base image is not pulled on the other
  hosts (the derived image's layers include it). ``docker_derived_registry_auth_file`` [none], a 0600 file on the
  controller of one line USER:PASSWORD, gives the registry's credentials: the controller's lookups send them
  only when the registry asks, over https; the hosts get them as a 0600 Docker client configuration
  (/etc/ironserve/registry-auth/config.json, ``docker --config``) for the push and the pulls, never on a command
  line;
- without it: each host builds ``ironserve/<recipe>:derived`` on its own (N builds, and their image IDs differ);
  the deploy warns, naming the key.

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
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FactBase, FileUploadCommand, FunctionCommand, OperationError, deploy, operation
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files

from ironserve.derived_image import (
    PENDING,
    build_args,
    docker_config_text,
    dockerfile_text,
    mount_base,
    placeholder,
    registry_credentials,
    registry_digest,
)
from ironserve.registry import RegistryError
from ironserve.spec import DockerRuntime
from ironserve.units import ETC_DIR, image_ref, in_container, local_derived_ref, sha256_text
from roles.common import PUSHED_IMAGES, LongCommand, in_run, json_output, uses_sudo, with_pushed_images
from roles.context import DeploymentContext
from roles.desired import RuntimeCheck, listed_check, present_check
from roles.secret_file import Secret, secret_file

IMAGES_DIR = f"{ETC_DIR}/images"
# the Docker client configuration holding the credentials of the registry of derived images (0700 dir, 0600 file)
REGISTRY_AUTH_DIR = f"{ETC_DIR}/registry-auth"
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


def builder(ctx: DeploymentContext) -> str | None:
    """The host that builds and pushes the deployment's derived image: the first host of the deployment (inventory
    order) that runs it in a container and is in this run (--limit); None when none is."""
    running = {p.host for p in ctx.rendered.processes if in_container(ctx.recipe, p)}
    return next((h.name for h in ctx.hosts if h.name in running and in_run(h.name)), None)


def unshared_build_warning(ctx: DeploymentContext) -> str | None:
    """What the deploy says when each host builds its own derived image (no docker_derived_registry)."""
    if not isinstance(ctx.recipe.runtime, DockerRuntime) or not ctx.recipe.runtime.patches or ctx.derived:
        return None
    hosts = sorted({p.host for p in ctx.rendered.processes})
    return (
        f"recipe {ctx.recipe.id}: docker_derived_registry is not set: each host builds "
        f"{local_derived_ref(ctx.recipe.id)} on its own ({len(hosts)} build(s): {', '.join(hosts)}), and images "
        "built apart differ (one image ID per host, no digest the audit can check). Fix: set "
        "docker_derived_registry=HOST[:PORT]/PREFIX (an https registry the hosts reach, verified with "
        "docker_registry_ca) to build it once and run it by digest on every host"
    )


# --------------------------------------------------------------------------- facts

# the converged record's one read of the local images (roles/converged.py): every image's ID (its config, labels
# included, by content) with each repository, tag and repo digest it is known by; any pull, tag, push or removal
# changes it. Sorted: Docker lists images made in the same second in either order.
IMAGES_READ = (
    "images=$(docker image ls --all --no-trunc --digests --format '{{.ID}} {{.Repository}} {{.Tag}} {{.Digest}}' 2>&1)"
    '; rc=$?; printf \'%s\\n\' "$images" | LC_ALL=C sort; echo "rc $rc"'
)


class DockerImageDigests(FactBase):
    """RepoDigests of a local image (['repo@sha256:...']), None when the image is not present."""

    @staticmethod
    def light_paths(ref):
        """What its value is read from (roles/converged.py): the local images' one read, shared."""
        return {"sh": IMAGES_READ}

    def command(self, ref):
        return f"docker image inspect --format '{{{{json .RepoDigests}}}}' {shlex.quote(ref)} 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return None
        return json.loads(text) or []


class DockerImageLabel(FactBase):
    """The value of one label of a local image ('' when unset), None when the image is not present."""

    @staticmethod
    def light_paths(ref, label):
        """What its value is read from (roles/converged.py): the local images' one read, shared (a label is part of
        the image's config, whose digest is its ID)."""
        return {"sh": IMAGES_READ}

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


def _built(recipe_id: str, text: str, ref: str, pip_index_url: str | None):
    """The commands that make ``ref`` the image built from the Dockerfile ``text`` (its label holds the text's sha256):
    the Dockerfile written where it changed, the build where the image is missing or was built from another one.
    Returns whether there was anything to do."""
    want = sha256_text(text)
    path = dockerfile_path(recipe_id)
    changed = host.get_fact(Sha256File, path=path) != want
    if changed:
        yield f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}"
        yield FileUploadCommand(StringIO(text), path)
        yield f"chmod 644 {shlex.quote(path)}"
    if host.get_fact(DockerImageLabel, ref=ref, label=DOCKERFILE_LABEL) == want and not changed:
        return False
    build = ["docker", "build", "--network", "host", "--label", f"{DOCKERFILE_LABEL}={want}", "-t", ref, "-f", path]
    build += build_args(pip_index_url)
    yield LongCommand(shlex.join(build + [path.rsplit("/", 1)[0]]), f"building {ref}")
    return True


@operation()
def derived_image(recipe_id: str, image: str, digest: str | None, patches: list[str], pip_index_url: str | None = None):
    """Build ironserve/<recipe>:derived on this host from the pinned base + patches when the Dockerfile changed or
    the image is missing (no registry for derived images: each host builds its own)."""
    repo, _ = split_image(image)
    if not digest:
        # tag-only recipe: the base is whatever this host locked (read at execution, after image_pinned)
        lock = host.get_fact(ImageLock, path=lock_path(recipe_id)) or {}
        digest = lock.get("digest") if lock.get("image") == image else None
    base = f"{repo}@{digest}" if digest else image
    text = dockerfile_text(recipe_id, base, patches, pip_index_url)
    ref = local_derived_ref(recipe_id)
    if not (yield from _built(recipe_id, text, ref, pip_index_url)):
        host.noop(f"image {ref} is built from the current Dockerfile ({sha256_text(text)[:12]})")


@operation()
def derived_pushed(
    recipe_id: str,
    repository: str,
    tag: str,
    dockerfile: str,
    builder: str | None,
    build_here: bool = False,
    digest: str | None = None,
    pip_index_url: str | None = None,
    ca_file: str | None = None,
    auth_file: str | None = None,
    docker_config: str | None = None,
    base_source: str | None = None,
):
    """The deployment's derived image is in the site's registry as ``repository:tag`` (tag: the Dockerfile's
    sha256): ``digest`` is what the registry gave the tag while the run planned; without it the ``builder`` (this
    host when ``build_here``) builds the image (where its label shows another Dockerfile or none), pushes it and
    records the digest the registry then gives the tag, checked against the pushed image's own
    (``_record_push``), for every host's pull. ``base_source``: the base's PATH@sha256:... in the same registry,
    whose layers are mounted into the repository before the push (``_mounted_base``)."""
    tagged = f"{repository}:{tag}"
    if digest:
        host.noop(f"{tagged} is in the registry as {digest}: nothing to build")
        return
    if builder is None:
        raise OperationError(
            f"{tagged} is not in the registry and no host of this run can build it: include the deployment's "
            "first engine host (--limit)"
        )
    if not build_here:
        host.noop(f"{builder} builds and pushes {tagged}")
        return
    yield from _built(recipe_id, dockerfile, tagged, pip_index_url)
    if base_source:
        yield FunctionCommand(_mounted_base, (repository, base_source, ca_file, auth_file), {})
    yield LongCommand(f"{docker_client(docker_config)} push {shlex.quote(tagged)}", f"pushing {tagged}")
    yield FunctionCommand(_record_push, (repository, tag, ca_file, auth_file), {})


def docker_client(config: str | None) -> str:
    """The docker command, with the client configuration holding the registry's credentials when there is one."""
    return f"docker --config {shlex.quote(config)}" if config else "docker"


def _mounted_base(state, host, repository: str, source: str, ca_file: str | None, auth_file: str | None) -> bool:
    """The base's layers mounted into the derived image's repository from where the registry holds the base, so
    the push uploads only the patches' layers (ironserve/derived_image.py ``mount_base``). Never fails the run:
    a layer not mounted is one the push uploads, as without this step."""
    try:
        mounted, layers = mount_base(repository, source, ca_file, auth_file)
    except RegistryError as exc:
        host.log_styled(f"{repository}: the base's layers not mounted from {source} ({exc}): the push uploads them")
        return True
    left = f", the push uploads the other {layers - mounted}" if mounted < layers else ""
    host.log_styled(
        f"{repository}: {mounted} of {layers} base layer(s) mounted from {source.partition('@')[0]} in the "
        f"registry{left}: the push sends only the patches' layers",
        fg="yellow" if left else "green",
    )
    return True


def _record_push(state, host, repository: str, tag: str, ca_file: str | None, auth_file: str | None = None) -> bool:
    """After the builder's push: the digest the registry gives the tag must be one the pushed image has (another
    push of the tag in between, or a registry that rewrote the manifest, stops here); it becomes what every host
    pulls and runs."""
    tagged = f"{repository}:{tag}"
    fmt = "{{range .RepoDigests}}{{println .}}{{end}}"
    status, output = host.run_shell_command(
        f"docker image inspect --format {shlex.quote(fmt)} {shlex.quote(tagged)}", _sudo=uses_sudo(host)
    )
    local = [line.partition("@")[2] for line in output.stdout_lines if line.startswith(f"{repository}@")]
    try:
        remote = registry_digest(repository, tag, ca_file, auth_file)
    except RegistryError as exc:
        remote, local = None, [str(exc)]
    if not status or not remote or remote not in local:
        host.log_styled(
            f"{tagged}: the registry gives {remote or 'no digest'}, the image pushed from here has "
            f"{', '.join(local) or 'none'}: digest mismatch, no host pulls it (rerun the deploy)",
            fg="red",
        )
        return False
    PUSHED_IMAGES[placeholder(repository, tag)] = f"{repository}@{remote}"
    host.log_styled(f"{tagged} pushed: every host runs {repository}@{remote}", fg="green")
    return True


@operation()
@with_pushed_images
def derived_pulled(ref: str, docker_config: str | None = None):
    """The deployment's derived image, by digest from the site's registry, on this host (the builder has it from
    its push). ``ref`` names an image this run pushes by a placeholder until the push (ironserve/derived_image.py):
    planned as a pull, resolved when it executes."""
    pull = LongCommand(f"{docker_client(docker_config)} pull {shlex.quote(ref)}", f"pulling {ref}")
    if PENDING not in ref and ref in (host.get_fact(DockerImageDigests, ref=ref) or []):
        host.noop(f"image {ref} is present")
        return
    yield pull


# --------------------------------------------------------------------------- role


_WARNED: set[str] = set()


def registry_image(ctx: DeploymentContext) -> list:
    """The deployment's derived image built once and pushed, then pulled by digest on every host: the changes."""
    image = ctx.derived
    assert image is not None
    who = builder(ctx)
    config = registry_login(image.registry, image.auth_file)
    pushed = derived_pushed(
        name=f"Derived image {image.tagged} in the registry (built and pushed by {who or 'no host of this run'})",
        recipe_id=ctx.recipe.id,
        repository=image.repository,
        tag=image.tag,
        dockerfile=image.dockerfile,
        builder=who,
        build_here=who == ctx.host_name,
        digest=image.digest,
        pip_index_url=image.pip_index_url,
        ca_file=image.ca_file,
        auth_file=image.auth_file,
        docker_config=config,
        base_source=image.base_source,
    )
    pulled = derived_pulled(
        name=f"Derived image {image.repository} pulled by digest", ref=image.ref, docker_config=config
    )
    return [pushed, pulled]


def registry_login(registry: str, auth_file: str | None) -> str | None:
    """The registry's credentials (a 0600 file on the controller) as a 0600 Docker client configuration on the
    host, for the push and the pulls (never on a command line); its directory, or None without credentials."""
    if not auth_file:
        return None
    try:
        credentials = registry_credentials(auth_file)
    except ValueError as exc:
        raise OperationError(f"docker_derived_registry_auth_file {exc}") from None
    files.directory(
        name="registry credentials directory", path=REGISTRY_AUTH_DIR, mode="700", user="root", group="root"
    )
    secret_file(
        name=f"credentials of {registry} (0600)",
        path=f"{REGISTRY_AUTH_DIR}/config.json",
        secret=Secret(docker_config_text(registry, credentials)),
    )
    return REGISTRY_AUTH_DIR


def local_image(ctx: DeploymentContext) -> list:
    """The pinned base pulled and (with patches) the derived image built on this host: the changes."""
    runtime = ctx.recipe.runtime
    changes = [
        image_pinned(
            name=f"Image {runtime.image} (pinned)", image=runtime.image, digest=runtime.digest, recipe_id=ctx.recipe.id
        )
    ]
    warning = unshared_build_warning(ctx)
    if warning and ctx.recipe.id not in _WARNED:
        _WARNED.add(ctx.recipe.id)
        logger.warning(f"warning: {warning}")
    if runtime.patches:
        changes.append(
            derived_image(
                name=f"Derived image {local_derived_ref(ctx.recipe.id)} (built on this host)",
                recipe_id=ctx.recipe.id,
                image=runtime.image,
                digest=runtime.digest,
                patches=list(runtime.patches),
                pip_index_url=ctx.host.pip_index_url,
            )
        )
    # a unit started before these files last changed runs an older image (see roles/launch.py)
    ctx.changes.record_runtime_paths(
        *([dockerfile_path(ctx.recipe.id)] if runtime.patches else []),
        *([] if runtime.digest else [lock_path(ctx.recipe.id)]),
    )
    return changes


@deploy("Recipe image")
def apply(ctx: DeploymentContext) -> None:
    assert isinstance(ctx.recipe.runtime, DockerRuntime)
    ctx.changes.record_runtime_change(*(registry_image(ctx) if ctx.derived else local_image(ctx)))
    ctx.changes.image = image_ref(ctx.recipe)


# --------------------------------------------------------------------------- audit


# every tag of an image found (repo:tag), then each of its repo digests (repo@sha256:...), a line each
IMAGE_NAMES_FORMAT = "{{range .RepoTags}}{{println .}}{{end}}{{range .RepoDigests}}{{println .}}{{end}}"


def image_names_read(refs: list[str]) -> str:
    """One docker run for all of a host's image checks: the tags and digests (``@sha256:...``, the repository cut
    off as the pinned check always ignored it) of every image ``refs`` names that is on the host. docker's CLI
    takes about 27 ms of CPU to start: one start for the host's image checks, not one each."""
    return (
        f"docker image inspect --format {shlex.quote(IMAGE_NAMES_FORMAT)} {shlex.join(refs)} 2>/dev/null "
        "| sed 's/^[^@]*@/@/'"
    )


def digest_present(check_id: str, ref: str, read: str) -> RuntimeCheck:
    """The image ``REPO@DIGEST`` is on the host, pulled by that digest (its repo digests name it); ``read`` is
    image_names_read of the host's image refs, ``ref`` among them."""
    digest = ref.rpartition("@")[2]
    return listed_check(f"{check_id}:{ref.rpartition('@')[0]}@{digest[:19]}", read, "@" + digest)


def container_runs(unit: str, ref: str) -> RuntimeCheck:
    """The running container of ``unit`` runs the image ``ref`` names (the same image ID)."""
    unit_q, ref_q = shlex.quote(unit), shlex.quote(ref)
    cmd = (
        f"a=$(docker container inspect --format '{{{{.Image}}}}' {unit_q} 2>/dev/null); "
        f"b=$(docker image inspect --format '{{{{.Id}}}}' {ref_q} 2>/dev/null); "
        'if [ -n "$b" ] && [ "$a" = "$b" ]; then echo same; else echo "${a:-no container} is not ${b:-absent}"; fi'
    )
    return RuntimeCheck(f"container-image:{unit}", "same", cmd)


def desired_runtime(ctx: DeploymentContext) -> list[RuntimeCheck]:
    """The image the units run is on the host (pinned digest, or the derived image) and, from the site's registry,
    is what each running container runs, for `ironserve audit`."""
    runtime = ctx.recipe.runtime
    if not isinstance(runtime, DockerRuntime):
        return []
    if ctx.derived:
        return registry_checks(ctx)
    derived = local_derived_ref(ctx.recipe.id) if runtime.patches else None
    read = image_names_read([ref for ref in (runtime.pinned_ref if runtime.digest else None, derived) if ref])
    out = []
    if runtime.digest:
        out.append(digest_present("image", runtime.pinned_ref, read))
    else:
        out.append(present_check(f"image-lock:{ctx.recipe.id}", f"test -s {shlex.quote(lock_path(ctx.recipe.id))}"))
    if derived:  # the image this host built, by its tag
        out.append(listed_check(f"derived-image:{derived}", read, derived))
    return out


def registry_checks(ctx: DeploymentContext) -> list[RuntimeCheck]:
    """The deployment's derived image pulled by its digest, and every container of this host running it."""
    image = ctx.derived
    assert image is not None
    if not image.digest:
        return [RuntimeCheck(f"derived-image:{image.tagged}", "pushed", "echo not in the registry")]
    out = [digest_present("derived-image", image.ref, image_names_read([image.ref]))]
    if ctx.launch:
        out += [container_runs(p.unit, image.ref) for p in ctx.processes if in_container(ctx.recipe, p)]
    return out
