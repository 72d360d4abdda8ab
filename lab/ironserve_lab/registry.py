"""The lab's container registry: Debian's docker-registry (the distribution registry 2.8) on the lab bridge.

Runs on this machine, bound to the bridge address only (https://GATEWAY:REGISTRY_PORT), serving what the lab
pushes into <lab dir>/registry/data (kept across `lab down`, like the supply). The binary is the Debian package
the lab's apt repository carries, unpacked under <lab dir>/registry/pkg (nothing is installed on this machine).

TLS with a CA made for this lab (<lab dir>/registry/tls): hosts trust it only where the inventory says so
(``docker_registry_ca``, which roles/container_runtime.py installs in /etc/docker/certs.d/), the way an internal
registry with an internal CA is trusted; Docker then pulls through it as a mirror (``docker_registry_mirror``)
without any insecure-registries exception. ``ironserve lock`` checks the same certificate.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from . import supply
from .state import GATEWAY, REGISTRY_PORT
from .system import LabError, daemon_pid, listening, run, say, spawn_daemon, stop_daemon, wait_for

PACKAGE = "docker-registry"
REPOSITORY = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def registry_dir(root: Path) -> Path:
    return root / "registry"


def address() -> str:
    return f"{GATEWAY}:{REGISTRY_PORT}"


def ca_file(root: Path) -> Path:
    return registry_dir(root) / "tls" / "ca.crt"


def binary(root: Path) -> Path:
    return registry_dir(root) / "pkg" / "usr" / "bin" / "docker-registry"


def ensure_binary(root: Path) -> Path:
    """Debian's docker-registry from the lab's apt repository, unpacked (downloaded there first if missing)."""
    exe = binary(root)
    if exe.is_file():
        return exe
    debs = sorted((supply.supply_dir(root) / "apt").glob(f"{PACKAGE}_*.deb"))
    if not debs:
        supply.publish_debs(root, [PACKAGE])
        debs = sorted((supply.supply_dir(root) / "apt").glob(f"{PACKAGE}_*.deb"))
    if not debs:
        raise LabError(f"{PACKAGE} is not in the lab's apt repository after publishing it")
    (registry_dir(root) / "pkg").mkdir(parents=True, exist_ok=True)
    run(["dpkg-deb", "-x", str(debs[-1]), str(registry_dir(root) / "pkg")])
    return exe


def ensure_tls(root: Path) -> None:
    """A CA of this lab and a server certificate for the bridge address (made once, kept across down/up)."""
    tls = registry_dir(root) / "tls"
    if (tls / "server.crt").exists() and (tls / "ca.crt").exists():
        return
    tls.mkdir(parents=True, exist_ok=True)
    os.chmod(tls, 0o700)
    ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    _ec_request(tls / "ca.key", tls / "ca.crt", "/CN=ironserve lab registry CA", "-x509", "-days", "3650", *ca_ext)
    _ec_request(tls / "server.key", tls / "server.csr", f"/CN={GATEWAY}")
    ext = tls / "server.ext"
    ext.write_text(f"subjectAltName=IP:{GATEWAY}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    signed = ["-CA", str(tls / "ca.crt"), "-CAkey", str(tls / "ca.key"), "-CAcreateserial"]
    run(
        ["openssl", "x509", "-req", "-in", str(tls / "server.csr"), *signed, "-out", str(tls / "server.crt")]
        + ["-days", "3650", "-extfile", str(ext)]
    )
    for key in ("ca.key", "server.key"):
        os.chmod(tls / key, 0o600)
    os.chmod(tls / "ca.crt", 0o644)


def _ec_request(key: Path, out: Path, subject: str, *extra: str) -> None:
    """openssl req with a new P-256 key (unencrypted, 0600 once written): a request, or with -x509 a certificate."""
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", *curve, "-keyout", str(key), "-out", str(out), "-subj", subject, *extra])


def config_text(root: Path) -> str:
    reg = registry_dir(root)
    return (
        "# ironserve lab registry (lab/ironserve_lab/registry.py)\n"
        "version: 0.1\n"
        "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {reg / 'data'}\n  delete:\n    enabled: false\n"
        f"http:\n  addr: {address()}\n  tls:\n    certificate: {reg / 'tls/server.crt'}\n"
        f"    key: {reg / 'tls/server.key'}\n  headers:\n    X-Content-Type-Options: [nosniff]\n"
    )


def _pidfile(root: Path) -> Path:
    return registry_dir(root) / "registry.pid"


def _storage(root: Path) -> Path:
    """The registry's filesystem storage (the distribution registry's own layout under it)."""
    return registry_dir(root) / "data" / "docker" / "registry" / "v2"


def _repository(root: Path, path: str) -> Path:
    if not REPOSITORY.fullmatch(path):
        raise LabError(f"not a repository path: {path!r}")
    return _storage(root) / "repositories" / path


def seed_blob(root: Path, path: str, digest: str, source: Path) -> bool:
    """A blob of this machine's image store put into the registry's storage as a hard link, linked into repository
    ``path`` as a finished upload links it: a 2-3 GB layer in no time instead of 10-15 s of upload through the
    registry. The blob store is content-addressed and never written in place (oci.py), so the two names stay the
    same bytes. False where no link can be made (another filesystem): the caller uploads it."""
    if not DIGEST.fullmatch(digest):
        raise LabError(f"not a blob digest: {digest!r}")
    repository = _repository(root, path)
    hexdigest = digest.removeprefix("sha256:")
    data = _storage(root) / "blobs" / "sha256" / hexdigest[:2] / hexdigest / "data"
    if not data.is_file():
        data.parent.mkdir(parents=True, exist_ok=True)
        staged = data.with_name(f".seed-{os.getpid()}")
        staged.unlink(missing_ok=True)
        try:
            os.link(source, staged)
        except OSError:
            return False
        os.replace(staged, data)
    link = repository / "_layers" / "sha256" / hexdigest / "link"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.write_text(digest)
    return True


def forget_tags(root: Path, path: str) -> bool:
    """Drop a repository's tags from the lab registry (its layers and manifests stay linked, as after any push), so
    the next deploy builds and pushes it again, uploading only what the repository lacks; True when it had tags."""
    tags = _repository(root, path) / "_manifests" / "tags"
    if not tags.is_dir():
        return False
    shutil.rmtree(tags)
    return True


def server_pid(root: Path) -> int | None:
    return daemon_pid(_pidfile(root), "docker-registry", str(registry_dir(root)))


def start_server(root: Path) -> None:
    exe = ensure_binary(root)
    ensure_tls(root)
    reg = registry_dir(root)
    (reg / "data").mkdir(parents=True, exist_ok=True)
    cfg = reg / "config.yml"
    text = config_text(root)
    if not cfg.exists() or cfg.read_text() != text:
        cfg.write_text(text)
        stop_server(root)
    if server_pid(root):
        return
    proc = spawn_daemon([str(exe), "serve", str(cfg)], reg / "registry.log")
    _pidfile(root).write_text(f"{proc.pid}\n")
    wait_for(lambda: server_pid(root) and listening(GATEWAY, REGISTRY_PORT), 15, what="the lab registry")
    say(f"registry: https://{address()} (Debian {PACKAGE}; CA {ca_file(root)})")


def stop_server(root: Path) -> None:
    stop_daemon(_pidfile(root), "docker-registry", str(registry_dir(root)), what="registry")
