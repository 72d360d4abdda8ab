"""The rank guard's loops, in this process: the leader (forming, serving, counting failures, restarting with
backoff), the follower (reporting, following, restarting to join), restart_engine's systemctl calls, the signed
report over real loopback HTTP to an in-process leader's server, and that server's answers to members and
strangers. What the guard asks of its host stands in: a clock whose sleeps return at once (and end a test at a
restart's final wait or after a number of polls), systemctl (calls recorded, InvocationID answered), the engine's
/health (a scripted status per probe). tests/test_rank_guard.py runs the same guard as real processes."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from .test_rank_guard import RANK0, RANK1, RANK2, SECRET, STRANGER, free_port, guard_module, report_body, signed


class Restarted(Exception):
    """restart_engine reached its final wait: systemd would stop the guard here."""


class Stopped(Exception):
    """The test's number of polls ran out."""


class Host:
    """The guard's host, in-process: clock, systemctl, the engine's /health, the journal."""

    def __init__(self, guard, monkeypatch, health=(), polls=50, invocations=("inv-a",)):
        self.guard, self.now, self.wall, self.polls = guard, 1000.0, 1.7e9, polls
        self.health, self.invocations = list(health), list(invocations)
        self.calls: list[list[str]] = []
        self.inputs: list[str] = []
        self.sleeps: list[float] = []
        self.lines: list[str] = []
        self.on_poll = lambda: None
        monkeypatch.setattr(
            guard, "time", SimpleNamespace(monotonic=lambda: self.now, time=lambda: self.wall, sleep=self.sleep)
        )
        monkeypatch.setattr(
            guard, "subprocess", SimpleNamespace(run=self.run, SubprocessError=subprocess.SubprocessError)
        )
        monkeypatch.setattr(guard, "http_status", self.probe)
        monkeypatch.setattr(guard, "log", self.lines.append)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds >= 3600:
            raise Restarted()
        self.now += seconds
        self.wall += seconds
        self.polls -= 1
        if self.polls < 0:
            raise Stopped()
        self.on_poll()

    def run(self, argv, **kwargs):
        """systemctl as the guard runs it (InvocationID of its own unit: the next of ``invocations``, the last one
        kept; "" is systemd not answering) and the metrics writer, fed its lines as text, bounded."""
        self.calls.append(list(argv))
        if kwargs.get("input") is not None:
            assert kwargs == {"input": kwargs["input"], "text": True, "capture_output": True, "timeout": 10}
            self.inputs.append(kwargs["input"])
        if "InvocationID" not in argv:
            return SimpleNamespace(stdout="", returncode=0)
        assert argv == ["systemctl", "show", "-p", "InvocationID", "--value", "u.service"], argv
        assert kwargs == {"capture_output": True, "text": True, "timeout": 30}, kwargs
        out = self.invocations.pop(0) if len(self.invocations) > 1 else self.invocations[0]
        return SimpleNamespace(stdout=out + "\n", returncode=0)

    def probe(self, url: str, timeout: float = 5.0):
        assert url == "http://127.0.0.1:1/health", url
        value = self.health.pop(0) if len(self.health) > 1 else self.health[0]
        if isinstance(value, Exception):
            raise value
        return value

    def systemctl(self) -> list[list[str]]:
        """systemctl calls other than InvocationID reads."""
        return [c for c in self.calls if c[0] == "systemctl" and "InvocationID" not in c]


RESTART = [
    ["systemctl", "kill", "--signal=SIGKILL", "u.service"],
    ["systemctl", "reset-failed", "u.service"],
    ["systemctl", "--no-block", "restart", "u.service"],
]


def config(tmp_path: Path, rank: int = 0, **more) -> dict:
    secret = tmp_path / "group.key"
    secret.write_text(SECRET + "\n")
    base = {
        "unit": "u",
        "rank": rank,
        "world": 2,
        "guard_port": 1,
        "leader": RANK0,
        "members": [RANK0, RANK1],
        "secret_file": str(secret),
        "health_url": "http://127.0.0.1:1/health",
        "poll_s": 1,
        "failure_threshold": 3,
        "formation_timeout_s": 10,
        "backoff_base_s": 15,
        "backoff_max_s": 600,
        "backoff_window_s": 1800,
        "state_dir": str(tmp_path / "state"),
    }
    return base | ({"bind": RANK0} if rank == 0 else {"source": RANK1}) | more


@pytest.fixture
def leader_host(monkeypatch):
    """(guard, Host, servers): the leader's server stands in (its reports are handed to the test)."""
    guard = guard_module()
    servers = []

    class Server:
        def __init__(self, address, reports, state):
            self.address, self.reports, self.state = address, reports, state
            servers.append(self)

        def serve_forever(self):
            self.served_by_daemon = threading.current_thread().daemon

    monkeypatch.setattr(guard, "GuardServer", Server)
    return guard, servers


def run_guard(loop, cfg) -> str:
    """Runs the guard's loop (leader or follower) until it restarts its engine ("restarted") or the polls run out
    ("stopped")."""
    try:
        loop(cfg)
    except Restarted:
        return "restarted"
    except Stopped:
        return "stopped"
    raise AssertionError(f"{loop.__name__} returned")


