"""The recipe catalogue: recipes/*.yaml and recipes/hardware.yaml, loaded and cross-checked.

Bad input is reported as a SpecError naming the file, the field path and a fix, before anything else runs.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from . import imagelock
from .commandline import SECRET_FLAGS, SECRET_NAME, SECRET_VALUE
from .problems import Problem, SpecError, message_and_fix
from .recipe_dirs import SITE_DIR, recipe_dirs, recipes_dir, use_recipe_dirs  # noqa: F401  (their home before)
from .spec import (
    DIST_INIT_DERIVED,
    RANK_GUARD_PORT_OFFSET,
    DockerRuntime,
    HardwareProfile,
    Parallelism,
    Recipe,
    effective_tuning,
    is_set,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


def _clash(kind: str, key: str, first: Path, again: Path) -> Problem:
    return Problem(
        _display(again),
        key,
        f"{kind} '{key}' is also defined in {_display(first)}",
        f"give the site's {kind} another id (and its file that name): site directories add to the "
        "catalogue, they never replace its entries",
    )


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
                # validators say what to write ('; write ...'), or name the expected form with an example
                msg, fix = message_and_fix(msg)
                example = re.search(r"\(e\.g\. ([^)]*)\)", msg)
                fix = fix or (
                    f"write it in that form, e.g. {example.group(1)}"
                    if example
                    else "change the value as the message says"
                )
            out.append(Problem(file, field, msg, fix))
    return out


MAX_YAML_BYTES = 1 << 20
MAX_YAML_NODES = 100_000  # after alias expansion: a recipe has a few hundred


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # the C parser: the catalogue loads on every call
    """Safe YAML with duplicate keys refused (a silently dropped first value is a wrong deploy)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise _DuplicateKey(key, seen[key], key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


class _DuplicateKey(Exception):
    def __init__(self, key, first, again):
        self.key, self.first, self.again = key, first, again


def _expanded_nodes(root) -> int:
    """Nodes of the document with every alias expanded, counted without expanding (memoised by node identity):
    a few hundred bytes of nested anchors expand to billions of nodes."""
    sizes: dict[int, int] = {}

    def size(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once; yaml refuses to construct it anyway
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(n) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        sizes[id(node)] = total = min(total, MAX_YAML_NODES + 1)
        return total

    return size(root) if root is not None else 0


def load_yaml_text(raw: bytes, where: str):
    """Parse one YAML document strictly: size-bounded, UTF-8, alias expansion bounded, no duplicate keys.
    Every failure is a SpecError naming the file, the line and the fix."""
    loader = _StrictLoader(_yaml_source(raw, where))
    try:
        root = loader.get_single_node()
        if _expanded_nodes(root) > MAX_YAML_NODES:
            raise SpecError.one(
                where,
                "",
                f"anchors and aliases expand to more than {MAX_YAML_NODES} nodes",
                "write the values out, or use fewer nested aliases",
            )
        return loader.construct_document(root) if root is not None else None
    except _DuplicateKey as dup:
        raise SpecError.one(
            where,
            f"line {dup.again.line + 1}",
            f"duplicate key '{dup.key}' (first on line {dup.first.line + 1})",
            "keep one of them",
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}" if mark else ""
        problem = f"not valid YAML ({getattr(exc, 'problem', None) or exc})"
        raise SpecError.one(where, at, problem, "fix the syntax") from None
    except RecursionError:
        raise SpecError.one(where, "", "nested too deeply", "flatten the document") from None
    finally:
        loader.dispose()


def _yaml_source(raw: bytes, where: str) -> str:
    """The document's text, checked before the parser sees it: no larger than a recipe may be, and UTF-8."""
    if len(raw) > MAX_YAML_BYTES:
        raise SpecError.one(
            where,
            "",
            f"{len(raw)} bytes is larger than the {MAX_YAML_BYTES} a recipe may be",
            "split it, or check that this is the right file",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        problem = f"not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        raise SpecError.one(where, f"line {line}", problem, "save the file as UTF-8") from None


def _load_yaml(path: Path):
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise SpecError([Problem(str(path), "", f"cannot read ({exc.strerror})", "check the path")]) from None
    return load_yaml_text(raw, str(path))


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_hardware(path: Path | None = None) -> dict[str, HardwareProfile]:
    if path is None:
        return hardware_profiles()
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
        raise SpecError(problems_from_validation(file, Recipe, err)) from None


def load_recipe_file(path: Path, hardware: dict[str, HardwareProfile] | None = None, *, locked: bool = True) -> Recipe:
    recipe = parse_recipe(_load_yaml(path), _display(path))
    check_recipe(recipe, hardware if hardware is not None else load_hardware(), _display(path))
    # a docker recipe without runtime.digest takes the one its lock file beside it records (ironserve lock)
    return imagelock.apply(recipe, path) if locked else recipe


def check_recipe(recipe: Recipe, hardware: dict[str, HardwareProfile], file: str) -> None:
    """Cross-field checks the schema cannot express: hardware ids, devices per node, file name."""
    problems: list[Problem] = []
    if Path(file).suffix in (".yaml", ".yml") and Path(file).stem != recipe.id:
        problems.append(
            Problem(file, "id", f"id '{recipe.id}' differs from the file name", f"rename to {recipe.id}.yaml")
        )
    for i, hw in enumerate(recipe.hardware):
        if hw not in hardware:
            close = difflib.get_close_matches(hw, list(hardware), n=1)
            fix = f"did you mean '{close[0]}'?" if close else f"one of: {', '.join(hardware)}"
            problems.append(Problem(file, f"hardware[{i}]", f"unknown hardware profile '{hw}'", fix))
    known = [hardware[h] for h in recipe.hardware if h in hardware]
    for gi, group in enumerate(recipe.topology.groups):
        server = recipe.group_server(group)
        parallelism = Parallelism.of(server, recipe.engine.launcher)
        need = parallelism.devices_per_node(group.nodes)
        dp_factor = parallelism.replicas  # DP replicas with devices of their own (see spec.Parallelism)
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
    problems += _port_problems(recipe, file)
    problems += _repeated_flag_problems(recipe, file)
    problems += _literal_secret_problems(recipe, file)
    if problems:
        raise SpecError(problems)


def _literal_secret_problems(recipe: Recipe, file: str) -> list[Problem]:
    """A secret written into the recipe (a key after --api-key, a token in env) would reach argv, unit files and
    every copy of the catalogue: an error, before anything renders. Names only, never the value."""
    out = []
    args = [("server.extra_args", recipe.server.extra_args)]
    args += [
        (f"topology.groups[{i}].server.extra_args", g.server.extra_args) for i, g in enumerate(recipe.topology.groups)
    ]
    if recipe.topology.router:
        args.append(("topology.router.extra_args", recipe.topology.router.extra_args))
    for where, extra in args:
        for flag in SECRET_FLAGS:
            if any(a == flag or a.startswith(f"{flag}=") for a in extra):
                out.append(
                    Problem(
                        file,
                        where,
                        f"{flag} with a literal key: it would reach argv, the unit file and ps",
                        "remove it; set server.api_key_file (a 0600 file on the host) or host data api_key_file",
                    )
                )
    envs = [("env", recipe.env)] + [(f"topology.groups[{i}].env", g.env) for i, g in enumerate(recipe.topology.groups)]
    for where, env in envs:
        for key, value in env.items():
            if (SECRET_NAME.search(key) and value and not value.startswith("<")) or SECRET_VALUE.match(value or ""):
                out.append(
                    Problem(
                        file,
                        f"{where}.{key}",
                        "holds a literal secret (value not shown)",
                        f"remove {key}; keep it in a 0600 file (the hub token: host data hf_token_file)",
                    )
                )
    return out


def _host_ports(recipe: Recipe, gi: int) -> list[tuple[int, str, str]]:
    """(port, what, field) for every port one host of group gi listens on (rank 0 of instance 0: the most)."""
    group = recipe.topology.groups[gi]
    server = recipe.group_server(group)
    where = f"topology.groups[{gi}]"
    port_field = f"{where}.server.port" if group.server.port else "server.port"
    # unset ports (<PORT>: lint's unset-value) are checked once they are set
    out = [(server.port or 30000, "the server port", port_field)] if is_set(server.port) else []
    if group.nodes > 1 and is_set(group.dist_init_port):
        d = group.dist_init_port
        last = d + DIST_INIT_DERIVED + (server.dp_size or 1) - 1
        out += [
            (
                port,
                f"SGLang's port dist_init_port + {port - d}" if port != d else "the dist-init port",
                f"{where}.dist_init_port",
            )
            for port in range(d, last + 1)
        ]
        out.append(
            (
                d + RANK_GUARD_PORT_OFFSET,
                f"the rank guard's port (dist_init_port + {RANK_GUARD_PORT_OFFSET})",
                f"{where}.dist_init_port",
            )
        )
    if group.bootstrap_port is not None:
        out += [
            (group.bootstrap_port + i, f"bootstrap port of instance {i}", f"{where}.bootstrap_port")
            for i in range(group.instances)
        ][:1]
        if group.bootstrap_port + group.instances - 1 > 65535:
            out.append(
                (
                    group.bootstrap_port + group.instances - 1,
                    "the last instance's bootstrap port",
                    f"{where}.bootstrap_port",
                )
            )
    return out


def _port_problems(recipe: Recipe, file: str) -> list[Problem]:
    """Ports one engine host opens twice, or past 65535: its server port, dist-init and SGLang's ports derived
    from it, the rank guard, the bootstrap port. (Clashes between processes, e.g. with the router, depend on where
    they land: render checks them per host.)"""
    problems = []
    for gi, _ in enumerate(recipe.topology.groups):
        ports = _host_ports(recipe, gi)
        seen: dict[int, tuple[str, str]] = {}
        for port, what, field in ports:
            if port > 65535:
                problems.append(
                    Problem(
                        file,
                        field,
                        f"{what} would be {port}, past 65535",
                        f"lower {field.rsplit('.', 1)[-1]} so every derived port stays below 65536",
                    )
                )
            elif port in seen and seen[port][0] != what:
                problems.append(
                    Problem(
                        file,
                        field,
                        f"{what} ({port}) is also {seen[port][0]} on the same host",
                        f"move {field.rsplit('.', 1)[-1]} or {seen[port][1].rsplit('.', 1)[-1]} so "
                        "no two listeners share a port",
                    )
                )
            else:
                seen.setdefault(port, (what, field))
    return problems


def _repeated_flag_problems(recipe: Recipe, file: str) -> list[Problem]:
    """A typed option repeated in extra_args: argparse keeps the last one, so the typed value silently loses."""
    from .render import server_flags

    problems = []
    typed_router = {"--host", "--port", "--policy", "--worker-urls", "--pd-disaggregation", "--prefill", "--decode"}
    for gi, group in enumerate(recipe.topology.groups):
        server = recipe.group_server(group)
        # (flags render derives from the topology are refused by the extra_args validator: spec.DERIVED_FLAGS)
        typed = {a for a in server_flags(server.model_copy(update={"extra_args": []})) if a.startswith("--")}
        for i, arg in enumerate(server.extra_args):
            flag = arg.split("=", 1)[0]
            if flag in typed:
                problems.append(
                    Problem(
                        file,
                        f"topology.groups[{gi}] server.extra_args[{i}]",
                        f"{flag} is also set by a typed field (or by ironserve)",
                        f"remove it from extra_args and set "
                        f"server.{flag[2:].replace('-', '_')} (or let ironserve derive it)",
                    )
                )
    if recipe.topology.router:
        for i, arg in enumerate(recipe.topology.router.extra_args):
            if arg.split("=", 1)[0] in typed_router:
                problems.append(
                    Problem(
                        file,
                        f"topology.router.extra_args[{i}]",
                        f"{arg.split('=', 1)[0]} is set by the router's typed fields",
                        "remove it from extra_args",
                    )
                )
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
    return [
        Problem(
            file,
            "runtime.run.ulimits.memlock",
            f"{', '.join(wanting)} needs unlimited locked memory inside the container",
            "add memlock: -1 to runtime.run.ulimits (docker --ulimit memlock=-1)",
        )
    ]


@dataclass(frozen=True)
class Catalogue:
    """The catalogue with the site's directories layered over it: each recipe and profile with the file it
    came from."""

    recipes: dict[str, Recipe]
    hardware: dict[str, HardwareProfile]
    files: dict[str, Path]  # recipe id -> its YAML file
    defaults: dict[str, dict[str, str]]  # model -> hardware -> recipe id
    dirs: tuple[Path, ...]


def _layered_hardware(dirs: tuple[Path, ...]) -> tuple[dict[str, HardwareProfile], list[Problem]]:
    """Every directory's profiles, and the clashes (reported with the recipes' problems, in one run)."""
    hardware: dict[str, HardwareProfile] = {}
    where: dict[str, Path] = {}
    problems: list[Problem] = []
    for d in dirs:
        path = d / "hardware.yaml"
        if d != dirs[0] and not path.exists():
            continue
        for pid, profile in load_hardware(path).items():
            if pid in hardware:
                problems.append(_clash("hardware profile", pid, where[pid], path))
                continue
            hardware[pid], where[pid] = profile, path
    return hardware, problems


def _layered_defaults(dirs: tuple[Path, ...]) -> dict[str, dict[str, str]]:
    defaults: dict[str, dict[str, str]] = {}
    where: dict[tuple[str, str], Path] = {}
    problems: list[Problem] = []
    for d in dirs:
        path = d / "defaults.yaml"
        if not path.exists():
            continue
        models = (_load_yaml(path) or {}).get("defaults") or {}
        if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
            raise SpecError(
                [
                    Problem(
                        _display(path),
                        "defaults",
                        "not a mapping of model -> hardware -> recipe id",
                        "write e.g. defaults: {glm5: {h100-sxm: my-glm5-h100}}",
                    )
                ]
            )
        for model, per_hw in models.items():
            for hw, rid in per_hw.items():
                if (model, hw) in where:
                    problems.append(_clash("default", f"defaults.{model}.{hw}", where[(model, hw)], path))
                    continue
                defaults.setdefault(model, {})[hw] = str(rid)
                where[(model, hw)] = path
    if problems:
        raise SpecError(problems)
    return defaults


@functools.lru_cache(maxsize=4)
def _catalogue_cached(dirs: tuple[Path, ...]) -> Catalogue:
    hardware, problems = _layered_hardware(dirs)
    recipes: dict[str, Recipe] = {}
    files: dict[str, Path] = {}
    for base in dirs:
        for path in sorted(base.glob("*.yaml")):
            if path.name in ("hardware.yaml", "defaults.yaml"):
                continue
            try:
                recipe = load_recipe_file(path, hardware)
            except SpecError as err:
                problems.extend(err.problems)
                continue
            if recipe.id in recipes:
                problems.append(_clash("recipe", recipe.id, files[recipe.id], path))
                continue
            recipes[recipe.id], files[recipe.id] = recipe, path
    if problems:
        raise SpecError(problems)
    return Catalogue(recipes, hardware, files, _layered_defaults(dirs), dirs)


def layered() -> Catalogue:
    return _catalogue_cached(recipe_dirs())


def catalogue() -> dict[str, Recipe]:
    return layered().recipes


def hardware_profiles() -> dict[str, HardwareProfile]:
    return layered().hardware


def recipe_file(ref: str) -> Path:
    """The YAML file of a recipe named by path (outside the catalogue) or by id (a catalogue or site recipe): its
    lock file goes beside it."""
    path = Path(ref)
    if ref.endswith((".yaml", ".yml")) or path.exists():
        return path
    get_recipe(ref)  # an unknown id fails here, with the nearest ids
    return layered().files[ref]


def get_recipe(ref: str) -> Recipe:
    """A recipe by id, or by path to a YAML file outside the catalogue."""
    path = Path(ref)
    if ref.endswith((".yaml", ".yml")) or path.exists():
        return load_recipe_file(path, hardware_profiles())
    recipes = catalogue()
    if ref not in recipes:
        close = difflib.get_close_matches(ref, list(recipes), n=3)
        fix = f"did you mean {', '.join(close)}?" if close else "run 'ironserve render --list' for the ids"
        raise SpecError([Problem(", ".join(_display(d) for d in recipe_dirs()), "id", f"no recipe '{ref}'", fix)])
    return recipes[ref]


def default_recipe(model: str, hardware: str) -> Recipe:
    """The default recipe for a model family on a hardware profile (defaults.yaml of the catalogue and the site)."""
    where = " + ".join(_display(d / "defaults.yaml") for d in recipe_dirs() if (d / "defaults.yaml").exists())
    models = layered().defaults
    if model not in models:
        raise SpecError([Problem(where, "defaults", f"no model '{model}'", f"one of: {', '.join(models)}")])
    per_hw = models[model]
    if hardware not in per_hw:
        raise SpecError(
            [
                Problem(
                    where,
                    f"defaults.{model}",
                    f"no default recipe for hardware '{hardware}'",
                    f"pick one with --data recipe=ID, add '{model}: {{{hardware}: RECIPE-ID}}' to the site's "
                    f"recipes/defaults.yaml, or use hardware {', '.join(per_hw)}",
                )
            ]
        )
    return get_recipe(per_hw[hardware])
