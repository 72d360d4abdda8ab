"""Rollback's promises, executed (roles/rollback.py): "a gate that did not run vouches for nothing" (a rank > 0
saves its files only when rank 0's gate positively passed in this run) and "rank 0 first" (every member restored,
then restarted in rank order, and only then the gate waited for again), with the order of the commands asserted
across the hosts of a 3-rank group."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from ironserve.units import deliberate
from roles import rollback

SNAPSHOT = [
    "current aaa  /etc/systemd/system/u.service",
    "snapshot bbb  /etc/systemd/system/u.service",
    "taken 2026-11-22T08:41:46Z",
]


class _Host:
    """A host of the group: answers the LastGood read with a differing snapshot, records every command (and what
    it logs) into one list shared by the whole group, so the order across hosts is what is checked."""

    def __init__(self, name: str, journal: list, ok=lambda command: True, rollback_enabled=True, sudo=False):
        self.name, self.journal, self.ok = name, journal, ok
        self.data = ({} if rollback_enabled else {"rollback": False}) | ({"_sudo": True} if sudo else {})
        self.logs: list[str] = []
        self.sudo_of: list[bool] = []

    def run_shell_command(self, command, _sudo=None, **kwargs):
        self.journal.append((self.name, command))
        self.sudo_of.append(_sudo)
        lines = SNAPSHOT if command.startswith("sha256sum") else []
        return self.ok(command), SimpleNamespace(stdout_lines=lines, stdout="\n".join(lines), stderr_lines=["refused"])

    def log_styled(self, message, **kwargs):
        self.logs.append(message)

    log = log_styled


def _group(journal, names=("r0", "r1", "r2"), **kwargs):
    hosts = {n: _Host(n, journal, **kwargs) for n in names}
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=hosts.get), activated_hosts=set(hosts.values()))
    members = [(n, f"u-{n}", [f"/etc/systemd/system/u-{n}.service"]) for n in names]
    return hosts, state, members


def _steps(journal):
    """The group's journal as (host, step) in order, the reads left out."""
    steps = []
    for name, command in journal:
        if command.startswith("sha256sum"):
            continue
        if command == deliberate("restart", f"u-{name}"):
            steps.append((name, "restart"))
        elif command == rollback.key_check_command(f"u-{name}"):
            steps.append((name, "key check"))
        elif command == rollback.restore_command(f"u-{name}"):
            steps.append((name, "restore"))
        elif command == "WAIT":
            steps.append(("gate", "wait"))
        else:
            steps.append((name, command))
    return steps


def test_rollback_restores_all_then_restarts_rank0_first_then_waits_for_the_gate():
    journal = []
    hosts, state, members = _group(journal)
    rollback.roll_back(
        state,
        hosts["r0"],
        "u-r0",
        "http://127.0.0.1:30000/health",
        60,
        members,
        "the unit died",
        lambda *a: journal.append(("gate", "WAIT")) or True,
    )
    assert _steps(journal) == [
        ("r0", "key check"),
        ("r1", "key check"),
        ("r2", "key check"),
        ("r0", "restore"),
        ("r1", "restore"),
        ("r2", "restore"),
        ("r0", "restart"),
        ("r1", "restart"),
        ("r2", "restart"),
        ("gate", "wait"),
    ]
    assert hosts["r0"].logs[-1].startswith("ROLLED BACK u-r0 on r0, r1, r2")


def test_a_failed_restart_of_a_rank_is_said_and_the_gate_is_not_waited_for():
    journal = []
    hosts, state, members = _group(journal)
    hosts["r1"].ok = lambda command: command != deliberate("restart", "u-r1")
    rollback.roll_back(
        state, hosts["r0"], "u-r0", "url", 60, members, "why", lambda *a: journal.append(("gate", "WAIT")) or True
    )
    assert ("gate", "wait") not in _steps(journal)
    assert hosts["r0"].logs[-1].startswith("ROLLBACK FAILED u-r0") and "the restart" in hosts["r0"].logs[-1]
    assert "r1 (u-r1)" in hosts["r0"].logs[-1] and "r2 (u-r2)" not in hosts["r0"].logs[-1]


def test_a_gate_that_stays_unhealthy_after_the_rollback_is_said():
    journal = []
    hosts, state, members = _group(journal)
    rollback.roll_back(state, hosts["r0"], "u-r0", "url", 60, members, "why", lambda *a: False)
    assert "restored but not healthy either" in hosts["r0"].logs[-1]


