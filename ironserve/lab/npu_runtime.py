"""The lab's supply for SGLang's Ascend runtime (the Atlas 800I A3 recipes' uv venv), served by the lab index.

The Atlas recipes pin what SGLang's NPU install resolves to (recipes/glm5.1-*.yaml: sglang 0.5.10.post1,
torch 2.8.0 + torch-npu 2.8.0.post2, torchvision 0.23.0, triton-ascend 3.2.0, memfabric-hybrid 1.1.4, with
overrides and excludes). A lab host installs exactly those pins with the production uv role, from the lab index,
so the index must hold every distribution that resolution reaches:

- real wheels (:data:`REAL_PINS`), downloaded once per machine for CPython 3.11 on x86_64 (the lab hosts'
  interpreter and machine): sglang itself and everything it needs that is not bound to an NPU;
- stand-ins (:data:`STANDINS`) with the published metadata of the Atlas (aarch64) build, for what no machine here
  can run: torch-npu and memfabric-hybrid (CANN-bound; an importable placeholder), torchvision (the aarch64 CPU
  build; the shared torchvision placeholder of the parser venvs), triton-ascend (its metadata only: it ships the
  ``triton`` package, which on the x86_64 lab host is the real triton that xgrammar's x86_64 marker asks for), and
  torch 2.8.0, which must run because SGLang's own parser (the deploy's parse check) imports it: it carries the
  files of this machine's CPU torch (the CPU runtime's, /opt/wheels).

torch's published metadata asks for the CUDA libraries and triton only where ``platform_machine == "x86_64"``; the
Atlas is aarch64, where those lines never apply, so the stand-in leaves them out and a lab host (x86_64) resolves
what an Atlas host resolves. torch-npu's ``torch.backends`` entry point (autoloaded by ``import torch``, it needs
CANN's libraries) is left out of its placeholder: the CPU torch the parser needs keeps importing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from . import cpu_runtime
from .wheels import build_wheel, metadata_text, rebrand_wheel, write_wheel

SGLANG_VERSION = "0.5.10.post1"
PLATFORM_TAG = "cp311-cp311-manylinux_2_28_x86_64"

# uv pip compile <the Atlas recipes' runtime.packages> --overrides <runtime.overrides> --excludes
#   <runtime.excludes> --python-version 3.11 --python-platform x86_64-manylinux_2_35 (PyPI, 2026-11-23), less the
# stand-ins below and what only torch's x86_64 lines bring (nvidia-*-cu12, triton 3.4.0). sglang's own metadata
# asks for torchcodec on x86_64 (av and decord2 on aarch64) and xgrammar for triton on x86_64 (the CPU runtime's
# 3.9.0 here): the lab host resolves its own machine's markers.
REAL_PINS = [
    "aiohappyeyeballs==2.7.1",
    "aiohttp==3.14.5",
    "aiosignal==1.4.0",
    "airportsdata==20260905",
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anthropic==2.12.0",
    "anyio==4.16.0",
    "apache-tvm-ffi==0.1.15.post2",
    "asttokens==3.0.2",
    "attrs==26.1.0",
    "blobfile==3.0.0",
    "build==1.6.1",
    "certifi==2026.10.18",
    "cffi==2.1.1",
    "charset-normalizer==3.5.2",
    "click==8.5.1",
    "cloudpickle==3.1.2",
    "compressed-tensors==0.20.0",
    "cryptography==50.0.2",
    "datasets==5.2.0",
    "dill==0.4.1",
    "diskcache==5.6.3",
    "distro==1.9.0",
    "docstring-parser==0.18.0",
    "einops==0.8.2",
    "executing==2.3.0",
    "fastapi==0.165.0",
    "filelock==4.2.12",
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
    "lark==1.3.1",
    "llguidance==0.7.30",
    "loguru==0.7.3",
    "lxml==6.1.3",
    "markdown-it-py==4.3.0",
    "markupsafe==3.0.4",
    "matplotlib-inline==0.2.2",
    "mdurl==0.1.2",
    "mistral-common==1.9.1",
    "modelscope==1.40.2",
    "modelscope-hub==0.5.1",
    "mpmath==1.3.0",
    "msgspec==0.22.0",
    "multidict==7.2.1",
    "multiprocess==0.70.19",
    "nest-asyncio==1.6.0",
    "networkx==3.6.1",
    "ninja==1.13.2",
    "numpy==2.4.6",
    "nvidia-ml-py==13.615.71",
    "openai==2.6.1",
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
    "python-dateutil==4.0.0",
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
    "sentencepiece==0.2.3",
    "setproctitle==1.3.8",
    "setuptools==84.2.1",
    f"sglang=={SGLANG_VERSION}",
    f"sglang-router=={cpu_runtime.ROUTER_VERSION}",
    "shellingham==1.5.4",
    "smg-grpc-proto==0.4.28",
    "smg-grpc-servicer==0.14.1",
    "sniffio==1.3.1",
    "soundfile==0.13.1",
    "stack-data==0.6.3",
    "starlette==1.10.0",
    "sympy==1.14.0",
    "tiktoken==0.14.0",
    "timm==1.0.16",
    "tokenizers==0.22.2",
    "torchao==0.9.0",
    "torchcodec==0.9.1",
    "tqdm==4.70.1",
    "traitlets==5.16.1",
    "transformers==5.3.0",
    "triton==3.9.0",
    "truststore==0.10.5",
    "typer==0.29.2",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
    "tzdata==2026.6",
    "urllib3==2.8.0",
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
    "watchfiles==1.3.0",
    "wcwidth==0.9.4",
    "xgrammar==0.1.32",
    "xxhash==4.1.0",
    "yarl==1.25.1",
]

# name -> (version, Requires-Python, Requires-Dist) as published for the cp311 manylinux aarch64 wheels (read from
# the wheels' METADATA); torch without its x86_64-only lines (see the module's docstring)
STANDINS = {
    "torch": (
        "2.8.0",
        ">=3.9.0",
        [
            "filelock",
            "typing-extensions>=4.10.0",
            'setuptools; python_version >= "3.12"',
            "sympy>=1.13.3",
            "networkx",
            "jinja2",
            "fsspec",
            'optree>=0.13.0; extra == "optree"',
            'opt-einsum>=3.3; extra == "opt-einsum"',
            'pyyaml; extra == "pyyaml"',
        ],
    ),
    "torch-npu": ("2.8.0.post2", None, ["torch==2.8.0"]),
    "torchvision": (
        "0.23.0",
        ">=3.9",
        ["numpy", "torch==2.8.0", "pillow!=8.3.*,>=5.3.0", 'gdown>=4.7.3; extra == "gdown"', 'scipy; extra == "scipy"'],
    ),
    "triton-ascend": ("3.2.0", None, []),
    "memfabric-hybrid": ("1.1.4", ">=3.8", []),
}
# stand-ins that carry a CPU build's files (the parse check imports them): name -> the CPU runtime's wheel
RUNS_CPU_BUILD = {"torch": f"torch-{cpu_runtime.TORCH_VERSION}-"}
# stand-ins of metadata only (their real package is another distribution's here)
METADATA_ONLY = {"triton-ascend"}


class WheelhouseError(RuntimeError):
    pass


def standin_metadata(name: str) -> str:
    version, requires_python, requires = STANDINS[name]
    return metadata_text(
        name,
        version,
        f"ironserve lab stand-in of {name} {version} (the Atlas build's metadata)",
        requires_python,
        requires,
    )


def build_standins(dest: Path, cpu_wheels: Path) -> list[Path]:
    """The stand-in wheels into ``dest`` (kept when present: the rebranded torch takes a minute to write)."""
    out = []
    for name, (version, _, requires) in STANDINS.items():
        if name in RUNS_CPU_BUILD:
            tag = PLATFORM_TAG
            target = dest / f"{name.replace('-', '_')}-{version}-{tag}.whl"
            if not target.is_file():
                src = sorted(cpu_wheels.glob(f"{RUNS_CPU_BUILD[name]}*.whl")) or sorted(
                    cpu_runtime.torch_wheels_dir().glob(f"{RUNS_CPU_BUILD[name]}*.whl")
                )
                if not src:
                    raise WheelhouseError(
                        f"no {RUNS_CPU_BUILD[name]}*.whl in {cpu_wheels}: the stand-in of {name} "
                        "runs the CPU runtime's build (build the CPU wheelhouse first)"
                    )
                rebrand_wheel(
                    src[-1], dest, name, version, standin_metadata(name), tag, generator="ironserve.lab.npu_runtime"
                )
            out.append(target)
        elif name == "torchvision":
            files = {
                p.relative_to(cpu_runtime.SHARED_SHIMS).as_posix(): p.read_bytes()
                for p in sorted((cpu_runtime.SHARED_SHIMS / "torchvision").rglob("*.py"))
            }
            out.append(build_wheel(dest, name, version, requires, STANDINS[name][1], files=files))
        elif name in METADATA_ONLY:
            out.append(
                write_wheel(dest, name, version, {}, standin_metadata(name), [], generator="ironserve.lab.npu_runtime")
            )
        else:
            out.append(build_wheel(dest, name, version, requires, STANDINS[name][1], package=name.replace("-", "_")))
    return out


def check_wheelhouse(dest: Path) -> list[str]:
    have = {cpu_runtime._wheel_key(w.name) for w in dest.glob("*.whl")}
    wanted = [p.partition("==")[::2] for p in REAL_PINS] + [(n, v[0]) for n, v in STANDINS.items()]
    return [f"{n}=={v}" for n, v in wanted if (cpu_runtime.normalize(n), v) not in have]


def build_wheelhouse(dest: str | os.PathLike, cpu_wheels: str | os.PathLike, timeout: int = 3600) -> dict:
    """Every wheel the Atlas runtime resolves to, into ``dest``: real wheels copied from the CPU runtime's
    wheelhouse where it has the same file, the rest downloaded (``pip download --no-deps`` of exact pins, nothing
    CUDA can come along), the stand-ins built. Returns a summary; raises WheelhouseError when one is missing."""
    dest, cpu_wheels = Path(dest), Path(cpu_wheels)
    dest.mkdir(parents=True, exist_ok=True)
    shared = {cpu_runtime._wheel_key(w.name): w for w in cpu_wheels.glob("*.whl")}
    todo = []
    for pin in [p for p in check_wheelhouse(dest) if p.partition("==")[0] not in STANDINS]:
        name, _, version = pin.partition("==")
        found = shared.get((cpu_runtime.normalize(name), version))
        if found:
            shutil.copy2(found, dest / found.name)
        else:
            todo.append(pin)
    if todo:
        proc = subprocess.run(cpu_runtime.download_command(dest, todo), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise WheelhouseError(f"pip download failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    build_standins(dest, cpu_wheels)
    missing = check_wheelhouse(dest)
    if missing:
        raise WheelhouseError("Ascend runtime wheelhouse incomplete: " + ", ".join(missing))
    wheels = sorted(dest.glob("*.whl"))
    (dest / "SHA256SUMS").write_text(
        "".join(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in wheels)
    )
    return {
        "path": str(dest),
        "wheels": len(wheels),
        "bytes": sum(w.stat().st_size for w in wheels),
        "sglang": SGLANG_VERSION,
        "standins": sorted(STANDINS),
    }
