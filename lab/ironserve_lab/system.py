"""Small shared helpers: progress output, running commands, host-safety preflight."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


class LabError(RuntimeError):
    """A lab failure with a message meant for the user (no traceback needed)."""


def say(message: str) -> None:
    # Progress goes to stderr so `lab status --format json` stays clean on stdout.
    print(f"[lab] {message}", file=sys.stderr, flush=True)


def run(
    cmd: list[str],
    *,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = None,
    env: dict | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, capture_output=capture, text=True, timeout=timeout, input=input, env={**os.environ, **env} if env else None
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip() if capture else ""
        raise LabError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{detail}")
    return proc


def unmount_tree(path: Path) -> None:
    """Every mount at or below ``path``, deepest first (lazily when busy): a stopped host's, a killed build's."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mnt in sorted((m for m in mounts if m == str(path) or m.startswith(str(path) + "/")), reverse=True):
        if subprocess.run(["umount", mnt], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mnt], capture_output=True)


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (it creates network namespaces, overlay mounts and "
            "systemd-nspawn containers); run it with sudo or as root"
        )


def apt_install(packages: list[str], why: str) -> None:
    """Install missing tools on this machine from its configured apt sources."""
    if not shutil.which("apt-get"):
        raise LabError(f"{' '.join(packages)} missing and no apt-get to install them ({why})")
    say(f"installing {' '.join(packages)} on this machine ({why})")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    proc = run(["apt-get", "install", "-y", "--no-install-recommends", *packages], check=False, env=env)
    if proc.returncode != 0:
        # Lists may be missing on a fresh machine; refresh once and retry.
        run(["apt-get", "update"], check=False, env=env)
        run(["apt-get", "install", "-y", "--no-install-recommends", *packages], env=env)


def ensure_tools() -> None:
    """Host-safety preflight: root, then systemd-nspawn, mmdebstrap and strip (installed when missing)."""
    require_root()
    missing = [
        pkg
        for tool, pkg in (("systemd-nspawn", "systemd-container"), ("mmdebstrap", "mmdebstrap"), ("strip", "binutils"))
        if not shutil.which(tool)
    ]
    if missing:
        try:
            apt_install(missing, "needed to build and boot lab hosts")
        except LabError as exc:
            raise LabError(f"systemd-nspawn/mmdebstrap are required and could not be installed: {exc}") from exc
    if not shutil.which("systemd-nspawn"):
        raise LabError("systemd-nspawn is required (package systemd-container) and is not available")
    for tool in ("ip", "nsenter", "ssh", "ssh-keygen", "mount"):
        if not shutil.which(tool):
            raise LabError(f"required tool {tool!r} not found on this machine")


# Every lab host's root processes share this machine's per-user inotify limits (the hosts have no user namespace of
# their own): an idle host's systemd holds 5 instances (2 of them its ask-password path units, which fail and leave
# the host degraded when none is left), logind and getty one each, dockerd, containerd and journal readers more.
# The kernel's default, 128 instances, is 18 idle hosts: a 20-host lab boots past it. 16 a host (twice the idle 7)
# and 64 for this machine's own root: a lab of 4 hosts or fewer changes nothing.
INOTIFY = Path("/proc/sys/fs/inotify")
INOTIFY_NEEDS = {"max_user_instances": (64, 16), "max_user_watches": (65536, 4096)}  # (this machine, each host)


def ensure_inotify(hosts: int, proc: Path = INOTIFY) -> None:
    """Raise (never lower) this machine's per-user inotify limits to what ``hosts`` lab hosts and it need."""
    for key, (this_machine, per_host) in INOTIFY_NEEDS.items():
        path = proc / key
        have, need = int(path.read_text()), this_machine + hosts * per_host
        if have >= need:
            continue
        try:
            path.write_text(f"{need}\n")
        except OSError as exc:
            raise LabError(
                f"fs.inotify.{key} is {have} and {hosts} lab host(s) need {need} (their systemd share this "
                f"machine's per-user limit) but it could not be raised ({exc.strerror}); run: "
                f"sysctl -w fs.inotify.{key}={need}"
            ) from exc
        say(f"raised fs.inotify.{key} from {have} to {need} on this machine: {hosts} lab host(s) share it")


def spawn_daemon(argv: list[str], log_path: Path) -> subprocess.Popen:
    """A lab server in a session of its own (it outlives the command that started it), its output appended to
    ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- the lab's own daemons (supply server, registry)


def daemon_pid(pidfile: Path, *markers: str) -> int | None:
    """The PID in ``pidfile`` when that process is still the daemon (its command line holds every marker)."""
    try:
        pid = int(pidfile.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if all(m.encode() in cmdline for m in markers) else None


def listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def stop_daemon(pidfile: Path, *markers: str, what: str) -> None:
    """SIGTERM, then SIGKILL after 5 s; the pidfile goes either way."""
    pid = daemon_pid(pidfile, *markers)
    if pid:
        os.kill(pid, signal.SIGTERM)
        try:
            wait_for(lambda: not daemon_pid(pidfile, *markers), 5, what=f"{what} exit")
        except LabError:
            os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
