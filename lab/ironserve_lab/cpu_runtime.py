"""The lab's CPU runtime for real SGLang: pinned wheels, the shim wheel, and the wheelhouse that holds them.

``cpu-lab`` hosts serve the generated tiny model (``ironserve_lab.tiny_model``) with real SGLang on the CPU.
What they install is exactly :data:`REQUIREMENTS` (requirements/cpu.txt; Python 3.11, manylinux x86_64, Debian
bookworm's glibc 2.36), from the lab's own package index, offline:

- ``sglang==0.5.23`` with its dependencies as PyPI resolves them, **minus the CUDA-only / GPU-kernel
  distributions** in :data:`EXCLUDED` (requirements/cpu-excludes.txt: flashinfer, sglang-kernel, nvidia-*, cuda-python, ...): they are
  either CUDA builds that cannot load next to CPU torch or kernels the CPU path never imports;
- ``torch==2.13.0+cpu`` (sglang 0.5.23 asks for torch==2.14.1; the CPU build at hand is 2.13.0, see
  :data:`OVERRIDES`), from ``/opt/wheels`` (``IRONSERVE_TORCH_WHEELS``);
- ``sglang-router==0.3.2`` (the router host runs it from the same venv);
- ``ironserve-lab-cpu-shims`` (:data:`SHIM_DIST`), built here from ``lab/ironserve_lab/cpu_shims/``: two import
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

    python -m ironserve_lab.cpu_runtime requirements          # the pins, one per line
    python -m ironserve_lab.cpu_runtime uv-config             # /etc/uv/uv.toml for lab hosts
    python -m ironserve_lab.cpu_runtime shim-wheel DIR        # build the shim wheel into DIR
    python -m ironserve_lab.cpu_runtime wheelhouse DIR        # every wheel of REQUIREMENTS into DIR
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import ironserve

from . import pinfiles
from .profiles import PROFILES
from .runtime import LabRuntime, WheelhouseError, download, record
from .wheels import write_wheel

SHIM_DIST = "ironserve-lab-cpu-shims"
# Everything a lab host's venv holds, in order (recipes/tiny-cpu.yaml runtime.packages is exactly this list), and
# sglang 0.5.23's requirements left out of it, with why (requirements/cpu*.txt)
REQUIREMENTS = pinfiles.read("cpu.txt")
EXCLUDED = pinfiles.commented("cpu-excludes.txt")
SGLANG_VERSION = pinfiles.version(REQUIREMENTS, "sglang")
ROUTER_VERSION = pinfiles.version(REQUIREMENTS, "sglang-router")
TORCH_VERSION = pinfiles.version(REQUIREMENTS, "torch")
SHIM_VERSION = pinfiles.version(REQUIREMENTS, SHIM_DIST)  # bump with any change under cpu_shims/
# sglang 0.5.23 pins torch==2.14.1 (CUDA on PyPI); the lab has the CPU build
OVERRIDES = [f"torch=={TORCH_VERSION}"]
PYTHON = "3.11"
PYTHON_TAG = "cp311"
GLIBC = (2, 36)  # Debian bookworm
SHIM_SOURCE = Path(__file__).with_name("cpu_shims")
# torchvision's placeholder is shared with the parser venvs (the product's ironserve/shims/), one source for both
SHARED_SHIMS = Path(ironserve.__file__).resolve().parent / "shims"
SHIM_PACKAGES = ("sgl_kernel", "torchvision")

# Environment of every SGLang server of the lab's CPU runtime (also in recipes/tiny-cpu*.yaml). OMP_NUM_THREADS:
# one torch intra-op thread, as the lab's hosts share this machine's cores (see the recipes' comment)
SERVER_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

_CUDA_WHEEL = re.compile(
    r"^(nvidia[-_](?!ml[-_]py)|cuda[-_]|flashinfer|sgl[-_]kernel|sglang[-_]kernel|"
    r"torch[-_]memory[-_]saver|tilelang|nccl)",
    re.I,
)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_text() -> str:
    return "".join(f"{r}\n" for r in REQUIREMENTS)


def uv_config() -> str:
    """``/etc/uv/uv.toml`` of a cpu-lab host: keeps ``uv pip install`` of the pins to the CPU runtime."""
    lines = [
        "# ironserve LAB hosts only (hardware cpu-lab): SGLang's CPU runtime, see lab/ironserve_lab/cpu_runtime.py.",
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
    """The shim packages' files (wheel path -> bytes), from lab/ironserve_lab/cpu_shims/."""
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
        generator="ironserve_lab.cpu_runtime",
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


def pinned_wheels() -> dict[str, str]:
    """{normalized name: version} of :data:`REQUIREMENTS`: what a wheel of the wheelhouse must be."""
    return {normalize(name): version for name, _, version in (r.partition("==") for r in REQUIREMENTS)}


