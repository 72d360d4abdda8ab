"""Stand-in GPU images: one per image reference the GPU-profile docker recipes name, in the lab registry.

Lab only. The real images (CUDA builds of SGLang, tens of GB) cannot run here and cannot be pulled into an
air-gapped lab; the stand-ins are real images for the real Docker engine in the lab hosts, built once per machine
without a Docker engine (oci.py) and cached beside the CPU runtime image (runtime_image.py):

- FROM the parser image (runtime_image.PARSER): the CPU runtime image's Debian base layer, and a venv of only
  what SGLang's parser imports, on the CPU runtime's pins (1.1 GB, not the runtime's 2.5; every host pulls it once
  and shares it across the stand-in tags);
- one layer of the recipe's SGLang (``engine.check_version``) installed ``--no-deps`` the way the lint parser
  venvs install it (ironserve/engine_parser.release_only: the release alone, no venv), at the place the real
  images keep their editable SGLang checkout, /sgl-workspace/sglang/python (``PYTHONPATH``): the recipes'
  derived-image patches that edit files there (``RUN sed -i ... /sgl-workspace/sglang/python/sglang/...``) really edit them;
- pip in the image's venv (the wheel Debian ships in the lab rootfs), because the recipes' patches run
  ``RUN pip install ...`` (from the lab index, which the derived build reaches as a production build reaches
  its mirror: roles/container_runtime.py passes PIP_INDEX_URL);
- for an engine era whose real images accept flags no PyPI release has (images.IMAGE_EXTRAS), a
  sitecustomize.py on the same path that registers exactly those (assets/image_extras.py).

So the deploy's parse check (``docker run --rm IMAGE python3 ...``) runs the image's own SGLang parser in the real
engine. Nothing in an image can drive a GPU: the lab prepares and validates GPU recipes, it serves none.

Their digests cannot be the recipes' upstream ones: ``lab up`` writes a site lock (ironserve/imagelock.py) naming
the lab registry's digest for each image, which the lab inventory passes as ``docker_image_lock``. Images outside
Docker Hub (nvcr.io/...) are pushed under their path in the lab registry, which the site lock names as their
``repository`` (Docker mirrors Docker Hub names only).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from ironserve import engine_parser, imagelock
from ironserve.registry import Registry

from . import oci, runtime_image, wheels
from .system import LabError, run, say

ASSETS = Path(__file__).parent / "assets"
WORKSPACE = "/sgl-workspace/sglang/python"
BUILD_VERSION = "4"  # bump when the layer below changes: the cached images are rebuilt
SITE_LOCK = "site-lock.json"


# CUDA builds the recipes' patches pip-install (`RUN pip install nvidia-cudnn-cu13==...`): stand-in wheels with
# their published metadata (name, version, Requires-Dist, Requires-Python; the dependencies' latest releases) in
# the lab index, so the derived build's pip resolves and installs what it would from PyPI, without the GBs of
# CUDA libraries no machine here can use (wheels.py).
CUDA_STANDINS = {
    "nvidia-cudnn-cu13": ("9.19.1.2", ">=3", ["nvidia-cublas"]),
    "nvidia-cublas": ("13.10.0.20", ">=3", ["nvidia-cuda-nvrtc"]),
    "nvidia-cuda-nvrtc": ("13.5.37", ">=3", []),
}


def patch_wheels(requirements: list[str], dest: Path) -> tuple[list[Path], list[str]]:
    """(stand-in wheels built into ``dest``, the requirements to download for real) for the patches' pins."""
    standins, real = [], []
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        if name not in CUDA_STANDINS or CUDA_STANDINS[name][0] != version:
            real.append(requirement)
            continue
        todo = [name]
        while todo:
            dist = todo.pop()
            version, requires_python, requires = CUDA_STANDINS[dist]
            standins.append(wheels.build_wheel(dest, dist, version, requires, requires_python))
            todo += [r for r in requires if r in CUDA_STANDINS]
    return standins, real


