"""One cgroup per lab host, in the hierarchies systemd uses (name=systemd v1 and/or cgroup2).

With --register=no --keep-unit, systemd-nspawn runs the container in the cgroup of the
process that starts it. Each host gets /<hierarchy>/ironlab/<host> so its systemd sees a
cgroup of its own, and `down` can find and kill anything left in it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

ROOT_NAME = "ironlab"


def hierarchies() -> list[Path]:
    """Mount points of the cgroup hierarchies systemd cares about, from /proc/self/mountinfo."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, opts = right.split(" ", 2)
        mnt = left.split()[4]
        if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in opts.split(",")):
            found.append(Path(mnt))
    return found


def host_cgroups(host: str) -> list[Path]:
    return [h / ROOT_NAME / host for h in hierarchies()]


def create(host: str) -> list[Path]:
    paths = host_cgroups(host)
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)
    return paths


def pids(path: Path) -> set[int]:
    found: set[int] = set()
    if not path.exists():
        return found
    for dirpath, _dirs, files in os.walk(path):
        if "cgroup.procs" in files:
            try:
                found |= {int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()}
            except OSError:
                pass
    return found


def kill_all(host: str) -> None:
    for p in host_cgroups(host):
        for pid in pids(p):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def remove(host: str | None = None) -> list[str]:
    """rmdir the host's cgroups (or all lab cgroups), deepest first; returns what is left."""
    left = []
    for h in hierarchies():
        top = h / ROOT_NAME / host if host else h / ROOT_NAME
        if not top.exists():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                left.append(dirpath)
        if host and not any(x for x in (h / ROOT_NAME).iterdir() if x.is_dir()):
            try:
                os.rmdir(h / ROOT_NAME)
            except OSError:
                pass
    return left


def leftovers() -> list[str]:
    return [str(h / ROOT_NAME) for h in hierarchies() if (h / ROOT_NAME).exists()]
