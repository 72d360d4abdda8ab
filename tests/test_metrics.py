"""ironserve's own metrics offline: the text format (checked by Prometheus's promtool where it is installed), the
host writer (files/bin/ironserve-textfile), the deploy clock's stages and outcomes, the file_sd output of
`ironserve status --format prometheus`, and the engines' and routers' metrics flags."""

from __future__ import annotations

import io
import json
import os
import subprocess
import types
from pathlib import Path

import pytest

from ironserve import catalogue
from ironserve.metrics import (
    DeployOutcome,
    Sample,
    audit_samples,
    deploy_samples,
    exposition,
    file_sd,
    timing_json,
    timing_table,
)
from ironserve.render import render
from ironserve.status import prometheus_targets

from .host_scripts import load_script
from .prometheus_tools import prometheus_tool

ROOT = Path(__file__).resolve().parents[1]


def textfile_module():
    return load_script("ironserve-textfile")


def outcome(**kw) -> DeployOutcome:
    base = dict(
        recipe="tiny-cpu",
        success=True,
        finished_at=1764030000.5,
        stages={"plan": 2.0, "runtime": 40.25, "engine_start": 61.0},
        gates={"sglang-tiny-cpu-server-0": True},
        units=[("sglang-tiny-cpu-server-0", "server")],
    )
    return DeployOutcome(**{**base, **kw})


def test_exposition_has_one_help_and_type_per_name_and_every_stage():
    text = exposition(deploy_samples(outcome()))
    assert text.count("# TYPE ironserve_deploy_stage_seconds gauge") == 1
    for stage, seconds in (("plan", "2.0"), ("runtime", "40.25"), ("engine_start", "61.0")):
        assert f'ironserve_deploy_stage_seconds{{recipe="tiny-cpu",stage="{stage}"}} {seconds}\n' in text
    assert 'ironserve_deploy_seconds{recipe="tiny-cpu"} 103.25\n' in text
    assert 'ironserve_deploy_last_success{recipe="tiny-cpu"} 1\n' in text
    assert 'ironserve_gate_passed{recipe="tiny-cpu",unit="sglang-tiny-cpu-server-0"} 1\n' in text
    failed = exposition(deploy_samples(outcome(success=False, gates={"sglang-tiny-cpu-server-0": False})))
    assert 'ironserve_deploy_last_success{recipe="tiny-cpu"} 0\n' in failed
    assert 'ironserve_gate_passed{recipe="tiny-cpu",unit="sglang-tiny-cpu-server-0"} 0\n' in failed


