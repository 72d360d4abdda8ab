"""The audit's plan made in a forked child (ironserve/audit/forked.py): its value, its errors and its death come back
to the parent as they would have in one process, the child never runs on into the parent's code, and a process with
another native thread is not forked. Each case runs in a fresh interpreter, whose threads this test controls."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from ironserve.audit.forked import Forked
    from ironserve.problems import Problem, SpecError

    class Unpicklable(Exception):
        def __reduce__(self):
            raise TypeError("no")

    def pid_and_payload(size):
        return os.getpid(), "x" * size

    def bad_recipe():
        raise SpecError([Problem("recipes/r.yaml", "engine.tp", "tp 3 does not divide 8 GPUs", "write tp: 8")])

    def dies():
        os._exit(3)

    def raises_unpicklable():
        raise Unpicklable("held a socket")

    WARMED = []

    def warm():
        WARMED.append(os.getpid())
        raise OSError("a warm-up that fails is the call's to say")

    def pid_warmed_and_sum(a, b):
        return os.getpid(), WARMED == [os.getpid()], a + b

    print("before", end="")  # buffered when the child is forked: written once, by the parent
    mode = sys.argv[1]
    if mode == "thread":
        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
    out = {}
    pid, payload = Forked(pid_and_payload, 3 << 20).result()
    out["child"], out["size"] = pid != os.getpid(), len(payload)
    cases = [("spec", bad_recipe)]  # (in this process the others would end it or raise as they are)
    for name, fn in cases + ([("dies", dies), ("unpicklable", raises_unpicklable)] if mode == "alone" else []):
        try:
            Forked(fn).result()
        except SpecError as exc:
            out[name] = ["SpecError", [p.line() for p in exc.problems]]
        except RuntimeError as exc:
            out[name] = ["RuntimeError", str(exc)]
    later = Forked(pid_warmed_and_sum, 1, warm=warm, later=True)
    later.send(2)  # the last argument, after the fork
    pid, out["warmed"], out["sum"] = later.result()
    out["later_child"] = pid != os.getpid()
    unpicklable = Forked(pid_warmed_and_sum, "a", later=True)
    unpicklable.send(threading.Lock())  # refused by pickle: the child is ended and the call made here
    try:
        unpicklable.result()
    except TypeError as exc:
        out["made_here"] = "lock" in str(exc)
    def warm_interrupted():
        raise KeyboardInterrupt  # the child ends before it reads its last argument

    gone = Forked(pid_warmed_and_sum, 1, warm=warm_interrupted, later=True)
    time.sleep(0.3)
    gone.send(2)  # a pipe with no reader: the call is made here
    out["gone_made_here"] = gone.result()[0] == os.getpid() and gone.pid is None
    cancelled = Forked(pid_warmed_and_sum, 1, later=True)
    child = cancelled.pid
    cancelled.cancel()  # the parent's own step failed: the child is ended and reaped
    out["reaped"] = child is None or not os.path.exists(f"/proc/{child}")
    print("\\n" + json.dumps(out))
    """
)


def _run(mode: str) -> tuple[str, dict]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, *rest = done.stdout.splitlines()
    assert len(rest) == 1, done.stdout  # one report: no child went on into the parent's code
    return first, json.loads(rest[0])


def test_the_plan_comes_back_from_the_child_with_its_errors():
    first, out = _run("alone")
    assert first == "before"
    assert out["child"] and out["size"] == 3 << 20  # more than a pipe holds: read whole, by its length
    assert out["spec"] == ["SpecError", ["recipes/r.yaml: engine.tp: tp 3 does not divide 8 GPUs. Fix: write tp: 8"]]
    assert out["dies"][0] == "RuntimeError" and "without an answer" in out["dies"][1] and "768" in out["dies"][1]
    assert out["unpicklable"] == ["RuntimeError", "Unpicklable: held a socket"]
    # forked before its last argument: warmed in the child (a failing warm-up ignored), then computed there
    assert out["later_child"] and out["warmed"] and out["sum"] == 3
    assert out["made_here"] and out["reaped"] and out["gone_made_here"]


def test_a_process_with_another_thread_plans_in_itself():
    first, out = _run("thread")
    assert first == "before" and not out["child"] and out["size"] == 3 << 20
    assert not out["later_child"] and not out["warmed"] and out["sum"] == 3  # (no warm-up needed in-process)
    assert out["spec"][0] == "SpecError"
