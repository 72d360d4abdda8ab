"""The rank guard's "only reports from the ranks' own addresses" with 3 ranks, where it means more than "from a
member's address": the real guard (files/bin/ironserve_rank_guard.py) leads a group of 3 on loopback (rank 0 at
127.0.0.1, rank 1 sending from 127.0.0.2, rank 2 from 127.0.0.3). A member holding the group's secret cannot
speak for another rank: rank 1's address signing as rank 2 is refused, cannot hide rank 2's death, and cannot
make the leader restart a healthy group."""

from __future__ import annotations

import json
import secrets
import time

from tests.test_rank_guard import (  # noqa: F401 (guard_env is a fixture)
    RANK0,
    RANK1,
    Health,
    calls_of,
    free_port,
    guard_env,
    guard_module,
    post,
    restart_asked,
    signed,
    wait_for,
)

RANK2 = "127.0.0.3"
MEMBERS = [RANK0, RANK1, RANK2]


def config(rank: int, port: int, health_url: str, state_dir) -> dict:
    """A guard of the 3-rank group (polls at 0.5 s: reports from loaded machines stay in time)."""
    secret = state_dir / "group.key"
    if not secret.exists():
        secret.write_text("ab" * 32 + "\n")
        secret.chmod(0o600)
    base = {
        "unit": f"engine{rank}",
        "rank": rank,
        "world": 3,
        "guard_port": port,
        "leader": RANK0,
        "members": MEMBERS,
        "secret_file": str(secret),
        "health_url": health_url,
        "poll_s": 0.5,
        "failure_threshold": 3,
        "formation_timeout_s": 30,
        "backoff_base_s": 0,
        "backoff_max_s": 0,
        "backoff_window_s": 60,
        "state_dir": str(state_dir / "state"),
    }
    return base | ({"bind": RANK0} if rank == 0 else {"source": MEMBERS[rank]})


def as_rank2(healthy: bool, challenge: str = "") -> dict:
    return {"rank": 2, "healthy": healthy, "nonce": secrets.token_hex(16), "challenge": challenge}


def no_restart(calls) -> bool:
    return not [c for c in calls_of(calls) if "restart" in c or "kill" in c]


def test_three_ranks_form_and_a_member_cannot_report_for_another_rank(guard_env):
    guard = guard_module()
    start, calls, tmp = guard_env
    port = free_port()
    health = [Health(), Health(), Health()]
    for rank in range(3):
        start(config(rank, port, health[rank].url, tmp), f"inv-{rank}")
    assert wait_for(lambda: "group formed" in (tmp / "rank0.log").read_text())
    # rank 1's address, with the group's secret, says rank 2 is unhealthy: refused every time, nothing restarted
    end = time.monotonic() + 2.5
    statuses = []
    while time.monotonic() < end:
        statuses.append(post(port, *signed(guard, as_rank2(False)), RANK1)[0])
        time.sleep(0.05)
    assert set(statuses) == {403}
    assert no_restart(calls), calls_of(calls)
    assert (
        f"refused a report from {RANK1}: signed as rank 2, which has another address" in (tmp / "rank0.log").read_text()
    )
    # rank 2's own reports count: its engine hangs, the group restarts
    health[2].code = 503
    assert restart_asked(calls, "engine0")
    assert "rank 2 not answering /health" in (tmp / "rank0.log").read_text()


def test_a_member_cannot_hide_a_dead_rank_by_reporting_it_healthy(guard_env):
    guard = guard_module()
    start, calls, tmp = guard_env
    port = free_port()
    health = [Health(), Health()]
    # rank 0's engine answers /health (the group formed), then rank 2 died: its guard never reports
    start(config(0, port, health[0].url, tmp), "inv-0")
    start(config(1, port, health[1].url, tmp), "inv-1")
    assert wait_for(lambda: "group formed" in (tmp / "rank0.log").read_text())
    replies = []
    end = time.monotonic() + 8
    while time.monotonic() < end and not any(c.startswith("--no-block restart engine0") for c in calls_of(calls)):
        status, _, body = post(port, *signed(guard, as_rank2(True)), RANK1)
        replies.append(status)
        if status == 200:  # a challenge for rank 2, handed to rank 1's address, would let it speak for rank 2
            challenge = json.loads(body)["challenge"]
            replies.append(post(port, *signed(guard, as_rank2(True, challenge)), RANK1)[0])
        time.sleep(0.05)
    assert restart_asked(calls, "engine0")
    assert replies and set(replies) == {403}
    leader_log = (tmp / "rank0.log").read_text()
    assert "rank 2 silent" in leader_log and "rank 1 silent" not in leader_log
    assert f"refused a report from {RANK1}: signed as rank 2, which has another address" in leader_log
