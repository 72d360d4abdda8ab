"""The fast path's check sent to every host before the deploy loads its roles (roles/converged_check.py): on its way
to each host when start() returns, once per run, only where the records would be read anyway, answered as the fact
answers, and a host whose early check failed read again the usual way. The SSH side is the loopback server of
tests/sshd.py."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api import Config, State
from pyinfra.context import ctx_state

from ironserve.fleet import read_fleet
from roles import converged, converged_check
from tests.sshd import connection_data, sshd  # noqa: F401 - the fixture
from tests.test_converged import _Inventory

ROOT = Path(__file__).resolve().parents[1]
ANSWER = '{"inputs": "D", "changed": [], "reads": 3}'


def _inventory(tmp_path: Path, sshd: dict) -> str:
    data = connection_data(tmp_path, sshd)
    path = tmp_path / "inventory.py"
    path.write_text(f"hosts = [('h1', {data!r}), ('h2', {data!r})]\n")
    return str(path)


@pytest.fixture
def checker(tmp_path, monkeypatch) -> Path:
    """A stand-in checker at the check's path: it answers as this release's checker does."""
    script = tmp_path / "ironserve-converged"
    script.write_text(f"#!/bin/sh\necho '{ANSWER}'\n")
    script.chmod(0o755)
    monkeypatch.setattr(converged_check, "SCRIPT", str(script))
    return script


def _connected(inventory: str) -> tuple[State, list]:
    fleet = read_fleet(inventory)
    state = State(fleet.pyinfra, Config())
    hosts = list(fleet.pyinfra)
    for h in hosts:
        h.connect(raise_exceptions=True, show_errors=False)
        state.activate_host(h)  # (as pyinfra's connect_all)
    return state, hosts


def test_the_check_is_on_its_way_to_every_host_when_start_returns(tmp_path, sshd, checker, caplog):
    state, hosts = _connected(_inventory(tmp_path, sshd))
    before = len(sshd["execs"])
    caplog.set_level(logging.DEBUG, logger="pyinfra")
    with ctx_state.use(state):
        converged_check.start()
        early = state.ironserve_converged_sent
        assert all(early.went[h].is_set() and not early.jobs[h].dead for h in hosts)  # written, not answered yet
        converged_check.start()  # the other hosts' deploys: nothing sent again
        got = converged_check.answers(state, hosts)
    sent = sshd["execs"][before:]  # (the in-process server has run since)
    assert len(sent) == 2 and all(str(checker) in line for line in sent)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Running command on ")]
    assert sorted(m.split(":")[0] for m in said) == ["Running command on h1", "Running command on h2"], said
    assert got == {h: {"inputs": "D", "changed": [], "reads": 3} for h in hosts}
    assert converged.why_not(got[hosts[0]], "D") is None and "inputs changed" in converged.why_not(got[hosts[0]], "E")


def test_a_host_without_the_checker_answers_it_has_no_record(tmp_path, sshd, monkeypatch):
    monkeypatch.setattr(converged_check, "SCRIPT", str(tmp_path / "none"))
    state, hosts = _connected(_inventory(tmp_path, sshd))
    with ctx_state.use(state):
        converged_check.start()
        got = converged_check.answers(state, hosts)
    assert converged.why_not(got[hosts[0]], "D") == "no checker installed"


class _Data(dict):
    def dict(self) -> dict:  # (pyinfra's host data)
        return dict(self)


class _Host:
    """A connected host as pyinfra's (hashable): its name, data and connector."""

    def __init__(self, name: str, data: dict, connector) -> None:
        self.name, self.data, self.connected, self.connector = name, _Data(data), True, connector


def _host(name: str, data: dict | None = None, client=True) -> _Host:
    connector = SimpleNamespace(client=SimpleNamespace(get_transport=lambda: None) if client else None)
    return _Host(name, dict(data or {}), connector)


@pytest.mark.parametrize(
    "hosts,active",
    [
        ([_host("a"), _host("b")], ["a"]),  # --limit: a host's plan reads its peers, the record is the whole run's
        ([_host("a"), _host("b", {"converged_fast_path": False})], None),
        ([_host("a"), _host("b", {"converged_fast_path": "no"})], None),  # typed: off
        ([_host("a"), _host("b", {"converged_fast_path": "maybe"})], None),  # does not validate: the deploy says so
        ([_host("a"), _host("b", client=False)], None),  # not pyinfra's SSH connector
    ],
)
def test_nothing_is_sent_early_where_the_records_are_not_read_or_not_over_ssh(monkeypatch, hosts, active):
    state = SimpleNamespace(inventory=_Inventory(hosts, hosts if active is None else hosts[:1]))
    monkeypatch.setattr(converged_check, "_state", lambda: state)
    monkeypatch.setattr(converged_check, "Sent", lambda *a: pytest.fail("sent"))
    converged_check.start()
    assert state.ironserve_converged_sent is None and converged_check.answers(state, hosts) == {}


def test_the_fast_path_is_on_early_as_the_typed_host_data_has_it():
    on = [converged_check.fast_path_on(_host("a", d)) for d in ({}, {"converged_fast_path": True})]
    on.append(converged_check.fast_path_on(_host("a", {"converged_fast_path": "true"})))  # --data's text, typed
    off = [converged_check.fast_path_on(_host("a", {"converged_fast_path": v})) for v in (False, 0, "no", "maybe")]
    assert on == [True] * 3 and off == [False] * 4


def test_a_failed_early_check_leaves_that_host_to_the_usual_read(monkeypatch):
    def refused():
        raise OSError("connection reset")

    good = {"inputs": "D", "changed": []}
    broken = _Host("b", {}, SimpleNamespace(client=SimpleNamespace(get_transport=refused)))
    monkeypatch.setattr(converged_check, "pop_global_arguments", lambda state, h, kwargs: ({}, []))
    state = SimpleNamespace()
    state.ironserve_converged_sent = converged_check.Sent(state, [broken])
    assert converged_check.answers(state, [broken]) == {} and state.ironserve_converged_sent.went[broken].is_set()
    read, other = [], _host("a")
    monkeypatch.setattr(converged_check, "answers", lambda state, hosts: {other: good})
    monkeypatch.setattr(converged, "read_all", lambda state, hosts, fact, kwargs: read.extend(hosts) or {broken: good})
    assert converged._decide(state, [other, broken], "D") is True and read == [broken]


def test_the_deploys_send_the_check_before_loading_the_roles():
    code = "import sys, roles.entry; print(sorted(m for m in sys.modules if m.startswith(('roles.', 'ironserve.'))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "['roles.converged_check', 'roles.entry']", out.stderr  # (the host data's model
    # loads when the first check is sent)
    for deploy in (ROOT / "deploys").glob("*.py"):
        text = deploy.read_text()
        if "deploy_model(" in text:
            assert "from roles.entry import deploy_model" in text, deploy
