"""The lab's CUDA runtime supply (lab/ironserve_lab/cuda_runtime.py, cuda_stubs.py): it covers the Python 3.12 recipes'
pins with one version of each name, its stand-ins carry the published metadata and put their stub libraries where
torch's RPATH looks, and a stub library answers torch's imports (version nodes included) with "no device"."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import zipfile

import pytest
from ironserve_lab import cuda_runtime, cuda_stubs

from ironserve import catalogue
from ironserve.spec import UvRuntime


def _pins(pins):
    return dict(p.partition("==")[::2] for p in pins)


@pytest.mark.parametrize("key", sorted(cuda_runtime.RUNTIMES))
def test_every_pin_of_the_recipe_is_a_real_wheel_or_a_standin_of_that_version(key):
    runtime = cuda_runtime.RUNTIMES[key]
    recipe = catalogue.get_recipe(runtime.recipe)
    assert isinstance(recipe.runtime, UvRuntime) and recipe.runtime.python == cuda_runtime.PYTHON
    pins = [*runtime.real, *runtime.standins]
    names = [p.partition("==")[0] for p in pins]
    assert len(names) == len(set(names)), "one version of each distribution per runtime (one resolution)"
    served = _pins(pins)
    for name, version in _pins(recipe.runtime.packages).items():
        assert served.get(name) == version, (recipe.id, name)
    assert served["torch"] == runtime.torch and served["sglang"] == recipe.engine.sglang
    assert set(runtime.standins) <= set(cuda_runtime.STANDINS)
    # nothing CUDA-bound and big is downloaded for real, torch and triton aside (they import on a CPU host)
    assert not [
        p
        for p in runtime.real
        if p.startswith(("nvidia-cublas", "nvidia-cudnn-cu", "nvidia-nccl", "sglang-kernel", "flashinfer-cubin"))
    ]


# how many distributions `uv pip compile` of each recipe's packages gave (Python 3.12, x86_64-manylinux_2_35, PyPI,
# 2026-11-23; the resolutions cuda_runtime.py records): a pin or a stand-in that goes missing changes the count
RESOLVED = {"sglang-0.5.10rc0": 181, "sglang-0.5.23": 207}


@pytest.mark.parametrize("key", sorted(RESOLVED))
def test_the_runtime_is_the_whole_resolution(key):
    runtime = cuda_runtime.RUNTIMES[key]
    assert len(runtime.real) + len(runtime.standins) == RESOLVED[key]
    assert not set(runtime.real) & set(runtime.standins)


def test_standins_are_those_the_runtimes_use_and_hardware_is_the_recipes():
    used = {p for r in cuda_runtime.RUNTIMES.values() for p in r.standins}
    assert used == set(cuda_runtime.STANDINS)
    hardware = {h for r in cuda_runtime.RUNTIMES.values() for h in catalogue.get_recipe(r.recipe).hardware}
    assert hardware == set(cuda_runtime.HARDWARE)


def test_every_library_torch_links_has_a_standin_of_the_runtime():
    for runtime in cuda_runtime.RUNTIMES.values():
        names = {p.partition("==")[0] for p in runtime.standins}
        for soname, (dist, where) in cuda_runtime.LIBRARY_DIRS[runtime.cuda].items():
            assert dist in names, (runtime.recipe, soname, dist)
            assert where.startswith("nvidia/") and where.endswith("/lib")


def test_standin_metadata_is_the_published_one():
    meta = cuda_runtime.standin_metadata("nvidia-cudnn-cu12==9.10.2.21")
    assert "Name: nvidia-cudnn-cu12\nVersion: 9.10.2.21\n" in meta
    assert "Requires-Dist: nvidia-cublas-cu12" in meta and "Requires-Python: >=3" in meta
    meta = cuda_runtime.standin_metadata("nvidia-cutlass-dsl-libs-cu13==4.8.1")
    assert "Provides-Extra: sass" in meta and "Requires-Dist: nvidia-cutlass-dsl-libs-base==4.8.1" in meta
    assert "Requires-Dist: torch==2.14.1" in cuda_runtime.standin_metadata("sglang-kernel==0.4.10")


def test_standin_wheels_place_stubs_and_the_sgl_kernel_shim(tmp_path):
    lib = cuda_runtime.build_standin(
        "nvidia-cuda-runtime-cu12==12.8.90", tmp_path, {"nvidia/cuda_runtime/lib/libcudart.so.12": b"\x7fELF"}
    )
    assert lib.name == "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    assert "nvidia/cuda_runtime/lib/libcudart.so.12" in zipfile.ZipFile(lib).namelist()
    kernel = cuda_runtime.build_standin("sglang-kernel==0.4.0", tmp_path)
    assert kernel.name == cuda_runtime.standin_wheel_name("sglang-kernel==0.4.0")
    assert kernel.name.endswith("-cp310-abi3-manylinux2014_x86_64.whl")
    assert "sgl_kernel/__init__.py" in zipfile.ZipFile(kernel).namelist()
    meta = cuda_runtime.build_standin("nvidia-nvvm==13.5.37", tmp_path)
    assert all(".dist-info/" in n for n in zipfile.ZipFile(meta).namelist())


def test_check_wheelhouse_names_every_missing_pin(tmp_path):
    missing = cuda_runtime.check_wheelhouse(tmp_path)
    assert "torch==2.9.1" in missing and "torch==2.14.1" in missing and "sglang-kernel==0.4.0" in missing
    cuda_runtime.build_standin("sglang-kernel==0.4.0", tmp_path)
    assert "sglang-kernel==0.4.0" not in cuda_runtime.check_wheelhouse(tmp_path)


@pytest.mark.skipif(not shutil.which("gcc") or not shutil.which("readelf"), reason="needs gcc and readelf")
def test_stub_library_answers_a_versioned_import_with_no_device(tmp_path):
    symbols = {"libcudart.so.12": {"cudaGetDeviceCount", "cudaGetErrorString", "cudaMalloc"}}
    stub = cuda_stubs.build("libcudart.so.12", symbols, tmp_path / "lib")
    # a consumer linked against it, as libtorch_cuda.so is against NVIDIA's: its imports name the version node
    (tmp_path / "use.c").write_text(
        "int cudaGetDeviceCount(int *);\nint probe(void) { int n; return cudaGetDeviceCount(&n); }\n"
    )
    consumer = tmp_path / "libuse.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(consumer),
            str(tmp_path / "use.c"),
            f"-L{tmp_path / 'lib'}",
            "-l:libcudart.so.12",
            f"-Wl,-rpath,{tmp_path / 'lib'}",
        ],
        check=True,
    )
    assert "libcudart.so.12" in cuda_stubs.needed(consumer)
    assert cuda_stubs.imports([consumer]) == {"libcudart.so.12": {"libcudart.so.12": {"cudaGetDeviceCount"}}}
    assert ctypes.CDLL(str(consumer)).probe() == 100  # cudaErrorNoDevice, through the versioned binding
    cuda = ctypes.CDLL(str(stub))
    cuda.cudaGetErrorString.restype = ctypes.c_char_p
    assert b"no CUDA-capable device" in cuda.cudaGetErrorString(100)
    assert cuda_stubs.library_for("libnccl.so.2").prefixes == ("nccl",)
    assert cuda_stubs.library_for("libfoo.so.1") is None


def test_version_script_of_unversioned_and_empty_libraries():
    assert "local: *;" in cuda_stubs.version_script({})
    script = cuda_stubs.version_script({"": {"ncclGetVersion"}})
    assert script.startswith("{") and "ncclGetVersion;" in script
    script = cuda_stubs.version_script({"NVSHMEM": {"nvshmem_init"}, "": {"nvshmemx_init_attr"}})
    assert script.startswith("NVSHMEM {") and "nvshmemx_init_attr;" in script
