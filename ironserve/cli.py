"""ironserve command line: render | lint | import | schema | lock | init | pyinfra | audit | status (| lab).

Offline commands (render, lint, import, schema, init) never touch a host. Exit codes, the same for every command:
0 ok; 1 findings: lint errors, audit drift, status units not in their intended state; 2 bad input (a recipe,
inventory, host data or option refused, with the file, key and fix) or an unreachable host; 130 interrupted
(Ctrl-C); 141 the output pipe closed (`| head`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import resources

if TYPE_CHECKING:
    from .findings import Finding

# Light at import: `ironserve --help` and the parser import neither pydantic, pyinfra, yaml nor jinja2 (the recipe
# models cost most of a second to build), nor dataclasses (findings, problems); each command imports what it uses.


def _engine_version(text: str | None) -> str | None:
    from .problems import Problem, SpecError

    if not text:
        return None
    if not text.startswith("sglang=="):
        raise SpecError(
            [
                Problem(
                    "--engine", "", f"'{text}' is not of the form sglang==VERSION", "write e.g. --engine sglang==0.5.23"
                )
            ]
        )
    return text.split("==", 1)[1]


def _hosts_from(path: str | None, data: list[str] | None = None):
    """The inventory's hosts as the deploy sees them: pyinfra's loader (groups, group_data/, --data)."""
    if not path:
        return None
    from .fleet import load_inventory
    from .hostdata import parse_data_args

    return load_inventory(path, parse_data_args(data or []))


# --------------------------------------------------------------------------- render


def cmd_render(args) -> int:
    if args.list or not args.recipe:
        from .catalogue_index import listing  # the validated catalogue's rows, remembered while its files are unchanged

        for rid, hardware, description in listing():
            print(f"{rid:45s} {','.join(hardware):32s} {description}")
        return 0
    from . import catalogue
    from .render import render, shell_script

    recipe = catalogue.get_recipe(args.recipe)
    rendered = render(recipe, _hosts_from(args.inventory, args.data), args.inventory or "inventory")
    if args.format == "json":
        print(json.dumps(rendered.as_dict(), indent=2))
    elif args.format == "shell":
        print(shell_script(rendered), end="")
    else:
        from .render import require_set
        from .spec import effective_tuning
        from .units import systemd_bundle

        require_set(rendered)  # units need every value: <PORT> left by import is said, not rendered
        profile = catalogue.hardware_profiles()[recipe.hardware[0]]
        print(systemd_bundle(rendered, effective_tuning(recipe, profile)), end="")
    return 0


# --------------------------------------------------------------------------- lint


def _print_findings(findings: list[Finding], fmt: str, subject: str) -> None:
    from .findings import Severity

    errors = sum(f.severity is Severity.error for f in findings)
    warnings = sum(f.severity is Severity.warning for f in findings)
    if fmt == "json":
        print(
            json.dumps(
                {
                    "subject": subject,
                    "errors": errors,
                    "warnings": warnings,
                    "findings": [f.as_dict() for f in findings],
                },
                indent=2,
            )
        )
        return
    for f in findings:
        print(f.line())
    print(f"{subject}: {errors} error(s), {warnings} warning(s)")


def _parser_findings(version: str, argvs: list[list[str]], router_version: str | None = None) -> list[Finding]:
    """Every argv (servers and routers) through the real parsers in one subprocess per venv; duplicates across
    ranks of a group are reported once."""
    from . import engine_parser
    from .findings import Finding, Severity

    try:
        per_argv = engine_parser.check_many(version, argvs, router_version=router_version)
    except engine_parser.EngineNotAvailable as exc:
        nearest = getattr(exc, "nearest", None)
        fix = (
            f"check with --engine sglang=={nearest} (the PyPI release of that time)"
            if nearest
            else "pick a PyPI version with --engine"
        )
        return [Finding("engine-not-available", Severity.error, str(exc), fix, "engine")]
    except engine_parser.UvMissing as exc:
        return [
            Finding(
                "engine-parser-unavailable",
                Severity.error,
                str(exc),
                "install uv (pip install uv, or see https://docs.astral.sh/uv/), or use --offline",
                "engine",
            )
        ]
    except engine_parser.ParserEnvError as exc:
        return [
            Finding(
                "engine-parser-unavailable",
                Severity.error,
                f"the SGLang parser could not run: {exc}",
                "check network access to the package index, or use --offline",
                "engine",
            )
        ]
    seen, out = set(), []
    for findings in per_argv:
        for f in findings:
            key = (f.rule, f.message, f.where)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def lint_recipe_full(
    recipe, engine: str | None, offline: bool, inventory: str | None = None, data: list[str] | None = None
) -> list[Finding]:
    from . import catalogue
    from .findings import Finding, Severity
    from .lint import lint_recipe
    from .pins import resolve_findings
    from .render import render

    findings = lint_recipe(recipe, catalogue.hardware_profiles(), engine)
    version = engine or recipe.engine.check_version
    # with an inventory: its host data validated and the argv rendered for its hosts (addresses, paths, NICs)
    hosts = _hosts_from(inventory, data)
    rendered = render(recipe, hosts, inventory or "inventory")
    # do the runtime's pins resolve (against the indexes the inventory maps, when one is given)?
    indexes = next((dict(h.host_data.package_indexes) for h in hosts or [] if h.host_data.package_indexes), {})
    findings += resolve_findings(recipe, catalogue.hardware_profiles(), offline=offline, package_indexes=indexes)
    if version and not offline:
        argvs = [p.argv for p in rendered.processes]
        parsed = [_where(f, recipe.id) for f in _parser_findings(version, argvs, recipe.engine.router)]
        if not engine and not recipe.engine.is_pypi:
            # The recipe runs an image era (a nightly build); the PyPI parser closest to it is evidence, not the
            # verdict: what it rejects is said, as a warning, so drift is visible without failing the recipe.
            parsed = [
                Finding(
                    f.rule,
                    Severity.warning if f.severity is Severity.error else f.severity,
                    f"{f.message} (parser of sglang {version}, nearest PyPI release to the image era "
                    f"{recipe.engine.sglang})",
                    f.fix,
                    f.where,
                )
                for f in parsed
            ]
        findings += parsed
    return findings


def _pasted_parser_findings(engine: str | None, argv: list[str], profile) -> list[Finding]:
    """The real parser on a pasted command: the version named with --engine, else the PyPI release of the hardware's
    seed era (or the newest ironserve knows), whose refusals are then warnings: evidence, not the verdict."""
    from .findings import Finding, Severity

    if engine:
        return _parser_findings(engine, [argv])
    from .commandline import parse_command
    from .importer import choose_engine

    command = parse_command(argv)  # the release import would choose: image tag, the flags' releases, seed era
    version, why, _ = choose_engine(profile.accelerator.arch, None, command.docker, [command], detect=False)
    return [
        Finding(
            f.rule,
            Severity.warning if f.severity is Severity.error else f.severity,
            f"{f.message} (parser of sglang {version}, {why}; name --engine to judge for your version)",
            f.fix,
            f.where,
        )
        for f in _parser_findings(version, [argv])
    ]


def _where(f: Finding, recipe_id: str) -> Finding:
    from .findings import Finding

    return Finding(f.rule, f.severity, f.message, f.fix, f"{recipe_id} {f.where}".strip())


def cmd_lint(args) -> int:
    from .lint import rule_table

    engine = _engine_version(args.engine)
    if args.rules:
        for row in rule_table():
            print(
                f"{row['rule']:36s} {row['severity']:8s} {row['summary']}\n{'':45s}scope: {row['scope']}; "
                f"source: {row['source']}"
            )
        return 0
    if args.command or args.file:
        return _lint_pasted_commands(args, engine)
    return _lint_recipes(args, engine)


def _pasted_profile(args):
    """The hardware profile a pasted command is linted for (--hardware, with --gpus overriding its count)."""
    from . import catalogue
    from .problems import Problem, SpecError

    if not args.hardware:
        raise SpecError(
            [
                Problem(
                    "command line",
                    "--hardware",
                    "a pasted command needs the hardware",
                    f"add --hardware with one of {', '.join(catalogue.hardware_profiles())}",
                )
            ]
        )
    profiles = catalogue.hardware_profiles()
    if args.hardware not in profiles:
        raise SpecError(
            [
                Problem(
                    "command line", "--hardware", f"unknown hardware '{args.hardware}'", f"one of {', '.join(profiles)}"
                )
            ]
        )
    profile = profiles[args.hardware]
    if args.gpus is not None:
        accel = profile.accelerator.model_copy(update={"count": args.gpus})
        profile = profile.model_copy(update={"accelerator": accel})
    return profile


def _pasted_launches(args) -> list[list[str]]:
    """The launch commands to lint: the one after --, then those of --file's script."""
    from .commandline import CommandError, parse_script
    from .problems import Problem, SpecError

    launches = [args.command] if args.command else []
    if args.file:
        try:
            launches += [words for _, words in parse_script(open(args.file).read()).commands]
        except (OSError, CommandError) as exc:
            raise SpecError([Problem(args.file, "", str(exc), getattr(exc, "fix", "check the path"))]) from None
        if not launches:
            raise SpecError(
                [
                    Problem(
                        args.file,
                        "",
                        "no SGLang launch command in the script",
                        "lint a script that runs python3 -m sglang.launch_server ...",
                    )
                ]
            )
    return launches


