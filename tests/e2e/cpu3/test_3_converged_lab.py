"""End to end on the lab: the converged fast path (roles/converged.py, on by default) on the 3-host cpu-lab deployment.

A run that changes nothing leaves a record on every host (root's 0600 file); the next run reads each host once and
plans nothing. Each change the record must not miss is made by hand and found by the host's own read: a managed file
edited and a unit stopped (the run plans every host in full and repairs them; that run changed something, so it leaves
no record and the one after it records again), a venv's package metadata edited without renaming anything, and a worker taken out of
the router (read on the router host by the engine hosts' plans: the run puts it back).
"""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest

from ..labcli import pyinfra, ssh
from .test_2_metrics_lab import LAB_KEY, key_for

pytestmark = pytest.mark.lab

EDITED = "/etc/default/prometheus-node-exporter"  # managed on every host (roles/node_exporter.py)
STOPPED = "prometheus-node-exporter.service"  # kept running on every host (the same role)
RECORD = "/var/lib/ironserve/converged.json"
CHECKER = "/usr/local/lib/ironserve/ironserve-converged"
FAST = "Every host is as the last run that changed nothing left it (3 checked): no change"
ROUTER = "http://127.0.0.1:30000"  # the router on lab1, as lab1 reaches it


def output(*args: str) -> str:
    out = pyinfra(*args)
    return out.stdout + out.stderr


def why_planned(log: str, name: str) -> str:
    """The line saying why a host's check did not vouch (empty: none)."""
    marker = f"[{name}] converged fast path: planning in full: "
    return log.split(marker, 1)[1].splitlines()[0] if marker in log else ""


@pytest.fixture(scope="module")
def fast(deployed, tmp_path_factory):
    args = ["-y", "deploys/tiny.py"]
    key = key_for(deployed)
    if key:  # keep the serving module's key: the same key from a file of this module's
        key_file = tmp_path_factory.mktemp("converged") / "api.key"
        key_file.write_text(LAB_KEY + "\n")
        key_file.chmod(0o600)
        args += ["--data", f"api_key_file={key_file}"]
    hosts = {h["name"]: h for h in deployed["hosts"]}
    for host in hosts.values():  # the earlier modules' runs may have recorded: start from none
        ssh(host, f"{CHECKER} forget")
    return {"args": args, "first": output(*args), "hosts": hosts, "key": key}


def recorded_again(fast) -> None:
    """After a run that changed something (no record): the next run records, the one after plans nothing."""
    again = output(*fast["args"])
    assert "planning in full: no record of a converged run" in again and "no record:" not in again, again[-3000:]
    assert FAST in output(*fast["args"])


def test_a_run_that_changes_nothing_leaves_a_private_record_on_every_host(fast):
    log = fast["first"]
    assert "converged fast path: planning in full: no record of a converged run" in log, log[-3000:]
    assert "converged fast path: no record" not in log, log[-3000:]
    for host in fast["hosts"].values():
        assert ssh(host, f"stat -c '%a %U' {RECORD}").stdout.split() == ["600", "root"]


def test_the_next_run_reads_each_host_once_and_plans_nothing(fast):
    log = output(*fast["args"], "--debug")
    assert FAST in log, log[-3000:]
    assert "Starting operation" not in log
    for name in fast["hosts"]:
        assert log.count(f"Running command on {name}:") == 1, f"{name}: more than the one check"


def test_a_file_edited_and_a_unit_stopped_are_found_and_repaired_then_recorded_again(fast):
    lab2, lab3 = fast["hosts"]["lab2"], fast["hosts"]["lab3"]
    ssh(lab2, f"echo '# edited by hand' >> {EDITED}")
    ssh(lab3, f"systemctl stop {STOPPED}")  # read with the host's other units in one systemctl call
    log = output(*fast["args"])
    assert EDITED in why_planned(log, "lab2"), log[-3000:]
    stopped = why_planned(log, "lab3")
    assert "SystemdStatus(" in stopped and STOPPED in stopped, log[-3000:]
    assert "edited by hand" not in ssh(lab2, f"cat {EDITED}").stdout
    assert ssh(lab3, f"systemctl is-active {STOPPED}", check=False).stdout.strip() == "active"
    assert ssh(lab2, f"test -e {RECORD}", check=False).returncode != 0  # the repair changed something: no record
    recorded_again(fast)


def test_a_venvs_package_metadata_edited_by_hand_is_found(fast):
    lab3 = fast["hosts"]["lab3"]
    # a distribution's METADATA of a venv the record reads (the first match of its first metadata glob)
    pick = (
        "import glob, json; reads = json.load(open('" + RECORD + "'))['reads']; "
        "print(next(sorted(glob.glob(s['sums'][0]))[0] for _, s in reads if glob.glob(s.get('sums', ['/-'])[0])))"
    )
    metadata = ssh(lab3, f"python3 -c {json.dumps(pick)}").stdout.strip()
    assert metadata.endswith("/METADATA"), metadata
    ssh(lab3, f"echo 'X-Edited: by hand' >> {metadata}")  # no package added, removed or renamed
    log = output(*fast["args"])
    assert "Packages" in why_planned(log, "lab3"), log[-3000:]  # the venv's package list (VenvPackages, PipPackages)
    # nothing of the package list changed: the full plan changed nothing, so it recorded again
    assert "no record:" not in log and FAST in output(*fast["args"]), log[-3000:]


def router_api(fast, method: str, path: str) -> str:
    """One call of the router's API on lab1, with the deployment's key when it has one."""
    auth = f"-H 'Authorization: Bearer {fast['key']}' " if fast["key"] else ""
    return ssh(fast["hosts"]["lab1"], f"curl -s -m 10 -X {method} {auth}{ROUTER}{path}").stdout


def router_workers(fast) -> list[dict]:
    return json.loads(router_api(fast, "GET", "/workers"))["workers"]


def test_a_worker_taken_out_of_the_router_is_found_on_the_router_host_and_put_back(fast):
    lab3_url = f"http://{fast['hosts']['lab3']['address']}:30000"
    (worker,) = [w for w in router_workers(fast) if w["url"] == lab3_url]
    router_api(fast, "DELETE", f"/workers/{urllib.parse.quote(worker['id'], safe='')}")
    for _ in range(40):  # bounded: the router removes it in a background job
        if lab3_url not in [w["url"] for w in router_workers(fast)]:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the router still lists {lab3_url}")
    log = output(*fast["args"])
    # the engine hosts' plans read the router host's worker list: its record replays that read
    assert "RouterWorkers" in why_planned(log, "lab1"), log[-3000:]
    assert lab3_url in [w["url"] for w in router_workers(fast)], log[-3000:]
    recorded_again(fast)
