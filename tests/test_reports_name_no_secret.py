"""Status and bench reports print key names, never values (issue 12).

With an API key file and a hub token file in the inventory's host data, and the hosts' probes answering, neither
secret's value appears anywhere in `ironserve status` (text and JSON), nor in the bench stage's command, nor in its
report. The lab end-to-end test (tests/e2e/cpu3/test_1_serve_tiny_lab.py) checks the same against a real keyed deployment.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ironserve import status as status_mod
from ironserve.bench import public_result, report
from ironserve.catalogue import get_recipe

KEY = "sk-status-" + "9f3b2c71e4a8d605"
TOKEN = "hf_" + "QwErTy0123456789tokenvalue"


@pytest.fixture
def keyed_inventory(tmp_path: Path) -> Path:
    key, token = tmp_path / "api_key", tmp_path / "hf_token"
    key.write_text(KEY + "\n")
    token.write_text(TOKEN + "\n")
    key.chmod(0o600)
    token.chmod(0o600)
    inventory = tmp_path / "inventory.py"
    data = {
        "hardware": "rtx6000-pro-maxq",
        "ssh_user": "ubuntu",
        "_sudo": True,
        "nic": "enp65s0f0",
        "model_source": "hub",
        "api_key_file": str(key),
        "hf_token_file": str(token),
    }
    inventory.write_text(f"gpu_nodes = [('gpu-a', {{**{data!r}, 'ssh_hostname': '192.0.2.10'}})]\n")
    return inventory


def _probe_answers(spec: str, units: list[dict]):
    # what a reachable host answers (the probe itself reads only unit states and /health codes); the spec is
    # printed in an unreachable host's error, so it must hold no secret either
    assert KEY not in spec and TOKEN not in spec
    return [
        {**{k: v for k, v in u.items() if k != "health_url"}, "active": "active", "health": "200"} for u in units
    ], None


def _probe_fails(spec: str, units: list[dict]):
    return [], f"NoValidConnectionsError: cannot reach {spec}"


@pytest.mark.parametrize("fmt", ["json", "text"])
@pytest.mark.parametrize("probe", [_probe_answers, _probe_fails], ids=["reachable", "unreachable"])
def test_status_prints_no_secret_value(keyed_inventory, monkeypatch, fmt, probe):
    monkeypatch.setattr(status_mod, "_probe", probe)
    out = io.StringIO()
    rc = status_mod.status(str(keyed_inventory), "deploys/glm5.py", out=out, fmt=fmt)
    text = out.getvalue()
    assert rc == (0 if probe is _probe_answers else 2), text
    assert "gpu-a" in text  # the report was really written
    assert KEY not in text and TOKEN not in text, text
    if fmt == "json":
        json.loads(text)


def test_bench_report_keeps_no_secret_value():
    """The bench report (printed table and the bench_report JSON) is built from bench_serving's result: a key or
    token in it (a future bench_serving echoing its arguments) is dropped, the figures kept."""
    recipe = get_recipe("glm5-nvfp4-rtx6000-tp8")
    result = {
        "completed": 8,
        "output_throughput": 100.0,
        "mean_tpot_ms": 20.0,
        "api_key": KEY,
        "HF_TOKEN": "x",
        "note": TOKEN,
        "backend": "sglang",
    }
    kept = public_result(result)
    assert kept == {"completed": 8, "output_throughput": 100.0, "mean_tpot_ms": 20.0, "backend": "sglang"}
    text, _ok = report(recipe, kept)
    dumped = json.dumps(kept) + text
    assert KEY not in dumped and TOKEN not in dumped and "100.00" in text
