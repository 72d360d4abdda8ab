#!/usr/bin/env python3
"""Rank guard: binds the units of one multi-node engine group, across hosts, so the group restarts as a whole.

One rank of a torch.distributed group cannot rejoin alone (the seeds: a decode rank that restarted by itself
waits forever for peers that already formed their group). Each rank's unit has a guard unit next to it
(<unit>-rank-guard.service, BindsTo/PartOf the engine unit: it starts, stops and restarts with it) running this
script with the host's python3 (standard library only). The guards agree on one fact: the systemd InvocationID
of rank 0's engine, which changes on every start of rank 0.

Rank 0 (leader) listens on ``guard_port`` of its cluster address (``bind``), for the group only:
- a report is ``POST /report`` with a JSON body {rank, healthy, nonce, challenge} and ``X-Ironserve-Mac``, the
  HMAC-SHA256 of the body under the group's secret (``secret_file``: 0600 root, the same on every rank's host,
  generated and distributed by the deploy);
- it is accepted only from the address of that rank (``members``, resolved at start), with a valid MAC and the
  challenge the leader gave that rank in its previous reply (single use): a forged report (no secret), a
  replayed one (challenge already used) or one from any other address changes nothing, and a replay does not
  disturb the rank's next genuine report. A report without a valid challenge (the first after a restart of
  either side) only gets the rank's outstanding challenge back;
- the reply to an accepted report, {accepted, challenge, formed, invocation}, carries its own MAC over the
  report's nonce, so a follower believes only its leader's answer to its own question (a forged or replayed
  reply cannot make it restart). Anything else gets an empty 403 or 404: nothing a stranger can use.
Followers send from their own cluster address (``source``) so that the leader sees the address it expects.

The leader:
- probes its own /health: the group is *formed* once anything answers there (SGLang starts rank 0's HTTP server
  only after every rank joined: the members are fixed from then on), *serving* at the first 200;
- not serving within ``formation_timeout_s``: restarts its engine (a new group), with backoff;
- once serving, every ``poll_s``: its own /health and each follower's latest report; a rank unhealthy (or silent)
  for ``failure_threshold`` polls in a row restarts rank 0's engine.
Ranks > 0 (followers) probe their own /health on the host (SGLang's dummy health server of ranks > 0, which
answers once the rank joined its group; the engine may bind loopback only, so nobody else probes it), report it
to the leader and read back rank 0's invocation: when it changes (rank 0 restarted, for any reason) they restart
their engine to join the new group, unless that group formed, or their engine is already in its rendezvous (the
report names this host's connections to rank 0's ``rendezvous``, torch's store at --dist-init-addr, and the reply
those rank 0's side holds): a restart then would break the group they are joining. Only the guard port has to be
open between the hosts.

So any rank failing ends in one restart of the whole group, ordered by rank 0. Group restarts back off: the n-th
within ``backoff_window_s`` waits min(backoff_base_s * 2**(n-1), backoff_max_s) first (state in /run, so it
survives the guard's own restarts). A group restart is deliberate to systemd (the guard resets the unit's count of
automatic restarts before it restarts it), so the engine units' own restart backoff (ironserve-backoff) never
delays it nor counts it: this guard's backoff is what bounds the group's restarts. Every decision is logged to the
journal of the guard unit, one line each.

Usage: ironserve-rank-guard CONFIG.json   (written by roles/sglang_service.py from ironserve.units)
"""

import errno
import hashlib
import hmac
import http.client
import ipaddress
import json
import os
import queue
import secrets
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler

STATE_DIR = "/run/ironserve/rank-groups"
MAC_HEADER = "X-Ironserve-Mac"
MAX_BODY = 4096
READ_TIMEOUT_S = 5.0  # a member's request line, headers and body: each read waits at most this long
WORKERS = 4  # connections served at once (a group's reports come one per rank per poll)
QUEUE = 16  # accepted members' connections waiting for a worker; beyond it, closed at once
MAX_REFUSED = 256  # peers and reasons remembered for the journal's rate limit
MAX_RENDEZVOUS = 32  # a follower's connections to rank 0's rendezvous named in one report
TCP_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")
TCP_ESTABLISHED = "01"
# errors of the guard's own resources (descriptors, memory, local ports): no evidence about the engine
OWN_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EADDRNOTAVAIL}


