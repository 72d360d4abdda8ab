"""The catalogue's listing (`render --list`: id, hardware, description), validated once and remembered.

Listing must still refuse a broken catalogue: the rows come from the fully validated catalogue (catalogue.py:
every recipe through the pydantic models and the cross-field checks), which costs most of a second of CPU. They
are kept in the user's cache, keyed by a digest of everything that decides the outcome: the layered directories
and every file in them (recipes, hardware.yaml, defaults.yaml, lock files; by content), the Python and the code
that validates (ironserve's and pydantic's modules, by size and time). While none of that changes, the listing
is read back without importing pydantic, yaml or the models; any change (a recipe edited, a site directory
added) validates again, and a catalogue that fails validation is never remembered.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib.util import find_spec
from pathlib import Path

from .recipe_dirs import recipe_dirs

KEEP = 16  # remembered listings (one per state of the catalogue: worktrees, site directories)
Row = tuple[str, list[str], str]  # recipe id, hardware profiles, description


def cache_dir() -> Path:
    return Path(os.environ.get("IRONSERVE_CACHE") or Path.home() / ".cache" / "ironserve") / "catalogue-index"


def _code_files() -> list[Path]:
    """The modules whose behaviour decides validation: ironserve's own and pydantic's (pydantic_core is pinned
    by pydantic's version)."""
    files = sorted(Path(__file__).parent.glob("*.py"))
    spec = find_spec("pydantic")
    if spec and spec.origin:
        files.append(Path(spec.origin).with_name("version.py"))
    return files


def fingerprint(dirs: tuple[Path, ...]) -> str:
    digest = hashlib.blake2b(sys.version.encode(), digest_size=20)
    for path in _code_files():
        st = path.stat()
        digest.update(f"\0code {path} {st.st_size} {st.st_mtime_ns}".encode())
    for d in dirs:
        digest.update(f"\0dir {d}".encode())
        for entry in sorted(os.scandir(d), key=lambda e: e.name):
            if entry.is_file():  # follows links, as the catalogue's reads do
                digest.update(f"\0file {entry.name}\0".encode())
                digest.update(Path(entry.path).read_bytes())
    return digest.hexdigest()


def _remembered(path: Path) -> list[Row] | None:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(rows, list) and all(
        isinstance(r, list)
        and len(r) == 3
        and isinstance(r[0], str)
        and isinstance(r[1], list)
        and isinstance(r[2], str)
        for r in rows
    )
    return [(r[0], r[1], r[2]) for r in rows] if ok else None


def _remember(path: Path, rows: list[Row]) -> None:
    """Written atomically (a reader sees the old listing or the new); a cache that cannot be written is skipped."""
    import tempfile  # only on a miss, which validated the whole catalogue anyway

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as fh:
            json.dump(rows, fh)
        os.replace(tmp, path)
        older = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)[KEEP:]
        for old in older:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def listing() -> list[Row]:
    """Every recipe of the layered catalogue, by id; a SpecError (exit 2) when any of it is refused."""
    dirs = recipe_dirs()
    path = cache_dir() / f"{fingerprint(dirs)}.json"
    rows = _remembered(path)
    if rows is not None:
        return rows
    from . import catalogue

    built = catalogue._catalogue_cached.cache_info().misses
    recipes = catalogue.catalogue()
    rows = [(rid, list(r.hardware), r.description) for rid, r in sorted(recipes.items())]
    # remembered only when validated just now: one built earlier in this process predates edits made since
    if catalogue._catalogue_cached.cache_info().misses > built:
        _remember(path, rows)
    return rows
