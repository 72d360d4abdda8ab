"""Weights once per deployment: one host of a run reads the hub, every other host fetches from a peer.

With ``model_source: hub`` on several hosts without a shared filesystem, each host downloading on its own costs N
copies of the hub's (or the site mirror's) egress, and the slowest host sets the time to serving. Here, for the
hosts of one run that need one model:

- a host whose weights are complete and verified is a source from the start; when none is, the first host of the
  run (inventory order) lacking them downloads from the hub (``hf download`` of the runtime, pinned to the commit
  the hub names, every file then checked against the hub's hashes: files/bin/ironserve_weights_peer.py). One host
  reads everything, rather than each host a share of the files: the hub's link is the bottleneck either way (the
  cluster network is 10-100x faster), one downloader keeps `hf download`'s own resume and mirror handling, and no
  host depends on all the others being up;
- every other host fetches from a source over HTTP on the cluster network: the source lends its verified model
  directory with the same helper, as a transient systemd unit started for the fetch and stopped once no host of the
  run is waiting (it also exits by itself when idle, and RuntimeMaxSec= bounds it), bound to its cluster address,
  taking only the run's member addresses (IPAddressAllow=, and checked at accept before reading), each request
  signed with the deployment's secret (0600 root on each host, generated once on the controller like a rank
  group's: roles/secret_file.py);
- fan-out is bounded: a source serves at most ``weights_peer_fanout`` peers at once; a host that fetched and
  verified becomes a source for the ones still waiting (a tree: the hosts holding the weights grow (1+F)-fold per
  round);
- every file lands only with the hub's hash (the manifest the downloading host recorded from the hub's API); an
  interrupted fetch resumes from its partial files (HTTP Range), an interrupted download where `hf download`
  left it: a rerun finishes. Progress lines (bytes, rate, ETA) come live in the deploy's output.

What this run needs is known only once every host is planned (pyinfra plans host after host), so the decision is
made when the weights operation executes (``obtain``, a FunctionCommand): each host's planning records whether its
weights were complete (``Distribution.add``), and the hosts' operations, which pyinfra executes in parallel, share
one ``Distribution`` per model and path (kept on pyinfra's state): a host waits for a source, the controller starts
and stops the sources' lending units over its own SSH connections. A host whose weights are complete plans nothing
(a rerun is a no-op); a host that fails before the weights stage is never a source.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass, field

import gevent
from gevent.lock import Semaphore

from ironserve.units import ETC_DIR, WEIGHTS_PEER
from roles.common import pushed, uses_sudo

WAIT_SAY_S = 30  # a host waiting for a source says so this often
LEND_MAX_S = 24 * 3600  # the lending unit's RuntimeMaxSec=: a killed deploy leaves no listener for long
LEND_IDLE_S = 300  # the lending unit exits after this long without a request
PROGRESS_S = 10


def unit_name(path: str) -> str:
    return f"ironserve-weights-peer-{hashlib.sha256(path.encode()).hexdigest()[:12]}"


def secret_name(repo: str, head_address: str) -> str:
    """The deployment's secret, by the model and its first engine host's address: the controller's name for it,
    and its file's on the hosts (another recipe of the same model on the same hosts keeps it)."""
    digest = hashlib.sha256(f"{repo} {head_address}".encode()).hexdigest()[:12]
    return f"weights-peers-{digest}"


def secret_path(name: str) -> str:
    return f"{ETC_DIR}/{name}.key"


def helper_command(mode: str, config: dict) -> str:
    """The helper run on a host: its config is JSON on its command line (paths and addresses, never a secret)."""
    return shlex.join((WEIGHTS_PEER, mode, json.dumps(config, sort_keys=True)))


