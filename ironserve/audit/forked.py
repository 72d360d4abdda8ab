"""A function run in a forked copy of this process while this one goes on: the audit's plan beside its handshakes.

An audit's controller work before its first read is one core's serial work: the plan (recipe + inventory -> checks,
pure CPU, a fifth of an audit on 8 hosts), pytest's import and the SSH handshakes. On a machine with two cores the
other one waits. Here the plan runs in a forked child on that core while the parent opens the connections and
imports the session, and the child's result (or its error: a SpecError is raised in the parent as it was raised
in the child) comes back pickled over a pipe, from our own process image to itself.

A process with other native threads is not forked (a lock another thread held at the fork would stay held in the
child), nor is one outside Linux: there the function runs in this process when its result is asked for.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from typing import Any, NoReturn

HEADER = 8  # bytes of the payload's length, before the payload


def single_threaded() -> bool:
    """This process runs one native thread (Linux: one entry in /proc/self/task)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


class Forked:
    """``fn(*args)`` computed in a forked child; ``result()`` waits for it (letting gevent's greenlets run)."""

    def __init__(self, fn: Callable[..., Any], *args: Any):
        self.call = (fn, args)
        self.pid: int | None = None
        if not (sys.platform.startswith("linux") and single_threaded()):
            return
        sys.stdout.flush()  # what this process has buffered is written once, by this process
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child(write_end, fn, args)
        os.close(write_end)
        self.pid, self.fd = pid, read_end

    def result(self) -> Any:
        fn, args = self.call
        if self.pid is None:
            return fn(*args)
        try:
            payload = _read_payload(self.fd)
        finally:
            os.close(self.fd)
            _, status = os.waitpid(self.pid, 0)
            self.pid = None
        if payload is None:
            raise RuntimeError(f"{fn.__name__} ended in its forked process without an answer (wait status {status})")
        ok, value = pickle.loads(payload)
        if ok:
            return value
        raise value


def _child(fd: int, fn: Callable[..., Any], args: tuple) -> NoReturn:
    """The child's whole life: compute, write, exit (never returning into the parent's code)."""
    code = 1
    try:
        try:
            payload = pickle.dumps((True, fn(*args)))
        except Exception as exc:  # noqa: BLE001 - said by the parent, as the parent would have said it
            payload = _error_payload(exc)
        os.write(fd, len(payload).to_bytes(HEADER, "big"))
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        code = 0
    except BaseException:  # noqa: BLE001 - interrupted (Ctrl-C reaches both): the parent says it once
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _error_payload(exc: Exception) -> bytes:
    try:
        return pickle.dumps((False, exc))
    except Exception:  # noqa: BLE001 - an error that does not pickle is said by its type and text
        return pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))


def _read_payload(fd: int) -> bytes | None:
    """The child's length-prefixed payload, or None where it ended before writing all of it."""
    header = _read_exactly(fd, HEADER)
    if header is None:
        return None
    return _read_exactly(fd, int.from_bytes(header, "big"))


def _read_exactly(fd: int, size: int) -> bytes | None:
    from gevent.socket import wait_read  # the connections' greenlets go on while this waits

    chunks, left = [], size
    while left:
        wait_read(fd)
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
