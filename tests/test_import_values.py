"""Import never invents or drops a value (shell variables become <name> inputs lint and deploy stop on), keeps what
it can know (explicit dist-init ports, the router's env), imports one half of a PD deployment, and chooses the
release a command's flags belong to, offline, naming renamed flags' successors."""

from __future__ import annotations

import shlex

import pytest
import yaml

from ironserve import catalogue
from ironserve.cli import main
from ironserve.commandline import parse_command
from ironserve.findings import Severity
from ironserve.importer import import_commands, import_script
from ironserve.lint import lint_recipe
from ironserve.render import render, unset_values
from ironserve.spec import Recipe

HW = catalogue.hardware_profiles()
VARS = (
    "python3 -m sglang.launch_server --model-path ${MODEL_PATH} --tp-size 8 --port ${PORT} "
    "--dist-init-addr ${MASTER}:${DIST_PORT} --nnodes 2 --node-rank ${RANK} --mem-fraction-static $MEM"
)


def _import(text: str, hardware: str = "rtx6000-pro"):
    result = import_script(text, hardware, "t", hardware_arch=HW[hardware].accelerator.arch)
    return result, Recipe.model_validate(result.data)


def _flags(argv: list[str]) -> dict[str, list[str]]:
    from ironserve.flags import split_flags

    return dict(split_flags(parse_command(argv).flags))


def test_values_import_cannot_know_are_carried_never_invented_or_dropped():
    result, recipe = _import(VARS)
    assert recipe.model.path == "<MODEL_PATH>"  # not /models/model_path
    assert recipe.server.port == "<PORT>"  # not dropped for SGLang's default
    assert recipe.topology.groups[0].dist_init_port == "<DIST_PORT>"  # not 5000
    assert recipe.server.extra_args == ["--mem-fraction-static", "<MEM>"]
    head = render(recipe).processes[0]
    flags = _flags(head.argv)
    assert flags["--model-path"] == ["<MODEL_PATH>"] and flags["--port"] == ["<PORT>"]
    assert flags["--dist-init-addr"][0].endswith(":<DIST_PORT>")
    unset = {f.message.split(" was ")[0] for f in lint_recipe(recipe, HW) if f.rule == "unset-value"}
    assert {"--model-path <MODEL_PATH>", "--port <PORT>", "--mem-fraction-static <MEM>"} <= unset
    assert all(f.severity is Severity.error for f in lint_recipe(recipe, HW) if f.rule == "unset-value")
    said = " ".join(f.message for f in result.findings if f.rule == "import-set-value")
    assert all(name in said for name in ("MODEL_PATH", "PORT", "DIST_PORT", "MEM"))
    assert {w for _, w in unset_values(render(recipe))} >= {"<MODEL_PATH>", "<PORT>"}  # what a deploy stops on


@pytest.mark.parametrize(
    "written,carried",
    [("${ROOT}/DeepSeek-V3", "<ROOT>/DeepSeek-V3"), ("/models/${NAME}", "/models/<NAME>"), ("$M", "<M>")],
)
def test_a_model_path_under_a_variable_keeps_what_is_known(written, carried):
    _, recipe = _import(f"python3 -m sglang.launch_server --model-path {written} --tp-size 2")
    assert recipe.model.path == carried
    assert _flags(render(recipe).processes[0].argv)["--model-path"] == [carried]


@pytest.mark.parametrize("written", ["${ROOT}/../x", "${A}${B}", "models/org/name", "./weights"])
def test_a_model_path_import_cannot_carry_is_refused_with_a_fix(written):
    from ironserve.commandline import CommandError

    with pytest.raises(CommandError) as err:
        _import(f"python3 -m sglang.launch_server --model-path {written} --tp-size 2")
    assert written in str(err.value) and "absolute path" in err.value.fix


def test_a_dist_init_address_in_one_variable_carries_its_port_as_an_input():
    result, recipe = _import(
        "python3 -m sglang.launch_server --model-path /m --tp-size 16 --nnodes 2 --node-rank 0 "
        "--dist-init-addr ${DIST_INIT_ADDR}"
    )
    assert recipe.topology.groups[0].dist_init_port == "<DIST_INIT_ADDR_PORT>"  # not 5000
    assert any(f.rule == "import-set-value" and "<DIST_INIT_ADDR_PORT>" in f.message for f in result.findings)