def lend_command(path: str, bind: str, port: int, secret: str, members: list[str], fanout: int) -> str:
    """Start the lending unit of ``path`` on a source (a transient systemd unit, Type=notify: the command returns
    once it listens); a unit left by an earlier run is replaced."""
    unit = shlex.quote(f"{unit_name(path)}.service")
    props = [
        "Type=notify",
        f"RuntimeMaxSec={LEND_MAX_S}",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "LimitNOFILE=256",
    ]
    allowed = _ip_addresses(members)
    if allowed:  # names (not addresses) cannot go into IPAddressAllow=: the helper checks them at accept
        props += ["IPAddressDeny=any", f"IPAddressAllow={' '.join(allowed)}"]
    argv = [WEIGHTS_PEER, "serve", "--bind", bind, "--port", str(port), "--root", path, "--secret-file", secret]
    argv += ["--members", ",".join(members), "--max-peers", str(fanout), "--idle-exit", str(LEND_IDLE_S)]
    run = ["systemd-run", "--quiet", "--collect", f"--unit={unit_name(path)}"]
    run += [f"--property={p}" for p in props]
    stop = f"systemctl stop {unit} 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null; "
    journal = f"journalctl -u {unit} -n 20 --no-pager -o cat >&2"
    return f"{stop}{shlex.join(run + argv)} || {{ {journal}; exit 1; }}"


def stop_command(path: str) -> str:
    return f"systemctl stop {shlex.quote(unit_name(path) + '.service')} 2>/dev/null; true"


def _ip_addresses(members: list[str]) -> list[str]:
    import ipaddress

    try:
        return sorted({str(ipaddress.ip_address(m)) for m in members})
    except ValueError:
        return []


# --------------------------------------------------------------------------- who gets the weights from where


@dataclass
class Member:
    """One host of the run that needs the weights: its cluster address and its helper configs (built while
    planning), and where it stands while the run executes."""

    name: str
    address: str
    download: dict
    fetch: dict
    lend: dict
    rank: int = (
        0  # its place among the deployment's engine hosts (inventory order): the first lacking one reads the hub
    )
    state: str = "lacking"  # ready (complete, verified) | lacking | obtaining | failed
    peers: int = 0  # the peers it lends to now
    lending: bool = False
    lendable: bool = True  # False once its lending unit failed to start
    lock: Semaphore = field(default_factory=Semaphore)


class Distribution:
    """The hosts of one run that need one model at one path, and where each gets its weights from."""

    def __init__(self, fanout: int, peers: bool = True):
        self.fanout, self.peers = max(1, fanout), peers
        self.members: dict[str, Member] = {}
        self.hub: str | None = None
        self.hub_decided = False

    def add(self, member: Member, complete: bool) -> None:
        member.state = "ready" if complete else "lacking"
        self.members[member.name] = member

    def mark_ready(self, name: str) -> None:
        if name in self.members:
            self.members[name].state = "ready"

    def hub_host(self, runner) -> str | None:
        """The one host that reads the hub (decided once): none when a host of the run has the weights."""
        if not self.hub_decided:
            self.hub_decided = True
            # by rank, not by the order the hosts were planned in (pyinfra's, which varies from run to run)
            usable = sorted((m for m in self.members.values() if runner.usable(m)), key=lambda m: m.rank)
            if not any(m.state == "ready" for m in usable):
                self.hub = next((m.name for m in usable if m.state != "ready"), None)
        return self.hub

    def obtain(self, runner, name: str) -> bool:
        """Execution of one host's weights operation: from the hub (the one host that reads it, or every host
        without peers), else from a source as soon as one has room."""
        me = self.members[name]
        if me.state == "ready":
            return True
        try:
            if not self.peers or self.hub_host(runner) == name:
                me.state = "obtaining"
                me.state = "ready" if runner.download(me) else "failed"
                return me.state == "ready"
            source = self._source(runner, me)
            if source is None:
                me.state = "failed"
                return False
            return self._fetch(runner, me, source)
        finally:
            self._stop_idle(runner)

    def _source(self, runner, me: Member) -> Member | None:
        """The source with the most room (the earliest in inventory order on a tie), reserved for ``me``; None when
        no host of the run has or will have the weights."""
        waited, said = time.monotonic(), time.monotonic()
        while True:
            usable = [m for m in self.members.values() if runner.usable(m)]
            free = [m for m in usable if m.state == "ready" and m.lendable and m.peers < self.fanout]
            if free:
                source = min(free, key=lambda m: m.peers)
                source.peers += 1
                return source
            coming = [m for m in usable if m.state == "obtaining" or (m.name == self.hub and m.state == "lacking")]
            if not coming and not any(m.state == "ready" and m.lendable for m in usable):
                runner.say(
                    me,
                    "weights: no host of this run has them or is getting them (the hub download or "
                    "every source failed): nothing to fetch from",
                    error=True,
                )
                return None
            if time.monotonic() - said >= WAIT_SAY_S:
                said = time.monotonic()
                busy = ", ".join(f"{m.name} ({m.state})" for m in usable if m.state in ("ready", "obtaining"))
                runner.say(me, f"weights: waiting {said - waited:.0f}s for a peer with room ({busy or 'none yet'})")
            runner.sleep(0.5)

    def _fetch(self, runner, me: Member, source: Member) -> bool:
        me.state = "obtaining"
        started = time.monotonic()
        try:
            ok = self._lending(runner, source) and runner.fetch(me, source)
        finally:
            source.peers -= 1
        me.state = "ready" if ok else "failed"
        if ok:
            runner.say(me, f"weights: fetched from {source.name} in {time.monotonic() - started:.1f}s")
        return ok

    def _lending(self, runner, source: Member) -> bool:
        """The source's lending unit runs (started once, by whichever host asks first)."""
        with source.lock:
            if not source.lending and source.lendable:
                members = [m.address for m in self.members.values() if m is not source]
                source.lending = runner.lend(source, members)
                source.lendable = source.lending
        return source.lending

    def _stop_idle(self, runner) -> None:
        """Once no host of the run waits or fetches, every lending unit stops."""
        if any(m.state in ("lacking", "obtaining") and runner.usable(m) for m in self.members.values()):
            return
        for m in self.members.values():
            if m.lending and m.peers == 0:
                m.lending = False
                runner.stop(m)


