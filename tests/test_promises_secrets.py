"""Secret files' "no world-readable moment", checked at every step of the write and not only between commands:
the install script roles/secret_file.py generates runs for real in a temporary directory under bash with a DEBUG
trap that, before each simple command of the script (and once after its last), records every file of the
destination's directory: its mode and whether it holds the secret. Writing the secret into the final path
first, into a file born with the default umask, or chmodding after the content is in, each shows a moment where
a file holding the secret is readable by group or others."""

from __future__ import annotations

import shlex
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from roles.secret_file import Secret
from tests.test_secret_file import VALUE, LocalHost


class SteppedHost(LocalHost):
    """LocalHost whose ``sh -c SCRIPT`` commands run under bash with a DEBUG trap recording, before every simple
    command, "<name> <octal mode> <secret|->" for each file of the watched directory."""

    def __init__(self, watch: Path, log: Path):
        super().__init__(watch, sudo=False)
        self.log = log

    def run_shell_command(self, command, _sudo=False, **kwargs):
        words = shlex.split(str(command))
        if words[:2] != ["sh", "-c"]:
            return super().run_shell_command(command, _sudo=_sudo, **kwargs)
        self.commands.append(str(command))
        watch, log, secret = (shlex.quote(str(x)) for x in (self.watch, self.log, VALUE))
        record = (
            f'for f in {watch}/* {watch}/.[!.]*; do [ -f "$f" ] || continue; '
            f'if grep -qF {secret} "$f"; then held=secret; else held=-; fi; '
            f'echo "$(basename "$f") $(stat -c %a "$f") $held"; done >> {log}; echo --- >> {log}'
        )
        script = f"trap {shlex.quote(record)} DEBUG\n{words[2]}\n{record}"
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        out = SimpleNamespace(stdout_lines=proc.stdout.splitlines(), stderr=proc.stderr, stdout=proc.stdout)
        return proc.returncode == 0, out


def _moments(log: Path) -> list[list[tuple[str, int, bool]]]:
    moments, current = [], []
    for line in log.read_text().splitlines():
        if line == "---":
            moments.append(current)
            current = []
        else:
            name, mode, held = line.split()
            current.append((name, int(mode, 8), held == "secret"))
    return moments


def _write(tmp_path, existing_mode: int | None):
    etc = tmp_path / "etc"
    etc.mkdir()
    dest = etc / "api.env"
    if existing_mode is not None:
        dest.write_text("old\n")
        dest.chmod(existing_mode)
    log = tmp_path / "moments.log"
    host = SteppedHost(etc, log)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    assert Secret(VALUE).write_secret(None, host, str(dest), "600", user, group)
    return dest, _moments(log)


@pytest.mark.parametrize("existing_mode", [None, 0o644, 0o666])
def test_no_file_holding_the_secret_is_ever_readable_by_others(tmp_path, existing_mode):
    dest, moments = _write(tmp_path, existing_mode)
    assert len(moments) >= 5, "the script's steps were not observed"
    holding = [(name, mode) for moment in moments for name, mode, held in moment if held]
    assert holding, "the secret was never seen in the directory: the observation is broken"
    assert all(mode & 0o077 == 0 for _, mode in holding), holding
    # the temporary file is the only one that holds the secret before the final rename
    first = next(i for i, moment in enumerate(moments) if any(held for _, _, held in moment))
    assert [name for name, _, held in moments[first] if held][0].startswith(".api.env.")
    assert dest.read_text() == VALUE and stat.S_IMODE(dest.stat().st_mode) == 0o600


def test_the_temporary_file_is_born_private_before_any_content(tmp_path):
    _, moments = _write(tmp_path, 0o644)
    temporaries = [(mode, held) for moment in moments for name, mode, held in moment if name.startswith(".api.env.")]
    assert temporaries and temporaries[0] == (0o600, False)  # created empty and 0600, then filled
    assert all(mode == 0o600 for mode, _ in temporaries)


