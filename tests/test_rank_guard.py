"""files/bin/ironserve_rank_guard.py, run for real on this machine: a leader and a follower process talking HTTP on
loopback (rank 0 at 127.0.0.1, rank 1 sending from 127.0.0.2), a stand-in `systemctl` on PATH (records calls,
answers InvocationID from a file) and a stand-in engine /health per rank. Checks the decisions that make a
multi-node group restart as a whole, and that only the group's signed, fresh reports from its own addresses
count: forged, replayed and foreign reports change nothing."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import resource
import secrets
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ironserve.render import Process
from ironserve.units import RANK_GUARD_PORT_OFFSET, rank_guard_files

from .host_scripts import load_script

GUARD = Path(__file__).resolve().parent.parent / "files" / "bin" / "ironserve_rank_guard.py"
SECRET = "ab" * 32
RANK0, RANK1, STRANGER, RANK2 = "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"


def guard_module():
    """The guard script as a module (its protocol helpers), for the tests that speak to a real guard."""
    return load_script(GUARD.name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Health:
    """A stand-in engine /health whose answer the test flips."""

    def __init__(self):
        self.code = 200
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(health.code)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"


@pytest.fixture
def guard_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\ncase "$*" in *InvocationID*) cat "$INVOCATION_FILE" 2>/dev/null;; esac\n'
    )
    (bin_dir / "systemctl").chmod(0o755)
    procs: list[subprocess.Popen] = []

    def start(config: dict, invocation: str, nofile: int | None = None) -> tuple[subprocess.Popen, Path]:
        """Run a guard; ``nofile``: its descriptor limit (the unit's LimitNOFILE=)."""
        name = f"rank{config['rank']}"
        inv = tmp_path / f"{name}.invocation"
        inv.write_text(invocation + "\n")
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "INVOCATION_FILE": str(inv),
            "PYTHONUNBUFFERED": "1",
        }
        log = open(tmp_path / f"{name}.log", "w")
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
        proc = subprocess.Popen(
            [sys.executable, str(GUARD), str(path)], env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit
        )
        procs.append(proc)
        return proc, inv

    yield start, calls, tmp_path
    for proc in procs:
        proc.kill()
        proc.wait()


def base_config(rank: int, port: int, health_url: str, state_dir: Path, world: int = 2) -> dict:
    secret = state_dir / "group.key"
    if not secret.exists():
        secret.write_text(SECRET + "\n")
        secret.chmod(0o600)
    members = [RANK0, RANK1, RANK2][:world]
    config = {
        "unit": f"engine{rank}",
        "rank": rank,
        "world": world,
        "guard_port": port,
        "leader": RANK0,
        "members": members,
        "secret_file": str(secret),
        "health_url": health_url,
        "poll_s": 0.2,
        "failure_threshold": 3,
        "formation_timeout_s": 30,
        "backoff_base_s": 0,
        "backoff_max_s": 0,
        "backoff_window_s": 60,
        "state_dir": str(state_dir / "state"),
    }
    return config | ({"bind": RANK0} if rank == 0 else {"source": members[rank]})