def log(message: str) -> None:
    print(message, flush=True)


class GuardFault(Exception):
    """The guard could not probe (its own descriptors, memory): says nothing about the engine's health."""


def http_status(url: str, timeout: float = 5.0) -> int | None:
    """The engine's answer to GET url: its HTTP status; 0 when it took the connection but gave no answer (timed
    out, reset); None when nothing listens (refused). GuardFault when the guard itself cannot ask: an error of the
    guard is never read as an unhealthy engine."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise GuardFault(f"cannot open a socket ({exc.strerror})") from None
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    connected = False
    try:
        sock.settimeout(timeout)
        sock.connect((host, port))
        connected, conn.sock = True, sock
        conn.request("GET", parts.path or "/")
        return conn.getresponse().status
    except OSError as exc:
        if exc.errno in OWN_ERRORS:
            raise GuardFault(f"cannot probe {url} ({exc.strerror})") from None
        return 0 if connected else None
    except http.client.HTTPException:
        return 0
    finally:
        conn.close()
        sock.close()


def read_secret(path: str) -> bytes:
    with open(path, "rb") as handle:
        secret = handle.read().strip()
    if len(secret) < 32:
        raise SystemExit(f"rank guard: the group secret in {path} is too short (the deploy writes 64 hex digits)")
    return secret


def mac(secret: bytes, *parts: bytes) -> str:
    """HMAC-SHA256 over the parts, each ended by a newline (a report: its body; a reply: the report's nonce, the
    reply body): a MAC of one kind of message is never valid for the other."""
    return hmac.new(secret, b"".join(p + b"\n" for p in parts), hashlib.sha256).hexdigest()


def addresses(name: str) -> set[str]:
    """The IP addresses a member's configured address (an IP or a name) stands for."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return {name}


def _table_address(field: str) -> tuple[str, int]:
    """One address of /proc/net/tcp{,6} ("0100007F:1F90"): 32-bit words in the host's byte order, then the port;
    an IPv4 address mapped into IPv6 is given as IPv4."""
    hexaddr, port = field.split(":")
    raw = bytes.fromhex(hexaddr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address), int(port, 16)


def established(tables: tuple[str, ...] = TCP_TABLES) -> list[tuple[tuple[str, int], tuple[str, int]]] | None:
    """This host's established TCP connections as (local, remote) (address, port) pairs, read from the kernel's
    tables (every process of the host's network namespace, the engine's included); None when none can be read."""
    found, pairs = False, []
    for table in tables:
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        found = True
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == TCP_ESTABLISHED:
                pairs.append((_table_address(fields[1]), _table_address(fields[2])))
    return pairs if found else None


def rendezvous_endpoint(rendezvous: str) -> tuple[set[str], int]:
    """Rank 0's rendezvous (--dist-init-addr, "host:port"): the addresses it stands for and its port."""
    host, _, port = rendezvous.rpartition(":")
    normal = set()
    for address in addresses(host.strip("[]")):
        try:
            normal.add(str(ipaddress.ip_address(address.split("%")[0])))
        except ValueError:
            pass
    return normal, int(port)


def rendezvous_connections(rendezvous: str) -> list[str] | None:
    """A follower's connections to rank 0's rendezvous ("address:port" of this end): torch's store, which every
    rank of a group keeps connected while it is in it. None when the kernel's tables cannot be read."""
    hosts, port = rendezvous_endpoint(rendezvous)
    pairs = established()
    if pairs is None:
        return None
    return sorted(f"{local[0]}:{local[1]}" for local, remote in pairs if remote[1] == port and remote[0] in hosts)[
        :MAX_RENDEZVOUS]


def rendezvous_peers(rendezvous: str, theirs: list[str]) -> list[str] | None:
    """Which of a follower's connections (their "address:port") rank 0's rendezvous holds established now: the
    follower's engine is in the rendezvous of this very rank 0 (never a stale one of an earlier). None when the
    kernel's tables cannot be read."""
    _, port = rendezvous_endpoint(rendezvous)
    pairs = established()
    if pairs is None:
        return None
    held = {f"{remote[0]}:{remote[1]}" for local, remote in pairs if local[1] == port}
    return sorted(held.intersection(theirs))


