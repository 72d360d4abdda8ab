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
        record = (f"for f in {watch}/* {watch}/.[!.]*; do [ -f \"$f\" ] || continue; "
                  f"if grep -qF {secret} \"$f\"; then held=secret; else held=-; fi; "
                  f"echo \"$(basename \"$f\") $(stat -c %a \"$f\") $held\"; done >> {log}; echo --- >> {log}")
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
