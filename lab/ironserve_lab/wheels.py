"""Stand-in wheels: the real names, versions and dependencies of builds no machine here can use (CUDA, NPU).

A stand-in wheel carries the published metadata of its distribution (``Name``, ``Version``, ``Requires-Dist``,
``Requires-Python``) and an importable placeholder package, nothing else: a resolver sees exactly what it sees on
the real index, so a pin set that does not resolve there does not resolve against the lab's index either, and an
install that needs a missing dependency fails the same way. Byte-stable (fixed timestamps), stdlib only.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_name(name: str, version: str, tag: str = "py3-none-any") -> str:
    return f"{re.sub(r'[-_.]+', '_', name)}-{version}-{tag}.whl"


def metadata_text(name: str, version: str, summary: str, requires_python: str | None, requires: list[str]) -> str:
    """METADATA of a stand-in: the published Requires-Python and Requires-Dist, a Provides-Extra for each extra its
    markers name (``extra == "x"`` or ``extra == 'x'``)."""
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}"]
    lines += [f"Requires-Python: {requires_python}"] if requires_python else []
    extras = sorted({m for r in requires for m in re.findall(r"extra == [\"']([^\"']+)[\"']", r)})
    lines += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    return "\n".join(lines) + "\n"


def write_wheel(
    dest: str | os.PathLike,
    name: str,
    version: str,
    members: dict[str, bytes],
    metadata: str,
    top_level: list[str],
    tag: str = "py3-none-any",
    generator: str = "ironserve_lab.wheels",
) -> Path:
    """Write a wheel of ``members`` ({path in the wheel: bytes}) with its dist-info (METADATA text as given, WHEEL,
    top_level.txt, RECORD), byte-stable, atomically (a temporary file renamed into place)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    dist_info = f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    members = dict(members)
    members[f"{dist_info}/METADATA"] = metadata.encode()
    members[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: {generator}\nRoot-Is-Purelib: true\nTag: {tag}\n"
    ).encode()
    members[f"{dist_info}/top_level.txt"] = "".join(f"{t}\n" for t in top_level).encode()
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in members.items()) + f"{dist_info}/RECORD,,\n"
    members[f"{dist_info}/RECORD"] = record.encode()
    target = dest / wheel_name(name, version, tag)
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    os.replace(tmp, target)
    return target


def build_wheel(
    dest: str | os.PathLike,
    name: str,
    version: str,
    requires: list[str] | tuple = (),
    requires_python: str | None = None,
    tag: str = "py3-none-any",
    package: str | None = None,
    files: dict[str, bytes] | None = None,
) -> Path:
    """A stand-in wheel of ``name`` ``version`` whose metadata requires ``requires`` (PEP 508 strings, markers
    included). ``package`` is the import name of its placeholder module (default: the name with ``_``); ``files``
    adds or replaces files ({path in the wheel: bytes})."""
    module = package or re.sub(r"[-_.]+", "_", name).lower()
    members: dict[str, bytes] = {
        f"{module}/__init__.py": (
            f'"""ironserve lab stand-in of {name} {version}: its metadata, none of its code."""\n'
            f"__version__ = {version!r}\n"
        ).encode(),
    }
    members.update(files or {})
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: ironserve lab stand-in of {name} (real metadata, no code)",
    ]
    if requires_python:
        metadata.append(f"Requires-Python: {requires_python}")
    metadata += [f"Requires-Dist: {r}" for r in requires]
    return write_wheel(dest, name, version, members, "\n".join(metadata) + "\n", [module], tag)


def rebrand_wheel(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    name: str,
    version: str,
    metadata: str,
    tag: str,
    generator: str = "ironserve_lab.wheels",
) -> Path:
    """A wheel with the files of the wheel ``src`` under another distribution's metadata (``name`` ``version``,
    METADATA text as given): a stand-in that runs the code of the nearest build this machine can run. The
    source's own dist-info is left out (its entry points kept), the RECORD written anew. Streams member by member
    (a CPU torch is ~800 MB unpacked) at a fast compression level; atomic like :func:`write_wheel`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    dist_info = f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    target = dest / wheel_name(name, version, tag)
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    records, top_level = [], set()

    def add(zout: zipfile.ZipFile, member: str, data: bytes, mode: int = 0o644) -> None:
        info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = mode << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zout.writestr(info, data, compresslevel=1)
        records.append(f"{member},{_record_hash(data)},{len(data)}\n")

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w") as zout:
        entry_points = None
        for item in zin.infolist():
            if item.is_dir():
                continue
            head = item.filename.split("/", 1)[0]
            if head.endswith(".dist-info"):
                if item.filename.endswith("/entry_points.txt"):
                    entry_points = zin.read(item)
                continue
            top_level.add(head.split(".", 1)[0] if "/" not in item.filename else head)
            add(zout, item.filename, zin.read(item), (item.external_attr >> 16) & 0o777 or 0o644)
        add(zout, f"{dist_info}/METADATA", metadata.encode())
        add(
            zout,
            f"{dist_info}/WHEEL",
            (f"Wheel-Version: 1.0\nGenerator: {generator}\nRoot-Is-Purelib: false\nTag: {tag}\n").encode(),
        )
        add(zout, f"{dist_info}/top_level.txt", "".join(f"{t}\n" for t in sorted(top_level)).encode())
        if entry_points is not None:
            add(zout, f"{dist_info}/entry_points.txt", entry_points)
        record = "".join(records) + f"{dist_info}/RECORD,,\n"
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zout.writestr(info, record.encode())
    os.replace(tmp, target)
    return target
