"""Import holds up on commands from the wild: every command of tests/data/wild_commands.yaml (SGLang's docs and
cookbooks, public launch scripts; none from the seeds) imports into a recipe that loads, lints without errors it
did not ask for, and renders back to the same engine flags, env, container options and router argv.

The comparison is exact except for what import changes on purpose, each said by a finding: shell variables become
{placeholders} or <name> inputs, secrets leave the recipe, ironserve owns the container's name/--rm/env file, and
defaults the renderer always writes (router host/port/policy, prefill bootstrap port) are made explicit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ironserve import catalogue
from ironserve.commandline import SHELL_VAR, Command, parse_command, parse_script, var_name
from ironserve.findings import Severity
from ironserve.flags import canonical, split_flags
from ironserve.importer import DEFAULT_BOOTSTRAP_PORT, ROUTER_DEFAULTS, CommandError, import_script
from ironserve.inventory import InventoryHost
from ironserve.lint import lint_recipe
from ironserve.render import render
from ironserve.units import exec_argv

from .seedtext import seed_path

CORPUS = yaml.safe_load((Path(__file__).parent / "data" / "wild_commands.yaml").read_text())["commands"]
HW = catalogue.hardware_profiles()
SEED_FILES = (
    "000_8d2c9ec68014ff04.txt",
    "001_45edfcf67fbf0cd0.txt",
    "002_3173a1ba003fc433.txt",
    "003_1e5a1bcf0c771155.txt",
    "004_0160d81ec05791b7.txt",
)
ROUND_TRIP = [c for c in CORPUS if "error" not in c["expect"]]
# flags whose value the renderer writes per host (placement), or import moves into the topology
PLACED = {
    "--dist-init-addr",
    "--node-rank",
    "--nnodes",
    "--disaggregation-mode",
    "--disaggregation-bootstrap-port",
    "--host",
}


def test_corpus_is_big_enough_and_cited():
    assert len(ROUND_TRIP) >= 20
    assert all(c["source"].startswith("github.com/") for c in CORPUS)
    kinds = {c["expect"]["topology"] for c in ROUND_TRIP}
    assert {"single", "multinode-tp", "pd-disaggregation", "replicas"} <= kinds
    assert sum("docker run" in c["text"] for c in ROUND_TRIP) >= 4
    assert sum("sglang_router" in c["text"] for c in ROUND_TRIP) >= 5
    seeds = " ".join(seed_path(name).read_text(errors="replace") for name in SEED_FILES)
    for entry in CORPUS:  # none from the seeds: no model path of the corpus appears in them
        for command, _ in parse_script(entry["text"]).commands:
            model = (_flag_map(command.flags).get("--model-path") or [""])[0]
            assert not model or SHELL_VAR.search(model) or model not in seeds, (entry["id"], model)


def _import(entry, tmp_path: Path):
    hw = entry["hardware"]
    result = import_script(entry["text"], hw, f"wild-{entry['id']}", hardware_arch=HW[hw].accelerator.arch)
    path = tmp_path / f"wild-{entry['id']}.yaml"
    path.write_text(yaml.safe_dump(result.data, sort_keys=False))
    recipe = catalogue.load_recipe_file(path, HW)  # the file loads like any recipe (spec and catalogue checks)
    return result, recipe


def _hosts(result, recipe):
    """Inventory hosts at the addresses the commands name (documentation hosts where they name none)."""
    hosts = []
    for n in range(recipe.topology.node_count):
        address = result.hosts[n] if n < len(result.hosts) and result.hosts[n] else f"192.0.2.{n + 10}"
        hosts.append(InventoryHost(f"h{n}", {"ssh_hostname": address, "nic": "eth0"}))
    return hosts


def _expected_value(values: list[str]) -> list[str]:
    """Values as import writes them: shell variables become <name> inputs."""
    return [SHELL_VAR.sub(lambda m: f"<{var_name(m)}>", v) for v in values]


def _flag_map(flags: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, values in split_flags(flags):
        flag = canonical(name)  # argparse abbreviations (--trust-remote) and aliases: the full name import writes
        out[flag] = values
    return out


def _engine_expectation(command: Command) -> dict[str, list[str]]:
    out = {}
    for flag, values in _flag_map(command.flags).items():
        if flag in PLACED or flag in ("--api-key", "--model-path") or flag.startswith("--router-"):
            continue
        out[flag] = _expected_value(values)  # a variable (--port ${PORT}) is kept as <PORT>, never dropped
    out.setdefault("--enable-metrics", [])  # SGLang's metrics: ironserve's default (server.enable_metrics)
    return out


def _rendered_flags(argv: list[str]) -> dict[str, list[str]]:
    command = parse_command(argv)
    return {
        f: v
        for f, v in _flag_map(command.flags).items()
        if f not in PLACED and f != "--model-path" and not f.startswith("--router-")
    }


def _match(processes, command: Command, index_by_role: dict):
    flags = _flag_map(command.flags)
    role = (flags.get("--disaggregation-mode") or ["server"])[0]
    rank = int((flags.get("--node-rank") or ["0"])[0]) if (flags.get("--node-rank") or ["0"])[0].isdigit() else 0
    mine = [p for p in processes if p.role == role and p.node_rank == rank]
    n = index_by_role.get((role, rank), 0)
    index_by_role[(role, rank)] = n + 1
    return mine[min(n, len(mine) - 1)]


def _expected_fields(recipe, expect: dict) -> None:
    """The recipe fields an entry names in expect: topology, launcher, family, runtime, engine, env_unset."""
    assert recipe.topology.kind == expect["topology"]
    got = {
        "launcher": recipe.engine.launcher,
        "family": recipe.model.family,
        "runtime": recipe.runtime.kind,
        "engine": recipe.engine.sglang,
        "env_unset": recipe.env_unset,
    }
    for key, value in got.items():
        if key in expect:
            assert value == expect[key], key


@pytest.mark.parametrize("entry", ROUND_TRIP, ids=[c["id"] for c in ROUND_TRIP])
def test_imports_and_round_trips(entry, tmp_path):
    result, recipe = _import(entry, tmp_path)
    expect = entry["expect"]
    _expected_fields(recipe, expect)
    assert recipe.engine.check_version, "the real-parser check never silently skips an imported recipe"
    rules = {f.rule for f in result.findings}
    for name in expect.get("set_values", []):
        assert any(
            f.rule == "import-set-value" and (name in f.message or name == "model" and f.where == "model")
            for f in result.findings
        ), (name, [f.line() for f in result.findings])
    for name in expect.get("secrets", []):
        assert "import-secret" in rules
        assert name not in yaml.safe_dump(result.data)
    assert not SHELL_VAR.search(yaml.safe_dump(result.data).replace("<", "(")), "no shell variable left to render"

    hosts = _hosts(result, recipe)
    rendered = render(recipe, hosts, "inventory")
    script = parse_script(entry["text"])
    engines = [c for c, _ in script.commands if c.kind != "router"]
    index: dict = {}
    for command in engines:
        proc = _match([p for p in rendered.processes if p.role != "router"], command, index)
        assert _rendered_flags(proc.argv) == _engine_expectation(command), proc.unit
        _same_placed_values(proc, command)
        # env: the command's (prefix, export, docker -e) minus secrets; variables as import said
        env = {**(command.docker.env if command.docker else {}), **command.env}
        want = {
            k: _expected_value([v])[0] for k, v in env.items() if k not in ("HF_TOKEN",) and not k.endswith("_IFNAME")
        }
        got = {k: v for k, v in proc.env.items() if not k.endswith("_IFNAME")}
        assert got == want, proc.unit
        if command.docker:
            _same_container(recipe, proc, command)
    routers = [c for c, _ in script.commands if c.kind == "router"]
    if routers:
        (router_proc,) = [p for p in rendered.processes if p.role == "router"]
        _same_router(routers[0], router_proc)
    if recipe.topology.router and not routers:
        assert "import-router-added" in rules  # PD commands without their router: one is added, and said
    for flag in expect.get("renamed", []):  # a flag of an older release: named with its successor
        assert any(f.rule == "import-renamed-flag" and f.where == flag for f in result.findings), flag
    if "dist_init_port" in expect:  # an explicit dist-init port is kept, whichever rank's command names it
        assert {g.dist_init_port for g in recipe.topology.groups} == {expect["dist_init_port"]}
    if "pd_half" in expect:  # one half alone: that half, no router, and a finding saying how to import the rest
        assert [g.role for g in recipe.topology.groups] == [expect["pd_half"]] * len(recipe.topology.groups)
        assert recipe.topology.router is None and "import-pd-half" in rules

    # the imported recipe lints without errors other than the values import asked the user to set and flags the
    # chosen engine no longer takes (what lint is for)
    allowed = {"unset-value", "engine-dropped-flag"}
    if not engines:  # a router alone: the engines' flags are the user's to write (lint says which the hardware needs)
        allowed.add("pd-ascend-transfer-backend")
    errors = [f.line() for f in lint_recipe(recipe, HW) if f.severity is Severity.error and f.rule not in allowed]
    assert not errors


def _same_placed_values(proc, command: Command):
    """Values import knows are kept exactly, the ones it cannot know are carried as <name>, never invented: the
    model path of a variable, the dist-init port whichever rank's command names it."""
    flags = _flag_map(command.flags)
    model = (flags.get("--model-path") or [""])[0]
    if SHELL_VAR.search(model):
        assert _flag_map(parse_command(proc.argv).flags)["--model-path"] == _expected_value([model])
    dist_init = (flags.get("--dist-init-addr") or [""])[0]
    if ":" in dist_init and proc.dist_init_port is not None:
        port = dist_init.rsplit(":", 1)[1]
        assert str(proc.dist_init_port) == _expected_value([port])[0], proc.unit