def test_a_leader_forms_serves_and_leaves_a_healthy_group_alone(tmp_path, leader_host, monkeypatch):
    guard, servers = leader_host
    # systemd once not answering (""): the invocation known is kept; rank 0 restarted before the group formed
    host = Host(guard, monkeypatch, health=[None, None, 503, 200], polls=12, invocations=["inv-a", "", "inv-b"])
    host.on_poll = lambda: servers[0].reports.latest.update({1: (host.now, True)})
    assert run_guard(guard.leader, config(tmp_path, rendezvous=f"{RANK0}:29500")) == "stopped"
    (server,) = servers
    assert server.address == (RANK0, 1) and server.reports.allowed == {1: {RANK1}} and server.reports.world == 2
    assert server.reports.secret == SECRET.encode() and server.served_by_daemon is True
    assert server.state == {"formed_in": "inv-b", "invocation": "inv-b", "rendezvous": f"{RANK0}:29500"}
    assert host.lines[:3] == [
        f"rank 0 guard of u: taking the group's signed reports on {RANK0}:1, engine invocation inv-a; waiting for "
        "the group to form (up to 10s)",
        "group formed after 3s: all 2 ranks joined (rank 0's server is up)",
        "group serving after 4s",
    ]
    assert len(host.lines) == 3 and not host.systemctl() and set(host.sleeps) == {1}


def test_a_group_that_never_forms_is_restarted_after_the_formation_timeout(tmp_path, leader_host, monkeypatch):
    guard, servers = leader_host
    # the guard's own probe fault while forming: said, and no sign of a formed group
    fault = guard.GuardFault("cannot open a socket (Too many open files)")
    host = Host(guard, monkeypatch, health=[fault, None])
    monkeypatch.setattr(guard, "STATE_DIR", str(tmp_path / "run"))  # the config names none, as on hosts
    cfg = config(tmp_path)
    del cfg["state_dir"]
    assert run_guard(guard.leader, cfg) == "restarted"
    assert host.now == 1011.0  # the first poll past the timeout
    assert host.lines[1] == "rank 0's health probe did not run: cannot open a socket (Too many open files)"
    assert host.lines[-1] == "restarting the group (1 within 1800s): the group did not form within 10s"
    assert host.systemctl() == RESTART and servers[0].state["formed_in"] is None
    # the restart is counted where the next guard reads it, and published through the metrics writer
    assert json.loads((tmp_path / "run" / "u.json").read_text()) == {"restarts": [1.7e9 + 11]}
    writer = str(Path(guard.__file__).with_name("ironserve-textfile"))
    assert [sys.executable, writer, "ironserve_rank_guard_u"] in host.calls
    assert host.inputs == [
        'ironserve_rank_guard_group_restarts{unit="u"} 1\n'
        f'ironserve_rank_guard_last_restart_timestamp_seconds{{unit="u"}} {1.7e9 + 11:.0f}\n'
    ]


def test_a_group_restarted_again_within_the_window_waits_its_backoff_first(tmp_path, leader_host, monkeypatch):
    guard, _ = leader_host
    host = Host(guard, monkeypatch, health=[None])
    state = tmp_path / "state"
    state.mkdir()
    (state / "u.json").write_text(json.dumps({"restarts": [1.7e9 - 100, 1.7e9 - 50, 1.7e9 - 5000]}))
    assert run_guard(guard.leader, config(tmp_path)) == "restarted"
    assert host.sleeps[-2:] == [30.0, 3600]  # two restarts within the window: 15 * 2
    assert host.lines[-2:] == [
        "group restart: waiting 30s first (backoff: restarts within the last 1800s)",
        "restarting the group (3 within 1800s): the group did not form within 10s",
    ]


def test_a_group_that_formed_but_never_serves_is_restarted_after_the_timeout(tmp_path, leader_host, monkeypatch):
    guard, servers = leader_host
    host = Host(guard, monkeypatch, health=[503])
    host.on_poll = lambda: servers[0].reports.latest.update({1: (host.now, True)})
    assert run_guard(guard.leader, config(tmp_path)) == "restarted"
    assert host.lines[1] == "group formed after 1s: all 2 ranks joined (rank 0's server is up)"
    assert host.lines[-1] == "restarting the group (1 within 1800s): the group formed but did not serve within 10s"
    assert host.systemctl() == RESTART


def test_a_follower_failing_after_forming_restarts_the_group_before_rank0_served(tmp_path, leader_host, monkeypatch):
    guard, servers = leader_host
    host = Host(guard, monkeypatch, health=[None, 503])
    host.on_poll = lambda: servers[0].reports.latest.update({1: (host.now, False)})
    assert run_guard(guard.leader, config(tmp_path)) == "restarted"
    assert host.lines[-4:] == [
        "rank 1 not answering /health: 1 of 3",
        "rank 1 not answering /health: 2 of 3",
        "rank 1 not answering /health: 3 of 3",
        "restarting the group (1 within 1800s): rank 1 not answering /health for 3 polls in a row; a rank cannot "
        "rejoin its group alone (the group formed, rank 0 had not served yet)",
    ]
    assert host.now == 1004.0 and host.systemctl() == RESTART


def test_a_follower_falling_silent_after_forming_restarts_the_group_before_rank0_served(
    tmp_path, leader_host, monkeypatch
):
    guard, servers = leader_host
    host = Host(guard, monkeypatch, health=[503])
    host.on_poll = lambda: host.now <= 1002 and servers[0].reports.latest.update({1: (host.now, True)})
    assert run_guard(guard.leader, config(tmp_path)) == "restarted"
    # silent once longer than (threshold + 1) polls: 4 s here
    assert host.lines[-4:] == [
        "rank 1 silent for 5s: 1 of 3",
        "rank 1 silent for 6s: 2 of 3",
        "rank 1 silent for 7s: 3 of 3",
        "restarting the group (1 within 1800s): rank 1 silent for 7s for 3 polls in a row; a rank cannot rejoin "
        "its group alone (the group formed, rank 0 had not served yet)",
    ]


