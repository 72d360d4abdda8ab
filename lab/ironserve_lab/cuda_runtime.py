"""The lab's supply for the CUDA uv runtimes of the RTX recipes (Python 3.12), served by the lab index.

Two seed recipes install SGLang from PyPI into a uv venv of Python 3.12 (interpreters.py supplies that Python):
``minimax-m2.5-nvfp4-rtx6000-tp2`` (sglang 0.5.10rc0 + sglang-kernel 0.4.0: torch 2.9.1, CUDA 12) and
``llama3-8b-multinode-tp4`` (sglang 0.5.23: torch 2.14.1, CUDA 13). A lab host installs exactly those pins with the
production uv role, from the lab index, so the index holds every distribution their resolution reaches
(:data:`RUNTIMES`, from ``uv pip compile`` of each recipe's packages for Python 3.12 on x86_64-manylinux_2_35,
PyPI, 2026-11-23: requirements/cuda-*.txt):

- real wheels (``Runtime.real``) for CPython 3.12 on x86_64, downloaded once per machine with exact pins and no
  dependencies: SGLang and everything not bound to a GPU, and the real CUDA builds of torch (the only cp312 torch
  there is), torchvision, torchaudio, torchcodec and triton (they import on a CPU host), plus the small GPU packages
  that install anywhere (flashinfer-python, flash-attn-4, cuda-bindings, quack-kernels, ...);
- stand-ins (:data:`STANDINS`) with the published metadata (name, version, Requires-Python, Requires-Dist, platform
  tag, read from the wheels' METADATA) for the NVIDIA CUDA library wheels (GBs per host), flashinfer-cubin and
  sglang-kernel. The library stand-ins torch links against carry stub shared libraries (cuda_stubs.py) at the
  paths of the real wheels (:data:`LIBRARY_DIRS`), generated at build time from the torch wheel of the runtime:
  the real torch imports and reports no CUDA device, like a real host whose GPU is absent, so SGLang's own parser
  (the deploy's parse check) and a torch.distributed gloo group (the launch preflight's rendezvous) run in the
  venv. sglang-kernel carries the CPU shim of ``sgl_kernel`` (importable names that raise when called); the rest
  are metadata and an importable placeholder, or metadata only where another wheel owns the package.

    python -m ironserve_lab.cuda_runtime wheelhouse DIR     # build it (prints a summary with the time taken)

Cost, kept visible: ``lab up`` builds it once per machine into the lab cache (runtime.ensure: CudaRuntime.cache), prints
the cold build's time and records its summary in ``build.json`` there. Measured here (2026-11-23, 2 cores, a cold
``PIP_NO_CACHE_DIR=1`` build into a scratch DIR): 253 wheels, 2.5 GiB, 113 s (83 s downloading 211 wheels, 30 s
generating the stub libraries and stand-ins); byte-identical on a rebuild. A host installs one runtime in about a
minute (3.5 GB venv).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import cpu_runtime, cuda_stubs, pinfiles
from .runtime import LabRuntime, WheelhouseError, download, record
from .wheels import build_wheel, metadata_text, write_wheel

PYTHON = "3.12"
# the hardware profiles of the recipes served (tests/test_lab_cuda_runtime.py checks them against the catalogue)
HARDWARE = ("rtx6000-pro", "rtx6000-pro-maxq")


@dataclass(frozen=True)
class Runtime:
    recipe: str
    torch: str
    cuda: str  # the CUDA major version of its torch: which LIBRARY_DIRS apply
    real: tuple[str, ...]  # exact pins of real wheels
    standins: tuple[str, ...]  # name==version of STANDINS


# name==version -> (Requires-Python, Requires-Dist, the real wheel's platform tag), as published (the wheels' METADATA)
STANDINS: dict[str, tuple[str | None, list[str], str]] = {
    "flashinfer-cubin==0.6.6": (">=3.8", [], "py3-none-any"),  # 255 MiB
    "nvidia-cublas-cu12==12.8.4.1": (">=3", [], "py3-none-manylinux_2_27_x86_64"),  # 567 MiB
    "nvidia-cublas==13.1.1.3": (">=3", ["nvidia-cuda-nvrtc"], "py3-none-manylinux_2_27_x86_64"),  # 404 MiB
    "nvidia-cuda-cccl==13.3.5.0.6": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 4 MiB
    "nvidia-cuda-crt==13.5.37": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 0 MiB
    "nvidia-cuda-cupti-cu12==12.8.90": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 10 MiB
    "nvidia-cuda-cupti==13.0.85": (">=3", [], "py3-none-manylinux_2_25_x86_64"),  # 10 MiB
    "nvidia-cuda-nvcc==13.5.37": (
        ">=3",
        ["nvidia-nvvm", "nvidia-cuda-runtime", "nvidia-cuda-crt"],
        "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64",
    ),  # 45 MiB
    "nvidia-cuda-nvrtc-cu12==12.8.93": (">=3", [], "py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64"),  # 84 MiB
    "nvidia-cuda-nvrtc==13.0.88": (">=3", [], "py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64"),  # 86 MiB
    "nvidia-cuda-runtime-cu12==12.8.90": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 1 MiB
    "nvidia-cuda-runtime==13.0.96": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 2 MiB
    "nvidia-cudnn-cu12==9.10.2.21": (">=3", ["nvidia-cublas-cu12"], "py3-none-manylinux_2_27_x86_64"),  # 674 MiB
    "nvidia-cudnn-cu13==9.24.0.43": (">=3", ["nvidia-cublas"], "py3-none-manylinux_2_27_x86_64"),  # 527 MiB
    "nvidia-cufft-cu12==11.3.3.83": (
        ">=3",
        ["nvidia-nvjitlink-cu12"],
        "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64",
    ),  # 184 MiB
    "nvidia-cufft==12.0.0.61": (
        ">=3",
        ["nvidia-nvjitlink"],
        "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64",
    ),  # 204 MiB
    "nvidia-cufile-cu12==1.13.1.3": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 1 MiB
    "nvidia-cufile==1.15.1.6": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 1 MiB
    "nvidia-curand-cu12==10.3.9.90": (">=3", [], "py3-none-manylinux_2_27_x86_64"),  # 61 MiB
    "nvidia-curand==10.4.0.35": (">=3", [], "py3-none-manylinux_2_27_x86_64"),  # 57 MiB
    "nvidia-cusolver-cu12==11.7.3.90": (
        ">=3",
        ["nvidia-cublas-cu12", "nvidia-nvjitlink-cu12", "nvidia-cusparse-cu12"],
        "py3-none-manylinux_2_27_x86_64",
    ),  # 255 MiB
    "nvidia-cusolver==12.0.4.66": (
        ">=3",
        ["nvidia-cublas", "nvidia-nvjitlink", "nvidia-cusparse"],
        "py3-none-manylinux_2_27_x86_64",
    ),  # 192 MiB
    "nvidia-cusparse-cu12==12.5.8.93": (
        ">=3",
        ["nvidia-nvjitlink-cu12"],
        "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64",
    ),  # 275 MiB
    "nvidia-cusparse==12.6.3.3": (
        ">=3",
        ["nvidia-nvjitlink"],
        "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64",
    ),  # 139 MiB
    "nvidia-cusparselt-cu12==0.7.1": (None, [], "py3-none-manylinux2014_x86_64"),  # 274 MiB
    "nvidia-cusparselt-cu13==0.8.1": (None, [], "py3-none-manylinux2014_x86_64"),  # 162 MiB
    "nvidia-cutlass-dsl-libs-cu12==4.8.0": (
        ">=3.10",
        [
            "typing-extensions>=4.10.0",
            "cuda-bindings>=12.8",
            "backports-strenum ; python_full_version < '3.11'",
            "protobuf>=4.21.12",
            "nvidia-cutlass-dsl-libs-base==4.8.0",
            "nvidia-cuda-nvdisasm>=13.4.0rc1,<14 ; extra == 'sass'",
        ],
        "cp312-cp312-manylinux_2_28_x86_64",
    ),  # 87 MiB
    "nvidia-cutlass-dsl-libs-cu12==4.8.1": (
        ">=3.10",
        [
            "typing-extensions>=4.10.0",
            "cuda-bindings>=12.8",
            "backports-strenum ; python_full_version < '3.11'",
            "protobuf>=4.21.12",
            "nvidia-cutlass-dsl-libs-base==4.8.1",
            "nvidia-cuda-nvdisasm>=13.4.0rc1,<14 ; extra == 'sass'",
        ],
        "cp312-cp312-manylinux_2_28_x86_64",
    ),  # 87 MiB
    "nvidia-cutlass-dsl-libs-cu13==4.8.0": (
        ">=3.10",
        [
            "typing-extensions>=4.10.0",
            "cuda-bindings>=12.8",
            "backports-strenum ; python_full_version < '3.11'",
            "protobuf>=4.21.12",
            "nvidia-cutlass-dsl-libs-base==4.8.0",
            "nvidia-cuda-nvdisasm>=13.4.0rc1,<14 ; extra == 'sass'",
        ],
        "cp312-cp312-manylinux_2_28_x86_64",
    ),  # 88 MiB
    "nvidia-cutlass-dsl-libs-cu13==4.8.1": (
        ">=3.10",
        [
            "typing-extensions>=4.10.0",
            "cuda-bindings>=12.8",
            "backports-strenum ; python_full_version < '3.11'",
            "protobuf>=4.21.12",
            "nvidia-cutlass-dsl-libs-base==4.8.1",
            "nvidia-cuda-nvdisasm>=13.4.0rc1,<14 ; extra == 'sass'",
        ],
        "cp312-cp312-manylinux_2_28_x86_64",
    ),  # 88 MiB
    "nvidia-mathdx==25.6.0": (None, [], "py3-none-any"),  # 22 MiB
    "nvidia-nccl-cu12==2.27.5": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 307 MiB
    "nvidia-nccl-cu13==2.30.7": (">=3", [], "py3-none-manylinux_2_18_x86_64"),  # 206 MiB
    "nvidia-nvjitlink-cu12==12.8.93": (">=3", [], "py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64"),  # 37 MiB
    "nvidia-nvjitlink==13.5.37": (">=3", [], "py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64"),  # 44 MiB
    "nvidia-nvshmem-cu12==3.3.20": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 119 MiB
    "nvidia-nvshmem-cu13==3.4.5": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 58 MiB
    "nvidia-nvtx-cu12==12.8.90": (">=3", [], "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"),  # 0 MiB
    "nvidia-nvtx==13.0.85": (">=3", [], "py3-none-manylinux1_x86_64.manylinux_2_5_x86_64"),  # 0 MiB
    "nvidia-nvvm==13.5.37": (">=3", [], "py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64"),  # 72 MiB
    "sglang-kernel==0.4.0": (">=3.10", [], "cp310-abi3-manylinux2014_x86_64"),  # 338 MiB
    "sglang-kernel==0.4.10": (">=3.10", ["torch==2.14.1"], "cp310-abi3-manylinux2014_x86_64"),  # 356 MiB
}


def _runtime(recipe: str, cuda: str, pins_file: str) -> Runtime:
    """The runtime of ``recipe`` from its resolution (requirements/``pins_file``): the pins of STANDINS are
    stand-ins, the others real wheels."""
    pins = pinfiles.read(pins_file)
    return Runtime(
        recipe,
        pinfiles.version(pins, "torch"),
        cuda,
        tuple(p for p in pins if p not in STANDINS),
        tuple(p for p in pins if p in STANDINS),
    )


# the runtimes' resolutions: `uv pip compile` of each recipe's packages (requirements/cuda-*.txt)
RUNTIMES = {
    "sglang-0.5.10rc0": _runtime("minimax-m2.5-nvfp4-rtx6000-tp2", "12", "cuda-sglang-0.5.10rc0.txt"),
    "sglang-0.5.23": _runtime("llama3-8b-multinode-tp4", "13", "cuda-sglang-0.5.23.txt"),
}

# SONAME -> (the NVIDIA wheel that ships it, its directory in site-packages), per CUDA major version: where torch's
# RPATH looks ($ORIGIN/../../nvidia/...). The CUDA 13 wheels share nvidia/cu13/lib.
LIBRARY_DIRS = {
    "12": {
        "libcudart.so.12": ("nvidia-cuda-runtime-cu12", "nvidia/cuda_runtime/lib"),
        "libcublas.so.12": ("nvidia-cublas-cu12", "nvidia/cublas/lib"),
        "libcublasLt.so.12": ("nvidia-cublas-cu12", "nvidia/cublas/lib"),
        "libcudnn.so.9": ("nvidia-cudnn-cu12", "nvidia/cudnn/lib"),
        "libcufft.so.11": ("nvidia-cufft-cu12", "nvidia/cufft/lib"),
        "libcufile.so.0": ("nvidia-cufile-cu12", "nvidia/cufile/lib"),
        "libcupti.so.12": ("nvidia-cuda-cupti-cu12", "nvidia/cuda_cupti/lib"),
        "libcurand.so.10": ("nvidia-curand-cu12", "nvidia/curand/lib"),
        "libcusolver.so.11": ("nvidia-cusolver-cu12", "nvidia/cusolver/lib"),
        "libcusparse.so.12": ("nvidia-cusparse-cu12", "nvidia/cusparse/lib"),
        "libcusparseLt.so.0": ("nvidia-cusparselt-cu12", "nvidia/cusparselt/lib"),
        "libnccl.so.2": ("nvidia-nccl-cu12", "nvidia/nccl/lib"),
        "libnvrtc.so.12": ("nvidia-cuda-nvrtc-cu12", "nvidia/cuda_nvrtc/lib"),
        "libnvshmem_host.so.3": ("nvidia-nvshmem-cu12", "nvidia/nvshmem/lib"),
    },
    "13": {
        "libcudart.so.13": ("nvidia-cuda-runtime", "nvidia/cu13/lib"),
        "libcublas.so.13": ("nvidia-cublas", "nvidia/cu13/lib"),
        "libcublasLt.so.13": ("nvidia-cublas", "nvidia/cu13/lib"),
        "libcudnn.so.9": ("nvidia-cudnn-cu13", "nvidia/cudnn/lib"),
        "libcufft.so.12": ("nvidia-cufft", "nvidia/cu13/lib"),
        "libcufile.so.0": ("nvidia-cufile", "nvidia/cu13/lib"),
        "libcupti.so.13": ("nvidia-cuda-cupti", "nvidia/cu13/lib"),
        "libcurand.so.10": ("nvidia-curand", "nvidia/cu13/lib"),
        "libcusolver.so.12": ("nvidia-cusolver", "nvidia/cu13/lib"),
        "libcusparse.so.12": ("nvidia-cusparse", "nvidia/cu13/lib"),
        "libcusparseLt.so.0": ("nvidia-cusparselt-cu13", "nvidia/cusparselt/lib"),
        "libnccl.so.2": ("nvidia-nccl-cu13", "nvidia/nccl/lib"),
        "libnvrtc.so.13": ("nvidia-cuda-nvrtc", "nvidia/cu13/lib"),
        "libnvshmem_host.so.3": ("nvidia-nvshmem-cu13", "nvidia/nvshmem/lib"),
    },
}
# what torch's stub libraries are generated from: the runtime's wheels whose libraries an import can load
SCANNED = ("torch", "torchvision", "torchaudio")
# stand-ins whose real wheel ships an importable package: name -> its import name (a placeholder)
PACKAGES = {"flashinfer-cubin": "flashinfer_cubin", "sglang-kernel": "sgl_kernel"}
GENERATOR = "ironserve_lab.cuda_runtime"


def _split(pin: str) -> tuple[str, str]:
    name, _, version = pin.partition("==")
    return name, version


def standin_metadata(pin: str) -> str:
    name, version = _split(pin)
    requires_python, requires, _ = STANDINS[pin]
    return metadata_text(
        name,
        version,
        f"ironserve lab stand-in of {name} {version} (the published metadata; no GPU code)",
        requires_python,
        requires,
    )


def standin_wheel_name(pin: str) -> str:
    name, version = _split(pin)
    return f"{cpu_runtime.normalize(name).replace('-', '_')}-{version}-{STANDINS[pin][2]}.whl"


def stub_libraries(runtime: Runtime, wheelhouse: Path, work: Path) -> dict[str, dict[str, bytes]]:
    """{stand-in name: {path in the wheel: stub library}} for the CUDA libraries the runtime's torch (and the
    wheels of SCANNED) link against. Raises when torch needs a library no stand-in places where its RPATH looks."""
    wheels = []
    for pin in runtime.real:
        name, version = _split(pin)
        if name in SCANNED:
            found = sorted(wheelhouse.glob(f"{name}-{version}-*.whl"))
            if not found:
                raise WheelhouseError(f"no {name}-{version} wheel in {wheelhouse} to generate the stub libraries from")
            wheels.append(found[0])
    files = cuda_stubs.elf_files_of(wheels, work / "elf")
    dirs, out = LIBRARY_DIRS[runtime.cuda], {}
    for soname, symbols in cuda_stubs.imports(files).items():
        if soname not in dirs:
            raise WheelhouseError(
                f"torch {runtime.torch} links {soname}, which no stand-in of LIBRARY_DIRS "
                f"[{runtime.cuda!r}] ships (add it there, with its NVIDIA wheel)"
            )
        dist, where = dirs[soname]
        lib = cuda_stubs.build(soname, symbols, work / "stubs" / runtime.cuda)
        out.setdefault(dist, {})[f"{where}/{soname}"] = lib.read_bytes()
    return out


def build_standin(pin: str, dest: Path, libraries: dict[str, bytes] | None = None) -> Path:
    name, version = _split(pin)
    requires_python, requires, tag = STANDINS[pin]
    if name in PACKAGES:
        files = {}
        if name == "sglang-kernel":  # the CPU shim's importable names (each raises when called)
            files = {
                p.relative_to(cpu_runtime.SHIM_SOURCE).as_posix(): p.read_bytes()
                for p in sorted((cpu_runtime.SHIM_SOURCE / "sgl_kernel").rglob("*.py"))
            }
        return build_wheel(dest, name, version, requires, requires_python, tag=tag, package=PACKAGES[name], files=files)
    # the NVIDIA wheels: a namespace package `nvidia` of libraries (stubs where torch links one), no module
    return write_wheel(
        dest,
        name,
        version,
        dict(libraries or {}),
        standin_metadata(pin),
        ["nvidia"] if libraries else [],
        tag=tag,
        generator=GENERATOR,
    )


def wanted(runtime: Runtime) -> list[tuple[str, str]]:
    return [_split(p) for p in (*runtime.real, *runtime.standins)]


def check_wheelhouse(dest: Path) -> list[str]:
    """The pins of RUNTIMES with no wheel in ``dest`` ([] = complete)."""
    have = {cpu_runtime._wheel_key(w.name) for w in dest.glob("*.whl")}
    missing = []
    for runtime in RUNTIMES.values():
        missing += [
            f"{n}=={v}"
            for n, v in wanted(runtime)
            if (cpu_runtime.normalize(n), v) not in have and f"{n}=={v}" not in missing
        ]
    return missing


def build_wheelhouse(dest: str | os.PathLike, timeout: int = 3600) -> dict:
    """Every wheel of RUNTIMES into ``dest`` (kept across runs: what is there is not fetched again): the real ones
    downloaded (``pip download --no-deps`` of exact pins for CPython 3.12 manylinux x86_64), the stand-ins built,
    their stub libraries generated from the runtime's torch. Returns a summary with the seconds taken."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    missing = set(check_wheelhouse(dest))
    todo = [p for p in missing if p not in STANDINS]
    for runtime in RUNTIMES.values():  # one pip call per runtime: pip takes one version of a name per call
        pins = [p for p in runtime.real if p in missing]
        missing -= set(pins)
        if not pins:
            continue
        # exact pins, --no-deps, for another Python than this machine's: a pip configuration capping this
        # machine's own torch/torchvision (a constraint file) must not refuse them
        download(
            cpu_runtime.download_command(dest, pins, python=PYTHON),
            timeout,
            env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
        )
    downloaded = time.monotonic()
    for runtime in RUNTIMES.values():
        if not [p for p in runtime.standins if not (dest / standin_wheel_name(p)).is_file()]:
            continue
        with tempfile.TemporaryDirectory(prefix="ironserve-cuda-") as tmp:
            libraries = stub_libraries(runtime, dest, Path(tmp))
        for pin in runtime.standins:
            build_standin(pin, dest, libraries.get(_split(pin)[0]))
    missing = check_wheelhouse(dest)
    if missing:
        raise WheelhouseError("CUDA runtime wheelhouse incomplete: " + ", ".join(missing))
    return {
        **record(dest),
        "runtimes": sorted(RUNTIMES),
        "downloaded": len(todo),
        "download_s": round(downloaded - t0, 1),
        "total_s": round(time.monotonic() - t0, 1),
    }


class CudaRuntime(LabRuntime):
    """The CUDA uv runtimes of the RTX recipes (Python 3.12): real wheels, torch's CUDA build among them, and stand-ins
    of the NVIDIA libraries with stub libraries."""

    name = "CUDA runtimes"
    hardware = HARDWARE
    cache = f"lab-cuda-wheelhouse/py{PYTHON.replace('.', '')}"

    def contents(self) -> str:
        return f"{', '.join(RUNTIMES)} (Python {PYTHON}, ~3 GB of wheels)"

    def problems(self, wheelhouse: Path) -> list[str]:
        return check_wheelhouse(wheelhouse)

    def build(self, wheelhouse: Path) -> dict:
        try:
            return build_wheelhouse(wheelhouse)
        except cuda_stubs.StubError as exc:
            raise WheelhouseError(f"the stub libraries could not be generated: {exc}") from exc


RUNTIME = CudaRuntime()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "wheelhouse":
        print(json.dumps(build_wheelhouse(args[1]), indent=1))
        return 0
    print("usage: python -m ironserve_lab.cuda_runtime wheelhouse DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
