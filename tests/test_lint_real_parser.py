"""`ironserve lint` with SGLang's real parsers (cached CPU venvs): seed-era drift is said per recipe."""

from __future__ import annotations

import json
import shlex

import pytest

from ironserve.cli import main

from .ci import need_parser_prerequisites

pytestmark = pytest.mark.parser


@pytest.fixture(autouse=True)
def _parser_prerequisites():
    need_parser_prerequisites()


def lint_json(capsys, *args) -> tuple[int, dict]:
    rc = main(["lint", "--format", "json", *args])
    return rc, json.loads(capsys.readouterr().out)


def test_image_era_recipe_reports_parser_drift_as_warning(capsys):
    rc, out = lint_json(capsys, "glm5-nvfp4-mtp-rtx6000-tp8")
    assert rc == 0
    drift = [f for f in out["findings"] if f["rule"] == "engine-unknown-flag"]
    assert drift and drift[0]["severity"] == "warning"
    assert "--enable-pcie-oneshot-allreduce" in drift[0]["message"] and "dev-cu13-2026-03" in drift[0]["message"]


def test_recipe_against_0_5_23_fails_with_replacements(capsys):
    rc, out = lint_json(capsys, "glm5.1-w4a8-a3-2p1d-48-128k-prefix90", "--engine", "sglang==0.5.23")
    assert rc == 1
    fixes = " ".join(f["fix"] for f in out["findings"] if f["severity"] == "error")
    assert "--enable-prefill-cp" in fixes and "--cuda-graph-bs-decode" in fixes


def test_pasted_command_unknown_flag_suggests_nearest(capsys):
    cmd = "python3 -m sglang.launch_server --model-path /m --tp-size 2 --mem-fraction-statik 0.8"
    rc, out = lint_json(capsys, "--hardware", "rtx6000-pro", "--engine", "sglang==0.5.9", "--", *shlex.split(cmd))
    assert rc == 1
    (hit,) = [f for f in out["findings"] if f["rule"] == "engine-unknown-flag"]
    assert "--mem-fraction-static" in hit["fix"]


def test_router_argv_is_checked_with_sglang_router(capsys):
    rc, out = lint_json(capsys, "glm5.1-w4a8-a3-4p1d-48-64k-prefix90")
    assert rc == 0, out
