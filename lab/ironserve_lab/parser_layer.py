"""The stand-in GPU images' venv layer: the CPU runtime's venv cut down to what SGLang's argument parser imports.

Lab only. A stand-in GPU image runs nothing but the deploy's parse check (the image's own SGLang parser) and the
recipes' image patches (``sed`` on SGLang's files, ``pip install``): nothing in it can drive a GPU. The CPU runtime's
venv also carries what serving on CPU needs (pandas, scipy, pyarrow, numba and llvmlite, the router, the grammar
backends, SGLang 0.5.23 itself, which the stand-ins shadow with their own release): 1.3 of its 3 GB, which every
GPU-profile host would pull for nothing.

What stays: the distributions the lint's parser venvs are built from (ironserve.engine_parser: what
``sglang.srt.server_args`` imports, with torch and the lab's import shims), and everything they require as the venv's
own metadata says (``Requires-Dist`` whose markers hold for the image's Python, extras not taken), with their files,
bytecode and scripts. What goes: every other distribution's files (its RECORD), their bytecode, and the directories
left empty (an empty ``pandas/`` would import as a namespace package). Files no distribution owns (the venv itself)
stay. So an import the parser does not make fails in a stand-in as a missing package, loudly.

The layer is the runtime layer's own tar records, copied byte for byte (owners, modes, mtimes unchanged), cached by
the runtime layer's digest.
"""

from __future__ import annotations

import csv
import email.parser
import hashlib
import json
import posixpath
import tarfile
import time
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ironserve import engine_parser

from . import cpu_runtime, oci
from .system import LabError, say

CUT_VERSION = "1"  # bump when what is kept changes: the cached layers are cut again
BLOCK = 512


def roots() -> list[str]:
    """The distributions a stand-in keeps with their requirements: the parser venvs' own, and the import shims."""
    return sorted({canonicalize_name(d) for d in [*engine_parser.parser_distributions(), cpu_runtime.SHIM_DIST]})


class _Venv:
    """What a venv layer's tar holds: its members in order, each distribution's requirements and files."""

    def __init__(self, tar: tarfile.TarFile):
        self.members: list[tarfile.TarInfo] = []
        metadata: dict[str, str] = {}  # dist-info directory -> METADATA text
        records: dict[str, str] = {}  # dist-info directory -> RECORD text
        self.python = ""
        for member in tar:
            self.members.append(member)
            name = posixpath.normpath(member.name)
            if name.endswith((".dist-info/METADATA", ".dist-info/RECORD")):
                text = tar.extractfile(member).read().decode("utf-8", "replace")
                (metadata if name.endswith("METADATA") else records)[posixpath.dirname(name)] = text
            elif name.endswith("/pyvenv.cfg"):
                self.python = _venv_python(tar.extractfile(member).read().decode())
        self.requires: dict[str, list[str]] = {}
        self.files: dict[str, set[str]] = {}
        for info_dir, text in metadata.items():
            headers = email.parser.Parser().parsestr(text, headersonly=True)
            dist = canonicalize_name(headers["Name"])
            self.requires[dist] = headers.get_all("Requires-Dist") or []
            site = posixpath.dirname(info_dir)
            rows = csv.reader(records.get(info_dir, "").splitlines())  # CSV: a path with a comma is quoted
            self.files[dist] = {posixpath.normpath(posixpath.join(site, row[0])) for row in rows if row}


def _venv_python(pyvenv_cfg: str) -> str:
    """The venv's Python version (``version = 3.11.2`` or ``version_info = 3.11.2.final.0``)."""
    for line in pyvenv_cfg.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            return ".".join(value.strip().split(".")[:3])
    return ""


def kept(venv: _Venv, wanted: list[str]) -> set[str]:
    """``wanted`` and everything it requires, as the venv's metadata says, for the venv's Python; no extras."""
    env = default_environment()
    if venv.python:
        env.update(python_full_version=venv.python, python_version=".".join(venv.python.split(".")[:2]))
    env["extra"] = ""
    keep: set[str] = set()
    todo = [d for d in wanted if d in venv.requires]
    while todo:
        dist = todo.pop()
        if dist in keep:
            continue
        keep.add(dist)
        for line in venv.requires[dist]:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate(env):
                todo.append(canonicalize_name(req.name))
    return keep & set(venv.requires)


