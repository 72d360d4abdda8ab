"""The lab's CPU SGLang runtime image: the tiny-cpu uv runtime's exact pins in a container image.

``ironserve-lab/sglang-cpu:<sglang version>`` (recipes/tiny-cpu-docker.yaml) is built once per machine, without a
Docker engine, and cached in ~/.cache/ironserve/lab-images (IRONSERVE_CACHE) like the CPU wheelhouse:

- layer 1, the Debian base: the lab's own bookworm rootfs (rootfs.py), minus /dev, /proc, /sys, /run, /tmp and
  apt's caches (a Debian image as `debootstrap | docker import` makes it);
- layer 2, the runtime: an overlay over that rootfs, in which the rootfs's own Python 3.11 gets a venv at
  /opt/sglang filled by ``uv pip install --no-index`` from the CPU wheelhouse (cpu_runtime.REQUIREMENTS with the
  wheelhouse's uv.toml: the same pins, exclusions and torch override as the uv runtime of recipes/tiny-cpu.yaml);
  the layer is the overlay's upper directory, checked to hold no whiteouts, with mtimes clamped. Triton's GPU
  toolchain binaries (GPU_TOOLCHAIN, half a GB that compiles only GPU kernels) are left out of it.

The image puts /opt/sglang/bin first on PATH, so the units' ``python3 -m sglang.launch_server`` is the venv's.
``lab up`` pushes it to the lab registry (registry.py); the base layer's digest depends on this machine's
rootfs, so the image digest is per machine (`ironserve lock` resolves it).

The same build makes the parser image (:data:`PARSER`), the base of the stand-in GPU images (gpu_images.py): the
same base layer, and a venv of only what SGLang's argument parser imports (the lint parser venvs' distributions,
ironserve.engine_parser, with the lab's import shims) and what they require, resolved by uv from the same
wheelhouse under the same pins (``-c requirements.txt``): 1.1 of the runtime's 2.5 GB, installed directly, so a
GPU profile's cold ``lab up`` never builds the serving venv it does not use. Both venvs leave out what nothing
loads (:data:`NEVER_LOADED`) and their shared objects' debug info; the parser image has bytecode only for the
modules SGLang's parser loads (``Venv.bytecode_for``), the CPU runtime image for all (its engines import more).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from ironserve import engine_parser

from . import cpu_runtime, oci, state
from .scratch import scratch_dir
from .system import LabError, run, say, unmount_tree

REPO = "ironserve-lab/sglang-cpu"
TAG = cpu_runtime.SGLANG_VERSION
VENV = "/opt/sglang"
BUILD_VERSION = "7"  # bump when the build below changes: the cached image is rebuilt
# The GPU toolchains in triton's wheel (NVIDIA's ptxas and CUPTI, the ROCm code generator, a GPU test library):
# 0.5 GB of every host's pull, used only to compile GPU kernels, which nothing on this CPU image (or the GPU
# stand-ins built on the parser image) does. Their Python stays: `import triton` reads it; the binaries are found
# lazily.
GPU_TOOLCHAIN = (
    "triton/backends/nvidia/bin",
    "triton/backends/nvidia/lib/cupti",
    "triton/backends/nvidia/lib/cupti-blackwell",
    "triton/backends/amd/lib/libtriton_amd_codegen.so",
    "triton/instrumentation/libGPUInstrumentationTestLib.so",
)
# ... and torch's C++ unit tests (torch/test, 82 MB, and torch/bin's largest, 36 MB: executables no import runs) and
# its protobuf compiler (11 MB, for building against torch): left out of both images (torch/bin/torch_shm_manager,
# which torch.multiprocessing runs, stays)
TORCH_EXECUTABLES = (
    "torch/test",
    "torch/bin/test_api",
    "torch/bin/test_jit",
    "torch/bin/test_lazy",
    "torch/bin/test_aoti_abi_check",
    "torch/bin/test_profiler_collection",
    "torch/bin/protoc",
    "torch/bin/protoc-3.13.0.0",
)
NEVER_LOADED = (*GPU_TOOLCHAIN, *TORCH_EXECUTABLES)
# The parser image's stand-ins compile nothing: torch's C headers (for C++ extensions and the CPU inductor's
# generated code, which serving on the CPU runtime may build) go too.
PARSER_UNUSED = (*NEVER_LOADED, "torch/include")
BASE_EXCLUDES = (
    "./dev/*",
    "./proc/*",
    "./sys/*",
    "./run/*",
    "./tmp/*",
    "./var/cache/apt/*",
    "./var/lib/apt/lists/*",
    "./etc/ssh/ssh_host_*",
)
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PINS = "/tmp/ironlab-wheels/requirements.txt"  # the wheelhouse's requirements.txt, as the build's chroot sees it


@dataclass(frozen=True)
class Venv:
    """What an image's venv layer is installed from, and how the build checks it."""

    name: str  # the cached image's record, images/<name>-<key>.json
    install: tuple[str, ...]  # `uv pip install` arguments (the wheelhouse's uv.toml applies to both)
    imports: str  # Python the finished venv must run
    bytecode: str  # a package whose bytecode proves the hash-checked compilation
    unused: tuple[str, ...]  # site-packages paths left out of the layer (each must exist: a release that moved one)
    title: str
    # Python whose imported modules get bytecode (the runtime's SGLang release on its path, from the wheelhouse): an
    # image that only runs that need not compile all of its venv, the rest is compiled when something imports it;
    # "" compiles the whole venv (uv's --compile-bytecode)
    bytecode_for: str = ""
    # the build's tmpfs (scratch.py), GiB: the overlay's upper directory at its fullest, uv's unpacked wheels included
    # (the runtime's: 5.9 GiB)
    scratch_gib: int = 8

    def history(self) -> str:
        """The venv layer's line in the image history: how it was installed, what it leaves out."""
        compiled = f", bytecode for `{self.bytecode_for}`" if self.bytecode_for else ""
        return (
            f"uv venv {VENV} && uv pip install --no-index {' '.join(self.install)} (lab/ironserve_lab/cpu_runtime.py "
            f"pins){compiled}, less {', '.join(self.unused)} and the shared objects' debug info"
        )


