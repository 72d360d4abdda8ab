"""The recipe catalogue: recipes/*.yaml and recipes/hardware.yaml, loaded and cross-checked.

Bad input is reported as a SpecError naming the file, the field path and a fix, before anything else runs.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from .commandline import SECRET_FLAGS, SECRET_NAME, SECRET_VALUE
from .spec import RANK_GUARD_PORT_OFFSET, DockerRuntime, HardwareProfile, Recipe, devices_per_node, effective_tuning

REPO_ROOT = Path(__file__).resolve().parent.parent


def recipes_dir() -> Path:
    return Path(os.environ.get("IRONSERVE_RECIPES", REPO_ROOT / "recipes"))


@dataclass
class Problem:
    file: str
    field: str
    message: str
    fix: str

    def line(self) -> str:
        field = f" {self.field}:" if self.field else ""
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.file}:{field} {self.message}.{fix}"


class SpecError(Exception):
    """Bad recipe, hardware profile or inventory data. Carries every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(p.line() for p in problems))


def _allowed_keys(model: type[BaseModel], path: tuple) -> list[str]:
    """Walk the model along a field path to list the keys valid where a typo was made."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None or isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_of(field.annotation)
    return list(current.model_fields) if current else []


def _model_of(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found:
            return found
    return None


def problems_from_validation(file: str, model: type[BaseModel], err: ValidationError) -> list[Problem]:
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p in ("docker", "uv")))
        field = ".".join(str(p) for p in loc)
        if e["type"] == "extra_forbidden":
            key = str(loc[-1])
            allowed = _allowed_keys(model, loc[:-1])
            close = difflib.get_close_matches(key, allowed, n=1)
            fix = f"did you mean '{close[0]}'?" if close else f"remove it; valid keys: {', '.join(allowed)}"
            out.append(Problem(file, field, f"unknown key '{key}'", fix))
        elif e["type"] == "missing":
            out.append(Problem(file, field, "required field is missing", f"add '{loc[-1]}'"))
        else:
            msg = e["msg"].removeprefix("Value error, ")
            given = e.get("input")
            fix = "give a value of the expected type"
            if e["type"].startswith(("int_", "float_", "bool_", "string_")):
                fix = f"got {given!r}; {msg.lower()}"
            elif e["type"] == "literal_error":
                fix = f"got {given!r}; use one of the allowed values"
            elif e["type"] == "value_error":
                fix = "see the message"
            out.append(Problem(file, field, msg, fix))
    return out


def _load_yaml(path: Path):
    try:
        # the C loader when PyYAML has it: the catalogue loads on every CLI call
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise SpecError([Problem(str(path), where, f"not valid YAML ({getattr(exc, 'problem', exc)})", "fix the syntax")])
    except OSError as exc:
        raise SpecError([Problem(str(path), "", f"cannot read ({exc.strerror})", "check the path")])


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_hardware(path: Path | None = None) -> dict[str, HardwareProfile]:
    path = path or recipes_dir() / "hardware.yaml"
    data = _load_yaml(path)
    problems: list[Problem] = []
    profiles: dict[str, HardwareProfile] = {}
    for i, item in enumerate((data or {}).get("profiles", [])):
        try:
            profile = HardwareProfile.model_validate(item)
        except ValidationError as err:
            for p in problems_from_validation(_display(path), HardwareProfile, err):
                p.field = f"profiles[{i}].{p.field}"
                problems.append(p)
            continue
        profiles[profile.id] = profile
    if problems:
        raise SpecError(problems)
    return profiles


def parse_recipe(data, file: str) -> Recipe:
    if not isinstance(data, dict):
        raise SpecError([Problem(file, "", "a recipe is a YAML mapping", "start the file with 'id: ...'")])
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise SpecError(problems_from_validation(file, Recipe, err))


def load_recipe_file(path: Path, hardware: dict[str, HardwareProfile] | None = None) -> Recipe:
    recipe = parse_recipe(_load_yaml(path), _display(path))
    check_recipe(recipe, hardware if hardware is not None else load_hardware(), _display(path))
    return recipe


def check_recipe(recipe: Recipe, hardware: dict[str, HardwareProfile], file: str) -> None:
    """Cross-field checks the schema cannot express: hardware ids, devices per node, file name."""
    problems: list[Problem] = []
    if Path(file).suffix in (".yaml", ".yml") and Path(file).stem != recipe.id:
        problems.append(Problem(file, "id", f"id '{recipe.id}' differs from the file name", f"rename to {recipe.id}.yaml"))
    for i, hw in enumerate(recipe.hardware):
        if hw not in hardware:
            close = difflib.get_close_matches(hw, list(hardware), n=1)
            fix = f"did you mean '{close[0]}'?" if close else f"one of: {', '.join(hardware)}"
            problems.append(Problem(file, f"hardware[{i}]", f"unknown hardware profile '{hw}'", fix))
    known = [hardware[h] for h in recipe.hardware if h in hardware]
    for gi, group in enumerate(recipe.topology.groups):
        server = recipe.group_server(group)
        need = devices_per_node(server, group.nodes)
        # DP without DP attention runs dp_size copies of the TP group (see spec.devices_per_node)
        dp_factor = 1 if server.enable_dp_attention else (server.dp_size or 1)
        dp = f" x dp_size {dp_factor}" if dp_factor > 1 else ""
        for profile in known:
            have = profile.accelerator.count
            if profile.accelerator.vendor != "none" and need > have:
                field = f"topology.groups[{gi}].server.tp_size" if group.server.tp_size else "server.tp_size"
                problems.append(
                    Problem(
                        file,
                        field,
                        f"tp_size {server.tp_size} x pp_size {server.pp_size or 1}{dp} over {group.nodes} node(s) "
                        f"needs {need} devices per node; {profile.id} has {have}",
                        f"lower tp_size to at most {have * group.nodes // (server.pp_size or 1) // dp_factor} or "
                        f"raise nodes to {-(-need * group.nodes // have)}",
                    )
                )
    problems += _memlock_problems(recipe, known, file)
    problems += _rank_guard_port_problems(recipe, file)
    problems += _literal_secret_problems(recipe, file)
    if problems:
        raise SpecError(problems)


def _literal_secret_problems(recipe: Recipe, file: str) -> list[Problem]:
    """A secret written into the recipe (a key after --api-key, a token in env) would reach argv, unit files and
    every copy of the catalogue: an error, before anything renders. Names only, never the value."""
    out = []
    args = [("server.extra_args", recipe.server.extra_args)]
    args += [(f"topology.groups[{i}].server.extra_args", g.server.extra_args) for i, g in enumerate(recipe.topology.groups)]
    if recipe.topology.router:
        args.append(("topology.router.extra_args", recipe.topology.router.extra_args))
    for where, extra in args:
        for flag in SECRET_FLAGS:
            if any(a == flag or a.startswith(f"{flag}=") for a in extra):
                out.append(Problem(file, where, f"{flag} with a literal key: it would reach argv, the unit file and ps",
                                   "remove it; set server.api_key_file (a 0600 file on the host) or host data "
                                   "api_key_file"))
    envs = [("env", recipe.env)] + [(f"topology.groups[{i}].env", g.env) for i, g in enumerate(recipe.topology.groups)]
    for where, env in envs:
        for key, value in env.items():
            if (SECRET_NAME.search(key) and value and not value.startswith("<")) or SECRET_VALUE.match(value or ""):
                out.append(Problem(file, f"{where}.{key}", "holds a literal secret (value not shown)",
                                   f"remove {key}; keep it in a 0600 file (the hub token: host data hf_token_file)"))
    return out


def _rank_guard_port_problems(recipe: Recipe, file: str) -> list[Problem]:
    """Rank 0 of a multi-node group also listens on its rank guard's port (dist-init + 100, see
    ironserve/units.py): it must not be a port the deployment already uses."""
    taken = {recipe.server.port or 30000: "server.port"}
    if recipe.topology.router:
        taken[recipe.topology.router.port] = "topology.router.port"
    for gi, group in enumerate(recipe.topology.groups):
        taken[recipe.group_server(group).port or 30000] = f"topology.groups[{gi}] server port"
        if group.bootstrap_port:
            for i in range(group.instances):
                taken[group.bootstrap_port + i] = f"topology.groups[{gi}].bootstrap_port"
    problems = []
    for gi, group in enumerate(recipe.topology.groups):
        guard = group.dist_init_port + RANK_GUARD_PORT_OFFSET
        if group.nodes > 1 and guard in taken:
            problems.append(Problem(file, f"topology.groups[{gi}].dist_init_port",
                                    f"the rank guard's port {guard} (dist_init_port + {RANK_GUARD_PORT_OFFSET}) is "
                                    f"{taken[guard]}", f"pick a dist_init_port whose + {RANK_GUARD_PORT_OFFSET} is free"))
    return problems


def _memlock_problems(recipe: Recipe, profiles: list[HardwareProfile], file: str) -> list[Problem]:
    """A container's locked-memory limit is docker's --ulimit, not the unit's LimitMEMLOCK: when the hardware's
    tuning asks for unlimited (pinned NCCL/HCCL buffers), the recipe's docker run must say so (the seeds'
    --ulimit memlock=-1)."""
    runtime = recipe.runtime
    if not isinstance(runtime, DockerRuntime) or str(runtime.run.ulimits.get("memlock", "")) in ("-1", "unlimited"):
        return []
    wanting = [p.id for p in profiles if effective_tuning(recipe, p).limits.memlock == "unlimited"]
    if not wanting:
        return []
    return [Problem(file, "runtime.run.ulimits.memlock", f"{', '.join(wanting)} needs unlimited locked memory "
                    "inside the container", "add memlock: -1 to runtime.run.ulimits (docker --ulimit memlock=-1)")]


@functools.lru_cache(maxsize=1)
def _catalogue_cached(root: str) -> tuple[dict[str, Recipe], dict[str, HardwareProfile]]:
    base = Path(root)
    hardware = load_hardware(base / "hardware.yaml")
    recipes: dict[str, Recipe] = {}
    problems: list[Problem] = []
    for path in sorted(base.glob("*.yaml")):
        if path.name in ("hardware.yaml", "defaults.yaml"):
            continue
        try:
            recipe = load_recipe_file(path, hardware)
        except SpecError as err:
            problems.extend(err.problems)
            continue
        recipes[recipe.id] = recipe
    if problems:
        raise SpecError(problems)
    return recipes, hardware


def catalogue() -> dict[str, Recipe]:
    return _catalogue_cached(str(recipes_dir()))[0]


def hardware_profiles() -> dict[str, HardwareProfile]:
    return _catalogue_cached(str(recipes_dir()))[1]


def get_recipe(ref: str) -> Recipe:
    """A recipe by id, or by path to a YAML file outside the catalogue."""
    path = Path(ref)
    if ref.endswith((".yaml", ".yml")) or path.exists():
        return load_recipe_file(path, hardware_profiles())
    recipes = catalogue()
    if ref not in recipes:
        close = difflib.get_close_matches(ref, list(recipes), n=3)
        fix = f"did you mean {', '.join(close)}?" if close else "run 'ironserve render --list' for the ids"
        raise SpecError([Problem(str(recipes_dir()), "id", f"no recipe '{ref}'", fix)])
    return recipes[ref]


def default_recipe(model: str, hardware: str) -> Recipe:
    """The catalogue's default recipe for a model family on a hardware profile (recipes/defaults.yaml)."""
    path = recipes_dir() / "defaults.yaml"
    data = _load_yaml(path) or {}
    models = data.get("defaults", {})
    if model not in models:
        raise SpecError([Problem(_display(path), "defaults", f"no model '{model}'", f"one of: {', '.join(models)}")])
    per_hw = models[model]
    if hardware not in per_hw:
        raise SpecError(
            [
                Problem(
                    _display(path),
                    f"defaults.{model}",
                    f"no default recipe for hardware '{hardware}'",
                    f"pick one with --data recipe=ID, or use hardware {', '.join(per_hw)}",
                )
            ]
        )
    return get_recipe(per_hw[hardware])
