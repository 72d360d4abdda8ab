"""roles/secret_file.py beyond its fixtures: the write itself, run for real on this machine through a stand-in
pyinfra host (commands run by the local shell, uploads written locally), and the controller's secrets."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from roles.secret_file import Secret, generated_secret, read_secret

VALUE = "sk-" + "q" * 40


class LocalHost:
    """Just what write_secret uses of a pyinfra host: run_shell_command, put_file, data, log_styled. Records
    every command and upload, and the mode of every file in the destination's directory at each step."""

    def __init__(self, watch: Path, sudo: bool):
        self.data = {"_sudo": sudo}
        self.commands: list[str] = []
        self.uploads: list[tuple[str, int]] = []
        self.watch = watch
        self.seen_modes: list[tuple[str, int]] = []

    def _snapshot(self):
        for p in self.watch.iterdir():
            self.seen_modes.append((p.name, stat.S_IMODE(p.stat().st_mode)))

    def run_shell_command(self, command, _sudo=False, **kwargs):
        self.commands.append(str(command))
        self._snapshot()
        proc = subprocess.run(["sh", "-c", str(command)], capture_output=True, text=True)
        self._snapshot()
        out = SimpleNamespace(stdout_lines=proc.stdout.splitlines(), stderr=proc.stderr, stdout=proc.stdout)
        return proc.returncode == 0, out

    def put_file(self, src, dest, **kwargs):
        Path(dest).write_text(src.read())
        parent = stat.S_IMODE(Path(dest).parent.stat().st_mode)
        self.uploads.append((dest, parent))
        return True

    def log_styled(self, *args, **kwargs):
        pass


@pytest.mark.parametrize("sudo", [False, True])
def test_write_secret_never_leaves_a_readable_copy_and_never_shows_the_value(tmp_path, sudo):
    etc = tmp_path / "etc"
    etc.mkdir()
    dest = etc / "api.env"
    dest.write_text("old\n")
    dest.chmod(0o644)  # a world-readable leftover is replaced, not chmodded after the fact
    host = LocalHost(etc, sudo)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    assert Secret(VALUE).write_secret(None, host, str(dest), "600", user, group)
    assert dest.read_text() == VALUE and stat.S_IMODE(dest.stat().st_mode) == 0o600
    # the upload went into a private (0700) directory, which is gone afterwards
    ((upload, parent_mode),) = host.uploads
    assert parent_mode == 0o700 and not Path(upload).parent.exists()
    # every file seen in the destination directory, temporary ones included, was 0600 (but the old one)
    assert all(mode == 0o600 for name, mode in host.seen_modes if name != "api.env" or mode != 0o644)
    assert [p.name for p in etc.iterdir()] == ["api.env"]
    assert not any(VALUE in c for c in host.commands)


def test_a_secret_never_prints():
    secret = Secret(VALUE)
    assert VALUE not in repr(secret) and VALUE not in str(secret) and VALUE not in f"{secret!r} {[secret]}"
    assert secret.reveal() == VALUE
    assert secret.digest("/a") != secret.digest("/b")  # the host-side digest is salted with the path


def test_generated_secrets_are_made_once_and_kept_private(tmp_path):
    where = tmp_path / "secrets"
    first = generated_secret("rank-group-x", str(where))
    assert generated_secret("rank-group-x", str(where)) == first  # every run, every host: the same
    assert generated_secret("rank-group-y", str(where)) != first
    assert len(first.reveal()) == 64
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert stat.S_IMODE((where / "rank-group-x").stat().st_mode) == 0o600
    assert read_secret(str(where / "rank-group-x"), "x") == first
    os.remove(where / "rank-group-x")  # rotation: delete the file
    assert generated_secret("rank-group-x", str(where)) != first