def parser_roots() -> list[str]:
    """The distributions the parser image installs with what they require: the parser venvs' own and the shims."""
    return sorted({canonicalize_name(d) for d in [*engine_parser.parser_distributions(), cpu_runtime.SHIM_DIST]})


RUNTIME = Venv(
    name=f"sglang-cpu-{TAG}",
    install=("-r", PINS),
    imports="import sglang, torch, triton; print(sglang.__version__, torch.__version__)",
    bytecode="sglang",
    unused=NEVER_LOADED,
    title="ironserve lab: SGLang CPU runtime",
)
PARSER = Venv(
    name="parser",
    install=("-c", PINS, *parser_roots()),
    imports="import torch, transformers, triton; print('parser packages', torch.__version__)",
    bytecode="torch",
    unused=PARSER_UNUSED,
    title="ironserve lab: what SGLang's parser imports, on the CPU runtime's pins",
    scratch_gib=6,  # 4.0 GiB at its fullest (the runtime's: 5.9)
    # the stand-ins run only the parse check: SGLang's parser (their own SGLang, compiled in its layer; here the
    # runtime's release) and what it imports of this venv, a sixth of its modules
    bytecode_for="import sglang.srt.server_args, torch, transformers, triton",
)


def cache_dir() -> Path:
    return state.cache_dir() / "lab-images"


def build_dir() -> Path:
    """Where an image's venv is installed (in memory where it can): gone once its layer is written."""
    return cache_dir() / "build"


def _base_identity(base: Path) -> str:
    """What makes this machine's rootfs this one: its version marker and its dpkg status (size, mtime)."""
    status = (base / "var/lib/dpkg/status").stat()
    return f"{(base / 'etc/ironlab-base-version').read_text().strip()}:{status.st_size}:{status.st_mtime_ns}"


