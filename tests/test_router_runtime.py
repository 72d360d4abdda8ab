"""Routers run from their own venv of the recipe's pinned sglang-router, and their argv is probed there.

Issue 19's third failure: the GB200 disagg recipe's router ran (and was probed) in the Dynamo engine image, which has
no sglang_router ("No module named 'sglang_router'"). Every router with a pinned version gets its own venv
(sglang-router==engine.router: on the OS's python3 beside a docker runtime, on the uv runtime's Python beside a uv
one): a dedicated router host installs no engine runtime (issue 30), and an engine runtime's upgrade leaves the
router's unit as it is.
"""

from __future__ import annotations

import pytest

from ironserve import catalogue
from ironserve.render import render
from ironserve.units import exec_argv, router_venv, unit_files, venv_path
from roles.sglang_service import parse_check_argv

GB200 = "glm5-nvfp4-gb200-disagg"


def router_of(recipe_id: str):
    recipe = catalogue.get_recipe(recipe_id)
    return recipe, next(p for p in render(recipe).processes if p.role == "router")


def test_gb200_router_runs_and_is_probed_in_its_own_venv():
    recipe, proc = router_of(GB200)
    venv = router_venv(recipe)
    assert venv == f"/opt/ironserve/venvs/sglang-router-{recipe.engine.router}"
    argv = exec_argv(recipe, proc)
    assert argv[:3] == [f"{venv}/bin/python3", "-m", "sglang_router.launch_router"]
    assert "docker" not in " ".join(argv)
    probe = parse_check_argv(recipe, proc)
    assert probe[0] == f"{venv}/bin/python3" and "--kind" in probe and "router" in probe and "docker" not in probe
    unit = unit_files(recipe, proc, recipe.tuning or catalogue.hardware_profiles()["gb200"].tuning).unit_text
    assert f"{venv}/bin/python3" in unit and "docker run" not in unit
    # the engines stay in the image
    engine = next(p for p in render(recipe).processes if p.role != "router")
    assert exec_argv(recipe, engine)[0] == "/usr/bin/docker"


def test_a_uv_runtime_router_runs_and_is_probed_in_its_own_venv_on_the_runtimes_python():
    for recipe_id in ("tiny-cpu", "glm5.1-w4a8-a3-1p1d-32-16k"):
        recipe, proc = router_of(recipe_id)
        venv = f"/opt/ironserve/venvs/sglang-router-{recipe.engine.router}-py{recipe.runtime.python}"
        assert router_venv(recipe) == venv
        argv = exec_argv(recipe, proc)
        assert argv[:3] == [f"{venv}/bin/python3", "-m", "sglang_router.launch_router"], argv
        assert parse_check_argv(recipe, proc)[0] == f"{venv}/bin/python3"
        # the engines stay in the runtime's venv, whose name the router's unit never carries
        engine = next(p for p in render(recipe).processes if p.role != "router")
        assert f"{venv_path(recipe)}/bin/python3" in exec_argv(recipe, engine)
        assert venv_path(recipe) not in " ".join(argv)


def test_a_runtime_upgrade_leaves_the_router_unit_as_it_is():
    recipe, proc = router_of("tiny-cpu")
    tuning = catalogue.hardware_profiles()["cpu-lab"].tuning
    pins = [p if not p.startswith("torch==") else "torch==2.13.1+cpu" for p in recipe.runtime.packages]
    upgraded = recipe.model_copy(update={"runtime": recipe.runtime.model_copy(update={"packages": pins})})
    assert venv_path(upgraded) != venv_path(recipe)
    assert unit_files(upgraded, proc, tuning).unit_text == unit_files(recipe, proc, tuning).unit_text


def _tiny_hosts():
    return [
        ("r0", {"hardware": "cpu-lab", "ironserve_role": "router", "allow_open_bind": True}),
        ("n0", {"hardware": "cpu-lab", "allow_open_bind": True}),
        ("n1", {"hardware": "cpu-lab", "allow_open_bind": True}),
    ]


def test_a_dedicated_router_host_gets_the_router_venv_and_no_engine_runtime():
    from roles import uv_env
    from roles.context import build_context
    from roles.deployment import roles_for

    recipe = catalogue.get_recipe("tiny-cpu")
    router, engine = (build_context("tiny", name, _tiny_hosts()) for name in ("r0", "n0"))
    assert router.is_router_only and "uv_env" not in [r.name for r in roles_for(router)]
    assert "uv_env" in [r.name for r in roles_for(engine)]
    # the preflight checks the interpreter of each venv the host gets
    assert uv_env.venvs_of(router) == [(router_venv(recipe), "3.11")]
    assert uv_env.venvs_of(engine) == [(venv_path(recipe), "3.11")]
    # the audit (the same roles) expects the router venv on the router host, the runtime's on the engine hosts
    from ironserve.audit.providers import runtime_checks

    assert [c.id for c in runtime_checks(router)] == [f"venv-packages:{router_venv(recipe)}"]
    assert [c.id for c in runtime_checks(engine)] == [f"venv-packages:{venv_path(recipe)}"]
    # the router's venv is installed in the runtime stage, timed with the runtimes (its stage metric)
    assert [(r.name, r.stage) for r in roles_for(router) if r.stage == "runtime"] == [("router_runtime", "runtime")]


