"""Lock files: what a recipe's runtime resolves to, written once (``ironserve lock``) and read by every deploy.

``<recipe>.lock.json`` beside the recipe's YAML file (recipes/<id>.lock.json for the catalogue):

- docker recipes: ``{"docker": {"image": REPO:TAG, "digest": "sha256:...", "registry": HOST}}``: the manifest
  digest the tag had in the registry the inventory names (``docker_registry_mirror``, else the image's own
  registry). Loading a recipe without ``runtime.digest`` applies it (catalogue.load_recipe_file), so every host
  pulls REPO@DIGEST, the units run it, and the audit checks that digest: all ranks of a group run one image;
- uv recipes: ``{"uv": {"index": URL, "runtime": DIGEST, "platforms": {ARCH: {"name==version": ["sha256:...",
  ...]}}}}``: the full resolution of the runtime (its pins, every transitive dependency, with the recipe's
  overrides and excludes) for each machine of its hardware profiles, each distribution with the sha256 of its
  files in the index the inventory names (``uv pip compile --generate-hashes``; a pin that is not
  ``name==version`` is refused). ``runtime`` is the digest of the recipe's runtime section (units.runtime_digest):
  a lock of other pins is stale. The uv role installs from it with ``--require-hashes`` (roles/uv_env.py), and the
  router's own venv resolves within it where it holds sglang-router==engine.router (``-c``, hash-checked); a uv
  recipe without a lock installs unchecked, with a warning, or not at all under host data ``require_locks``.

- docker recipes with a router (engine.router): ``{"router": {"index": URL, "version": VERSION, "platforms": {ARCH:
  {PYTHON: {"name==version": [...]}}}}}``: the router's own venv (ironserve.units.router_venv), which beside a
  docker runtime runs on the host's python3, resolved for each machine and each Python minor the hosts may have
  (``--router-python``; default :data:`ROUTER_PYTHONS`), every distribution with its sha256. The router role
  installs it ``--require-hashes`` for the host's machine and python3 (roles/router_runtime.py); without an entry
  for them it installs unchecked with a warning, or not at all under ``require_locks``.

A lock whose image (or uv runtime, or router version) differs from the recipe's (the tag or the pins were edited) is
stale: it is ignored and the deploy says so.

Site locks (host data ``docker_image_lock``, a file on the controller; ``ironserve lock --all --site FILE``):
``{"docker": {IMAGE: {"digest": "sha256:...", "replaces": "sha256:..."|null, "repository": REPO|null}}}``, the
images this site's registry holds in place of the recipes' own. For a site that rebuilds or re-signs upstream
images into its registry (their digests then differ from upstream's), or mirrors a registry Docker cannot mirror
(only Docker Hub names go through ``registry-mirrors``: ``repository`` then names the image in the site's
registry). An entry applies to a recipe whose image is IMAGE and whose own digest (recipe or lock file) is
``replaces`` (null: a tag-only recipe); any other digest makes the entry stale, which stops the deploy: the
site lock must be made again for the recipe's new pin. The deploy, the units and the audit then use the
site's digest (roles/context.build_context).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from . import pins
from .problems import Problem, SpecError
from .registry import DOCKER_HUB, Registry, repository_path
from .spec import DockerRuntime, Recipe, UvRuntime
from .units import ROUTER_DIST, router_venv, runtime_digest

SUFFIX = ".lock.json"


def lock_file(recipe_file: Path) -> Path:
    return recipe_file.with_name(recipe_file.stem + SUFFIX)


def read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpecError(
            [Problem(str(path), "", f"unreadable lock file: {exc}", "run `ironserve lock` again")]
        ) from None
    return data if isinstance(data, dict) else None


def write(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def locked_digest(recipe: Recipe, lock: dict | None) -> str | None:
    """The digest the lock gives the recipe's image (None: no lock, no docker entry, or a stale one)."""
    entry = (lock or {}).get("docker") or {}
    if isinstance(recipe.runtime, DockerRuntime) and entry.get("image") == recipe.runtime.image:
        digest = entry.get("digest")
        if isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            return digest
    return None


def apply(recipe: Recipe, recipe_file: Path) -> Recipe:
    """The recipe with its lock's digest when it pins none itself (unchanged otherwise)."""
    runtime = recipe.runtime
    if not isinstance(runtime, DockerRuntime) or runtime.digest:
        return recipe
    digest = locked_digest(recipe, read(lock_file(recipe_file)))
    if not digest:
        return recipe
    return recipe.model_copy(update={"runtime": runtime.model_copy(update={"digest": digest})})


