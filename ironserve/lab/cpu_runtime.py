"""The lab's CPU runtime for real SGLang: pinned wheels, the shim wheel, and the wheelhouse that holds them.

``cpu-lab`` hosts serve the generated tiny model (``ironserve.lab.tiny_model``) with real SGLang on the CPU.
What they install is exactly :data:`REQUIREMENTS` (Python 3.11, manylinux x86_64, Debian bookworm's glibc
2.36), from the lab's own package index, offline:

- ``sglang==0.5.23`` with its dependencies as PyPI resolves them, **minus the CUDA-only / GPU-kernel
  distributions** in :data:`EXCLUDED` (flashinfer, sglang-kernel, nvidia-*, cuda-python, ...): they are
  either CUDA builds that cannot load next to CPU torch or kernels the CPU path never imports;
- ``torch==2.13.0+cpu`` (sglang 0.5.23 asks for torch==2.14.1; the CPU build at hand is 2.13.0, see
  :data:`OVERRIDES`), from ``/opt/wheels`` (``IRONSERVE_TORCH_WHEELS``);
- ``sglang-router==0.3.2`` (the router host runs it from the same venv);
- ``ironserve-lab-cpu-shims`` (:data:`SHIM_DIST`), built here from ``ironserve/lab/cpu_shims/``: two import
  shims, see that directory's README.md and below.

Because the product's uv role runs a plain ``uv pip install`` (with resolution), sglang's own metadata would
pull the excluded packages and torch 2.14.1 back in. Lab hosts therefore carry :func:`uv_config` as
``/etc/uv/uv.toml`` (uv's system-level configuration): ``exclude-dependencies`` for :data:`EXCLUDED` and
``override-dependencies`` for :data:`OVERRIDES`. That file is lab runtime, not product: production hosts have
GPUs and install sglang's real dependency set.

The shims (only in this runtime, never in a product unit; each raises loudly if ever called):

- ``sgl_kernel``: SGLang's CPU engine imports names from ``sgl_kernel`` at module level (e.g.
  ``sglang.kernels.ops.kvcache.cache_move`` -> ``copy_all_layer_kv_cache_cpu``). PyPI has only CUDA builds
  of sgl-kernel/sglang-kernel; SGLang's CPU build is not published there. On a CPU without Intel AMX (every
  lab host) SGLang calls none of them: each layer takes its torch-native path because
  ``torch.ops.sgl_kernel.convert_weight_packed`` does not exist. The shim makes every name importable as a
  placeholder that raises ``NotImplementedError`` naming the kernel, and registers no torch op.
- ``torchvision``: the PyPI wheels are CUDA builds that fail to load next to CPU torch; sglang imports
  ``torchvision.transforms`` at module level in multimodal helpers (same inert shim as the parser venvs of
  ``ironserve.engine_parser``). Text models never call it.

Serving also needs ``SGLANG_USE_CPU_ENGINE=1`` in the server's environment: SGLang's own switch for its CPU
platform (without it ``--device cpu`` still takes CUDA-era code paths, e.g. rotary embedding imports vllm).
That is product configuration of the ``tiny-cpu`` recipe (``env``), not a shim.

    python -m ironserve.lab.cpu_runtime requirements          # the pins, one per line
    python -m ironserve.lab.cpu_runtime uv-config             # /etc/uv/uv.toml for lab hosts
    python -m ironserve.lab.cpu_runtime shim-wheel DIR        # build the shim wheel into DIR
    python -m ironserve.lab.cpu_runtime wheelhouse DIR        # every wheel of REQUIREMENTS into DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .wheels import write_wheel

SGLANG_VERSION = "0.5.23"
ROUTER_VERSION = "0.3.2"
TORCH_VERSION = "2.13.0+cpu"
PYTHON = "3.11"
PYTHON_TAG = "cp311"
GLIBC = (2, 36)  # Debian bookworm
SHIM_DIST = "ironserve-lab-cpu-shims"
SHIM_VERSION = "0.1.0"  # bump with any change under cpu_shims/ (hosts keep an installed version)
SHIM_SOURCE = Path(__file__).with_name("cpu_shims")
# torchvision's placeholder is shared with the parser venvs (ironserve/shims/), one source for both
SHARED_SHIMS = Path(__file__).resolve().parents[1] / "shims"
SHIM_PACKAGES = ("sgl_kernel", "torchvision")

# Environment of every SGLang server of the lab's CPU runtime (also in recipes/tiny-cpu.yaml).
SERVER_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1"}

# sglang 0.5.23 requirements (direct) left out of the CPU runtime, and why. Their own dependencies
# (nvidia-cuda-*, nvidia-cutlass-dsl-libs-*, nccl4py, cuda-bindings, z3-solver, ...) go with them.
EXCLUDED = {
    "sglang-kernel": "CUDA build of SGLang's kernels; the CPU path needs only importable names (shim sgl_kernel)",
    "sgl-kernel": "old name of sglang-kernel (CUDA build)",
    "flashinfer-python": "CUDA attention/sampling kernels (the CPU path uses torch_native / pytorch backends)",
    "flash-attn-4": "CUDA attention kernels",
    "humming-kernels": "CUDA kernels",
    "quack-kernels": "CUDA kernels (cutlass DSL)",
    "sgl-deep-ep": "DeepEP, CUDA expert-parallel communication",
    "sgl-deep-gemm": "DeepGEMM, CUDA FP8 GEMM kernels",
    "sgl-flash-mla": "FlashMLA, CUDA MLA attention kernels",
    "tilelang": "GPU kernel compiler (pulls CUDA toolchain wheels)",
    "torch-memory-saver": "CUDA memory (un)mapping for RL weight swaps",
    "nvidia-cutlass-dsl": "CUTLASS Python DSL, CUDA only",
    "nvidia-mathdx": "CUDA math device extensions",
    "nvshmem4py-cu13": "NVSHMEM, CUDA only",
    "cuda-python": "CUDA driver/runtime bindings",
    "torchvision": "PyPI wheels are CUDA builds that cannot load next to CPU torch (shim torchvision)",
    "torchaudio": "PyPI wheels are CUDA builds; audio models only",
    "torchcodec": "video decoding against CUDA torch; multimodal only",
}
# sglang 0.5.23 pins torch==2.14.1 (CUDA on PyPI); the lab has the CPU build of 2.13.0.
OVERRIDES = [f"torch=={TORCH_VERSION}"]

# uv pip compile 'sglang==0.5.23' 'sglang-router==0.3.2' --python-version 3.11
#   --python-platform x86_64-manylinux_2_36 --only-binary :all: --excludes EXCLUDED --overrides OVERRIDES
# (PyPI, 2026-11-22), torch left out (it comes from /opt/wheels).
PINS = [
    "aiohappyeyeballs==2.7.1",
    "aiohttp==3.14.5",
    "aiosignal==1.4.0",
    "airportsdata==20260905",
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anthropic==2.12.0",
    "anyio==4.16.0",
    "apache-tvm-ffi==0.1.11",
    "asttokens==3.0.2",
    "attrs==26.1.0",
    "blobfile==3.0.0",
    "build==1.6.1",
    "certifi==2026.10.18",
    "cffi==2.1.1",
    "charset-normalizer==3.5.2",
    "click==8.5.1",
    "cloudpickle==3.1.2",
    "compressed-tensors==0.18.0",
    "cryptography==50.0.2",
    "datasets==5.2.0",
    "deepseek-recipe==0.2.0",
    "dill==0.4.1",
    "diskcache==5.6.3",
    "distro==1.9.0",
    "docstring-parser==0.18.0",
    "easydict==1.14",
    "einops==0.8.2",
    "executing==2.3.0",
    "fastapi==0.165.0",
    "filelock==4.2.11",
    "frozenlist==1.8.0",
    "fsspec==2026.9.0",
    "gguf==0.19.0",
    "grpcio==1.85.1",
    "grpcio-health-checking==1.85.1",
    "grpcio-reflection==1.85.1",
    "h11==0.16.0",
    "hf-xet==1.8.0",
    "httpcore==1.0.9",
    "httpcore2==2.16.2",
    "httpx==0.28.1",
    "httpx2==2.16.2",
    "huggingface-hub==1.33.0",
    "idna==3.20",
    "interegular==0.3.3",
    "ipython==9.18.1",
    "ipython-pygments-lexers==1.1.1",
    "jedi==0.20.1",
    "jinja2==3.1.6",
    "jiter==0.19.0",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "kernels==0.14.1",
    "kernels-data==0.16.2",
    "lark==1.3.1",
    "llguidance==1.9.1",
    "llvmlite==0.47.0",
    "loguru==0.7.3",
    "lxml==6.1.3",
    "markdown-it-py==4.3.0",
    "markupsafe==3.0.4",
    "matplotlib-inline==0.2.2",
    "mdurl==0.1.2",
    "mistral-common==1.13.1",
    "modelscope==1.40.2",
    "modelscope-hub==0.5.1",
    "mpmath==1.3.0",
    "msgspec==0.22.0",
    "multidict==7.2.1",
    "multiprocess==0.70.19",
    "nest-asyncio==1.6.0",
    "networkx==3.6.1",
    "ninja==1.13.2",
    "numba==0.65.1",
    "numpy==2.3.5",
    "nvidia-ml-py==13.615.71",
    "openai==2.8.0",
    "openai-harmony==0.0.4",
    "opentelemetry-api==1.45.2",
    "orjson==3.13.0",
    "outlines==0.1.11",
    "outlines-core==0.1.26",
    "packaging==26.3",
    "pandas==3.1.1",
    "parso==0.8.7",
    "partial-json-parser==0.2.1.1.post7",
    "pexpect==4.9.0",
    "pillow==13.0.0",
    "prometheus-client==0.26.0",
    "prompt-toolkit==3.0.53",
    "propcache==0.5.4",
    "protobuf==7.36.2",
    "psutil==7.2.2",
    "ptyprocess==0.7.0",
    "pure-eval==0.2.4",
    "py-spy==0.4.3",
    "pyarrow==26.0.1",
    "pybase64==1.5.1",
    "pycountry==26.2.16",
    "pycparser==3.12",
    "pycryptodomex==3.24.2",
    "pydantic==2.14.3",
    "pydantic-core==2.50.4",
    "pydantic-extra-types==2.11.1",
    "pygments==2.21.0",
    "pyproject-hooks==1.3.3",
    "python-dateutil==2.9.0.post0",
    "python-multipart==0.0.34",
    "pyyaml==6.0.3",
    "pyzmq==27.3.0",
    "referencing==0.37.0",
    "regex==2026.11.15",
    "requests==2.34.2",
    "rich==15.0.0",
    "rpds-py==2026.9.1",
    "safetensors==0.8.0",
    "scipy==1.17.1",
    "sentencepiece==0.2.1",
    "setproctitle==1.3.8",
    "setuptools==84.2.1",
    f"sglang=={SGLANG_VERSION}",
    f"sglang-router=={ROUTER_VERSION}",
    "shellingham==1.5.4",
    "six==1.17.0",
    "smg-grpc-proto==0.4.28",
    "smg-grpc-servicer==0.14.1",
    "sniffio==1.3.1",
    "soundfile==0.13.1",
    "stack-data==0.6.3",
    "starlette==1.10.0",
    "sympy==1.14.0",
    "tiktoken==0.14.0",
    "timm==1.0.25",
    "tml-renderers==0.1.0",
    "tokenizers==0.23.2",
    "tomlkit==0.15.2",
    "tqdm==4.70.1",
    "traitlets==5.16.1",
    "transformers==5.19.0",
    "triton==3.9.0",
    "truststore==0.10.5",
    "typer==0.29.2",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
    "urllib3==2.8.0",
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
    "watchfiles==1.3.0",
    "wcwidth==0.9.4",
    "xgrammar==0.2.7",
    "xxhash==4.1.0",
    "yarl==1.25.1",
    "zstandard==0.25.0",
]

# Everything a lab host's venv holds (recipes/tiny-cpu.yaml runtime.packages is exactly this list).
REQUIREMENTS = [
    f"sglang=={SGLANG_VERSION}",
    f"sglang-router=={ROUTER_VERSION}",
    f"torch=={TORCH_VERSION}",
    f"{SHIM_DIST}=={SHIM_VERSION}",
] + [p for p in PINS if not p.startswith((f"sglang=={SGLANG_VERSION}", f"sglang-router=={ROUTER_VERSION}"))]

_CUDA_WHEEL = re.compile(
    r"^(nvidia[-_](?!ml[-_]py)|cuda[-_]|flashinfer|sgl[-_]kernel|sglang[-_]kernel|"
    r"torch[-_]memory[-_]saver|tilelang|nccl)",
    re.I,
)


class WheelhouseError(RuntimeError):
    pass


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_text() -> str:
    return "".join(f"{r}\n" for r in REQUIREMENTS)


def uv_config() -> str:
    """``/etc/uv/uv.toml`` of a cpu-lab host: keeps ``uv pip install`` of the pins to the CPU runtime."""
    lines = [
        "# ironserve LAB hosts only (hardware cpu-lab): SGLang's CPU runtime, see ironserve/lab/cpu_runtime.py.",
        "# sglang's metadata asks for CUDA-only distributions and torch==2.14.1; the lab's CPU runtime leaves the",
        "# former out (import shims: ironserve-lab-cpu-shims) and takes the CPU build of torch 2.13.0.",
        "override-dependencies = [" + ", ".join(json.dumps(o) for o in OVERRIDES) + "]",
        "exclude-dependencies = [",
        *(f"    {json.dumps(name)},  # {why}" for name, why in EXCLUDED.items()),
        "]",
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the shim wheel


def shim_files() -> dict[str, bytes]:
    """The shim packages' files (wheel path -> bytes), from ironserve/lab/cpu_shims/."""
    out = {}
    for package in SHIM_PACKAGES:
        base = SHIM_SOURCE if (SHIM_SOURCE / package).is_dir() else SHARED_SHIMS
        for path in sorted((base / package).rglob("*.py")):
            out[path.relative_to(base).as_posix()] = path.read_bytes()
    if not out:
        raise WheelhouseError(f"no shim sources under {SHIM_SOURCE}")
    return out


