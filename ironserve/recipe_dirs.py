"""Where recipes come from: the built-in catalogue, then the site's directories layered over it.

Its own small module (the standard library, resources and problems only), so that a command can find the
catalogue's files without importing pydantic and the recipe models: `render --list` answers from a validated
index of them (catalogue_index).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import resources
from .problems import Problem, SpecError

SITE_DIR = "recipes"  # a project's own recipes and profiles, beside its inventory (`ironserve init` makes it)
_given_dirs: list[Path] = []  # --recipes DIR


def recipes_dir() -> Path:
    """The built-in catalogue (IRONSERVE_CATALOGUE replaces it, e.g. for a modified copy in a test)."""
    return Path(os.environ.get("IRONSERVE_CATALOGUE") or resources.catalogue_dir())


def use_recipe_dirs(dirs: list[str]) -> None:
    """Site recipe directories named on the command line (--recipes DIR), layered like IRONSERVE_RECIPES."""
    _given_dirs[:] = [Path(d) for d in dirs]


def recipe_dirs() -> tuple[Path, ...]:
    """The catalogue first, then the site's directories layered over it: IRONSERVE_RECIPES (os.pathsep-separated),
    --recipes DIR, and the project's recipes/ (of the working directory, when it has one). Each may hold recipes,
    a hardware.yaml and a defaults.yaml; an id defined twice is an error (catalogue's clash_problem)."""
    base = recipes_dir()
    named = [Path(p) for p in os.environ.get("IRONSERVE_RECIPES", "").split(os.pathsep) if p] + _given_dirs
    for d in named:
        if not d.is_dir():
            raise SpecError(
                [
                    Problem(
                        str(d),
                        "",
                        "recipe directory not found",
                        "give a directory of recipe YAML files (IRONSERVE_RECIPES or --recipes), or create it",
                    )
                ]
            )
    out = [base.resolve()]
    builtin = resources.catalogue_dir().resolve()  # a checkout's recipes/ is the catalogue, even when replaced
    for d in named + [Path(SITE_DIR)]:
        if d.is_dir() and d.resolve() not in out and d.resolve() != builtin:
            out.append(d.resolve())
    return tuple(out)