def test_failures_are_counted_for_every_rank_past_one_the_guard_could_not_judge():
    guard = guard_module()
    guard.log = lambda line: None
    failures: dict[int, int] = {}
    for _ in range(2):
        assert guard.count_failures(failures, {0: None, 1: "not answering /health"}, 3) is None
    assert guard.count_failures(failures, {0: None, 1: "not answering /health"}, 3) == (
        "rank 1 not answering /health for 3 polls in a row; a rank cannot rejoin its group alone"
    )
    assert guard.count_failures(failures, {0: "healthy", 1: "healthy"}, 3) is None and failures == {0: 0, 1: 0}


def test_a_serving_group_restarts_when_rank0_fails_three_polls_in_a_row(tmp_path, leader_host, monkeypatch):
    guard, servers = leader_host
    # serving, one bad poll (forgiven by the next good one), then bad for good; the guard's own probe fault is no
    # verdict either way
    fault = guard.GuardFault("cannot probe (Too many open files)")
    host = Host(guard, monkeypatch, health=[200, 200, 503, 200, 503, fault, 503, 503])
    host.on_poll = lambda: servers[0].reports.latest.update({1: (host.now, True)})
    assert run_guard(guard.leader, config(tmp_path)) == "restarted"
    assert host.lines[3:] == [
        "rank 0 not answering /health: 1 of 3",
        "rank 0 not answering /health: 1 of 3",
        "rank 0's health probe did not run: cannot probe (Too many open files); not counted against rank 0",
        "rank 0 not answering /health: 2 of 3",
        "rank 0 not answering /health: 3 of 3",
        "restarting the group (1 within 1800s): rank 0 not answering /health for 3 polls in a row; a rank cannot "
        "rejoin its group alone",
    ]


def test_a_serving_group_restarts_when_a_follower_falls_silent(tmp_path, leader_host, monkeypatch):
    guard, servers = leader_host
    host = Host(guard, monkeypatch, health=[200], invocations=["inv-a", "inv-a", "", "inv-b"])
    reported = []

    def follower_reports():
        if len(reported) < 3:
            reported.append(host.now)
            servers[0].reports.latest[1] = (host.now, True)

    host.on_poll = follower_reports
    assert run_guard(guard.leader, config(tmp_path)) == "restarted"
    # silent for longer than (threshold + 1) polls, then counted: one, two, three
    assert host.lines[-1] == (
        "restarting the group (1 within 1800s): rank 1 silent for 7s for 3 polls in a row; a rank cannot rejoin "
        "its group alone"
    )
    assert host.lines[-4] == "rank 1 silent for 5s: 1 of 3"
    # an invocation systemd could not tell ("") keeps the last one known
    assert servers[0].state["invocation"] == "inv-b"


# --------------------------------------------------------------------------- the follower


@pytest.fixture
def follower_host(tmp_path, monkeypatch):
    """(guard, Host, answers, bodies): the leader's replies scripted, the follower's reports recorded."""
    guard = guard_module()
    answers: list = []
    bodies: list[dict] = []

    def report(cfg, secret, body, timeout=5.0):
        assert secret == SECRET.encode() and cfg["leader"] == RANK0
        bodies.append(body)
        return answers.pop(0) if answers else None

    monkeypatch.setattr(guard, "report", report)
    return guard, answers, bodies


def accepted(invocation: str, formed=False, challenge="c-next", **more) -> dict:
    return {"accepted": True, "challenge": challenge, "invocation": invocation, "formed": formed, **more}


def test_a_follower_follows_rank0_and_restarts_to_join_its_new_group(tmp_path, follower_host, monkeypatch):
    guard, answers, bodies = follower_host
    host = Host(guard, monkeypatch, health=[200, 503, 200], polls=3, invocations=["e-1"])
    answers += [
        {"accepted": False, "challenge": "c-1"},  # the first report only gets a challenge
        accepted("inv-a", challenge="c-2"),
        accepted("inv-a", challenge="c-3"),
        accepted("inv-a", challenge="c-4"),
        accepted("inv-b", challenge="c-5"),
    ]
    assert run_guard(guard.follower, config(tmp_path, rank=1)) == "restarted"
    assert [(b["rank"], b["healthy"], b["challenge"], b["rendezvous"]) for b in bodies] == [
        (1, True, "", []),
        (1, True, "c-1", []),
        (1, False, "c-2", []),
        (1, True, "c-3", []),
        (1, True, "c-4", []),
    ]
    assert len({b["nonce"] for b in bodies}) == 5 and all(len(b["nonce"]) == 32 for b in bodies)
    following = json.loads((tmp_path / "state" / "u.following").read_text())
    assert following == {"leader_invocation": "inv-a", "engine_invocation": "e-1"}
    assert host.lines == [
        f"rank 1 guard of u: following rank 0's engine through its guard at {RANK0}:1",
        "rank 0's engine invocation inv-a",
        "restarting this rank: rank 0 restarted (invocation inv-a -> inv-b): joining its new group",
    ]
    assert host.systemctl() == RESTART and host.sleeps == [1, 1, 1, 3600]
    assert not (tmp_path / "state" / "u.json").exists()  # a follower's restart is no group restart: no backoff


def test_a_follower_keeps_its_engine_in_rank0s_new_group_when_it_formed_or_holds_its_rendezvous(
    tmp_path, follower_host, monkeypatch
):
    guard, answers, bodies = follower_host
    host = Host(guard, monkeypatch, health=[200], polls=2, invocations=["e-1"])

    def connections(rendezvous):
        assert rendezvous == f"{RANK0}:29500"
        return [f"{RANK1}:41000"]

    monkeypatch.setattr(guard, "rendezvous_connections", connections)
    answers += [
        accepted("inv-a"),
        accepted("inv-b", formed=True),
        accepted("inv-c", rendezvous=[f"{RANK1}:41000"]),
    ]
    assert run_guard(guard.follower, config(tmp_path, rank=1, rendezvous=f"{RANK0}:29500")) == "stopped"
    assert [b["rendezvous"] for b in bodies] == [[f"{RANK1}:41000"]] * 3
    assert host.lines[2:] == [
        "rank 0 restarted (invocation inv-a -> inv-b) and its new group formed with this rank's engine: following it",
        "rank 0 restarted (invocation inv-b -> inv-c) and this rank's engine is in its rendezvous: following it",
    ]
    assert json.loads((tmp_path / "state" / "u.following").read_text())["leader_invocation"] == "inv-c"
    assert not host.systemctl()