class _Scripted(LocalHost):
    """LocalHost that records each command with the sudo it was run with, and can fail one step: "mktemp",
    "upload" or "install"."""

    def __init__(self, watch: Path, sudo: bool, fail: str = ""):
        super().__init__(watch, sudo)
        self.fail, self.sudo_of, self.logged = fail, [], []

    def run_shell_command(self, command, _sudo=False, **kwargs):
        self.sudo_of.append((str(command).split()[0:2], _sudo))
        if self.fail == "mktemp" and "mktemp -d" in str(command):  # a failed mktemp's stdout is no directory
            return False, SimpleNamespace(stdout_lines=[str(self.watch)], stderr="mktemp: no space", stdout="")
        if self.fail == "install" and str(command).startswith("sh -c"):
            return False, SimpleNamespace(stdout_lines=[], stderr="mv: read-only file system", stdout="")
        return super().run_shell_command(command, _sudo=_sudo, **kwargs)

    def put_file(self, src, dest, **kwargs):
        return False if self.fail == "upload" else super().put_file(src, dest, **kwargs)

    def log_styled(self, message, **kwargs):
        self.logged.append(message)


def _me():
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    return user, subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("sudo", [False, True])
def test_the_install_and_the_cleanup_run_with_the_hosts_sudo_the_upload_as_the_user(tmp_path, sudo):
    host = _Scripted(tmp_path, sudo)
    assert Secret(VALUE).write_secret(None, host, str(tmp_path / "new" / "api.env"), "600", *_me())
    assert [s for _, s in host.sudo_of] == [False, sudo, sudo]  # mktemp -d, the install, the clean-up
    assert host.sudo_of[1][0] == ["sh", "-c"] and host.sudo_of[2][0] == ["rm", "-rf"]
    # a destination directory that did not exist is made (755: it is a directory like /etc/ironserve)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o755
    assert f"chown {shlex.quote(':'.join(_me()))} " in shlex.split(host.commands[1])[2]


@pytest.mark.parametrize(
    "fail, said",
    [
        ("mktemp", "cannot make a private upload directory: mktemp: no space"),
        ("upload", None),
        ("install", "could not put the secret in place: mv: read-only file system"),
    ],
)
def test_a_failed_step_fails_the_write_and_leaves_no_upload_behind(tmp_path, fail, said):
    dest = tmp_path / "api.env"
    host = _Scripted(tmp_path, False, fail)
    assert Secret(VALUE).write_secret(None, host, str(dest), "600", *_me()) is False
    assert not dest.exists()
    if said:
        assert host.logged == [f"{dest}: {said}"]
    for upload, _ in host.uploads:
        assert not Path(upload).parent.exists()
    if fail != "mktemp":
        assert host.sudo_of[-1][0] == ["rm", "-rf"]  # the upload directory removed whatever happened


def test_a_secret_prints_as_hidden_exactly():
    assert repr(Secret(VALUE)) == str(Secret(VALUE)) == "Secret(<hidden>)"


@pytest.mark.parametrize("text", ["", "\n", "first\nsecond\n"])
def test_a_controller_secret_file_holds_exactly_one_line(tmp_path, text):
    from pyinfra.api import OperationError

    from roles.secret_file import read_secret

    path = tmp_path / "key"
    path.write_text(text)
    with pytest.raises(OperationError, match=f"^api key: {path} must hold exactly one non-empty line$"):
        read_secret(str(path), "api key")
    absent = tmp_path / "absent"
    with pytest.raises(OperationError) as raised:
        read_secret(str(absent), "api key")
    assert str(raised.value) == (
        f"api key: {absent} does not exist on this machine (host data points at a file on "
        "the controller, not on the host)"
    )


def test_generated_secrets_live_in_a_directory_made_with_its_parents(tmp_path):
    from roles.secret_file import generated_secret

    where = tmp_path / "home" / ".config" / "ironserve" / "secrets"
    assert len(generated_secret("g", str(where)).reveal()) == 64
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    (where / "g").write_text("")  # a generated secret emptied by hand: the error names it
    from pyinfra.api import OperationError

    with pytest.raises(OperationError, match=f"^generated secret g: {where / 'g'} must hold exactly one"):
        generated_secret("g", str(where))
