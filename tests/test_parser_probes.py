"""Warm parser probes (ironserve/parser_probes.py): one process per venv answers every check of this process.

A stand-in probe (a few lines of Python speaking the probe's line protocol) counts its own requests; the real probe's
``--serve`` mode is checked in tests/test_engine_parser.py (a real parser venv).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from ironserve import _parser_probe, parser_probes

FAKE = textwrap.dedent(
    """
    import json, os, sys
    print("a banner an import printed", flush=True)
    for n, line in enumerate(sys.stdin, 1):
        request = json.loads(line)
        if request.get("die"):
            sys.stderr.write("the probe fell over\\n")
            sys.exit(9)
        if request.get("hang"):
            sys.stdin.read()
        print("noise between answers", flush=True)
        answer = {"ok": not request.get("fail"), "pid": os.getpid(), "served": n, "echo": request.get("echo")}
        sys.stdout.write(MARK + json.dumps(answer) + "\\n")
        sys.stdout.flush()
    """
).replace("MARK", repr(parser_probes.ANSWER.decode()))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The stand-in's command; the probes these tests start are theirs alone (the session's real ones stay)."""
    script = tmp_path / "probe.py"
    script.write_text(FAKE)
    monkeypatch.setattr(parser_probes, "_PROBES", {})
    yield [sys.executable, str(script)]
    parser_probes.close_all()


def ask(cmd, request, venv=Path("/venv/a"), version=1, timeout=30):
    return parser_probes.ask(venv, cmd, {}, request, timeout, version)


def test_one_process_answers_every_request_and_skips_what_imports_print(fake):
    first = ask(fake, {"echo": "one"})
    second = ask(fake, {"echo": "two"})
    assert (first["echo"], second["echo"]) == ("one", "two")
    assert first["pid"] == second["pid"] and second["served"] == 2


def test_each_venv_has_its_own_probe_and_a_rebuilt_venv_a_new_one(fake):
    a = ask(fake, {})
    b = ask(fake, {}, venv=Path("/venv/b"))
    assert a["pid"] != b["pid"]
    rebuilt = ask(fake, {}, version=2)
    assert rebuilt["pid"] != a["pid"] and rebuilt["served"] == 1
    assert ask(fake, {}, venv=Path("/venv/b"))["pid"] == b["pid"]


def test_a_probe_that_dies_says_why_and_the_next_question_starts_another(fake):
    before = ask(fake, {})
    with pytest.raises(parser_probes.ProbeFailed) as err:
        ask(fake, {"die": True})
    assert "rc=9" in str(err.value) and "the probe fell over" in err.value.detail
    after = ask(fake, {})
    assert after["pid"] != before["pid"] and after["served"] == 1


def test_a_hung_probe_times_out_and_is_killed(fake):
    ask(fake, {})
    probe = parser_probes._PROBES[Path("/venv/a")][1]
    with pytest.raises(parser_probes.ProbeFailed, match="timed out"):
        ask(fake, {"hang": True}, timeout=0.5)
    assert not probe.alive() and Path("/venv/a") not in parser_probes._PROBES


def test_a_failed_import_is_not_kept(fake):
    failed = ask(fake, {"fail": True})
    assert failed["ok"] is False and Path("/venv/a") not in parser_probes._PROBES
    assert ask(fake, {})["pid"] != failed["pid"]


def test_close_all_ends_every_probe(fake):
    ask(fake, {})
    ask(fake, {}, venv=Path("/venv/b"))
    probes = [probe for _, probe in parser_probes._PROBES.values()]
    parser_probes.close_all()
    assert not parser_probes._PROBES and not any(p.alive() for p in probes)


def test_the_real_probe_serves_a_line_each_and_stops_at_a_failed_import(monkeypatch, capsys):
    answers = []
    monkeypatch.setattr(_parser_probe, "_answer", lambda obj, mark="": answers.append((mark, obj)))

    def no_sglang():
        raise ModuleNotFoundError("No module named 'sglang'", name="sglang.srt")

    monkeypatch.setattr(_parser_probe, "_server_parser", no_sglang)
    rc = _parser_probe.serve(['{"kind": "server", "argvs": []}\n', '{"kind": "server"}\n'])
    assert rc == 3 and len(answers) == 1
    mark, answer = answers[0]
    assert mark == _parser_probe.ANSWER == parser_probes.ANSWER.decode()
    assert answer["ok"] is False and answer["missing_module"] == "sglang"