def _lint_pasted_commands(args, engine) -> int:
    from .commandline import CommandError, parse_command
    from .findings import Finding, has_errors
    from .lint import lint_pasted
    from .problems import Problem, SpecError

    profile, launches = _pasted_profile(args), _pasted_launches(args)
    findings = []
    for n, words in enumerate(launches):
        try:
            found = lint_pasted(words, profile, engine)
        except ValueError as exc:
            raise SpecError([Problem("command", "", str(exc), "paste ENV=VAL ... COMMAND after --")]) from None
        if not args.offline and not has_errors(found):
            try:
                found += _pasted_parser_findings(engine, parse_command(words).argv, profile)
            except CommandError:
                pass  # already a finding
        if len(launches) > 1:
            found = [Finding(f.rule, f.severity, f.message, f.fix, f"command {n + 1}") for f in found]
        findings += found
    _print_findings(findings, args.format, args.file or "command")
    return 1 if has_errors(findings) else 0


def _lint_recipes(args, engine) -> int:
    from . import catalogue
    from .findings import has_errors

    targets = list(catalogue.catalogue()) if args.all or not args.recipe else [args.recipe]
    worst = 0
    everything: list[Finding] = []
    for ref in targets:
        recipe = catalogue.get_recipe(ref)
        findings = lint_recipe_full(recipe, engine, args.offline, args.inventory, args.data)
        everything += findings
        if args.format == "text":
            _print_findings(findings, "text", recipe.id)
        worst = max(worst, 1 if has_errors(findings) else 0)
    if args.format == "json":
        _print_findings(everything, "json", ",".join(targets) if len(targets) < 4 else f"{len(targets)} recipes")
    return worst


