"""Where the project's own static files are: files/ of the checkout, or the copy an installed wheel carries.

The roles put these on hosts (helper scripts, the NCCL graph, the GPU clock script) and render units from them
(jinja2 templates). A wheel carries files/ as ironserve/_files (pyproject.toml); a checkout has none there.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def files_dir() -> Path:
    packaged = _PACKAGE / "_files"
    return packaged if packaged.is_dir() else _PACKAGE.parent / "files"


def project_file(path: str) -> Path:
    """A path as recipes write it, relative to the checkout ("files/nccl/..."), as a path on this machine."""
    parts = Path(path).parts
    if parts and parts[0] == "files":
        return files_dir().joinpath(*parts[1:])
    return _PACKAGE.parent / path