def _same_container(recipe, proc, command: Command):
    original = command.docker
    got = parse_command(exec_argv(recipe, proc)).docker
    assert got is not None
    for attr in ("image", "digest", "shm_size", "ipc", "network", "gpus", "privileged", "cpuset_cpus", "entrypoint"):
        assert getattr(got, attr) == getattr(original, attr), attr
    for attr in ("devices", "other"):
        assert getattr(got, attr) == _expected_value(getattr(original, attr)), attr
    assert set(_expected_value(original.volumes)) <= set(got.volumes)
    assert {k: v for k, v in got.ulimits.items() if k in original.ulimits} == original.ulimits
    assert got.env_files[1:] == original.env_files  # the unit's own 0600 env file comes first
    assert got.name == proc.unit and got.dropped == ["--rm"] and not got.detach


def _same_router(command: Command, proc):
    want = _flag_map(command.flags)
    got = _flag_map(parse_command(proc.argv).flags)
    for key, default in ROUTER_DEFAULTS.items():
        want.setdefault(f"--{key}", [str(default)])
    # URLs: same ports (and bootstrap ports); addresses are the inventory's, which the test took from the URLs
    for flag in ("--prefill", "--decode", "--worker-urls"):
        if flag in want:
            assert flag in got
    prefill = [a for a in _pairs(command.flags, "--prefill")]
    got_prefill = [a for a in _pairs(parse_command(proc.argv).flags, "--prefill")]
    assert [(_port(u), int(b) if b else DEFAULT_BOOTSTRAP_PORT) for u, b in prefill] == [
        (_port(u), int(b)) for u, b in got_prefill
    ]
    assert [_port(u) for u, _ in _pairs(command.flags, "--decode")] == [
        _port(u) for u, _ in _pairs(parse_command(proc.argv).flags, "--decode")
    ]
    for flag in set(want) - {"--prefill", "--decode", "--worker-urls"}:
        assert got.get(flag) == _expected_value(want[flag]), flag
    assert proc.env == {k: _expected_value([v])[0] for k, v in command.env.items()}  # the router's env prefix


def _pairs(flags: list[str], name: str):
    out = []
    for flag, values in split_flags(flags):
        if flag == name:
            out.append((values[0], values[1] if len(values) > 1 else None))
    return out


def _port(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


@pytest.mark.parametrize("entry", [c for c in CORPUS if "error" in c["expect"]], ids=lambda c: c["id"])
def test_what_cannot_be_a_recipe_is_refused_with_a_fix(entry):
    with pytest.raises(CommandError) as err:
        import_script(entry["text"], entry["hardware"], "x", hardware_arch=HW[entry["hardware"]].accelerator.arch)
    assert entry["expect"]["error"] in str(err.value) and err.value.fix