def shim_wheel_name() -> str:
    return f"{SHIM_DIST.replace('-', '_')}-{SHIM_VERSION}-py3-none-any.whl"


def build_shim_wheel(dest: str | os.PathLike) -> Path:
    """Build ``ironserve_lab_cpu_shims-<version>-py3-none-any.whl`` into ``dest`` (stdlib only, byte-stable)."""
    readme = (SHIM_SOURCE / "README.md").read_text()
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {SHIM_DIST}\n"
        f"Version: {SHIM_VERSION}\n"
        f"Summary: ironserve lab only: import shims (sgl_kernel, torchvision) for SGLang {SGLANG_VERSION} on CPU\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.10\n"
        "Description-Content-Type: text/markdown\n\n" + readme
    )
    return write_wheel(
        dest,
        SHIM_DIST,
        SHIM_VERSION,
        shim_files(),
        metadata,
        list(SHIM_PACKAGES),
        generator="ironserve.lab.cpu_runtime",
    )


# --------------------------------------------------------------------------- the wheelhouse


def torch_wheels_dir() -> Path:
    return Path(os.environ.get("IRONSERVE_TORCH_WHEELS", "/opt/wheels"))


def _torch_wheel(torch_dir: Path) -> Path:
    found = sorted(torch_dir.glob(f"torch-{TORCH_VERSION}-{PYTHON_TAG}-{PYTHON_TAG}-*linux*_x86_64.whl"))
    if not found:
        raise WheelhouseError(
            f"no torch-{TORCH_VERSION}-{PYTHON_TAG}-*.whl in {torch_dir}: the lab's CPU runtime needs the CPU "
            "build of torch (PyPI's torch is a multi-GB CUDA build). Set IRONSERVE_TORCH_WHEELS to a directory "
            "holding it."
        )
    return found[-1]


