"""At exit the heap is frozen (gc.freeze), so the interpreter's last collections skip it: registered once, by the
console script and by every deploy, and only run at exit (a process still collects its garbage until then)."""

from __future__ import annotations

import atexit
import gc
import subprocess
import sys
import textwrap

import pytest

from ironserve import cli, console, heap
from roles import converged, deployment

# a garbage cycle with a finaliser, left for the exit: the interpreter's last collection finds it unless frozen
SCRIPT = textwrap.dedent(
    """
    import gc, os, sys
    from ironserve.heap import freeze_at_exit

    class Noisy:
        def __del__(self):
            os.write(1, b"collected at exit\\n")

    gc.disable()  # (no collection before the exit's)
    cycle = Noisy()
    cycle.me = cycle
    del cycle
    if sys.argv[1:] == ["freeze"]:
        freeze_at_exit()
        freeze_at_exit()
    print("done", flush=True)
    """
)


def _exit_collects(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_exit_skips_collecting_what_the_process_leaves():
    assert _exit_collects() == "done\ncollected at exit\n"  # without: the exit's collection finds the cycle
    assert _exit_collects("freeze") == "done\n"


def test_a_garbage_cycle_made_before_the_exit_is_still_collected():
    collected = []

    class Cycle:
        def __del__(self):
            collected.append(True)

    heap.freeze_at_exit()
    item = Cycle()
    item.me = item
    del item
    gc.collect()
    assert collected == [True]


@pytest.fixture
def registered(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "_registered", {"freeze": False})
    monkeypatch.setattr(atexit, "register", lambda fn, *a, **k: calls.append(fn))
    return calls


def test_the_console_script_and_every_deploy_freeze_at_exit_once(monkeypatch, registered):
    monkeypatch.setattr(cli, "main", lambda: 0)
    assert console.run() == 0 and console.run() == 0
    assert registered == [gc.freeze]
    monkeypatch.setattr(heap, "_registered", {"freeze": False})
    monkeypatch.setattr(converged, "decided", lambda: True)  # (a host planned after the first: returns at once)
    assert deployment.deploy_model("tiny") is None and deployment.deploy_model("tiny") is None
    assert registered == [gc.freeze, gc.freeze]
