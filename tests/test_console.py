"""The console script ends quietly: Ctrl-C is 130, a closed output pipe 141, neither with a traceback; bad input
is 2 for every command; --version names the release."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ironserve import cli, console
from ironserve.resources import version

BIN = Path(sys.executable).parent / "ironserve"


@pytest.mark.parametrize("raised,code", [(KeyboardInterrupt, 130), (BrokenPipeError, 141)])
def test_interrupts_and_closed_pipes_have_their_codes(monkeypatch, capsys, raised, code):
    def main():
        raise raised()

    monkeypatch.setattr(cli, "main", main)
    assert console.run() == code
    assert "Traceback" not in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly():
    proc = subprocess.run(
        f"{BIN} lint --rules | head -1", shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash"
    )
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1 and proc.stderr == "", proc.stderr


def test_version_and_bad_input(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"ironserve {version()}"
    for argv in (
        ["render", "no-such-recipe"],
        ["lint", "--offline", "no-such-recipe"],
        ["lock", "no-such-recipe"],
        ["import", "--hardware", "no-such-hw", "--", "python3", "-m", "sglang.launch_server"],
    ):
        assert cli.main(argv) == 2, argv