def report(config: dict, secret: bytes, body: dict, timeout: float = 5.0) -> dict | None:
    """Send one signed report to the leader from this rank's own address; the leader's verified reply or None."""
    payload = json.dumps(body, sort_keys=True).encode()
    source = config.get("source")
    conn = http.client.HTTPConnection(config["leader"], int(config["guard_port"]), timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        try:
            conn.connect()
        except OSError as exc:
            if not source or exc.errno != errno.EADDRNOTAVAIL:
                raise
            # this host's configured address is not one of its own (NAT, a name for another interface): the
            # leader will refuse what comes from elsewhere, and says so in its journal
            log(f"cannot send from this rank's address {source} ({exc.strerror}); sending from the default route")
            config["source"] = None
            conn = http.client.HTTPConnection(config["leader"], int(config["guard_port"]), timeout=timeout)
        conn.request("POST", "/report", body=payload,
                     headers={"Content-Type": "application/json", MAC_HEADER: mac(secret, b"report", payload)})
        response = conn.getresponse()
        data = response.read(MAX_BODY)
        signature = response.getheader(MAC_HEADER) or ""
        if response.status != 200:
            return None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if not hmac.compare_digest(signature, mac(secret, b"reply", body["nonce"].encode(), data)):
        log("ignoring a reply to this rank's report that does not carry the group's MAC")
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


class Refusals:
    """The journal's rate limit of refusals: one line per peer and reason a minute, remembered for at most
    MAX_REFUSED of them (a flood from many addresses neither floods the journal nor grows this table)."""

    def __init__(self):
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()

    def say(self, peer: str, line: str, why: str = "") -> None:
        key, now = f"{peer} {why}", time.monotonic()
        with self.lock:
            if now - self.seen.get(key, -60.0) < 60:
                return
            if len(self.seen) >= MAX_REFUSED:
                self.seen = {k: t for k, t in self.seen.items() if now - t < 60}
                if len(self.seen) >= MAX_REFUSED:
                    key = "many peers"  # one line a minute for all of them
                    if now - self.seen.get(key, -60.0) < 60:
                        return
                    line = f"refusing connections from more than {MAX_REFUSED} peers a minute (latest {peer})"
            self.seen[key] = now
        log(line)


class Reports:
    """What the leader believes of its followers: only verified reports from each rank's own address, each
    carrying the single-use challenge the leader gave that rank in its previous reply."""

    def __init__(self, secret: bytes, members: list[str], world: int):
        self.secret = secret
        self.allowed = {rank: addresses(members[rank]) for rank in range(1, world)}
        self.world = world
        self.latest: dict[int, tuple[float, bool]] = {}  # rank -> (monotonic time, healthy) of its latest report
        self.challenges: dict[int, str] = {}
        self.lock = threading.Lock()
        self.refused = Refusals()

    def members(self) -> set[str]:
        """Every address a report may come from (any rank > 0's)."""
        return set().union(*self.allowed.values())

    def refuse(self, peer: str, why: str) -> None:
        self.refused.say(peer, f"refused a report from {peer}: {why}", why)

    def handle(self, peer: str, payload: bytes, signature: str, state: dict) -> tuple[int, bytes, str]:
        """(HTTP status, reply body, reply MAC) of one POST /report."""
        if not any(peer in allowed for allowed in self.allowed.values()):
            self.refuse(peer, "not the address of a rank of this group")
            return 403, b"", ""
        if not hmac.compare_digest(signature, mac(self.secret, b"report", payload)):
            self.refuse(peer, "bad MAC (not signed with this group's secret)")
            return 403, b"", ""
        try:
            body = json.loads(payload)
            rank, nonce = int(body["rank"]), str(body["nonce"])
            healthy, challenge = body["healthy"] is True, str(body.get("challenge") or "")
            theirs = [str(c) for c in body.get("rendezvous") or []][:MAX_RENDEZVOUS]
        except (ValueError, KeyError, TypeError):
            self.refuse(peer, "malformed report")
            return 403, b"", ""
        if rank not in self.allowed or peer not in self.allowed[rank]:
            self.refuse(peer, f"signed as rank {rank}, which has another address")
            return 403, b"", ""
        with self.lock:
            # one outstanding challenge per rank, replaced only when used: a replayed report (its challenge
            # already used) is refused without disturbing the rank's next genuine one
            current = self.challenges.get(rank) or secrets.token_hex(16)
            accepted = bool(challenge) and hmac.compare_digest(challenge, current)
            if accepted:
                self.latest[rank] = (time.monotonic(), healthy)
                current = secrets.token_hex(16)
            elif challenge:
                self.refuse(peer, f"rank {rank}: a challenge already used or never given (a replay?)")
            self.challenges[rank] = current
            reply = {"accepted": accepted, "challenge": current}
            if accepted:
                # formed: the group of the engine invocation named beside it (never an earlier one's)
                reply.update(formed=state["formed_in"] == state["invocation"], invocation=state["invocation"])
        if accepted and state.get("rendezvous"):
            peers = rendezvous_peers(state["rendezvous"], theirs)
            if peers is not None:
                reply["rendezvous"] = peers
        data = json.dumps(reply, sort_keys=True).encode()
        return 200, data, mac(self.secret, b"reply", nonce.encode(), data)


def invocation(unit: str) -> str:
    """The engine unit's systemd InvocationID; "" when it cannot be asked (the caller keeps what it knew)."""
    try:
        out = subprocess.run(["systemctl", "show", "-p", "InvocationID", "--value", f"{unit}.service"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


class Backoff:
    """Group restarts within a window, kept in /run across the guard's own restarts."""

    def __init__(self, unit: str, base: float, limit: float, window: float, state_dir: str = STATE_DIR):
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, f"{unit}.json")
        self.base, self.limit, self.window = base, limit, window

    def _load(self) -> list[float]:
        try:
            with open(self.path) as handle:
                return [t for t in json.load(handle).get("restarts", []) if time.time() - t < self.window]
        except (OSError, ValueError):
            return []

    def delay(self) -> float:
        recent = len(self._load())
        return 0.0 if recent == 0 else min(self.base * 2 ** (recent - 1), self.limit)

    def record(self) -> int:
        restarts = self._load() + [time.time()]
        os.makedirs(self.state_dir, exist_ok=True)
        with open(self.path, "w") as handle:
            json.dump({"restarts": restarts}, handle)
        return len(restarts)


def publish_restarts(unit: str, count: int) -> None:
    """The group's restarts as ironserve_* metrics through the host's one metrics writer (ironserve-textfile,
    beside this script; roles/node_exporter.py): best effort and bounded."""
    lines = [f'ironserve_rank_guard_group_restarts{{unit="{unit}"}} {count}',
             f'ironserve_rank_guard_last_restart_timestamp_seconds{{unit="{unit}"}} {time.time():.0f}']
    writer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ironserve-textfile")
    try:
        subprocess.run([sys.executable, writer, f"ironserve_rank_guard_{unit}"], input="\n".join(lines) + "\n",
                       text=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        pass


def restart_engine(config: dict, why: str, backoff: Backoff | None = None) -> None:
    unit = config["unit"]
    if backoff is not None:
        wait = backoff.delay()
        if wait:
            log(f"group restart: waiting {wait:.0f}s first (backoff: restarts within the last "
                f"{backoff.window:.0f}s)")
            time.sleep(wait)
        count = backoff.record()
        publish_restarts(unit, count)  # restarts within the window
        log(f"restarting the group ({count} within {backoff.window:.0f}s): {why}")
    else:
        log(f"restarting this rank: {why}")
    # the group is being abandoned: nothing to drain, and a rank > 0 waits for a shutdown broadcast from a rank 0
    # that is gone (until TimeoutStopSec); a hung rank ignores SIGTERM. SIGKILL, then a fresh start.
    subprocess.run(["systemctl", "kill", "--signal=SIGKILL", f"{unit}.service"])
    # a deliberate restart, bounded by this guard's own backoff (above): systemd's count of automatic restarts back
    # to 0, so the engine's restart backoff (ironserve-backoff) neither delays it nor counts the SIGKILL as a crash
    # (without this, a unit already waiting in auto-restart would keep its count through the restart below)
    subprocess.run(["systemctl", "reset-failed", f"{unit}.service"])
    # --no-block: this guard is PartOf the unit and is stopped by the very restart it asks for
    subprocess.run(["systemctl", "--no-block", "restart", f"{unit}.service"])
    time.sleep(3600)  # systemd stops this process as part of the restart


class Handler(BaseHTTPRequestHandler):
    """One member's request (the server already checked its address): POST /report, everything else empty."""

    server_version, sys_version = "", ""  # no software banner
    timeout = READ_TIMEOUT_S  # each read of the request: a member that stalls is dropped, never waited for

    def _reply(self, status: int, data: bytes = b"", signature: str = "") -> None:
        self.send_response(status)
        if signature:
            self.send_header(MAC_HEADER, signature)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - http.server's name
        if self.path != "/report":
            return self._reply(404)
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            return self._reply(400)
        payload = self.rfile.read(length)
        reports, state = self.server.reports, self.server.state
        self._reply(*reports.handle(self.client_address[0], payload, self.headers.get(MAC_HEADER) or "", state))

    def do_GET(self):  # noqa: N802
        self._reply(404)

    def send_error(self, code, message=None, explain=None):  # no HTML page naming the server
        self._reply(code)

    def log_message(self, *args):  # keep the journal to decisions
        pass


class GuardServer(socketserver.TCPServer):
    """The leader's listener: a peer that is no rank of the group is closed as it is accepted (nothing read); a
    member's connection waits in a short queue for one of a fixed pool of workers (full: closed). Threads and
    descriptors stay bounded whatever connects."""

    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], reports: "Reports", state: dict):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.reports, self.state = reports, state
        self.members = reports.members()
        self.pending: queue.Queue = queue.Queue(maxsize=QUEUE)
        super().__init__(address, Handler)
        for _ in range(WORKERS):
            threading.Thread(target=self._work, daemon=True).start()

    def get_request(self):
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in OWN_ERRORS:  # out of descriptors: let some close before accepting again
                self.reports.refused.say("", f"cannot accept a connection ({exc.strerror}); retrying", "accept")
                time.sleep(0.2)
            raise

    def verify_request(self, request, client_address) -> bool:
        if client_address[0] in self.members:
            return True
        self.reports.refused.say(client_address[0], f"refused a connection from {client_address[0]}: not the "
                                                    "address of a rank of this group", "stranger")
        return False

    def process_request(self, request, client_address) -> None:
        try:
            self.pending.put_nowait((request, client_address))
        except queue.Full:
            self.reports.refused.say(client_address[0], f"dropped a connection from {client_address[0]}: "
                                                        f"{QUEUE} already waiting", "busy")
            self.shutdown_request(request)

    def _work(self) -> None:
        while True:
            request, client_address = self.pending.get()
            try:
                self.finish_request(request, client_address)
            except Exception as exc:  # noqa: BLE001 - one line, never a traceback per request
                self.handle_error(request, client_address, exc)
            finally:
                self.shutdown_request(request)

    def handle_error(self, request, client_address, exc: Exception | None = None) -> None:
        why = type(exc).__name__ if exc else "error"
        self.reports.refused.say(client_address[0], f"a request from {client_address[0]} failed: {why}", why)


def rank0_verdict(config: dict, refused: "Refusals") -> str | None:
    """Rank 0's engine by its /health; None when the guard could not ask (its own fault: not counted)."""
    try:
        return "healthy" if http_status(config["health_url"]) == 200 else "not answering /health"
    except GuardFault as fault:
        refused.say("", f"rank 0's health probe did not run: {fault}; not counted against rank 0", "probe")
        return None


def follower_verdicts(reports: "Reports", world: int, formed_at: float, window: float) -> dict[int, str]:
    """Each rank > 0 by its latest accepted report: healthy, unhealthy, or silent for longer than ``window``."""
    now, verdicts = time.monotonic(), {}
    for rank in range(1, world):
        seen, healthy = reports.latest.get(rank, (0.0, False))
        if seen < formed_at:
            # no report since the group formed: silent once it had the time for a few polls
            verdicts[rank] = "silent" if now - formed_at > window else "healthy"
        elif now - seen > window:
            verdicts[rank] = f"silent for {now - seen:.0f}s"
        else:
            verdicts[rank] = "healthy" if healthy else "not answering /health"
    return verdicts


def leader(config: dict) -> None:
    unit, poll = config["unit"], float(config["poll_s"])
    # formed_in: the engine invocation the group formed in (every rank joined); None while it forms
    state = {"formed_in": None, "invocation": invocation(unit), "rendezvous": config.get("rendezvous")}
    backoff = Backoff(unit, float(config["backoff_base_s"]), float(config["backoff_max_s"]),
                      float(config["backoff_window_s"]), config.get("state_dir", STATE_DIR))
    reports = Reports(read_secret(config["secret_file"]), config["members"], int(config["world"]))
    server = GuardServer((config["bind"], int(config["guard_port"])), reports, state)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"rank 0 guard of {unit}: taking the group's signed reports on {config['bind']}:{config['guard_port']}, "
        f"engine invocation "
        f"{state['invocation']}; waiting for the group to form (up to {config['formation_timeout_s']}s)")
    serving_at = wait_until_serving(config, state, reports, backoff)
    threshold, world = int(config["failure_threshold"]), int(config["world"])
    failures: dict[int, int] = {}
    while True:
        time.sleep(poll)
        state["invocation"] = invocation(unit) or state["invocation"]
        verdicts = {0: rank0_verdict(config, reports.refused),
                    **follower_verdicts(reports, world, serving_at, poll * (threshold + 1))}
        why = count_failures(failures, verdicts, threshold)
        if why:
            restart_engine(config, why, backoff)


