"""The lab's pins: requirements files in requirements/ (one requirement a line, ``#`` comments), read at run time.

A runtime's file is what its hosts resolve to (the ``uv pip compile`` in its header), so new pins are new data, not
code; the recipes that install a runtime carry the same pins (tests check them equal).
"""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).with_name("requirements")


def commented(name: str) -> dict[str, str]:
    """{requirement: its comment ("" when none)} of requirements/NAME, in the file's order (an excludes file says
    there why each name is left out)."""
    out = {}
    for line in (DIR / name).read_text().splitlines():
        requirement, _, comment = line.partition("#")
        if requirement.strip():
            out[requirement.strip()] = comment.strip()
    return out


def read(name: str) -> list[str]:
    """The requirements of requirements/NAME, in the file's order."""
    return list(commented(name))


def version(pins: list[str], name: str) -> str:
    """The version ``pins`` pin ``name`` to (``name==VERSION``)."""
    for pin in pins:
        pinned, sep, found = pin.partition("==")
        if sep and pinned == name:
            return found
    raise KeyError(f"no {name}==VERSION among the pins")
