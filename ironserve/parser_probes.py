"""Warm parser probes: one probe process per parser venv, kept for the life of this process.

Importing ``sglang.srt.server_args`` takes 10-30 s of CPU on a small machine, and a lint of a catalogue (or an
import of a script, or a test session) checks many commands against the same release one call at a time. A probe
started with ``--serve`` imports once and answers one JSON request per line for as long as this process lives; it is
closed at exit, and replaced when its venv changes (rebuilt: another manifest) or it fails, times out or dies. It
keeps the environment it started with (this process's, as ``engine_parser`` filters it). A venv being built is probed cold (``engine_parser._probe_raw``): its path moves.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ironserve import _parser_probe

ANSWER = _parser_probe.ANSWER.encode()  # the line that carries an answer; imports may print anything else
_READ_CHUNK = 1 << 16


class ProbeFailed(Exception):
    """The probe gave no answer: it died, timed out or said something else. ``detail``: its stderr's tail."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class WarmProbe:
    """One ``_parser_probe.py --serve`` process: requests in on stdin, answers out on stdout, a line each."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.lock = threading.Lock()
        self.errors = tempfile.TemporaryFile()  # drained by the kernel, never by a full pipe
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, env=env)
        self.pending = b""

    def ask(self, request: dict, timeout: float) -> dict:
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
            except OSError as err:
                raise ProbeFailed(f"the probe is gone (rc={self.proc.poll()}): {err}", self.stderr_tail()) from err
            deadline = time.monotonic() + timeout
            while True:
                line = self._line(deadline)
                if line.startswith(ANSWER):
                    return json.loads(line[len(ANSWER) :])

    def _line(self, deadline: float) -> bytes:
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProbeFailed("timed out", self.stderr_tail())
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.proc.stdout.fileno(), _READ_CHUNK)
            if not chunk:
                raise ProbeFailed(f"gave no answer (rc={self.proc.wait()})", self.stderr_tail())
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def stderr_tail(self, size: int = 3000) -> str:
        self.errors.seek(0, os.SEEK_END)
        self.errors.seek(max(0, self.errors.tell() - size))
        return self.errors.read().decode(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Killed: a probe keeps nothing worth a clean exit, and torch's threads can hold up a polite one."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.errors):
            stream.close()


_PROBES: dict[Path, tuple[tuple, WarmProbe]] = {}
_PROBES_LOCK = threading.Lock()


def ask(venv: Path, cmd: list[str], env: dict[str, str], request: dict, timeout: float, version_key) -> dict:
    """The answer of ``venv``'s warm probe (started, or restarted, as needed). ``version_key``: what names the venv's
    build (its manifest's status): another one means a rebuilt venv and a new probe."""
    key = (tuple(cmd), version_key)
    with _PROBES_LOCK:
        kept = _PROBES.get(venv)
        if kept is not None and (kept[0] != key or not kept[1].alive()):
            kept[1].close()
            kept = None
        if kept is None:
            kept = _PROBES[venv] = (key, WarmProbe(cmd, env))
    probe = kept[1]
    try:
        answer = probe.ask(request, timeout)
    except BaseException:
        _discard(venv, probe)
        raise
    if not answer.get("ok"):
        _discard(venv, probe)  # its import failed: the next question starts a new probe
    return answer


def _discard(venv: Path, probe: WarmProbe) -> None:
    with _PROBES_LOCK:
        if venv in _PROBES and _PROBES[venv][1] is probe:
            del _PROBES[venv]
    probe.close()


@atexit.register
def close_all() -> None:
    with _PROBES_LOCK:
        probes = [probe for _, probe in _PROBES.values()]
        _PROBES.clear()
    for probe in probes:
        probe.close()