def test_a_follower_whose_probe_fails_reports_its_last_answer_and_a_silent_leader_changes_nothing(
    tmp_path, follower_host, monkeypatch
):
    guard, answers, bodies = follower_host
    fault = guard.GuardFault("cannot open a socket (Too many open files)")
    host = Host(guard, monkeypatch, health=[fault, 200, fault, 503], polls=3)
    answers += [accepted("inv-a"), None, None, None]
    assert run_guard(guard.follower, config(tmp_path, rank=1)) == "stopped"
    # before any answer it knew, the rank reports itself unhealthy; a silent leader's challenge is forgotten
    assert [b["healthy"] for b in bodies] == [False, True, True, False]
    assert [b["challenge"] for b in bodies] == ["", "c-next", "", ""]
    assert (
        host.lines.count(
            "this rank's health probe did not run: cannot open a socket (Too many open files); reporting the last answer"
        )
        == 2
    )
    assert not host.systemctl()


def test_a_follower_sends_at_most_two_reports_a_poll(tmp_path, follower_host, monkeypatch):
    guard, answers, bodies = follower_host
    Host(guard, monkeypatch, health=[200], polls=0)  # one poll
    answers += [{"accepted": False, "challenge": f"c-{i}"} for i in (1, 2, 3)]
    assert run_guard(guard.follower, config(tmp_path, rank=1)) == "stopped"
    assert [b["challenge"] for b in bodies] == ["", "c-1"]


# --------------------------------------------------------------------------- restart_engine and invocation


def test_invocation_is_systemds_and_empty_when_systemctl_cannot_answer(monkeypatch):
    guard = guard_module()
    calls = []

    def run(argv, **kwargs):
        calls.append((argv, kwargs))
        return SimpleNamespace(stdout=" inv-x \n")

    monkeypatch.setattr(guard, "subprocess", SimpleNamespace(run=run, SubprocessError=subprocess.SubprocessError))
    assert guard.invocation("sglang-u") == "inv-x"
    assert calls == [
        (
            ["systemctl", "show", "-p", "InvocationID", "--value", "sglang-u.service"],
            {"capture_output": True, "text": True, "timeout": 30},
        )
    ]
    for error in (OSError(errno.ENOENT, "No such file"), subprocess.TimeoutExpired("systemctl", 30)):

        def fails(argv, error=error, **kwargs):
            raise error

        monkeypatch.setattr(guard, "subprocess", SimpleNamespace(run=fails, SubprocessError=subprocess.SubprocessError))
        assert guard.invocation("sglang-u") == ""


def test_the_main_runs_the_leader_for_rank0_and_the_follower_for_the_others(tmp_path, monkeypatch):
    guard = guard_module()
    ran = []
    monkeypatch.setattr(guard, "leader", lambda cfg: ran.append(("leader", cfg["rank"])))
    monkeypatch.setattr(guard, "follower", lambda cfg: ran.append(("follower", cfg["rank"])))
    for rank in (0, 1, 2):
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps({"rank": rank}))
        monkeypatch.setattr(guard.sys, "argv", ["ironserve-rank-guard", str(path)])
        assert guard.main() == 0
    assert ran == [("leader", 0), ("follower", 1), ("follower", 2)]


# --------------------------------------------------------------------------- the wire, in-process


@pytest.fixture
def guard_servers():
    """start(members, bind): a real leader's server (GuardServer, its handler and workers) in this process, the
    group's reports signed with SECRET: (guard, server, port, journal). All stopped with the test, workers too."""
    guard = guard_module()
    lines: list[str] = []
    guard.log = lines.append
    before = set(threading.enumerate())
    started = []

    def start(members: list[str], bind: str = RANK0, workers: int | None = None):
        reports = guard.Reports(SECRET.encode(), members, len(members))
        kept, guard.WORKERS = guard.WORKERS, guard.WORKERS if workers is None else workers
        try:
            server = guard.GuardServer((bind, 0), reports, {"formed_in": "inv-a", "invocation": "inv-a"})
        finally:
            started.append((server, server.pending, guard.WORKERS))
            guard.WORKERS = kept
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return guard, server, server.server_address[1], lines

    yield start
    hook, threading.excepthook = threading.excepthook, threading.__excepthook__  # a thread's SystemExit: silent
    try:
        for server, pending, workers in started:
            server.shutdown()
            server.server_close()
            # its workers end too: a thread left running breaks gevent's patching when pyinfra's CLI is imported
            server.finish_request = stop_worker
            server.shutdown_request = lambda request: None
            for _ in range(workers):
                pending.put((None, None))
        for left in set(threading.enumerate()) - before:
            left.join(5)
            assert not left.is_alive(), left
    finally:
        threading.excepthook = hook


@pytest.fixture
def leader_server(guard_servers):
    """The leader on 127.0.0.1, rank 1 at 127.0.0.2 and rank 2 at 127.0.0.4."""
    return guard_servers([RANK0, RANK1, RANK2])


def stop_worker(request, client_address):
    raise SystemExit()  # out of the worker's loop, which catches Exception only


def exchange(port: int, source: str, request: bytes) -> bytes:
    """Raw bytes in, everything the server answered until it closed (b"" when it closed at once)."""
    with socket.create_connection((RANK0, port), timeout=5, source_address=(source, 0)) as conn:
        conn.sendall(request)
        out = b""
        try:
            while chunk := conn.recv(4096):
                out += chunk
        except ConnectionResetError:
            pass
    return out


