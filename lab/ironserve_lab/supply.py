"""Air-gapped supply for lab hosts: an apt repository, a Python package index and plain files.

Layout under <lab dir>/supply/ (served as-is on http://<gateway>:<port>/):
  apt/       flat apt repository: *.deb, Packages(.gz), Release    -> "deb [trusted=yes] URL/apt ./"
  wheels/    wheel/sdist files                                      (pip download)
  simple/    PEP 503 index over wheels/                            -> pip --index-url URL/simple/
  ascend/    Ascend .run installers (stand-ins in the lab)

Filled from this machine's configured registries (its apt sources, its pip config), the
way an internal mirror is filled for an air-gapped cluster. Hosts reach it only over the
lab bridge; the server binds the gateway address only.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .state import GATEWAY, SUPPLY_PORT
from .system import LabError, daemon_pid, listening, run, say, spawn_daemon, stop_daemon, wait_for

HTTPD = Path(__file__).with_name("httpd.py")


def supply_dir(root: Path) -> Path:
    return root / "supply"


def ensure_dirs(root: Path) -> Path:
    sup = supply_dir(root)
    for sub in ("apt", "wheels", "simple", "ascend"):
        (sup / sub).mkdir(parents=True, exist_ok=True)
    return sup


# ---------------------------------------------------------------- apt repository


def _apt_lists_present() -> bool:
    return any(Path("/var/lib/apt/lists").glob("*_Packages*"))


def publish_debs(root: Path, names: list[str]) -> list[str]:
    """Download `names` plus every dependency the base rootfs lacks, then reindex the repo.

    apt resolves against the base rootfs's dpkg status (not this machine's), so the set is
    exactly what a lab host needs to `apt-get install` these packages from the lab repo.
    """
    repo = ensure_dirs(root) / "apt"
    if not names:
        return []
    if not _apt_lists_present():
        say("refreshing this machine's apt lists (apt-get update)")
        run(["apt-get", "update"], check=False)
    status = root / "base" / "var/lib/dpkg/status"
    if not status.exists():
        raise LabError("base rootfs missing; build it before publishing packages")
    with tempfile.TemporaryDirectory(prefix="ironlab-apt-") as tmp:
        (Path(tmp) / "partial").mkdir()
        proc = run(
            [
                "apt-get",
                "install",
                "--download-only",
                "-y",
                "--no-install-recommends",
                "-o",
                f"Dir::State::status={status}",
                "-o",
                f"Dir::Cache::archives={tmp}",
                "-o",
                "Debug::NoLocking=1",
                "-o",
                "APT::Get::AllowUnauthenticated=false",
                *names,
            ],
            check=False,
            env={"DEBIAN_FRONTEND": "noninteractive"},
        )
        if proc.returncode != 0:
            raise LabError(f"could not download {' '.join(names)} for the lab repo:\n{proc.stderr.strip()}")
        got = sorted(p.name for p in Path(tmp).glob("*.deb"))
        for name in got:
            shutil.move(str(Path(tmp) / name), repo / name)
    reindex_apt(root)
    return got


def add_debs(root: Path, debs: list[Path]) -> None:
    repo = ensure_dirs(root) / "apt"
    for deb in debs:
        shutil.copy2(deb, repo / deb.name)
    reindex_apt(root)


def reindex_apt(root: Path) -> None:
    """Write Packages, Packages.gz and Release for the flat repository (dpkg-deb only)."""
    repo = supply_dir(root) / "apt"
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        control = run(["dpkg-deb", "-f", str(deb)]).stdout.rstrip("\n")
        data = deb.read_bytes()
        stanzas.append(
            f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    packages = "\n".join(stanzas).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    lines = [
        "Origin: ironserve-lab",
        "Label: ironserve-lab",
        "Suite: lab",
        "Codename: lab",
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S +0000', time.gmtime())}",
        "Architectures: amd64 all",
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        blob = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(blob).hexdigest()} {len(blob)} {name}")
    (repo / "Release").write_text("\n".join(lines) + "\n")
    sign_release(root)


# ---------------------------------------------------------------- signing

KEYRING_NAME = "ironlab-archive-keyring.gpg"
ARMORED_KEY_NAME = "ironlab-archive-key.asc"
HOST_KEYRING = f"/usr/share/keyrings/{KEYRING_NAME}"  # where hosts keep it (the inventory's apt_signed_by)


def _gpg(root: Path, *args: str) -> subprocess.CompletedProcess:
    home = root / "gpg"
    home.mkdir(mode=0o700, exist_ok=True)
    return run(["gpg", "--batch", "--quiet", "--homedir", str(home), *args])


def sign_release(root: Path) -> None:
    """Sign the repo like a real mirror (InRelease, Release.gpg) with a key made for this lab.

    Hosts trust only that key (signed-by), so roles exercise the same signed-by path they use
    with an internal mirror. Without gpg on this machine the repo stays unsigned (trusted=yes).
    """
    repo = supply_dir(root) / "apt"
    if not shutil.which("gpg"):
        return
    try:
        if not (root / "gpg" / "pubring.kbx").exists() or not _gpg(root, "--list-secret-keys").stdout.strip():
            _gpg(
                root,
                "--passphrase",
                "",
                "--quick-gen-key",
                "ironserve lab archive <lab@ironserve.invalid>",
                "ed25519",
                "sign",
                "never",
            )
        _gpg(root, "--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
        _gpg(root, "--yes", "--armor", "--detach-sign", "-o", str(repo / "Release.gpg"), str(repo / "Release"))
        # binary keyring (what hosts keep for signed-by) and the armored key, published next to the
        # index the way vendors publish theirs (roles fetch <mirror>/<key name> and dearmor it)
        for args in (["--output", str(repo / KEYRING_NAME)], ["--armor", "--output", str(repo / ARMORED_KEY_NAME)]):
            subprocess.run(
                ["gpg", "--batch", "--homedir", str(root / "gpg"), "--yes", *args, "--export"],
                check=True,
                capture_output=True,
            )
    finally:
        # gpg starts an agent for the homedir; never leave it running.
        subprocess.run(["gpgconf", "--homedir", str(root / "gpg"), "--kill", "all"], capture_output=True)


def key_fingerprint(root: Path) -> str:
    """The fingerprint of the lab's archive key ("" when the repo is unsigned): what the inventory pins for roles
    that fetch the mirror's key (host data nvidia_apt_key_fingerprint)."""
    armored = supply_dir(root) / "apt" / ARMORED_KEY_NAME
    if not armored.exists() or not shutil.which("gpg"):
        return ""
    with tempfile.TemporaryDirectory(prefix="ironlab-gpg-") as home:
        out = run(["gpg", "--homedir", home, "--batch", "--with-colons", "--show-keys", str(armored)]).stdout
    lines = [line.split(":") for line in out.splitlines()]
    return next((f[9] for prev, f in zip(lines, lines[1:]) if prev[0] == "pub" and f[0] == "fpr"), "")


