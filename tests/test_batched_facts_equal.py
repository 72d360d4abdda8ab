"""Batched facts equal single facts for ironserve's own facts (roles/*), not only pyinfra's: every batchable
FactBase subclass of the roles, with each of its fixtures (tests/facts/<module>.<Fact>/*.yaml: arguments, the
command's output, the parsed fact), read through a real batch (roles/host_state.py's HostState command, run by
sh, its output split) answers what pyinfra's own get_fact makes of the same output: ``process(lines)``, or
``default()`` when the command printed nothing (pyinfra never calls process() on no output, and 17 of these facts
have a ``process([])`` that differs from their ``default()``). The facts' real commands, run on this machine
alone and in one batch, agree too."""

from __future__ import annotations

import inspect
import shlex
import subprocess
from importlib import import_module
from pathlib import Path

import pytest
import yaml
from pyinfra.api import FactBase
from pyinfra.api.facts import _MISSING_COMMAND_MARKER

from roles.host_state import HostState, Request, batchable

FIXTURES = Path(__file__).parent / "facts"
NONCE = "ironserve-batch-fedcba9876543210"
ROLE_MODULES = sorted(
    p.stem for p in (Path(__file__).resolve().parents[1] / "roles").glob("*.py") if p.stem != "__init__"
)


def role_facts() -> list[type[FactBase]]:
    found = []
    for name in ROLE_MODULES:
        module = import_module(f"roles.{name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, FactBase) and batchable(cls):
                found.append(cls)
    return found


def fixtures_of(cls) -> list[dict]:
    folder = FIXTURES / f"{cls.__module__.removeprefix('roles.')}.{cls.__name__}"
    return [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))]


def single(cls, lines: list[str]):
    """What pyinfra's get_fact makes of a successful command's stdout lines."""
    return cls().process(lines) if lines else cls().default()


def batched(requests: list[Request], scripts: list[str]) -> list:
    """Each request's value from one HostState read of ``scripts`` (one per request), run by sh."""
    command = HostState().command(reads=scripts, nonce=NONCE)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120).stdout.splitlines()
    answers = HostState().process(out)
    assert len(answers) == len(requests)
    return [req.value(answer) for req, answer in zip(requests, answers)]


def printing(lines: list[str]) -> str:
    return "printf '%s\\n' " + " ".join(shlex.quote(str(line)) for line in lines) if lines else "true"


def test_every_fact_of_the_roles_is_seen_and_has_fixtures():
    facts = role_facts()
    assert len(facts) >= 30, [f.__name__ for f in facts]
    assert [f"{f.__module__}.{f.__name__}" for f in facts if not fixtures_of(f)] == []


CASES = [(cls, case) for cls in role_facts() for case in fixtures_of(cls)]


@pytest.mark.parametrize("cls, case", CASES, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(CASES)])
def test_a_batched_fact_equals_the_single_fact_on_the_fixtures_output(cls, case):
    args = case.get("arg") or case.get("arguments") or {}
    output = case.get("output") or []
    lines = output.splitlines() if isinstance(output, str) else [str(line) for line in output]
    requests = [Request(cls, args), Request(cls, args)]
    # the fixture's output, and the same fact printing nothing, side by side in one batch
    got, empty = batched(requests, [printing(lines), "true"])
    assert got == single(cls, lines)
    if lines and "fact" in case:
        assert got == case["fact"]
    assert empty == cls().default()


def test_some_facts_differ_on_no_output_so_the_empty_case_matters():
    differ = [cls for cls in role_facts() if _process_empty(cls) != cls().default()]
    assert len(differ) >= 10, [c.__name__ for c in differ]


def _process_empty(cls):
    try:
        return cls().process([])
    except Exception as exc:  # noqa: BLE001 - a process([]) that raises differs from any default() too
        return exc


def test_the_facts_real_commands_agree_alone_and_batched():
    """Run on this machine (no GPUs, no ironserve files: mostly the empty and absent cases), every fact's own
    command once alone and once in a single batch of all of them: the same values wherever both read."""
    requests = [Request(cls, case.get("arg") or {}) for cls, case in CASES]
    scripts = [req.shell() for req in requests]
    before = _alone(scripts)
    command = HostState().command(reads=scripts, nonce=NONCE)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=300).stdout.splitlines()
    answers = HostState().process(out)
    # this machine may change between two reads of it (a lab beside this suite brings its bridge up or down): a
    # batched value must equal the value read alone just before the batch or just after it
    after = _alone(scripts)
    compared = 0
    for req, answer, reads in zip(requests, answers, zip(before, after)):
        assert answer is not None, req.key
        values = [single(req.cls, lines) for rc, lines in reads if rc == answer["rc"]]
        assert values, (req.key, answer["rc"], [rc for rc, _ in reads])
        if answer["rc"] == 0 and all(lines != [_MISSING_COMMAND_MARKER] for _, lines in reads):
            assert req.value(answer) in values, req.key  # (pyinfra: MissingCommandError, no value)
            compared += 1
    assert compared >= len(requests) // 2


def _alone(scripts: list[str]) -> list[tuple[int, list[str]]]:
    """Each fact's own command run alone: its exit status and its lines."""
    alone = []
    for script in scripts:
        proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
        alone.append((proc.returncode, proc.stdout.splitlines()))
    return alone