def count_failures(failures: dict[int, int], verdicts: dict[int, str | None], threshold: int) -> str | None:
    """Adds one poll's verdicts to each rank's count of failed polls in a row (a healthy one sets it back to 0; None,
    the guard's own fault, counts neither for nor against the rank); the reason to restart the group once a rank
    failed ``threshold`` polls in a row, else None."""
    for rank, verdict in verdicts.items():
        if verdict is None:
            continue
        if verdict == "healthy":
            failures[rank] = 0
            continue
        failures[rank] = failures.get(rank, 0) + 1
        log(f"rank {rank} {verdict}: {failures[rank]} of {threshold}")
        if failures[rank] >= threshold:
            return f"rank {rank} {verdict} for {failures[rank]} polls in a row; a rank cannot rejoin its group alone"
    return None


def probe_rank0(config: dict, refused: "Refusals") -> int | None:
    """Rank 0's /health status (0: took the connection, gave no answer); None when nothing listens or the guard
    could not ask (its own fault, said once a minute)."""
    try:
        return http_status(config["health_url"])
    except GuardFault as fault:
        refused.say("", f"rank 0's health probe did not run: {fault}", "probe")
        return None


def wait_until_serving(config: dict, state: dict, reports: "Reports", backoff: Backoff) -> float:
    """Rank 0's engine forms its group, then serves; when it serves (monotonic). Formed: its HTTP server is up,
    which SGLang starts only once every rank joined (from then on the group's members are fixed, and the replies
    say so); serving: its /health answers 200. Neither within the formation timeout: the group restarts. Once
    formed, a follower that fails (hangs, dies) restarts the group at once, as after it served: rank 0's warm-up
    waits on every rank, so that group can never serve (without this it stayed down for the whole timeout)."""
    started, poll = time.monotonic(), float(config["poll_s"])
    threshold, world = int(config["failure_threshold"]), int(config["world"])
    formed_at, failures = None, {}
    while True:
        time.sleep(poll)
        state["invocation"] = invocation(config["unit"]) or state["invocation"]
        status = probe_rank0(config, reports.refused)
        if status is not None and formed_at is None:
            formed_at, state["formed_in"] = time.monotonic(), state["invocation"]
            log(f"group formed after {formed_at - started:.0f}s: all {world} ranks joined (rank 0's server is up)")
        if status == 200:
            log(f"group serving after {time.monotonic() - started:.0f}s")
            return time.monotonic()
        if formed_at is not None:
            why = count_failures(failures, follower_verdicts(reports, world, formed_at, poll * (threshold + 1)),
                                 threshold)
            if why:
                restart_engine(config, f"{why} (the group formed, rank 0 had not served yet)", backoff)
        if time.monotonic() - started > float(config["formation_timeout_s"]):
            what = "did not form" if formed_at is None else "formed but did not serve"
            restart_engine(config, f"the group {what} within {config['formation_timeout_s']}s", backoff)


