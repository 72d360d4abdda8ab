"""Routers run from a runtime that has the recipe's pinned sglang-router, and their argv is probed there.

Issue 19's third failure: the GB200 disagg recipe's router ran (and was probed) in the Dynamo engine image, which has
no sglang_router ("No module named 'sglang_router'"). A router whose engine runtime lacks the pin gets its own venv
(sglang-router==engine.router on the OS's python3); a uv runtime that pins it keeps the router in the engine venv.
"""

from __future__ import annotations

from ironserve import catalogue
from ironserve.render import render
from ironserve.units import exec_argv, router_venv, unit_files
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


def test_uv_runtime_with_the_pin_keeps_the_router_in_the_engine_venv():
    for recipe_id in ("tiny-cpu", "glm5.1-w4a8-a3-1p1d-32-16k"):
        recipe, proc = router_of(recipe_id)
        assert router_venv(recipe) is None
        assert "/sglang-router-" not in exec_argv(recipe, proc)[0] + exec_argv(recipe, proc)[-1]


def test_recipes_without_a_router_need_no_router_venv():
    for recipe_id, recipe in catalogue.catalogue().items():
        if recipe.topology.router is None:
            assert router_venv(recipe) is None, recipe_id


def test_audit_checks_the_router_venv_on_the_router_host_only():
    from roles import router
    from roles.context import build_context

    hosts = [(f"gb{i}", {"hardware": "gb200", "ssh_hostname": f"10.0.0.{i + 1}", "nic": "eth0"}) for i in range(5)]
    checks = {name: router.desired_runtime(build_context("glm5", name, hosts)) for name, _ in hosts}
    with_router = [name for name, found in checks.items() if found]
    assert len(with_router) == 1
    (check,) = checks[with_router[0]]
    assert check.id == "venv-packages:/opt/ironserve/venvs/sglang-router-0.3.2"
    assert check.expected == {"sglang-router": "0.3.2"}
