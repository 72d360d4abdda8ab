"""The lab's stand-in GPU images and stand-in checkpoints, offline (no root, no lab).

The images themselves run in the real Docker engine of the lab hosts (tests/e2e/test_deploy_glm5_lab.py: pulled
by the site lock's digest, derived builds, the parse check in the image); here: which images the lab builds and
locks, the era's extra flags as the image's sitecustomize registers them in a real argparse parser, the wheels the
patches install, and the checkpoints as the role verifies them.
"""

from __future__ import annotations

import argparse
import json
import py_compile
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ironserve_lab import cluster, gpu_images, images, runtime_image
from ironserve_lab.system import LabError

from ironserve import catalogue, engine_parser
from ironserve.hostdata import DEFAULTS
from ironserve.inventory import InventoryHost
from ironserve.render import model_path_on
from ironserve.spec import DockerRuntime
from roles import model_weights as mw

GLM_DIGEST = "sha256:426d1fa4b10722688678b99d817c2caa92a89eed4a8ee2927ab44a848bbe77df"


def _gpu_docker_recipes():
    return [
        r for r in catalogue.catalogue().values() if isinstance(r.runtime, DockerRuntime) and r.hardware != ["cpu-lab"]
    ]


def test_one_stand_in_image_per_image_the_gpu_recipes_name():
    wanted = gpu_images.wanted(images.docker_recipes())
    assert set(wanted) == {r.runtime.image for r in _gpu_docker_recipes()}
    assert "ironserve-lab/sglang-cpu:0.5.23" not in wanted  # cpu-lab's image is the CPU runtime image itself
    glm = wanted["lmsysorg/sglang:glm5-blackwell"]
    # the site lock replaces the recipes' upstream pin; tag-only images replace the bare tag
    assert glm["replaces"] == GLM_DIGEST and wanted["lmsysorg/sglang:dev-cu13"]["replaces"] is None
    assert glm["version"] == "0.5.9" and "--enable-pcie-oneshot-allreduce" in glm["extras"]["flags"]
    gb200 = wanted["nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.1.1-cuda13"]
    assert gb200["version"] == "0.5.10.post1" and gb200["extras"] is None
    assert all(r.id in wanted[r.runtime.image]["recipes"] for r in _gpu_docker_recipes())


def test_the_images_sitecustomize_adds_exactly_the_eras_flags(tmp_path):
    """What a patched nightly image accepts and its PyPI release lacks, registered in the release's own parser."""
    extras = images.IMAGE_EXTRAS["dev-cu13-2026-03"]
    baked = json.dumps({"flags": extras["flags"], "choices": extras["choices"]})
    site = tmp_path / "sitecustomize.py"
    site.write_text((gpu_images.ASSETS / "image_extras.py").read_text().replace("'__EXTRAS__'", repr(baked)))
    original = argparse.ArgumentParser.parse_known_args
    try:
        runpy.run_path(str(site))
        parser = argparse.ArgumentParser(prog="sglang.launch_server")
        parser.add_argument("--model-path", required=True)
        parser.add_argument("--tool-call-parser", choices=["glm47"])
        args = parser.parse_args(
            ["--model-path", "/m", "--enable-pcie-oneshot-allreduce", "--tool-call-parser", "qwen3"]
        )
        assert args.enable_pcie_oneshot_allreduce and args.tool_call_parser == "qwen3"
        other = argparse.ArgumentParser()  # not a server parser: untouched
        other.add_argument("--x")
        assert other.parse_known_args(["--enable-pcie-oneshot-allreduce"])[1] == ["--enable-pcie-oneshot-allreduce"]
    finally:
        argparse.ArgumentParser.parse_known_args = original


def test_the_lab_index_carries_what_the_patches_pip_install():
    assert cluster.patch_requirements(
        ["RUN pip install --no-cache-dir transformers==5.2.0", "RUN sed -i s/a/b/ /x.py", "RUN pip install foo"]
    ) == ["transformers==5.2.0"]
    glm = catalogue.get_recipe("glm5-nvfp4-mtp-rtx6000-tp8")
    assert cluster.patch_requirements(glm.runtime.patches) == ["transformers==5.2.0"]


def test_wheelhouse_and_repo_carry_what_the_roles_install():
    assert cluster.UV_VERSION == DEFAULTS.uv_version
    assert f"nvidia-ml-py=={DEFAULTS.nvidia_ml_py_version}" in cluster.DEFAULT_WHEELS
    assert {"python3-venv", "curl", "gpg", "ca-certificates", "python3-pip", "docker.io"} <= set(cluster.DEFAULT_DEBS)