# --------------------------------------------------------------------------- import / schema


def _read_script(name: str) -> str:
    from .problems import Problem, SpecError

    try:
        with open(name) as fh:
            return fh.read()
    except OSError as exc:
        raise SpecError([Problem(name, "", f"cannot read ({exc.strerror})", "check the path")]) from exc


def cmd_import(args) -> int:
    from . import catalogue
    from .findings import has_errors
    from .importer import to_yaml

    profiles = catalogue.hardware_profiles()
    _check_import_input(args, profiles)
    engine = _engine_version(args.engine)
    args.id = _import_id(args.id, args.output)
    result = _imported(args, profiles[args.hardware].accelerator.arch, engine)
    text = to_yaml(result.data)
    for f in result.findings:
        print(f.line(), file=sys.stderr)
    linted = _lint_imported(result.data, profiles, engine, args.output or "imported recipe")
    if any(h for h in result.hosts):
        print(
            f"hosts in render order (put them in the inventory): {', '.join(h or '?' for h in result.hosts)}",
            file=sys.stderr,
        )
    if args.inventory_out:
        from .importer import inventory_text

        _write_said(args.inventory_out, inventory_text(result))
    if args.output:
        _write_said(args.output, text)
    else:
        print(text, end="")
    return 1 if has_errors(linted) else 0


