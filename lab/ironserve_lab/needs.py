"""What a bring-up builds: everything a hardware profile's recipes may need, or only what the deploys named need.

``lab up --for NAME`` (repeatable) names what the lab is for: a recipe ID, a model family (its catalogue default
for the lab's hardware, recipes/defaults.yaml) or a deploy file (``deploys/glm5.py``: the family it deploys). The
bring-up then builds only the runtimes, the CPU runtime or parser image and the stand-in GPU images those recipes
use, and says what it leaves out; without ``--for``, everything the profile's recipes use, as before. What a lab was
brought up for is kept in its state and shown by ``lab status``; a later ``up`` adds what it is asked for (the
supply and the registry keep what they hold).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from .profiles import PROFILES
from .system import LabError


@dataclass(frozen=True)
class Needs:
    """The recipes a bring-up builds for (``everything``: every recipe of the profile, named or not)."""

    hardware: str
    recipes: tuple = ()
    everything: bool = True

    def uses(self, recipe) -> bool:
        return self.hardware in recipe.hardware and (self.everything or recipe.id in self.ids())

    def ids(self) -> list[str]:
        return [r.id for r in self.recipes]

    def runtime(self, runtime) -> bool:
        """A runtime's wheelhouse: for the profile's hosts, when some recipe built for installs with uv."""
        if self.hardware not in runtime.hardware:
            return False
        return self.everything or any(r.runtime.kind == "uv" for r in self.recipes)

    def runtime_image(self) -> bool:
        """An image of the CPU runtime's pins: cpu-lab's docker recipes run the runtime image, the stand-in GPU
        images are built on the parser image (runtime_image.PARSER)."""
        if PROFILES[self.hardware]["kind"] not in ("none", "nvidia"):
            return False
        return self.everything or any(r.runtime.kind == "docker" for r in self.recipes)


def resolve(hardware: str, names: list[str]) -> Needs:
    """The Needs of ``names`` on ``hardware`` (none named: everything); LabError naming a name that is none of a
    recipe, a model family with a default for the hardware, or a deploy file."""
    if not names:
        return Needs(hardware)
    recipes = {}
    for name in names:
        recipe = _recipe(hardware, name)
        if hardware not in recipe.hardware:
            raise LabError(
                f"--for {name}: recipe {recipe.id} is for {', '.join(recipe.hardware)}, not this lab's {hardware} "
                f"(fix: --hardware {recipe.hardware[0]}, or name a recipe for {hardware})"
            )
        recipes[recipe.id] = recipe
    return Needs(hardware, tuple(recipes.values()), everything=False)


def _recipe(hardware: str, name: str):
    from ironserve import catalogue
    from ironserve.problems import SpecError

    family = deployed_family(Path(name)) if name.endswith(".py") else name
    try:
        if family in catalogue.catalogue():
            return catalogue.get_recipe(family)
        return catalogue.default_recipe(family, hardware)
    except SpecError as exc:
        raise LabError(f"--for {name}: neither a recipe ID nor a model family with a {hardware} recipe: {exc}") from exc


def deployed_family(path: Path) -> str:
    """The model family a deploy file deploys: the string its ``deploy_model("...")`` call names."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError) as exc:
        raise LabError(f"--for {path}: cannot read the deploy file ({exc})") from exc
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) == "deploy_model"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            return node.args[0].value
    raise LabError(f'--for {path}: no deploy_model("FAMILY") call in it; name the recipe ID instead')
