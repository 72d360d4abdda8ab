"""Bad input fails before any host is touched, naming the file, the field and the fix (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ironserve import catalogue
from ironserve.catalogue import SpecError
from ironserve.cli import main

GOOD = catalogue.recipes_dir() / "glm5-nvfp4-mtp-rtx6000-tp8.yaml"


def write_variant(tmp_path: Path, mutate, name="glm5-nvfp4-mtp-rtx6000-tp8") -> Path:
    data = yaml.safe_load(GOOD.read_text())
    mutate(data)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def problems(path: Path) -> list:
    with pytest.raises(SpecError) as err:
        catalogue.get_recipe(str(path))
    return err.value.problems


def test_typo_in_key_names_file_field_and_suggestion(tmp_path):
    path = write_variant(tmp_path, lambda d: d["server"].__setitem__("tp_sise", 8))
    (p,) = problems(path)
    assert p.file.endswith("glm5-nvfp4-mtp-rtx6000-tp8.yaml")
    assert p.field == "server.tp_sise"
    assert "unknown key" in p.message and "tp_size" in p.fix


def test_nested_typo_suggests_within_its_section(tmp_path):
    path = write_variant(tmp_path, lambda d: d["server"]["speculative"].__setitem__("num_step", 3))
    (p,) = problems(path)
    assert p.field == "server.speculative.num_step" and "num_steps" in p.fix


def test_wrong_type(tmp_path):
    path = write_variant(tmp_path, lambda d: d["server"].__setitem__("tp_size", "eight"))
    (p,) = problems(path)
    assert p.field == "server.tp_size" and "eight" in p.fix


def test_tp_larger_than_devices(tmp_path):
    path = write_variant(tmp_path, lambda d: d["server"].__setitem__("tp_size", 16))
    found = problems(path)
    assert any(p.field == "server.tp_size" and "needs 16 devices per node" in p.message for p in found)
    assert all("lower tp_size" in p.fix for p in found if p.field == "server.tp_size")


def test_container_without_unlimited_memlock(tmp_path):
    # the default ulimits carry memlock -1: a recipe that lists its own without it loses it
    path = write_variant(
        tmp_path, lambda d: d["runtime"].setdefault("run", {}).__setitem__("ulimits", {"stack": "67108864"})
    )
    (p,) = problems(path)
    assert p.field == "runtime.run.ulimits.memlock" and "unlimited locked memory" in p.message
    assert p.fix == "add memlock: -1 to runtime.run.ulimits (docker --ulimit memlock=-1)"


def test_rank_guard_port_must_be_free(tmp_path):
    src = catalogue.recipes_dir() / "tiny-cpu-tp2.yaml"
    data = yaml.safe_load(src.read_text())
    data["topology"]["groups"][0]["dist_init_port"] = 29900  # + 100 = the server's port 30000
    path = tmp_path / "tiny-cpu-tp2.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    (p,) = problems(path)
    assert p.field == "topology.groups[0].dist_init_port" and "30000" in p.message and "server" in p.message


def test_unknown_hardware_suggests(tmp_path):
    path = write_variant(tmp_path, lambda d: d.__setitem__("hardware", ["rtx6000-pro-maxx"]))
    (p,) = problems(path)
    assert p.field == "hardware[0]" and "rtx6000-pro-maxq" in p.fix


def test_env_boolean_must_be_quoted(tmp_path):
    path = write_variant(tmp_path, lambda d: d["env"].__setitem__("SGLANG_ENABLE_SPEC_V2", True))
    (p,) = problems(path)
    assert p.field == "env.SGLANG_ENABLE_SPEC_V2" and "YAML boolean" in p.message and "quoted text" in p.fix


def test_unpinned_uv_package(tmp_path):
    def mutate(d):
        d["runtime"] = {"kind": "uv", "python": "3.12", "packages": ["sglang"]}

    (p,) = problems(write_variant(tmp_path, mutate))
    assert p.field.startswith("runtime.packages") and "not pinned" in p.message


def test_file_name_must_match_id(tmp_path):
    path = write_variant(tmp_path, lambda d: None, name="renamed")
    (p,) = problems(path)
    assert p.field == "id" and "rename" in p.fix


def test_invalid_yaml_reports_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("id: x\nserver: [unclosed\n")
    (p,) = problems(path)
    assert p.field.startswith("line ") and "YAML" in p.message


def test_cli_exit_2_with_file_field_fix(tmp_path, capsys):
    path = write_variant(tmp_path, lambda d: d["server"].__setitem__("tp_sise", 8))
    assert main(["render", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path.name) in err and "server.tp_sise" in err and "did you mean 'tp_size'" in err
    assert main(["lint", "--offline", str(path)]) == 2


def test_unknown_recipe_id_suggests(capsys):
    assert main(["render", "glm5-nvfp4-mtp-rtx6000"]) == 2
    assert "glm5-nvfp4-mtp-rtx6000-tp8" in capsys.readouterr().err


def test_topology_consistency(tmp_path):
    # one half of a PD deployment loads alone (its router runs with the other half), never with a router
    def mutate(d):
        d["topology"] = {
            "kind": "pd-disaggregation",
            "groups": [{"role": "prefill", "bootstrap_port": 8998}],
            "router": {},
        }

    (p,) = problems(write_variant(tmp_path, mutate))
    assert p.field == "topology" and "no decode group" in p.message and "router" in p.message

    def no_half(d):
        d["topology"] = {"kind": "pd-disaggregation", "groups": [{"role": "server"}], "router": {}}

    (p,) = problems(write_variant(tmp_path, no_half))
    assert p.field == "topology" and "a prefill group and a decode group" in p.message


def test_a_flag_render_derives_is_refused_in_extra_args(tmp_path):
    # later stages read the bind address, ranks and devices from the process's fields, built from typed fields
    path = write_variant(
        tmp_path, lambda d: d["server"].__setitem__("extra_args", ["--tp=4", "--watchdog-timeout", "9"])
    )
    (p,) = problems(path)
    assert p.field == "server.extra_args" and "--tp does not belong in extra_args" in p.message
    assert "server.tp_size" in p.message


def test_a_literal_secret_in_a_recipe_is_an_error_named_without_its_value(tmp_path):
    key, token = "sk-" + "a" * 30, "hf_" + "b" * 30

    def mutate(d):
        d["server"].setdefault("extra_args", []).extend(["--api-key", key])
        d.setdefault("env", {})["HF_TOKEN"] = token
        d["env"]["SOME_SETTING"] = token  # a hub token under any name

    found = problems(write_variant(tmp_path, mutate))
    fields = sorted(p.field for p in found)
    assert fields == ["env.HF_TOKEN", "env.SOME_SETTING", "server.extra_args"], fields
    text = " ".join(f"{p.message} {p.fix}" for p in found)
    assert key not in text and token not in text and "api_key_file" in text