def _check_import_input(args, profiles: dict) -> None:
    """A known hardware profile and something to import, before anything is parsed."""
    from .problems import SpecError

    if args.hardware not in profiles:
        raise SpecError.one(
            "command line", "--hardware", f"unknown hardware '{args.hardware}'", f"one of {', '.join(profiles)}"
        )
    if not args.command and not args.file:
        raise SpecError.one(
            "command line", "", "no command to import", "paste it after --, or name a launch script with --file"
        )


def _imported(args, arch: str, engine: str | None):
    """The pasted command, or the launch scripts (--file repeated: the halves and the router of one deployment, one
    script each, and a pasted command beside them), as recipe data; a command import refuses is a SpecError."""
    from .commandline import CommandError, parse_command
    from .importer import import_commands, import_script
    from .problems import SpecError

    words = args.command
    options = {"engine": engine, "hardware_arch": arch, "detect": not args.offline}
    try:
        if args.file:
            texts = [_read_script(name) for name in args.file] + ([shlex.join(words)] if words else [])
            return import_script("\n".join(texts), args.hardware, args.id, **options)
        return import_commands([parse_command(words)], args.hardware, args.id, **options)
    except CommandError as exc:
        source = ", ".join(args.file or ["command"])
        raise SpecError.one(source, exc.where if exc.where != "command" else "", str(exc), exc.fix) from None


def _lint_imported(data: dict, profiles: dict, engine: str | None, where: str) -> list:
    """What import writes must load and pass lint: cross-field errors (a tp_size larger than the hardware's devices)
    stop it, exit 2, nothing written; lint errors are said (returned), and exit 1 after writing (fix the file, lint
    again)."""
    from . import catalogue
    from .findings import Severity
    from .lint import lint_recipe
    from .problems import SpecError

    recipe = catalogue.parse_recipe(data, where)
    catalogue.check_recipe(recipe, profiles, where)
    try:
        linted = lint_recipe(recipe, profiles, engine)
    except SpecError:  # placement that needs the inventory's hosts (a router beside an engine): `lint --inventory`
        linted = []
    for f in linted:
        if f.severity is Severity.error:
            print(f.line(), file=sys.stderr)
    return linted