def platform_tags() -> list[str]:
    """manylinux tags a Debian bookworm x86_64 host accepts, newest first (pip does not expand them itself)."""
    major, minor = GLIBC
    return [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 16, -1)] + ["manylinux2014_x86_64"]


def _pip() -> list[str]:
    for python in (sys.executable, shutil.which("python3")):
        if python and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return [python, "-m", "pip"]
    raise WheelhouseError("pip is needed to download the wheelhouse (python3 -m pip)")


def download_command(dest: Path, pins: list[str], python: str = PYTHON) -> list[str]:
    """``pip download`` of exact pins, no dependencies, binary wheels for CPython ``python`` on the lab hosts."""
    tag = "cp" + python.replace(".", "")
    cmd = [
        *_pip(),
        "download",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        tag,
        "--abi",
        "abi3",
        "--abi",
        "none",
        "--dest",
        str(dest),
    ]
    for tag in platform_tags():
        cmd += ["--platform", tag]
    return cmd + pins


def _wheel_key(filename: str) -> tuple[str, str]:
    name, version = filename.split("-")[:2]
    return normalize(name), version


def check_wheelhouse(dest: str | os.PathLike) -> list[str]:
    """Problems of the wheelhouse in ``dest`` ([] = complete): a missing pin, a CUDA wheel, an extra wheel."""
    dest = Path(dest)
    have: dict[str, list[str]] = {}
    for whl in dest.glob("*.whl"):
        name, version = _wheel_key(whl.name)
        have.setdefault(name, []).append(version)
    problems = []
    wanted = {}
    for req in REQUIREMENTS:
        name, _, version = req.partition("==")
        wanted[normalize(name)] = version
        versions = have.get(normalize(name), [])
        if version not in versions:
            problems.append(f"{req}: no wheel in {dest}" + (f" (have {', '.join(versions)})" if versions else ""))
    for name, versions in sorted(have.items()):
        if _CUDA_WHEEL.match(name):
            problems.append(f"{name} {versions}: CUDA-only wheel in the CPU wheelhouse")
        elif name not in wanted:
            problems.append(f"{name} {versions}: not a pin of the CPU runtime")
    return problems


