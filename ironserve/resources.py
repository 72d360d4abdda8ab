"""Where the project's own data is: the checkout's directories, or the copies an installed wheel carries.

The roles put files/ on hosts (helper scripts, the NCCL graph, the GPU clock script) and render units from it
(jinja2 templates); the catalogue (recipes/: recipes, hardware profiles, defaults) is what every command reads;
deploys/ are the entry points `ironserve init` copies into a project. A wheel carries them as ironserve/_files,
ironserve/_catalogue and ironserve/_deploys (pyproject.toml); a checkout has none of those, and its own
directories are used.
"""

from __future__ import annotations

import shutil
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _packaged(name: str, checkout: str) -> Path:
    packaged = _PACKAGE / name
    return packaged if packaged.is_dir() else _PACKAGE.parent / checkout


def files_dir() -> Path:
    return _packaged("_files", "files")


def catalogue_dir() -> Path:
    """The built-in catalogue: recipes/*.yaml, hardware.yaml, defaults.yaml."""
    return _packaged("_catalogue", "recipes")


def deploys_dir() -> Path:
    return _packaged("_deploys", "deploys")


def project_file(path: str) -> Path:
    """A path as recipes write it, relative to the checkout ("files/nccl/..."), as a path on this machine."""
    parts = Path(path).parts
    if parts and parts[0] == "files":
        return files_dir().joinpath(*parts[1:])
    return _PACKAGE.parent / path


def uv_binary() -> str | None:
    """uv on PATH, else the one the `uv` package installed beside ironserve (a dependency), else a usual place."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return next((str(p) for p in (Path.home() / ".local/bin/uv", Path("/usr/local/bin/uv")) if p.is_file()), None)


def version() -> str:
    """The installed distribution's version (the checkout's pyproject when run from one without installing)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("ironserve")
    except PackageNotFoundError:
        from . import __version__

        return __version__
