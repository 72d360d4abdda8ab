"""The rolling change's plan, offline (roles/rolling.py): the steps (the canary alone, then roll_max_groups a
step, the router keeping one group of each role), what the plan says per group (`--dry`: the launch prints it, the
steps' operation names carry it), and that the hosts of a run agree on one roll_max_groups."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import yaml

from ironserve import catalogue
from ironserve.inventory import InventoryHost
from ironserve.render import render
from roles import rolling
from roles.context import build_context

ROUTER = ("r", {"ssh_hostname": "10.0.0.9", "ironserve_role": "router", "hardware": "cpu-lab"})


def _replicas(tmp_path, n: int):
    """tiny-cpu with ``n`` replicas behind its router, rendered on a router host and n replica hosts."""
    data = yaml.safe_load(catalogue.recipe_file("tiny-cpu").read_text())
    data["topology"]["groups"][0]["instances"] = n
    path = tmp_path / "tiny-cpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = catalogue.get_recipe(str(path))
    hosts = [InventoryHost(*ROUTER)] + [
        InventoryHost(f"h{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "hardware": "cpu-lab"}) for i in range(n)
    ]
    return render(recipe, hosts)


def _layout(rendered, max_groups: int) -> list[list[str]]:
    steps = rolling.roll_steps(rolling.roll_groups(rendered), max_groups)
    return [[g[0].host for g in step] for step in steps]


@pytest.mark.parametrize(
    "max_groups, layout",
    [
        (1, [["h0"], ["h1"], ["h2"], ["h3"]]),
        (2, [["h0"], ["h1", "h2"], ["h3"]]),
        (3, [["h0"], ["h1", "h2", "h3"]]),
        # never all four at once: the canary is back in the router before the rest moves, and one of each role
        # stays in (3 of 4 at most)
        (10, [["h0"], ["h1", "h2", "h3"]]),
    ],
)
def test_the_canary_moves_alone_then_steps_of_roll_max_groups(tmp_path, max_groups, layout):
    assert _layout(_replicas(tmp_path, 4), max_groups) == layout


def test_more_than_a_step_may_move_is_clamped_and_said(tmp_path):
    groups = rolling.roll_groups(_replicas(tmp_path, 2))
    assert rolling.roll_steps(groups, 5) == [[groups[0]], [groups[1]]]
    assert rolling.clamp_note(groups, 5) == (
        "; roll_max_groups=5 clamped to 1 of the 2 server groups a step (the router keeps one of each role)"
    )
    assert rolling.clamp_note(rolling.roll_groups(_replicas(tmp_path, 4)), 2) == ""
    assert "clamped to 1 of the 2 server groups" in rolling.plan_lines(_replicas(tmp_path, 2), 5, False)[0]


def _pd(recipe_id: str, nodes: int):
    recipe = catalogue.get_recipe(recipe_id)
    hosts = [
        InventoryHost(f"h{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "nic": "enp1s0", "hardware": recipe.hardware[0]})
        for i in range(nodes)
    ]
    return render(recipe, hosts)


def test_the_only_group_of_a_role_moves_alone_and_is_named_an_outage():
    """2P1D: the two prefill groups (2 ranks each, each moved as one) roll, the router keeping one; the decode
    group is the only one of its role: it moves alone and the plan says that step is an outage."""
    rendered = _pd("glm5.1-w4a8-a3-2p1d-48-128k-prefix90", 6)
    groups = rolling.roll_groups(rendered)
    steps = rolling.roll_steps(groups, 4)
    assert [[(g[0].role, len(g)) for g in step] for step in steps] == [
        [("prefill", 2)],
        [("prefill", 2)],
        [("decode", 2)],
    ]
    names = [rolling.step_name(groups, steps, i, False) for i in range(len(steps))]
    assert "the canary, alone" in names[0] and "OUTAGE" not in names[0] + names[1]
    assert "(2 ranks, moved as one)" in names[0]
    assert names[2].endswith("(the deployment's only decode group: an OUTAGE while it is out of the router)")
    lines = rolling.plan_lines(rendered, 4, False)
    assert lines[3].startswith("  step 3: ") and "the only decode group: an OUTAGE" in lines[3], lines


def test_the_plan_of_two_replicas_says_each_group_and_what_goes():
    """What `--dry` prints for a 2-group deployment: each group's step, the canary, and the units each host loses;
    the steps' operation names say the same (one name on every host: pyinfra lists one per operation)."""
    hosts = [ROUTER, *[(f"h{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "hardware": "cpu-lab"}) for i in range(2)]]
    rendered = build_context("tiny", "h0", hosts).rendered
    lines = rolling.plan_lines(rendered, 1, True, {"h0": ["sglang-old-server-0"], "h1": []})
    assert lines == [
        "Change plan of tiny-cpu: 2 engine groups behind the router sglang-tiny-cpu-router on r; a running "
        "group whose configuration changes rolls, 2 steps, at most 1 group(s) a step after the canary:",
        "  step 1: sglang-tiny-cpu-server-0 on h0: rolls; the canary, alone, benchmarked before and after its change",
        "  step 2: sglang-tiny-cpu-server-1 on h1: rolls",
        "  a group not running yet starts in the launch's wave; the router restarts in place",
        "  removed from h0: sglang-old-server-0 (not declared by tiny-cpu: stopped, disabled, deleted)",
    ]
    groups = rolling.roll_groups(rendered)
    steps = rolling.roll_steps(groups, 1)
    assert rolling.step_name(groups, steps, 0, True) == (
        "Roll step 1 of 2: sglang-tiny-cpu-server-0 on h0: the canary, alone: out of the router, drained, restarted "
        "on its staged configuration, gated and benchmarked against its figures before, back in; no other group "
        "moves unless it passes"
    )
    assert rolling.step_name(groups, steps, 1, True) == (
        "Roll step 2 of 2: sglang-tiny-cpu-server-1 on h1: out of the router, drained, restarted on its staged "
        "configuration, gated, back in"
    )


def test_the_plan_of_a_single_group_names_the_outage():
    """One group (TP2 over two hosts, no router): a change restarts it in place; the plan and the start's name
    say that is an outage."""
    from roles import launch

    hosts = [
        (f"n{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "nic": "host0", "hardware": "cpu-lab", "recipe": "tiny-cpu-tp2"})
        for i in range(2)
    ]
    ctx = build_context("tiny", "n0", hosts)
    assert rolling.plan_lines(ctx.rendered, 1, False, {"n0": [], "n1": []}) == [
        "Change plan of tiny-cpu-tp2: sglang-tiny-cpu-tp2-server: no router with several engine groups, so a change "
        "restarts in place: an OUTAGE for the length of its restart"
    ]
    assert "an outage for its length" in launch._in_place(ctx, ctx.processes[0])


def test_the_launch_prints_the_plan_once_with_what_each_host_loses(monkeypatch, caplog):
    hosts = [ROUTER, *[(f"h{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "hardware": "cpu-lab"}) for i in range(2)]]
    ctx = build_context("tiny", "h0", hosts)
    found = {"r": {"sglang-old-router": "old"}, "h0": {"sglang-tiny-cpu-server-0": "tiny-cpu"}, "h1": {}}
    inventory = SimpleNamespace(
        get_host=lambda name: SimpleNamespace(get_fact=lambda fact, **kw: found[name]),
    )
    monkeypatch.setattr(rolling, "context", SimpleNamespace(inventory=inventory))
    monkeypatch.setattr(rolling, "in_run", lambda name: True)
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        rolling.say_plan(ctx)
        rolling.say_plan(ctx)  # the next host of the run: said once
    text = caplog.text
    assert text.count("Change plan of tiny-cpu") == 1, text
    assert "removed from r: sglang-old-router (not declared by tiny-cpu" in text and "removed from h0" not in text


def test_the_hosts_of_a_run_agree_on_one_roll_max_groups_and_canary_bench():
    hosts = [
        (ROUTER[0], {**ROUTER[1], "roll_max_groups": 4}),
        ("h0", {"ssh_hostname": "10.0.0.1", "hardware": "cpu-lab", "roll_max_groups": 2, "canary_bench": True}),
        ("h1", {"ssh_hostname": "10.0.0.2", "hardware": "cpu-lab", "roll_max_groups": 3}),
    ]
    ctx = build_context("tiny", "h1", hosts)
    assert rolling.deployment_data(ctx) == (2, True)


@pytest.mark.parametrize("value", [0, -1, "two"])
def test_roll_max_groups_is_a_positive_count(value):
    from ironserve.catalogue import SpecError

    hosts = [ROUTER, ("h0", {"ssh_hostname": "10.0.0.1", "hardware": "cpu-lab", "roll_max_groups": value})]
    with pytest.raises(SpecError) as refused:
        build_context("tiny", "h0", hosts)
    assert refused.value.problems[0].field.endswith("roll_max_groups"), refused.value.problems


def test_every_host_holding_a_group_plans_every_step_under_one_name(tmp_path, monkeypatch):
    """pyinfra ties the calls of one line across hosts by their count: the k-th step_rolled of every host is one
    operation. So each host holding a group's rank 0 plans every step, in order, under the same name, and each
    group is planned once, in its step, on its own host."""
    from roles.launch import config_paths
    from roles.sglang_service import live_files

    data = yaml.safe_load(catalogue.recipe_file("tiny-cpu").read_text())
    data["topology"]["groups"][0]["instances"] = 4
    path = tmp_path / "tiny-cpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    hosts = [
        (ROUTER[0], {**ROUTER[1], "recipe": str(path), "roll_max_groups": 2}),
        *[
            (
                f"h{i}",
                {"ssh_hostname": f"10.0.0.{i + 1}", "hardware": "cpu-lab", "recipe": str(path), "roll_max_groups": 2},
            )
            for i in range(4)
        ],
    ]
    calls: dict[str, list] = {}
    monkeypatch.setattr(rolling, "host", SimpleNamespace(get_fact=lambda fact, **kw: {"active": "active"}))
    monkeypatch.setattr(rolling, "router_workers", lambda router: None)
    rolls: dict = {}
    for name, _ in hosts[1:]:
        ctx = build_context("tiny", name, hosts)
        ctx.rolls = rolls  # one record for the run, as roles.context.current shares it
        monkeypatch.setattr(
            rolling,
            "step_rolled",
            lambda name, step, plans, pending, rolls, workers, host=name: calls.setdefault(host, []).append(
                (name, step, [p["group"] for p in plans])
            ),
        )
        rolling.apply(ctx, ctx.processes, live_files, config_paths, lambda proc: False)
    heads = {h: [p.group_key for p in build_context("tiny", h, hosts).processes] for h in calls}
    assert len({len(c) for c in calls.values()}) == 1 and len({tuple(n for n, _, _ in c) for c in calls.values()}) == 1
    steps = [[g for c in calls.values() for g in c[i][2]] for i in range(len(next(iter(calls.values()))))]
    assert [sorted(s) for s in steps] == [["server-g0-i0"], ["server-g0-i1", "server-g0-i2"], ["server-g0-i3"]]
    for host, planned in calls.items():
        assert all(g in heads[host] for _, _, groups in planned for g in groups), (host, planned)
    assert rolls["groups"] and sorted(rolls["groups"]) == sorted(g for s in steps for g in s)


@pytest.mark.parametrize(
    "output, fact",
    [
        (['{"workers": [{"url": "http://10.0.0.2:30000"}]}'], {"urls": ["http://10.0.0.2:30000"]}),
        (['{"workers": []}'], {"urls": []}),
        (['{"error": "ConnectionRefusedError: refused"}'], {"error": "ConnectionRefusedError: refused"}),
        (["Traceback ..."], {"error": "Traceback ..."}),
        ([], {"error": "ironserve-roll printed nothing"}),
    ],
)
def test_the_router_workers_fact_lists_only_what_the_router_answered(output, fact):
    # an empty list would mark every group "left out of the router" and roll a first deploy
    assert rolling.RouterWorkers().process(output) == fact