def build_key(base: Path, wheelhouse: Path, venv: Venv = RUNTIME) -> str:
    text = json.dumps(
        {
            "build": BUILD_VERSION,
            "base": _base_identity(base),
            "wheels": (wheelhouse / "SHA256SUMS").read_text(),
            "requirements": cpu_runtime.REQUIREMENTS,
            "install": venv.install,
            "bytecode_for": venv.bytecode_for,
        }
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ref_file(base: Path, wheelhouse: Path, venv: Venv = RUNTIME) -> Path:
    return cache_dir() / "images" / f"{venv.name}-{build_key(base, wheelhouse, venv)}.json"


def base_layer(base: Path) -> dict:
    """The Debian base layer of this machine's rootfs (cached by the rootfs's identity)."""
    key = hashlib.sha256(f"{_base_identity(base)}:{oci.LAYER_TAR}".encode()).hexdigest()[:16]
    record = cache_dir() / "images" / f"base-{key}.json"

    def make() -> dict:
        say("runtime image: Debian base layer from the lab rootfs")
        return oci.layer_from_dir(cache_dir(), base, BASE_EXCLUDES, progress=say)

    return oci.cached_layer(cache_dir(), record, make)


def _whiteouts(upper: Path) -> list[str]:
    found = []
    for dirpath, dirs, files in os.walk(upper):
        for name in dirs + files:
            path = Path(dirpath) / name
            st = path.lstat()
            if (st.st_mode & 0o170000) == 0o020000 and st.st_rdev == 0:
                found.append(str(path.relative_to(upper)))
        try:
            if os.getxattr(dirpath, "trusted.overlay.opaque") == b"y":
                found.append(str(Path(dirpath).relative_to(upper)) + " (opaque)")
        except OSError:
            pass
    return found


def site_packages(root: Path) -> Path:
    """The image venv's site-packages under ``root`` (a rootfs, an overlay, a layer's staging directory)."""
    return root / VENV.lstrip("/") / "lib/python3.11/site-packages"


def _drop_unused(merged: Path, unused: tuple[str, ...]) -> None:
    site = site_packages(merged)
    missing = [rel for rel in unused if not (site / rel).exists()]
    if missing:  # a triton or torch release that moved them: the image would silently grow again
        raise LabError(
            f"runtime image: what the build leaves out is not where it expects it: {missing} "
            "(update runtime_image.GPU_TOOLCHAIN, NEVER_LOADED or PARSER_UNUSED)"
        )
    for rel in unused:
        path = site / rel
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def has_debug_info(path: Path) -> bool:
    """Whether ``path`` is a 64-bit little-endian ELF file with DWARF sections (``.debug_*``), read from its section
    headers (what `readelf -S` lists)."""
    with open(path, "rb") as elf:
        head = elf.read(64)
        if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
            return False
        shoff = int.from_bytes(head[0x28:0x30], "little")
        shentsize, shnum, shstrndx = (int.from_bytes(head[i : i + 2], "little") for i in (0x3A, 0x3C, 0x3E))
        elf.seek(shoff)
        headers = elf.read(shentsize * shnum)
        if shstrndx >= shnum or len(headers) < shentsize * shnum:
            return False
        names = headers[shstrndx * shentsize : (shstrndx + 1) * shentsize]
        elf.seek(int.from_bytes(names[0x18:0x20], "little"))
        strtab = elf.read(int.from_bytes(names[0x20:0x28], "little"))
    starts = (int.from_bytes(headers[i * shentsize : i * shentsize + 4], "little") for i in range(shnum))
    return any(strtab[start:].startswith(b".debug_") for start in starts)


def _strip_debug_info(merged: Path) -> None:
    """The venv's shared objects without their debug info (triton's libtriton.so: 477 MB, 183 without): never loaded
    when the code runs, but every host pulls it. `strip --strip-debug` keeps the symbols and the code."""
    site = site_packages(merged)
    found = [path for path in site.rglob("*.so*") if path.is_file() and not path.is_symlink() and has_debug_info(path)]
    before = sum(path.stat().st_size for path in found)
    for path in found:
        # into a new file renamed over the old one: `strip` in place rewrites the inode (binutils 2.40 keeps it),
        # which a process beside that already mapped the library would see change under it (SIGSEGV)
        stripped = path.with_name(path.name + ".stripped")
        run(["strip", "--strip-debug", "-o", str(stripped), str(path)])
        os.chmod(stripped, path.stat().st_mode)
        os.replace(stripped, path)
    after = sum(path.stat().st_size for path in found)
    say(f"runtime image: debug info stripped from {len(found)} shared object(s): {before >> 20} -> {after >> 20} MiB")


def _check_bytecode(merged: Path, package: str = "sglang") -> None:
    """The venv's bytecode is hash-checked (flags word of the pyc header, PEP 552), so it survives the clamped mtimes."""
    pyc = site_packages(merged) / package / "__pycache__/__init__.cpython-311.pyc"
    try:
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
    except OSError as exc:
        raise LabError(f"runtime image: no bytecode compiled for {package} ({exc})") from exc
    if not flags & 1:
        raise LabError(
            f"runtime image: {pyc.name} is timestamp-checked: in the layer (mtimes clamped to 0) every "
            "pyc would be stale; the install needs SOURCE_DATE_EPOCH"
        )


def _install_venv(base: Path, wheelhouse: Path, work: Path, venv: Venv = RUNTIME) -> Path:
    """Overlay over the rootfs, venv + pinned install inside it (chroot); returns the upper directory."""
    upper, ovl, merged = work / "upper", work / "ovl", work / "merged"
    for d in (upper, ovl, merged):
        d.mkdir(parents=True)
    uv = shutil.which("uv")
    if not uv:
        raise LabError("uv is needed on this machine to build the lab's runtime image (scripts/env.sh installs it)")
    run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={base},upperdir={upper},workdir={ovl}", str(merged)])
    try:
        _bind_build_inputs(merged, wheelhouse)
        shutil.copy2(uv, merged / "tmp/ironlab-uv")
        _install_in_chroot(merged, venv)
    finally:
        unmount_tree(merged)  # the binds in it first, then the overlay
    _clean_upper(upper)
    return upper


def _bind_build_inputs(merged: Path, wheelhouse: Path) -> None:
    """The wheelhouse (read-only), /proc and /dev bound into the overlay."""
    wheels = merged / "tmp/ironlab-wheels"
    wheels.mkdir(parents=True)
    for src, dst, opts in (
        (wheelhouse, wheels, ["--bind", "-o", "ro"]),
        ("/proc", merged / "proc", ["--bind"]),
        ("/dev", merged / "dev", ["--bind"]),
    ):
        run(["mount", *opts, str(src), str(dst)])


def _install_in_chroot(merged: Path, venv: Venv) -> None:
    """The venv and its pinned install inside the overlay, checked: hash-checked bytecode, no GPU toolchain, imports."""
    # SOURCE_DATE_EPOCH: the bytecode is compiled hash-checked (PEP 552), not against source mtimes, which the
    # layer clamps to 0: timestamp pycs would all be stale, and every container start would recompile
    env = {
        "HOME": "/tmp/ironlab-home",
        "UV_NO_CACHE": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_CONFIG_FILE": "/tmp/ironlab-wheels/uv.toml",
        "PATH": PATH,
        "SOURCE_DATE_EPOCH": "0",
    }
    chroot = ["chroot", str(merged), "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    uv = [*chroot, "/tmp/ironlab-uv"]
    run([*uv, "venv", "--python", "/usr/bin/python3.11", VENV])
    wheels = ["--no-index", "--find-links", "/tmp/ironlab-wheels", *venv.install]
    compile_all = [] if venv.bytecode_for else ["--compile-bytecode"]
    run(
        [*uv, "pip", "install", "--python", f"{VENV}/bin/python", "--link-mode", "copy", *compile_all, *wheels],
        timeout=3600,
    )
    _drop_unused(merged, venv.unused)
    with ThreadPoolExecutor(max_workers=1) as beside:
        # the shared objects lose their debug info on one core while the other imports what the parser loads (each
        # stripped copy is renamed over the old file: a process that mapped the old one keeps it)
        stripped = beside.submit(_strip_debug_info, merged)
        if venv.bytecode_for:
            _compile_loaded(merged, chroot, venv.bytecode_for)
        stripped.result()
    _check_bytecode(merged, venv.bytecode)
    check = run([*chroot, f"{VENV}/bin/python", "-c", venv.imports], timeout=600)
    say(f"runtime image ({venv.name}): the venv imports {check.stdout.strip()}")


# Imports the statements, the import compiling each module once and writing its (timestamp) pyc, then stamps the
# pycs of the venv's loaded modules hash-checked (PEP 552: the same code object, the flags and the source's hash in
# the header instead of its mtime and size, which the layer clamps to 0) and removes every other pyc of the venv
# (modules the import loaded and dropped again); prints how many it stamped. One pass: listing the modules with
# PYTHONDONTWRITEBYTECODE and compiling them again afterwards compiled each twice.
BYTECODE_OF_LOADED = """
import importlib.util, os, py_compile, sys
{statements}
stamped = set()
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None) or ""
    if not (path.startswith("{venv}/") and path.endswith(".py")):
        continue
    pyc = importlib.util.cache_from_source(path)
    try:
        with open(pyc, "rb") as written:
            data = written.read()
    except OSError:
        data = b""
    if data[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(data[4:8], "little") == 0:
        with open(path, "rb") as src:
            source_hash = importlib.util.source_hash(src.read())
        with open(pyc + ".tmp", "wb") as out:
            out.write(data[:4] + (3).to_bytes(4, "little") + source_hash + data[16:])
        os.replace(pyc + ".tmp", pyc)
    else:
        py_compile.compile(path, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    stamped.add(pyc)
for folder, _, names in os.walk("{venv}"):
    for name in names:
        if name.endswith(".pyc") and os.path.join(folder, name) not in stamped:
            os.unlink(os.path.join(folder, name))
print(len(stamped))
"""


def _compile_loaded(merged: Path, chroot: list[str], statements: str) -> None:
    """Hash-checked bytecode for the venv modules ``statements`` import, and for no other."""
    python = f"{VENV}/bin/python"
    wheels = sorted((merged / "tmp/ironlab-wheels").glob(f"sglang-{cpu_runtime.SGLANG_VERSION}-*.whl"))
    if not wheels:
        raise LabError(f"runtime image: no sglang {cpu_runtime.SGLANG_VERSION} wheel in the CPU wheelhouse")
    with zipfile.ZipFile(wheels[0]) as whl:
        whl.extractall(merged / "tmp/ironlab-sglang")
    script = BYTECODE_OF_LOADED.format(statements=statements, venv=VENV)
    count = run([*chroot, "PYTHONPATH=/tmp/ironlab-sglang", python, "-c", script], timeout=1800).stdout.strip()
    say(f"runtime image: bytecode for the {count} modules `{statements}` loads")


def _clean_upper(upper: Path) -> None:
    """The build's own files out of the layer; LabError when the install removed a file of the base."""
    for leftover in (
        "tmp/ironlab-wheels",
        "tmp/ironlab-uv",
        "tmp/ironlab-home",
        "tmp/ironlab-sglang",
        "root/.cache",
    ):
        path = upper / leftover
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    found = _whiteouts(upper)
    if found:
        raise LabError(f"runtime image: the install removed files of the base, a layer cannot say that: {found[:5]}")


def ensure(base: Path, wheelhouse: Path, venv: Venv = RUNTIME) -> tuple[Path, dict]:
    """The cached image of ``venv`` (built first when missing): (its ref file, {manifest_digest, config_digest})."""
    ref = ref_file(base, wheelhouse, venv)
    found = oci.read_image(cache_dir(), ref)
    if found:
        return ref, found
    what = f"{REPO}:{TAG}" if venv is RUNTIME else f"({venv.name})"
    say(
        f"runtime image {what}: building it once for this machine (Debian base from the lab rootfs + "
        f"`uv pip install {' '.join(venv.install)}` from the CPU wheelhouse, a few minutes) -> {cache_dir()}"
    )
    t0 = time.monotonic()
    layers = [base_layer(base), _venv_layer(base, wheelhouse, venv, t0)]
    labels = {"org.opencontainers.image.title": venv.title}
    if venv is RUNTIME:
        labels["ironserve.lab.sglang"] = cpu_runtime.SGLANG_VERSION
    labels["ironserve.lab.requirements.sha256"] = hashlib.sha256(cpu_runtime.requirements_text().encode()).hexdigest()
    config = {"Env": [f"PATH={PATH}", f"VIRTUAL_ENV={VENV}"], "Cmd": ["python3"], "WorkingDir": "/", "Labels": labels}
    history = [
        "lab rootfs (Debian bookworm, lab/ironserve_lab/rootfs.py)",
        venv.history(),
    ]
    found = oci.write_image(cache_dir(), ref, layers, config, history)
    say(
        f"runtime image {what} built in {time.monotonic() - t0:.0f}s: {found['manifest_digest']} "
        f"({sum(layer['size'] for layer in layers) / 2**20:.0f} MiB, uncompressed)"
    )
    return ref, found


def _venv_layer(base: Path, wheelhouse: Path, venv: Venv, t0: float) -> dict:
    """The venv installed in an overlay over the rootfs, its upper directory written as a layer."""
    work = build_dir()
    with scratch_dir(work, venv.scratch_gib, f"runtime image ({venv.name})"):
        upper = _install_venv(base, wheelhouse, work, venv)
        say(f"runtime image ({venv.name}): venv installed after {time.monotonic() - t0:.0f}s; writing its layer")
        return oci.layer_from_dir(cache_dir(), upper, ("./tmp/*",), normalize_mtime=True, progress=say)