def wanted(recipes: list) -> dict[str, dict]:
    """{image: {version, extras, replaces, recipes}} for the docker recipes given (GPU profiles)."""
    from .images import IMAGE_EXTRAS

    out: dict[str, dict] = {}
    for recipe in recipes:
        runtime = recipe.runtime
        entry = out.setdefault(
            runtime.image,
            {
                "version": recipe.engine.check_version,
                "replaces": runtime.digest,
                "recipes": [],
                "extras": None if recipe.engine.is_pypi else IMAGE_EXTRAS.get(recipe.engine.sglang),
            },
        )
        if (entry["version"], entry["replaces"]) != (recipe.engine.check_version, runtime.digest):
            raise LabError(
                f"recipes {entry['recipes'][0]} and {recipe.id} name the image {runtime.image} with "
                f"different engines or digests: the lab registry can hold one image per tag"
            )
        entry["recipes"].append(recipe.id)
    return out


def _stage(stage: Path, base_rootfs: Path, version: str, extras: dict | None) -> None:
    """The layer's files: SGLang at WORKSPACE, pip in the venv, the era's extras."""
    # the release alone (what the parser venv installs --no-deps), not a whole parser venv: a cold `lab up` for one
    # docker recipe need not build GBs of venv to copy one package
    src = engine_parser.release_only(version, stage.parent / "release")
    dest = stage / WORKSPACE.lstrip("/")
    dest.mkdir(parents=True)
    shutil.copytree(src / "sglang", dest / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    # bytecode for the image's Python 3.11 (this machine's, as the parser venvs'), hash-checked (the layer clamps
    # mtimes to 0; a patch's `sed -i` makes just that module stale): each `docker run` of the image imports SGLang
    # without compiling it first
    run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "--invalidation-mode",
            "checked-hash",
            "-d",
            f"{WORKSPACE}/sglang",
            str(dest / "sglang"),
        ]
    )
    for info in src.glob("sglang-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    if extras:
        baked = json.dumps({"flags": extras.get("flags") or {}, "choices": extras.get("choices") or {}})
        (dest / "sitecustomize.py").write_text(
            (ASSETS / "image_extras.py").read_text().replace("'__EXTRAS__'", repr(baked))
        )
    pip_wheels = sorted((base_rootfs / "usr/share/python-wheels").glob("pip-*.whl"))
    if not pip_wheels:
        raise LabError(
            f"no pip wheel in the lab rootfs ({base_rootfs}/usr/share/python-wheels): the images' "
            "`RUN pip install` patches need pip"
        )
    site = runtime_image.site_packages(stage)
    site.mkdir(parents=True)
    with zipfile.ZipFile(pip_wheels[-1]) as whl:
        whl.extractall(site)
    bindir = stage / runtime_image.VENV.lstrip("/") / "bin"
    bindir.mkdir(parents=True)
    for name in ("pip", "pip3"):
        (bindir / name).write_text(
            f"#!{runtime_image.VENV}/bin/python3\nimport sys\n"
            "from pip._internal.cli.main import main\nsys.exit(main())\n"
        )
        (bindir / name).chmod(0o755)


def _layer_key(spec: dict, base_rootfs: Path) -> str:
    """What a stand-in's own layer is made of: the build, the SGLang release, the era's extras, the rootfs's pip."""
    text = json.dumps(
        {
            "build": BUILD_VERSION,
            "version": spec["version"],
            "extras": spec["extras"],
            "asset": (ASSETS / "image_extras.py").read_text(),
            "pip": [w.name for w in sorted((base_rootfs / "usr/share/python-wheels").glob("pip-*.whl"))],
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def own_layer(spec: dict, base_rootfs: Path) -> dict:
    """The stand-in's layer on the parser image ({digest, size, diff_id}), made first when the cache lacks it. It does
    not depend on the parser image: ``lab up`` makes it while that builds (:func:`prepare_layers`)."""
    store = runtime_image.cache_dir()

    def make() -> dict:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="ironlab-gpu-image-", dir=store) as tmp:
            _stage(Path(tmp) / "layer", base_rootfs, spec["version"], spec["extras"])
            layer = oci.layer_from_dir(store, Path(tmp) / "layer", normalize_mtime=True)
        say(f"stand-in layer: SGLang {spec['version']} at {WORKSPACE}, pip, made in {time.monotonic() - t0:.0f}s")
        return layer

    # made beside the parser image: the record's directory (made first) may be the cache's first
    return oci.cached_layer(store, store / "images" / f"gpu-layer-{_layer_key(spec, base_rootfs)}.json", make)


def prepare_layers(recipes: list, base_rootfs: Path) -> None:
    """Every stand-in's own layer the recipes need, made ahead (beside the parser image's build); one that cannot be
    made is left to :func:`publish`, which says why."""
    for spec in wanted(recipes).values():
        try:
            own_layer(spec, base_rootfs)
        except (engine_parser.EngineNotAvailable, engine_parser.ParserEnvError, LabError):
            continue


def _key(image: str, base_ref: dict, layer: dict) -> str:
    """A stand-in image: its name (labels), the parser image under it, its own layer."""
    text = json.dumps(
        {"build": BUILD_VERSION, "image": image, "base": base_ref["manifest_digest"], "layer": layer["digest"]},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure(image: str, spec: dict, base_rootfs: Path, base_ref_file: Path) -> Path:
    """The cached stand-in image for ``image`` (built first when missing): its ref file."""
    store = runtime_image.cache_dir()
    base_ref = oci.read_image(store, base_ref_file)
    if not base_ref:
        raise LabError(f"the parser image {base_ref_file} is not built")
    own = own_layer(spec, base_rootfs)
    ref = store / "images" / f"gpu-{_key(image, base_ref, own)}.json"
    if oci.read_image(store, ref):
        return ref
    manifest = json.loads(oci.blob_path(store, base_ref["manifest_digest"]).read_bytes())
    config = json.loads(oci.blob_path(store, base_ref["config_digest"]).read_bytes())
    layers = [
        {"digest": item["digest"], "size": item["size"], "diff_id": diff_id}
        for item, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"])
    ]
    layers.append(own)
    env = [e for e in config["config"]["Env"] if not e.startswith("PYTHONPATH=")] + [f"PYTHONPATH={WORKSPACE}"]
    labels = {
        **config["config"].get("Labels", {}),
        "org.opencontainers.image.title": f"ironserve lab stand-in for {image}: SGLang {spec['version']} on the CPU runtime's parser packages, no GPU code",
        "ironserve.lab.standin-for": image,
        "ironserve.lab.sglang": spec["version"],
    }
    history = [h["created_by"] for h in config["history"]] + [
        f"SGLang {spec['version']} --no-deps at {WORKSPACE} (as the lint parser venvs install it), pip"
        + (", the engine era's extra flags" if spec["extras"] else ""),
    ]
    oci.write_image(store, ref, layers, {**config["config"], "Env": env, "Labels": labels}, history)
    say(f"stand-in image for {image}: its layer on the parser image {base_ref['manifest_digest'][:19]}")
    return ref


def publish(
    client: Registry,
    registry: str,
    ca_file: Path,
    recipes: list,
    base_rootfs: Path,
    base_ref_file: Path,
    site_lock: Path,
    seed: Callable[[str, str, Path], bool] | None = None,
) -> dict:
    """Build (once) and push every stand-in image the recipes name, then lock them as a site would
    (`ironserve lock --site`: imagelock.resolve_site against the registry); the site lock's data. ``seed``: as
    oci.push's (blobs put into the registry's storage without an upload)."""
    t0 = time.monotonic()
    store = runtime_image.cache_dir()
    data: dict = {"docker": {}}
    pushed: list[str] = []
    for image, spec in sorted(wanted(recipes).items()):
        try:
            ref = ensure(image, spec, base_rootfs, base_ref_file)
        except (engine_parser.EngineNotAvailable, engine_parser.ParserEnvError) as exc:
            # the lab stays usable for the other recipes; this one's pull will fail at its deploy, naming the image
            say(
                f"warning: no stand-in image for {image} (recipes {', '.join(spec['recipes'])}): the SGLang "
                f"{spec['version']} release could not be installed: {str(exc).strip()[-600:]}"
            )
            continue
        _, path, tag = imagelock.split_reference(image)
        # the layers the stand-ins share: uploaded with the first, mounted into the others' repositories
        digest = oci.push(client, store, ref, path, [tag], say=say, mount_from=pushed[-1:], seed=seed)
        pushed.append(path)
        recipe = next(r for r in recipes if r.id == spec["recipes"][0])
        data["docker"][image] = imagelock.resolve_site(recipe, registry, str(ca_file))
        if data["docker"][image]["digest"] != digest:
            raise LabError(f"the lab registry answers {data['docker'][image]['digest']} for {image}, pushed {digest}")
    if imagelock.read(site_lock) != data:
        site_lock.parent.mkdir(parents=True, exist_ok=True)
        imagelock.write(site_lock, data)
    say(f"registry: {len(data['docker'])} stand-in GPU image(s), site lock {site_lock} ({time.monotonic() - t0:.1f}s)")
    return data