def test_stand_in_checkpoints_verify_like_the_role_checks_them(tmp_path):
    models = images.publish_models(tmp_path)
    host = InventoryHost("lab1", {"model_root": images.MODEL_ROOT})
    for recipe in _gpu_docker_recipes():
        path = model_path_on(recipe, host)
        name = path.rsplit("/", 1)[-1]
        assert models[name]["path"] == path and recipe.id in models[name]["recipes"]
    for name in models:
        local = tmp_path / "models" / name
        check = subprocess.run(["sha256sum", "-c", mw.MANIFEST], cwd=local, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        index = json.loads((local / mw.INDEX).read_text())
        assert sorted(set(index["weight_map"].values())) == [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ]
        out = subprocess.run(
            ["sh", "-c", mw.ModelCheckpoint().command(path=str(local))], capture_output=True, text=True
        )
        state = mw.ModelCheckpoint().process(out.stdout.splitlines())
        assert mw.checkpoint_problems(state) == [] and state["shards"] == 2 and state["manifest_stamp"]
    stamp = {p: p.stat().st_mtime for p in (tmp_path / "models").rglob("*")}
    images.publish_models(tmp_path)  # regenerating keeps size and mtime: the role's verified stamp holds
    assert {p: p.stat().st_mtime for p in (tmp_path / "models").rglob("*")} == stamp


def test_cuda_builds_the_patches_install_are_stand_ins_with_their_metadata(tmp_path):
    import zipfile

    standins, real = gpu_images.patch_wheels(
        ["nvidia-cudnn-cu13==9.19.1.2", "transformers==5.2.0", "nvidia-cudnn-cu13==1.0"], tmp_path
    )
    assert real == ["transformers==5.2.0", "nvidia-cudnn-cu13==1.0"]  # no stand-in of that version: the real one
    names = sorted(w.name for w in standins)
    assert names == [
        "nvidia_cublas-13.10.0.20-py3-none-any.whl",
        "nvidia_cuda_nvrtc-13.5.37-py3-none-any.whl",
        "nvidia_cudnn_cu13-9.19.1.2-py3-none-any.whl",
    ]
    with zipfile.ZipFile(tmp_path / names[2]) as whl:
        meta = whl.read("nvidia_cudnn_cu13-9.19.1.2.dist-info/METADATA").decode()
    assert "Requires-Dist: nvidia-cublas" in meta and "Version: 9.19.1.2" in meta
    pins = {r for recipe in _gpu_docker_recipes() for r in cluster.patch_requirements(recipe.runtime.patches)}
    assert "nvidia-cudnn-cu13==9.19.1.2" in pins


def test_the_runtime_image_leaves_out_only_gpu_toolchains_and_cpp_tests(tmp_path):
    """The binaries of GPU_TOOLCHAIN and torch's C++ tests (NEVER_LOADED) go; triton's Python (its backends' drivers included) and
    torch's testing module stay; a release that moved them is an error, not an image half a GB larger again. The
    parser image leaves torch's headers out too."""
    site = runtime_image.site_packages(tmp_path)
    for rel in runtime_image.NEVER_LOADED:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".so"):
            (site / rel).write_bytes(b"\x7fELF")
        else:
            (site / rel).mkdir()
            (site / rel / "ptxas").write_bytes(b"\x7fELF")
    kept = [
        site / "triton/backends/nvidia/driver.py",
        site / "triton/backends/amd/compiler.py",
        site / "triton/_C/libtriton.so",
        site / "torch/testing/__init__.py",
        site / "torch/bin/torch_shm_manager",
    ]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("kept\n")
    runtime_image._drop_unused(tmp_path, runtime_image.RUNTIME.unused)
    assert not [rel for rel in runtime_image.NEVER_LOADED if (site / rel).exists()]
    assert all(path.is_file() for path in kept)
    with pytest.raises(LabError, match="GPU_TOOLCHAIN"):
        runtime_image._drop_unused(tmp_path, runtime_image.RUNTIME.unused)
    assert set(runtime_image.PARSER.unused) - set(runtime_image.RUNTIME.unused) == {"torch/include"}


