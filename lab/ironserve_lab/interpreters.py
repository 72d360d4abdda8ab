"""Python interpreters for air-gapped lab hosts: this machine's CPython builds, packaged as uv's managed Pythons.

Recipes of seed 003 run ``uv venv --python 3.12``; the lab hosts run Debian bookworm (Python 3.11), have no way to
the internet, and Debian has no 3.12. This machine has a CPython 3.12 built for the same Debian (pyenv's, under
``$IRONSERVE_PYTHONS`` or ``/root/.pyenv/versions``). The lab packages it in the layout of uv's ``install_only``
archives (a top-level ``python/`` with ``bin/`` and ``lib/``) and writes a download list in uv's format (URL and
sha256 of each archive) next to it on the lab bridge; a host finds it through the production host-data option
``uv_python_downloads_json_url`` (UV_PYTHON_DOWNLOADS_JSON_URL), as a cluster would name its own builds.

pyenv builds with ``--enable-shared`` and an absolute RPATH to its prefix; the archive's interpreter gets
``$ORIGIN/../lib`` instead (written in place, same length padded with NULs), as python-build-standalone's have, so
it runs wherever uv unpacks it. The test suite of the standard library and pyenv's site-packages are left out.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from pathlib import Path

PYTHONS_DIR = Path(os.environ.get("IRONSERVE_PYTHONS", "/root/.pyenv/versions"))
LIST_NAME = "downloads.json"


class InterpreterError(RuntimeError):
    pass


def find_build(minor: str, root: Path | None = None) -> Path | None:
    """The newest ``<root>/3.12.N`` prefix holding a runnable ``bin/python3.12``, None when there is none."""
    root = root or PYTHONS_DIR
    found = []
    for prefix in root.glob(f"{minor}.*"):
        m = re.fullmatch(rf"{re.escape(minor)}\.(\d+)", prefix.name)
        if m and (prefix / "bin" / f"python{minor}").is_file():
            found.append((int(m.group(1)), prefix))
    return max(found)[1] if found else None


def _relocated(binary: bytes, prefix: Path) -> bytes:
    old = f"{prefix}/lib".encode()
    new = b"$ORIGIN/../lib"
    if old + b"\0" not in binary:
        return binary  # no absolute RPATH: already relocatable
    return binary.replace(old + b"\0", new + b"\0" * (len(old) - len(new) + 1))


def archive(prefix: Path, dest: Path) -> Path:
    """``cpython-<version>-ironserve-install_only.tar.gz`` of ``prefix`` into ``dest`` (kept when present)."""
    version = prefix.name
    target = dest / f"cpython-{version}-ironserve-install_only.tar.gz"
    if target.is_file():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    minor = ".".join(version.split(".")[:2])
    interpreter = f"bin/python{minor}"
    # the standard library's own tests, and whatever pyenv installed into site-packages (the dir itself stays)
    skipped = (f"lib/python{minor}/test/", f"lib/python{minor}/site-packages/")
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    # gzip's fastest level: the archive crosses the lab's own bridge, and level 6 took 12 s of one core here
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        for path in sorted(prefix.rglob("*")):
            rel = path.relative_to(prefix).as_posix()
            if rel.startswith(skipped) or rel == skipped[0].rstrip("/"):
                continue
            info = tar.gettarinfo(str(path), f"python/{rel}")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if rel == interpreter:
                data = _relocated(path.read_bytes(), prefix)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            elif info.isfile():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    os.replace(tmp, target)
    return target


def download_entry(version: str, url: str, sha256: str) -> tuple[str, dict]:
    major, minor, patch = (int(x) for x in version.split("."))
    key = f"cpython-{version}-linux-x86_64-gnu"
    return key, {
        "name": "cpython",
        "arch": {"family": "x86_64", "variant": None},
        "os": "linux",
        "libc": "gnu",
        "major": major,
        "minor": minor,
        "patch": patch,
        "prerelease": "",
        "url": url,
        "sha256": sha256,
        "variant": None,
        "build": "ironserve-lab",
    }


def publish(dest: Path, base_url: str, cache: Path, minors: tuple[str, ...] = ("3.12",)) -> dict[str, str]:
    """Archives of this machine's builds of ``minors`` and uv's download list into ``dest``; {minor: version} of
    those published (a minor with no build here is left out: the recipes that need it say so)."""
    dest.mkdir(parents=True, exist_ok=True)
    entries, published = {}, {}
    for minor in minors:
        prefix = find_build(minor)
        if not prefix:
            continue
        tarball = archive(prefix, cache)
        if not (dest / tarball.name).is_file() or (dest / tarball.name).stat().st_size != tarball.stat().st_size:
            shutil.copy2(tarball, dest / tarball.name)
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        key, entry = download_entry(prefix.name, f"{base_url.rstrip('/')}/{tarball.name}", digest)
        entries[key] = entry
        published[minor] = prefix.name
    (dest / LIST_NAME).write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    return published
