"""The lab's model hub: a Hugging Face-compatible hub on the lab bridge, serving the lab's models, counting bytes.

Stand-alone (standard library only), run as `python3 hubd.py` by hub.py, bound to the lab bridge address only (the
lab is air-gapped: this is the hub its hosts have). Each repository is a directory of the lab's (the generated tiny
model under the hub id its recipes name). Enough of the hub's API for `hf download` (huggingface_hub 1.x) and
ironserve's weights helper:

- ``GET /api/models/REPO`` and ``/api/models/REPO/revision/REV`` (``?blobs=true``: every sibling's blob id, size
  and LFS sha256): the commit a revision names, and the files;
- ``GET /api/models/REPO/tree/REV[/PATH]`` (``?recursive=true``): the tree listing (oid, size, lfs);
- ``HEAD``/``GET /REPO/resolve/REV/FILE``: the file, with the hub's headers (X-Repo-Commit, ETag, X-Linked-Etag and
  X-Linked-Size for LFS files) and ``Range: bytes=N-[M]`` (206), which `hf download` resumes with.

REV is ``main`` or the repository's commit. A file is LFS (sha256 oid) when its suffix is a weights format or it is
larger than 10 MiB, else a git blob (sha1 of "blob SIZE\\0" and the content), as on the hub. The commit is a hash of
the listing, so the same files give the same commit. Errors carry the hub's X-Error-Code (RepoNotFound,
RevisionNotFound, EntryNotFound).

Every byte of every response body is counted, per repository, into the status file (``--status``, JSON,
rewritten after each response): ``{"bytes_served", "model_bytes", "requests", "repos": {REPO: {...}}}``, which
`ironserve lab status` reports as ``hub``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx", ".ckpt")
LFS_MIN_SIZE = 10 << 20
CHUNK = 1 << 20


class Repo:
    """One repository: a directory's files (hidden ones left out), their hashes and the commit they make."""

    def __init__(self, repo_id: str, directory: str):
        self.id, self.directory, self.files = repo_id, directory, {}
        for top, dirs, names in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(n for n in names if not n.startswith(".")):
                path = os.path.join(top, name)
                self.files[os.path.relpath(path, directory)] = self._entry(path)
        listing = "".join(f"{p} {e['oid']}\n" for p, e in sorted(self.files.items()))
        self.commit = hashlib.sha1(listing.encode()).hexdigest()
        self.model_bytes = sum(e["size"] for e in self.files.values())

    @staticmethod
    def _entry(path: str) -> dict:
        data = open(path, "rb").read()
        entry = {"size": len(data), "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
        if path.endswith(LFS_SUFFIXES) or len(data) > LFS_MIN_SIZE:
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def etag(self, rel: str) -> str:
        entry = self.files[rel]
        return entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]

    def info(self, blobs: bool) -> dict:
        siblings = []
        for rel, entry in sorted(self.files.items()):
            sibling = {"rfilename": rel}
            if blobs:
                sibling.update({"blobId": entry["oid"], "size": entry["size"]})
                if "lfs" in entry:
                    lfs = entry["lfs"]
                    sibling["lfs"] = {"sha256": lfs["oid"], "size": lfs["size"], "pointerSize": lfs["pointerSize"]}
            siblings.append(sibling)
        return {
            "_id": self.commit[:24],
            "id": self.id,
            "modelId": self.id,
            "sha": self.commit,
            "private": False,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "createdAt": "2026-01-01T00:00:00.000Z",
        }

    def tree(self, under: str, recursive: bool) -> list[dict]:
        prefix = f"{under.strip('/')}/" if under.strip("/") else ""
        out, folders = [], set()
        for rel, entry in sorted(self.files.items()):
            if not rel.startswith(prefix):
                continue
            rest = rel[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/", 1)[0])
                continue
            out.append(
                {
                    "type": "file",
                    "path": rel,
                    "oid": entry["oid"],
                    "size": entry["size"],
                    **({"lfs": entry["lfs"]} if "lfs" in entry else {}),
                }
            )
        out += [{"type": "directory", "path": f, "oid": "0" * 40, "size": 0} for f in sorted(folders)]
        return out


class Counters:
    """Bytes served per repository, kept in the status file."""

    def __init__(self, path: str, repos: dict[str, Repo]):
        self.path, self.lock = path, threading.Lock()
        self.repos = {
            r.id: {
                "bytes_served": 0,
                "requests": 0,
                "model_bytes": r.model_bytes,
                "files": len(r.files),
                "commit": r.commit,
            }
            for r in repos.values()
        }
        self.other = 0  # bytes of answers naming no repository (errors)
        self.write()

    def add(self, repo: str | None, n: int, request: bool = False) -> None:
        with self.lock:
            if repo in self.repos:
                self.repos[repo]["bytes_served"] += n
                self.repos[repo]["requests"] += int(request)
            else:
                self.other += n

    def write(self) -> None:
        with self.lock:
            data = {
                "bytes_served": sum(r["bytes_served"] for r in self.repos.values()) + self.other,
                "model_bytes": sum(r["model_bytes"] for r in self.repos.values()),
                "requests": sum(r["requests"] for r in self.repos.values()),
                "repos": self.repos,
            }
            tmp = f"{self.path}.tmp-{threading.get_ident()}"
            with open(tmp, "w") as handle:
                json.dump(data, handle, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ironserve-lab-hub"
    sys_version = ""
    repo: str | None = None

    def log_message(self, fmt, *args):  # one line per request, to the hub's log
        sys.stderr.write(f"{self.address_string()} {fmt % args}\n")

    def do_HEAD(self):  # noqa: N802
        self._route(body=False)

    def do_GET(self):  # noqa: N802
        self._route(body=True)

    def _route(self, body: bool) -> None:
        self.repo = None
        path = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(path.query)
        parts = [urllib.parse.unquote(p) for p in path.path.split("/")[1:]]
        try:
            if parts[:2] == ["api", "models"]:
                self._api(parts[2:], query, body)
            else:
                self._resolve(parts, body)
        finally:
            self.server.counters.add(self.repo, 0, request=True)
            self.server.counters.write()

    def _find_repo(self, parts: list[str]) -> tuple[Repo | None, list[str]]:
        """The repository the path starts with (ids with or without an organisation), and the rest."""
        for n in (2, 1):
            repo = self.server.repos.get("/".join(parts[:n]))
            if repo:
                self.repo = repo.id
                return repo, parts[n:]
        return None, parts

    def _api(self, parts: list[str], query: dict, body: bool) -> None:
        repo, rest = self._find_repo(parts)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found", body)
        if not rest or rest[0] == "revision":
            if rest and not self._revision(repo, rest[1:2], body):
                return
            blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
            return self._json(repo.info(blobs), body)
        if rest[0] == "tree" and len(rest) >= 2:
            if not self._revision(repo, rest[1:2], body):
                return
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            return self._json(repo.tree("/".join(rest[2:]), recursive), body)
        self._error(404, "EntryNotFound", "Not found", body)

    def _revision(self, repo: Repo, rev: list[str], body: bool) -> bool:
        if rev and rev[0] in ("main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev[0] if rev else ''}", body)
        return False

    def _resolve(self, parts: list[str], body: bool) -> None:
        repo, rest = self._find_repo(parts)
        if repo is None or len(rest) < 3 or rest[0] != "resolve":
            return self._error(404, "RepoNotFound", "Repository not found", body)
        if not self._revision(repo, rest[1:2], body):
            return
        rel = "/".join(rest[2:])
        if rel not in repo.files:
            return self._error(404, "EntryNotFound", f"{rel} does not exist", body, commit=repo.commit)
        self._file(repo, rel, body)

    def _file(self, repo: Repo, rel: str, body: bool) -> None:
        entry, size = repo.files[rel], repo.files[rel]["size"]
        found = re.fullmatch(r"bytes=(\d+)-(\d*)", (self.headers.get("Range") or "").strip())
        start, end = (int(found.group(1)), int(found.group(2) or size - 1)) if found else (0, size - 1)
        if found and (start >= size or end < start):
            return self._error(416, "RangeNotSatisfiable", "Range not satisfiable", body)
        end = min(end, size - 1)
        self.send_response(206 if found else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{repo.etag(rel)}"')
        if "lfs" in entry:
            self.send_header("X-Linked-Etag", f'"{repo.etag(rel)}"')
            self.send_header("X-Linked-Size", str(size))
        if found:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(max(end - start + 1, 0)))
        self.end_headers()
        if body and size:
            with open(os.path.join(repo.directory, rel), "rb") as handle:
                handle.seek(start)
                left = end - start + 1
                while left > 0:
                    block = handle.read(min(CHUNK, left))
                    if not block:
                        break
                    self._send(block)
                    left -= len(block)

    def _send(self, data: bytes) -> None:
        self.wfile.write(data)
        self.server.counters.add(self.repo, len(data))

    def _json(self, value, body: bool, status: int = 200, headers: dict | None = None) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for key, val in (headers or {}).items():
            self.send_header(key, val)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self._send(data)

    def _error(self, status: int, code: str, message: str, body: bool, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, **({"X-Repo-Commit": commit} if commit else {})}
        self._json({"error": message}, body, status, headers)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="the lab's Hugging Face-compatible hub")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--repos", required=True, help='JSON: {"org/name": "/directory", ...}')
    parser.add_argument("--status", required=True, help="the status file (bytes served, JSON)")
    parser.add_argument("--pidfile", required=True)
    args = parser.parse_args(argv)
    repos = {rid: Repo(rid, directory) for rid, directory in json.loads(args.repos).items()}
    server = ThreadingHTTPServer((args.bind, args.port), HubHandler)
    server.daemon_threads = True
    server.repos, server.counters = repos, Counters(args.status, repos)
    with open(args.pidfile + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()}\n")
    os.replace(args.pidfile + ".tmp", args.pidfile)  # written once listening: readiness signal
    server.serve_forever()


if __name__ == "__main__":
    main()
