"""A function run in a forked copy of this process while this one goes on: the audit's plan beside its handshakes.

An audit's controller work before its first read is one core's serial work: the plan (recipe + inventory -> checks,
pure CPU, a fifth of an audit on 8 hosts), pytest's import and the SSH handshakes. On a machine with two cores the
other one waits. Here the plan runs in a forked child on that core while the parent opens the connections and
imports the session, and the child's result (or its error: a SpecError is raised in the parent as it was raised
in the child) comes back pickled over a pipe, from our own process image to itself.

The child can be forked before all of its arguments are known: it first runs ``warm`` (the imports and loads every
plan begins with) while the parent computes the last argument (the inventory read) and ``send``s it over a second
pipe. So the plan's imports run on the other core while the parent reads the inventory, instead of after it.

A process with other native threads is not forked (a lock another thread held at the fork would stay held in the
child), nor is one outside Linux: there the function runs in this process when its result is asked for.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

HEADER = 8  # bytes of the payload's length, before the payload
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # (Python 3.10 names it; Linux's number)


def single_threaded() -> bool:
    """This process runs one native thread (Linux: one entry in /proc/self/task)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


class Forked:
    """``fn(*args)`` computed in a forked child; ``result()`` waits for it (letting gevent's greenlets run). With
    ``later``, the child first runs ``warm`` and then waits for its last argument: ``send(value)``."""

    def __init__(self, fn: Callable[..., Any], *args: Any, warm: Callable[[], Any] | None = None, later=False):
        self.call = (fn, args)
        self.pid: int | None = None
        self.inbox: int | None = None  # the pipe the last argument goes down (later)
        if not (sys.platform.startswith("linux") and single_threaded()):
            return
        sys.stdout.flush()  # what this process has buffered is written once, by this process
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        inbox = os.pipe() if later else None
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            if inbox:
                os.close(inbox[1])
            _child(write_end, fn, args, warm, inbox[0] if inbox else None)
        os.close(write_end)
        if inbox:
            os.close(inbox[0])
            self.inbox = _widened(inbox[1])
        self.pid, self.fd = pid, read_end

    def send(self, value: Any) -> None:
        """The child's last argument. One that does not pickle, or a child already gone, ends the child: the call is
        then made here."""
        fn, args = self.call
        self.call = (fn, (*args, value))
        if self.inbox is None:
            return
        try:
            payload = pickle.dumps(value)
        except Exception:  # noqa: BLE001 - an inventory's data holding an object pickle refuses
            self.cancel()
            return
        try:
            _write_payload(self.inbox, payload)  # (past the pipe's size, this waits for the child to read)
        except OSError:  # the child is gone (killed, out of memory): the call is made here
            self.cancel()
            return
        os.close(self.inbox)
        self.inbox = None

    def cancel(self) -> None:
        """End the child unasked (the parent's own step failed): nothing it made is used."""
        if self.pid is None:
            return
        for fd in (self.fd, self.inbox):
            if fd is not None:
                os.close(fd)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.pid = self.inbox = None

    def result(self) -> Any:
        fn, args = self.call
        if self.pid is None:
            return fn(*args)
        try:
            payload = _read_payload(self.fd, _cooperative_wait())
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


def _child(fd: int, fn: Callable[..., Any], args: tuple, warm: Callable[[], Any] | None, inbox: int | None) -> NoReturn:
    """The child's whole life: warm, wait for its last argument, compute, write, exit (never returning into the
    parent's code). The parent closing the inbox unsent (its own step failed) ends it quietly."""
    code = 1
    try:
        _warm(warm)
        if inbox is not None:
            sent = _read_payload(inbox)
            if sent is None:
                os._exit(0)
            args = (*args, pickle.loads(sent))
        try:
            payload = pickle.dumps((True, fn(*args)))
        except Exception as exc:  # noqa: BLE001 - said by the parent, as the parent would have said it
            payload = _error_payload(exc)
        _write_payload(fd, payload)
        code = 0
    except BaseException:  # noqa: BLE001 - interrupted (Ctrl-C reaches both): the parent says it once
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _warm(warm: Callable[[], Any] | None) -> None:
    """Load what the call will need; a failure here is the call's to say (it meets it again), not the warm-up's."""
    if warm is None:
        return
    try:
        warm()
    except Exception:  # noqa: BLE001, S110 - raised again, with its context, by the call itself
        pass


def _widened(fd: int) -> int:
    """A pipe widened to take a fleet's hosts at once, where Linux lets it (1 MiB, the default cap for a user)."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass
    return fd


def _write_payload(fd: int, payload: bytes) -> None:
    os.write(fd, len(payload).to_bytes(HEADER, "big"))
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]


def _error_payload(exc: Exception) -> bytes:
    try:
        return pickle.dumps((False, exc))
    except Exception:  # noqa: BLE001 - an error that does not pickle is said by its type and text
        return pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))


def _cooperative_wait() -> Callable[[int], Any]:
    from gevent.socket import wait_read  # the parent's connection greenlets go on while it waits

    return wait_read


def _read_payload(fd: int, wait: Callable[[int], Any] | None = None) -> bytes | None:
    """A length-prefixed payload, or None where the writer ended before writing all of it; ``wait``: what waits
    for the pipe to be readable (the parent's gevent), else a plain blocking read (the child)."""
    header = _read_exactly(fd, HEADER, wait)
    if header is None:
        return None
    return _read_exactly(fd, int.from_bytes(header, "big"), wait)


def _read_exactly(fd: int, size: int, wait: Callable[[int], Any] | None) -> bytes | None:
    chunks, left = [], size
    while left:
        if wait:
            wait(fd)
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
