"""A mixed lab (`lab up --nodes N --hardware P --plus PROFILE:N`): hosts of several stand-in profiles on one bridge,
each profile's runtimes and images built, every host its own profile; no root (the bring-up itself runs in CI's mixed
stage, scripts/test)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from ironserve_lab import cli, cluster, cpu_runtime, cuda_runtime, needs, npu_runtime, state, system
from ironserve_lab.state import LabState
from ironserve_lab.system import LabError

from ..e2e.test_recipe_matrix_lab import SECOND_PROFILE
from ..recipe_matrix import ELSEWHERE, matrix

ROOT = Path(__file__).resolve().parents[2]
MATRIX_MODULE = "tests/e2e/test_recipe_matrix_lab.py"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ironserve")
    cli.add_lab_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["lab", "up", *argv])


def test_plus_adds_hosts_of_other_profiles_in_order():
    args = parse("--nodes", "5", "--hardware", "gb200", "--plus", "rtx6000-pro-maxq:2", "--plus", "atlas-800i-a3:1")
    assert args.plus == [("rtx6000-pro-maxq", 2), ("atlas-800i-a3", 1)]
    assert cluster.host_plan(args.nodes, args.hardware, tuple(args.plus)) == [
        ("gb200", 5),
        ("rtx6000-pro-maxq", 2),
        ("atlas-800i-a3", 1),
    ]
    assert parse("--nodes", "2").plus == []


@pytest.mark.parametrize("bad", ["rtx6000:2", "gb200:0", "gb200", "gb200:-1", "gb200:two", ":2"])
def test_a_plus_that_is_no_profile_and_count_is_refused_by_the_parser(bad, capsys):
    with pytest.raises(SystemExit) as caught:
        parse("--plus", bad)
    assert caught.value.code == 2
    assert "PROFILE:N" in capsys.readouterr().err


def test_a_plan_with_no_hosts_of_a_profile_or_an_unknown_one_is_refused():
    with pytest.raises(LabError, match="--nodes must be at least 1"):
        cluster.host_plan(0, "cpu-lab")
    with pytest.raises(LabError, match="--plus gb200:0: at least 1 host"):
        cluster.host_plan(2, "cpu-lab", (("gb200", 0),))
    with pytest.raises(LabError, match="unknown hardware 'h100'"):
        cluster.host_plan(2, "cpu-lab", (("h100", 1),))
    with pytest.raises(LabError, match=f"at most {state.MAX_HOSTS}"):
        cluster.host_plan(state.MAX_HOSTS, "cpu-lab", (("gb200", 1),))


def test_for_and_plus_together_are_refused_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("IRONSERVE_LAB_DIR", str(tmp_path))
    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster, "ensure_tools", lambda: pytest.fail("tools checked before the arguments"))
    with pytest.raises(LabError, match="--for builds for one profile"):
        cluster.up(2, "rtx6000-pro-maxq", ("glm5",), (("atlas-800i-a3", 2),))
    assert not (tmp_path / "state.json").exists()


def test_each_host_gets_its_profile_and_the_state_says_so(tmp_path):
    lab = LabState(hardware="gb200")
    cluster._size_hosts(tmp_path, lab, [("gb200", 2), ("rtx6000-pro-maxq", 1), ("atlas-800i-a3", 1)])
    assert [(h.name, h.hardware) for h in lab.hosts] == [
        ("lab1", "gb200"),
        ("lab2", "gb200"),
        ("lab3", "rtx6000-pro-maxq"),
        ("lab4", "atlas-800i-a3"),
    ]
    assert [h["hardware"] for h in state.load(tmp_path).status()["hosts"]] == [h.hardware for h in lab.hosts]
    assert len((tmp_path / "ssh" / "known_hosts").read_text().splitlines()) == 4
    # an up without --plus re-profiles the running hosts in place (same names, addresses and keys)
    cluster._size_hosts(tmp_path, lab, [("cpu-lab", 4)])
    assert {h.hardware for h in lab.hosts} == {"cpu-lab"} and len(lab.hosts) == 4


def test_a_mixed_lab_builds_what_each_profile_uses_and_one_site_lock_for_every_stand_in_image():
    mixed = [needs.resolve(p, []) for p in ("gb200", "rtx6000-pro-maxq", "atlas-800i-a3")]
    assert cluster._runtimes(mixed) == [r for r in cluster.RUNTIMES if r in (cuda_runtime.RUNTIME, npu_runtime.RUNTIME)]
    # the parser image (the CPU runtime's pins) under the NVIDIA stand-ins
    assert cpu_runtime.RUNTIME in cluster._first_runtimes(mixed)
    gpu = {r.id for r in cluster._gpu_recipes(mixed)}
    assert "glm5-nvfp4-gb200-disagg" in gpu and "glm5-nvfp4-mtp-rtx6000-tp8" in gpu
    assert gpu == {r.id for r in cluster._gpu_recipes(mixed[0])} | {r.id for r in cluster._gpu_recipes(mixed[1])}
    assert cluster._gpu_recipes(mixed[2]) == []  # Atlas recipes are uv runtimes


def test_build_makes_what_the_plans_up_builds_and_touches_no_lab(tmp_path, monkeypatch):
    """`lab build` with a mixed plan: each wheelhouse once, the stand-ins' layers, then the parser image they sit on
    (never the cpu-lab image for NVIDIA and Atlas profiles); no state, index, registry, bridge or host."""
    monkeypatch.setenv("IRONSERVE_LAB_DIR", str(tmp_path))
    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster, "ensure_tools", lambda: None)
    monkeypatch.setattr(cluster.rootfs, "ensure_base", lambda root: root / "base")
    built = []
    monkeypatch.setattr(cluster.runtime, "ensure", lambda r: built.append(r.name) or tmp_path / r.name)
    monkeypatch.setattr(cluster.gpu_images, "prepare_layers", lambda recipes, base: built.append("layers"))
    monkeypatch.setattr(cluster.runtime_image, "ensure", lambda base, wheels, venv=None: built.append(venv) or ("ref",))
    touched = [
        (cluster.supply, "start_server"),
        (cluster.supply, "add_wheels"),
        (cluster.registry, "start_server"),
        (cluster.network, "ensure_bridge"),
        (cluster.runtime, "publish"),
        (cluster, "_boot"),
    ]
    for module, name in touched:
        monkeypatch.setattr(module, name, lambda *a, name=name, **k: pytest.fail(f"{name}: a lab touched"))
    said = cluster.build(1, "gb200", (("rtx6000-pro-maxq", 1), ("atlas-800i-a3", 1)))
    firsts = [r.name for r in cluster._first_runtimes([needs.resolve(p, []) for p in ("gb200", "rtx6000-pro-maxq")])]
    assert built[: len(firsts)] == firsts and built.count(cuda_runtime.RUNTIME.name) == 1
    # the stand-ins' layers are made beside the parser image (as `up` makes them): last, in either order
    last = ["layers", cpu_runtime.RUNTIME.name, cluster.runtime_image.PARSER]
    assert npu_runtime.RUNTIME.name in built and sorted(built[-3:], key=str) == sorted(last, key=str)
    assert said[-1].startswith("the parser image") and not any("CPU runtime image" in s for s in said)
    assert [p.name for p in tmp_path.iterdir()] == ["lab.lock"]  # no state: taken for the base rootfs only


def test_build_refuses_a_bad_plan_before_the_tools_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("IRONSERVE_LAB_DIR", str(tmp_path))
    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster, "ensure_tools", lambda: pytest.fail("tools checked before the plan"))
    with pytest.raises(LabError, match="--plus gb200:0: at least 1 host"):
        cluster.build(2, "cpu-lab", (("gb200", 0),))
    assert list(tmp_path.iterdir()) == []


def test_build_takes_the_plan_arguments_of_up():
    parser = argparse.ArgumentParser(prog="ironserve")
    cli.add_lab_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["lab", "build", "--nodes", "5", "--hardware", "gb200", "--plus", "atlas-800i-a3:8"])
    assert (args.lab_command, args.nodes, args.hardware, args.plus) == ("build", 5, "gb200", [("atlas-800i-a3", 8)])
    with pytest.raises(SystemExit):
        parser.parse_args(["lab", "build", "--for", "glm5"])  # one profile's subset is `up --for`'s


def stage_arrays() -> dict[str, list[str]]:
    """scripts/test's stage arrays (``NAME=(...)``), each element as bash reads it."""
    text = (ROOT / "scripts" / "test").read_text()
    return {
        name: shlex.split(body, comments=True) for name, body in re.findall(r"^([A-Z_]+)=\((.*?)\)$", text, re.M | re.S)
    }