def _bytecode_source(path: str) -> str | None:
    """``pkg/__pycache__/mod.cpython-311.pyc`` -> ``pkg/mod.py``; None for any other path."""
    head, sep, tail = path.rpartition("/__pycache__/")
    return f"{head}/{tail.split('.')[0]}.py" if sep and tail.endswith(".pyc") else None


def dropped(venv: _Venv, keep: set[str]) -> set[str]:
    """The member paths the cut leaves out: the other distributions' files and bytecode, and the directories they
    leave empty (a directory that was empty in the venv stays)."""
    gone = set().union(*(files for dist, files in venv.files.items() if dist not in keep))
    paths = [(posixpath.normpath(m.name), m.isdir()) for m in venv.members]
    gone |= {path for path, _ in paths if _bytecode_source(path) in gone}
    gone -= {posixpath.normpath(m.linkname) for m in venv.members if m.islnk()}  # a kept hard link's target stays
    had_children = {posixpath.dirname(path) for path, _ in paths}
    needed: set[str] = set()
    for path, is_dir in paths:
        if path in gone or (is_dir and path in had_children):
            continue
        while (path := posixpath.dirname(path)) not in needed and path not in ("", ".", "/"):
            needed.add(path)  # every directory above a kept file or a kept empty directory
    return gone | {path for path, is_dir in paths if is_dir and path in had_children and path not in needed}


def _kept_spans(venv: _Venv, gone: set[str], end: int) -> list[tuple[int, int]]:
    """The byte ranges of the kept members' tar records (headers, long-name headers and data), runs merged."""
    spans: list[tuple[int, int]] = []
    starts = [m.offset for m in venv.members] + [end]
    for member, start, stop in zip(venv.members, starts, starts[1:]):
        if member.issparse():
            raise LabError(f"{member.name}: a sparse member; the runtime layer is written without --sparse")
        if posixpath.normpath(member.name) in gone:
            continue
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], stop)
        else:
            spans.append((start, stop))
    return spans


def _last_record_end(member: tarfile.TarInfo) -> int:
    return member.offset_data + (-(-member.size // BLOCK) * BLOCK if member.isreg() else 0)


def _records(source: Path, spans: list[tuple[int, int]]):
    """``source``'s byte ranges, then GNU tar's end of archive (two zero blocks, padded to 10 KiB records)."""
    size = 0
    with open(source, "rb") as src:
        for start, stop in spans:
            src.seek(start)
            while start < stop and (chunk := src.read(min(oci.CHUNK, stop - start))):
                yield chunk
                start += len(chunk)
                size += len(chunk)
    yield bytes(2 * BLOCK + (-(size + 2 * BLOCK) % (20 * BLOCK)))


def cut(store: Path, layer: dict) -> dict:
    """The parser-only cut of the runtime's venv layer (cut once, cached): {digest, size, diff_id}."""
    key = hashlib.sha256(json.dumps([CUT_VERSION, layer["digest"], roots()]).encode()).hexdigest()[:16]
    record = store / "images" / f"parser-layer-{key}.json"
    try:
        found = json.loads(record.read_text())
        if oci.blob_path(store, found["digest"]).is_file():
            return found
    except (OSError, ValueError, KeyError):
        pass
    t0 = time.monotonic()
    source = oci.blob_path(store, layer["digest"])
    with tarfile.open(source, "r:") as tar:
        venv = _Venv(tar)
    keep = kept(venv, roots())
    missing = sorted(set(roots()) - keep)
    if missing:
        raise LabError(f"the CPU runtime's venv lacks {', '.join(missing)}, which SGLang's parser imports")
    gone = dropped(venv, keep)
    end = _last_record_end(venv.members[-1]) if venv.members else 0
    cut_layer = oci.put_layer(store, _records(source, _kept_spans(venv, gone, end)))
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(cut_layer) + "\n")
    say(
        f"stand-in images: the runtime venv cut to what SGLang's parser imports ({len(keep)} of "
        f"{len(venv.requires)} distributions, {cut_layer['size'] / 2**20:.0f} of {layer['size'] / 2**20:.0f} MiB) "
        f"in {time.monotonic() - t0:.0f}s"
    )
    return cut_layer
