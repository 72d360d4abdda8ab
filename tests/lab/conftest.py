"""Lab end-to-end fixtures: one lab (2 hosts, stand-in rtx6000-pro-maxq) per test session.

Needs root and systemd-nspawn (installed on first use when apt can); skipped with the reason otherwise. A lab left
up by an interrupted run is torn down first (the lab tests hold the lab lock, so no one else's lab is up).
The first run on a machine builds the base rootfs (~2 min); later runs boot in seconds.

Coordination: every tests/lab file shares the one session lab (`lab` fixture). test_lab.py's
test_down_leaves_nothing tears it down; the collection hook below runs it after every other test of this
directory, whatever the file order. Tests that install packages or change a host say which host they use:
lab1 stays without the NVIDIA driver until test_lab.py installs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HARDWARE = "rtx6000-pro-maxq"
NODES = 2


def pytest_collection_modifyitems(config, items):
    """The lab's teardown test runs after every other test of tests/lab (one lab per session)."""
    here = Path(__file__).parent
    down = [i for i in items if i.name == "test_down_leaves_nothing" and here in Path(str(i.path)).parents]
    if not down:
        return
    rest = [i for i in items if i not in down]
    ours = [n for n, i in enumerate(rest) if here in Path(str(i.path)).parents]
    at = ours[-1] + 1 if ours else len(rest)
    items[:] = rest[:at] + down + rest[at:]


def lab_cli(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "ironserve_lab", *args], capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class Lab:
    status: dict

    @property
    def hosts(self) -> list[dict]:
        return self.status["hosts"]

    def ssh(
        self, host: dict, command: str, user: str | None = None, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess:
        user = user or host["ssh_user"]
        proc = subprocess.run(
            [
                "ssh",
                "-i",
                host["ssh_key"],
                "-o",
                f"UserKnownHostsFile={self.status['known_hosts']}",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
                "-o",
                "LogLevel=ERROR",
                f"{user}@{host['address']}",
                command,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {host['name']} {command!r} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def refresh(self) -> None:
        self.status = json.loads(lab_cli("status", "--format", "json").stdout)


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("lab tests need root (network namespaces, overlay mounts, systemd-nspawn)")
    if not shutil.which("systemd-nspawn") and not shutil.which("apt-get"):
        pytest.skip("lab tests need systemd-nspawn (package systemd-container), and apt-get is not there to install it")
    state_dir = Path(os.environ.get("IRONSERVE_LAB_DIR") or "/var/lib/ironserve-lab")
    if (state_dir / "state.json").exists():
        # a lab left up (an interrupted run) is torn down, never a reason to skip: a skip here hid every lab test
        if lab_cli("down", check=False).returncode != 0:
            lab_cli("down")
    proc = lab_cli("up", "--nodes", str(NODES), "--hardware", HARDWARE, check=False)
    if proc.returncode != 0:
        lab_cli("down", check=False)
        if "systemd-nspawn is required" in proc.stderr:
            pytest.skip(proc.stderr.strip())
        raise AssertionError(f"lab up failed:\n{proc.stderr}")
    the_lab = Lab(json.loads(lab_cli("status", "--format", "json").stdout))
    try:
        yield the_lab
    finally:
        lab_cli("down", check=False)