def file_sums(root: Path, subdir: str) -> dict[str, str]:
    """{file: sha256} of the files published under ``subdir`` (the Ascend installers' checksums for the inventory)."""
    folder = supply_dir(root) / subdir
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.glob("*")) if f.is_file()}


def keyring(root: Path) -> Path | None:
    path = supply_dir(root) / "apt" / KEYRING_NAME
    return path if path.exists() else None


# ---------------------------------------------------------------- wheelhouse


def _pip() -> list[str]:
    """A pip for Python 3.11 (the hosts' interpreter); uv-made venvs have none, so fall back."""
    candidates = [[sys.executable, "-m", "pip"], ["python3", "-m", "pip"], ["/usr/bin/python3", "-m", "pip"], ["pip3"]]
    for cand in candidates:
        if not shutil.which(cand[0]):
            continue
        proc = subprocess.run([*cand, "--version"], capture_output=True, text=True)
        if proc.returncode == 0 and "python 3.11" in proc.stdout:
            return cand
    raise LabError(
        "no pip for Python 3.11 found on this machine to fill the lab wheelhouse "
        "(lab hosts run Debian bookworm's Python 3.11)"
    )


def fetch_wheels(requirements: list[str], staging: Path) -> list[Path]:
    """`pip download` each requirement (with its dependencies, resolved on its own) into a directory of its own under
    ``staging``, side by side: the files, for :func:`add_wheels` to publish. The time is the index's round trips, not
    this machine's CPU; nothing here writes the lab index, so it can run beside a thread that does.

    Lab hosts run Debian bookworm's Python 3.11 on x86_64; pip here downloads for this
    interpreter, so run the lab from a Python 3.11 x86_64 environment (the project's).
    """
    shutil.rmtree(staging, ignore_errors=True)
    if not requirements:
        return []
    pip = _pip()

    def download(numbered: tuple[int, str]) -> list[Path]:
        dest = staging / str(numbered[0])
        dest.mkdir(parents=True)
        cmd = [*pip, "download", "--disable-pip-version-check", "-q", "-d", str(dest), numbered[1]]
        proc = run(cmd, check=False)
        if proc.returncode != 0:
            raise LabError(f"pip download {numbered[1]} failed:\n{proc.stderr.strip()}")
        return sorted(dest.iterdir())

    with ThreadPoolExecutor(max_workers=4) as pool:
        return [f for files in pool.map(download, enumerate(requirements)) for f in files]


