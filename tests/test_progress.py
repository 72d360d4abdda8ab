"""Long waits (pulls, builds, downloads, venv installs) say they are still running through pyinfra's logger."""

from __future__ import annotations

import gevent

from roles.common import LongCommand


class _State:
    print_output = print_input = False


class _Host:
    def __init__(self):
        self.lines: list[str] = []

    def log(self, message):
        self.lines.append(message)

    def run_shell_command(self, command, **kwargs):
        gevent.sleep(0.35)  # the remote command runs; the SSH channel waits cooperatively
        return True, None


def test_progress_lines_while_the_command_runs():
    host = _Host()
    cmd = LongCommand("docker pull repo@sha256:" + "0" * 64, "pulling repo", every=0.1)
    assert str(cmd) == "docker pull repo@sha256:" + "0" * 64  # the plan shows the plain command
    assert cmd.execute(_State(), host, {}) == (True, None)
    ticks = [line for line in host.lines if "still running after" in line]
    assert len(ticks) >= 2 and all(line.startswith("pulling repo: ") for line in ticks), host.lines
    assert host.lines[-1].startswith("pulling repo: ") and host.lines[-1].endswith("s")
    gevent.sleep(0.25)
    assert len([line for line in host.lines if "still running" in line]) == len(ticks)  # the ticker stopped