def build_wheelhouse(
    dest: str | os.PathLike, *, torch_dir: str | os.PathLike | None = None, timeout: int = 3600
) -> dict:
    """Every wheel of :data:`REQUIREMENTS` into ``dest`` (kept across runs: pip skips what is there).

    ``pip download --no-deps --only-binary :all:`` of the exact pins for CPython 3.11 manylinux x86_64 (no
    resolution, so nothing CUDA can come along), torch copied from ``torch_dir`` (default /opt/wheels),
    the shim wheel built here. Writes ``requirements.txt``, ``uv.toml`` and ``SHA256SUMS`` next to the wheels
    and returns a summary; raises WheelhouseError when a wheel is missing or a CUDA wheel is present.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    torch = _torch_wheel(Path(torch_dir) if torch_dir else torch_wheels_dir())
    if not (dest / torch.name).is_file() or (dest / torch.name).stat().st_size != torch.stat().st_size:
        shutil.copy2(torch, dest / torch.name)
    build_shim_wheel(dest)
    missing = [p for p in check_wheelhouse(dest) if p.endswith(f"no wheel in {dest}") or "(have" in p]
    if missing:
        todo = [p.split(":")[0] for p in missing if not p.startswith(("torch==", SHIM_DIST))]
        proc = subprocess.run(download_command(dest, todo), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise WheelhouseError(f"pip download failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    problems = check_wheelhouse(dest)
    if problems:
        raise WheelhouseError("wheelhouse incomplete:\n" + "\n".join(problems))
    (dest / "requirements.txt").write_text(requirements_text())
    (dest / "uv.toml").write_text(uv_config())
    wheels = sorted(dest.glob("*.whl"))
    sums = "".join(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in wheels)
    (dest / "SHA256SUMS").write_text(sums)
    return {
        "path": str(dest),
        "wheels": len(wheels),
        "bytes": sum(w.stat().st_size for w in wheels),
        "sglang": SGLANG_VERSION,
        "router": ROUTER_VERSION,
        "torch": TORCH_VERSION,
        "python": PYTHON,
        "shim": f"{SHIM_DIST}=={SHIM_VERSION}",
    }


def install_command(uv: str, python: str, wheelhouse: str | os.PathLike) -> list[str]:
    """What a lab host runs, in effect (the uv role adds its index options): offline, from the wheelhouse."""
    return [uv, "pip", "install", "--python", python, "--no-index", "--find-links", str(wheelhouse), *REQUIREMENTS]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["requirements"]:
        sys.stdout.write(requirements_text())
    elif args == ["uv-config"]:
        sys.stdout.write(uv_config())
    elif len(args) == 2 and args[0] == "shim-wheel":
        print(build_shim_wheel(args[1]))
    elif len(args) == 2 and args[0] == "wheelhouse":
        print(json.dumps(build_wheelhouse(args[1]), indent=1))
    else:
        print(
            "usage: python -m ironserve.lab.cpu_runtime requirements | uv-config | shim-wheel DIR | wheelhouse DIR",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