def _project(filename: str) -> str | None:
    if filename.endswith(".whl"):
        name = filename.split("-")[0]
    elif filename.endswith((".tar.gz", ".zip")):
        name = re.sub(r"\.(tar\.gz|zip)$", "", filename).rsplit("-", 1)[0]
    else:
        return None
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503 normalisation


DIGESTS_NAME = "wheels.sha256.json"  # beside wheels/: {file: [size, mtime_ns, inode, sha256]} of the last reindex


def _digests(sup: Path, files: list[Path]) -> dict[str, str]:
    """sha256 of each file, reusing the last reindex's where the file is the same (size, mtime, inode): the
    wheelhouse holds GBs (the CUDA runtimes), and every reindex would read them all again."""
    cache_file = sup / DIGESTS_NAME
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    out, kept = {}, {}
    for f in files:
        st = f.stat()
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = cache.get(f.name)
        out[f.name] = hit[3] if hit and hit[:3] == key else hashlib.sha256(f.read_bytes()).hexdigest()
        kept[f.name] = [*key, out[f.name]]
    cache_file.write_text(json.dumps(kept, sort_keys=True))
    return out


def reindex_wheels(root: Path) -> None:
    """Generate a static PEP 503 simple/ tree linking to ../../wheels/<file>#sha256=..."""
    sup = supply_dir(root)
    simple = sup / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    simple.mkdir(parents=True)
    projects: dict[str, list[Path]] = {}
    for f in sorted((sup / "wheels").iterdir()):
        name = _project(f.name)
        if name:
            projects.setdefault(name, []).append(f)
    digests = _digests(sup, [f for files in projects.values() for f in files])
    for name, files in projects.items():
        links = []
        for f in files:
            digest = digests[f.name]
            links.append(f'<a href="../../wheels/{html.escape(f.name)}#sha256={digest}">{html.escape(f.name)}</a><br>')
        (simple / name).mkdir()
        (simple / name / "index.html").write_text(
            f"<!DOCTYPE html><html><body>\n{chr(10).join(links)}\n</body></html>\n"
        )
    index = [f'<a href="{n}/">{n}</a><br>' for n in sorted(projects)]
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{chr(10).join(index)}\n</body></html>\n")


def add_wheels(root: Path, wheels: list[Path]) -> int:
    """Put ready-made wheels into the wheelhouse (hard links where possible) and reindex when any was new.

    Returns how many were added; wheels already there with the same size are kept as they are.
    """
    dest = ensure_dirs(root) / "wheels"
    added = 0
    for whl in wheels:
        target = dest / whl.name
        if target.is_file() and target.stat().st_size == whl.stat().st_size:
            continue
        target.unlink(missing_ok=True)
        try:
            os.link(whl, target)
        except OSError:  # another filesystem
            shutil.copy2(whl, target)
        added += 1
    if added or not (supply_dir(root) / "simple" / "index.html").exists():
        reindex_wheels(root)
    return added


# ---------------------------------------------------------------- files


def add_files(root: Path, subdir: str, files: list[Path]) -> None:
    dest = ensure_dirs(root) / subdir
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, dest / f.name)


# ---------------------------------------------------------------- server


def _pidfile(root: Path) -> Path:
    return supply_dir(root) / "httpd.pid"


def server_pid(root: Path) -> int | None:
    return daemon_pid(_pidfile(root), "httpd.py", str(supply_dir(root)))


def start_server(root: Path) -> None:
    sup = ensure_dirs(root)
    if server_pid(root):
        return
    _pidfile(root).unlink(missing_ok=True)
    spawn_daemon(
        [
            sys.executable,
            str(HTTPD),
            "--bind",
            GATEWAY,
            "--port",
            str(SUPPLY_PORT),
            "--root",
            str(sup),
            "--pidfile",
            str(_pidfile(root)),
        ],
        sup.parent / "supply-httpd.log",
    )
    wait_for(lambda: server_pid(root) and listening(GATEWAY, SUPPLY_PORT), 10, what="the lab supply server")


def stop_server(root: Path) -> None:
    stop_daemon(_pidfile(root), "httpd.py", str(supply_dir(root)), what="supply server")
