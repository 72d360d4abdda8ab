"""Audit and status of lab hosts reached only through another lab host as a bastion (ProxyJump), with the
inventory's known_hosts and strict host key checking (on the shared 3-host cpu-lab of this package).

The inventory is the lab's (inventories/lab.py) with ssh_config_file for the two replica hosts: their address
matches a `ProxyJump bastion` block, the bastion being the first lab host, whose own key is checked against the
lab's known_hosts too. pyinfra's connector opens both hops; the replicas' sshd sees the connection coming from the
bastion's address, not from this machine's.
"""

from __future__ import annotations

import json
import runpy

import pytest

from ironserve.audit import connection
from ironserve.fleet import read_fleet

from ..labcli import ROOT, ironserve

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def behind_bastion(deployed, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bastion")
    hosts = runpy.run_path(str(ROOT / "inventories" / "lab.py"))["lab_hosts"]
    bastion, behind = hosts[0], hosts[1:]
    common = bastion[1]
    config = tmp / "ssh_config"
    config.write_text(
        f"Host bastion\n  HostName {bastion[1]['ssh_hostname']}\n  User {common['ssh_user']}\n"
        f"  IdentityFile {common['ssh_key']}\n  UserKnownHostsFile {common['ssh_known_hosts_file']}\n"
        "  StrictHostKeyChecking yes\n"
        f"Host {' '.join(data['ssh_hostname'] for _, data in behind)}\n  ProxyJump bastion\n"
    )
    entries = [bastion] + [(name, {**data, "ssh_config_file": str(config)}) for name, data in behind]
    inventory = tmp / "behind_bastion.py"
    inventory.write_text(f"lab_hosts = {entries!r}\n")
    return {"inventory": str(inventory), "bastion": bastion, "behind": behind}


def test_the_hosts_behind_the_bastion_see_it_as_their_peer(behind_bastion):
    fleet = read_fleet(behind_bastion["inventory"])
    names = [name for name, _ in behind_bastion["behind"]]
    specs = connection.open_hosts(fleet, names)
    try:
        for name, data in behind_bastion["behind"]:
            # sshd's connections on the host (sudo drops SSH_CONNECTION): each peer is the bastion
            answer = connection.backend(specs[name]).run("ss -Htn state established '( sport = :22 )'")
            peers = {line.split()[-1].rsplit(":", 1)[0] for line in answer.stdout.splitlines() if line.strip()}
            assert answer.rc == 0 and peers == {behind_bastion["bastion"][1]["ssh_hostname"]}, answer.stdout
            host = fleet.pyinfra.get_host(name)
            assert host.connector.data["ssh_strict_host_key_checking"] == "yes"
            assert host.connector.data["ssh_known_hosts_file"] == data["ssh_known_hosts_file"]
    finally:
        connection.close(specs)


def test_status_and_audit_through_the_bastion(behind_bastion):
    inventory = behind_bastion["inventory"]
    out = ironserve("status", inventory, "deploys/tiny.py", "--format", "json", check=False, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert all("error" not in h for h in report["hosts"]) and len(report["hosts"]) == 3, report
    assert all(u["active"] == "active" for h in report["hosts"] for u in h["units"]), report
    names = [name for name, _ in behind_bastion["behind"]]
    out = ironserve(
        "audit",
        inventory,
        "deploys/tiny.py",
        *[a for n in names for a in ("--limit", n)],
        "--format",
        "json",
        check=False,
        timeout=600,
    )
    # reached and read (0 clean, 1 drift); unreachable would be 2
    assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-2000:]
    results = json.loads(out.stdout)["results"]
    assert {r["host"] for r in results} == set(names), results
    assert not [r for r in results if r["found"].startswith(("unreachable", "not run"))], results
    print(f"\naudit through the bastion: {sum(r['ok'] for r in results)}/{len(results)} checks ok on {names}")


def test_a_bastion_key_the_known_hosts_lacks_is_refused(behind_bastion, tmp_path):
    """The same inventory with an empty known_hosts for the hosts: nothing is trusted on first use."""
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    text = (
        open(behind_bastion["inventory"])
        .read()
        .replace(repr(behind_bastion["bastion"][1]["ssh_known_hosts_file"]), repr(str(empty)))
    )
    inventory = tmp_path / "unknown_keys.py"
    inventory.write_text(text)
    out = ironserve("status", str(inventory), "deploys/tiny.py", "--format", "json", check=False, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert all("No host key" in h.get("error", "") for h in json.loads(out.stdout)["hosts"]), out.stdout
    assert empty.read_text() == ""