def wait_for(predicate, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def calls_of(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def restart_asked(calls: Path, unit: str) -> bool:
    """Did a guard ask systemd to restart ``unit`` (within the wait)?"""
    return wait_for(lambda: any(c.startswith(f"--no-block restart {unit}") for c in calls_of(calls)))


def leader_alone(start, tmp: Path, health_code: int, **config) -> None:
    """Rank 0's guard with no follower running, its engine answering /health with ``health_code``."""
    h0 = Health()
    h0.code = health_code
    start(base_config(0, free_port(), h0.url, tmp) | config, "inv-a")


def test_a_rank_that_stops_answering_restarts_rank0_and_the_follower_follows(guard_env, monkeypatch):
    start, calls, tmp = guard_env
    port = free_port()
    h0, h1 = Health(), Health()
    leader, inv0 = start(base_config(0, port, h0.url, tmp), "inv-a")
    follower, _ = start(base_config(1, port, h1.url, tmp), "inv-f")
    # formed, both healthy: no restart
    assert wait_for(lambda: "group formed" in (tmp / "rank0.log").read_text())
    # the follower records which generation of the group (rank 0's invocation) its engine (its own) follows
    following = tmp / "state" / "engine1.following"
    assert wait_for(following.exists)
    assert json.loads(following.read_text()) == {"leader_invocation": "inv-a", "engine_invocation": "inv-f"}
    time.sleep(1.5)
    assert not [c for c in calls_of(calls) if "restart" in c]
    # rank 1 hangs: its reports say unhealthy; after 3 polls the leader abandons the group (SIGKILL, restart)
    h1.code = 503
    assert restart_asked(calls, "engine0")
    made = calls_of(calls)
    # SIGKILL, then systemd's count of automatic restarts reset, then the restart: a deliberate restart, which the
    # engine's own restart backoff (files/bin/ironserve-backoff) never delays nor counts as a crash
    kill, reset = "kill --signal=SIGKILL engine0.service", "reset-failed engine0.service"
    assert kill in made and reset in made
    assert made.index(kill) < made.index(reset) < made.index("--no-block restart engine0.service")
    assert "rank 1 not answering /health" in (tmp / "rank0.log").read_text()
    # rank 0 came back (new invocation, its group still forming: its server not up yet): the follower restarts its
    # own engine to join it
    leader.kill()
    inv0.write_text("inv-b\n")
    h1.code = 200
    forming = f"http://127.0.0.1:{free_port()}/health"  # nothing listens there
    start(base_config(0, port, forming, tmp) | {"unit": "engine0"}, "inv-b")
    assert restart_asked(calls, "engine1")
    assert "rank 0 restarted (invocation inv-a -> inv-b)" in (tmp / "rank1.log").read_text()


def test_a_silent_follower_counts_as_failed_and_a_healthy_group_is_left_alone(guard_env):
    start, calls, tmp = guard_env
    leader_alone(start, tmp, 200)  # no follower ever reports
    assert wait_for(lambda: "group formed" in (tmp / "rank0.log").read_text())
    assert restart_asked(calls, "engine0")
    assert "rank 1 silent" in (tmp / "rank0.log").read_text()


def test_a_group_that_never_forms_is_restarted_after_the_formation_timeout(guard_env):
    start, calls, tmp = guard_env
    nothing_listens = f"http://127.0.0.1:{free_port()}/health"
    start(base_config(0, free_port(), nothing_listens, tmp) | {"formation_timeout_s": 1}, "inv-a")
    assert restart_asked(calls, "engine0")
    assert "the group did not form within 1s" in (tmp / "rank0.log").read_text()


def test_a_group_that_formed_but_never_serves_is_restarted_after_the_formation_timeout(guard_env):
    """Rank 0's server up (every rank joined) but /health never 200 (a warm-up hung on a lost rank): the group is
    formed for the followers' replies, and restarted at the same timeout."""
    start, calls, tmp = guard_env
    port, h0, h1 = free_port(), Health(), Health()
    h0.code = 503
    start(base_config(0, port, h0.url, tmp) | {"formation_timeout_s": 2}, "inv-a")
    start(base_config(1, port, h1.url, tmp), "inv-f")  # healthy: only the timeout restarts this group
    assert restart_asked(calls, "engine0")
    log = (tmp / "rank0.log").read_text()
    assert "group formed after" in log and "the group formed but did not serve within 2s" in log
    assert "not answering" not in log and "silent" not in log


def test_a_follower_that_fails_after_forming_restarts_the_group_before_rank0_served(guard_env):
    """Every rank joined (rank 0's server up) and rank 0 warms up (/health not 200 yet) when rank 1 hangs: the
    leader restarts the group after its failure threshold, not at the formation timeout (rank 0's warm-up waits
    on rank 1: that group can never serve)."""
    start, calls, tmp = guard_env
    port, h0, h1 = free_port(), Health(), Health()
    h0.code = 503
    start(base_config(0, port, h0.url, tmp) | {"formation_timeout_s": 600}, "inv-a")
    start(base_config(1, port, h1.url, tmp), "inv-f")
    assert wait_for(lambda: "group formed" in (tmp / "rank0.log").read_text())
    time.sleep(1.5)  # formed and warming up, rank 1 healthy: nothing restarts
    assert not [c for c in calls_of(calls) if "restart" in c]
    h1.code = 503
    started = time.monotonic()
    assert restart_asked(calls, "engine0")
    assert time.monotonic() - started < 10
    log = (tmp / "rank0.log").read_text()
    assert "rank 1 not answering /health for 3 polls in a row" in log
    assert "(the group formed, rank 0 had not served yet)" in log and "serving" not in log


def test_guard_config_from_the_render():
    procs = [
        Process(
            host=f"n{i}",
            address=f"10.0.0.{i + 1}",
            role="decode",
            node_rank=i,
            group=1,
            instance=0,
            nnodes=2,
            port=30001,
            serves_http=i == 0,
            unit="sglang-r-decode",
            argv=[
                "python3",
                "-m",
                "sglang.launch_server",
                "--host",
                "0.0.0.0",
                "--port",
                "30001",
                "--dist-init-addr",
                "10.0.0.1:5000",
                "--nnodes",
                "2",
                "--node-rank",
                str(i),
            ],
            env={},
            launcher=["python3", "-m", "sglang.launch_server"],
            bind="0.0.0.0",
            dist_init_addr="10.0.0.1",
            dist_init_port=5000,
            head="n0",
        )
        for i in range(2)
    ]
    from ironserve.catalogue import get_recipe

    recipe = get_recipe("tiny-cpu-tp2")
    files = rank_guard_files(recipe, procs[1], procs)
    config = json.loads(files.config_text)
    assert config["leader"] == "10.0.0.1" and config["guard_port"] == 5000 + RANK_GUARD_PORT_OFFSET
    assert config["members"] == ["10.0.0.1", "10.0.0.2"] and config["source"] == "10.0.0.2"
    assert config["secret_file"] == "/etc/ironserve/sglang-r-decode.rank-group.key"
    leader = json.loads(rank_guard_files(recipe, procs[0], procs).config_text)
    assert leader["bind"] == "10.0.0.1" and "source" not in leader  # the cluster address, never 0.0.0.0
    assert config["health_url"] == "http://127.0.0.1:30001/health"  # its own port, probed on its own host
    assert config["rank"] == 1 and config["world"] == 2
    # both ends know rank 0's rendezvous (--dist-init-addr): a follower in it is never restarted out of it
    assert config["rendezvous"] == leader["rendezvous"] == "10.0.0.1:5000"
    # the deploy's gate and rollback decide about a new group before the guard gives up on it: never a race
    from ironserve.units import RANK_FOLLOW_S

    assert config["formation_timeout_s"] >= recipe.health_timeout_s + RANK_FOLLOW_S + 60
    assert files.unit_name == "sglang-r-decode-rank-guard.service"
    assert "BindsTo=sglang-r-decode.service" in files.unit_text
    assert "PartOf=sglang-r-decode.service" in files.unit_text
    # a flood neither takes its descriptors nor reaches it from outside the group (where systemd can filter)
    lines = files.unit_text.splitlines()
    assert "LimitNOFILE=256" in lines and "IPAddressDeny=any" in lines
    assert "IPAddressAllow=10.0.0.1 10.0.0.2 localhost" in lines
    named = [dataclasses.replace(p, address=f"n{p.node_rank}.cluster") for p in procs]
    text = rank_guard_files(recipe, named[0], named).unit_text  # names: IPAddressAllow= takes addresses only
    assert not [x for x in text.splitlines() if x.startswith("IPAddress")] and "LimitNOFILE=256" in text


def test_group_restarts_back_off_exponentially_within_the_window(tmp_path):
    module = guard_module()
    backoff = module.Backoff("u", base=15, limit=600, window=1800, state_dir=str(tmp_path))
    delays = []
    for _ in range(8):
        delays.append(backoff.delay())
        backoff.record()
    assert delays == [0, 15, 30, 60, 120, 240, 480, 600]
    # the record survives the guard's own restart (a new process reads the same state file)
    assert module.Backoff("u", 15, 600, 1800, str(tmp_path)).delay() == 600
    assert module.Backoff("u", 15, 600, 0, str(tmp_path)).delay() == 0  # outside the window: no wait


# --------------------------------------------------------------------------- who the leader believes


def post(port: int, payload: bytes, signature: str, source: str, path: str = "/report"):
    """One raw POST to the leader's guard from ``source``: (status, headers, body); (None, {}, b"") when the guard
    closed the connection without a word (a stranger's)."""
    conn = http.client.HTTPConnection(RANK0, port, timeout=5, source_address=(source, 0))
    try:
        conn.request("POST", path, body=payload, headers={"X-Ironserve-Mac": signature})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        return None, {}, b""
    finally:
        conn.close()


def signed(guard, body: dict, secret: str = SECRET) -> tuple[bytes, str]:
    payload = json.dumps(body, sort_keys=True).encode()
    return payload, guard.mac(secret.encode(), b"report", payload)


def report_body(healthy: bool, challenge: str = "") -> dict:
    return {"rank": 1, "healthy": healthy, "nonce": secrets.token_hex(16), "challenge": challenge}


def flood(port: int, messages: list[tuple[bytes, str, str]], seconds: float) -> list[int]:
    """Send the (payload, mac, source) messages over and over for ``seconds``: the statuses answered."""
    statuses, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        for payload, signature, source in messages:
            statuses.append(post(port, payload, signature, source)[0])
        time.sleep(0.05)
    return statuses


def test_forged_and_foreign_reports_change_nothing(guard_env):
    """A healthy group under a flood of "rank 1 is unhealthy": unsigned, signed with another secret, or signed
    right but sent from an address that is no rank's. The leader refuses all and restarts nothing."""
    guard = guard_module()
    start, calls, tmp = guard_env
    port = free_port()
    h0, h1 = Health(), Health()
    start(base_config(0, port, h0.url, tmp), "inv-a")
    start(base_config(1, port, h1.url, tmp), "inv-f")
    assert wait_for(lambda: "group formed" in (tmp / "rank0.log").read_text())
    forged = signed(guard, report_body(False), secret="cd" * 32)
    unsigned = (json.dumps(report_body(False)).encode(), "")
    foreign = signed(guard, report_body(False))
    statuses = flood(port, [(*forged, RANK1), (*unsigned, RANK1)], seconds=3)
    assert set(statuses) == {403}
    # from an address that is no rank's: closed as accepted, nothing read, nothing answered
    assert set(flood(port, [(*foreign, STRANGER)], seconds=1)) == {None}
    # replays of a signed "unhealthy" report (its challenge long used) from rank 1's own address: refused, and
    # the real follower's reports keep being accepted meanwhile (no restart for silence either)
    replayed = signed(guard, report_body(False, "a-used-challenge"))
    assert set(flood(port, [(*replayed, RANK1)], seconds=2)) == {200}
    assert not [c for c in calls_of(calls) if "restart" in c or "kill" in c], calls_of(calls)
    log = (tmp / "rank0.log").read_text()
    assert f"refused a connection from {STRANGER}: not the address of a rank of this group" in log
    assert f"refused a report from {RANK1}: bad MAC" in log
    # the real follower's signed reports still count: its hang is still noticed
    h1.code = 503
    assert restart_asked(calls, "engine0")


def test_a_forged_or_replayed_healthy_report_cannot_hide_a_dead_rank(guard_env):
    """No follower runs (rank 1 is dead). Someone at rank 1's address replays a genuine "healthy" report it
    captured, and sends forged ones: rank 1 stays silent to the leader, which restarts the group."""
    guard = guard_module()
    start, calls, tmp = guard_env
    port = free_port()
    h0 = Health()
    start(base_config(0, port, h0.url, tmp), "inv-a")
    assert wait_for(lambda: "group formed" in (tmp / "rank0.log").read_text())
    # one genuine exchange: a challenge, then a report carrying it (accepted once)
    status, _, body = post(port, *signed(guard, report_body(True)), RANK1)
    assert status == 200 and not json.loads(body)["accepted"]
    genuine = signed(guard, report_body(True, json.loads(body)["challenge"]))
    status, _, body = post(port, *genuine, RANK1)
    assert status == 200 and json.loads(body)["accepted"]
    forged = signed(guard, report_body(True, json.loads(body)["challenge"]), secret="cd" * 32)
    replies = []
    end = time.monotonic() + 8
    while time.monotonic() < end and not any(c.startswith("--no-block restart engine0") for c in calls_of(calls)):
        replies.append(post(port, *genuine, RANK1))  # the replay
        post(port, *forged, RANK1)
        time.sleep(0.05)
    assert restart_asked(calls, "engine0")
    assert replies and not any(json.loads(r[2])["accepted"] for r in replies if r[0] == 200)
    log = (tmp / "rank0.log").read_text()
    assert "rank 1 silent" in log
    assert "a challenge already used or never given (a replay?)" in log


def test_replies_carry_nothing_a_stranger_can_use(guard_env):
    guard = guard_module()
    start, calls, tmp = guard_env
    port = free_port()
    start(base_config(0, port, Health().url, tmp), "inv-secret-invocation")
    assert wait_for(lambda: "waiting for the group to form" in (tmp / "rank0.log").read_text())
    with socket.create_connection((RANK0, port), timeout=5, source_address=(STRANGER, 0)) as conn:
        try:
            conn.sendall(b"GET /group?rank=1&healthy=0 HTTP/1.0\r\n\r\n")
            answer = conn.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            answer = b""
        assert answer == b""  # a stranger: closed, not a byte of an answer
    assert post(port, *signed(guard, report_body(False)), STRANGER) == (None, {}, b"")
    answers = [post(port, *signed(guard, report_body(False), secret="cd" * 32), RANK1)]
    answers.append(post(port, b"x" * 10, "", RANK1, path="/group"))
    for status, headers, body in answers:
        assert status in (403, 404) and body == b"", (status, body)
        assert "Python" not in headers.get("Server", "") and "X-Ironserve-Mac" not in headers
    # a member with the secret learns the invocation, but not from a reply it could not verify
    status, headers, body = post(port, *signed(guard, report_body(True)), RANK1)
    assert status == 200 and "engine0" not in body.decode() and "invocation" not in json.loads(body)


class FakeLeader:
    """Answers every report with a new invocation of rank 0 (its group forming), signed as ``how`` says."""

    def __init__(self, guard, port: int, how: str):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                data = json.dumps(
                    {"accepted": True, "challenge": "c", "formed": False, "invocation": f"inv-{secrets.token_hex(4)}"}
                ).encode()
                key = (SECRET if how != "other-secret" else "cd" * 32).encode()
                nonce = request["nonce"] if how == "right" else "an-earlier-nonce"
                self.send_response(200)
                self.send_header("X-Ironserve-Mac", guard.mac(key, b"reply", nonce.encode(), data))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((RANK0, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize("how", ["other-secret", "stale-nonce"])
def test_a_follower_believes_only_its_leaders_answer_to_its_own_report(guard_env, how):
    """Forged (another secret) or replayed (signed for an earlier report) replies announcing a new rank 0
    never restart a follower; the control (signed right) does."""
    guard = guard_module()
    start, calls, tmp = guard_env
    port = free_port()
    fake = FakeLeader(guard, port, how)
    start(base_config(1, port, Health().url, tmp), "inv-f")
    # three replies refused (polls apart), however slowly this machine runs the guard
    log = tmp / "rank1.log"
    assert wait_for(lambda: log.read_text().count("does not carry the group's MAC") >= 3), log.read_text()
    fake.server.shutdown()
    fake.server.server_close()
    assert not [c for c in calls_of(calls) if "restart" in c], calls_of(calls)
    control = FakeLeader(guard, port, "right")
    try:
        assert restart_asked(calls, "engine1")
    finally:
        control.server.shutdown()
        control.server.server_close()


# --------------------------------------------------------------------------- floods and the guard's own faults

GUARD_NOFILE = 64  # the leader's descriptor limit in the flood test (the unit's LimitNOFILE=, scaled down)


def idle_connections(port: int, source: str, count: int) -> list[socket.socket]:
    """``count`` connections to the leader's guard from ``source`` that send nothing and stay open."""
    held = []
    for _ in range(count):
        conn = socket.socket()
        conn.setblocking(False)
        conn.bind((source, 0))
        conn.connect_ex((RANK0, port))
        held.append(conn)
    return held


def test_a_flood_of_idle_connections_restarts_nothing_in_a_group_of_three(guard_env):
    """A stranger holds more idle connections to rank 0's guard than the guard has descriptors (RLIMIT_NOFILE
    set small for the guard's process): the guard closes each as it accepts it, its own health probes keep
    running, both followers' reports keep counting; no group restart is decided. After the flood it still
    notices a rank that stops answering."""
    start, calls, tmp = guard_env
    port = free_port()
    health = [Health(), Health(), Health()]
    start(base_config(0, port, health[0].url, tmp, world=3), "inv-a", nofile=GUARD_NOFILE)
    for rank in (1, 2):
        start(base_config(rank, port, health[rank].url, tmp, world=3), f"inv-f{rank}")
    assert wait_for(lambda: "group formed" in (tmp / "rank0.log").read_text())
    held = idle_connections(port, STRANGER, 5 * GUARD_NOFILE)
    try:
        time.sleep(5)  # 25 polls of 0.2 s: eight times the failure threshold
        more = idle_connections(port, STRANGER, GUARD_NOFILE)  # still accepting (and closing) while flooded
        held += more
        time.sleep(1)
    finally:
        for conn in held:
            conn.close()
    log = (tmp / "rank0.log").read_text()
    assert not [c for c in calls_of(calls) if "restart" in c or "kill" in c], (calls_of(calls), log[-2000:])
    # its own probe of rank 0 kept running and answering (a follower late once on this busy machine is no matter:
    # three polls in a row make a decision, and none was made)
    assert "rank 0 not answering" not in log and "did not run" not in log, log[-2000:]
    assert f"refused a connection from {STRANGER}: not the address of a rank of this group" in log
    assert "Traceback" not in log
    # the guard is still the group's: rank 2 stops answering, the group restarts
    health[2].code = 503
    assert restart_asked(calls, "engine0")
    assert "rank 2 not answering /health" in (tmp / "rank0.log").read_text()


def test_a_bad_content_length_gets_a_400_and_no_traceback(guard_env):
    start, calls, tmp = guard_env
    port = free_port()
    start(base_config(0, port, Health().url, tmp), "inv-a")
    assert wait_for(lambda: "waiting for the group to form" in (tmp / "rank0.log").read_text())
    for length in (b"abc", b"-5", b"99999999", b""):
        with socket.create_connection((RANK0, port), timeout=5, source_address=(RANK1, 0)) as conn:
            conn.sendall(b"POST /report HTTP/1.0\r\nContent-Length: " + length + b"\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.0 400 "), length
    # a member that sends nothing is dropped after the read timeout, not waited for
    guard = guard_module()
    with socket.create_connection((RANK0, port), timeout=guard.READ_TIMEOUT_S + 5, source_address=(RANK1, 0)) as c:
        started = time.monotonic()
        assert c.recv(4096) == b"" and time.monotonic() - started < guard.READ_TIMEOUT_S + 3
    time.sleep(0.3)
    assert "Traceback" not in (tmp / "rank0.log").read_text()


def test_the_guards_own_probe_failure_is_no_verdict_on_rank0(monkeypatch):
    """No descriptor left for the guard's health probe (EMFILE): neither healthy nor unhealthy, and said."""
    import errno

    guard = guard_module()
    lines = []
    monkeypatch.setattr(guard, "log", lines.append)

    def no_descriptor(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    health = Health()
    config = {"health_url": health.url}
    refused = guard.Refusals()
    assert guard.rank0_verdict(config, refused) == "healthy"
    health.code = 503
    assert guard.rank0_verdict(config, refused) == "not answering /health"
    monkeypatch.setattr(guard.socket, "socket", no_descriptor)
    assert guard.rank0_verdict(config, refused) is None
    assert "did not run" in lines[-1] and "Too many open files" in lines[-1]
    # an engine that does not answer is still a verdict
    monkeypatch.undo()
    monkeypatch.setattr(guard, "log", lines.append)
    assert (
        guard.rank0_verdict({"health_url": f"http://127.0.0.1:{free_port()}/health"}, refused)
        == "not answering /health"
    )


def test_the_refusals_table_stays_bounded():
    guard = guard_module()
    refusals = guard.Refusals()
    said = []
    guard.log = said.append
    for i in range(10 * guard.MAX_REFUSED):
        refusals.say(f"10.1.{i // 250}.{i % 250}", f"refused {i}", "stranger")
    assert len(refusals.seen) <= guard.MAX_REFUSED + 1
    assert len(said) <= guard.MAX_REFUSED + 1 and any("more than" in line for line in said)


def test_the_guard_installed_on_hosts_is_this_module_and_needs_only_the_standard_library():
    """The source is a .py module (so mutation testing can import it); hosts still get one self-contained script
    at RANK_GUARD, run by the host's python3: nothing it imports may come from the project or a venv."""
    import ast

    from ironserve.units import RANK_GUARD
    from roles.sglang_service import BIN_SRC, HELPERS

    assert (BIN_SRC / dict((d, n) for n, d in HELPERS)[RANK_GUARD]).resolve() == GUARD
    tree = ast.parse(GUARD.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert imported and imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


# --------------------------------------------------------------------------- the leader's rules, in-process


def leader_reports(guard, world: int = 3):
    return guard.Reports(SECRET.encode(), [RANK0, RANK1, RANK2, "127.0.0.5"][:world], world)


def answer(guard, reports, peer: str, body: dict, secret: str = SECRET, state=None):
    """(status, reply JSON or None) of one report handled by the leader; the reply's MAC is checked."""
    payload, signature = signed(guard, body, secret)
    state = state or {"formed_in": "i0", "invocation": "i0"}
    status, data, reply_mac = reports.handle(peer, payload, signature, state)
    if status != 200:
        assert data == b"" and reply_mac == ""
        return status, None
    assert reply_mac == guard.mac(SECRET.encode(), b"reply", body["nonce"].encode(), data)
    return status, json.loads(data)


def test_the_leader_believes_one_signed_report_per_challenge_from_each_ranks_own_address(capsys):
    guard = guard_module()
    reports = leader_reports(guard)
    assert reports.members() == {RANK1, RANK2}
    status, first = answer(guard, reports, RANK1, report_body(False))
    assert status == 200 and first == {"accepted": False, "challenge": first["challenge"]} and first["challenge"]
    assert answer(guard, reports, RANK1, report_body(False))[1]["challenge"] == first["challenge"]  # still outstanding
    _, accepted = answer(
        guard,
        reports,
        RANK1,
        report_body(True, first["challenge"]),
        state={"formed_in": "inv-7", "invocation": "inv-7"},
    )
    assert accepted["accepted"] and accepted["formed"] is True and accepted["invocation"] == "inv-7"
    assert accepted["challenge"] != first["challenge"] and reports.latest[1][1] is True
    _, replayed = answer(guard, reports, RANK1, report_body(False, first["challenge"]))
    assert replayed == {"accepted": False, "challenge": accepted["challenge"]} and reports.latest[1][1] is True
    assert "refused a report from 127.0.0.2: rank 1: a challenge already used" in capsys.readouterr().out
    _, next_one = answer(guard, reports, RANK1, report_body(True, accepted["challenge"]))  # the genuine next
    assert next_one["accepted"] and 2 not in reports.latest
    body = {**report_body(True, next_one["challenge"]), "healthy": 1}  # only true is healthy
    assert answer(guard, reports, RANK1, body)[1]["accepted"] and reports.latest[1][1] is False


@pytest.mark.parametrize(
    ("peer", "body", "secret", "why"),
    [
        (STRANGER, report_body(True), SECRET, "not the address of a rank of this group"),
        (RANK0, report_body(True), SECRET, "not the address of a rank of this group"),  # rank 0 reports to nobody
        (RANK1, report_body(True), "cd" * 32, "bad MAC"),
        (RANK1, {"healthy": True, "nonce": "n"}, SECRET, "malformed report"),
        (RANK1, {"rank": "one", "healthy": True, "nonce": "n"}, SECRET, "malformed report"),
        (RANK1, {"rank": 1, "healthy": True}, SECRET, "malformed report"),
        (RANK1, {"rank": 1, "nonce": "n"}, SECRET, "malformed report"),
        (RANK1, {**report_body(True), "rank": 2}, SECRET, "signed as rank 2, which has another address"),
        (RANK1, {**report_body(True), "rank": 3}, SECRET, "signed as rank 3, which has another address"),
        (RANK1, {**report_body(True), "rank": 0}, SECRET, "signed as rank 0, which has another address"),
    ],
)
def test_the_leader_refuses_what_is_not_a_ranks_own_signed_report(capsys, peer, body, secret, why):
    guard = guard_module()
    reports = leader_reports(guard)
    assert answer(guard, reports, peer, body, secret) == (403, None)
    assert not reports.latest and not reports.challenges
    assert f"refused a report from {peer}: {why}" in capsys.readouterr().out


def test_a_malformed_payload_is_refused(capsys):
    guard = guard_module()
    reports = leader_reports(guard)
    for payload in (b"not json", b"[1, 2]", b"null"):
        signature = guard.mac(SECRET.encode(), b"report", payload)
        assert reports.handle(RANK1, payload, signature, {}) == (403, b"", "")
    assert capsys.readouterr().out.count("malformed report") == 1  # one journal line a minute per peer and reason


def test_a_mac_of_one_kind_of_message_is_never_valid_for_another():
    guard = guard_module()
    key = SECRET.encode()
    assert guard.mac(key, b"report", b"x") != guard.mac(key, b"reply", b"x")
    assert guard.mac(key, b"reply", b"ab", b"c") != guard.mac(key, b"reply", b"a", b"bc")
    assert guard.mac(key, b"report", b"x") == guard.mac(key, b"report", b"x") != guard.mac(b"k" * 64, b"report", b"x")
    import hashlib
    import hmac

    assert guard.mac(key, b"report", b"x") == hmac.new(key, b"report\nx\n", hashlib.sha256).hexdigest()


def test_the_group_secret_is_read_whole_and_refused_when_short(tmp_path):
    guard = guard_module()
    path = tmp_path / "key"
    path.write_text(SECRET + "\n")
    assert guard.read_secret(str(path)) == SECRET.encode()
    path.write_text("ab" * 15 + "a\n")  # 31 characters
    with pytest.raises(SystemExit, match="too short"):
        guard.read_secret(str(path))
    path.write_text("ab" * 16)
    assert guard.read_secret(str(path)) == b"ab" * 16


def test_followers_are_judged_by_their_latest_report_and_silence(monkeypatch):
    guard = guard_module()
    reports = leader_reports(guard, world=4)
    now = 1000.0
    monkeypatch.setattr(guard.time, "monotonic", lambda: now)
    formed_at, window = 990.0, 20.0
    reports.latest = {1: (995.0, True), 2: (985.0, True), 3: (979.0, False)}
    # rank 2 last reported before the group formed; rank 3 too: both count as silent only after the window
    assert guard.follower_verdicts(reports, 4, formed_at, window) == {1: "healthy", 2: "healthy", 3: "healthy"}
    now = 1011.0  # 21 s after forming
    assert guard.follower_verdicts(reports, 4, formed_at, window) == {1: "healthy", 2: "silent", 3: "silent"}
    now = 1010.0  # exactly the window: not yet
    assert guard.follower_verdicts(reports, 4, formed_at, window)[2] == "healthy"
    reports.latest = {1: (1005.0, False), 2: (990.0, True), 3: (989.0, True)}
    now = 1008.0
    assert guard.follower_verdicts(reports, 4, formed_at, window) == {
        1: "not answering /health",
        2: "healthy",
        3: "healthy",
    }
    now = 1010.5 + 20
    assert guard.follower_verdicts(reports, 4, formed_at, window) == {
        1: "silent for 26s",
        2: "silent for 40s",
        3: "silent",
    }


def test_a_follower_joins_rank0s_new_group_unless_it_formed_with_this_engine():
    step = guard_module().follow_step

    def said(invocation, formed=False, accepted=True):
        return {"accepted": accepted, "invocation": invocation, "formed": formed}

    assert step(None, said("inv-a")) == ("follow", "rank 0's engine invocation inv-a")
    assert step("inv-a", said("inv-a", formed=True)) == ("wait", "")
    # an answer that is no verified reply, or carries no invocation, changes nothing
    assert step("inv-a", said("inv-b", accepted=False)) == ("wait", "")
    assert step("inv-a", None) == ("wait", "")
    # rank 0 restarted and its group is forming: this engine is in the old one, restart it to join
    assert step("inv-a", said("inv-b")) == (
        "restart",
        "rank 0 restarted (invocation inv-a -> inv-b): joining its new group",
    )
    # rank 0 restarted and its new group already formed: only with this engine (the one rank 1 engine running
    # since this guard started), so restarting it would break the group it is in
    action, why = step("inv-a", said("inv-b", formed=True))
    assert action == "follow" and "(invocation inv-a -> inv-b) and its new group formed with this rank's engine" in why


def test_the_leader_says_formed_only_of_the_invocation_its_group_formed_in():
    """A group formed in an earlier engine invocation is no formed group of the current one (a follower reading
    "formed" keeps its engine, ironserve_rank_guard.follow_step)."""
    guard = guard_module()
    reports = leader_reports(guard, world=2)
    _, first = answer(guard, reports, RANK1, report_body(True))
    state = {"formed_in": "inv-1", "invocation": "inv-2"}
    _, reply = answer(guard, reports, RANK1, report_body(True, first["challenge"]), state=state)
    assert reply["accepted"] and reply["invocation"] == "inv-2" and reply["formed"] is False


def test_a_follower_in_rank0s_new_rendezvous_is_not_restarted_out_of_it():
    """Rank 0 restarted and its group still forms: a follower whose engine already connected to the new rank 0's
    rendezvous follows it (a restart would break the group it joins, and rank 0 would wait until its formation
    timeout); one whose engine is not in it restarts to join; one that cannot tell keeps the old rule."""
    step = guard_module().follow_step
    forming = {"accepted": True, "invocation": "inv-b", "formed": False}
    action, why = step("inv-a", forming, True)
    assert action == "follow" and why.endswith("and this rank's engine is in its rendezvous: following it")
    assert step("inv-a", forming, False)[0] == step("inv-a", forming, None)[0] == "restart"
    assert step("inv-a", {**forming, "formed": True}, False)[0] == "follow"  # formed: with this very engine
    assert step("inv-b", forming, False) == ("wait", "")


def test_in_the_rendezvous_only_when_rank0_holds_one_of_this_hosts_connections():
    in_rendezvous = guard_module().in_rendezvous
    mine = ["10.0.0.2:41000", "10.0.0.2:41002"]
    assert in_rendezvous(mine, {"rendezvous": ["10.0.0.2:41002"]}) is True
    assert in_rendezvous(mine, {"rendezvous": []}) is False  # stale: rank 0 no longer holds them
    assert in_rendezvous([], {"rendezvous": ["10.0.0.2:41002"]}) is False
    assert in_rendezvous(None, {"rendezvous": []}) is None  # this host's tables unreadable
    assert in_rendezvous(mine, {}) is None and in_rendezvous(mine, None) is None  # rank 0 could not tell
    assert in_rendezvous(mine, {"rendezvous": "10.0.0.2:41002"}) is None


def test_the_kernels_tcp_tables_name_both_ends_of_a_rendezvous_connection():
    """A real store-like connection on loopback: the follower's side names its end, rank 0's side holds it; once
    closed, neither does. Addresses of both table formats are read in the host's byte order."""
    guard = guard_module()
    assert guard._table_address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert guard._table_address("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)
    assert guard._table_address("00000000000000000000000001000000:0016") == ("::1", 22)
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen()
        rendezvous = f"127.0.0.1:{store.getsockname()[1]}"
        client = socket.create_connection(store.getsockname())
        held, _ = store.accept()
        mine = guard.rendezvous_connections(rendezvous)
        assert mine == [f"127.0.0.1:{client.getsockname()[1]}"]
        assert guard.rendezvous_peers(rendezvous, mine + ["127.0.0.1:1"]) == mine
        client.close()
        held.close()
        assert guard.rendezvous_connections(rendezvous) == [] and guard.rendezvous_peers(rendezvous, mine) == []
    assert guard.established(("/nonexistent/tcp",)) is None


def test_the_leaders_reply_names_the_followers_connections_its_rendezvous_holds(monkeypatch):
    guard = guard_module()
    reports = leader_reports(guard, world=2)
    monkeypatch.setattr(
        guard,
        "established",
        lambda: [
            (("10.0.0.1", 5000), ("127.0.0.2", 41000)),
            (("10.0.0.1", 5000), ("127.0.0.3", 41001)),
            (("10.0.0.1", 22), ("127.0.0.2", 41002)),
        ],
    )
    state = {"formed_in": None, "invocation": "inv-2", "rendezvous": "10.0.0.1:5000"}
    _, first = answer(guard, reports, RANK1, report_body(True))
    assert "rendezvous" not in first  # nothing for a report it did not accept
    body = {**report_body(True, first["challenge"]), "rendezvous": ["127.0.0.2:41000", "127.0.0.2:41002"]}
    _, reply = answer(guard, reports, RANK1, body, state=state)
    assert reply["accepted"] and reply["rendezvous"] == ["127.0.0.2:41000"] and reply["formed"] is False


def test_the_probe_tells_a_server_that_takes_the_connection_from_none_listening():
    """Rank 0's HTTP server up (SGLang starts it once every rank joined) is the group formed, whatever it answers;
    nothing listening is a group still forming."""
    guard = guard_module()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert guard.http_status(f"http://127.0.0.1:{silent.getsockname()[1]}/health", timeout=0.3) == 0
    assert guard.http_status(f"http://127.0.0.1:{free_port()}/health", timeout=0.3) is None
    health = Health()
    health.code = 503
    assert guard.http_status(health.url) == 503


def test_each_journal_line_leaves_the_guard_as_it_is_logged(monkeypatch):
    """Under systemd the guard's stdout is a pipe, which Python buffers by blocks: a decision logged must reach the
    journal at once, not when a buffer fills (a group restarted and nothing said of it)."""
    guard = guard_module()
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    pipe = os.fdopen(write_end, "w", buffering=1 << 16)  # block-buffered, as a pipe is for python3 under systemd
    try:
        monkeypatch.setattr(sys, "stdout", pipe)
        guard.log("restarting the group (1 within 1800s): rank 1 silent")
        assert os.read(read_end, 4096) == b"restarting the group (1 within 1800s): rank 1 silent\n"
    finally:
        monkeypatch.undo()
        pipe.close()
        os.close(read_end)


def test_a_follower_records_the_group_it_follows_where_the_deploy_reads_it(tmp_path, monkeypatch):
    """The config the deploy writes names no state directory: the record goes to the guard's own, the directory
    units.following_path reads (the launch's check that a rank joined rank 0's group)."""
    from ironserve.units import RANK_GROUP_STATE_DIR, following_path

    guard = guard_module()
    assert guard.STATE_DIR == RANK_GROUP_STATE_DIR
    monkeypatch.setattr(guard, "STATE_DIR", str(tmp_path / "rank-groups"))
    monkeypatch.setattr(guard, "invocation", lambda unit: f"{unit}-engine-inv")
    unit = "sglang-tiny-cpu-tp2-server"
    guard.record_following({"unit": unit, "rank": 1}, "rank0-inv")
    recorded = tmp_path / "rank-groups" / following_path(unit).rsplit("/", 1)[1]
    assert json.loads(recorded.read_text()) == {
        "leader_invocation": "rank0-inv",
        "engine_invocation": f"{unit}-engine-inv",
    }
    assert [p.name for p in (tmp_path / "rank-groups").iterdir()] == [recorded.name]  # no temporary file left


def test_rank0s_rendezvous_named_by_a_host_name_is_resolved_whatever_its_letters(monkeypatch):
    """--dist-init-addr may name rank 0's host (the hosts' resolver answers for it): brackets are an IPv6
    address's only, and nothing else of the name is dropped before it is resolved."""
    guard = guard_module()
    hosts = {"NODEX": "10.0.0.7", "Xnode": "10.0.0.8", "node0": "10.0.0.9"}

    def resolver(name, port, *args, **kwargs):
        if name not in hosts:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (hosts[name], 0))]

    monkeypatch.setattr(guard.socket, "getaddrinfo", resolver)
    assert guard.rendezvous_endpoint("NODEX:29500") == ({"10.0.0.7"}, 29500)
    assert guard.rendezvous_endpoint("Xnode:29501") == ({"10.0.0.8"}, 29501)
    assert guard.rendezvous_endpoint("[node0]:29502") == ({"10.0.0.9"}, 29502)


def test_a_probe_and_a_report_wait_at_most_5s_for_an_answer(monkeypatch):
    """The guards poll every 5 s: neither rank 0's health probe nor a follower's report waits longer than that for
    an answer (the timeouts the sockets are given, the engine and the leader answering here at once)."""
    guard = guard_module()
    timeouts: list[float | None] = []

    class Socket(socket.socket):
        def settimeout(self, value):
            timeouts.append(value)
            super().settimeout(value)

    health = Health()
    monkeypatch.setattr(guard.socket, "socket", Socket)
    assert guard.http_status(health.url) == 200
    assert timeouts == [5.0]
    monkeypatch.undo()

    connect = socket.create_connection

    def create_connection(address, timeout=None, source_address=None, **kwargs):
        timeouts.append(timeout)
        return connect(address, timeout, source_address, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    with socket.socket() as leader:
        leader.bind((RANK0, 0))
        leader.listen()
        cfg = {"leader": RANK0, "guard_port": leader.getsockname()[1], "source": RANK1}

        def answer():
            conn, _ = leader.accept()
            conn.recv(4096)
            conn.sendall(b"HTTP/1.0 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            conn.close()

        server = threading.Thread(target=answer)
        server.start()
        assert guard.report(cfg, SECRET.encode(), {"rank": 1, "nonce": "n"}) is None
        server.join(5)
    assert timeouts[1:] == [5.0]
