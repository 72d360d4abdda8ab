"""Stub CUDA libraries: what a CUDA build of torch links against, as a host without a GPU would answer it.

PyPI's torch for Linux x86_64 is a CUDA build: its libraries (``libtorch_cuda.so``, ``libc10_cuda.so``, ...) name
``libcudart.so.12``, ``libcublas.so.12``, ``libcudnn.so.9``, ``libnccl.so.2``, ... as DT_NEEDED, found through their
RPATH in the NVIDIA library wheels (``site-packages/nvidia/<component>/lib``, for CUDA 13 ``nvidia/cu13/lib``).
Without those files ``import torch`` fails; with the real ones each host installs GBs it can never use. The lab's
stand-ins of those wheels carry instead one small library per SONAME, generated here from the torch wheel itself:

- every symbol the wheel's libraries import from it (``readelf --dyn-syms``: versioned ``sym@libcudart.so.12``, and
  the unversioned ones by the library's name prefix, e.g. ``nccl*``, ``cusparseLt*``), under the same version nodes,
  so the dynamic linker accepts the library exactly as it accepts NVIDIA's;
- each function returns the library's own "no device" / "not initialized" status (:data:`LIBRARIES`), the error
  strings a fixed text: torch imports, ``torch.cuda.is_available()`` is False and ``device_count()`` 0, as on a real
  host whose GPU is absent (``cudaGetDeviceCount`` answers ``cudaErrorNoDevice``); CPU tensors and gloo work.

Built with this machine's gcc (``-nostdlib``, no libc needed), byte-stable for the same input. The driver
(``libcuda.so.1``) is no wheel's: torch loads it lazily, and the lab hosts have none, like a host without a driver.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class StubError(RuntimeError):
    pass


@dataclass(frozen=True)
class Library:
    soname: re.Pattern  # the SONAMEs it stands for (one library per SONAME found among the wheel's DT_NEEDED)
    prefixes: tuple  # unversioned imported symbols that belong to it, by name prefix
    status: int  # what its functions return: the library's "no device" / "not initialized" status
    what: str


# A CUDA library of the NVIDIA wheels -> how its stub answers. Statuses (from the libraries' headers):
# cudaErrorNoDevice, CUBLAS/CUSPARSE/CUSOLVER_STATUS_NOT_INITIALIZED, CUDNN_STATUS_NOT_INITIALIZED,
# CUFFT_SETUP_FAILED, CURAND_STATUS_NOT_INITIALIZED, ncclUnhandledCudaError, NVRTC_ERROR_INTERNAL_ERROR,
# CUPTI_ERROR_NOT_INITIALIZED, CU_FILE_DRIVER_NOT_INITIALIZED, nvshmem's generic error, NVJITLINK_ERROR_INTERNAL.
LIBRARIES = [
    Library(re.compile(r"libcudart\.so\.\d+"), ("cuda",), 100, "CUDA runtime"),
    Library(re.compile(r"libcublasLt\.so\.\d+"), ("cublasLt",), 1, "cuBLASLt"),
    Library(re.compile(r"libcublas\.so\.\d+"), ("cublas",), 1, "cuBLAS"),
    Library(re.compile(r"libcudnn\.so\.\d+"), ("cudnn",), 1001, "cuDNN"),
    Library(re.compile(r"libcufft\.so\.\d+"), ("cufft",), 7, "cuFFT"),
    Library(re.compile(r"libcurand\.so\.\d+"), ("curand",), 101, "cuRAND"),
    Library(re.compile(r"libcusolver\.so\.\d+"), ("cusolver",), 1, "cuSOLVER"),
    Library(re.compile(r"libcusparseLt\.so\.\d+"), ("cusparseLt",), 1, "cuSPARSELt"),
    Library(re.compile(r"libcusparse\.so\.\d+"), ("cusparse",), 1, "cuSPARSE"),
    Library(re.compile(r"libnccl\.so\.\d+"), ("nccl",), 1, "NCCL"),
    Library(re.compile(r"libnvrtc\.so\.\d+"), ("nvrtc",), 11, "NVRTC"),
    Library(re.compile(r"libcupti\.so\.\d+"), ("cupti", "Cupti"), 15, "CUPTI"),
    Library(re.compile(r"libcufile\.so\.\d+"), ("cuFile",), 5001, "cuFile"),
    Library(re.compile(r"libnvshmem_host\.so\.\d+"), ("nvshmem",), 1, "NVSHMEM"),
    Library(re.compile(r"libnvJitLink\.so\.\d+"), ("nvJitLink",), 6, "nvJitLink"),
    Library(re.compile(r"libnvToolsExt\.so\.\d+"), ("nvtx",), 0, "NVTX"),
]
# functions that return a C string (an error's text or name): they get one, never a status cast to a pointer
_STRING_FUNCTIONS = re.compile(r"((Error|Status)(String|Name)|GetLastError|GetErrorName)$")
NO_DEVICE_TEXT = "no CUDA-capable device is detected (ironserve lab: stub {what} library, no GPU on this host)"


def library_for(soname: str) -> Library | None:
    return next((lib for lib in LIBRARIES if lib.soname.fullmatch(soname)), None)


def _readelf(path: Path, *args: str) -> str:
    proc = subprocess.run(["readelf", "-W", *args, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StubError(f"readelf {' '.join(args)} {path}: {proc.stderr.strip()}")
    return proc.stdout


def needed(path: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf(path, "-d"))


def undefined_symbols(path: Path) -> list[tuple[str, str | None]]:
    """(symbol, version node or None) of every undefined dynamic symbol of the ELF file ``path``."""
    out = []
    for line in _readelf(path, "--dyn-syms").splitlines():
        cols = line.split()
        if len(cols) >= 8 and cols[6] == "UND" and cols[7]:
            name, _, version = cols[7].partition("@")
            out.append((name, version.split(" ")[0].lstrip("@") or None))
    return out


def imports(files: list[Path]) -> dict[str, dict[str, set[str]]]:
    """{stubbed SONAME: {version node ("" = none): symbols}} that the ELF ``files`` need from the CUDA libraries."""
    sonames = sorted({s for f in files for s in needed(f) if library_for(s)})
    wanted: dict[str, dict[str, set[str]]] = {s: {} for s in sonames}
    nodes = {s: s for s in sonames}  # NVIDIA's libraries version their symbols by their SONAME...
    for soname in (s for s in sonames if s.startswith("libnvshmem_host")):
        nodes["NVSHMEM"] = soname  # ...nvshmem by its name
    for f in files:
        for name, version in undefined_symbols(f):
            if version in nodes:
                wanted[nodes[version]].setdefault(version, set()).add(name)
            elif version is None:
                # cublasLt before cublas, cusparseLt before cusparse: the longest prefix wins
                matches = [s for s in sonames if name.startswith(library_for(s).prefixes)]
                if matches:
                    lib = max(matches, key=lambda s: max(len(p) for p in library_for(s).prefixes if name.startswith(p)))
                    wanted[lib].setdefault("", set()).add(name)
    return wanted


def c_source(soname: str, symbols: dict[str, set[str]]) -> str:
    lib = library_for(soname)
    text = NO_DEVICE_TEXT.format(what=lib.what)
    lines = [
        f"/* ironserve lab stub of {soname} ({lib.what}): generated by ironserve_lab.cuda_stubs */",
        f'static const char no_device[] = "{text}";',
    ]
    for name in sorted({s for group in symbols.values() for s in group}):
        if _STRING_FUNCTIONS.search(name):
            lines.append(f"const char *{name}(void) {{ return no_device; }}")
        else:
            lines.append(f"long {name}(void) {{ return {lib.status}; }}")
    return "\n".join(lines) + "\n"


def version_script(symbols: dict[str, set[str]]) -> str:
    """The version nodes of ``symbols`` ({node: names}, "" = unversioned). An unversioned import binds to a
    symbol's default version too, so with named nodes the unversioned ones join the first; ld takes no anonymous
    node beside named ones."""
    named = sorted(n for n in symbols if n)
    if not named:
        if not symbols.get(""):
            return "{\n  local: *;\n};\n"
        return "{\n  global:\n" + "".join(f"    {s};\n" for s in sorted(symbols.get("", ()))) + "  local: *;\n};\n"
    groups = {n: set(symbols[n]) for n in named}
    groups[named[0]] |= set(symbols.get("", ())) - {s for g in groups.values() for s in g}
    return "".join(
        f"{node} {{\n  global:\n"
        + "".join(f"    {s};\n" for s in sorted(groups[node]))
        + ("  local: *;\n" if node == named[0] else "")
        + "};\n"
        for node in named
    )


def build(soname: str, symbols: dict[str, set[str]], dest: Path) -> Path:
    """Compile the stub of ``soname`` exporting ``symbols`` into ``dest/soname``."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise StubError("no C compiler (gcc) on this machine to build the lab's stub CUDA libraries")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ironserve-stub-") as tmp:
        src, script = Path(tmp) / "stub.c", Path(tmp) / "stub.map"
        src.write_text(c_source(soname, symbols))
        script.write_text(version_script(symbols))
        out = dest / soname
        proc = subprocess.run(
            [
                cc,
                "-shared",
                "-fPIC",
                "-O1",
                "-nostdlib",
                "-Wl,--build-id=none",
                f"-Wl,-soname,{soname}",
                f"-Wl,--version-script,{script}",
                "-o",
                str(out),
                str(src),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise StubError(f"building the stub {soname} failed: {proc.stderr[-2000:]}")
    return out


def elf_files_of(wheels: list[Path], dest: Path) -> list[Path]:
    """The shared objects of ``wheels`` extracted under ``dest`` (the inputs of :func:`imports`)."""
    files = []
    for whl in wheels:
        with zipfile.ZipFile(whl) as zf:
            for member in zf.namelist():
                if re.search(r"\.so(\.\d+)*$", member):
                    files.append(Path(zf.extract(member, dest / whl.stem)))
    return files
