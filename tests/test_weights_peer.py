"""files/bin/ironserve_weights_peer.py, run for real on this machine: the hub download (the lab's hub, hubd.py, on
loopback, with a stand-in `hf` that downloads through the hub's resolve URLs), the lending server and the fetch
(a source at 127.0.0.1, members at 127.0.0.2, a stranger at 127.0.0.3). Checks that only the deployment's signed
requests from its members' addresses are answered, that only the listed files inside the model directory are lent,
that a fetch resumes its partial files with a Range request and refuses what is not the hub's file, and that the
marker the helper writes is what the deploy's fact reads."""

from __future__ import annotations

import argparse
import ast
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ironserve_lab import hub as lab_hub
from ironserve_lab import tiny_model

from ironserve.units import WEIGHTS_PEER
from roles import model_weights as mw

from .host_scripts import load_script

HELPER = Path(__file__).resolve().parent.parent / "files" / "bin" / "ironserve_weights_peer.py"
SOURCE, MEMBER, STRANGER = "127.0.0.1", "127.0.0.2", "127.0.0.3"
REPO, SECRET = "ironserve-lab/tiny-llama", "ab" * 32
# a stand-in for the runtime's `hf download REPO --local-dir DIR --revision COMMIT`: every file of the commit
# through the hub's resolve URLs (the real client is exercised against the same hub in the lab)
STAND_IN_HF = """
import json, os, sys, urllib.request
repo, root, commit = sys.argv[1], sys.argv[3], sys.argv[5]
assert sys.argv[2] == "--local-dir" and sys.argv[4] == "--revision" and len(commit) == 40, sys.argv
hub = os.environ["HF_ENDPOINT"]
tree = json.load(urllib.request.urlopen(f"{hub}/api/models/{repo}/tree/{commit}?recursive=true"))
for entry in tree:
    data = urllib.request.urlopen(f"{hub}/{repo}/resolve/{commit}/{entry['path']}").read()
    if entry["path"] == os.environ.get("CORRUPT"):
        data = data[:-1] + bytes([data[-1] ^ 1])
    os.makedirs(os.path.dirname(os.path.join(root, entry["path"])), exist_ok=True)
    open(os.path.join(root, entry["path"]), "wb").write(data)
"""


def helper_module():
    return load_script(HELPER.name)


def free_port(address: str = SOURCE) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def run_helper(mode: str, config: dict, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HELPER), mode, json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def fact(path: Path) -> dict:
    out = subprocess.run(["sh", "-c", mw.ModelCheckpoint().command(str(path))], capture_output=True, text=True)
    return mw.ModelCheckpoint().process(out.stdout.splitlines())


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The lab's hub serving the generated tiny model on loopback: (its URL, its status file, the model dir)."""
    root = tmp_path_factory.mktemp("hub")
    model = tiny_model.generate(root / "tiny-llama")
    port = free_port()
    status = root / "served.json"
    proc = lab_hub.start_local(SOURCE, port, {REPO: str(model)}, status, root / "pid")
    yield f"http://{SOURCE}:{port}", status, model
    proc.kill()
    proc.wait()


def download_config(hub_url: str, root: Path, tmp: Path) -> dict:
    script = tmp / "hf.py"
    script.write_text(STAND_IN_HF)
    return {
        "endpoint": hub_url,
        "repo": REPO,
        "revision": "main",
        "root": str(root),
        "hf": [sys.executable, str(script), REPO, "--local-dir", str(root)],
        "env": {"HF_ENDPOINT": hub_url},
        "marker": str(tmp / f"marker-{root.name}"),
        "progress_s": 0.05,
    }


@pytest.fixture
def downloaded(hub, tmp_path):
    """A model directory the helper downloaded from the hub and verified: (its path, the download config)."""
    hub_url, _status, _model = hub
    config = download_config(hub_url, tmp_path / "seed", tmp_path)
    out = run_helper("download", config)
    assert out.returncode == 0, out.stdout + out.stderr
    return tmp_path / "seed", config


# --------------------------------------------------------------------------- the hub, once