def test_a_size_that_is_a_variable_is_refused_with_a_fix():
    from ironserve.commandline import CommandError

    with pytest.raises(CommandError) as err:
        _import("python3 -m sglang.launch_server --model-path /m --tp-size ${TP}")
    assert "--tp-size" in str(err.value) and "write --tp-size N" in err.value.fix


def test_a_role_that_is_a_variable_is_refused_with_a_fix():
    from ironserve.commandline import CommandError

    with pytest.raises(CommandError) as err:
        _import("python3 -m sglang.launch_server --model-path /m --disaggregation-mode ${ROLE}")
    assert "expected prefill or decode" in str(err.value) and "--disaggregation-mode prefill" in err.value.fix


def test_bash_array_elements_are_filled_from_the_script_or_carried():
    script = (
        "D_IP=(10.0.0.5 10.0.0.6)\n"
        "python3 -m sglang.launch_server --model-path /m --tp-size 16 --host ${D_IP[1]} "
        "--dist-init-addr ${D_IP[0]}:20000 --nnodes 2 --node-rank 1\n"
    )
    result, recipe = _import(script)
    assert result.hosts == [None, "10.0.0.6"] and recipe.server.host == "{node_address}"
    assert recipe.topology.groups[0].dist_init_port == 20000  # a rank-1 command's explicit port is kept
    # pasted without the array: the element is an input to set, never "expected a value"
    result, recipe = _import("python3 -m sglang.launch_server --model-path /m --disaggregation-ib-device ${IB[0]}")
    assert recipe.server.extra_args == ["--disaggregation-ib-device", "<IB_0>"]


def test_router_env_prefix_and_variable_port_are_kept():
    text = (
        "SGLANG_DP_ROUND_ROBIN=1 RUST_LOG=info python -m sglang_router.launch_router --worker-urls "
        "http://10.0.0.1:30000 http://10.0.0.2:30000 --port ${ROUTER_PORT}\n"
    )
    _, recipe = _import(text)
    assert recipe.topology.router.env == {"SGLANG_DP_ROUND_ROBIN": "1", "RUST_LOG": "info"}
    (router,) = [p for p in render(recipe).processes if p.role == "router"]
    assert router.env == {"SGLANG_DP_ROUND_ROBIN": "1", "RUST_LOG": "info"}
    assert _flags(router.argv)["--port"] == ["<ROUTER_PORT>"]
    assert any(f.rule == "unset-value" and "<ROUTER_PORT>" in f.message for f in lint_recipe(recipe, HW))


@pytest.mark.parametrize("role,other", [("prefill", "decode"), ("decode", "prefill")])
def test_a_lone_prefill_or_decode_command_is_that_half(role, other, tmp_path):
    text = (
        f"python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp-size 8 "
        f"--disaggregation-mode {role} --port 30000 --trust-remote\n"
    )
    result, recipe = _import(text)
    assert recipe.topology.kind == "pd-disaggregation" and recipe.topology.router is None
    assert [g.role for g in recipe.topology.groups] == [role]
    (half,) = [f for f in result.findings if f.rule == "import-pd-half"]
    assert other in half.message and "--file repeated" in half.fix and "topology.router" in half.fix
    assert [p.role for p in render(recipe).processes] == [role]
    assert recipe.server.trust_remote_code or recipe.topology.groups[0].server.trust_remote_code  # --trust-remote
    assert not [f for f in lint_recipe(recipe, HW) if f.severity is Severity.error]
    # the two halves given as two files (and the router): the whole deployment
    files = []
    for n, line in enumerate(
        [
            text,
            text.replace(role, other).replace("30000", "30001"),
            "python -m sglang_router.launch_router --pd-disaggregation --prefill "
            "http://10.0.0.1:30000 --decode http://10.0.0.2:30001\n",
        ]
    ):
        files += ["--file", str(tmp_path / f"{n}.sh")]
        (tmp_path / f"{n}.sh").write_text(line)
    out = tmp_path / "r.yaml"
    assert main(["import", "--hardware", "rtx6000-pro", "--offline", *files, "--output", str(out)]) == 0
    whole = Recipe.model_validate(yaml.safe_load(out.read_text()))
    assert {g.role for g in whole.topology.groups} == {"prefill", "decode"} and whole.topology.router