def test_a_uv_runtime_pinning_another_router_version_is_refused_naming_both_keys(tmp_path):
    import yaml

    from ironserve.problems import SpecError

    data = yaml.safe_load(catalogue.recipe_file("tiny-cpu").read_text())
    data["runtime"]["packages"] = [
        "sglang-router==0.3.1" if p.startswith("sglang-router==") else p for p in data["runtime"]["packages"]
    ]
    path = tmp_path / "tiny-cpu.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as err:
        catalogue.load_recipe_file(path)
    (problem,) = err.value.problems
    assert problem.field == "runtime" and "sglang-router==0.3.1" in problem.message and "0.3.2" in problem.message
    assert "write the same version in both" in problem.fix


def test_recipes_without_a_router_need_no_router_venv():
    for recipe_id, recipe in catalogue.catalogue().items():
        if recipe.topology.router is None:
            assert router_venv(recipe) is None, recipe_id


def test_audit_checks_the_router_venv_on_the_router_host_only():
    from ironserve.audit.providers import runtime_checks
    from roles.context import build_context

    hosts = [(f"gb{i}", {"hardware": "gb200", "ssh_hostname": f"10.0.0.{i + 1}", "nic": "eth0"}) for i in range(5)]
    checks = {
        name: [c for c in runtime_checks(build_context("glm5", name, hosts)) if "sglang-router" in c.id]
        for name, _ in hosts
    }
    with_router = [name for name, found in checks.items() if found]
    assert len(with_router) == 1
    (check,) = checks[with_router[0]]
    assert check.id == "venv-packages:/opt/ironserve/venvs/sglang-router-0.3.2"
    assert check.expected == {"sglang-router": "0.3.2"}


def test_the_router_venv_resolves_within_the_runtimes_lock_where_it_holds_the_pin(monkeypatch):
    from roles import router_runtime
    from roles.context import build_context

    ctx = build_context("tiny", "r0", _tiny_hosts())
    locked = {"sglang-router==0.3.2": ["sha256:" + "a" * 64], "orjson==3.11.5": ["sha256:" + "b" * 64]}
    monkeypatch.setattr(router_runtime, "runtime_lock", lambda ctx: ({"x86_64": locked}, ""))
    assert router_runtime.router_lock(ctx, "x86_64") == locked
    assert (
        router_runtime.router_lock(ctx, "aarch64") is None
    )  # no resolution for this machine: unchecked, as the runtime
    other = {"sglang-router==0.3.1": ["sha256:" + "a" * 64]}
    monkeypatch.setattr(router_runtime, "runtime_lock", lambda ctx: ({"x86_64": other}, ""))
    assert router_runtime.router_lock(ctx, "x86_64") is None  # a lock without the router's pin cannot vouch for it
    monkeypatch.setattr(router_runtime, "runtime_lock", lambda ctx: (None, "no lock file"))
    assert router_runtime.router_lock(ctx, "x86_64") is None


def test_router_venvs_of_every_version_are_found_and_one_role_per_host_removes_the_unused(tmp_path):
    import subprocess

    from roles import router_runtime, uv_env
    from roles.context import build_context
    from roles.deployment import roles_for

    for name in ("sglang-router-0.3.1-py3.11", "sglang-router-0.2.9", "runtime-0123456789ab", "sglang-router-x", "x"):
        (tmp_path / name).mkdir()
    command = uv_env.VenvsInUse().command(root=str(tmp_path), recipe_id="tiny-cpu")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert uv_env.VenvsInUse().process(out.splitlines()) == {  # no unit of this machine names them
        str(tmp_path / "runtime-0123456789ab"): False,
        str(tmp_path / "sglang-router-0.2.9"): False,
        str(tmp_path / "sglang-router-0.3.1-py3.11"): False,
    }
    router, engine = (build_context("tiny", name, _tiny_hosts()) for name in ("r0", "n0"))
    assert router_runtime.removes_unused_venvs(router)  # a dedicated router host has no runtime role to do it
    assert not router_runtime.removes_unused_venvs(engine) and "uv_env" in [r.name for r in roles_for(engine)]