def test_the_helper_installed_on_hosts_is_this_module_and_needs_only_the_standard_library():
    assert mw.PEER_SRC.resolve() == HELPER and WEIGHTS_PEER.endswith("ironserve-weights-peer")
    tree = ast.parse(HELPER.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert imported and imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_download_pins_the_hubs_commit_verifies_every_file_and_marks_what_the_fact_reads(hub, downloaded):
    _url, _status, model = hub
    seed, config = downloaded
    for name in tiny_model.files():
        assert (seed / name).read_bytes() == (model / name).read_bytes()
    manifest = json.loads((seed / mw.HUB_MANIFEST).read_text())
    entries = {f["path"]: f for f in manifest["files"]}
    safetensors = (model / "model.safetensors").read_bytes()
    assert entries["model.safetensors"]["sha256"] == hashlib.sha256(safetensors).hexdigest()  # LFS: sha256
    config_json = (model / "config.json").read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(config_json) + config_json).hexdigest()
    assert entries["config.json"]["git"] == blob  # a small file: its git blob id
    state = fact(seed)
    assert Path(config["marker"]).read_text().split() == [state["hub_stamp"], REPO, "main"]
    state["hub_verified"] = Path(config["marker"]).read_text().strip()
    assert mw.hub_problems(state, REPO, "main") == [] and mw.hub_problems(state, REPO, "v2") != []
    (seed / "config.json").write_bytes(config_json + b" ")  # a file changed since: the stamp moves
    assert fact(seed)["hub_stamp"] != state["hub_stamp"]


def test_a_downloaded_file_that_is_not_the_hubs_is_removed_and_the_run_fails(hub, tmp_path):
    hub_url, _status, _model = hub
    config = download_config(hub_url, tmp_path / "seed", tmp_path)
    out = run_helper("download", config, env={"CORRUPT": "model.safetensors"})
    assert out.returncode == 1 and "model.safetensors: hash" in out.stderr, out.stderr
    assert not (tmp_path / "seed" / "model.safetensors").exists() and not Path(config["marker"]).exists()
    assert (tmp_path / "seed" / "config.json").exists()  # what is right stays: a rerun fetches the rest


def test_the_download_says_progress_in_bytes_rate_and_eta(downloaded):
    _seed, config = downloaded
    out = run_helper("download", config)  # a rerun: hf's resume finds everything, the check runs again
    assert out.returncode == 0, out.stderr
    assert "weights from the hub (ironserve-lab/tiny-llama): 248.8 kB of 248.8 kB (100%)" in out.stdout
    assert "/s, ETA 0s" in out.stdout and "verified against its hashes (commit " in out.stdout


# --------------------------------------------------------------------------- lending and fetching