def stage_hosts(up: list[str]) -> dict[str, str]:
    """A stage's hosts (lab1, lab2, ... in plan order) and their hardware profiles."""
    args = parse(*up)
    plan = cluster.host_plan(args.nodes, args.hardware, tuple(args.plus))
    return {f"lab{i}": profile for i, profile in enumerate([p for p, n in plan for _ in range(n)], 1)}


@pytest.mark.parametrize("up,streams", [("SHARED_UP", "SHARED"), ("MIXED_UP", "MIXED")])
def test_each_stage_stream_has_hosts_of_its_own_among_the_stages(up, streams):
    arrays = stage_arrays()
    profiles = stage_hosts(arrays[up])
    hosts = [name for stream in arrays[streams] for name in stream.split(" ", 1)[0].split(",")]
    assert len(hosts) == len(set(hosts)), hosts
    assert set(hosts) <= set(profiles), (hosts, profiles)


def test_the_mixed_stage_runs_every_matrix_test_in_exactly_one_stream_with_the_hosts_it_needs():
    """The matrix split between streams by their hosts (marker lab_profile): each recipe's hardware in one stream
    only, with as many hosts of it as the recipe places; the Python 3.12 tests' profile in one stream too."""
    arrays = stage_arrays()
    profiles = stage_hosts(arrays["MIXED_UP"])
    streams = [s.split(" ", 1)[0].split(",") for s in arrays["MIXED"] if s.split(" ", 1)[1] == MATRIX_MODULE]
    assert len(streams) >= 2
    for entry in [e for e in matrix() if e.recipe not in ELSEWHERE]:
        runs = [s for s in streams if entry.hardware in {profiles[h] for h in s}]
        assert len(runs) == 1, (entry.recipe, entry.hardware, streams)
        assert sum(profiles[h] == entry.hardware for h in runs[0]) >= entry.hosts, (entry.recipe, runs[0])
    assert sum(any(profiles[h] == SECOND_PROFILE[0] for h in s) for s in streams) == 1


def test_without_an_image_every_wheelhouse_is_built_beside_the_rootfs_bootstrap():
    """`up --for` venv recipes builds no image: their wheelhouses go beside the bootstrap, not after it."""
    venv_only = [needs.resolve("cpu-lab", ["tiny-cpu", "tiny-cpu-tp2"])]
    assert not cluster._wants_cpu_image(venv_only)
    assert cluster._first_runtimes(venv_only) == cluster._runtimes(venv_only) == [cpu_runtime.RUNTIME]
    with_image = [needs.resolve("cpu-lab", [])]  # tiny-cpu-docker: the CPU runtime image, built from its wheelhouse
    assert cluster._first_runtimes(with_image) == [cpu_runtime.RUNTIME] and cluster._wants_cpu_image(with_image)
