"""The audit's folded file questions answer exactly as testinfra's own commands do, run for real on this machine:
a file, an empty one, a directory, a link, a broken link, a missing path, a setuid mode, a name shlex must quote."""

from __future__ import annotations

import shlex
import subprocess

import pytest
import testinfra

from ironserve import batch
from ironserve.audit import fold
from ironserve.audit.checks import Check
from ironserve.audit.evaluate import evaluate
from ironserve.audit.snapshot import HostSnapshot

ASKED = ("test -e {}", "sha256sum {} | cut -d ' ' -f 1", "stat -Lc %a {}", "stat -Lc %U {}")


def sh(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, stdin=subprocess.DEVNULL)


def alone(cmd: str) -> batch.Answer:
    out = sh(cmd)
    return batch.Answer(out.returncode, tuple(out.stdout.splitlines()))


def batched(commands: list[str]) -> list[batch.Answer | None]:
    nonce = batch.new_nonce()
    return batch.split(sh(batch.compose(commands, nonce)).stdout.splitlines(), len(commands), nonce)


@pytest.fixture
def paths(tmp_path) -> list[str]:
    (tmp_path / "unit.service").write_text("[Unit]\n")
    (tmp_path / "secret.env").write_text("A=1\n")
    (tmp_path / "secret.env").chmod(0o640)
    (tmp_path / "empty").write_text("")
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o4755)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "unit.service")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    (tmp_path / "with space").write_text("x\n")
    names = ["unit.service", "secret.env", "empty", "tool", "dir", "link", "broken", "missing", "with space"]
    return [str(tmp_path / n) for n in names]


def test_each_folded_question_gets_the_answer_its_own_command_gives(paths):
    commands = [q.format(shlex.quote(p)) for p in paths for q in ASKED] + ["echo unrelated"]
    folded = fold.fold(commands)
    # 8 safe paths' 32 questions become one stat and one sha256sum; the quoted name's and the other read stay
    assert len(folded.sent) == 4 + 1 + 2, folded.sent
    read = dict(zip(folded.sent, batched(folded.sent)))
    got = read | fold.unfold(folded, read)
    for cmd in commands:
        assert got[cmd] == alone(cmd), cmd
    assert got["stat -Lc %a " + paths[3]] == batch.Answer(0, ("4755",))
    assert got["test -e " + paths[6]].rc == 1  # a broken link does not exist, for test -e and stat -L alike


def test_a_stat_that_cannot_answer_sends_the_questions_one_by_one(paths):
    folded = fold.fold([q.format(p) for p in paths[:2] for q in ASKED])
    assert fold.unfold(folded, {folded.stat: batch.Answer(127, ())}) is None
    # a batch cut off before the stat answered leaves the questions unanswered (asked again), never guessed
    assert fold.unfold(folded, {}) == {}
    # only a name shlex leaves as it is is folded: sha256sum would print a backslash's name escaped
    assert fold.fold(["test -e /etc/a\\b"]).sent == ["test -e /etc/a\\b"]


def test_a_snapshot_reads_files_folded_with_the_results_of_reading_each(paths):
    owner = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    checks = [Check("h", f"file:{p}", "file", "0" * 64, {"path": p, "mode": 0o644, "owner": owner}) for p in paths]
    checks.append(Check("h", "env:secret", "env_file", "A=1\n", {"path": paths[1], "mode": 0o600}))
    snap = HostSnapshot("local://")
    sent: list[str] = []
    real, run = snap.real, snap.real.run
    real.run = lambda command, *a, **kw: sent.append(command) or run(command, *a, **kw)
    try:
        snap.read(checks, evaluate)
        folded = [evaluate(snap.host(), c) for c in checks]
    finally:
        real.run = run
    each = [evaluate(testinfra.get_host("local://"), c) for c in checks]
    assert snap.error is None and snap.commands == 1 and len(sent) == 1
    # testinfra's 3 probes (uname -s and -m, os-release), the quoted name's 4 questions, the env file's contents,
    # and the 8 safe paths' 32 questions in one stat and one sha256sum
    assert sent[0].count("__rc=$?") == 3 + 4 + 1 + 2, sent[0]
    assert folded == each
    assert folded[-1] == (False, "mode 0o640 (secrets readable)")
    assert folded[0][1] == f"content {'0' * 12} != {'0' * 12}" or not folded[0][0]
