"""The distribution's Prometheus tools (prometheus, promtool) for tests: on PATH, or unpacked once from
`apt-get download prometheus` into the cache (no service, no install), shared by the offline and lab tests."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

CACHE = Path.home() / ".cache" / "ironserve" / "prometheus"


def prometheus_tool(name: str) -> str:
    """The path of ``name`` (prometheus or promtool); the package is fetched and unpacked on first use, under a
    lock (the offline and lab tests run side by side)."""
    found = shutil.which(name)
    if found:
        return found
    unpacked = CACHE / "usr" / "bin" / name
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not unpacked.exists():
            subprocess.run(
                ["apt-get", "download", "prometheus"], cwd=CACHE, check=True, capture_output=True, timeout=600
            )
            deb = next(CACHE.glob("prometheus_*.deb"))
            subprocess.run(["dpkg-deb", "-x", str(deb), str(CACHE)], check=True, timeout=300)
            deb.unlink()
    return str(unpacked)