def test_the_parser_image_installs_the_parser_venvs_distributions_on_the_runtimes_pins():
    """One list for both: what the lint's parser venvs install is what the stand-ins' venv holds (with the shims and
    what they require, resolved by uv), pinned by the CPU runtime's requirements.txt; cached apart from the runtime."""
    roots = runtime_image.parser_roots()
    assert {"torch", "transformers", "triton", "pillow", "pyzmq", "ironserve-lab-cpu-shims"} <= set(roots)
    assert len(roots) == len(engine_parser.parser_distributions()) + 1 and "sglang" not in roots
    assert runtime_image.PARSER.install == ("-c", runtime_image.PINS, *roots)
    assert runtime_image.RUNTIME.install == ("-r", runtime_image.PINS)
    assert runtime_image.PARSER.bytecode in roots and "sglang" not in runtime_image.PARSER.imports


def test_the_runtime_and_parser_images_are_cached_apart(tmp_path):
    base, wheelhouse = tmp_path / "base", tmp_path / "wheels"
    for d in ("var/lib/dpkg", "etc"):
        (base / d).mkdir(parents=True)
    (base / "var/lib/dpkg/status").write_text("Package: python3\n")
    (base / "etc/ironlab-base-version").write_text("7\n")
    wheelhouse.mkdir()
    (wheelhouse / "SHA256SUMS").write_text("ab  torch.whl\n")
    runtime, parser = (
        runtime_image.ref_file(base, wheelhouse, v) for v in (runtime_image.RUNTIME, runtime_image.PARSER)
    )
    assert runtime.name.startswith(f"sglang-cpu-{runtime_image.TAG}-") and parser.name.startswith("parser-")
    assert runtime.name.split("-")[-1] != parser.name.split("-")[-1]


def test_the_images_shared_objects_lose_their_debug_info_and_still_load(tmp_path):
    """An extension module built with DWARF sections (this environment's cffi backend, as uv.lock pins it) is found,
    stripped smaller into a new file, and still imports; an ELF without debug info and a file that is no ELF are left alone."""
    import _cffi_backend

    source = Path(_cffi_backend.__file__)
    assert runtime_image.has_debug_info(source)
    site = runtime_image.site_packages(tmp_path)
    site.mkdir(parents=True)
    shutil.copy2(source, site / source.name)
    (site / source.name).chmod(0o751)
    (site / "data.sort").write_text("not an ELF\n")
    before = (site / source.name).stat().st_ino
    runtime_image._strip_debug_info(tmp_path)
    assert not runtime_image.has_debug_info(site / source.name)
    # a new file renamed over the old (its mode kept): a process beside that mapped the old one keeps it unchanged
    assert (site / source.name).stat().st_ino != before and (site / source.name).stat().st_mode & 0o777 == 0o751
    assert not list(site.glob("*.stripped"))
    assert (site / source.name).stat().st_size < source.stat().st_size
    code = "import sys, _cffi_backend; print(_cffi_backend.__file__, _cffi_backend.__version__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, check=True).stdout
    assert out.startswith(str(site / source.name)), out
    size = (site / source.name).stat().st_size
    runtime_image._strip_debug_info(tmp_path)  # nothing left to strip: the file is not rewritten
    assert (site / source.name).stat().st_size == size and (site / "data.sort").read_text() == "not an ELF\n"


def test_the_runtime_images_bytecode_must_be_hash_checked(tmp_path):
    """The layer clamps every mtime to 0: timestamp pycs would all be stale, so the build refuses them."""
    pkg = runtime_image.site_packages(tmp_path) / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("version = 1\n")
    pyc = pkg / "__pycache__/__init__.cpython-311.pyc"
    py_compile.compile(
        str(pkg / "__init__.py"), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP
    )
    with pytest.raises(LabError, match="SOURCE_DATE_EPOCH"):
        runtime_image._check_bytecode(tmp_path)
    py_compile.compile(
        str(pkg / "__init__.py"), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
    )
    runtime_image._check_bytecode(tmp_path)


