#!/usr/bin/env python3
"""Weights peer: the hub is read once per deployment, the other hosts fetch from peers, every file is verified.

Run on the hosts by roles/weights_peers.py with the host's python3 (standard library only), as root. Modes:

- ``download CONFIG``: the one host of a run that reads the hub. Asks the hub (``endpoint``, or huggingface.co)
  for the revision's commit and every file's hash (``/api/models/REPO/revision/REV?blobs=true``, else the
  recursive tree listing): the sha256 of LFS files, the git blob id of the others. Runs the runtime's own ``hf
  download`` (``hf`` argv, which resumes) pinned to that commit, printing progress lines (bytes, rate, ETA) from
  what is on disk; then hashes every file against the hub's hashes. A file that differs is removed (with hf's
  record of it, so a rerun downloads it again) and the run fails naming it.
- ``serve --bind A --port P --root DIR --secret-file F --members a,b --max-peers N``: lends a verified model
  directory to the other hosts of the deployment, for the duration of their fetch (a transient systemd unit,
  started and stopped by the deploy; it also exits after ``--idle-exit`` seconds without a request). Listens on
  this host's cluster address only; a connection from any address that is not one of ``members`` is closed as it
  is accepted, before a byte is read; at most ``--max-peers`` peers at once and a fixed number of connections
  (more are closed); each read of a request waits at most READ_TIMEOUT_S. Every request carries the HMAC-SHA256
  of (method, path, range, time, nonce) under the deployment's secret (0600 root, generated on the controller);
  a request without it, too old (CLOCK_WINDOW_S) or replayed (nonce seen) gets an empty 403. Serves only the
  manifest (its reply signed over the request's nonce) and the files the manifest lists, as regular files inside
  the model directory (no ``..``, no link out of the tree): nothing else.
- ``fetch CONFIG``: gets the manifest from a peer (believed only with the peer's MAC over this request's nonce),
  then every file it lists that is not already here with the hub's hash, ``streams`` files at a time, each hashed
  while it streams into a partial file under .cache/ironserve/partial (an interrupted fetch resumes there with a
  Range request); a file lands in place only when its size and hash are the hub's. Progress lines every
  ``progress_s``.
- ``verify CONFIG``: hashes the files of the model directory against its manifest, and says so.

Verified state: the manifest is kept at .cache/ironserve/hub-manifest.json in the model directory, and a marker
(``marker``) holds "STAMP REPO REVISION", STAMP the sha256 of the manifest and of the directory's listing (path,
size, mtime of every file outside .cache/), computed as roles/model_weights.py's ModelCheckpoint computes it: the
deploy knows a host is done without hashing anything again.
"""

import collections
import concurrent.futures
import errno
import hashlib
import hmac
import http.client
import json
import os
import re
import secrets
import socket
import socketserver
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler

MANIFEST = ".cache/ironserve/hub-manifest.json"  # relative to the model directory
PARTIAL = ".cache/ironserve/partial"
MAC_HEADER, TIME_HEADER, NONCE_HEADER = "X-Ironserve-Mac", "X-Ironserve-Time", "X-Ironserve-Nonce"
CHUNK = 1 << 20
READ_TIMEOUT_S = 10.0  # a peer's request line and headers: each read waits at most this long
SEND_TIMEOUT_S = 60.0  # a file being sent: a receiver stalled this long is dropped
CLOCK_WINDOW_S = 300  # a request's time may differ this much from this host's clock
MAX_NONCES = 65536  # nonces remembered against replays (older ones are outside the window anyway)
STREAMS_PER_PEER = 4  # connections one peer may hold (its parallel files)
MAX_MANIFEST = 64 << 20
MAX_FILES = 100_000
RETRIES = 5  # a file's fetch is resumed this many times after a broken connection
HUB_TIMEOUT_S = 60
_HEX = {"sha256": re.compile(r"[0-9a-f]{64}"), "git": re.compile(r"[0-9a-f]{40}")}


def log(message: str) -> None:
    print(message, flush=True)


