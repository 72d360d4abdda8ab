"""The audit's folded file questions answer exactly as testinfra's own commands do, run for real on this machine:
a file, an empty one, a directory, a link, a broken link, a missing path, a setuid mode, a name shlex must quote.
Its folded package questions likewise, read by the real dpkg-query from a status database of our own (dpkg's
DPKG_ADMINDIR): a multi-arch package, a held one, one removed with its configuration kept, an unknown one."""

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
from roles.nvidia_driver import hold_check

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


# dpkg's status database as dpkg writes it: a multi-arch library on two architectures, a held driver, a package
# removed with its configuration kept
STATUS = """\
Package: libfoo
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Version: 1.0
Maintainer: x <x@example.org>
Description: x

Package: libfoo
Status: install ok installed
Architecture: i386
Multi-Arch: same
Version: 1.0
Maintainer: x <x@example.org>
Description: x

Package: nvidia-open-580
Status: hold ok installed
Architecture: amd64
Version: 580.105.08-1
Maintainer: x <x@example.org>
Description: x

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 2.0
Maintainer: x <x@example.org>
Description: x
"""
PACKAGE_ASKED = ("dpkg-query -f '${{Status}}' -W {}", "dpkg-query -f '${{Status}} ${{Version}}' -W {}")
PACKAGES = ["libfoo", "nvidia-open-580", "gone", "no-such-package"]


@pytest.fixture
def dpkg_db(tmp_path, monkeypatch):
    admin = tmp_path / "dpkg"
    (admin / "info").mkdir(parents=True)
    (admin / "updates").mkdir()
    (admin / "status").write_text(STATUS)
    (admin / "available").write_text("")
    monkeypatch.setenv("DPKG_ADMINDIR", str(admin))  # read by every dpkg-query these tests start


def test_each_folded_package_question_gets_the_answer_its_own_command_gives(dpkg_db):
    commands = [q.format(p) for p in PACKAGES for q in PACKAGE_ASKED] + ["dpkg-query -f '${Status}' -W 'nvidia-*'"]
    folded = fold.fold(commands)
    # 8 questions become one dpkg-query; the glob (which -W would match against other packages) is asked alone
    assert folded.sent == [commands[-1], fold.PACKAGES + "gone libfoo no-such-package nvidia-open-580"]
    read = dict(zip(folded.sent, batched(folded.sent)))
    got = read | fold.unfold(folded, read)
    for cmd in commands:
        assert got[cmd] == alone(cmd), cmd
    assert got[PACKAGE_ASKED[0].format("libfoo")].lines == ("install ok installedinstall ok installed",)
    assert got[PACKAGE_ASKED[1].format("gone")] == batch.Answer(0, ("deinstall ok config-files 2.0",))
    assert got[PACKAGE_ASKED[0].format("no-such-package")].rc == 1


def test_a_dpkg_query_that_fails_sends_the_package_questions_one_by_one():
    folded = fold.fold([q.format("libfoo") for q in PACKAGE_ASKED])
    assert fold.unfold(folded, {folded.dpkg: batch.Answer(2, ())}) is None
    assert fold.unfold(folded, {folded.dpkg: batch.Answer(0, ("libfoo install ok installed",))}) is None
    assert fold.unfold(folded, {}) == {}  # cut off before dpkg-query answered: asked again


def test_a_snapshot_reads_packages_and_the_hold_in_one_dpkg_query(dpkg_db):
    checks = [Check("h", f"package:{p}", "package", "1.0", {"name": p}) for p in PACKAGES]
    hold = hold_check("nvidia-open-580")
    checks.append(Check("h", hold.id, hold.kind, hold.expected, {"cmd": hold.cmd}))
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
    assert sent[0].count("dpkg-query") == 1, sent[0]
    assert folded == each
    # (testinfra reads a multi-arch package's run-together status as not installed, folded or not)
    assert folded[1] == (False, "580.105.08-1") and folded[3] == (False, "not installed")
    assert folded[-1] == (True, "hold ok installed")
