"""The audit's batched reads: a typical host (systemd, Debian family) is read in one round trip, and a host unlike
that guess costs one more round, never a wrong result (every check is evaluated again on the real answers)."""

from __future__ import annotations

import testinfra.host
from testinfra.backend.base import BaseBackend

from ironserve import batch
from ironserve.audit.checks import Check
from ironserve.audit.evaluate import evaluate
from ironserve.audit.snapshot import HostSnapshot

UNIT = "sglang-tiny-server.service"
CHECKS = [
    Check("h", "package:nvidia-open-580", "package", "580.82.07-1", {"name": "nvidia-open-580"}),
    Check("h", f"unit-enabled:{UNIT}", "service_enabled", True, {"name": UNIT}),
    Check("h", f"unit-active:{UNIT}", "service_active", True, {"name": UNIT}),
    Check("h", "listening:30000", "listening", True, {"port": 30000}),
    Check("h", "sysctl:vm.swappiness", "sysctl", "0", {"key": "vm.swappiness"}),
    Check("h", "file:x.conf", "file", "ab" * 32, {"path": "/etc/x.conf", "mode": 0o644, "owner": "root"}),
    Check("h", "env:x.env", "env_file", "A=1\n", {"path": "/etc/x.env", "mode": 0o600}),
]
COMMON = {
    "uname -s": "Linux",
    "uname -m": "x86_64",
    "command -v command": "command",
    "command -v ss": "/usr/bin/ss",
    "/usr/bin/ss --numeric --listening": "Netid State Recv-Q Send-Q Local Address:Port Peer Address:Port\ntcp LISTEN 0 128 10.0.0.2:30000 0.0.0.0:*",
    "test -d /run/systemd/system/": "",
    "command -v systemctl": "/usr/bin/systemctl",
    f"systemctl is-active {UNIT}": "active",
    f"systemctl is-enabled {UNIT}": "enabled",
    "test -e /proc/sys/vm/swappiness": "",
    "sysctl -n vm.swappiness": "0",
    "test -e /etc/x.conf": "",
    "sha256sum /etc/x.conf | cut -d ' ' -f 1": "ab" * 32,
    "stat -Lc %a /etc/x.conf": "644",
    "stat -Lc %U /etc/x.conf": "root",
    "test -e /etc/x.env": "",
    "stat -Lc %a /etc/x.env": "600",
    "cat -- /etc/x.env": "A=1",
}
DEBIAN = {
    **COMMON,
    "cat /etc/os-release": 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"',
    "command -v dpkg-query": "/usr/bin/dpkg-query",
    "dpkg-query -f '${Status}' -W nvidia-open-580": "install ok installed",
    "dpkg-query -f '${Status} ${Version}' -W nvidia-open-580": "install ok installed 580.82.07-1",
}
RHEL = {
    **COMMON,
    "cat /etc/os-release": 'ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.4"',
    "command -v rpm": "/usr/bin/rpm",
    "rpm -q --quiet nvidia-open-580 2>&1": "",
    'rpm -q --queryformat="%{VERSION}" nvidia-open-580': "580.82.07-1",
}


class FakeHost(BaseBackend):
    """A host answering from a table (rc 1 and nothing for what it does not have), counting what it was asked."""

    NAME = "fake"

    def __init__(self, table: dict[str, str]):
        super().__init__("fake")
        self.table, self.asked = table, []

    def answer(self, cmd: str) -> batch.Answer:
        self.asked.append(cmd)
        out = self.table.get(cmd)
        return batch.Answer(1, ()) if out is None else batch.Answer(0, tuple(out.splitlines()))

    def run(self, command, *args, **kwargs):
        cmd = self.quote(command, *args)
        a = self.answer(cmd)
        return self.result(a.rc, self.encode(cmd), a.stdout, "")


class Snapshot(HostSnapshot):
    """HostSnapshot over a FakeHost: each batch answered command by command, as the batched read splits them."""

    def __init__(self, fake: FakeHost):
        super().__init__("fake://")
        self.fake = fake

    @property
    def real(self):
        return self.fake

    def _read(self, commands):
        self.batches += 1
        self.answers.update({cmd: self.fake.answer(cmd) for cmd in commands})


def alone(table):
    host = testinfra.host.Host(FakeHost(table))
    host.backend.set_host(host)
    return [evaluate(host, c) for c in CHECKS]


def read(table):
    snap = Snapshot(FakeHost(table)).read(CHECKS, evaluate)
    host = snap.host()
    return snap, [evaluate(host, c) for c in CHECKS]


def test_a_systemd_debian_host_is_read_in_one_round_trip():
    snap, results = read(DEBIAN)
    assert snap.error is None and snap.commands == 1
    assert results == alone(DEBIAN) and all(ok for ok, _ in results), results


def test_a_host_unlike_the_guess_costs_a_round_never_a_wrong_result():
    snap, results = read(RHEL)
    assert snap.error is None and snap.batches == 2 and snap.commands == 2
    assert results == alone(RHEL) and all(ok for ok, _ in results), results
    # a Debian host whose package is missing reads as missing, guessed or not
    missing = {k: v for k, v in DEBIAN.items() if not k.startswith("dpkg-query")}
    assert read(missing)[1][0] == alone(missing)[0] and not alone(missing)[0][0]


def _counting(seen: list):
    """evaluate, each check it is asked noted in ``seen``."""
    return lambda host, check: seen.append(check) or evaluate(host, check)


def test_the_plans_first_batch_is_the_batch_the_read_would_have_sent():
    from ironserve.audit.snapshot import first_questions

    for table in (DEBIAN, RHEL):
        plain, seeded = Snapshot(FakeHost(table)), Snapshot(FakeHost(table))
        plain_evaluated, seeded_evaluated = [], []
        plain.read(CHECKS, _counting(plain_evaluated))
        seeded.read(CHECKS, _counting(seeded_evaluated), first_questions(CHECKS, evaluate))
        assert seeded.fake.asked == plain.fake.asked and seeded.batches == plain.batches
        assert len(plain_evaluated) - len(seeded_evaluated) == len(CHECKS)  # the first recording was the plan's
        assert [evaluate(seeded.host(), c) for c in CHECKS] == alone(table)
    # a first batch that misses questions (a plan of other guesses) costs a round, never an answer
    seeded = Snapshot(FakeHost(DEBIAN))
    seeded.read(CHECKS, evaluate, first_questions(CHECKS, evaluate)[:2])
    assert seeded.batches == 2 and [evaluate(seeded.host(), c) for c in CHECKS] == alone(DEBIAN)