def site_entry(digest: str, replaces: str | None, repository: str | None = None) -> dict:
    """One image of a site lock (see the module docstring)."""
    return {"digest": digest, "replaces": replaces, "repository": repository}


def apply_site(recipe: Recipe, site_lock: str | Path | None) -> Recipe:
    """The recipe with the site lock's digest (and repository) for its image; unchanged when the lock names none."""
    runtime = recipe.runtime
    if not site_lock or not isinstance(runtime, DockerRuntime):
        return recipe
    entry = _site_lock_entry(Path(site_lock).expanduser(), runtime.image, str(site_lock))
    if entry is None:
        return recipe
    _check_site_entry(entry, recipe, str(site_lock))
    update = {"digest": entry["digest"]}
    if entry.get("repository"):
        update["image"] = f"{entry['repository']}:{split_reference(runtime.image)[2]}"
    return recipe.model_copy(update={"runtime": _sited_runtime(runtime, update, str(site_lock))})


def _site_lock_entry(path: Path, image: str, where: str) -> dict | None:
    """The site lock's entry for ``image``, None when it has none; the lock itself must exist (host data names it)."""
    data = read(path)
    if data is None:
        raise SpecError.one(
            where,
            "",
            "docker_image_lock names no file",
            "run `ironserve lock --all --site FILE --inventory INVENTORY`, or unset it",
        )
    entry = (data.get("docker") or {}).get(image)
    return entry if isinstance(entry, dict) else None


def _check_site_entry(entry: dict, recipe: Recipe, where: str) -> None:
    """An entry applies only as a digest that replaces the very pin the recipe has: any other is stale."""
    runtime = recipe.runtime
    digest = entry.get("digest")
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise SpecError.one(
            where,
            f"docker.{runtime.image}.digest",
            f"not a digest: {digest!r}",
            "run `ironserve lock --all --site FILE` again",
        )
    if entry.get("replaces") != runtime.digest:
        raise SpecError.one(
            where,
            f"docker.{runtime.image}.replaces",
            f"the site's image replaces {entry.get('replaces') or 'the bare tag'}, but recipe "
            f"{recipe.id} pins {runtime.digest or 'no digest'}: the site lock is stale",
            "push the recipe's image to the site registry and run `ironserve lock --all --site "
            "FILE --inventory INVENTORY` again",
        )


def _sited_runtime(runtime: DockerRuntime, update: dict, where: str) -> DockerRuntime:
    """The runtime with the site's digest and image, validated as the recipe's own fields are (model_copy would
    not): the values reach docker argv and units."""
    try:
        return DockerRuntime.model_validate({**runtime.model_dump(), **update})
    except ValidationError as exc:
        fields = {"image": "repository"}  # the site lock's own field names
        raise SpecError(
            [
                Problem(
                    where,
                    f"docker.{runtime.image}.{fields.get(e['loc'][-1], e['loc'][-1])}",
                    f"{e['msg']}: {e.get('input')!r}",
                    "run `ironserve lock --all --site FILE` again",
                )
                for e in exc.errors()
            ]
        ) from None


# --------------------------------------------------------------------------- resolving (ironserve lock)


def split_reference(image: str) -> tuple[str, str, str]:
    """'[registry/]repo:tag' -> (registry, API repository path, tag); Docker Hub names (docker.io/ written or not)
    get library/ as docker does."""
    name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    first, _, rest = name.partition("/")
    if rest and first in ("docker.io", "index.docker.io"):
        return DOCKER_HUB, repository_path(rest), tag
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return DOCKER_HUB, repository_path(name), tag


def _tag_digest(
    recipe: Recipe, registry: str, path: str, tag: str, ca_file: str | None, missing: str, push: str
) -> str:
    """The manifest digest ``registry`` gives path:tag; a SpecError naming the recipe's image when it has none."""
    digest = Registry(registry, ca_file).digest(path, tag)
    if not digest:
        problem = f"{recipe.runtime.image}: the registry {registry} {missing}"
        raise SpecError.one(recipe.id, "runtime.image", problem, f"{push}, or fix the tag")
    return digest


def resolve_docker(recipe: Recipe, mirror: str | None, ca_file: str | None) -> dict:
    runtime = recipe.runtime
    assert isinstance(runtime, DockerRuntime)
    registry, repo, tag = split_reference(runtime.image)
    if registry == DOCKER_HUB and mirror:
        registry = mirror
    digest = _tag_digest(recipe, registry, repo, tag, ca_file, f"has no tag {tag}", "push the image there")
    return {"image": runtime.image, "digest": digest, "registry": registry}