class Refused(Exception):
    """What a run cannot go on from (its message says what and why)."""


# --------------------------------------------------------------------------- the manifest and hashes


def checked_path(rel: object) -> str:
    """A file's path in a repository: relative, plain components, nothing under .cache/; else ValueError."""
    if not isinstance(rel, str) or not rel or len(rel) > 4096 or rel.startswith("/") or "\\" in rel:
        raise ValueError(f"not a relative path: {rel!r}")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == ".cache":
        raise ValueError(f"not a plain path inside the model directory: {rel!r}")
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        raise ValueError(f"a control character in {rel!r}")
    return rel


def checked_entry(item: object) -> dict:
    """One file of a manifest: {path, size, sha256 | git} with a valid path, size and hash."""
    if not isinstance(item, dict):
        raise ValueError("a file entry is not an object")
    kinds = [k for k in ("sha256", "git") if k in item]
    if len(kinds) != 1 or not isinstance(item[kinds[0]], str) or not _HEX[kinds[0]].fullmatch(item[kinds[0]]):
        raise ValueError(f"{item.get('path')!r}: no valid sha256 or git blob id")
    size = item.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"{item.get('path')!r}: no valid size")
    return {"path": checked_path(item.get("path")), "size": size, kinds[0]: item[kinds[0]]}


def parse_manifest(data: bytes, repo: str, revision: str) -> dict:
    """The manifest of ``repo`` at ``revision`` (the deploy's), validated whole; Refused otherwise."""
    try:
        manifest = json.loads(data)
        if manifest.get("repo") != repo or manifest.get("revision") != revision:
            raise ValueError(f"it is {manifest.get('repo')}@{manifest.get('revision')}, not {repo}@{revision}")
        if not _HEX["git"].fullmatch(str(manifest.get("commit"))):
            raise ValueError("no commit")
        files = [checked_entry(f) for f in manifest["files"]]
        if not 0 < len(files) <= MAX_FILES or len({f["path"] for f in files}) != len(files):
            raise ValueError("no files, too many, or one listed twice")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Refused(f"the manifest is not usable: {exc}") from None
    return {**manifest, "files": files}


def manifest_bytes(repo: str, revision: str, commit: str, files: list[dict]) -> bytes:
    body = {"repo": repo, "revision": revision, "commit": commit, "files": sorted(files, key=lambda f: f["path"])}
    return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()


def hasher(entry: dict):
    """The hash the hub gives for this file: sha256 of an LFS file, git's blob id (sha1 of "blob SIZE\\0"
    and the content) of any other."""
    if "sha256" in entry:
        return hashlib.sha256()
    h = hashlib.sha1()
    h.update(b"blob %d\0" % entry["size"])
    return h


def expected(entry: dict) -> str:
    return entry.get("sha256") or entry["git"]


def hash_into(h, path: str, progress=None, limit: int | None = None) -> int:
    """Feed a file (its first ``limit`` bytes) to ``h``; the number of bytes read."""
    done = 0
    with open(path, "rb", buffering=0) as handle:
        while limit is None or done < limit:
            block = handle.read(CHUNK if limit is None else min(CHUNK, limit - done))
            if not block:
                break
            h.update(block)
            done += len(block)
            if progress:
                progress.add(len(block))
    return done


def file_problem(root: str, entry: dict, progress=None) -> str | None:
    """None when the file at its place has the hub's size and hash, else what is wrong."""
    path = os.path.join(root, entry["path"])
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            return f"{entry['path']}: missing"
        if os.path.getsize(path) != entry["size"]:
            return f"{entry['path']}: {os.path.getsize(path)} bytes, the hub says {entry['size']}"
        h = hasher(entry)
        hash_into(h, path, progress)
    except OSError as exc:
        return f"{entry['path']}: cannot read it ({exc.strerror})"
    if h.hexdigest() != expected(entry):
        return f"{entry['path']}: hash {h.hexdigest()} is not the hub's {expected(entry)}"
    return None