def test_rollback_false_in_host_data_changes_nothing():
    journal = []
    hosts, state, members = _group(journal, rollback_enabled=False)
    rollback.roll_back(state, hosts["r0"], "u-r0", "url", 60, members, "why", lambda *a: True)
    assert journal == []


@pytest.mark.parametrize(
    "results",
    [
        None,  # no gate ran at all in this run
        {},  # rank 0's host dropped out before its gate
        {("r0", "u-r0"): False},  # the gate ran and failed
        {("r0", "u-r0"): "passed"},  # something truthy that is not a pass
        {("r9", "u-r0"): True},  # another host's gate of the same unit passed
        {("r0", "u-other"): True},  # another unit's gate on rank 0's host passed
    ],
)
def test_a_gate_that_did_not_pass_in_this_run_vouches_for_nothing(results):
    journal = []
    rank1 = _Host("r1", journal)
    assert rollback._save_if_gate_passed(None, rank1, "u-r1", ["/p"], ["r0", "u-r0"], results) is True
    assert journal == []  # nothing saved: the previous last good stays the last good
    assert "did not pass in this run" in rank1.logs[-1]


def test_a_gate_that_passed_saves_the_ranks_files_and_a_failed_save_fails():
    journal = []
    rank1 = _Host("r1", journal)
    assert rollback._save_if_gate_passed(None, rank1, "u-r1", ["/p"], ["r0", "u-r0"], {("r0", "u-r0"): True})
    assert journal == [("r1", rollback.save_command("u-r1", ["/p"]))]
    rank1.ok = lambda command: False
    assert rollback._save_if_gate_passed(None, rank1, "u-r1", ["/p"], ["r0", "u-r0"], {("r0", "u-r0"): True}) is False


def test_the_save_command_snapshots_the_files_with_their_digests(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    (live / "u.service").write_text("unit\n")
    snap = tmp_path / "last-good" / "u"
    command = rollback.save_command("u", [str(live / "u.service"), str(live / "absent.marker")])
    command = command.replace(rollback.snapshot_dir("u"), str(snap))
    assert subprocess.run(["bash", "-c", command]).returncode == 0
    manifest = (snap / "MANIFEST").read_text().split()
    assert manifest[1] == str(live / "u.service") and len(manifest) == 2  # the absent file is not part of it
    assert (snap / "u.service").read_text() == "unit\n" and (snap / "TAKEN").read_text().startswith("20")
    state = rollback.LastGood().process(
        [f"current {manifest[0]}  {live / 'u.service'}", f"snapshot {manifest[0]}  {live / 'u.service'}"]
    )
    assert not rollback.differs(state)
    assert rollback.differs({**state, "current": {str(live / "u.service"): "0" * 64}})


@pytest.mark.parametrize("sudo", [False, True])
def test_every_rollback_command_runs_with_the_members_sudo_and_reads_its_own_unit(sudo):
    journal, waited = [], []
    hosts, state, members = _group(journal, sudo=sudo)
    rollback.roll_back(
        state,
        hosts["r0"],
        "u-r0",
        "http://127.0.0.1:30000/health",
        60,
        members,
        "why",
        lambda *a: waited.append(a) or True,
    )
    for name, h in hosts.items():
        assert h.sudo_of == [sudo] * 4, name  # the read, the key check, the restore, the restart
        read = next(c for n, c in journal if n == name and c.startswith("sha256sum"))
        assert read == rollback.LastGood().command(f"u-{name}", [f"/etc/systemd/system/u-{name}.service"])
    assert waited == [(state, hosts["r0"], "u-r0", "http://127.0.0.1:30000/health", 60)]
    assert "(healthy after 0s)" in hosts["r0"].logs[-1]
    rank1 = _Host("r1", journal, sudo=sudo)
    rollback._save_if_gate_passed(None, rank1, "u-r1", ["/p"], ["r0", "u-r0"], {("r0", "u-r0"): True})
    assert rank1.sudo_of == [sudo]


def test_a_run_without_an_activated_hosts_record_rolls_back_all_members():
    journal = []
    hosts, state, members = _group(journal)
    del state.activated_hosts
    rollback.roll_back(state, hosts["r0"], "u-r0", "url", 60, members, "why", lambda *a: True)
    assert hosts["r0"].logs[-1].startswith("ROLLED BACK u-r0 on r0, r1, r2")


def test_differs_only_with_a_last_good_configuration_that_is_not_the_current_one():
    state = {"current": {"/p": "a"}, "snapshot": {"/p": "b"}, "taken": None}
    assert rollback.differs(state)
    assert not rollback.differs({**state, "snapshot": {"/p": "a"}})
    assert not rollback.differs({**state, "snapshot": None}) and not rollback.differs(None)