def record_following(config: dict, leader_invocation: str) -> None:
    """Which generation of the group (rank 0's engine invocation) this rank's engine (its own invocation) follows:
    how the deploy tells, without comparing clocks across hosts, that this rank already joined rank 0's group."""
    state_dir = config.get("state_dir", STATE_DIR)
    path = os.path.join(state_dir, f"{config['unit']}.following")
    os.makedirs(state_dir, exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump({"leader_invocation": leader_invocation, "engine_invocation": invocation(config["unit"])}, handle)
    os.replace(path + ".tmp", path)


def follower(config: dict) -> None:
    unit, poll, rank = config["unit"], float(config["poll_s"]), int(config["rank"])
    secret = read_secret(config["secret_file"])
    log(f"rank {rank} guard of {unit}: following rank 0's engine through its guard at "
        f"{config['leader']}:{config['guard_port']}")
    seen, challenge, healthy = None, "", False
    while True:
        try:
            healthy = http_status(config["health_url"]) == 200
        except GuardFault as fault:  # the guard's own fault: report what it knew, never "unhealthy" for it
            log(f"this rank's health probe did not run: {fault}; reporting the last answer")
        mine = rendezvous_connections(config["rendezvous"]) if config.get("rendezvous") else None
        # at most twice: a report without a valid challenge (the first, or after either side restarted) only
        # gets one back; the second report carries it
        for _ in range(2):
            answer = report(config, secret, {"rank": rank, "healthy": healthy, "nonce": secrets.token_hex(16),
                                             "challenge": challenge, "rendezvous": mine or []})
            challenge = str((answer or {}).get("challenge") or "")
            if not answer or answer.get("accepted"):
                break
        step, why = follow_step(seen, answer, in_rendezvous(mine, answer))
        if step == "restart":
            restart_engine(config, why)
        elif step == "follow":
            seen = answer["invocation"]
            log(why)
            record_following(config, seen)
        time.sleep(poll)


def in_rendezvous(mine: list[str] | None, answer: dict | None) -> bool | None:
    """Whether this rank's engine is in the rendezvous of rank 0's current engine: rank 0's side holds one of the
    connections this host holds to it. None when either side could not tell (no tables, no rendezvous)."""
    theirs = (answer or {}).get("rendezvous")
    if mine is None or not isinstance(theirs, list):
        return None
    return bool(set(mine).intersection(theirs))


def follow_step(seen: str | None, answer: dict | None, joining: bool | None = None) -> tuple[str, str]:
    """What a follower does with the leader's verified answer: ("follow", why) adopts rank 0's invocation as the
    group this rank's engine is in, ("restart", why) restarts this rank to join rank 0's new group, ("wait", "")
    changes nothing. ``joining``: this engine is in the rendezvous of rank 0's current engine (in_rendezvous).

    A new invocation of rank 0 is followed without a restart when its group formed (rank 0's server is up only
    once every rank joined: with this very engine, the one running since this guard started) or when this engine
    is already in its rendezvous (it connected to the new rank 0 while that one formed): restarting it then would
    break the group it is joining, and rank 0 would wait for it until its formation timeout."""
    current = (answer or {}).get("invocation") if (answer or {}).get("accepted") else None
    if not current or current == seen:
        return "wait", ""
    if seen is None:
        return "follow", f"rank 0's engine invocation {current}"
    change = f"rank 0 restarted (invocation {seen} -> {current})"
    if answer.get("formed"):
        return "follow", f"{change} and its new group formed with this rank's engine: following it"
    if joining:
        return "follow", f"{change} and this rank's engine is in its rendezvous: following it"
    return "restart", f"{change}: joining its new group"


def main() -> int:
    with open(sys.argv[1]) as handle:
        config = json.load(handle)
    (leader if config["rank"] == 0 else follower)(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
