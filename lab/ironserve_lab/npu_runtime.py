"""The lab's supply for SGLang's Ascend runtime (the Atlas 800I A3 recipes' uv venv), served by the lab index.

The Atlas recipes pin what SGLang's NPU install resolves to (recipes/glm5.1-*.yaml: sglang 0.5.10.post1,
torch 2.8.0 + torch-npu 2.8.0.post2, torchvision 0.23.0, triton-ascend 3.2.0, memfabric-hybrid 1.1.4, with
overrides and excludes). A lab host installs exactly those pins with the production uv role, from the lab index,
so the index must hold every distribution that resolution reaches:

- real wheels (:data:`REAL_PINS`, requirements/npu.txt), downloaded once per machine for CPython 3.11 on x86_64 (the lab hosts'
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

import os
import shutil
from pathlib import Path

from . import cpu_runtime, pinfiles
from .profiles import PROFILES
from .runtime import LabRuntime, WheelhouseError, download, record
from .wheels import build_wheel, metadata_text, rebrand_wheel, write_wheel

PLATFORM_TAG = "cp311-cp311-manylinux_2_28_x86_64"
# what a lab host resolves the Atlas recipes' pins to: the real wheels, then the stand-ins (requirements/npu.txt)
PINS = pinfiles.read("npu.txt")
SGLANG_VERSION = pinfiles.version(PINS, "sglang")

# name -> (Requires-Python, Requires-Dist) as published for the cp311 manylinux aarch64 wheels of the stand-ins' pins
# (read from the wheels' METADATA); torch without its x86_64-only lines (see the module's docstring)
STANDIN_METADATA: dict[str, tuple[str | None, list[str]]] = {
    "torch": (
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
    "torch-npu": (None, ["torch==2.8.0"]),
    "torchvision": (
        ">=3.9",
        ["numpy", "torch==2.8.0", "pillow!=8.3.*,>=5.3.0", 'gdown>=4.7.3; extra == "gdown"', 'scipy; extra == "scipy"'],
    ),
    "triton-ascend": (None, []),
    "memfabric-hybrid": (">=3.8", []),
}
# name -> (version, Requires-Python, Requires-Dist): the stand-ins, at their pins
STANDINS = {name: (pinfiles.version(PINS, name), *meta) for name, meta in STANDIN_METADATA.items()}
# the real wheels (downloaded): every pin but the stand-ins'
REAL_PINS = [p for p in PINS if p.partition("==")[0] not in STANDINS]
# stand-ins that carry a CPU build's files (the parse check imports them): name -> the CPU runtime's wheel
RUNS_CPU_BUILD = {"torch": f"torch-{cpu_runtime.TORCH_VERSION}-"}
# stand-ins of metadata only (their real package is another distribution's here)
METADATA_ONLY = {"triton-ascend"}


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
                    src[-1], dest, name, version, standin_metadata(name), tag, generator="ironserve_lab.npu_runtime"
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
                write_wheel(dest, name, version, {}, standin_metadata(name), [], generator="ironserve_lab.npu_runtime")
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
        download(cpu_runtime.download_command(dest, todo), timeout)
    build_standins(dest, cpu_wheels)
    missing = check_wheelhouse(dest)
    if missing:
        raise WheelhouseError("Ascend runtime wheelhouse incomplete: " + ", ".join(missing))
    return {
        **record(dest),
        "sglang": SGLANG_VERSION,
        "standins": sorted(STANDINS),
    }


class NpuRuntime(LabRuntime):
    """SGLang's Ascend runtime, as an Atlas host resolves it: built on the CPU runtime's wheelhouse (its real wheels
    and torch's CPU build)."""

    name = "Ascend runtime"
    hardware = tuple(pid for pid, profile in PROFILES.items() if profile["kind"] == "ascend")
    cache = f"lab-npu-wheelhouse/{SGLANG_VERSION}"
    requires = (cpu_runtime.RUNTIME,)

    def contents(self) -> str:
        return f"sglang {SGLANG_VERSION}, {len(REAL_PINS)} real wheels, stand-ins {', '.join(STANDINS)}"

    def problems(self, wheelhouse: Path) -> list[str]:
        return check_wheelhouse(wheelhouse)

    def build(self, wheelhouse: Path) -> dict:
        return build_wheelhouse(wheelhouse, cpu_runtime.RUNTIME.wheelhouse())


RUNTIME = NpuRuntime()
