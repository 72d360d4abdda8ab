"""End to end on the lab: the converged fast path (roles/converged.py) on the 3-host cpu-lab deployment.

With host data ``converged_fast_path=true``: a run that changes nothing leaves a record on every host (root's 0600
file); the next run reads each host once and plans nothing; a managed file edited on one host is found by that
host's read, the run plans every host in full and repairs it, and that run (it changed something) leaves no record:
the one after it, changing nothing, records again.
"""

from __future__ import annotations

import pytest

from ..labcli import pyinfra, ssh
from .test_2_metrics_lab import LAB_KEY, key_for

pytestmark = pytest.mark.lab

EDITED = "/etc/default/prometheus-node-exporter"  # managed on every host (roles/node_exporter.py)
RECORD = "/var/lib/ironserve/converged.json"
FAST = "Every host is as the last run that changed nothing left it (3 checked): no change"


def output(*args: str) -> str:
    out = pyinfra(*args)
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def fast(deployed, tmp_path_factory):
    args = ["-y", "deploys/tiny.py", "--data", "converged_fast_path=true"]
    if key_for(deployed):  # keep the serving module's key: the same key from a file of this module's
        key_file = tmp_path_factory.mktemp("converged") / "api.key"
        key_file.write_text(LAB_KEY + "\n")
        key_file.chmod(0o600)
        args += ["--data", f"api_key_file={key_file}"]
    return {"args": args, "first": output(*args), "hosts": {h["name"]: h for h in deployed["hosts"]}}


def test_a_run_that_changes_nothing_leaves_a_private_record_on_every_host(fast):
    log = fast["first"]
    assert "converged fast path: planning in full" in log, log[-3000:]
    assert "converged fast path: no record" not in log, log[-3000:]
    for host in fast["hosts"].values():
        assert ssh(host, f"stat -c '%a %U' {RECORD}").stdout.split() == ["600", "root"]


def test_the_next_run_reads_each_host_once_and_plans_nothing(fast):
    log = output(*fast["args"], "--debug")
    assert FAST in log, log[-3000:]
    assert "Starting operation" not in log
    for name in fast["hosts"]:
        assert log.count(f"Running command on {name}:") == 1, f"{name}: more than the one check"


def test_a_file_edited_on_a_host_is_found_and_repaired_then_recorded_again(fast):
    lab2 = fast["hosts"]["lab2"]
    ssh(lab2, f"echo '# edited by hand' >> {EDITED}")
    log = output(*fast["args"])
    assert "[lab2] converged fast path: planning in full: changed since its record:" in log, log[-3000:]
    assert EDITED in log.split("[lab2] converged fast path:", 1)[1].splitlines()[0]
    assert "edited by hand" not in ssh(lab2, f"cat {EDITED}").stdout
    assert ssh(lab2, f"test -e {RECORD}", check=False).returncode != 0  # the repair changed something: no record
    again = output(*fast["args"])
    assert "planning in full: no record of a converged run" in again and "no record:" not in again, again[-3000:]
    assert FAST in output(*fast["args"])
