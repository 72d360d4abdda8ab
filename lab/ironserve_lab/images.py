"""The lab's engine eras, the catalogue's docker recipes, and stand-in model checkpoints.

Lab only. The stand-in GPU images themselves are gpu_images.py (real images for the real Docker engine of the lab
hosts); IMAGE_EXTRAS below says what the real images of an engine era accept beyond their PyPI parser.

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
from pathlib import Path

MODEL_ROOT = "/srv/models"
MANIFEST = "ironserve-manifest.sha256"
INDEX = "model.safetensors.index.json"
MODELS_VERSION = "1"  # bump when the checkpoint layout below changes
MTIME = 1760000000  # fixed: files keep their size and mtime across regenerations (the role stamps both)


# What the real images of an engine era accept that the PyPI release whose parser stands for them never had
# (docs/engine-flags.md: seed 000's patched nightly image). A stand-in image of that era (gpu_images.py) registers
# exactly these in its real PyPI parser (assets/image_extras.py); images of PyPI engines get nothing added.
IMAGE_EXTRAS = {
    "dev-cu13-2026-03": {
        "flags": {"--enable-pcie-oneshot-allreduce": "store_true"},
        "choices": {"--tool-call-parser": ["qwen3"]},
        "evidence": "docs/engine-flags.md: no PyPI release ever had either (patched nightly image of seed 000)",
    },
}


def docker_recipes() -> list:
    """The docker recipes of the accelerator profiles, whose images the lab stands in for (gpu_images.py; a cpu-lab
    recipe such as tiny-cpu-docker runs the CPU runtime image itself, with the real generated model)."""
    from ironserve import catalogue
    from ironserve.spec import DockerRuntime

    from .profiles import PROFILES

    return [
        r
        for _, r in sorted(catalogue.catalogue().items())
        if isinstance(r.runtime, DockerRuntime)
        and any(PROFILES.get(hw, {}).get("kind") not in (None, "none") for hw in r.hardware)
    ]


def _seed_recipes() -> list:
    """The catalogue's recipes for real hardware (the cpu-lab ones serve the lab's generated tiny model)."""
    from ironserve import catalogue

    return [r for _, r in sorted(catalogue.catalogue().items()) if "cpu-lab" not in r.hardware]


# ---------------------------------------------------------------- stand-in checkpoints


def model_name(recipe) -> str | None:
    source = recipe.model.path or recipe.model.hub_id or ""
    return source.rstrip("/").rsplit("/", 1)[-1] or None


def _safetensors(name: str, shape: tuple[int, ...]) -> bytes:
    count = 1
    for n in shape:
        count *= n
    data = b"\0" * (2 * count)  # bf16 zeros
    header = json.dumps(
        {
            "__metadata__": {"format": "pt", "ironserve_lab": "stand-in shard, no real weights"},
            name: {"dtype": "BF16", "shape": list(shape), "data_offsets": [0, len(data)]},
        },
        separators=(",", ":"),
    ).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def checkpoint_files(name: str, recipe_ids: list[str], hub_id: str | None) -> dict[str, bytes]:
    """The files of a stand-in checkpoint (manifest included), by path relative to the model directory."""
    shards = {
        "model-00001-of-00002.safetensors": ("model.embed_tokens.weight", (16, 8)),
        "model-00002-of-00002.safetensors": ("lm_head.weight", (16, 8)),
    }
    blobs = {f: _safetensors(t, s) for f, (t, s) in shards.items()}
    files = {
        "config.json": json.dumps(
            {
                "architectures": ["IronLabStandInForCausalLM"],
                "model_type": "ironlab-stand-in",
                "hidden_size": 8,
                "num_hidden_layers": 0,
                "vocab_size": 16,
                "torch_dtype": "bfloat16",
                "_name_or_path": hub_id or name,
                "ironserve_lab": f"stand-in checkpoint for {', '.join(recipe_ids)}: no real weights, cannot be served",
            },
            indent=2,
        ).encode()
        + b"\n",
        INDEX: json.dumps(
            {
                "metadata": {"total_size": sum(len(b) for b in blobs.values())},
                "weight_map": {t: f for f, (t, _) in shards.items()},
            },
            indent=2,
        ).encode()
        + b"\n",
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
    readme = (
        "ironserve lab stand-in checkpoints (no real weights): one directory per model of the catalogue's seed\n"
        "recipes, named as ironserve.render.model_path_on derives it from model_root. Verify with\n"
        f"  cd {MODEL_ROOT}/<name> && sha256sum -c {MANIFEST}\n"
    )
    if not (out_dir / "README").exists() or (out_dir / "README").read_text() != readme:
        (out_dir / "README").write_text(readme)
    return result
