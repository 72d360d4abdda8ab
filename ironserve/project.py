"""`ironserve init DIR`: a project a site starts from and runs as is.

It holds an inventory with comments, group_data/all.py with the keys most sites set, one deploy per model family
(the package's deploys/), and a recipes/ directory for the site's own recipes, profiles and defaults, which every
command run from the project layers over the catalogue (ironserve/catalogue.py). Nothing is overwritten: a file
that is already there is an error naming it.
"""

from __future__ import annotations

from pathlib import Path

from . import resources
from .problems import Problem, SpecError

TEMPLATE = Path(__file__).resolve().parent / "project_template"


def project_files() -> dict[str, bytes]:
    """Relative path -> content of every file init writes."""
    out = {
        str(p.relative_to(TEMPLATE)): p.read_bytes()
        for p in sorted(TEMPLATE.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }
    for deploy in sorted(resources.deploys_dir().glob("*.py")):
        out[f"deploys/{deploy.name}"] = deploy.read_bytes()
    return out


def init_project(directory: str) -> list[Path]:
    """Write the project into ``directory`` (created; it may exist but must not hold any of the files)."""
    root = Path(directory)
    files = project_files()
    present = [name for name in files if (root / name).exists() or (root / name).is_symlink()]
    if present:
        raise SpecError(
            [
                Problem(
                    str(root / present[0]),
                    "",
                    f"already exists ({len(present)} of the project's files are there)",
                    "init a new directory, or move those files away",
                )
            ]
        )
    if root.exists() and not root.is_dir():
        raise SpecError([Problem(str(root), "", "is not a directory", "give a directory to create")])
    written = []
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as fh:  # never through a link or over a file that appeared meanwhile
            fh.write(content)
        written.append(path)
    return written