def resolve_site(recipe: Recipe, mirror: str | None, ca_file: str | None) -> dict:
    """A site lock's entry for the recipe's image: its digest in the site's registry ``mirror`` (Docker Hub names
    through it as their mirror, other registries' images under their path there, named as the repository)."""
    runtime = recipe.runtime
    assert isinstance(runtime, DockerRuntime)
    registry, path, tag = split_reference(runtime.image)
    where = mirror or registry
    digest = _tag_digest(recipe, where, path, tag, ca_file, f"has no {path}:{tag}", "push the site's image there")
    repository = f"{mirror}/{path}" if mirror and registry != DOCKER_HUB else None
    return site_entry(digest, runtime.digest, repository)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)(\[[A-Za-z0-9_.,\- ]*\])?==([A-Za-z0-9_.+!\-]+)")


def parse_hashed_requirements(text: str) -> dict[str, list[str]]:
    """`uv pip compile --generate-hashes --no-annotate` output -> {"name==version": ["sha256:...", ...]}."""
    out: dict[str, list[str]] = {}
    for entry in re.sub(r"\\\n", " ", text).splitlines():
        tokens = entry.split("#", 1)[0].split() if not entry.lstrip().startswith("#") else []
        if not tokens:
            continue
        match = _PIN.fullmatch(tokens[0])
        hashes = sorted(t.split("=", 1)[1] for t in tokens[1:] if t.startswith("--hash=sha256:"))
        if not match or not hashes:
            raise ValueError(f"not a hashed pin: {entry.strip()[:200]}")
        out[f"{_norm(match.group(1))}=={match.group(3)}"] = hashes
    return out


def hashed_requirements_text(locked: dict[str, list[str]]) -> str:
    """The lock's distributions as a requirements file for `uv pip install --require-hashes`."""
    return "".join(f"{req} {' '.join('--hash=' + h for h in hashes)}\n" for req, hashes in sorted(locked.items()))


def _compile_hashed(
    uv: str, runtime: UvRuntime, platform: str, idx: list[str], recipe_id: str, runner, field: str = "runtime.packages"
) -> dict:
    with tempfile.TemporaryDirectory(prefix="ironserve-lock-") as tmp:
        cmd = pins.compile_command(uv, runtime, platform, idx, Path(tmp))
        cmd += ["--generate-hashes", "--no-annotate"]
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
        proc = runner(cmd, capture_output=True, text=True, timeout=pins.TIMEOUT_S, env=env)
    if proc.returncode != 0:
        raise SpecError(
            [
                Problem(
                    recipe_id,
                    field,
                    f"uv pip compile for {platform} (Python {runtime.python}) failed: "
                    f"{' '.join(proc.stderr.split())[:600]}",
                    "make the pins resolve against the index (ironserve lint says why)",
                )
            ]
        )
    try:
        return parse_hashed_requirements(proc.stdout)
    except ValueError as exc:  # a direct URL or a file without a sha256 in the index: nothing to check it by
        raise SpecError(
            [
                Problem(
                    recipe_id,
                    field,
                    f"{exc} (resolved for {platform})",
                    "serve every distribution from a PEP 503 index that publishes sha256 hashes",
                )
            ]
        ) from None


def resolve_uv(recipe: Recipe, index: str, arches: list[str], runner=subprocess.run) -> dict:
    """The full resolution of a uv runtime with the sha256 of every distribution's files in the PEP 503 index
    ``index``, for each machine of ``arches`` (x86_64, aarch64)."""
    runtime = recipe.runtime
    assert isinstance(runtime, UvRuntime)
    problems = [
        Problem(recipe.id, f"runtime.packages[{i}]", f"{requirement!r} is not pinned", "write name==version")
        for i, requirement in enumerate(runtime.packages)
        if not _PIN.fullmatch(requirement.strip())
    ]
    if problems:
        raise SpecError(problems)
    uv = _uv(recipe.id)
    idx = ["--index-url", index, *(["--prerelease", "allow"] if runtime.prerelease else [])]  # as the role installs
    platforms = {arch: _compile_hashed(uv, runtime, pins.PLATFORMS[arch], idx, recipe.id, runner) for arch in arches}
    return {"index": public_url(index), "runtime": runtime_digest(runtime), "platforms": platforms}