def test_promtool_accepts_the_textfile():
    text = exposition(deploy_samples(outcome()) + audit_samples({("lab2", "file:/etc/x"): True}, 1764030000.0))
    proc = subprocess.run(
        [prometheus_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("bad", ['say "hi"', "a b", "line\nbreak", "x" * 300, "key=s3cret value"])
def test_label_values_are_names_never_free_text(bad):
    with pytest.raises(ValueError, match="label value"):
        exposition([Sample("ironserve_gate_passed", 1, {"unit": bad})])


def test_only_ironserve_names_and_finite_values():
    with pytest.raises(ValueError, match="ironserve_"):
        exposition([Sample("node_load1", 1)])
    with pytest.raises(ValueError, match="finite"):
        exposition([Sample("ironserve_deploy_seconds", float("nan"))])


def test_timing_table_and_json_add_up_to_time_to_serving():
    stages = {"plan": 2.0, "runtime": 40.25, "engine_start": 61.0}
    table = timing_table(stages).splitlines()
    assert table[0].split() == ["stage", "seconds", "share", "elapsed"]
    assert table[2].split() == ["runtime", "40.2", "39%", "42.2"]
    assert table[-1].split() == ["time", "to", "serving", "103.2"]
    data = json.loads(timing_json("tiny-cpu", True, stages))
    assert data["time_to_serving_s"] == 103.25 and [s["stage"] for s in data["stages"]] == list(stages)


def test_textfile_writer_renames_a_0644_file_into_place(tmp_path):
    writer = textfile_module()
    text = exposition(deploy_samples(outcome()))
    path = writer.write("ironserve_deploy", text, str(tmp_path))
    assert Path(path).read_text() == text and oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert os.listdir(tmp_path) == ["ironserve_deploy.prom"]  # no temporary left behind
    assert writer.write("ironserve_deploy", text, str(tmp_path / "absent")) is None  # no collector: nothing


@pytest.mark.parametrize(
    "name, text",
    [
        ("../etc/passwd", ""),
        (".hidden", ""),
        ("ok", "node_load1 1\n"),
        ("ok", "IRONSERVE_API_KEY=abc\n"),
        ("ok", 'ironserve_x{a="1"} 1\nrm -rf /\n'),
    ],
)
def test_textfile_writer_refuses_names_and_lines_that_are_not_ironserve_metrics(tmp_path, name, text):
    with pytest.raises(ValueError):
        textfile_module().write(name, text, str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_textfile_writer_command_line(tmp_path):
    text = exposition(audit_samples({("lab2", "unit:sglang"): False}, 1.0))
    proc = subprocess.run(
        ["python3", str(ROOT / "files/bin/ironserve-textfile"), "ironserve_audit", str(tmp_path)],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and (tmp_path / "ironserve_audit.prom").read_text() == text
    bad = subprocess.run(
        ["python3", str(ROOT / "files/bin/ironserve-textfile"), "x", str(tmp_path)],
        input="HF_TOKEN=hf_abc\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "hf_abc" not in bad.stderr


# --------------------------------------------------------------------------- the deploy clock


class FakeHost:
    def __init__(self, name: str, fail: bool = False):
        self.name, self.data, self.commands, self.fail = name, {}, [], fail

    def run_shell_command(self, command, _sudo=False):
        self.commands.append(command)
        lines = ["0123456789abcdef  /etc/systemd/system/sglang-tiny-cpu-server-0.service"]
        return (not self.fail), types.SimpleNamespace(stdout_lines=lines, stderr="")


def test_clock_assigns_operations_to_the_stage_marked_before_them():
    from roles.deploy_clock import DeployClock

    clock, state = DeployClock(), types.SimpleNamespace(op_meta={})
    clock.mark(state, "preflight")
    state.op_meta.update({"a": 0, "b": 0})
    clock.mark(state, "units")
    state.op_meta["c"] = 0
    clock.mark(state, "preflight")  # the next host's planning: its known operations keep their stage
    state.op_meta["d"] = 0
    clock.mark(state, None)
    assert clock.stage_of == {"a": "preflight", "b": "preflight", "c": "units", "d": "preflight"}


def test_clock_times_stages_in_order_and_publishes_each_host_once():
    from roles.deploy_clock import DeployClock

    clock = DeployClock()
    clock.stage_of = {"a": "runtime", "b": "engine_start"}
    clock.created, clock.started, clock.ended = (
        0.0,
        {"engine_start": 50.0, "runtime": 10.0},
        {"runtime": 48.0, "engine_start": 90.0},
    )
    assert clock.stages() == {"plan": 10.0, "runtime": 38.0, "engine_start": 40.0}
    ctx = types.SimpleNamespace(
        recipe=types.SimpleNamespace(id="tiny-cpu"),
        gate_results={("lab2", "sglang-tiny-cpu-server-0"): True, ("lab3", "x"): False},
        processes=[
            types.SimpleNamespace(
                unit="sglang-tiny-cpu-server-0", role="server", health_url="http://127.0.0.1:30000/health"
            )
        ],
    )
    clock.contexts = {"lab2": ctx}
    host = FakeHost("lab2")
    clock.publish(host, success=True)
    clock.publish(host, success=False)  # once per run: a later failure of a written host does not overwrite it
    write = host.commands[-1]
    assert len(host.commands) == 2 and write.endswith(
        "| python3 /usr/local/lib/ironserve/ironserve-textfile ironserve_deploy"
    )
    assert 'ironserve_deploy_last_success{recipe=\\"tiny-cpu\\"} 1' not in write  # shell-quoted as one word
    assert 'ironserve_deploy_last_success{recipe="tiny-cpu"} 1' in write
    assert 'generation="0123456789ab"' in write and 'unit="x"' not in write


# --------------------------------------------------------------------------- targets and flags


INVENTORY = """hosts = [
    ("lab1", {"ssh_hostname": "10.213.7.11", "hardware": "cpu-lab", "ironserve_role": "router"}),
    ("lab2", {"ssh_hostname": "10.213.7.12", "hardware": "cpu-lab"}),
    ("lab3", {"ssh_hostname": "10.213.7.13", "hardware": "cpu-lab", "node_exporter_port": 9200}),
]
"""


def test_status_prometheus_gives_every_target_with_labels_and_no_secret(tmp_path):
    inventory = tmp_path / "inv.py"
    inventory.write_text(INVENTORY)
    key = tmp_path / "key"
    key.write_text("s3cret-api-key-value\n")
    buffer = io.StringIO()
    assert (
        prometheus_targets(str(inventory), str(ROOT / "deploys/tiny.py"), {"api_key_file": str(key)}, out=buffer) == 0
    )
    out = buffer.getvalue()
    assert "s3cret" not in out
    groups = {(g["labels"]["role"], g["labels"]["host"]): g for g in json.loads(out)}
    assert sorted(groups) == [
        ("node", "lab1"),
        ("node", "lab2"),
        ("node", "lab3"),
        ("router", "lab1"),
        ("server", "lab2"),
        ("server", "lab3"),
    ]
    assert groups[("router", "lab1")]["targets"] == ["10.213.7.11:29000"]
    assert groups[("server", "lab3")]["targets"] == ["10.213.7.13:30000"]
    assert groups[("node", "lab3")]["targets"] == ["10.213.7.13:9200"]
    assert groups[("server", "lab2")]["labels"] == {
        "recipe": "tiny-cpu",
        "role": "server",
        "group": "0",
        "rank": "0",
        "host": "lab2",
        "unit": "sglang-tiny-cpu-server-0",
    }


def test_file_sd_skips_engines_without_metrics_and_ranks_above_zero():
    recipe = catalogue.get_recipe("tiny-cpu")
    off = recipe.model_copy(update={"server": recipe.server.model_copy(update={"enable_metrics": False})})
    procs = render(off).processes
    assert [g["labels"]["role"] for g in file_sd("tiny-cpu", procs, [])] == ["router"]
    assert all("--enable-metrics" not in p.argv for p in procs)
    multi = render(catalogue.get_recipe("tiny-cpu-tp2")).processes
    assert [g["labels"]["rank"] for g in file_sd("tiny-cpu-tp2", multi, [])] == ["0"]


def test_engines_serve_metrics_by_default_and_the_router_binds_its_endpoint_like_itself():
    rendered = render(catalogue.get_recipe("tiny-cpu"))
    for proc in rendered.processes:
        if proc.role == "router":
            argv = proc.argv
            assert argv[argv.index("--prometheus-host") + 1] == argv[argv.index("--host") + 1]
            assert argv[argv.index("--prometheus-port") + 1] == "29000" and proc.metrics_port == 29000
        else:
            assert "--enable-metrics" in proc.argv and proc.metrics_port == proc.port


def test_node_exporter_listens_on_the_hosts_address_only():
    from roles.node_exporter import defaults_text

    assert defaults_text("10.213.7.12", 9100).splitlines()[-1] == (
        'ARGS="--web.listen-address=10.213.7.12:9100 --collector.textfile.directory=/var/lib/prometheus/node-exporter"'
    )
    assert "--web.listen-address=[fd00::2]:9100" in defaults_text("fd00::2", 9100)


def test_backoff_waits_and_guard_group_restarts_are_published_through_the_writer(tmp_path, monkeypatch):
    monkeypatch.setenv("IRONSERVE_TEXTFILE_DIR", str(tmp_path))
    load_script("ironserve-backoff").publish("sglang-tiny-cpu-tp2-server", 5, 30.0)
    load_script("ironserve_rank_guard.py").publish_restarts("sglang-tiny-cpu-tp2-server", 2)
    backoff = (tmp_path / "ironserve_backoff_sglang-tiny-cpu-tp2-server.prom").read_text()
    guard = (tmp_path / "ironserve_rank_guard_sglang-tiny-cpu-tp2-server.prom").read_text()
    assert 'ironserve_backoff_last_wait_seconds{unit="sglang-tiny-cpu-tp2-server"} 30\n' in backoff
    assert 'ironserve_backoff_failures{unit="sglang-tiny-cpu-tp2-server"} 5\n' in backoff
    assert 'ironserve_rank_guard_group_restarts{unit="sglang-tiny-cpu-tp2-server"} 2\n' in guard
    proc = subprocess.run(
        [prometheus_tool("promtool"), "check", "metrics"], input=backoff + guard, capture_output=True, text=True
    )
    # exit 3 is lint only (these writers publish no HELP lines); a malformed exposition says "error"
    assert "error" not in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr


def test_audit_result_as_a_textfile(tmp_path):
    from ironserve.audit.runner import write_audit_textfile

    def result(host, check, ok):
        return types.SimpleNamespace(check=types.SimpleNamespace(host=host, id=check), ok=ok)

    write_audit_textfile(
        str(tmp_path / "ironserve_audit.prom"),
        [result("lab2", "file:/etc/systemd/system/x.service", False), result("lab3", "unit:sglang x active", True)],
    )
    text = (tmp_path / "ironserve_audit.prom").read_text()
    assert 'ironserve_audit_drift{host="lab2",check="file:/etc/systemd/system/x.service"} 1\n' in text
    assert 'ironserve_audit_drift{host="lab3",check="unit:sglang_x_active"} 0\n' in text
    with pytest.raises(ValueError, match=r"\.prom"):
        write_audit_textfile(str(tmp_path / "audit.txt"), [])


def test_clock_reports_a_deploy_every_host_of_which_failed(tmp_path):
    from roles.deploy_clock import DeployClock

    clock = DeployClock()
    clock.created, clock.started, clock.ended = 0.0, {"preflight": 1.0}, {"preflight": 3.0}
    ctx = types.SimpleNamespace(
        recipe=types.SimpleNamespace(id="tiny-cpu"),
        gate_results={},
        processes=[],
        host=types.SimpleNamespace(deploy_timings_json=str(tmp_path / "t.json")),
    )
    clock.contexts = {"lab2": ctx, "lab3": ctx}
    lab2, lab3 = FakeHost("lab2"), FakeHost("lab3")
    state = types.SimpleNamespace(
        activated_hosts={lab2, lab3},
        get_op_meta=lambda op: types.SimpleNamespace(global_arguments={"_ignore_errors": False}),
    )
    clock.operation_host_error(state, lab2, "op")
    assert not (tmp_path / "t.json").exists()  # lab3 still runs: its outcome may yet be a success
    clock.operation_host_error(state, lab3, "op")
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["success"] is False and data["stages"] == [
        {"stage": "plan", "seconds": 1.0},
        {"stage": "preflight", "seconds": 2.0},
    ]
    assert 'ironserve_deploy_last_success{recipe="tiny-cpu"} 0' in lab3.commands[-1]