def _write_said(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
    print(f"wrote {path}", file=sys.stderr)


def _import_id(given: str | None, output: str | None) -> str | None:
    """-o FILE names the recipe: its id is the file's name (what the catalogue and `render FILE` require)."""
    from .problems import Problem, SpecError

    if not output:
        return given
    stem = Path(output).stem
    if not Path(output).name.endswith((".yaml", ".yml")):
        raise SpecError([Problem("command line", "--output", f"{output} is not a .yaml file", f"write to {stem}.yaml")])
    if given and given != stem:
        raise SpecError(
            [
                Problem(
                    "command line",
                    "--id",
                    f"--id {given} differs from the file name {output}",
                    f"drop --id (the id is the file name), or write to {given}.yaml",
                )
            ]
        )
    return stem


def cmd_schema(args) -> int:
    from .spec import HardwareProfile, Recipe

    if args.host_data:
        from .hostdata import json_schema, markdown_table

        print(
            markdown_table() if args.markdown else json.dumps(json_schema(), indent=2), end="\n" * (not args.markdown)
        )
        return 0
    schema = (HardwareProfile if args.hardware else Recipe).model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    print(json.dumps(schema, indent=2))
    return 0


# --------------------------------------------------------------------------- lock


def _recipe_files(args) -> list[Path]:
    from . import catalogue
    from .problems import Problem, SpecError

    if args.all:
        return [catalogue.recipe_file(i) for i in sorted(catalogue.catalogue())]
    if not args.recipe:
        raise SpecError([Problem("lock", "RECIPE", "no recipe given", "name a recipe id or file, or --all")])
    return [catalogue.recipe_file(args.recipe)]


def cmd_lock(args) -> int:
    """Resolve each recipe's runtime (docker tag -> digest; uv pins -> hashes; a docker recipe's router venv ->
    hashes) and write <recipe>.lock.json."""
    from . import catalogue, imagelock

    mirror, ca_file, index = args.registry, args.registry_ca, args.index
    for host in _hosts_from(args.inventory) or []:
        mirror = mirror or host.host_data.docker_registry_mirror
        ca_file = ca_file or host.host_data.docker_registry_ca
        index = index or host.host_data.pip_index_url
    if args.site:
        return _lock_site(args, mirror, ca_file)
    wrote = 0
    for path in _recipe_files(args):
        raw = recipe = catalogue.load_recipe_file(path, catalogue.hardware_profiles(), locked=False)
        lock_path = imagelock.lock_file(path)
        # --router adds the router's resolution to what the lock holds (an image a site lock pins stays as it is)
        data = {**(imagelock.read(lock_path) or {}), "recipe": recipe.id} if args.router else {"recipe": recipe.id}
        found = _lock_docker(args, raw, data, mirror, ca_file) + _lock_router(args, raw, path, data, index)
        found += _lock_uv(args, raw, path, data, index)
        if not found:
            continue
        if imagelock.read(lock_path) != data:
            imagelock.write(lock_path, data)
            wrote += 1
        print(f"{recipe.id}: {'; '.join(found)} -> {lock_path}")
    print(f"{wrote} lock file(s) written")
    return 0


def _python_minor(value: str) -> str:
    if not re.fullmatch(r"3\.[0-9]{1,2}", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Python minor version: write 3.X (3.11)")
    return value


def _no_index(path, field: str):
    from .problems import SpecError

    return SpecError.one(
        str(path), field, "no package index to lock against", "give --index URL or an inventory with pip_index_url"
    )


def _arches(args, recipe) -> list[str]:
    from . import catalogue

    profiles = catalogue.hardware_profiles()
    return args.arch or sorted({profiles[h].cpu_arch for h in recipe.hardware if h in profiles})


def _lock_docker(args, raw, data: dict, mirror, ca_file) -> list[str]:
    """A docker recipe's image digest into ``data`` (unless --router, or the recipe pins it); what was locked."""
    from . import imagelock
    from .spec import DockerRuntime

    if not isinstance(raw.runtime, DockerRuntime) or args.router:
        return []
    if raw.runtime.digest:
        print(f"{raw.id}: runtime.digest pins {raw.runtime.digest} in the recipe; no image lock needed")
        return []
    data["docker"] = imagelock.resolve_docker(raw, mirror, ca_file)
    return [f"{data['docker']['image']} -> {data['docker']['digest']} (registry {data['docker']['registry']})"]


def _lock_router(args, raw, path, data: dict, index) -> list[str]:
    """A docker recipe's router venv resolution with hashes into ``data`` (where it has a router venv); what was
    locked. Without an index: said and skipped, refused under --router."""
    from . import imagelock
    from .spec import DockerRuntime
    from .units import router_venv

    if not isinstance(raw.runtime, DockerRuntime) or not router_venv(raw):
        return []
    if not index and args.router:
        raise _no_index(path, "engine.router")
    if not index:
        print(
            f"{raw.id}: its router venv is not locked: no package index (give --index URL or an inventory with "
            "pip_index_url)"
        )
        return []
    where = imagelock.public_url(index)
    pythons = args.router_python or list(imagelock.ROUTER_PYTHONS)
    data["router"] = imagelock.resolve_router(
        raw, index, _arches(args, raw), pythons, required=bool(args.router_python)
    )
    for skipped in data["router"].pop("skipped"):
        print(f"{raw.id}: the router venv does not resolve for {skipped} in {where}: left out of the lock")
    locked = data["router"]["platforms"]
    counts = [
        f"{len(r)} distributions for {arch} Python {py}" for arch, by_py in locked.items() for py, r in by_py.items()
    ]
    return [f"the router venv's {', '.join(counts)}, with their sha256 in {where}"]


def _lock_uv(args, raw, path, data: dict, index) -> list[str]:
    """A uv recipe's full resolution with hashes into ``data``; what was locked, in words."""
    from . import imagelock
    from .spec import UvRuntime

    if not isinstance(raw.runtime, UvRuntime) or args.router:
        return []
    if not index:
        raise _no_index(path, "runtime")
    data["uv"] = imagelock.resolve_uv(raw, index, _arches(args, raw))
    return [
        ", ".join(f"{len(locked)} distributions for {arch}" for arch, locked in data["uv"]["platforms"].items())
        + f", with their sha256 in {imagelock.public_url(index)}"
    ]


def _lock_site(args, mirror: str | None, ca_file: str | None) -> int:
    """--site FILE: the digests the site's registry holds for the docker recipes' images (host data
    docker_image_lock), each replacing the digest its recipe pins (recipe or lock file)."""
    from . import catalogue, imagelock
    from .spec import DockerRuntime

    data: dict = {"docker": {}}
    for path in _recipe_files(args):
        recipe = catalogue.load_recipe_file(path, catalogue.hardware_profiles())
        if not isinstance(recipe.runtime, DockerRuntime) or recipe.runtime.image in data["docker"]:
            continue
        entry = data["docker"][recipe.runtime.image] = imagelock.resolve_site(recipe, mirror, ca_file)
        print(
            f"{recipe.id}: {recipe.runtime.image} -> {entry['digest']}"
            + (f" (in place of {entry['replaces']})" if entry["replaces"] else "")
            + (f" from {entry['repository']}" if entry["repository"] else "")
        )
    imagelock.write(Path(args.site), data)
    print(f"site lock: {len(data['docker'])} image(s) -> {args.site}")
    return 0


# --------------------------------------------------------------------------- init / pyinfra


def cmd_init(args) -> int:
    from .project import init_project

    written = init_project(args.directory)
    print(f"wrote {len(written)} files into {args.directory}:")
    for path in written:
        print(f"  {path}")
    print(
        f"next: cd {args.directory}; edit inventory.py and group_data/all.py; ironserve render --list; "
        "pyinfra inventory.py deploys/MODEL.py --dry"
    )
    return 0


def run_pyinfra(argv: list[str]) -> int:
    """`ironserve pyinfra ARGS`: the pyinfra installed beside ironserve (a tool install exposes only ironserve)."""
    os.execv(sys.executable, [sys.executable, "-m", "pyinfra", *argv])
    return 2  # not reached


# --------------------------------------------------------------------------- main


class _Version(argparse.Action):
    """--version: the distribution's version, looked up only when asked (importlib.metadata is slow to import)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {resources.version()}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; `command` (the subcommand about to run) is the one optional module imported."""
    parser = argparse.ArgumentParser(
        prog="ironserve",
        description=__doc__.splitlines()[0],
        allow_abbrev=False,
        epilog="exit codes: 0 ok, 1 findings (lint errors, drift), 2 bad input or an unreachable host, 130 interrupted",
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show program's version number and exit")
    parser.add_argument(
        "--recipes",
        action="append",
        default=[],
        metavar="DIR",
        help="a site directory of recipes / hardware.yaml / defaults.yaml layered over the catalogue "
        "(repeatable; also IRONSERVE_RECIPES and the project's recipes/)",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    _add_recipe_parsers(sub)
    _add_catalogue_parsers(sub)

    p = sub.add_parser(
        "init", help="write a project to start from: inventory, group_data, deploys, recipes/", allow_abbrev=False
    )
    p.add_argument("directory")
    p.set_defaults(func=cmd_init)

    sub.add_parser(
        "pyinfra", help="run the pyinfra installed beside ironserve: ironserve pyinfra INVENTORY DEPLOY", add_help=False
    )

    _add_optional(sub, command)
    return parser


def _add_inventory_options(p, inventory_help: str) -> None:
    """--inventory and the --data that adds host data to its hosts: they come together."""
    p.add_argument("--inventory", help=inventory_help)
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="host data for every host of --inventory, as pyinfra's --data",
    )


def _add_recipe_parsers(sub) -> None:
    """render, lint and import: recipes and pasted commands."""
    p = sub.add_parser("render", help="what runs on each host", allow_abbrev=False)
    p.add_argument("recipe", nargs="?", help="recipe id or YAML file")
    _add_inventory_options(p, "pyinfra inventory file: hosts, addresses, ranks")
    p.add_argument("--format", choices=["json", "shell", "systemd"], default="json")
    p.add_argument("--list", action="store_true", help="list the catalogue")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("lint", help="pitfalls in a recipe or a pasted command", allow_abbrev=False)
    p.add_argument("recipe", nargs="?", help="recipe id or YAML file (default: the whole catalogue)")
    p.add_argument("--all", action="store_true", help="lint every recipe in the catalogue")
    p.add_argument("--hardware", help="hardware profile id for a pasted command")
    p.add_argument("--gpus", type=int, help="devices present on the node, if fewer than the profile's")
    p.add_argument("--engine", help="sglang==VERSION: judge for that version, with its real parser")
    p.add_argument("--offline", action="store_true", help="skip the real-parser check (no venv build)")
    _add_inventory_options(p, "pyinfra inventory: validate its host data and render for its hosts")
    p.add_argument("--file", help="a launch script: lint each SGLang launch in it")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("--rules", action="store_true", help="list the rules")
    p.set_defaults(func=cmd_lint)

    p = sub.add_parser("import", help="pasted command -> recipe YAML", allow_abbrev=False)
    p.add_argument("--hardware", required=True)
    p.add_argument("--id", help="recipe id (default: the -o file's name, else derived)")
    p.add_argument("--engine", help="sglang==VERSION (default: the newest cached parser that accepts the command)")
    p.add_argument(
        "--file",
        action="append",
        help="a launch script: its engine commands and router become one "
        "recipe; repeat it for scripts of one deployment (prefill, decode, router)",
    )
    p.add_argument("--offline", action="store_true", help="choose no engine by parsing (no parser run)")
    p.add_argument("--inventory-out", help="also write a pyinfra inventory with the hosts the commands name")
    p.add_argument("--output", "-o", help="write to this .yaml file instead of stdout (the recipe's id is its name)")
    p.set_defaults(func=cmd_import)


def _add_catalogue_parsers(sub) -> None:
    """schema and lock: the recipe schema and the catalogue's pins."""
    p = sub.add_parser("schema", help="JSON Schema of recipes, for editors", allow_abbrev=False)
    p.add_argument("--hardware", action="store_true", help="schema of hardware profiles instead")
    p.add_argument("--host-data", action="store_true", help="schema of inventory host data instead")
    p.add_argument("--markdown", action="store_true", help="with --host-data: the table of docs/host-data.md")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser(
        "lock", help="pin each recipe's image digest / package hashes in <recipe>.lock.json", allow_abbrev=False
    )
    p.add_argument("recipe", nargs="?", help="recipe id or YAML file")
    p.add_argument("--all", action="store_true", help="every recipe of the catalogue")
    p.add_argument(
        "--inventory",
        help="pyinfra inventory naming the registry (docker_registry_mirror, "
        "docker_registry_ca) and the package index (pip_index_url)",
    )
    p.add_argument("--registry", help="host[:port] to resolve Docker Hub names at (default: the inventory's)")
    p.add_argument("--registry-ca", help="CA file of that registry")
    p.add_argument("--index", help="PEP 503 index URL for uv runtimes (default: the inventory's pip_index_url)")
    p.add_argument(
        "--arch",
        action="append",
        choices=["x86_64", "aarch64"],
        help="machines to resolve a uv runtime for (repeatable; default: those of the recipe's hardware profiles)",
    )
    p.add_argument(
        "--router-python",
        action="append",
        type=_python_minor,
        metavar="3.X",
        help="Python minors to resolve a docker recipe's router venv for, the hosts' python3 (repeatable; "
        "default: 3.10, 3.11 and 3.12)",
    )
    p.add_argument(
        "--router",
        action="store_true",
        help="lock only the router venvs of docker recipes, keeping the rest of each lock file (images a site "
        "lock pins)",
    )
    p.add_argument(
        "--site",
        metavar="FILE",
        help="write a site lock instead: the digests the registry holds for "
        "the recipes' images, in place of theirs (host data docker_image_lock)",
    )
    p.set_defaults(func=cmd_lock)


# Subcommands whose modules arrive separately: (command, module, function adding its parser, its line in --help).
# Only the module of the command that runs is imported (audit and status import pyinfra and the recipe models); the
# others get a placeholder carrying their help line, so that `ironserve --help` lists them at no cost.
_OPTIONAL = (
    ("lab", "ironserve_lab.cli", "add_lab_parser", "local multi-host lab (systemd-nspawn hosts, air-gapped supply)"),
    ("audit", "ironserve.audit", "add_audit_parser", "drift: compare hosts with the deploy's declaration (testinfra)"),
    ("status", "ironserve.status", "add_status_parser", "endpoint, served model and unit state per host"),
)
# What a command whose package is not installed says instead (exit 2): the lab is a checkout's package of its own
_NOT_INSTALLED = {
    "lab": "the lab runs from a checkout of ironserve: it is the package ironserve_lab (lab/ in the repository), "
    "which an installed ironserve does not carry; in a checkout, `uv sync` (scripts/env.sh) installs it into .venv: "
    "run .venv/bin/ironserve lab there",
}


def _add_optional(sub, command: str | None) -> None:
    from importlib.util import find_spec

    for name, module, fn, summary in _OPTIONAL:
        try:
            # the top-level package: found without importing any of it (`--help` imports nothing of the lab)
            if find_spec(module.partition(".")[0]) is None:
                if name == command and name in _NOT_INSTALLED:
                    _add_not_installed(sub, name, summary)
                continue
            if name == command:
                getattr(__import__(module, fromlist=[fn]), fn)(sub)
            else:
                sub.add_parser(name, help=summary, add_help=False)
        except ImportError:  # a dependency of its module is missing: no such command here
            continue


def _add_not_installed(sub, name: str, summary: str) -> None:
    """`ironserve NAME ...` for a command whose package is not here: every word after NAME taken (no option of its
    own, not even -h), the reason said, exit 2."""
    parser = sub.add_parser(name, help=summary, add_help=False, prefix_chars="\0")
    parser.add_argument("words", nargs="*")

    def explain(_args) -> int:
        print(f"error: ironserve {name}: {_NOT_INSTALLED[name]}", file=sys.stderr)
        return 2

    parser.set_defaults(func=explain)


def _subcommand(argv: list[str]) -> str | None:
    """The subcommand word of argv: the first word that is neither an option nor --recipes' value."""
    words = iter(argv)
    for word in words:
        if word == "--recipes":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pyinfra"]:
        return run_pyinfra(argv[1:])
    # Everything after a bare '--' is a pasted command (lint, import): keep it away from argparse.
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = build_parser(_subcommand(argv)).parse_args(argv)
    args.command = command
    from .problems import SpecError
    from .recipe_dirs import use_recipe_dirs

    use_recipe_dirs(args.recipes)
    try:
        return args.func(args)
    except SpecError as err:
        for problem in err.problems:
            print(f"error: {problem.line()}", file=sys.stderr)
        return 2  # bad input: never 1, which lint's error findings and audit's drift mean


if __name__ == "__main__":
    sys.exit(main())