def test_a_follower_report_goes_signed_from_its_own_address_and_the_reply_is_verified(leader_server):
    guard, server, port, lines = leader_server
    cfg = {"leader": RANK0, "guard_port": port, "source": RANK1}
    first = guard.report(cfg, SECRET.encode(), report_body(True))
    assert first["accepted"] is False and len(first["challenge"]) == 32
    second = guard.report(cfg, SECRET.encode(), report_body(False, first["challenge"]))
    assert second == {"accepted": True, "challenge": second["challenge"], "formed": True, "invocation": "inv-a"}
    assert server.reports.latest[1][1] is False
    # signed with another secret: the leader refuses it, the follower hears nothing it believes
    assert guard.report(cfg, b"cd" * 32, report_body(True, second["challenge"])) is None
    assert lines[-1] == f"refused a report from {RANK1}: bad MAC (not signed with this group's secret)"
    # from an address that is not this host's: sent from the default route instead (the leader refuses that)
    elsewhere = {**cfg, "source": "192.0.2.10"}
    assert guard.report(elsewhere, SECRET.encode(), report_body(True)) is None
    assert elsewhere["source"] is None
    assert (
        "cannot send from this rank's address 192.0.2.10 (Cannot assign requested address); sending from the "
        "default route"
    ) in lines
    # nothing listening: no answer, and the rank's own address kept (it is this host's)
    refused = {**cfg, "guard_port": free_port()}
    said = len(lines)
    assert guard.report(refused, SECRET.encode(), report_body(True)) is None
    assert refused["source"] == RANK1 and len(lines) == said
    # no source address configured: sent from the default route (127.0.0.1: rank 0's, refused as it connects)
    assert guard.report({"leader": RANK0, "guard_port": port}, SECRET.encode(), report_body(True)) is None


def test_a_rank_whose_address_is_not_its_hosts_reports_from_the_default_route(guard_servers):
    """A group whose rank 1 is this host's 127.0.0.1 (a NAT'ed or misnamed address in the inventory): the report
    leaves from there, to the leader's guard port, and is answered."""
    guard, server, port, lines = guard_servers([RANK1, RANK0], bind=RANK1)
    cfg = {"leader": RANK1, "guard_port": port, "source": "192.0.2.10"}
    reply = guard.report(cfg, SECRET.encode(), report_body(True), timeout=5)
    assert reply is not None and reply["accepted"] is False and cfg["source"] is None


def test_a_reply_longer_than_a_report_may_be_is_cut_and_not_believed(leader_server, monkeypatch):
    guard, server, port, lines = leader_server
    body = report_body(True)
    long = json.dumps({"accepted": True, "pad": "x" * guard.MAX_BODY}).encode()
    signature = guard.mac(SECRET.encode(), b"reply", body["nonce"].encode(), long)
    monkeypatch.setattr(server.reports, "handle", lambda *args: (200, long, signature))
    assert guard.report({"leader": RANK0, "guard_port": port, "source": RANK1}, SECRET.encode(), body) is None


def test_a_reply_without_the_groups_mac_or_json_is_not_believed(leader_server, monkeypatch):
    guard, server, port, lines = leader_server
    cfg = {"leader": RANK0, "guard_port": port, "source": RANK1}
    monkeypatch.setattr(server.reports, "handle", lambda *args: (200, b'{"accepted": true}', "0" * 64))
    assert guard.report(cfg, SECRET.encode(), report_body(True)) is None
    assert lines[-1] == "ignoring a reply to this rank's report that does not carry the group's MAC"
    body = report_body(True)
    not_json = b"not json"
    signature = guard.mac(SECRET.encode(), b"reply", body["nonce"].encode(), not_json)
    monkeypatch.setattr(server.reports, "handle", lambda *args: (200, not_json, signature))
    assert guard.report(cfg, SECRET.encode(), body) is None
    monkeypatch.setattr(server.reports, "handle", lambda *args: (403, b"", ""))
    assert guard.report(cfg, SECRET.encode(), report_body(True)) is None