def check_wheelhouse(dest: str | os.PathLike) -> list[str]:
    """Problems of the wheelhouse in ``dest`` ([] = complete): a missing pin, a CUDA wheel, an extra wheel."""
    dest = Path(dest)
    have: dict[str, list[str]] = {}
    for whl in dest.glob("*.whl"):
        name, version = _wheel_key(whl.name)
        have.setdefault(name, []).append(version)
    problems = []
    wanted = pinned_wheels()
    for req in REQUIREMENTS:
        name, _, version = req.partition("==")
        versions = have.get(normalize(name), [])
        if version not in versions:
            problems.append(f"{req}: no wheel in {dest}" + (f" (have {', '.join(versions)})" if versions else ""))
    for name, versions in sorted(have.items()):
        if _CUDA_WHEEL.match(name):
            problems.append(f"{name} {versions}: CUDA-only wheel in the CPU wheelhouse")
        elif name not in wanted:
            problems.append(f"{name} {versions}: not a pin of the CPU runtime")
    return problems


def prune_wheelhouse(dest: Path) -> list[str]:
    """Remove the wheels of ``dest`` that are no pin of this runtime (an earlier runtime's: another version, or a
    distribution since left out); the names removed. The wheelhouse is a cache across runs: an upgrade of the pins
    neither refuses it nor carries what the runtime no longer holds."""
    wanted = pinned_wheels()
    removed = []
    for whl in sorted(dest.glob("*.whl")):
        name, version = _wheel_key(whl.name)
        if wanted.get(name) != version:
            whl.unlink()
            removed.append(whl.name)
    return removed


def build_wheelhouse(
    dest: str | os.PathLike, *, torch_dir: str | os.PathLike | None = None, timeout: int = 3600
) -> dict:
    """Every wheel of :data:`REQUIREMENTS` into ``dest`` (kept across runs: pip skips what is there; a wheel that
    is no pin any more is removed).

    ``pip download --no-deps --only-binary :all:`` of the exact pins for CPython 3.11 manylinux x86_64 (no
    resolution, so nothing CUDA can come along), torch copied from ``torch_dir`` (default /opt/wheels),
    the shim wheel built here. Writes ``requirements.txt``, ``uv.toml`` and ``SHA256SUMS`` next to the wheels
    and returns a summary; raises WheelhouseError when a wheel is missing or a CUDA wheel is present.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    prune_wheelhouse(dest)
    torch = _torch_wheel(Path(torch_dir) if torch_dir else torch_wheels_dir())
    if not (dest / torch.name).is_file() or (dest / torch.name).stat().st_size != torch.stat().st_size:
        shutil.copy2(torch, dest / torch.name)
    build_shim_wheel(dest)
    missing = [p for p in check_wheelhouse(dest) if p.endswith(f"no wheel in {dest}") or "(have" in p]
    if missing:
        todo = [p.split(":")[0] for p in missing if not p.startswith(("torch==", SHIM_DIST))]
        download(download_command(dest, todo), timeout)
    problems = check_wheelhouse(dest)
    if problems:
        raise WheelhouseError("wheelhouse incomplete:\n" + "\n".join(problems))
    (dest / "requirements.txt").write_text(requirements_text())
    (dest / "uv.toml").write_text(uv_config())
    return {
        **record(dest),
        "sglang": SGLANG_VERSION,
        "router": ROUTER_VERSION,
        "torch": TORCH_VERSION,
        "python": PYTHON,
        "shim": f"{SHIM_DIST}=={SHIM_VERSION}",
    }


def install_command(uv: str, python: str, wheelhouse: str | os.PathLike) -> list[str]:
    """What a lab host runs, in effect (the uv role adds its index options): offline, from the wheelhouse."""
    return [uv, "pip", "install", "--python", python, "--no-index", "--find-links", str(wheelhouse), *REQUIREMENTS]


def stale_files(dest: Path) -> list[str]:
    """The files beside the wheels (the runtime image's build reads them) that say other pins or other uv settings
    than this runtime's."""
    stale = []
    if not (dest / "requirements.txt").is_file() or (dest / "requirements.txt").read_text() != requirements_text():
        stale.append(f"{dest / 'requirements.txt'}: not the runtime's pins")
    try:
        same = tomllib.loads((dest / "uv.toml").read_text()) == tomllib.loads(uv_config())
    except (OSError, tomllib.TOMLDecodeError):
        same = False
    if not same:
        stale.append(f"{dest / 'uv.toml'}: not the runtime's exclusions and overrides")
    return stale


class CpuRuntime(LabRuntime):
    """SGLang on the CPU: what cpu-lab hosts serve with, and what the lab's runtime image (runtime_image.py) and
    the Ascend runtime's wheelhouse (npu_runtime.py) are built from."""

    name = "CPU runtime"
    hardware = tuple(pid for pid, profile in PROFILES.items() if profile["kind"] == "none")
    cache = f"lab-cpu-wheelhouse/{SGLANG_VERSION}"

    def contents(self) -> str:
        return (
            f"{len(REQUIREMENTS)} pins (sglang {SGLANG_VERSION}, sglang-router {ROUTER_VERSION}, torch {TORCH_VERSION})"
        )

    def problems(self, wheelhouse: Path) -> list[str]:
        return check_wheelhouse(wheelhouse) + stale_files(wheelhouse)

    def build(self, wheelhouse: Path) -> dict:
        return build_wheelhouse(wheelhouse)


RUNTIME = CpuRuntime()


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
            "usage: python -m ironserve_lab.cpu_runtime requirements | uv-config | shim-wheel DIR | wheelhouse DIR",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
