"""Audit checks are derived from the spec (no per-model lists); evaluators read hosts through testinfra."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import testinfra

from ironserve.audit.checks import Check
from ironserve.audit.evaluate import evaluate
from ironserve.audit.runner import Result, deploy_model, plan_checks, table
from ironserve.catalogue import SpecError
from ironserve.units import sha256_text


def ids(checks):
    return {c.id for c in checks}


def test_deploy_model_read_from_the_deploy_file():
    assert deploy_model("deploys/glm5.py") == "glm5"
    assert deploy_model("deploys/glm51.py") == "glm5.1"


def test_checks_cover_what_the_deploy_manages():
    checks, _ = plan_checks("inventories/rtx6000.py", "deploys/glm5.py")
    found = ids(checks)
    for expected in (
        "cpu-governor",
        "sysctl:vm.swappiness",
        "file:/etc/sysctl.d/90-ironserve.conf",
        "file:/etc/security/limits.d/90-ironserve.conf",
        "package:nvidia-open-580",
        "package:cuda-toolkit-13-0",
        "gpu-devices",
        "gpu-memory-clock-offset",
        "file:/usr/local/lib/ironserve/ironserve-gpu-clocks.py",
        "file:/mnt/nccl_graph_opt.xml",
    ):
        assert expected in found, expected
    unit = "sglang-glm5-nvfp4-mtp-rtx6000-tp8-server.service"
    assert {f"unit-file:{unit}", f"env-file:{unit}", f"unit-enabled:{unit}", f"unit-active:{unit}"} <= found
    assert {"port:5000", "health:sglang-glm5-nvfp4-mtp-rtx6000-tp8-server"} <= found
    assert any(i.startswith("image:lmsysorg/sglang@sha256:426d") for i in found)
    assert all(c.fix == "pyinfra inventories/rtx6000.py deploys/glm5.py --limit gpu-a" for c in checks)


@pytest.mark.parametrize("data, restart", [({}, "RestartSec=15"), ({"engine_restart_s": 7}, "RestartSec=7")])
def test_the_audit_expects_the_unit_the_deploy_writes_restart_delay_included(data, restart):
    """engine_restart_s reaches the unit through the rendered process: the deploy's unit file and the audit's
    expected hash are one text (a host's own value is no drift)."""
    from ironserve.audit.checks import derive_checks
    from roles.context import build_context
    from roles.sglang_service import live_files

    hosts = [("n0", {"hardware": "cpu-lab", **data}), ("n1", {"hardware": "cpu-lab"})]
    ctx = build_context("tiny", "n0", [*hosts, ("r0", {"hardware": "cpu-lab", "ironserve_role": "router"})])
    (proc,) = ctx.processes
    unit = {path: text for path, text, _ in live_files(ctx, proc)}[f"/etc/systemd/system/{proc.unit}.service"]
    assert restart in unit.splitlines()
    checks = {c.id: c for c in derive_checks(ctx, "deploys/tiny.py", "inventory.py")}
    assert checks[f"unit-file:{proc.unit}.service"].expected == sha256_text(unit)


def test_launch_false_expects_inactive_and_no_health():
    checks, _ = plan_checks("inventories/rtx6000.py", "deploys/glm5.py", data={"launch": "false"})
    active = [c for c in checks if c.id.startswith("unit-active:")]
    assert active and all(c.expected is False for c in active)
    assert not [c for c in checks if c.gate == "workload"]


def test_the_clock_offsets_are_read_by_the_inventorys_tools_venv():
    checks, _ = plan_checks("inventories/rtx6000.py", "deploys/glm5.py", data={"tools_venv": "/srv/tools"})
    (offsets,) = [c for c in checks if c.kind == "clock_offsets"]
    assert offsets.params["cmd"] == "/srv/tools/bin/python /usr/local/lib/ironserve/ironserve-gpu-clocks.py --read"


def test_only_rank0_is_probed_and_npus_counted():
    checks, _ = plan_checks("inventories/atlas_a3.py", "deploys/glm51.py")
    by_host = {h: ids([c for c in checks if c.host == h]) for h in ("a3-0", "a3-1")}
    assert "port:6688" in by_host["a3-0"] and "port:6688" not in by_host["a3-1"]
    assert "npu-devices" in by_host["a3-1"] and "gpu-devices" not in by_host["a3-1"]
    assert not any(i.startswith("package:nvidia") for i in by_host["a3-0"])
    assert any(i.startswith("venv-packages:") for i in by_host["a3-0"])


def test_multinode_ranks_audit_their_rank_guard_and_helpers():
    checks, _ = plan_checks("inventories/atlas_a3.py", "deploys/glm51.py")
    for h in ("a3-0", "a3-1"):
        found = ids([c for c in checks if c.host == h])
        guards = [i for i in found if i.startswith("unit-active:") and i.endswith("-rank-guard.service")]
        assert guards, f"{h}: no rank guard check"
        assert any(i.startswith("file:/etc/ironserve/") and i.endswith(".rank-group.json") for i in found)
        assert "file:/usr/local/lib/ironserve/ironserve-rank-guard" in found
        assert "file:/usr/local/lib/ironserve/ironserve-rendezvous" in found


def test_limit_to_unknown_host_is_bad_input():
    with pytest.raises(SpecError):
        plan_checks("inventories/rtx6000.py", "deploys/glm5.py", limit=["nope"])


@pytest.fixture
def local():
    return testinfra.get_host("local://")


def test_file_evaluator_content_and_mode(tmp_path, local):
    path = tmp_path / "unit.service"
    path.write_text("[Unit]\n")
    os.chmod(path, 0o644)
    check = Check("h", "file:x", "file", sha256_text("[Unit]\n"), {"path": str(path), "mode": 0o644, "owner": None})
    assert evaluate(local, check)[0]
    path.write_text("[Unit]\nedited\n")
    ok, found = evaluate(local, check)
    assert not ok and "content" in found
    path.unlink()
    assert evaluate(local, check) == (False, "missing")


def test_env_file_evaluator_names_keys_never_values_and_flags_world_readable(tmp_path, local):
    path = tmp_path / "x.env"
    expected = "# managed\nA=1\nB=2\nIRONSERVE_API_KEY=<secret>\n"
    path.write_text("# managed\nA=1\nB=2\nIRONSERVE_API_KEY=sk-the-real-key\n")
    os.chmod(path, 0o600)
    check = Check("h", "env-file:x", "env_file", expected, {"path": str(path), "mode": 0o600})
    assert evaluate(local, check) == (True, "same")  # the deployed key is compared by presence
    os.chmod(path, 0o644)
    ok, found = evaluate(local, check)
    assert not ok and "secrets readable" in found
    os.chmod(path, 0o600)
    # a secret planted by hand, a changed value, a missing key: named, never shown
    path.write_text("A=1\nB=hunter2-value\nSTOLEN_TOKEN=hf_planted_s3cret\n")
    ok, found = evaluate(local, check)
    assert not ok
    assert found == "missing: IRONSERVE_API_KEY; not declared: STOLEN_TOKEN; value differs: B"
    assert "hf_planted" not in found and "hunter2" not in found and "sk-" not in found


def test_sysctl_absent_key_is_not_drift(local):
    check = Check("h", "sysctl:kernel.no_such_key", "sysctl", "1", {"key": "kernel.no_such_key"})
    assert evaluate(local, check) == (True, "absent in this kernel")


def test_table_names_host_check_and_fix():
    c = Check(
        "gpu-a", "sysctl:vm.swappiness", "sysctl", "0", {}, "host", "pyinfra inv.py deploys/glm5.py --limit gpu-a"
    )
    text = table([Result(c, False, "60")])
    assert "gpu-a" in text and "sysctl:vm.swappiness" in text and "found 60" in text and "--limit gpu-a" in text


def test_checks_read_in_batches_and_reported_by_pytest(tmp_path):
    """run_checks: each host read over one connection in a few batched commands, every check reported by the
    pytest session (JUnit, one testcase per check), with what the evaluators find reading the host alone."""
    from ironserve.audit.runner import Reads, run_checks

    sample = tmp_path / "sample.conf"
    sample.write_text("x = 1\n")
    sample.chmod(0o644)
    owner = __import__("pwd").getpwuid(os.getuid()).pw_name
    checks = [
        Check(
            "local", "file:sample", "file", sha256_text("x = 1\n"), {"path": str(sample), "mode": 0o644, "owner": owner}
        ),
        Check("local", "file:missing", "file", "0" * 64, {"path": str(tmp_path / "missing")}),
        Check("local", "sysctl:vm.swappiness", "sysctl", "nope", {"key": "vm.swappiness"}),
        Check("local", "unit-active:none", "service_active", False, {"name": "ironserve-no-such-unit"}),
    ]
    reads = Reads({}, {})
    junit = tmp_path / "audit.xml"
    results = run_checks(checks, {"local": "local://"}, junit=str(junit), reads=reads)
    alone = [evaluate(testinfra.get_host("local://"), c) for c in checks]
    assert [(r.ok, r.found) for r in results] == [tuple(a) for a in alone]
    assert [r.ok for r in results] == [True, False, False, True]
    assert reads.unreachable == {} and 1 <= reads.commands["local"] <= 5
    xml = junit.read_text()
    assert xml.count("<testcase") == len(checks) and "local::file:sample" in xml
    import xml.etree.ElementTree as ET

    found = {
        case.get("name"): [p.get("value") for p in case.iter("property") if p.get("name") == "found"]
        for case in ET.fromstring(xml).iter("testcase")
    }
    assert [found[f"test_check[local::{c.id}]"] for c in checks] == [[r.found] for r in results]


def test_the_generated_session_loads_no_other_plugin_and_restores_the_environment(tmp_path, monkeypatch):
    """The session runs without other packages' pytest plugins (a site's plugin must not change what the audit
    reports) and without the per-test capture plugins it has no use for; the caller's environment is as before."""
    import pytest as real_pytest

    from ironserve.audit import runner

    seen = {}

    def fake_main(args, plugins):
        seen["args"] = args
        seen["env"] = {k: os.environ.get(k) for k in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "IRONSERVE_AUDIT_PLAN")}
        return 0

    monkeypatch.setattr(real_pytest, "main", fake_main)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("IRONSERVE_AUDIT_PLAN", "the caller's")
    runner._pytest(["x"], tmp_path / "plan.json")
    assert seen["env"] == {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "IRONSERVE_AUDIT_PLAN": str(tmp_path / "plan.json")}
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in os.environ and os.environ["IRONSERVE_AUDIT_PLAN"] == "the caller's"
    results = runner.run_checks([Check("local", "sysctl:x", "sysctl", "1", {"key": "x"})], {"local": "local://"})
    assert "no:logging" in seen["args"] and "no:unraisableexception" in seen["args"]
    assert [r.found for r in results] == ["not run"]


