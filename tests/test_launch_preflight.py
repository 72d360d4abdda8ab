"""Launch preflight (roles/launch_preflight.py) and the rendezvous script, offline.

The pure parts from real renders of the catalogue; files/bin/ironserve-rendezvous run for real as two local ranks
with CPU torch (the SGLang parser venv's, marked ``parser``): a group that forms, and one whose
GLOO_SOCKET_IFNAME names no interface, which fails with gloo's own error.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from ironserve import catalogue
from ironserve.inventory import InventoryHost
from ironserve.render import render
from ironserve.units import venv_path
from roles import launch_preflight as lp
from roles.context import build_context
from roles.launch_preflight import nic_problems, parse_rendezvous, rank_groups, rendezvous_argv

SCRIPT = Path(__file__).resolve().parent.parent / "files" / "bin" / "ironserve-rendezvous"


def hosts(n: int, nic: str = "eth0") -> list[InventoryHost]:
    return [
        InventoryHost(f"n{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "nic": nic, "hardware": "cpu-lab"}) for i in range(n)
    ]


def test_rank_groups_of_a_multinode_recipe():
    rendered = render(catalogue.get_recipe("tiny-cpu-tp2"), hosts(2))
    groups = rank_groups(rendered)
    assert list(groups) == ["server-g0-i0"]
    group = groups["server-g0-i0"]
    assert (group.addr, group.port, group.world) == ("10.0.0.1", 29500, 2)
    assert [p.node_rank for p in group.members] == [0, 1]
    # the rank's socket interfaces, as render pinned them to the host's nic (what the NIC check and the
    # rendezvous read)
    assert group.members[1].socket_interfaces == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert {k: group.members[1].env[k] for k in group.members[1].socket_interfaces} == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
    }


def test_rank_groups_of_pd_disaggregation_are_per_instance():
    recipe = catalogue.get_recipe("glm5.1-w4a8-a3-2p1d-48-128k-prefix90")
    n = sum(g.instances * g.nodes for g in recipe.topology.groups)
    placed = [
        InventoryHost(
            f"a{i}",
            {"ssh_hostname": f"10.1.0.{i + 1}", "nic": "enp1", "hardware": "atlas-800i-a3"}
            | ({"ironserve_role": "router"} if i == n else {}),
        )
        for i in range(n + 1)
    ]
    groups = rank_groups(render(recipe, placed))
    assert groups, "the 2P1D recipe has multi-node groups"
    for group in groups.values():
        assert group.world == len(group.members) >= 2
        assert {(p.dist_init_addr, p.dist_init_port) for p in group.members} == {(group.addr, group.port)}
        assert {p.head for p in group.members} == {group.members[0].host}
        assert group.members[0].address == group.addr  # rank 0 hosts the dist-init address
    assert len({(g.addr, g.port) for g in groups.values()}) == len(groups)


def test_single_node_recipes_have_no_rank_group():
    placed = [InventoryHost("r", {"ironserve_role": "router", "hardware": "cpu-lab"}), *hosts(2)]
    assert rank_groups(render(catalogue.get_recipe("tiny-cpu"), placed)) == {}


R1 = {"addrs": {"lo": ["127.0.0.1"], "host0": ["10.213.7.12"]}, "target": "10.213.7.11", "route_dev": "host0"}
R0 = {"addrs": {"lo": ["127.0.0.1"], "host0": ["10.213.7.11"]}, "target": "10.213.7.11", "route_dev": "lo"}
HEAD = ("10.213.7.11", 29500)


def test_nic_problems_name_host_interface_and_fix():
    assert nic_problems("n1", 1, {"GLOO_SOCKET_IFNAME": "host0"}, HEAD, R1) == []
    assert nic_problems("n0", 0, {"GLOO_SOCKET_IFNAME": "host0"}, HEAD, R0) == []
    (wrong_route,) = nic_problems("n1", 1, {"GLOO_SOCKET_IFNAME": "lo"}, HEAD, R1)
    assert wrong_route.startswith(
        "n1 (rank 1): GLOO_SOCKET_IFNAME=lo, but the route to rank 0 (10.213.7.11:29500) leaves by host0"
    )
    assert wrong_route.endswith("fix: set host data nic=host0 (or route rank 0's network over lo)")
    (not_on_rank0,) = nic_problems("n0", 0, {"GLOO_SOCKET_IFNAME": "lo"}, HEAD, R0)
    assert "this host's rank-0 address 10.213.7.11 is not on lo" in not_on_rank0
    assert not_on_rank0.endswith("fix: set host data nic=host0")
    (missing,) = nic_problems("n1", 1, {"NCCL_SOCKET_IFNAME": "eth9"}, HEAD, R1)
    assert "NCCL_SOCKET_IFNAME=eth9 names no interface with an IPv4 address" in missing
    assert "interfaces: host0 10.213.7.12, lo 127.0.0.1" in missing and "(host0, the route to" in missing
    # NCCL's prefix and exclusion forms
    assert nic_problems("n1", 1, {"NCCL_SOCKET_IFNAME": "host"}, HEAD, R1) == []
    assert nic_problems("n1", 1, {"NCCL_SOCKET_IFNAME": "^docker,lo"}, HEAD, R1) == []
    (unresolved,) = nic_problems(
        "n1",
        1,
        {"GLOO_SOCKET_IFNAME": "host0"},
        ("sgl-dev-0", 5000),
        {"addrs": R1["addrs"], "target": None, "route_dev": None},
    )
    assert "does not resolve on this host" in unresolved


def test_rendezvous_runs_in_the_engine_runtime():
    rendered = render(catalogue.get_recipe("tiny-cpu-tp2"), hosts(2, nic="host0"))
    group = rank_groups(rendered)["server-g0-i0"]
    argv = rendezvous_argv(rendered.recipe, group.members[1], group, 60)
    assert argv[:3] == ["env", "GLOO_SOCKET_IFNAME=host0", "NCCL_SOCKET_IFNAME=host0"]
    assert argv[3] == f"{venv_path(rendered.recipe)}/bin/python3"
    assert argv[4:] == [
        "/usr/local/lib/ironserve/ironserve-rendezvous",
        "--addr",
        "10.0.0.1",
        "--port",
        "29500",
        "--rank",
        "1",
        "--world",
        "2",
        "--timeout",
        "60",
    ]
    # uv runtime with sourced Ascend env scripts: sourced first, as for the engine
    recipe = catalogue.get_recipe("glm5.1-w4a8-a3-pd-mixed-16")
    placed = [
        InventoryHost(f"a{i}", {"ssh_hostname": f"10.1.0.{i + 1}", "nic": "enp1", "hardware": "atlas-800i-a3"})
        for i in range(2)
    ]
    r = render(recipe, placed)
    g = rank_groups(r)["server-g0-i0"]
    ascend = rendezvous_argv(r.recipe, g.members[-1], g, 60)
    assert "HCCL_SOCKET_IFNAME=enp1" in ascend and ascend[ascend.index("/bin/bash") + 1] == "-c"
    assert "source " in ascend[ascend.index("/bin/bash") + 2]
    # docker runtime (GB200 decode group of 4 nodes): the image's python with the host's network
    recipe = catalogue.get_recipe("glm5-nvfp4-gb200-disagg")
    n = sum(gr.instances * gr.nodes for gr in recipe.topology.groups)
    placed = [
        InventoryHost(
            f"g{i}",
            {"ssh_hostname": f"10.2.0.{i + 1}", "nic": "enP6p3s0f0np0", "hardware": "gb200"}
            | ({"ironserve_role": "router"} if i == n else {}),
        )
        for i in range(n + 1)
    ]
    r = render(recipe, placed)
    g = next(gr for gr in rank_groups(r).values() if gr.world == 4)
    docker = rendezvous_argv(r.recipe, g.members[-1], g, 60)
    assert docker[:5] == ["docker", "run", "--rm", "--network", "host"]
    assert "GLOO_SOCKET_IFNAME=enP6p3s0f0np0" in docker
    assert docker[-11:] == [
        "/ironserve-rendezvous",
        "--addr",
        g.addr,
        "--port",
        str(g.port),
        "--rank",
        "3",
        "--world",
        "4",
        "--timeout",
        "60",
    ]


def test_parse_rendezvous_output():
    line = 'IRONSERVE-RENDEZVOUS {"ok": true, "rank": 1, "world": 2, "seconds": 0.4}'
    assert parse_rendezvous(["noise", line])["ok"] is True
    failed = parse_rendezvous(["Traceback ...", "killed"])
    assert failed["ok"] is False and "printed no result" in failed["error"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(python: Path, ifname: str, timeout: int = 20) -> list[dict]:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                "env",
                f"GLOO_SOCKET_IFNAME={ifname}",
                str(python),
                str(SCRIPT),
                "--addr",
                "127.0.0.1",
                "--port",
                str(port),
                "--rank",
                str(rank),
                "--world",
                "2",
                "--timeout",
                str(timeout),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    return [parse_rendezvous(p.communicate(timeout=timeout + 60)[0].splitlines()) for p in procs]


@pytest.mark.parser
def test_real_gloo_rendezvous_forms_and_a_wrong_interface_fails():
    from ironserve.engine_parser import parser_env

    python = parser_env("0.5.23") / "bin" / "python"
    ok = _ranks(python, "lo")
    assert [r["ok"] for r in ok] == [True, True], ok
    assert ok[0]["sum"] == 3.0 and ok[1]["ifname"] == "lo"
    bad = _ranks(python, "ironserve-no-such0", timeout=5)
    assert not any(r["ok"] for r in bad), bad
    assert any("ironserve-no-such0" in (r.get("error") or "") for r in bad), bad
    print(f"\nlocal gloo rendezvous of 2 ranks: {ok[0]['seconds']}s; wrong interface: {bad[0]['error']}")


def test_rendezvous_script_reports_a_missing_torch_as_a_result(tmp_path):
    out = subprocess.run(
        [
            "python3",
            "-S",
            str(SCRIPT),
            "--addr",
            "127.0.0.1",
            "--port",
            "1",
            "--rank",
            "0",
            "--world",
            "1",
            "--timeout",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    result = parse_rendezvous(out.stdout.splitlines())
    assert out.returncode == 1 and result["ok"] is False and "torch" in result["error"].lower(), out.stdout


def test_shell_quoting_of_the_rendezvous_command():
    rendered = render(catalogue.get_recipe("tiny-cpu-tp2"), hosts(2))
    group = rank_groups(rendered)["server-g0-i0"]
    argv = rendezvous_argv(rendered.recipe, group.members[0], group, 30)
    command = " ".join(shlex.quote(a) for a in argv)
    assert shlex.split(command) == argv and argv[-2:] == ["--timeout", "30"]
    # plain text for the operation's arguments: strings only, each one word for the shell
    assert all(isinstance(a, str) for a in argv) and json.loads(json.dumps(argv)) == argv


def test_the_deploy_hands_the_rendezvous_its_argv_as_shell_words(monkeypatch):
    """What the deploy gives group_rendezvous is the rendezvous argv quoted for the shell, word for word: Ascend
    ranks source their env scripts in a `bash -c` script with spaces, which an unquoted join would split."""
    placed = [
        (f"a{i}", {"ssh_hostname": f"10.1.0.{i + 1}", "nic": "enp1", "hardware": "atlas-800i-a3"}) for i in range(2)
    ]
    placed = [(name, {**data, "recipe": "glm5.1-w4a8-a3-pd-mixed-16"}) for name, data in placed]
    ctx = build_context("glm51", "a1", placed)
    given = []
    monkeypatch.setattr(lp, "group_rendezvous", lambda **kw: given.append(kw))
    for op in ("nic_reaches_rank0", "memlock_unlimited", "iommu_passthrough", "pcie_acs_disabled"):
        monkeypatch.setattr(lp, op, lambda **kw: None)
    monkeypatch.setattr(lp, "in_run", lambda name: True)
    monkeypatch.setattr(lp, "host", SimpleNamespace(name="a1", get_fact=lambda *a, **kw: None))
    lp.apply._inner(ctx)
    group = rank_groups(ctx.rendered)["server-g0-i0"]
    (rank1,) = [p for p in group.members if p.host == "a1"]
    argv = rendezvous_argv(ctx.recipe, rank1, group, ctx.host.rendezvous_timeout_s)
    assert len(given) == 1 and any(" " in word for word in argv), (given, argv)
    assert shlex.split(given[0]["command"]) == argv
