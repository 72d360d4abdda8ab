"""The per-host deploy lock (roles/common.host_locked): two deploys on one host never interleave the commands that
build or remove what they share, a killed deploy leaves no stale lock (flock releases with its process), and a
venv another deploy is preparing is never removed from under it. Run by bash, as pyinfra runs each command."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from roles import common, uv_env


@pytest.fixture
def lock(tmp_path, monkeypatch):
    path = tmp_path / "run" / "deploy.lock"
    monkeypatch.setattr(common, "DEPLOY_LOCK", str(path))
    return path


def _start(command: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["sh", "-c", command], start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for(path, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_locked_commands_of_two_deploys_never_interleave(lock, tmp_path):
    log, started = tmp_path / "log", tmp_path / "a-started"
    first = _start(common.host_locked(f"touch {started}; echo a-start >> {log}; sleep 1; echo a-end >> {log}"))
    _wait_for(started)
    second = _start(common.host_locked(f"echo b >> {log}"))
    assert second.wait(timeout=20) == 0 and first.wait(timeout=20) == 0
    assert log.read_text().split() == ["a-start", "a-end", "b"]
    assert lock.exists() and lock.parent.stat().st_mode & 0o022 == 0  # the lock's directory: no one else writes


def test_a_killed_deploy_leaves_no_stale_lock(lock, tmp_path):
    started = tmp_path / "started"
    holder = _start(common.host_locked(f"touch {started}; sleep 600"))
    _wait_for(started)
    os.killpg(holder.pid, signal.SIGKILL)  # the deploy (its ssh session, its shell) killed mid-command
    holder.wait(timeout=10)
    began = time.monotonic()
    assert subprocess.run(["sh", "-c", common.host_locked("true")], timeout=20).returncode == 0
    assert time.monotonic() - began < 5


def test_a_lock_held_too_long_fails_saying_so(lock, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "DEPLOY_LOCK_WAIT_S", 1)
    started = tmp_path / "started"
    holder = _start(common.host_locked(f"touch {started}; sleep 30"))
    try:
        _wait_for(started)
        out = subprocess.run(["sh", "-c", common.host_locked("true")], capture_output=True, text=True, timeout=20)
        assert out.returncode == common.DEPLOY_LOCK_TIMEOUT_RC and "another deploy held" in out.stderr
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)


def test_removal_keeps_a_venv_another_deploy_is_preparing(lock, tmp_path):
    preparing, orphan, old = (
        tmp_path / "runtime-aaaaaaaaaaaa",
        tmp_path / "runtime-bbbbbbbbbbbb",
        tmp_path / "runtime-cccccccccccc",
    )
    for venv in (preparing, orphan, old):
        (venv / "bin").mkdir(parents=True)
    subprocess.run(["sh", "-c", uv_env.prepared(str(preparing))], check=True)
    subprocess.run(["sh", "-c", uv_env.prepared(str(old))], check=True)
    stale = time.time() - (uv_env.PREPARED_MINUTES + 5) * 60
    os.utime(old / uv_env.PREPARED_MARK, (stale, stale))  # a deploy killed a day ago: its mark has expired
    out = subprocess.run(
        ["sh", "-c", uv_env.removal_command([str(preparing), str(orphan), str(old)])],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert preparing.is_dir() and f"{preparing} kept" in out.stdout
    assert not orphan.exists() and not old.exists()
