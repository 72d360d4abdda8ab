"""Lock files: what a recipe's runtime resolves to, written once (``ironserve lock``) and read by every deploy.

``<recipe>.lock.json`` beside the recipe's YAML file (recipes/<id>.lock.json for the catalogue):

- docker recipes: ``{"docker": {"image": REPO:TAG, "digest": "sha256:...", "registry": HOST}}``: the manifest
  digest the tag had in the registry the inventory names (``docker_registry_mirror``, else the image's own
  registry). Loading a recipe without ``runtime.digest`` applies it (catalogue.load_recipe_file), so every host
  pulls REPO@DIGEST, the units run it, and the audit checks that digest: all ranks of a group run one image;
- uv recipes: ``{"uv": {"index": URL, "packages": {"name==version": ["sha256:...", ...]}}}``: every pin with
  the hashes of its files in the index the inventory names (a pin that is not ``name==version`` is refused).

A lock whose image differs from the recipe's (the tag was edited) is stale: it is ignored and the deploy says so.
"""

from __future__ import annotations

import html.parser
import json
import re
import urllib.parse
import urllib.request
from pathlib import Path

from .problems import Problem, SpecError
from .registry import DOCKER_HUB, Registry, repository_path
from .spec import DockerRuntime, Recipe, UvRuntime

SUFFIX = ".lock.json"


def lock_file(recipe_file: Path) -> Path:
    return recipe_file.with_name(recipe_file.stem + SUFFIX)


def read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpecError([Problem(str(path), "", f"unreadable lock file: {exc}", "run `ironserve lock` again")])
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


# --------------------------------------------------------------------------- resolving (ironserve lock)


def split_reference(image: str) -> tuple[str, str, str]:
    """'[registry/]repo:tag' -> (registry, API repository path, tag); Docker Hub names get library/ as docker does."""
    name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return DOCKER_HUB, repository_path(name), tag


def resolve_docker(recipe: Recipe, mirror: str | None, ca_file: str | None) -> dict:
    runtime = recipe.runtime
    assert isinstance(runtime, DockerRuntime)
    registry, repo, tag = split_reference(runtime.image)
    if registry == DOCKER_HUB and mirror:
        registry = mirror
    digest = Registry(registry, ca_file).digest(repo, tag)
    if not digest:
        raise SpecError([Problem(recipe.id, "runtime.image", f"{runtime.image}: the registry {registry} has no "
                                 f"tag {tag}", "push the image there, or fix the tag")])
    return {"image": runtime.image, "digest": digest, "registry": registry}


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links += [v for k, v in attrs if k == "href" and v]


def _file_version(filename: str) -> str | None:
    if filename.endswith(".whl"):
        parts = filename.split("-")
        return parts[1] if len(parts) >= 5 else None
    match = re.match(r"^(.+)-([^-]+)\.(tar\.gz|zip)$", filename)
    return match.group(2) if match else None


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve_uv(recipe: Recipe, index: str, opener=urllib.request.urlopen) -> dict:
    """Every pin of a uv runtime with the sha256 of each of its files in the PEP 503 index ``index``."""
    runtime = recipe.runtime
    assert isinstance(runtime, UvRuntime)
    packages: dict[str, list[str]] = {}
    problems = []
    for i, requirement in enumerate(runtime.packages):
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)==([A-Za-z0-9_.+!\-]+)", requirement.strip())
        if not match:
            problems.append(Problem(recipe.id, f"runtime.packages[{i}]", f"{requirement!r} is not pinned",
                                    "write name==version"))
            continue
        name, version = match.groups()
        page_url = urllib.parse.urljoin(index.rstrip("/") + "/", _norm(name) + "/")
        with opener(page_url, timeout=60) as resp:
            parser = _Links()
            parser.feed(resp.read().decode("utf-8", "replace"))
        hashes = sorted({f"sha256:{frag.split('=', 1)[1]}" for href in parser.links
                         for path, _, frag in [href.partition("#")]
                         if frag.startswith("sha256=")
                         and _file_version(urllib.parse.unquote(path.rsplit("/", 1)[-1])) == version})
        if not hashes:
            problems.append(Problem(recipe.id, f"runtime.packages[{i}]", f"{requirement}: no file of that version "
                                    f"in {index}", "publish it to the index, or fix the pin"))
            continue
        packages[f"{_norm(name)}=={version}"] = hashes
    if problems:
        raise SpecError(problems)
    return {"index": index, "packages": packages}