def test_the_parser_image_compiles_what_its_check_imports_hash_checked_and_nothing_else(tmp_path):
    """The parser image's bytecode (runtime_image.BYTECODE_OF_LOADED): the venv's modules the statements import get
    hash-checked pycs (the layer clamps mtimes) with the code the import compiled, the others none."""
    venv = tmp_path / "venv"
    (venv / "pkg").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "loaded.py": "import pkg.also, pkg.dropped, sys\ndel sys.modules['pkg.dropped']\n",
        "also.py": "VALUE = 41 + 1\n",
        "dropped.py": "",
        "unused.py": "",
    }
    for name, text in files.items():
        (venv / "pkg" / name).write_text(text)
    env = {"PYTHONPATH": str(venv), "PATH": "/usr/bin:/bin"}
    script = runtime_image.BYTECODE_OF_LOADED.format(statements="import pkg.loaded, json", venv=venv)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "3"
    compiled = {pyc.name.split(".")[0]: pyc.read_bytes() for pyc in venv.rglob("*.pyc")}
    assert {name: int.from_bytes(data[4:8], "little") for name, data in compiled.items()} == {
        "__init__": 3,  # flags: hash-based (1), checked (2)
        "loaded": 3,
        "also": 3,
    }
    expected = py_compile.compile(
        str(venv / "pkg/also.py"),
        cfile=str(tmp_path / "also.pyc"),
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    assert compiled["also"] == Path(expected).read_bytes()  # byte for byte what py_compile writes
    out = subprocess.run([sys.executable, "-c", "import pkg.also; print(pkg.also.VALUE)"], env=env, capture_output=True)
    assert out.stdout.strip() == b"42" and not list((venv / "pkg/__pycache__").glob("*.tmp"))


def test_a_requirement_without_a_stand_in_version_is_downloaded_for_real(tmp_path):
    standins, real = gpu_images.patch_wheels(["uv==0.13.9", "nvidia-ml-py", "nvidia-cublas"], tmp_path)
    assert standins == [] and real == ["uv==0.13.9", "nvidia-ml-py", "nvidia-cublas"]


def test_the_index_wheels_are_fetched_side_by_side_each_resolved_on_its_own(tmp_path, monkeypatch):
    from ironserve_lab import supply, wheels

    links = tmp_path / "links"
    for name, version, requires in (("a", "1", ["c"]), ("a", "2", []), ("b", "1", []), ("c", "1", [])):
        wheels.build_wheel(links, name, version, requires)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    fetched = supply.fetch_wheels(["a==1", "a==2", "b"], tmp_path / "staging")
    assert sorted(f.name for f in fetched) == sorted(
        ["a-1-py3-none-any.whl", "c-1-py3-none-any.whl", "a-2-py3-none-any.whl", "b-1-py3-none-any.whl"]
    )  # a==1 and a==2 cannot be one resolution: each requirement gets its own directory
    with pytest.raises(LabError, match="pip download nothere"):
        supply.fetch_wheels(["b", "nothere==9"], tmp_path / "staging")


def test_a_stand_ins_own_layer_is_made_once_and_sits_on_any_parser_image(tmp_path, monkeypatch):
    from ironserve_lab import oci

    monkeypatch.setenv("IRONSERVE_CACHE", str(tmp_path / "cache"))
    base = tmp_path / "base"
    (base / "usr/share/python-wheels").mkdir(parents=True)
    (base / "usr/share/python-wheels/pip-23.0.1-py3-none-any.whl").write_bytes(b"")
    staged = []

    def stage(stage_dir, base_rootfs, version, extras):
        staged.append(version)
        (stage_dir / "sgl-workspace").mkdir(parents=True)
        (stage_dir / "sgl-workspace/marker").write_text(version)

    monkeypatch.setattr(gpu_images, "_stage", stage)
    spec = {"version": "0.5.9", "extras": None, "recipes": ["r"], "replaces": GLM_DIGEST}
    gpu_images.prepare_layers([], base)  # no recipes, nothing made
    layer = gpu_images.own_layer(spec, base)
    store = runtime_image.cache_dir()
    refs = []
    for n in (1, 2):  # two parser images (e.g. a rebuilt one): the same own layer on each, made once
        parser_layer = oci.put_blob(store, f"parser layer {n}".encode())
        parser = store / "images" / f"parser-{n}.json"
        oci.write_image(store, parser, [{**parser_layer, "diff_id": parser_layer["digest"]}], {"Env": []}, ["p"])
        refs.append(gpu_images.ensure("lmsysorg/sglang:x", spec, base, parser))
    assert staged == ["0.5.9"] and refs[0] != refs[1]
    for ref in refs:
        found = oci.read_image(store, ref)
        manifest = json.loads(oci.blob_path(store, found["manifest_digest"]).read_bytes())
        assert manifest["layers"][-1]["digest"] == layer["digest"] and len(manifest["layers"]) == 2