@pytest.mark.parametrize(
    "flag,release,successor",
    [
        ("--enable-deepep-moe", "0.5.2", "--moe-a2a-backend deepep"),
        ("--speculative-ngram-max-match-window-size 12", "0.5.9", "--speculative-ngram-max-trie-depth"),
        ("--cuda-graph-max-bs 160", "0.5.19", "--cuda-graph-max-bs-decode"),
    ],
)
def test_engine_is_the_release_the_flags_belong_to_and_renames_are_named(flag, release, successor):
    # gb200's seed era is an image of its own: no era release to prefer, the flags decide
    result = import_commands(
        [parse_command(shlex.split(f"python3 -m sglang.launch_server --model-path /m --tp-size 4 {flag}"))],
        "gb200",
        "t",
        detect=False,
    )
    assert result.data["engine"]["sglang"] == release
    (note,) = [f for f in result.findings if f.rule == "import-engine"]
    assert flag.split()[0] in note.message and "parser takes every flag" in note.message
    (renamed,) = [f for f in result.findings if f.rule == "import-renamed-flag"]
    assert renamed.where == flag.split()[0] and successor in renamed.message


def test_the_hardware_era_release_is_kept_when_its_parser_takes_the_flags():
    result = import_commands(
        [
            parse_command(
                shlex.split("python3 -m sglang.launch_server --model-path /m --tp-size 8 --cuda-graph-max-bs 160")
            )
        ],
        "rtx6000-pro",
        "t",
    )
    assert result.data["engine"]["parser_version"] == "0.5.9"  # the seeds' era: --cuda-graph-max-bs is there
    result = import_commands(
        [parse_command(shlex.split("python3 -m sglang.launch_server --model-path /m --tp-size 8 --enable-deepep-moe"))],
        "rtx6000-pro",
        "t",
    )
    assert result.data["engine"]["sglang"] == "0.5.2" and result.data["runtime"]["kind"] == "uv"


def test_flags_of_no_single_release_are_said():
    result = import_commands(
        [
            parse_command(
                shlex.split(
                    "python3 -m sglang.launch_server --model-path /m --enable-deepep-moe --cuda-graph-max-bs-decode 8"
                )
            )
        ],
        "gb200",
        "t",
    )
    (note,) = [f for f in result.findings if f.rule == "import-engine"]
    assert "no release takes every flag" in note.message and "--enable-deepep-moe" in note.message


def test_a_deploy_stops_on_a_value_still_unset(tmp_path, monkeypatch):
    from ironserve.catalogue import SpecError
    from roles.context import build_context

    result, _ = _import("python3 -m sglang.launch_server --model-path /models/Qwen3-8B --tp-size 2 --port ${PORT}")
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(result.data, sort_keys=False))
    monkeypatch.chdir(tmp_path)  # host data names the recipe file relative to the deploy's directory
    with pytest.raises(SpecError) as err:
        build_context("t", "h1", [("h1", {"hardware": "rtx6000-pro", "recipe": "t.yaml"})])
    assert "<PORT>" in str(err.value) and "set it in the recipe" in str(err.value)


def test_units_are_not_rendered_with_a_value_still_unset(tmp_path, capsys):
    result, _ = _import(VARS)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(result.data, sort_keys=False))
    assert main(["render", str(path), "--format", "shell"]) == 0  # what runs where, inputs shown as <name>
    capsys.readouterr()
    assert main(["render", str(path), "--format", "systemd"]) == 2  # bad input: exit 2
    err = capsys.readouterr().err
    assert "<PORT>" in err and "<DIST_PORT>" in err and "set it in the recipe" in err