def test_a_plan_that_fails_runs_nothing_on_any_host_and_closes_the_handshakes(monkeypatch):
    from ironserve.audit import connection, runner

    def bad_plan(*args):
        raise SpecError.one("recipes/r.yaml", "engine.tp", "tp 3 does not divide 8 GPUs", "write tp: 8")

    fleet = SimpleNamespace(hosts=[SimpleNamespace(name="h", groups=[])])
    closed, ran = [], []
    monkeypatch.setattr(runner, "read_fleet", lambda *a, **k: fleet)
    monkeypatch.setattr(runner, "plan_checks", bad_plan)  # made in the forked child: its error comes back whole
    monkeypatch.setattr(connection, "open_hosts", lambda fleet, names: {n: "local://" for n in names})
    monkeypatch.setattr(connection, "connect_ahead", lambda specs: None)
    monkeypatch.setattr(connection, "close", closed.append)
    monkeypatch.setattr(runner, "run_checks", lambda *a, **k: ran.append(a))
    with pytest.raises(SpecError, match=r"engine\.tp: tp 3 does not divide 8 GPUs\. Fix: write tp: 8"):
        runner.audit("inv.py", "deploys/tiny.py")
    assert closed == [{"h": "local://"}] and not ran


def test_a_hosts_checks_are_reported_while_a_slower_host_is_still_read(monkeypatch):
    """The session reports a host's checks as soon as its read is back: the reported rows of a quick host come
    before a slow host's read ends (its reads go on meanwhile), and every host's read is reported."""
    from ironserve.audit import runner

    lines: list[dict] = []
    rows = runner._rows

    def in_order(results_dir, reads):
        lines.extend(json.loads(line) for f in results_dir.glob("*.jsonl") for line in f.read_text().splitlines())
        return rows(results_dir, reads)

    monkeypatch.setattr(runner, "_rows", in_order)
    checks = [
        Check("quick", "cmd:echo", "command", "quick", {"cmd": "echo quick"}),
        Check("slow", "cmd:sleep", "command", "slow", {"cmd": "sleep 1; echo slow"}),
    ]
    reads = runner.Reads({}, {})
    results = runner.run_checks(checks, {"quick": "local://", "slow": "local://"}, reads=reads)
    assert [(r.ok, r.found) for r in results] == [(True, "quick"), (True, "slow")]
    order = [(row["host"], "read" if row.get("read") else "check") for row in lines]
    assert order.index(("quick", "check")) < order.index(("slow", "read")), order
    assert set(reads.commands) == {"quick", "slow"} and reads.unreachable == {}
