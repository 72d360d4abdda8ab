"""Shared helpers of the lab end-to-end tests: run ironserve/pyinfra from the repository, ssh into lab hosts."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*args: str, check: bool = True, timeout: int = 1200, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        list(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def pyinfra(
    *args: str, check: bool = True, timeout: int = 1500, env: dict | None = None
) -> subprocess.CompletedProcess:
    return run(str(BIN / "pyinfra"), "inventories/lab.py", *args, check=check, timeout=timeout, env=env)


def ironserve(
    *args: str, check: bool = True, timeout: int = 1800, env: dict | None = None
) -> subprocess.CompletedProcess:
    return run(str(BIN / "ironserve"), *args, check=check, timeout=timeout, env=env)


def run_log(text: str, keep: int = 8000) -> str:
    """What a pyinfra run said while executing (the hosts' logs, gates, journals), without its results table."""
    end = text.rfind("--> Results")
    return (text[:end] if end > 0 else text)[-keep:]


def ssh(host: dict, command: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
    return run(
        "ssh",
        "-i",
        host["ssh_key"],
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        f"{host['ssh_user']}@{host['address']}",
        f"sudo sh -c {json.dumps(command)}",
        check=check,
        timeout=timeout,
    )


# Set by scripts/test for the modules it runs side by side on one cpu-lab it brought up: this module's hosts
# (inventories/lab.py reads it too). The lab is then neither brought up nor taken down by the module.
SHARED = "IRONSERVE_LAB_HOSTS"


def shared_hosts() -> list[str]:
    return [name for name in os.environ.get(SHARED, "").split(",") if name]


def lab_status() -> dict:
    """`lab status --format json`, its hosts those of this module (IRONSERVE_LAB_HOSTS's, in its order)."""
    status = json.loads(ironserve("lab", "status", "--format", "json").stdout)
    if shared_hosts():  # the hosts the lab inventory selects, in its order (it checks the names)
        by_name = {h["name"]: h for h in status["hosts"]}
        selected = runpy.run_path(str(ROOT / "inventories" / "lab.py"))["lab_hosts"]
        status = {**status, "hosts": [by_name[name] for name, _ in selected]}
    return status


def lab_down() -> None:
    """A lab left up would make the later lab tests skip: a down that fails is tried once more, then fails."""
    if shared_hosts():
        return  # scripts/test takes the shared lab down
    if ironserve("lab", "down", check=False).returncode != 0:
        time.sleep(10)
        ironserve("lab", "down")


def lab_up(nodes: int, hardware: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    """`lab up` on a clean slate: `up` keeps a lab that is up (its hosts, their deploys), so one a killed run left
    behind is taken down first (said on stderr), never deployed over (a first deploy would find it converged).
    On a shared lab: this module's hosts, each one an earlier module deployed to replaced by a fresh one
    (`lab reset`)."""
    if shared_hosts():
        return _shared_up(nodes, hardware)
    status = ironserve("lab", "status", "--format", "json", check=False)
    try:
        left = json.loads(status.stdout).get("hosts") if status.returncode == 0 else None
    except ValueError:  # "lab is down"
        left = None
    if left:
        print(f"[lab] a lab was left up ({len(left)} hosts): taken down before this module's", file=sys.stderr)
        lab_down()
    return ironserve("lab", "up", "--nodes", str(nodes), "--hardware", hardware, timeout=timeout)


def up_with_api_key(tmp_path_factory, nodes: int, hardware: str, timeout: int = 1800) -> tuple[list[dict], str]:
    """`lab up` for a deploy test: (the hosts of `lab status`, an API key file on the controller)."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "api_key").write_text(f"lab-api-key-{hardware}-s3cret\n")
    lab_up(nodes, hardware, timeout)
    return lab_status()["hosts"], str(secrets / "api_key")


def _shared_up(nodes: int, hardware: str) -> subprocess.CompletedProcess:
    hosts = lab_status()["hosts"]
    assert len(hosts) == nodes and {h["hardware"] for h in hosts} == {hardware}, (SHARED, nodes, hardware, hosts)
    said = []
    for host in hosts:
        if ssh(host, "test -e /etc/ironserve", check=False).returncode == 0:
            said.append(ironserve("lab", "reset", host["name"], timeout=600).stderr)
    return subprocess.CompletedProcess(["lab", "up", SHARED], 0, "", "".join(said))


def shared_profiles(names: list[str] | None = None) -> dict[str, str]:
    """``names`` (default: this module's hosts, IRONSERVE_LAB_HOSTS) and their hardware profiles, from `lab status`
    ({} without names)."""
    names = shared_hosts() if names is None else names
    if not names:
        return {}
    status = json.loads(ironserve("lab", "status", "--format", "json").stdout)
    profile = {h["name"]: h["hardware"] for h in status["hosts"]}
    return {name: profile.get(name, "") for name in names}
