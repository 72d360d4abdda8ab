"""A copy of the catalogue for a test to write into (lock files, edited recipes), pointed at with
IRONSERVE_CATALOGUE: the checkout's recipes/ stays as it is, for the tests running beside it too, and lock files a
user's `ironserve lock` or a lab run left there are not copied."""

from __future__ import annotations

import shutil
from pathlib import Path

CATALOGUE = Path(__file__).resolve().parents[1] / "recipes"


def unlocked_catalogue(parent: Path) -> Path:
    """``parent``/recipes: the catalogue without its lock files."""
    dest = parent / "recipes"
    shutil.copytree(CATALOGUE, dest, ignore=shutil.ignore_patterns("*.lock.json"))
    return dest
