"""roles/weights_peers.py's Distribution: which host of a run reads the hub and which peer each other host fetches
from, run in gevent greenlets as pyinfra runs one operation on every host, with a stand-in runner that takes time
and records what runs where (the helper itself: tests/test_weights_peer.py; on hosts: tests/e2e/cpu3)."""

from __future__ import annotations

import gevent
import pytest

from roles import weights_peers as wp


class Runner:
    """Does what the helper would, taking ``seconds`` per transfer; records every step."""

    def __init__(self, seconds: float = 0.05, fail: set[str] = frozenset(), unusable: set[str] = frozenset()):
        self.seconds, self.fail, self.unusable = seconds, set(fail), set(unusable)
        self.log: list[tuple] = []
        self.active: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.lending: set[str] = set()

    def usable(self, member):
        return member.name not in self.unusable

    def download(self, member):
        self.log.append(("hub", member.name))
        gevent.sleep(self.seconds)
        return f"hub:{member.name}" not in self.fail

    def lend(self, source, members):
        self.log.append(("lend", source.name, tuple(members)))
        if f"lend:{source.name}" in self.fail:
            return False
        self.lending.add(source.name)
        return True

    def stop(self, source):
        self.log.append(("stop", source.name))
        self.lending.discard(source.name)

    def fetch(self, member, source):
        assert source.name in self.lending, f"{member.name} fetched from {source.name}, which was not lending"
        self.active[source.name] = self.active.get(source.name, 0) + 1
        self.most[source.name] = max(self.most.get(source.name, 0), self.active[source.name])
        self.log.append(("fetch", member.name, source.name))
        gevent.sleep(self.seconds)
        self.active[source.name] -= 1
        return f"fetch:{member.name}" not in self.fail

    def say(self, member, text, error=False):
        self.log.append(("say", member.name, text))

    @staticmethod
    def sleep(seconds):
        gevent.sleep(min(seconds, 0.01))


def distribution(n: int, complete: set[str] = frozenset(), fanout: int = 2, peers: bool = True) -> wp.Distribution:
    dist = wp.Distribution(fanout, peers=peers)
    for i in range(1, n + 1):
        name = f"h{i}"
        dist.add(wp.Member(name, f"10.0.0.{i}", {}, {}, {"path": "/m"}, rank=i), name in complete)
    return dist


def run_all(dist: wp.Distribution, runner: Runner) -> dict[str, bool]:
    """Every host's weights operation at once, as pyinfra executes one operation on all hosts."""
    jobs = {name: gevent.spawn(dist.obtain, runner, name) for name in dist.members}
    gevent.joinall(list(jobs.values()), timeout=30, raise_error=True)
    return {name: job.value for name, job in jobs.items()}


def steps(runner: Runner, kind: str) -> list[tuple]:
    return [entry for entry in runner.log if entry[0] == kind]


def test_one_host_reads_the_hub_and_the_others_fetch_from_peers_in_a_growing_tree():
    dist, runner = distribution(8, fanout=2), Runner()
    assert run_all(dist, runner) == {f"h{i}": True for i in range(1, 9)}
    assert steps(runner, "hub") == [("hub", "h1")]  # the hub is read once, by the first host
    fetched = steps(runner, "fetch")
    assert sorted(m for _, m, _ in fetched) == [f"h{i}" for i in range(2, 9)]
    assert max(runner.most.values()) <= 2  # never more than the fan-out from one source
    assert {s for _, _, s in fetched} - {"h1"}, "hosts that fetched never lent to the ones still waiting"
    assert not runner.lending  # every lending unit stopped once no host waits
    assert all(m.state == "ready" for m in dist.members.values())


def test_the_first_engine_host_reads_the_hub_whatever_order_the_hosts_were_planned_in():
    dist = wp.Distribution(2)
    for i in (3, 1, 2):  # pyinfra plans the hosts in an order of its own
        dist.add(wp.Member(f"h{i}", f"10.0.0.{i}", {}, {}, {"path": "/m"}, rank=i - 1), False)
    runner = Runner()
    assert all(run_all(dist, runner).values())
    assert steps(runner, "hub") == [("hub", "h1")]


def test_a_host_with_verified_weights_is_the_source_and_the_hub_is_not_read():
    dist, runner = distribution(3, complete={"h2"}), Runner()
    assert all(run_all(dist, runner).values())
    assert steps(runner, "hub") == [] and {s for _, _, s in steps(runner, "fetch")} == {"h2"}
    lend = steps(runner, "lend")[0]
    assert lend[:2] == ("lend", "h2") and set(lend[2]) == {"10.0.0.1", "10.0.0.3"}  # the run's members only


def test_a_rerun_with_every_host_complete_runs_nothing():
    dist, runner = distribution(3, complete={"h1", "h2", "h3"}), Runner()
    assert all(run_all(dist, runner).values()) and runner.log == []


def test_when_the_hub_download_fails_the_waiting_hosts_fail_rather_than_wait_forever():
    dist, runner = distribution(4), Runner(fail={"hub:h1"})
    assert run_all(dist, runner) == {"h1": False, "h2": False, "h3": False, "h4": False}
    assert steps(runner, "hub") == [("hub", "h1")] and steps(runner, "fetch") == []  # the hub is not read again
    said = [text for _, name, text in steps(runner, "say") if name == "h2"]
    assert any("nothing to fetch from" in text for text in said)


def test_a_host_that_failed_before_the_weights_is_neither_the_hub_reader_nor_a_source():
    dist, runner = distribution(3, complete={"h1"}), Runner(unusable={"h1"})
    result = run_all(dist, runner)
    assert steps(runner, "hub") == [("hub", "h2")] and result["h3"] is True
    assert {s for _, _, s in steps(runner, "fetch")} == {"h2"}


def test_a_source_whose_lending_unit_fails_is_not_tried_again():
    dist, runner = distribution(4, complete={"h1", "h2"}, fanout=1), Runner(fail={"lend:h1"})
    result = run_all(dist, runner)
    assert [s[1] for s in steps(runner, "lend")].count("h1") == 1
    assert sorted(result.values()).count(True) >= 3 and {s for _, _, s in steps(runner, "fetch")} == {"h2"}


def test_a_failed_fetch_fails_that_host_only():
    dist, runner = distribution(4, fanout=1), Runner(fail={"fetch:h2"})
    result = run_all(dist, runner)
    assert result["h2"] is False and result["h1"] and result["h3"] and result["h4"]
    assert "h2" not in {s for _, _, s in steps(runner, "fetch")}


def test_without_peers_every_host_reads_the_hub():
    dist, runner = distribution(3, peers=False), Runner()
    assert all(run_all(dist, runner).values())
    assert sorted(steps(runner, "hub")) == [("hub", "h1"), ("hub", "h2"), ("hub", "h3")]


@pytest.mark.parametrize("members", [["10.0.0.2", "10.0.0.3"], ["node-b", "10.0.0.3"]])
def test_the_lending_unit_is_bounded_and_allows_only_the_members(members):
    command = wp.lend_command("/m", "10.0.0.1", 8790, "/etc/ironserve/k", members, 2)
    assert "--property=RuntimeMaxSec=" in command and "--property=Type=notify" in command
    assert "--members 10.0.0.2,10.0.0.3" in command or "--members node-b,10.0.0.3" in command
    if members[0][0].isdigit():
        assert "'--property=IPAddressAllow=10.0.0.2 10.0.0.3'" in command and "IPAddressDeny=any" in command
    else:  # a name cannot go into IPAddressAllow=: the helper's own check at accept stands alone
        assert "IPAddressAllow" not in command