# --------------------------------------------------------------------------- on the hosts, over pyinfra's SSH


class HostRunner:
    """What a Distribution does on the hosts: the helper, run over the controller's SSH connections."""

    def __init__(self, state):
        self.state = state

    def host(self, member: Member):
        return self.state.inventory.get_host(member.name)

    def usable(self, member: Member) -> bool:
        """A host of the run that has not failed (a failed host's operations stopped; it lends nothing)."""
        failed = getattr(self.state, "failed_hosts", None) or set()
        on = self.host(member)
        return on is not None and on not in failed and self.state.is_host_in_limit(on)

    def _run(self, member: Member, command: str, show: bool = True) -> bool:
        on = self.host(member)
        ok, _out = on.run_shell_command(command, print_output=show, _sudo=uses_sudo(on))
        return bool(ok)

    def download(self, member: Member) -> bool:
        # a docker runtime's `hf download` runs in the recipe's image: the derived image this run pushed, by digest
        return self._run(member, helper_command("download", pushed(member.download)))

    def fetch(self, member: Member, source: Member) -> bool:
        return self._run(member, helper_command("fetch", {**member.fetch, "peer": source.address}))

    def lend(self, source: Member, members: list[str]) -> bool:
        ok = self._run(source, lend_command(members=members, **source.lend), show=False)
        if not ok:
            self.say(
                source,
                f"weights: could not lend them to the other hosts ({unit_name(source.lend['path'])} "
                "did not start; its journal: journalctl -u that unit)",
                error=True,
            )
        return ok

    def stop(self, source: Member) -> None:
        self._run(source, stop_command(source.lend["path"]), show=False)

    def say(self, member: Member, text: str, error: bool = False) -> None:
        self.host(member).log_styled(text, fg="red" if error else None)

    @staticmethod
    def sleep(seconds: float) -> None:
        gevent.sleep(seconds)


def distributions(state) -> dict:
    """The run's distributions, {"REPO@REVISION": Distribution}, kept on pyinfra's state."""
    if not hasattr(state, "ironserve_weights"):
        state.ironserve_weights = {}
    return state.ironserve_weights


def obtain(state, host, key: str, path: str) -> bool:
    """The FunctionCommand of roles/model_weights.py's weights_obtained: this host's weights, from where the run's
    distribution says."""
    dist = distributions(state).get(key)
    if dist is None or host.name not in dist.members:
        host.log_styled(f"weights: {path} was not planned for this host in this run", fg="red")
        return False
    return dist.obtain(HostRunner(state), host.name)
