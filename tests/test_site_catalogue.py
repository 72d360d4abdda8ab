"""Hardware and recipes as data: the open arch grammar, the catalogue's Hopper/Blackwell profiles, site recipe
directories layered over the catalogue (IRONSERVE_RECIPES, --recipes, the project's recipes/) with clashes refused,
`--data recipe=FILE.yaml`, and lint rules of SM120 that stay on SM120."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from ironserve import catalogue
from ironserve.cli import main
from ironserve.lint import lint_pasted
from ironserve.problems import SpecError
from ironserve.spec import Accelerator

SITE = Path(__file__).resolve().parent / "data" / "site" / "recipes"
SITE_RECIPE = "llama3-8b-h100-tp1"


@pytest.fixture(autouse=True)
def _no_site_dirs(monkeypatch):
    monkeypatch.delenv("IRONSERVE_RECIPES", raising=False)
    yield
    catalogue.use_recipe_dirs([])


def _accelerator(**over):
    return {
        "vendor": "nvidia",
        "arch": "sm90",
        "name": "x",
        "count": 8,
        "memory_gib": 80,
        "interconnect": "nvswitch",
        **over,
    }


@pytest.mark.parametrize(
    "arch,vendor",
    [
        ("sm80", "nvidia"),
        ("sm86", "nvidia"),
        ("sm89", "nvidia"),
        ("sm90", "nvidia"),
        ("sm100", "nvidia"),
        ("sm103", "nvidia"),
        ("sm120", "nvidia"),
        ("ascend-a3", "huawei"),
        ("ascend-a5", "huawei"),
        ("none", "none"),
    ],
)
def test_arch_is_an_open_grammar(arch, vendor):
    assert Accelerator.model_validate(_accelerator(arch=arch, vendor=vendor)).arch == arch


@pytest.mark.parametrize(
    "arch,vendor,says",
    [
        ("sm9", "nvidia", "not an accelerator architecture"),
        ("sm90 ", "nvidia", "not an accelerator architecture"),
        ("sm90;id", "nvidia", "not an accelerator architecture"),
        ("hopper", "nvidia", "not an accelerator architecture"),
        ("ascend-a3", "nvidia", "not an architecture of vendor nvidia"),
        ("sm90", "huawei", "not an architecture of vendor huawei"),
    ],
)
def test_arch_refuses_what_is_not_one(arch, vendor, says, tmp_path):
    hw = tmp_path / "hardware.yaml"
    hw.write_text(
        yaml.safe_dump(
            {
                "profiles": [
                    {
                        "id": "mine",
                        "description": "d",
                        "cpu_arch": "x86_64",
                        "accelerator": _accelerator(arch=arch, vendor=vendor),
                    }
                ]
            }
        )
    )
    with pytest.raises(SpecError) as err:
        catalogue.load_hardware(hw)
    assert says in str(err.value) and "profiles[0].accelerator" in str(err.value)


def test_the_catalogue_has_hopper_and_blackwell_profiles():
    hw = catalogue.hardware_profiles()
    expect = {
        "h100-sxm": ("sm90", 8, "x86_64"),
        "h200": ("sm90", 8, "x86_64"),
        "b200": ("sm100", 8, "x86_64"),
        "gb300": ("sm103", 4, "aarch64"),
    }
    for pid, (arch, count, cpu) in expect.items():
        p = hw[pid]
        assert (p.accelerator.arch, p.accelerator.count, p.cpu_arch) == (arch, count, cpu), pid
        assert p.driver_branch == "580" and p.toolkit == "13.0" and p.tuning.limits.memlock == "unlimited", pid
    assert hw["gb300"].accelerator.interconnect == "nvlink-mnnvl"  # IMEX, as GB200
    assert hw["h200"].accelerator.memory_gib > hw["h100-sxm"].accelerator.memory_gib


def test_sm120_findings_stay_on_sm120():
    hw = catalogue.hardware_profiles()
    ep = "python3 -m sglang.launch_server --model-path m/DeepSeek-V3 --tp-size 8 --ep-size 8"
    kimi = "python3 -m sglang.launch_server --model-path moonshotai/Kimi-K2.5 --tp-size 8 --kv-cache-dtype fp8_e4m3"
    legacy = "python3 -m sglang.launch_server --model-path m/x --tp-size 8 --disable-custom-all-reduce"
    for command, rule in ((ep, "ep-on-pcie"), (kimi, "kimi-fp8-kv-slow"), (legacy, "legacy-disable-custom-all-reduce")):
        rules = {
            pid: {f.rule for f in lint_pasted(shlex.split(command), hw[pid])}
            for pid in ("rtx6000-pro", "h100-sxm", "b200", "gb300")
        }
        assert rule in rules["rtx6000-pro"], (rule, rules)
        assert not [pid for pid in ("h100-sxm", "b200", "gb300") if rule in rules[pid]], (rule, rules)


def test_a_site_directory_adds_to_the_catalogue(monkeypatch, capsys):
    before = set(catalogue.catalogue())
    monkeypatch.setenv("IRONSERVE_RECIPES", str(SITE))
    assert set(catalogue.catalogue()) == before | {SITE_RECIPE}
    assert catalogue.default_recipe("llama3", "h100-sxm").id == SITE_RECIPE
    assert catalogue.default_recipe("glm5", "rtx6000-pro").id == "glm5-nvfp4-mtp-rtx6000-tp8"  # the catalogue's
    assert main(["render", SITE_RECIPE, "--format", "shell"]) == 0
    assert "--model-path meta-llama/Llama-3.1-8B-Instruct" in capsys.readouterr().out


def test_the_projects_recipes_and_the_option_add_too(tmp_path, monkeypatch, capsys):
    project = tmp_path / "project"
    shutil.copytree(SITE, project / "recipes")
    monkeypatch.chdir(project)
    assert SITE_RECIPE in catalogue.catalogue()
    monkeypatch.chdir(tmp_path)
    assert SITE_RECIPE not in catalogue.catalogue()
    assert main(["--recipes", str(SITE), "render", "--list"]) == 0
    assert SITE_RECIPE in capsys.readouterr().out
    assert main(["--recipes", str(tmp_path / "missing"), "render", "--list"]) == 2
    assert "recipe directory not found" in capsys.readouterr().err


def test_a_clashing_id_is_an_error_naming_both_files(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    shutil.copytree(SITE, site)
    shutil.copy(catalogue.recipes_dir() / "tiny-cpu.yaml", site / "tiny-cpu.yaml")
    (site / "hardware.yaml").write_text(
        yaml.safe_dump(
            {"profiles": [{"id": "h200", "description": "mine", "cpu_arch": "x86_64", "accelerator": _accelerator()}]}
        )
    )
    monkeypatch.setenv("IRONSERVE_RECIPES", str(site))
    assert main(["render", "--list"]) == 2
    err = capsys.readouterr().err
    assert "recipe 'tiny-cpu' is also defined in" in err and "tiny-cpu.yaml" in err
    assert "hardware profile 'h200' is also defined in" in err and "never replace" in err
    assert "Traceback" not in err


def test_data_recipe_names_a_yaml_file_absolute_or_relative(tmp_path, monkeypatch):
    from roles.context import build_context

    mine = tmp_path / "mine.yaml"
    mine.write_text((SITE / f"{SITE_RECIPE}.yaml").read_text().replace(f"id: {SITE_RECIPE}", "id: mine"))
    for ref in (str(mine), "mine.yaml", "./mine.yaml"):
        monkeypatch.chdir(tmp_path)
        ctx = build_context("llama3", "h1", [("h1", {"hardware": "h100-sxm", "recipe": ref})])
        assert ctx.recipe.id == "mine" and ctx.profile.accelerator.arch == "sm90"
    with pytest.raises(SpecError) as err:
        build_context("llama3", "h1", [("h1", {"hardware": "h100-sxm", "recipe": "mine.yaml; id"})])
    assert "h1.recipe" in str(err.value)


def test_nvswitch_boards_and_only_they_need_fabric_manager():
    hw = catalogue.hardware_profiles()
    assert {pid for pid, p in hw.items() if p.fabric_manager} == {"h100-sxm", "h200", "b200"}
    assert all(hw[pid].accelerator.interconnect == "nvswitch" for pid in ("h100-sxm", "h200", "b200"))
    # PCIe cards have no NVSwitch; GB200/GB300 trays use IMEX, their NVLink switch trays are managed off the node
    assert not any(hw[pid].fabric_manager for pid in ("rtx6000-pro", "rtx6000-pro-maxq", "gb200", "gb300"))


@pytest.mark.parametrize(
    "vendor,arch,interconnect",
    [("nvidia", "sm120", "pcie"), ("nvidia", "sm100", "nvlink-mnnvl"), ("huawei", "ascend-a3", "hccs")],
)
def test_fabric_manager_is_refused_where_there_is_no_nvswitch(vendor, arch, interconnect, tmp_path):
    hw = tmp_path / "hardware.yaml"
    hw.write_text(
        yaml.safe_dump(
            {
                "profiles": [
                    {
                        "id": "mine",
                        "description": "d",
                        "cpu_arch": "x86_64",
                        "fabric_manager": True,
                        "accelerator": _accelerator(vendor=vendor, arch=arch, interconnect=interconnect),
                    }
                ]
            }
        )
    )
    with pytest.raises(SpecError) as err:
        catalogue.load_hardware(hw)
    assert "fabric_manager: true is for NVIDIA boards with interconnect nvswitch" in str(err.value)
    assert "write fabric_manager: false" in str(err.value) and "profiles[0]" in str(err.value)
