"""Container images without a Docker engine on this machine: layers, image config, manifest, registry push.

The lab builds its images on the lab machine (no dockerd here) as Docker image manifests (schema 2) in an
OCI-layout-like blob store (``<dir>/blobs/sha256/<hex>``, one small JSON file naming each image's manifest), then pushes them to the lab
registry over the Docker Registry HTTP API v2 (the same calls ``docker push`` makes). Layers are tars of
directories written by GNU tar with a fixed order, owner and mtime, so a layer's digest depends on its content
only. They are not compressed (Docker's media type for a plain tar layer; the engine detects the format as it
unpacks): the registry and every pulling host are on this machine's own bridge, where gzip only spends CPU, about
30 s to write the runtime image's 3 GB layer here and as much again for each host that pulls it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ironserve.registry import MANIFEST_V2, Registry, RegistryError

CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"
CHUNK = 1 << 20


def blob_path(store: Path, digest: str) -> Path:
    return store / "blobs" / "sha256" / digest.removeprefix("sha256:")


def put_blob(store: Path, data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = blob_path(store, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return {"digest": digest, "size": len(data)}


def layer_from_dir(
    store: Path,
    src: Path,
    excludes: tuple[str, ...] = (),
    *,
    normalize_mtime: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """A plain tar layer of everything under ``src`` (numeric owners kept, no xattrs): {digest, size, diff_id}
    (an uncompressed layer's digest is its diff_id)."""
    cmd = ["tar", "--sort=name", "--numeric-owner", "--one-file-system", "-C", str(src), "-cf", "-"]
    if normalize_mtime:
        cmd[1:1] = ["--mtime=@0", "--clamp-mtime"]
    for pattern in excludes:
        cmd.insert(1, f"--exclude={pattern}")
    cmd.append(".")

    def chunks():
        size, last = 0, time.monotonic()
        with subprocess.Popen(cmd, stdout=subprocess.PIPE) as tar:
            while chunk := tar.stdout.read(CHUNK):
                yield chunk
                size += len(chunk)
                if progress and time.monotonic() - last > 15:
                    progress(f"layer of {src.name}: {size / 2**20:.0f} MiB so far")
                    last = time.monotonic()
            if tar.wait() != 0:
                raise RuntimeError(f"tar of {src} failed (rc={tar.returncode})")

    return put_layer(store, chunks())


def put_layer(store: Path, chunks: Iterable[bytes]) -> dict:
    """A plain tar layer written from ``chunks`` into the store under its sha256 (nothing left when they fail):
    {digest, size, diff_id} (an uncompressed layer's digest is its diff_id)."""
    blobs = store / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    raw, size = hashlib.sha256(), 0
    with tempfile.NamedTemporaryFile(dir=blobs, delete=False) as out:
        try:
            for chunk in chunks:
                raw.update(chunk)
                out.write(chunk)
                size += len(chunk)
        except BaseException:
            os.unlink(out.name)
            raise
    digest = "sha256:" + raw.hexdigest()
    os.chmod(out.name, 0o644)
    os.replace(out.name, blob_path(store, digest))
    return {"digest": digest, "size": size, "diff_id": digest}


def write_image(store: Path, ref_file: Path, layers: list[dict], config: dict, history: list[str]) -> dict:
    """Image config + schema 2 manifest into the store, named by ``ref_file``; {manifest_digest, config_digest}."""
    image = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": h} for h in history],
    }
    cfg = put_blob(store, json.dumps(image, sort_keys=True, separators=(",", ":")).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_V2,
        "config": {"mediaType": CONFIG_V1, **cfg},
        "layers": [{"mediaType": LAYER_TAR, "digest": layer["digest"], "size": layer["size"]} for layer in layers],
    }
    blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
    ref = put_blob(store, blob)
    result = {"manifest_digest": ref["digest"], "config_digest": cfg["digest"]}
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    ref_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


def cached_layer(store: Path, record: Path, make: Callable[[], dict]) -> dict:
    """The layer ``record`` names in ``store`` ({digest, size, diff_id}), made by ``make`` (and recorded) when the
    record or its blob is missing."""
    try:
        layer = json.loads(record.read_text())
        if blob_path(store, layer["digest"]).is_file():
            return layer
    except (OSError, ValueError, KeyError):
        pass
    record.parent.mkdir(parents=True, exist_ok=True)
    layer = make()
    record.write_text(json.dumps(layer) + "\n")
    return layer


def read_image(store: Path, ref_file: Path) -> dict | None:
    """{manifest_digest, config_digest} of a complete image in the store, None when any blob is missing."""
    try:
        ref = json.loads(ref_file.read_text())
        manifest = json.loads(blob_path(store, ref["manifest_digest"]).read_bytes())
    except (OSError, ValueError, KeyError):
        return None
    blobs = [manifest["config"]["digest"]] + [layer["digest"] for layer in manifest["layers"]]
    return ref if all(blob_path(store, d).is_file() for d in blobs) else None


def push(
    registry: Registry,
    store: Path,
    ref_file: Path,
    repo: str,
    tags: list[str],
    say: Callable[[str], None] = lambda _m: None,
    mount_from: Sequence[str] = (),
    seed: Callable[[str, str, Path], bool] | None = None,
) -> str:
    """Push a stored image as repo:tag for each tag (blobs the registry has are skipped, blobs it holds in one of
    the repositories ``mount_from`` are mounted, blobs ``seed(repo, digest, path)`` puts into its storage are not
    uploaded); its digest."""
    ref = read_image(store, ref_file)
    if not ref:
        raise RegistryError(f"no complete image {ref_file.name} in {store}")
    blob = blob_path(store, ref["manifest_digest"]).read_bytes()
    manifest = json.loads(blob)
    for item in [manifest["config"], *manifest["layers"]]:
        if registry.has_blob(repo, item["digest"]):
            continue
        if any(registry.mount_blob(repo, item["digest"], source) for source in mount_from):
            continue
        if seed and seed(repo, item["digest"], blob_path(store, item["digest"])):
            continue
        say(f"pushing {repo} blob {item['digest'][:19]} ({item['size'] / 2**20:.0f} MiB)")
        registry.push_blob(repo, item["digest"], blob_path(store, item["digest"]))
    for tag in tags:
        if registry.digest(repo, tag) == ref["manifest_digest"]:
            continue
        registry.put_manifest(repo, tag, blob, manifest["mediaType"])
    return ref["manifest_digest"]
