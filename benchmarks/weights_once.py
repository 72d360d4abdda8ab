"""Hub bytes per host count: the weights of N hosts from the hub once, the rest from peers (offline, on loopback).

Each "host" is a loopback address (127.0.0.11, .12, ...) with its own model directory. The real pieces run: the
lab's hub (lab/ironserve_lab/hubd.py) serving a checkpoint of ``--size-mb`` MB in ``--files`` files, the
controller's Distribution (roles/weights_peers.py, in gevent greenlets as pyinfra runs one operation on every
host), and files/bin/ironserve_weights_peer.py for the download (with a stand-in `hf download` that fetches through
the hub's resolve URLs), the lending units (processes bound to their host's address, members only, signed
requests) and the fetches. Prints, for each host count, the bytes the hub served against the model's bytes, the
wall time, and what every host downloading on its own would have cost the hub.

    python benchmarks/weights_once.py [--hosts 1,2,4,8] [--size-mb 64] [--files 4] [--fanout 2]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
import tempfile
import time
from pathlib import Path

from gevent import monkey

monkey.patch_all(thread=False)  # the Distribution waits and runs subprocesses in greenlets, as under pyinfra

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab"))

import gevent  # noqa: E402
from gevent import subprocess  # noqa: E402
from ironserve_lab import hub as lab_hub  # noqa: E402

from roles import weights_peers as wp  # noqa: E402

HELPER = ROOT / "files" / "bin" / "ironserve_weights_peer.py"
REPO = "bench/weights"
STAND_IN_HF = """
import json, os, sys, urllib.request
repo, root, commit = sys.argv[1], sys.argv[3], sys.argv[5]
hub = os.environ["HF_ENDPOINT"]
for entry in json.load(urllib.request.urlopen(f"{hub}/api/models/{repo}/tree/{commit}?recursive=true")):
    with urllib.request.urlopen(f"{hub}/{repo}/resolve/{commit}/{entry['path']}") as r, \\
            open(os.path.join(root, entry["path"]), "wb") as out:
        while block := r.read(1 << 20):
            out.write(block)
"""


def checkpoint(directory: Path, size_mb: int, files: int) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"architectures": ["Bench"]}\n')
    for i in range(files):
        (directory / f"model-{i + 1:05d}-of-{files:05d}.safetensors").write_bytes(os.urandom(size_mb * 2**20 // files))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRunner:
    """What HostRunner does on hosts, on this machine: the helper as processes, one loopback address per host."""

    def __init__(self, work: Path):
        self.work, self.lenders = work, {}

    def usable(self, member):
        return True

    def _helper(self, *args: str) -> bool:
        out = subprocess.run([sys.executable, str(HELPER), *args], capture_output=True, text=True)
        if out.returncode:
            print(f"{args[0]} failed: {out.stdout[-1000:]}{out.stderr[-2000:]}", file=sys.stderr)
        return out.returncode == 0

    def download(self, member):
        return self._helper("download", json.dumps(member.download))

    def lend(self, source, members):
        lend = source.lend
        self.lenders[source.name] = proc = subprocess.Popen(
            [
                sys.executable,
                str(HELPER),
                "serve",
                "--bind",
                lend["bind"],
                "--port",
                str(lend["port"]),
                "--root",
                lend["path"],
                "--secret-file",
                lend["secret"],
                "--members",
                ",".join(members),
                "--max-peers",
                str(lend["fanout"]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return b"lending" in proc.stdout.readline()

    def stop(self, source):
        proc = self.lenders.pop(source.name)
        proc.kill()
        proc.wait()

    def fetch(self, member, source):
        return self._helper("fetch", json.dumps({**member.fetch, "peer": source.address}))

    def say(self, member, text, error=False):
        pass

    @staticmethod
    def sleep(seconds):
        gevent.sleep(seconds)


def members(work: Path, hub_url: str, n: int, fanout: int, key: Path) -> list[wp.Member]:
    script = work / "hf.py"
    script.write_text(STAND_IN_HF)
    out, port = [], free_port()  # one port on every host's address, as weights_peer_port
    for i in range(1, n + 1):
        address, root = f"127.0.0.{10 + i}", work / f"host{i}" / "model"
        root.parent.mkdir(parents=True)
        common = {"repo": REPO, "revision": "main", "root": str(root), "marker": str(root.parent / "marker")}
        download = {
            **common,
            "endpoint": hub_url,
            "hf": [sys.executable, str(script), REPO, "--local-dir", str(root)],
            "env": {"HF_ENDPOINT": hub_url},
            "progress_s": 3600,
        }
        fetch = {**common, "port": port, "source": address, "secret_file": str(key), "progress_s": 3600, "streams": 4}
        lend = {"path": str(root), "bind": address, "port": port, "secret": str(key), "fanout": fanout}
        member = wp.Member(f"host{i}", address, download, fetch, lend)
        out.append(member)
    return out


def run(n: int, size_mb: int, files: int, fanout: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checkpoint(work / "hub" / "model", size_mb, files)
        port, status = free_port(), work / "hub" / "served.json"
        hub = lab_hub.start_local("127.0.0.1", port, {REPO: str(work / "hub" / "model")}, status, work / "hub" / "pid")
        key = work / "key"
        key.write_text(secrets.token_hex(32))
        dist = wp.Distribution(fanout)
        for member in members(work, f"http://127.0.0.1:{port}", n, fanout, key):
            dist.add(member, False)
        runner = LocalRunner(work)
        started = time.monotonic()
        jobs = [gevent.spawn(dist.obtain, runner, name) for name in dist.members]
        gevent.joinall(jobs, raise_error=True)
        took = time.monotonic() - started
        gevent.sleep(0.3)  # the hub's count is written once each answer is out
        served = json.loads(status.read_text())
        hub.kill()
        hub.wait()
        for job in jobs:
            assert job.value, "a host did not get the weights"
        return {"hosts": n, "served": served["bytes_served"], "model": served["model_bytes"], "seconds": took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", default="1,2,4,8")
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--fanout", type=int, default=2)
    args = parser.parse_args()
    print(f"model: {args.size_mb} MB in {args.files} files; fan-out {args.fanout}; hub and hosts on loopback")
    print(f"{'hosts':>5}  {'hub bytes':>12}  {'x model':>7}  {'each from the hub':>17}  {'wall s':>6}")
    for n in (int(x) for x in args.hosts.split(",")):
        r = run(n, args.size_mb, args.files, args.fanout)
        print(
            f"{r['hosts']:>5}  {r['served']:>12}  {r['served'] / r['model']:>7.3f}  "
            f"{r['hosts'] * r['model']:>17}  {r['seconds']:>6.1f}"
        )


if __name__ == "__main__":
    main()