def test_the_leaders_server_answers_members_only_and_nothing_else(leader_server):
    guard, server, port, lines = leader_server
    payload, signature = signed(guard, report_body(True))
    head = f"POST /report HTTP/1.1\r\nHost: x\r\nX-Ironserve-Mac: {signature}\r\n".encode()
    ok = exchange(port, RANK1, head + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    status, _, rest = ok.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status == b"HTTP/1.0 200 OK" and json.loads(body)["accepted"] is False
    fields = dict(line.split(b":", 1) for line in headers.split(b"\r\n") if line)
    assert sorted(fields) == [b"Content-Length", b"Date", b"Server", b"X-Ironserve-Mac"]
    assert fields[b"Server"].strip() == b""  # no software banner
    assert f"Content-Length: {len(body)}".encode() in headers
    # anything but a member's POST /report: an empty answer, no page, no banner
    for source, request, answer in [
        (RANK1, b"GET /report HTTP/1.1\r\n\r\n", b"HTTP/1.0 404 Not Found"),
        (RANK1, b"POST /other HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", b"HTTP/1.0 404 Not Found"),
        (RANK1, b"POST /report HTTP/1.1\r\n\r\n", b"HTTP/1.0 400 Bad Request"),
        (RANK1, b"POST /report HTTP/1.1\r\nContent-Length: x\r\n\r\n", b"HTTP/1.0 400 Bad Request"),
        (RANK1, b"POST /report HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"HTTP/1.0 400 Bad Request"),
        (RANK2, b"POST /report HTTP/1.1\r\nContent-Length: 4097\r\n\r\n", b"HTTP/1.0 400 Bad Request"),
        (RANK2, b"PUT /report HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", b"HTTP/1.0 501 Not Implemented"),
        # from one byte to MAX_BODY a body is read, and judged (unsigned: refused)
        (RANK1, b"POST /report HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", b"HTTP/1.0 403 Forbidden"),
        (RANK1, b"POST /report HTTP/1.1\r\nContent-Length: 4096\r\n\r\n" + b"x" * 4096, b"HTTP/1.0 403 Forbidden"),
    ]:
        got = exchange(port, source, request)
        assert got.split(b"\r\n")[0] == answer, (request, got)
        assert got.endswith(b"Content-Length: 0\r\n\r\n") and b"X-Ironserve-Mac" not in got, got
    # a stranger is closed as it is accepted, read nothing, said once a minute
    assert exchange(port, STRANGER, b"POST /report HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}") == b""
    assert exchange(port, STRANGER, b"GET / HTTP/1.1\r\n\r\n") == b""
    assert exchange(port, "127.0.0.6", b"GET / HTTP/1.1\r\n\r\n") == b""
    for peer in (STRANGER, "127.0.0.6"):  # each peer said once a minute
        assert lines.count(f"refused a connection from {peer}: not the address of a rank of this group") == 1


def test_a_request_that_fails_in_the_leaders_hands_is_named_and_closed(leader_server, monkeypatch):
    guard, server, port, lines = leader_server
    assert server.pending.maxsize == guard.QUEUE
    workers = [t for t in threading.enumerate() if t.name.endswith("(_work)")]
    assert len(workers) >= guard.WORKERS and all(t.daemon for t in workers)  # never keep the guard from exiting
    # a request that fails in the leader's hands: one line naming the error, the connection closed
    payload, signature = signed(guard, report_body(True))
    request = f"POST /report HTTP/1.1\r\nX-Ironserve-Mac: {signature}\r\nContent-Length: {len(payload)}\r\n\r\n"

    def fails(*args):
        raise ValueError("a bug")

    monkeypatch.setattr(server.reports, "handle", fails)
    assert exchange(port, RANK2, request.encode() + payload) == b""
    assert wait_until(lambda: f"a request from {RANK2} failed: ValueError" in lines), lines

    server.handle_error(None, (RANK1, 5), KeyError("x"))
    assert lines[-1] == f"a request from {RANK1} failed: KeyError"
    server.handle_error(None, (STRANGER, 5))
    assert lines[-1] == f"a request from {STRANGER} failed: error"


def test_the_leaders_server_drops_connections_beyond_its_queue(guard_servers):
    """No worker free (none here) and the queue full: a member's next connection is closed at once, said once a
    minute for that member whatever port it comes from."""
    guard, server, port, lines = guard_servers([RANK0, RANK1, RANK2], workers=0)
    waiting = []
    for _ in range(guard.QUEUE):  # accepted and queued, never answered
        waiting.append(socket.create_connection((RANK0, port), timeout=5, source_address=(RANK2, 0)))
    assert wait_until(lambda: server.pending.full())
    assert exchange(port, RANK1, b"GET / HTTP/1.1\r\n\r\n") == b""
    assert exchange(port, RANK1, b"GET / HTTP/1.1\r\n\r\n") == b""
    assert lines == [f"dropped a connection from {RANK1}: {guard.QUEUE} already waiting"]
    while not server.pending.empty():
        server.pending.get_nowait()[0].close()
    for conn in waiting:
        conn.close()


def test_a_leader_on_an_ipv6_address_takes_reports(guard_servers):
    guard, server, port, lines = guard_servers(["::1", "::1"], bind="::1")
    assert server.address_family == socket.AF_INET6
    reply = guard.report({"leader": "::1", "guard_port": port, "source": "::1"}, SECRET.encode(), report_body(True))
    assert reply is not None and reply["accepted"] is False


def wait_until(predicate, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_the_leaders_server_backs_off_when_it_runs_out_of_descriptors(leader_server, monkeypatch):
    guard, server, port, lines = leader_server
    waited = []
    monkeypatch.setattr(guard, "time", SimpleNamespace(sleep=waited.append, monotonic=lambda: 5000.0))

    def no_descriptor(self):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(guard.socketserver.TCPServer, "get_request", no_descriptor)
    with pytest.raises(OSError):
        server.get_request()
    assert waited == [0.2] and lines[-1] == "cannot accept a connection (Too many open files); retrying"

    def reset(self):
        raise OSError(errno.ECONNABORTED, "Software caused connection abort")

    monkeypatch.setattr(guard.socketserver.TCPServer, "get_request", reset)
    with pytest.raises(OSError):
        server.get_request()
    assert waited == [0.2]


def test_http_status_reads_the_status_and_says_the_guards_own_faults(monkeypatch):
    guard = guard_module()

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer():
            conn, _ = listener.accept()
            request = conn.recv(4096)
            conn.sendall(b"HTTP/1.0 204 No Content\r\nContent-Length: 0\r\n\r\n")
            conn.close()
            seen.append(request)

        seen: list[bytes] = []
        server = threading.Thread(target=answer)
        server.start()
        assert guard.http_status(f"http://127.0.0.1:{port}/health?x=1") == 204
        server.join()
        assert seen[0].startswith(b"GET /health HTTP/1.1\r\n")

        def garbage():
            conn, _ = listener.accept()
            conn.recv(4096)
            conn.sendall(b"nonsense\r\n\r\n")
            conn.close()

        server = threading.Thread(target=garbage)
        server.start()
        assert guard.http_status(f"http://127.0.0.1:{port}") == 0  # took the connection, answered no HTTP
        server.join()

    def failing(family, kind):
        raise OSError(errno.ENFILE, "Too many open files in system")

    monkeypatch.setattr(guard.socket, "socket", failing)
    with pytest.raises(guard.GuardFault, match=r"cannot open a socket \(Too many open files in system\)"):
        guard.http_status("http://127.0.0.1:1/health")


# --------------------------------------------------------------------------- the guard's small rules


def test_a_members_name_stands_for_its_addresses():
    guard = guard_module()
    assert "127.0.0.1" in guard.addresses("localhost") and "localhost" not in guard.addresses("localhost")
    assert guard.addresses("10.0.0.5") == {"10.0.0.5"}
    assert guard.addresses("no-such-host.invalid") == {"no-such-host.invalid"}  # the leader refuses what it cannot


def test_the_kernels_tables_are_read_whole_past_their_header_and_a_missing_one(tmp_path):
    guard = guard_module()
    header = "  sl  local_address rem_address   st tx_queue rx_queue\n"
    tcp = tmp_path / "tcp"
    tcp.write_text(
        header
        + "   0: 0100007F:1F90 0200007F:A000 01 00000000:00000000\n"  # established, the first row
        + "   1: 0100007F:0016 00000000:0000 0A 00000000:00000000\n"  # listening
        + "   2: 0100007F:0050 0300007F:A001 01\n"  # established, nothing after its state
        + "   3: 0100007F:0051\n"  # cut short
        + "   4: 0100007F:0052 0300007F:A002\n"  # cut before its state
    )
    tcp6 = tmp_path / "tcp6"
    tcp6.write_text(header + "   0: 00000000000000000000000001000000:0016 00000000000000000000000001000000:B000 01\n")
    assert guard.established((str(tmp_path / "missing"), str(tcp), str(tcp6))) == [
        (("127.0.0.1", 8080), ("127.0.0.2", 40960)),
        (("127.0.0.1", 80), ("127.0.0.3", 40961)),
        (("::1", 22), ("::1", 45056)),
    ]


def test_a_rank_that_never_reported_is_silent_once_the_window_passed_and_the_window_is_inclusive(monkeypatch):
    guard = guard_module()
    reports = guard.Reports(SECRET.encode(), [RANK0, RANK1, RANK2], 3)
    monkeypatch.setattr(guard, "time", SimpleNamespace(monotonic=lambda: 1030.0))
    reports.latest = {2: (1010.0, True)}  # rank 2: exactly the window ago; rank 1: never
    assert guard.follower_verdicts(reports, 3, 1000.0, 20.0) == {1: "silent", 2: "healthy"}
    assert guard.follower_verdicts(reports, 3, 1015.0, 20.0) == {1: "healthy", 2: "healthy"}


def test_the_health_probe_asks_the_urls_host_port_and_path(monkeypatch):
    guard = guard_module()
    for host, url_host, family in (("127.0.0.2", "127.0.0.2", socket.AF_INET), ("::1", "[::1]", socket.AF_INET6)):
        with socket.socket(family) as listener:
            listener.bind((host, 0))
            listener.listen()
            port = listener.getsockname()[1]
            seen: list[bytes] = []

            def answer(listener=listener, seen=seen):
                conn, _ = listener.accept()
                seen.append(conn.recv(4096))
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
                conn.close()

            for path, asked in (("/health", b"GET /health HTTP/1.1\r\n"), ("", b"GET / HTTP/1.1\r\n")):
                server = threading.Thread(target=answer)
                server.start()
                assert guard.http_status(f"http://{url_host}:{port}{path}") == 200
                server.join()
                assert seen[-1].startswith(asked) and f"Host: {url_host}:{port}\r\n".encode() in seen[-1]

    class Unreachable:
        def __init__(self, *args):
            pass

        def settimeout(self, timeout):
            pass

        def connect(self, address):
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")

        def close(self):
            pass

    monkeypatch.setattr(guard.socket, "socket", Unreachable)
    url = "http://10.0.0.1:30000/health"
    with pytest.raises(guard.GuardFault) as fault:
        guard.http_status(url)
    assert str(fault.value) == f"cannot probe {url} (Cannot assign requested address)"


def test_rank0s_rendezvous_address_in_any_form():
    guard = guard_module()
    assert guard.rendezvous_endpoint("127.0.0.1:29500") == ({"127.0.0.1"}, 29500)
    assert guard.rendezvous_endpoint("[::1]:29500") == ({"::1"}, 29500)
    assert guard.rendezvous_endpoint("[fe80::1%lo]:29501") == ({"fe80::1"}, 29501)  # the tables carry no scope
    assert guard.rendezvous_endpoint("no-such-host.invalid:1") == (set(), 1)
    # a scope the resolver cannot take is left off as well
    assert guard.rendezvous_endpoint("[fe80::1%nosuchif0]:1") == ({"fe80::1"}, 1)


def test_the_backoffs_record_without_restarts_and_a_restart_exactly_a_window_ago(tmp_path, monkeypatch):
    guard = guard_module()
    monkeypatch.setattr(guard, "time", SimpleNamespace(time=lambda: 5000.0))
    backoff = guard.Backoff("u", 15, 600, 1800, str(tmp_path))
    assert backoff.path == str(tmp_path / "u.json")
    (tmp_path / "u.json").write_text("{}")
    assert backoff.delay() == 0
    (tmp_path / "u.json").write_text(json.dumps({"restarts": [5000.0 - 1800, 5000.0 - 1799]}))
    assert backoff.delay() == 15 and backoff.record() == 2


def test_refusals_say_each_peer_and_reason_once_a_minute(monkeypatch):
    guard = guard_module()
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(guard, "time", SimpleNamespace(monotonic=lambda: clock.now))
    said: list[str] = []
    monkeypatch.setattr(guard, "log", said.append)
    reports = guard.Reports(SECRET.encode(), [RANK0, RANK1, RANK2], 3)
    reports.refuse(RANK1, "bad MAC")  # the first, at once
    clock.now = 59.9
    reports.refuse(RANK1, "bad MAC")  # within the minute: not again
    reports.refuse(RANK2, "bad MAC")  # another peer, the same reason
    reports.refuse(RANK1, "malformed report")  # the same peer, another reason
    clock.now = 60.0
    reports.refuse(RANK1, "bad MAC")  # a minute later: again
    assert said == [
        f"refused a report from {RANK1}: bad MAC",
        f"refused a report from {RANK2}: bad MAC",
        f"refused a report from {RANK1}: malformed report",
        f"refused a report from {RANK1}: bad MAC",
    ]
    # a full table forgets what is a minute old before it says "many peers"
    refusals = guard.Refusals()
    clock.now = 1000.0
    for i in range(guard.MAX_REFUSED):
        refusals.say(f"10.1.0.{i}", f"refused {i}", "stranger")
    clock.now = 1060.0
    refusals.say("10.2.0.1", "refused the next", "stranger")
    assert said[-1] == "refused the next" and len(refusals.seen) == 1
    # more peers than the table holds within a minute: one line a minute for all of them, from the start
    clock.now, refusals, said[:] = 5.0, guard.Refusals(), []
    for i in range(guard.MAX_REFUSED + 2):
        refusals.say(f"10.3.{i // 250}.{i % 250}", f"refused {i}", "stranger")
    many = f"refusing connections from more than {guard.MAX_REFUSED} peers a minute (latest 10.3.1.6)"
    assert said[guard.MAX_REFUSED :] == [many]
    clock.now = 65.0  # a minute later every entry is forgotten, "many peers" too: a peer is said by its own line
    refusals.say("10.4.0.1", "refused 1", "stranger")
    assert said[-1] == "refused 1"


def test_a_first_report_gets_a_fresh_challenge_without_a_refusal(monkeypatch):
    guard = guard_module()
    said: list[str] = []
    monkeypatch.setattr(guard, "log", said.append)
    reports = guard.Reports(SECRET.encode(), [RANK0, RANK1], 2)
    state = {"formed_in": "i", "invocation": "i"}
    payload, signature = signed(guard, report_body(True))
    status, data, _ = reports.handle(RANK1, payload, signature, state)
    first = json.loads(data)["challenge"]
    payload, signature = signed(guard, report_body(True, first))
    status, data, _ = reports.handle(RANK1, payload, signature, state)
    reply = json.loads(data)
    assert status == 200 and reply["accepted"] and not said
    assert len(first) == len(reply["challenge"]) == 32 and first != reply["challenge"]


def report_within(guard, cfg: dict, seconds: float, timeout: float) -> tuple[bool, dict | None]:
    """guard.report in a thread: (whether it returned within ``seconds``, its answer). A report still waiting
    then is left to the caller to end (closing what it waits on)."""
    out: list = []
    worker = threading.Thread(target=lambda: out.append(guard.report(cfg, SECRET.encode(), report_body(True), timeout)))
    worker.start()
    worker.join(seconds)
    return not worker.is_alive(), (out or [None])[0]


def test_a_report_to_a_leader_that_never_answers_gives_up_within_its_timeout():
    """A leader's guard that takes the connection and says nothing (hung, stopped): the follower's report gives up
    within its timeout, from this rank's own address and from the default route alike; it never hangs the
    follower's loop."""
    guard = guard_module()
    guard.log = lambda line: None
    with socket.socket() as stalled:  # takes connections (the kernel's backlog), never reads or answers
        stalled.bind((RANK0, 0))
        stalled.listen(8)
        port = stalled.getsockname()[1]
        for source in (RANK1, "192.0.2.10"):  # the second is not this host's: sent from the default route
            start = time.monotonic()
            returned, answer = report_within(guard, {"leader": RANK0, "guard_port": port, "source": source}, 3, 0.3)
            if not returned:
                stalled.close()  # the connections waiting in its backlog are reset: the report ends
            assert returned and answer is None, source
            assert time.monotonic() - start < 2


def test_two_groups_followers_on_one_host_report_at_the_same_time(guard_servers):
    """Two multi-node groups with a rank on this host: each rank's guard reports from the host's address, from a
    port of the kernel's choosing, so one report waiting for its leader never keeps another from leaving."""
    guard, server, port, lines = guard_servers([RANK0, RANK1])
    with socket.socket() as stalled:
        stalled.bind((RANK0, 0))
        stalled.listen(8)
        busy = threading.Thread(
            target=guard.report,
            args=(
                {"leader": RANK0, "guard_port": stalled.getsockname()[1], "source": RANK1},
                SECRET.encode(),
                report_body(True),
                5,
            ),
        )
        busy.start()
        held, _ = stalled.accept()  # the first group's report is connected, waiting for its answer
        try:
            reply = guard.report(
                {"leader": RANK0, "guard_port": port, "source": RANK1}, SECRET.encode(), report_body(True), 5
            )
            assert reply is not None and reply["accepted"] is False
        finally:
            held.close()
            busy.join(5)


def test_a_failed_request_is_said_once_a_minute_per_peer_and_kind_whatever_port_it_came_from(leader_server):
    guard, server, port, lines = leader_server
    server.handle_error(None, (RANK1, 40001), KeyError("x"))
    server.handle_error(None, (RANK1, 40002), KeyError("y"))  # the same peer and kind, another connection: not again
    server.handle_error(None, (RANK2, 40001), KeyError("x"))  # another peer, the same kind
    server.handle_error(None, (RANK1, 40003), ValueError("x"))  # the same peer, another kind
    assert lines == [
        f"a request from {RANK1} failed: KeyError",
        f"a request from {RANK2} failed: KeyError",
        f"a request from {RANK1} failed: ValueError",
    ]
