"""files/bin/ironserve-rank-guard, run for real on this machine: a leader and a follower process talking HTTP on
loopback, a stand-in `systemctl` on PATH (records calls, answers InvocationID from a file) and a stand-in engine
/health per rank. Checks the decisions that make a multi-node group restart as a whole."""

from __future__ import annotations

import json
import os
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

GUARD = Path(__file__).resolve().parent.parent / "files" / "bin" / "ironserve-rank-guard"


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
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'case "$*" in *InvocationID*) cat "$INVOCATION_FILE" 2>/dev/null;; esac\n')
    (bin_dir / "systemctl").chmod(0o755)
    procs: list[subprocess.Popen] = []

    def start(config: dict, invocation: str) -> tuple[subprocess.Popen, Path]:
        name = f"rank{config['rank']}"
        inv = tmp_path / f"{name}.invocation"
        inv.write_text(invocation + "\n")
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "INVOCATION_FILE": str(inv),
               "PYTHONUNBUFFERED": "1"}
        log = open(tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen([sys.executable, str(GUARD), str(path)], env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc, inv

    yield start, calls, tmp_path
    for proc in procs:
        proc.kill()
        proc.wait()


def base_config(rank: int, port: int, health_url: str, state_dir: Path) -> dict:
    return {"unit": f"engine{rank}", "rank": rank, "world": 2, "guard_port": port,
            "leader_url": f"http://127.0.0.1:{port}/group", "health_url": health_url, "poll_s": 0.2,
            "failure_threshold": 3, "formation_timeout_s": 30, "backoff_base_s": 0, "backoff_max_s": 0,
            "backoff_window_s": 60, "state_dir": str(state_dir / "state")}


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
    assert "kill --signal=SIGKILL engine0.service" in calls_of(calls)
    assert "rank 1 not answering /health" in (tmp / "rank0.log").read_text()
    # rank 0 came back (new invocation): the follower restarts its own engine to join the new group
    leader.kill()
    inv0.write_text("inv-b\n")
    h1.code = 200
    start(base_config(0, port, h0.url, tmp) | {"unit": "engine0"}, "inv-b")
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
    leader_alone(start, tmp, 503, formation_timeout_s=1)
    assert restart_asked(calls, "engine0")
    assert "did not form within 1s" in (tmp / "rank0.log").read_text()


def test_guard_config_from_the_render():
    procs = [Process(host=f"n{i}", address=f"10.0.0.{i + 1}", role="decode", node_rank=i, group=1, instance=0,
                     nnodes=2, port=30001, serves_http=i == 0, unit="sglang-r-decode",
                     argv=["python3", "-m", "sglang.launch_server", "--host", "0.0.0.0", "--port", "30001",
                           "--dist-init-addr", "10.0.0.1:5000", "--nnodes", "2", "--node-rank", str(i)], env={},
                     launcher=["python3", "-m", "sglang.launch_server"], bind="0.0.0.0", dist_init_addr="10.0.0.1",
                     dist_init_port=5000, head="n0")
             for i in range(2)]
    from ironserve.catalogue import get_recipe

    recipe = get_recipe("tiny-cpu-tp2")
    files = rank_guard_files(recipe, procs[1], procs)
    config = json.loads(files.config_text)
    assert config["leader_url"] == f"http://10.0.0.1:{5000 + RANK_GUARD_PORT_OFFSET}/group"
    assert config["health_url"] == "http://127.0.0.1:30001/health"  # its own port, probed on its own host
    assert config["rank"] == 1 and config["world"] == 2
    # the deploy's gate and rollback decide about a new group before the guard gives up on it: never a race
    from ironserve.units import RANK_FOLLOW_S

    assert config["formation_timeout_s"] >= recipe.health_timeout_s + RANK_FOLLOW_S + 60
    assert files.unit_name == "sglang-r-decode-rank-guard.service"
    assert "BindsTo=sglang-r-decode.service" in files.unit_text
    assert "PartOf=sglang-r-decode.service" in files.unit_text


def test_group_restarts_back_off_exponentially_within_the_window(tmp_path):
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("rank_guard", str(GUARD))
    spec = importlib.util.spec_from_loader("rank_guard", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    backoff = module.Backoff("u", base=15, limit=600, window=1800, state_dir=str(tmp_path))
    delays = []
    for _ in range(8):
        delays.append(backoff.delay())
        backoff.record()
    assert delays == [0, 15, 30, 60, 120, 240, 480, 600]
    # the record survives the guard's own restart (a new process reads the same state file)
    assert module.Backoff("u", 15, 600, 1800, str(tmp_path)).delay() == 600
    assert module.Backoff("u", 15, 600, 0, str(tmp_path)).delay() == 0  # outside the window: no wait