@pytest.fixture
def lending(downloaded, tmp_path):
    """The helper lending the downloaded directory on SOURCE to MEMBER: (port, the model directory)."""
    seed, _config = downloaded
    key = tmp_path / "key"
    key.write_text(SECRET + "\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HELPER),
            "serve",
            "--bind",
            SOURCE,
            "--port",
            str(port),
            "--root",
            str(seed),
            "--secret-file",
            str(key),
            "--members",
            MEMBER,
            "--max-peers",
            "2",
            "--idle-exit",
            "60",
        ],
        stdout=open(tmp_path / "serve.log", "w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while "lending" not in (tmp_path / "serve.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port, seed
    proc.kill()
    proc.wait()


def fetch_config(port: int, root: Path, tmp: Path, secret: str = SECRET, source: str = MEMBER) -> dict:
    key = tmp / f"key-{secret[:4]}"
    key.write_text(secret + "\n")
    return {
        "peer": SOURCE,
        "port": port,
        "source": source,
        "root": str(root),
        "secret_file": str(key),
        "repo": REPO,
        "revision": "main",
        "marker": str(tmp / f"marker-{root.name}"),
        "progress_s": 0.05,
        "streams": 2,
    }


def test_a_member_fetches_every_file_verified_and_marked(lending, tmp_path):
    port, seed = lending
    config = fetch_config(port, tmp_path / "peer", tmp_path)
    out = run_helper("fetch", config)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"weights from {SOURCE}: 248.8 kB of 248.8 kB (100%)" in out.stdout and ", ETA " in out.stdout
    assert "7 files (248.8 kB) from 127.0.0.1" in out.stdout
    for name in tiny_model.files():
        assert (tmp_path / "peer" / name).read_bytes() == (seed / name).read_bytes()
    state = fact(tmp_path / "peer")
    assert Path(config["marker"]).read_text().split() == [state["hub_stamp"], REPO, "main"]
    again = run_helper("fetch", config)  # everything here with the hub's hash: nothing moves
    assert again.returncode == 0 and "0 files (0 B)" in again.stdout and "7 already here" in again.stdout
    assert run_helper("verify", config).returncode == 0


def test_a_stranger_is_closed_before_a_byte_is_read_and_a_wrong_secret_gets_nothing(lending, tmp_path):
    port, _seed = lending
    with socket.create_connection((SOURCE, port), timeout=5, source_address=(STRANGER, 0)) as conn:
        try:
            conn.sendall(b"GET /manifest HTTP/1.0\r\n\r\n")
            answer = conn.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            answer = b""
    assert answer == b""
    out = run_helper("fetch", fetch_config(port, tmp_path / "peer", tmp_path, secret="cd" * 32))
    assert out.returncode == 1 and "refused the manifest (HTTP 403)" in out.stderr, out.stderr
    assert not (tmp_path / "peer" / "config.json").exists()
    assert "refused 127.0.0.3: not a host of this deployment" in (tmp_path / "serve.log").read_text()


def signed_get(helper, port: int, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(SOURCE, port, timeout=10, source_address=(MEMBER, 0))
    try:
        signed = helper.signed_headers(SECRET.encode(), "GET", path)
        conn.request("GET", path, headers=signed if headers is None else headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_only_signed_fresh_requests_for_listed_files_inside_the_tree_are_answered(lending, tmp_path):
    helper = helper_module()
    port, seed = lending
    outside = tmp_path / "outside.json"
    outside.write_text("secret")
    assert signed_get(helper, port, "/manifest", headers={})[0] == 403  # unsigned
    headers = helper.signed_headers(SECRET.encode(), "GET", "/files/config.json")
    assert signed_get(helper, port, "/files/config.json", headers)[0] == 200
    assert signed_get(helper, port, "/files/config.json", headers) == (403, b"")  # replayed
    old = helper.signed_headers(SECRET.encode(), "GET", "/manifest")
    old[helper.TIME_HEADER] = str(int(time.time()) - 3600)
    old[helper.MAC_HEADER] = helper.mac(
        SECRET.encode(), "request", "GET", "/manifest", "", old[helper.TIME_HEADER], old[helper.NONCE_HEADER]
    )
    assert signed_get(helper, port, "/manifest", old) == (403, b"")  # too old
    for path in (
        "/files/../../../etc/passwd",
        "/files/%2e%2e/outside.json",
        "/files/.cache/ironserve/hub-manifest.json",
        f"/files/{outside}",
        "/etc/passwd",
    ):
        assert signed_get(helper, port, path) == (404, b""), path
    (seed / "config.json").unlink()
    (seed / "config.json").symlink_to(outside)  # a listed file that is a link out of the tree
    assert signed_get(helper, port, "/files/config.json") == (404, b"")


def test_an_interrupted_fetch_resumes_with_a_range_request(lending, tmp_path, monkeypatch):
    helper = helper_module()
    port, seed = lending
    root = tmp_path / "peer"
    whole = (seed / "model.safetensors").read_bytes()
    partial = root / helper.PARTIAL / "model.safetensors"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(whole[:100_000])
    asked = []
    real_get = helper.PeerClient.get
    monkeypatch.setattr(
        helper.PeerClient,
        "get",
        lambda self, path, byte_range="": asked.append((path, byte_range)) or real_get(self, path, byte_range),
    )
    progress = helper.Progress("t", len(whole), 60)
    config = fetch_config(port, root, tmp_path)
    client = helper.PeerClient(config, SECRET.encode())
    manifest = helper.parse_manifest((seed / helper.MANIFEST).read_bytes(), REPO, "main")
    entry = next(f for f in manifest["files"] if f["path"] == "model.safetensors")
    helper.fetch_file(client, str(root), entry, progress)
    assert asked == [("/files/model.safetensors", "bytes=100000-")]
    assert progress.done == len(whole) - 100_000 and (root / "model.safetensors").read_bytes() == whole
    assert not partial.exists()


def test_what_is_not_the_hubs_file_is_refused_and_never_lands(lending, tmp_path):
    port, seed = lending
    data = bytearray((seed / "model.safetensors").read_bytes())
    data[-1] ^= 1  # the source's copy went bad after it was verified: same size, other bytes
    (seed / "model.safetensors").write_bytes(bytes(data))
    config = fetch_config(port, tmp_path / "peer", tmp_path)
    out = run_helper("fetch", config)
    assert out.returncode == 1 and "is not the hub's file" in out.stderr and "refused" in out.stderr, out.stderr
    assert not (tmp_path / "peer" / "model.safetensors").exists() and not Path(config["marker"]).exists()
    assert not list((tmp_path / "peer").rglob("*.safetensors"))  # nor its partial file


def test_a_manifest_without_the_peers_mac_or_with_a_path_out_of_the_tree_is_refused(tmp_path):
    helper = helper_module()
    good = {
        "repo": REPO,
        "revision": "main",
        "commit": "a" * 40,
        "files": [{"path": "c.json", "size": 1, "git": "b" * 40}],
    }
    assert helper.parse_manifest(json.dumps(good).encode(), REPO, "main")["files"][0]["path"] == "c.json"
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../b", ".cache/x", "a\nb", ""):
        body = {**good, "files": [{"path": bad, "size": 1, "git": "b" * 40}]}
        with pytest.raises(helper.Refused):
            helper.parse_manifest(json.dumps(body).encode(), REPO, "main")
    with pytest.raises(helper.Refused, match="not ironserve-lab/tiny-llama@v2"):
        helper.parse_manifest(json.dumps(good).encode(), REPO, "v2")

    class Forger(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            data = json.dumps(good).encode()
            self.send_response(200)
            self.send_header(
                helper.MAC_HEADER, helper.mac(b"x" * 64, "manifest", self.headers[helper.NONCE_HEADER], data)
            )
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((SOURCE, 0), Forger)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = run_helper("fetch", fetch_config(server.server_address[1], tmp_path / "peer", tmp_path))
    finally:
        server.shutdown()
    assert out.returncode == 1 and "does not carry the deployment's MAC" in out.stderr, out.stderr


def test_a_lender_serves_a_bounded_number_of_peers_and_connections(downloaded, tmp_path):
    helper = helper_module()
    seed, _config = downloaded
    key = tmp_path / "key"
    key.write_text(SECRET)
    args = argparse.Namespace(bind=SOURCE, port=0, root=str(seed), members=[MEMBER, STRANGER], max_peers=1)
    manifest = (seed / helper.MANIFEST).read_bytes()
    server = helper.PeerServer(args, helper.Gate(SECRET.encode()), manifest, json.loads(manifest)["files"])
    closed = []
    server.shutdown_request = closed.append
    server.finish_request = lambda request, address: time.sleep(0.5)
    try:
        for n in range(helper.STREAMS_PER_PEER + 1):
            server.process_request(f"m{n}", (MEMBER, 1000 + n))
        server.process_request("other", (STRANGER, 2000))  # a second peer beyond --max-peers 1
        assert closed[:2] == [f"m{helper.STREAMS_PER_PEER}", "other"]
        assert server.idle_for() == 0.0  # busy: never stops while it lends
    finally:
        server.server_close()


def test_the_stamp_is_the_facts_whatever_the_file_names(tmp_path):
    helper = helper_module()
    root = tmp_path / "m"
    for name in ("a", "a b", "B", "a.b", "sub/z", "é"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / ".cache").mkdir()
    (root / ".cache" / "x").write_text("not listed")
    manifest = b'{"files": []}\n'
    (root / mw.HUB_MANIFEST).parent.mkdir(parents=True)
    (root / mw.HUB_MANIFEST).write_bytes(manifest)
    assert fact(root)["hub_stamp"] == helper.stamp(str(root), manifest)
    shutil.rmtree(root / ".cache" / "ironserve")
    assert fact(root)["hub_stamp"] is None