def stamp(root: str, manifest: bytes) -> str:
    """sha256 of the manifest and the directory's listing outside .cache/: the same bytes as the shell of
    roles/model_weights.py's ModelCheckpoint (find -printf '%P %s %T@', LC_ALL=C sort)."""
    listing = subprocess.run(
        ["find", ".", "-type", "f", "!", "-path", "./.cache/*", "-printf", "%P %s %T@\\n"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    lines = sorted(listing.split(b"\n")[:-1])
    return hashlib.sha256(manifest + b"".join(line + b"\n" for line in lines)).hexdigest()


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def mark_verified(config: dict, manifest: bytes) -> None:
    """Keep the manifest beside the files, then the marker the deploy reads (after every file was verified)."""
    root = config["root"]
    write_atomic(os.path.join(root, MANIFEST), manifest)
    write_atomic(config["marker"], f"{stamp(root, manifest)} {config['repo']} {config['revision']}\n".encode())


def verify_all(root: str, files: list[dict], workers: int, progress) -> list[str]:
    """Every file against its hash, ``workers`` at once; the problems."""
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        found = pool.map(lambda entry: file_problem(root, entry, progress), files)
        return [p for p in found if p]


# --------------------------------------------------------------------------- progress lines


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


class Progress:
    """Bytes done of a total, said every ``every`` seconds (and once at the end) as bytes, rate and ETA."""

    def __init__(self, what: str, total: int, every: float, measure=None):
        self.what, self.total, self.every, self.measure = what, total, every, measure
        self.done, self.started, self.lock = 0, time.monotonic(), threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)
        self.thread.start()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n

    def line(self) -> str:
        try:
            done = self.measure() if self.measure else self.done
        except OSError:
            done = self.done
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = done / elapsed
        left = max(self.total - done, 0)
        eta = f"{left / rate:.0f}s" if rate > 0 else "unknown"
        pct = 100 * done / self.total if self.total else 100
        return f"{self.what}: {human(done)} of {human(self.total)} ({pct:.0f}%), {human(rate)}/s, ETA {eta}"

    def _tick(self) -> None:
        while not self.stopped.wait(self.every):
            log(self.line())

    def finish(self) -> float:
        self.stopped.set()
        log(self.line())
        return time.monotonic() - self.started


# --------------------------------------------------------------------------- download: the hub, once


def read_token(config: dict) -> str | None:
    if not config.get("token_file"):
        return None
    with open(config["token_file"]) as handle:
        return handle.read().strip() or None


def hub_get(url: str, token: str | None) -> tuple[bytes, object]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=HUB_TIMEOUT_S) as response:
            return response.read(MAX_MANIFEST), response.headers
    except urllib.error.HTTPError as exc:
        why = {
            401: "no access (token missing or wrong)",
            403: "no access (gated or private: check the token)",
            404: "repository or revision not found",
        }.get(exc.code, f"HTTP {exc.code}")
        raise Refused(f"the hub answered {url.split('?')[0]}: {why}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise Refused(f"cannot reach the hub at {url.split('?')[0]}: {exc}") from None


def sibling_entry(item: dict) -> dict:
    """A file of the hub's revision info (blobs=true) or tree listing as a manifest entry."""
    lfs = item.get("lfs") or None
    path = item.get("rfilename") or item.get("path")
    if lfs:
        return checked_entry({"path": path, "size": lfs.get("size"), "sha256": lfs.get("sha256") or lfs.get("oid")})
    return checked_entry({"path": path, "size": item.get("size"), "git": item.get("blobId") or item.get("oid")})


def tree_files(base: str, commit: str, token: str | None) -> list[dict]:
    """The recursive tree listing of a commit, every page of it (Link: <...>; rel="next")."""
    url, files = f"{base}/tree/{commit}?recursive=true&expand=false", []
    while url:
        data, headers = hub_get(url, token)
        files += [sibling_entry(item) for item in json.loads(data) if item.get("type") == "file"]
        nxt = re.search(r'<([^>]+)>;\s*rel="next"', headers.get("Link") or "")
        url = nxt.group(1) if nxt else ""
        if len(files) > MAX_FILES:
            raise Refused(f"more than {MAX_FILES} files in the repository")
    return files


def hub_files(config: dict, token: str | None) -> tuple[str, list[dict]]:
    """(commit, files with their hashes) of the deploy's repo@revision, as the hub gives them."""
    endpoint = (config.get("endpoint") or "https://huggingface.co").rstrip("/")
    base = f"{endpoint}/api/models/{config['repo']}"
    data, _ = hub_get(f"{base}/revision/{urllib.parse.quote(config['revision'], safe='')}?blobs=true", token)
    try:
        info = json.loads(data)
        commit = str(info.get("sha"))
        if not _HEX["git"].fullmatch(commit):
            raise ValueError("no commit")
        try:
            files = [sibling_entry(s) for s in info.get("siblings") or []]
        except ValueError:
            files = []  # a mirror without the blobs' hashes: the tree listing has them
        files = files or tree_files(base, commit, token)
    except (ValueError, AttributeError, TypeError) as exc:
        raise Refused(f"the hub's answer for {config['repo']}@{config['revision']} is not usable: {exc}") from None
    return commit, files


def bytes_on_disk(root: str, files: list[dict]) -> int:
    """What an `hf download` in progress has: the files in place, and its partial (.incomplete) ones."""
    done = 0
    for entry in files:
        try:
            done += min(os.path.getsize(os.path.join(root, entry["path"])), entry["size"])
        except OSError:
            pass
    for top, _dirs, names in os.walk(os.path.join(root, ".cache", "huggingface")):
        for name in names:
            try:
                done += os.path.getsize(os.path.join(top, name)) if name.endswith(".incomplete") else 0
            except OSError:
                pass  # moved into place meanwhile
    return done


def run_hf(config: dict, commit: str, files: list[dict]) -> None:
    """The runtime's `hf download ... --revision COMMIT`, its progress said from the disk, its output kept for
    an error."""
    total = sum(f["size"] for f in files)
    env = {**os.environ, **config.get("env", {}), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    os.makedirs(config["root"], mode=0o755, exist_ok=True)
    progress = Progress(
        f"weights from the hub ({config['repo']})",
        total,
        config.get("progress_s", 10),
        measure=lambda: bytes_on_disk(config["root"], files),
    )
    tail = collections.deque(maxlen=40)
    proc = subprocess.Popen(
        [*config["hf"], "--revision", commit],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    for line in proc.stdout:
        tail.append(line.rstrip())
    rc = proc.wait()
    progress.finish()
    if rc != 0:
        raise Refused(f"hf download failed (exit {rc}):\n" + "\n".join(tail))


def forget(root: str, problem: str) -> None:
    """A file that is not the hub's: removed, with hf's record of it, so that a rerun downloads it again."""
    rel = problem.split(": ", 1)[0]
    for path in (os.path.join(root, rel), os.path.join(root, ".cache", "huggingface", "download", rel + ".metadata")):
        try:
            os.unlink(path)
        except OSError:
            pass


def download(config: dict) -> int:
    token = read_token(config)
    commit, files = hub_files(config, token)
    total = sum(f["size"] for f in files)
    log(f"weights: {config['repo']}@{config['revision']} is commit {commit}: {len(files)} files, {human(total)}")
    run_hf(config, commit, files)
    check = Progress("verifying against the hub's hashes", total, config.get("progress_s", 10))
    problems = verify_all(config["root"], files, config.get("verify_workers", 4), check)
    check.finish()
    if problems:
        for problem in problems:
            forget(config["root"], problem)
        raise Refused(
            "files that are not the hub's (removed; a rerun downloads them again):\n  " + "\n  ".join(problems)
        )
    mark_verified(config, manifest_bytes(config["repo"], config["revision"], commit, files))
    log(f"weights: {len(files)} files, {human(total)} from the hub, verified against its hashes (commit {commit})")
    return 0


# --------------------------------------------------------------------------- the peer protocol


def read_secret(path: str) -> bytes:
    with open(path, "rb") as handle:
        secret = handle.read().strip()
    if len(secret) < 32:
        raise Refused(f"the deployment's secret in {path} is too short (the deploy writes 64 hex digits)")
    return secret


def mac(secret: bytes, *parts: str | bytes) -> str:
    """HMAC-SHA256 over the parts, each ended by a newline; the first names the kind of message."""
    data = b"".join((p if isinstance(p, bytes) else p.encode()) + b"\n" for p in parts)
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def signed_headers(secret: bytes, method: str, path: str, byte_range: str = "") -> dict:
    stamp_s, nonce = str(int(time.time())), secrets.token_hex(16)
    headers = {
        TIME_HEADER: stamp_s,
        NONCE_HEADER: nonce,
        MAC_HEADER: mac(secret, "request", method, path, byte_range, stamp_s, nonce),
    }
    if byte_range:
        headers["Range"] = byte_range
    return headers


class Gate:
    """What the server believes of a request: the deployment's MAC, a time inside the window, a fresh nonce."""

    def __init__(self, secret: bytes):
        self.secret, self.lock = secret, threading.Lock()
        self.nonces: collections.OrderedDict = collections.OrderedDict()
        self.said: dict[str, float] = {}

    def check(self, method: str, path: str, headers) -> str | None:
        """None for a request to answer, else why it is refused."""
        stamp_s, nonce = headers.get(TIME_HEADER) or "", headers.get(NONCE_HEADER) or ""
        want = mac(self.secret, "request", method, path, headers.get("Range") or "", stamp_s, nonce)
        if not hmac.compare_digest(headers.get(MAC_HEADER) or "", want):
            return "bad MAC (not signed with this deployment's secret)"
        try:
            skew = abs(time.time() - int(stamp_s))
        except ValueError:
            return "no request time"
        if skew > CLOCK_WINDOW_S:
            return f"request time {skew:.0f}s from this host's clock (are the clocks synchronised?)"
        with self.lock:
            if nonce in self.nonces:
                return "replayed (nonce already used)"
            self.nonces[nonce] = True
            while len(self.nonces) > MAX_NONCES:
                self.nonces.popitem(last=False)
        return None

    def say(self, peer: str, why: str) -> None:
        """One journal line per peer and reason a minute, the table bounded."""
        key, now = f"{peer} {why}", time.monotonic()
        with self.lock:
            if now - self.said.get(key, -60.0) < 60:
                return
            if len(self.said) > 256:
                self.said.clear()
            self.said[key] = now
        log(f"refused {peer}: {why}")


class PeerHandler(BaseHTTPRequestHandler):
    """One request of a member (its address was checked at accept): the manifest or a listed file."""

    protocol_version = "HTTP/1.1"
    server_version, sys_version = "", ""
    timeout = READ_TIMEOUT_S

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def send_error(self, code, message=None, explain=None):  # no page naming the server
        self.close_connection = True
        self._empty(code)

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        server = self.server
        server.touch()
        why = server.gate.check("GET", self.path, self.headers)
        if why:
            server.gate.say(self.client_address[0], why)
            self.close_connection = True
            return self._empty(403)
        self.connection.settimeout(SEND_TIMEOUT_S)
        if self.path == "/manifest":
            return self._manifest()
        rel = urllib.parse.unquote(self.path[len("/files/") :]) if self.path.startswith("/files/") else ""
        entry = server.files.get(rel)
        if entry is None:
            return self._empty(404)
        self._file(entry)

    def _manifest(self) -> None:
        body = self.server.manifest
        self.send_response(200)
        self.send_header(MAC_HEADER, mac(self.server.gate.secret, "manifest", self.headers[NONCE_HEADER], body))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _file(self, entry: dict) -> None:
        handle = self.server.open_file(entry)
        if handle is None:
            return self._empty(404)
        with handle:
            size = entry["size"]
            start = range_start(self.headers.get("Range"), size)
            if start is None:
                return self._empty(416)
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.send_header("Content-Length", str(size - start))
            self.end_headers()
            if size > start:
                self.connection.sendfile(handle, start, size - start)


def range_start(header: str | None, size: int) -> int | None:
    """Where a "bytes=N-" request starts (0 without one); None for a range this server does not serve."""
    if not header:
        return 0
    found = re.fullmatch(r"bytes=(\d+)-", header.strip())
    if not found or int(found.group(1)) >= max(size, 1):
        return None
    return int(found.group(1))


def member_addresses(names: list[str]) -> set[str]:
    out = set()
    for name in names:
        try:
            out |= {info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
        except OSError:
            out.add(name)
    return out


class PeerServer(socketserver.TCPServer):
    """Bound to this host's cluster address; a stranger is closed at accept (nothing read); a thread per
    connection, at most ``max_peers`` peers and STREAMS_PER_PEER connections each (more are closed)."""

    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, args, gate: Gate, manifest: bytes, files: list[dict]):
        self.address_family = socket.AF_INET6 if ":" in args.bind else socket.AF_INET
        self.root, self.gate, self.manifest = os.path.realpath(args.root), gate, manifest
        self.files = {f["path"]: f for f in files}
        self.members, self.max_peers = member_addresses(args.members), args.max_peers
        self.active: collections.Counter = collections.Counter()
        self.lock, self.last = threading.Lock(), time.monotonic()
        super().__init__((args.bind, args.port), PeerHandler)

    def touch(self) -> None:
        self.last = time.monotonic()

    def verify_request(self, request, client_address) -> bool:
        if client_address[0] in self.members:
            return True
        self.gate.say(client_address[0], "not a host of this deployment")
        return False

    def process_request(self, request, client_address) -> None:
        peer = client_address[0]
        with self.lock:
            busy = self.active[peer] >= STREAMS_PER_PEER or (
                peer not in self.active and len(self.active) >= self.max_peers
            )
            if not busy:
                self.active[peer] += 1
        if busy:
            self.gate.say(peer, f"busy ({self.max_peers} peers, {STREAMS_PER_PEER} connections each)")
            return self.shutdown_request(request)
        threading.Thread(target=self._serve_one, args=(request, client_address), daemon=True).start()

    def _serve_one(self, request, client_address) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback per request
            self.gate.say(client_address[0], f"request failed: {type(exc).__name__}")
        finally:
            self.shutdown_request(request)
            with self.lock:
                self.active[client_address[0]] -= 1
                if self.active[client_address[0]] <= 0:
                    del self.active[client_address[0]]
            self.touch()

    def open_file(self, entry: dict):
        """The listed file as a regular file inside the model directory, opened; None otherwise."""
        path = os.path.join(self.root, entry["path"])
        real = os.path.realpath(path)
        if not real.startswith(self.root + os.sep) or real != path:
            return None  # a link (to anywhere): only the files themselves are lent
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        handle = os.fdopen(fd, "rb")
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_size != entry["size"]:
            handle.close()
            return None
        return handle

    def idle_for(self) -> float:
        with self.lock:
            return 0.0 if self.active else time.monotonic() - self.last


def notify_ready() -> None:
    """systemd's READY=1 (Type=notify): the deploy's start returns once this server listens."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect("\0" + path[1:] if path.startswith("@") else path)
        sock.sendall(b"READY=1")


def serve(args) -> int:
    with open(os.path.join(args.root, MANIFEST), "rb") as handle:
        manifest = handle.read(MAX_MANIFEST)
    try:
        data = json.loads(manifest)
        files = [checked_entry(f) for f in data["files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"{args.root}: the manifest is not usable ({exc}): nothing to lend") from None
    server = PeerServer(args, Gate(read_secret(args.secret_file)), manifest, files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(
        f"lending {len(files)} files of {args.root} on {args.bind}:{args.port} to {', '.join(args.members)} "
        f"(at most {args.max_peers} at once)"
    )
    notify_ready()
    while server.idle_for() < args.idle_exit:
        time.sleep(1)
    log(f"no request for {args.idle_exit}s: stopping")
    server.shutdown()
    return 0


# --------------------------------------------------------------------------- fetch: from a peer


class PeerClient:
    """One connection to the peer, from this host's cluster address, every request signed."""

    def __init__(self, config: dict, secret: bytes):
        self.config, self.secret, self.conn, self.sent = config, secret, None, {}

    def _connect(self) -> http.client.HTTPConnection:
        source = self.config.get("source")
        conn = http.client.HTTPConnection(
            self.config["peer"],
            int(self.config["port"]),
            timeout=SEND_TIMEOUT_S,
            source_address=(source, 0) if source else None,
        )
        try:
            conn.connect()
        except OSError as exc:
            if not source or exc.errno != errno.EADDRNOTAVAIL:
                raise
            log(f"cannot send from this host's address {source} ({exc.strerror}); using the default route")
            self.config["source"] = None
            return self._connect()
        return conn

    def get(self, path: str, byte_range: str = "") -> http.client.HTTPResponse:
        """One signed request (``self.sent``: its headers); a refused connection is tried again for a few
        seconds (the peer's server may be starting)."""
        for attempt in range(20):
            try:
                self.conn = self.conn or self._connect()
                break
            except ConnectionRefusedError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        self.sent = signed_headers(self.secret, "GET", path, byte_range)
        self.conn.request("GET", path, headers=self.sent)
        return self.conn.getresponse()

    def close(self) -> None:
        if self.conn:
            self.conn.close()
        self.conn = None


def peer_manifest(config: dict, secret: bytes) -> tuple[bytes, dict]:
    """The peer's manifest, believed only with its MAC over this request's nonce."""
    client = PeerClient(config, secret)
    try:
        response = client.get("/manifest")
        body = response.read(MAX_MANIFEST)
        signature = response.getheader(MAC_HEADER) or ""
    except (OSError, http.client.HTTPException) as exc:
        raise Refused(f"cannot get the manifest from the peer {config['peer']}: {exc}") from None
    finally:
        client.close()
    if response.status != 200:
        raise Refused(
            f"the peer {config['peer']} refused the manifest (HTTP {response.status}): is this host one of "
            "the deployment's, with its secret?"
        )
    if not hmac.compare_digest(signature, mac(secret, "manifest", client.sent[NONCE_HEADER], body)):
        raise Refused(f"the manifest from {config['peer']} does not carry the deployment's MAC: refused")
    return body, parse_manifest(body, config["repo"], config["revision"])


def resume_partial(partial: str, entry: dict):
    """(hash of what a partial file holds, its length): where an interrupted fetch goes on."""
    h = hasher(entry)
    try:
        held = os.path.getsize(partial)
    except OSError:
        return h, 0
    if held >= entry["size"]:
        os.unlink(partial)
        return h, 0
    return h, hash_into(h, partial, limit=held)


def stream_into(response, handle, h, progress) -> int:
    got = 0
    while True:
        block = response.read(CHUNK)
        if not block:
            return got
        handle.write(block)
        h.update(block)
        got += len(block)
        progress.add(len(block))


def fetch_once(client: PeerClient, root: str, entry: dict, progress) -> bool:
    """One attempt at a file: resume its partial file, stream the rest; True once it is in place, verified."""
    partial = os.path.join(root, PARTIAL, entry["path"])
    os.makedirs(os.path.dirname(partial), mode=0o700, exist_ok=True)
    h, held = resume_partial(partial, entry)
    response = client.get("/files/" + urllib.parse.quote(entry["path"]), f"bytes={held}-" if held else "")
    if response.status not in (200, 206):
        response.read()
        raise Refused(f"{entry['path']}: the peer answered HTTP {response.status}")
    if held and response.status == 200:  # the whole file after all: start over
        h, held = hasher(entry), 0
    with open(partial, "ab" if held else "wb") as handle:
        got = stream_into(response, handle, h, progress)
        handle.flush()
        os.fsync(handle.fileno())
    if held + got < entry["size"]:
        return False  # cut short: resumed by the next attempt
    if held + got != entry["size"] or h.hexdigest() != expected(entry):
        os.unlink(partial)
        raise Refused(
            f"{entry['path']}: what the peer sent is not the hub's file (size {held + got}, hash "
            f"{h.hexdigest()}, the hub's {expected(entry)}): refused"
        )
    target = os.path.join(root, entry["path"])
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    os.chmod(partial, 0o644)
    os.replace(partial, target)
    return True


def fetch_file(client: PeerClient, root: str, entry: dict, progress) -> None:
    why = "it was cut short"
    for _ in range(RETRIES + 1):
        try:
            if fetch_once(client, root, entry, progress):
                return
        except (OSError, http.client.HTTPException) as exc:
            why = f"{type(exc).__name__}: {exc}"
        client.close()
        time.sleep(1)
    raise Refused(f"{entry['path']}: the peer's connection failed {RETRIES + 1} times ({why}); a rerun resumes")


def fetch_all(config: dict, secret: bytes, files: list[dict], progress) -> tuple[int, int, list[str]]:
    """Every file not already here with the hub's hash, ``streams`` at a time: (files fetched, bytes fetched,
    problems). A file already here counts in the progress as done."""
    work, lock = collections.deque(files), threading.Lock()
    counts, problems = [0, 0], []

    def stream() -> None:
        client = PeerClient(config, secret)
        try:
            while True:
                with lock:
                    if not work or problems:
                        return
                    entry = work.popleft()
                if file_problem(config["root"], entry) is None:
                    progress.add(entry["size"])
                    continue
                try:
                    fetch_file(client, config["root"], entry, progress)
                except Refused as exc:
                    with lock:
                        problems.append(str(exc))
                    return
                with lock:
                    counts[0], counts[1] = counts[0] + 1, counts[1] + entry["size"]
        finally:
            client.close()

    threads = [threading.Thread(target=stream) for _ in range(max(1, min(config.get("streams", 4), len(files))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts[0], counts[1], problems


def fetch(config: dict) -> int:
    secret = read_secret(config["secret_file"])
    manifest, parsed = peer_manifest(config, secret)
    files = parsed["files"]
    os.makedirs(config["root"], mode=0o755, exist_ok=True)
    progress = Progress(f"weights from {config['peer']}", sum(f["size"] for f in files), config.get("progress_s", 10))
    fetched, size, problems = fetch_all(config, secret, files, progress)
    took = progress.finish()
    if problems:
        raise Refused("\n".join(problems))
    mark_verified(config, manifest)
    log(
        f"weights: {fetched} files ({human(size)}) from {config['peer']} in {took:.1f}s, {len(files) - fetched} "
        f"already here; verified against the hub's hashes (commit {parsed['commit']})"
    )
    return 0


def verify(config: dict) -> int:
    with open(os.path.join(config["root"], MANIFEST), "rb") as handle:
        manifest = parse_manifest(handle.read(MAX_MANIFEST), config["repo"], config["revision"])
    total = sum(f["size"] for f in manifest["files"])
    progress = Progress("verifying against the hub's hashes", total, config.get("progress_s", 10))
    problems = verify_all(config["root"], manifest["files"], config.get("verify_workers", 4), progress)
    progress.finish()
    if problems:
        raise Refused("\n".join(problems))
    log(f"weights: {len(manifest['files'])} files verified against the hub's hashes (commit {manifest['commit']})")
    return 0


def serve_arguments(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser(prog="ironserve-weights-peer serve")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--members", type=lambda s: [m for m in s.split(",") if m], required=True)
    parser.add_argument("--max-peers", type=int, default=4)
    parser.add_argument("--idle-exit", type=float, default=300)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    modes = {"download": download, "fetch": fetch, "verify": verify}
    if len(argv) < 2 or argv[1] not in (*modes, "serve"):
        print(f"usage: {argv[0]} download|fetch|verify CONFIG-JSON | serve OPTIONS", file=sys.stderr)
        return 2
    try:
        if argv[1] == "serve":
            return serve(serve_arguments(argv[2:]))
        return modes[argv[1]](json.loads(argv[2]))
    except Refused as exc:
        print(f"ironserve-weights-peer: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