def public_url(url: str) -> str:
    """``url`` without the credentials an index URL may carry (https://user:token@mirror/...): what a lock file,
    committed beside its recipe, and the lock's output may name."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    return urlunsplit(parts._replace(netloc=netloc + (f":{parts.port}" if parts.port else "")))


def _uv(recipe_id: str) -> str:
    uv = pins.uv_binary()
    if not uv:
        raise SpecError.one(
            recipe_id, "runtime", "no uv on this machine to resolve the pins", "install uv (scripts/env.sh does)"
        )
    return uv


# The Python minors a docker recipe's router venv is locked for by default: the OS python3 of Ubuntu 22.04, Debian 12
# and Ubuntu 24.04 (the router venv beside a docker runtime runs on the host's python3)
ROUTER_PYTHONS = ("3.10", "3.11", "3.12")


def resolve_router(
    recipe: Recipe, index: str, arches: list[str], pythons: list[str], runner=subprocess.run, required: bool = True
) -> dict:
    """The router venv's resolution (sglang-router==engine.router and its dependencies) with the sha256 of every
    distribution's files in ``index``, for each machine of ``arches`` and each Python minor of ``pythons``: the
    router beside a docker runtime runs on the host's python3, whose minor the controller cannot know. Not
    ``required`` (the default minors): a minor the index cannot resolve is left out and named under "skipped"; a
    machine none resolves for is an error either way."""
    pin = f"{ROUTER_DIST}=={recipe.engine.router}"
    uv, idx = _uv(recipe.id), ["--index-url", index]
    platforms: dict[str, dict] = {}
    skipped: list[str] = []
    for arch in arches:
        failed = None
        for python in pythons:
            runtime = UvRuntime(kind="uv", python=python, packages=[pin])
            try:
                resolved = _compile_hashed(uv, runtime, pins.PLATFORMS[arch], idx, recipe.id, runner, "engine.router")
            except SpecError as exc:
                if required:
                    raise
                failed = exc
                skipped.append(f"{arch} Python {python}")
                continue
            platforms.setdefault(arch, {})[python] = resolved
        if arch not in platforms and failed:
            raise failed
    return {"index": public_url(index), "version": recipe.engine.router, "platforms": platforms, "skipped": skipped}


def uv_lock(recipe: Recipe, recipe_file: Path) -> tuple[dict | None, str]:
    """(the lock's {arch: {"name==version": hashes}} for the recipe's uv runtime, "") or (None, why there is none);
    (None, "") for a runtime that is not uv."""
    if not isinstance(recipe.runtime, UvRuntime):
        return None, ""
    path = lock_file(recipe_file)
    entry = (read(path) or {}).get("uv")
    if not isinstance(entry, dict):
        return None, f"no lock file with hashes ({path.name})"
    if entry.get("runtime") != runtime_digest(recipe.runtime):
        return None, f"the lock file {path.name} is stale (made for other pins)"
    platforms = entry.get("platforms")
    if not isinstance(platforms, dict) or not platforms:
        return None, f"the lock file {path.name} records no resolution"
    for arch, locked in platforms.items():
        _check_resolution(path, f"uv.platforms.{arch}", locked)
    return platforms, ""


def _check_resolution(path: Path, field: str, locked) -> None:
    """A lock's resolution is {"name==version": ["sha256:...", ...]}, else a SpecError naming its field."""
    if not isinstance(locked, dict) or not all(
        _PIN.fullmatch(req)
        and isinstance(hashes, list)
        and hashes
        and all(isinstance(h, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes)
        for req, hashes in locked.items()
    ):
        raise SpecError.one(
            str(path), field, "not a list of name==version with sha256 hashes", "run `ironserve lock` again"
        )


def router_lock(recipe: Recipe, recipe_file: Path) -> tuple[dict | None, str]:
    """(the lock's {arch: {python: {"name==version": hashes}}} for a docker recipe's router venv, "") or (None, why
    there is none); (None, "") for a recipe whose router does not run beside a docker runtime."""
    if not isinstance(recipe.runtime, DockerRuntime) or not router_venv(recipe):
        return None, ""
    path = lock_file(recipe_file)
    entry = (read(path) or {}).get("router")
    if not isinstance(entry, dict):
        return None, f"no lock of its router venv with hashes ({path.name})"
    if entry.get("version") != recipe.engine.router:
        return None, f"the lock file {path.name} is stale (made for sglang-router {entry.get('version')})"
    platforms = entry.get("platforms")
    if not isinstance(platforms, dict) or not platforms:
        return None, f"the lock file {path.name} records no router resolution"
    for arch, by_python in platforms.items():
        if not isinstance(by_python, dict):
            raise SpecError.one(
                str(path), f"router.platforms.{arch}", "not a map of Python minors", "run `ironserve lock` again"
            )
        for python, locked in by_python.items():
            _check_resolution(path, f"router.platforms.{arch}.{python}", locked)
    return platforms, ""
