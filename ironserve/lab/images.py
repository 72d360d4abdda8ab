"""The lab's container images, the SGLang parsers standing in for them, and stand-in model checkpoints.

Lab only. A real Docker engine cannot run in a lab host and there is no registry, so the docker
stand-in (assets/docker.py, package docker-ce-cli) answers from a table written into every host at
/etc/ironlab/docker-registry.json (REGISTRY_IN_HOST):

- the "registry" = the images the catalogue's docker recipes name: each DockerRuntime image at its
  pinned digest, or for a tag-only image at a deterministic lab digest, sha256("lab:" + image), so
  a pull by tag resolves the same on every host and every day; anything else is "manifest unknown";
- each image stands for the PyPI SGLang ``recipe.engine.check_version`` names (see
  ironserve/engine_parser.py); a python3 run in it runs that version's cached CPU parser venv
  (``parsers``: version -> venv path on the lab machine). An image of an engine era (a patched
  nightly, not a PyPI release) also accepts the flags IMAGE_EXTRAS lists for that era, which the
  real image has and no PyPI release ever had (``image_extras``), so the seeds' commands parse as
  they do in the real image; everything else is the PyPI release's own parser and messages.

The parser venvs (~/.cache/ironserve/sglang-parsers/<version>, built by engine_parser.parser_env) reach
the hosts read-only at the same absolute paths: `up` bind-mounts the whole parser cache directory
(venvs built later appear in running hosts) plus the base interpreter prefix the venvs point to
(pyvenv.cfg ``home``); a distribution Python under /usr is not mounted: the hosts' own python3.11
serves. For GPU profiles `up` builds the versions the images of the profile's recipes need
(first time: a minute or two each, from PyPI).

Stand-in checkpoints: for each docker recipe's model, <lab dir>/models/<name> (name = last part of
model.path, else of model.hub_id: what ironserve.render.model_path_on derives from ``model_root``)
holds config.json, model.safetensors.index.json naming two small shard files, the shards (valid
safetensors, a few bytes of zeros: no real weights) and ironserve-manifest.sha256 (sha256sum format).
The directory is mounted read-only on every host at MODEL_ROOT (/srv/models), like shared storage.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import time
from pathlib import Path

from .system import say

REGISTRY_IN_HOST = "/etc/ironlab/docker-registry.json"
MODEL_ROOT = "/srv/models"
MANIFEST = "ironserve-manifest.sha256"
INDEX = "model.safetensors.index.json"
MODELS_VERSION = "1"  # bump when the checkpoint layout below changes
MTIME = 1760000000  # fixed: files keep their size and mtime across regenerations (the role stamps both)


# What the real images of an engine era accept that the PyPI release whose parser stands for them never had
# (docs/engine-flags.md: seed 000's patched nightly image). A lab image of that era registers exactly these in
# its real PyPI parser (assets/image_extras.py, in the stand-in image: gpu_images.py); images of PyPI engines get nothing added.
IMAGE_EXTRAS = {
    "dev-cu13-2026-03": {
        "flags": {"--enable-pcie-oneshot-allreduce": "store_true"},
        "choices": {"--tool-call-parser": ["qwen3"]},
        "evidence": "docs/engine-flags.md: no PyPI release ever had either (patched nightly image of seed 000)",
    },
}


def docker_recipes() -> list:
    """The docker recipes the stand-in answers for: those of the accelerator profiles (a cpu-lab recipe such as
    tiny-cpu-docker runs on the real engine from the lab registry, with the real generated model)."""
    from ironserve import catalogue
    from ironserve.spec import DockerRuntime

    from .profiles import PROFILES

    return [r for _, r in sorted(catalogue.catalogue().items()) if isinstance(r.runtime, DockerRuntime)
            and any(PROFILES.get(hw, {}).get("kind") not in (None, "none") for hw in r.hardware)]


def _seed_recipes() -> list:
    """The catalogue's recipes for real hardware (the cpu-lab ones serve the lab's generated tiny model)."""
    from ironserve import catalogue

    return [r for _, r in sorted(catalogue.catalogue().items()) if "cpu-lab" not in r.hardware]


def split_image(image: str) -> tuple[str, str]:
    repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    return repo, tag


def lab_digest(image: str) -> str:
    """The digest a tag-only image has in the lab registry: stable for a given image reference."""
    return "sha256:" + hashlib.sha256(f"lab:{image}".encode()).hexdigest()


def _parser_dir(version: str) -> str | None:
    from ironserve import engine_parser

    try:
        return str(engine_parser.env_dir(version))
    except engine_parser.EngineNotAvailable:
        return None


def registry_table(recipes: list | None = None) -> dict:
    """{"images": [{repo, digest, digest_source, tags, sglang, parser_version, recipes, hardware}],
    "parsers": {version: venv path}} for the docker recipes of the catalogue."""
    recipes = docker_recipes() if recipes is None else recipes
    images: dict[tuple[str, str], dict] = {}
    tag_owner: dict[str, tuple[str, str]] = {}
    # pinned recipes first: a tag that some recipe pins resolves to that digest for the tag-only ones too
    for recipe in sorted(recipes, key=lambda r: (r.runtime.digest is None, r.id)):
        runtime = recipe.runtime
        repo, tag = split_image(runtime.image)
        ref = f"{repo}:{tag}"
        if runtime.digest:
            digest, source = runtime.digest, "recipe"
        elif ref in tag_owner:
            digest, source = tag_owner[ref][1], images[tag_owner[ref]]["digest_source"]
        else:
            digest, source = lab_digest(runtime.image), f"lab: sha256 of 'lab:{runtime.image}'"
        entry = images.setdefault((repo, digest), {
            "repo": repo, "digest": digest, "digest_source": source, "tags": [], "sglang": recipe.engine.sglang,
            "parser_version": recipe.engine.check_version, "recipes": [], "hardware": [],
            "image_extras": None if recipe.engine.is_pypi else IMAGE_EXTRAS.get(recipe.engine.sglang)})
        tag_owner.setdefault(ref, (repo, digest))
        if tag_owner[ref] == (repo, digest) and tag not in entry["tags"]:
            entry["tags"].append(tag)
        entry["recipes"].append(recipe.id)
        entry["hardware"] = sorted(set(entry["hardware"]) | set(recipe.hardware))
        if entry["parser_version"] != recipe.engine.check_version:
            entry.setdefault("conflicts", []).append(f"{recipe.id}: parser {recipe.engine.check_version}")
    table = sorted(images.values(), key=lambda e: (e["repo"], e["digest"]))
    versions = sorted({e["parser_version"] for e in table if e["parser_version"]})
    return {
        "about": "ironserve lab image registry (lab only): the images the catalogue's docker recipes name; a "
                 "python3 run in an image runs the CPU parser venv of its parser_version (see ironserve/lab/images.py)",
        "images": table,
        "parsers": {v: p for v in versions if (p := _parser_dir(v))},
    }


def versions_for(table: dict, hardware: str) -> list[str]:
    """Parser versions the images of the recipes for this hardware profile stand for."""
    return sorted({e["parser_version"] for e in table["images"] if e["parser_version"] and hardware in e["hardware"]})


def parser_built(path: str | os.PathLike) -> bool:
    return (Path(path) / "ironserve-env.json").is_file()


def ensure_parsers(versions: list[str]) -> dict[str, str]:
    """Build the missing parser venvs (engine_parser.parser_env); {version: problem} for those that failed."""
    from ironserve import engine_parser

    problems = {}
    for version in versions:
        path = _parser_dir(version)
        if path and parser_built(path):
            continue
        say(f"building the SGLang {version} parser venv the lab's docker stand-in runs for its images "
            f"(first time only: a minute or two, from PyPI) -> {path}")
        t0 = time.monotonic()
        try:
            engine_parser.parser_env(version)
        except Exception as exc:  # noqa: BLE001 - the lab stays usable; the stand-in says what is missing
            problems[version] = f"{type(exc).__name__}: {str(exc).strip()[-600:]}"
            say(f"warning: the SGLang {version} parser venv could not be built; `docker run` of its images "
                f"will say so in the hosts:\n{problems[version]}")
            continue
        say(f"SGLang {version} parser venv built in {time.monotonic() - t0:.0f}s")
    return problems


# ---------------------------------------------------------------- read-only mounts for the parser venvs

SYSTEM_PREFIXES = ("/", "/usr")


def _venv_prefix(venv: Path) -> str | None:
    """The base interpreter prefix a venv runs on (pyvenv.cfg home = <prefix>/bin)."""
    try:
        for line in (venv / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                home = Path(value.strip())
                return str(home.parent if home.name == "bin" else home)
    except OSError:
        return None
    return None


def interpreter_binds(prefix: str) -> list[str]:
    """Host paths to mount read-only so that a venv on the interpreter at `prefix` runs in a lab host."""
    prefix = os.path.normpath(prefix)
    if prefix in SYSTEM_PREFIXES or not os.path.isdir(prefix):
        return []  # a distribution Python: the hosts' own python3 of the same version serves
    if prefix == "/usr/local" or prefix.startswith(("/usr/", "/bin", "/lib", "/etc", "/var", "/srv")):
        # never cover a host system tree: mount the interpreter's own files only
        base = Path(prefix)
        picks = list((base / "bin").glob("python3*")) + list((base / "lib").glob("python3.*"))
        picks += list((base / "lib").glob("libpython3*"))
        return sorted(str(p) for p in picks if p.exists())
    return [prefix]


def parser_binds() -> list[str]:
    """Paths (same inside hosts) for the parser cache directory and the interpreters of its venvs."""
    from ironserve import engine_parser

    root = engine_parser.parsers_dir()
    root.mkdir(parents=True, exist_ok=True)
    prefixes = {p for cfg in root.glob("*/pyvenv.cfg") if (p := _venv_prefix(cfg.parent))}
    if sys.version_info[:2] == (3, 11):
        prefixes.add(sys.base_prefix)  # what engine_parser builds later venvs on (uv venv --python sys.executable)
    binds = [str(root)]
    for prefix in sorted(prefixes):
        binds += [b for b in interpreter_binds(prefix) if b not in binds]
    return binds


# ---------------------------------------------------------------- stand-in checkpoints

def model_name(recipe) -> str | None:
    source = recipe.model.path or recipe.model.hub_id or ""
    return source.rstrip("/").rsplit("/", 1)[-1] or None


def _safetensors(name: str, shape: tuple[int, ...]) -> bytes:
    count = 1
    for n in shape:
        count *= n
    data = b"\0" * (2 * count)  # bf16 zeros
    header = json.dumps({"__metadata__": {"format": "pt", "ironserve_lab": "stand-in shard, no real weights"},
                         name: {"dtype": "BF16", "shape": list(shape), "data_offsets": [0, len(data)]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def checkpoint_files(name: str, recipe_ids: list[str], hub_id: str | None) -> dict[str, bytes]:
    """The files of a stand-in checkpoint (manifest included), by path relative to the model directory."""
    shards = {"model-00001-of-00002.safetensors": ("model.embed_tokens.weight", (16, 8)),
              "model-00002-of-00002.safetensors": ("lm_head.weight", (16, 8))}
    blobs = {f: _safetensors(t, s) for f, (t, s) in shards.items()}
    files = {
        "config.json": json.dumps({
            "architectures": ["IronLabStandInForCausalLM"], "model_type": "ironlab-stand-in",
            "hidden_size": 8, "num_hidden_layers": 0, "vocab_size": 16, "torch_dtype": "bfloat16",
            "_name_or_path": hub_id or name,
            "ironserve_lab": f"stand-in checkpoint for {', '.join(recipe_ids)}: no real weights, cannot be served",
        }, indent=2).encode() + b"\n",
        INDEX: json.dumps({
            "metadata": {"total_size": sum(len(b) for b in blobs.values())},
            "weight_map": {t: f for f, (t, _) in shards.items()},
        }, indent=2).encode() + b"\n",
        **blobs,
    }
    manifest = "".join(f"{hashlib.sha256(data).hexdigest()}  {path}\n" for path, data in sorted(files.items()))
    files[MANIFEST] = manifest.encode()
    return files


def models_dir(root: Path) -> Path:
    return root / "models"


def publish_models(root: Path, recipes: list | None = None) -> dict[str, dict]:
    """Write the stand-in checkpoints under <root>/models (in place: hosts see it through a bind mount).

    Returns {name: {"path": path in hosts, "recipes": [...]}}.
    """
    # every seed recipe's model, whatever its runtime: a uv runtime's deploy verifies its weights the same way
    recipes = _seed_recipes() if recipes is None else recipes
    wanted: dict[str, dict] = {}
    for recipe in recipes:
        name = model_name(recipe)
        if name:
            entry = wanted.setdefault(name, {"recipes": [], "hub_id": recipe.model.hub_id})
            entry["recipes"].append(recipe.id)
    out_dir = models_dir(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_dir.chmod(0o755)
    result = {}
    for name, entry in sorted(wanted.items()):
        target = out_dir / name
        target.mkdir(exist_ok=True)
        target.chmod(0o755)
        files = checkpoint_files(name, entry["recipes"], entry["hub_id"])
        for rel, data in files.items():
            path = target / rel
            if not path.exists() or path.read_bytes() != data:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_bytes(data)
                tmp.chmod(0o644)
                os.replace(tmp, path)
            os.utime(path, (MTIME, MTIME))
        for stale in target.iterdir():
            if stale.name not in files:
                stale.unlink()
        result[name] = {"path": f"{MODEL_ROOT}/{name}", "recipes": entry["recipes"]}
    readme = ("ironserve lab stand-in checkpoints (no real weights): one directory per model of the catalogue's seed\n"
              "recipes, named as ironserve.render.model_path_on derives it from model_root. Verify with\n"
              f"  cd {MODEL_ROOT}/<name> && sha256sum -c {MANIFEST}\n")
    if not (out_dir / "README").exists() or (out_dir / "README").read_text() != readme:
        (out_dir / "README").write_text(readme)
    return result


def write_registry(root: Path, table: dict) -> Path:
    path = root / "images" / "docker-registry.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def registry_file(root: Path) -> Path:
    return root / "images" / "docker-registry.json"

