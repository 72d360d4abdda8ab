"""pyinfra's inventories everywhere: render/lint --inventory, audit and status read an inventory with pyinfra's own
loader (groups, group_data/, --data, --limit by group or glob) and reach hosts through pyinfra's SSH connector,
refusing host keys the inventory's known_hosts does not hold unless the inventory says otherwise. The SSH side is
a paramiko server on loopback in this process (it runs what it is sent with /bin/sh, as sshd would)."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pytest

from ironserve.audit import connection
from ironserve.audit.runner import plan_checks
from ironserve.cli import main
from ironserve.fleet import limit_hosts, load_inventory, read_fleet
from ironserve.problems import SpecError
from ironserve.status import status
from tests.sshd import connection_data, sshd  # noqa: F401 - the fixture

INVENTORY = """
workers = [("w1", {"ssh_hostname": "127.0.0.1"}), ("w2", {"ssh_hostname": "127.0.0.2"})]
second = ["w2"]
"""
ALL = """
hardware = "cpu-lab"
nic = "ens7"
sysctl_file = "/etc/sysctl.d/77-site.conf"
"""


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project as `ironserve init` lays it out: the inventory and group_data/ beside it, run from there."""
    (tmp_path / "group_data").mkdir()
    (tmp_path / "inventory.py").write_text(INVENTORY)
    (tmp_path / "group_data" / "all.py").write_text(ALL)
    (tmp_path / "group_data" / "second.py").write_text('launch = False\nnic = "ens9"\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_group_data_and_data_reach_the_hosts_as_pyinfra_merges_them(project):
    hosts = {h.name: h for h in load_inventory("inventory.py", {"health_poll_s": 5})}
    assert list(hosts) == ["w1", "w2"]  # the inventory's order: rank order
    assert hosts["w1"].data["nic"] == "ens7" and hosts["w2"].data["nic"] == "ens9"  # a group's data over all's
    assert hosts["w2"].data["launch"] is False and "launch" not in hosts["w1"].data
    assert all(h.data["health_poll_s"] == 5 and h.data["hardware"] == "cpu-lab" for h in hosts.values())
    assert "workers" in hosts["w1"].groups and {"workers", "second"} <= set(hosts["w2"].groups)


def test_limit_takes_groups_and_globs(project):
    hosts = load_inventory("inventory.py")
    assert [h.name for h in limit_hosts(hosts, ["second"], "inv")] == ["w2"]
    assert [h.name for h in limit_hosts(hosts, ["w*"], "inv")] == ["w1", "w2"]
    with pytest.raises(SpecError) as err:
        limit_hosts(hosts, ["gpu*"], "inv")
    assert "no host or group matches gpu*" in str(err.value) and "workers" in str(err.value)


def test_render_and_lint_see_the_group_data(project, capsys):
    assert main(["render", "tiny-cpu-tp2", "--inventory", "inventory.py", "--format", "json"]) == 0
    processes = json.loads(capsys.readouterr().out)["processes"]
    assert {p["host"]: p["env"].get("GLOO_SOCKET_IFNAME") for p in processes} == {"w1": "ens7", "w2": "ens9"}
    assert main(["render", "tiny-cpu-tp2", "--inventory", "inventory.py", "--data", "nic=ens8"]) == 0
    assert {p["env"].get("GLOO_SOCKET_IFNAME") for p in json.loads(capsys.readouterr().out)["processes"]} == {"ens8"}
    (project / "group_data" / "workers.py").write_text("lanch = False\n")  # (pyinfra caches files it ran)
    assert main(["lint", "tiny-cpu-tp2", "--offline", "--inventory", "inventory.py"]) == 2
    err = capsys.readouterr().err
    assert "w1.lanch" in err and "did you mean 'launch'" in err


def test_audit_plans_with_the_group_data_and_the_limit(project):
    deploy = str(Path(__file__).resolve().parent.parent / "deploys" / "tiny.py")
    checks, connections = plan_checks("inventory.py", deploy, ["second"], {"recipe": "tiny-cpu-tp2"})
    assert sorted(connections) == ["w2"] and {c.host for c in checks} == {"w2"}
    assert any(c.id == "file:/etc/sysctl.d/77-site.conf" for c in checks), sorted(c.id for c in checks)


def test_an_inventory_that_raises_is_reported(project, capsys):
    (project / "group_data" / "workers.py").write_text("raise RuntimeError('boom')\n")
    assert main(["render", "tiny-cpu", "--inventory", "inventory.py"]) == 2
    assert "inventory raised RuntimeError: boom" in capsys.readouterr().err


# ----------------------------------------------------------------------------- reaching hosts


def _inventory(tmp_path: Path, sshd: dict, known: bool, name: str = "inventory.py", **extra) -> str:
    data = {
        **connection_data(tmp_path, sshd, known),
        "hardware": "cpu-lab",
        "launch": False,
        "recipe": "tiny-cpu-docker",
        **extra,
    }
    path = tmp_path / name  # a new name per inventory: pyinfra keeps the code of files it ran by their path
    path.write_text(f"hosts = [('h1', {data!r})]\n")
    return str(path)


def _run(spec: str, command: str) -> tuple[int, str]:
    result = connection.backend(spec).run(command)
    return result.rc, result.stdout


def test_a_host_whose_key_is_known_answers_through_pyinfras_connector(tmp_path, sshd):
    fleet = read_fleet(_inventory(tmp_path, sshd, known=True))
    specs = connection.open_hosts(fleet, ["h1"])
    try:
        assert _run(specs["h1"], "echo here; exit 3") == (3, "here\n")
        host = fleet.pyinfra.get_host("h1")
        assert host.connected and host.connector.data["ssh_strict_host_key_checking"] == "yes"
    finally:
        connection.close(specs)


def test_an_unknown_host_key_is_refused_unless_the_inventory_says_otherwise(tmp_path, sshd):
    inventory = _inventory(tmp_path, sshd, known=False)
    deploy = Path(__file__).resolve().parent.parent / "deploys" / "tiny.py"
    out = io.StringIO()
    assert status(inventory, str(deploy), fmt="json", out=out) == 2
    report = json.loads(out.getvalue())
    assert "No host key for [127.0.0.1]" in report["hosts"][0]["error"], report
    assert Path(tmp_path / "known_hosts").read_text() == ""  # nothing was trusted on first use
    # the inventory's own choice is pyinfra's: accept-new records the key and answers
    inventory = _inventory(tmp_path, sshd, known=False, name="accepting.py", ssh_strict_host_key_checking="accept-new")
    out = io.StringIO()
    # reached (no unit there: "not in its intended state", exit 1, not unreachable, exit 2)
    assert status(inventory, str(deploy), fmt="json", out=out) == 1, out.getvalue()
    answered = json.loads(out.getvalue())["hosts"][0]
    assert "error" not in answered and answered["units"][0]["active"] in ("inactive", "unknown"), answered
    assert str(sshd["port"]) in Path(tmp_path / "known_hosts").read_text()


def test_an_init_project_renders_as_is_with_its_group_data(tmp_path, monkeypatch, capsys):
    assert main(["init", str(tmp_path / "mycluster")]) == 0
    assert "group_data/all.py" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path / "mycluster")
    assert main(["render", "llama3-8b-multinode-tp4", "--inventory", "inventory.py", "--format", "json"]) == 0
    processes = json.loads(capsys.readouterr().out)["processes"]
    assert [(p["host"], p["env"].get("NCCL_SOCKET_IFNAME")) for p in processes] == [
        ("gpu-1", "eth0"),
        ("gpu-2", "eth0"),
    ]
    assert main(["lint", "llama3-8b-multinode-tp4", "--offline", "--inventory", "inventory.py"]) == 0
    assert main(["init", str(tmp_path / "mycluster")]) == 2  # nothing is overwritten
    assert "already exists" in capsys.readouterr().err


def test_pyinfras_import_reads_the_entry_points_once_with_the_answers_of_reading_each(monkeypatch):
    """gevent's monkey patching (pyinfra_cli's import) looks up its plugins 31 times: read once for the import, each
    lookup answered as a read of its own, and importlib's own function back afterwards."""
    from importlib import metadata

    from ironserve.fleet import _entry_points_read_once

    original = metadata.entry_points
    groups = ["console_scripts", "pytest11", "gevent.plugins.monkey.will_patch_all", "no-such-group"]
    want = {g: sorted((ep.name, ep.value) for ep in original(group=g)) for g in groups}
    scans = []
    real_distributions = metadata.distributions
    monkeypatch.setattr(metadata, "distributions", lambda **kw: scans.append(1) or real_distributions(**kw))
    with _entry_points_read_once():
        got = {g: sorted((ep.name, ep.value) for ep in metadata.entry_points(group=g)) for g in groups * 3}
    assert got == want and want["console_scripts"]
    assert len(scans) == 1, "every lookup read every installed distribution again"
    assert metadata.entry_points is original


def test_handshakes_started_ahead_serve_the_first_read(tmp_path, sshd):
    import gevent

    fleet = read_fleet(_inventory(tmp_path, sshd, known=True))
    specs = connection.open_hosts(fleet, ["h1"])
    try:
        connection.connect_ahead(specs)
        gevent.wait([connection.backend(specs["h1"]).ahead], timeout=20)
        assert fleet.pyinfra.get_host("h1").connected  # before any command was sent
        assert _run(specs["h1"], "echo here") == (0, "here\n")
    finally:
        connection.close(specs)


def test_a_handshake_refused_ahead_is_said_at_the_first_read(tmp_path, sshd):
    # (a test of its own: pyinfra keeps a known_hosts file's keys by its path)
    fleet = read_fleet(_inventory(tmp_path, sshd, known=False))
    specs = connection.open_hosts(fleet, ["h1"])
    try:
        connection.connect_ahead(specs)
        with pytest.raises(Exception, match="No host key"):
            _run(specs["h1"], "echo here")
    finally:
        connection.close(specs)


def test_a_handshake_never_used_is_ended_by_close(tmp_path, sshd):
    import time

    import gevent

    silent = socket.socket()  # accepts the connection and never says a word
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    inventory = _inventory(tmp_path, {**sshd, "port": silent.getsockname()[1]}, known=True, name="silent.py")
    specs = connection.open_hosts(read_fleet(inventory), ["h1"])
    ahead = None
    try:
        connection.connect_ahead(specs)
        ahead = connection.backend(specs["h1"]).ahead
        gevent.sleep(0.3)
        assert not ahead.dead  # still waiting for the server's banner
        started = time.monotonic()
    finally:
        connection.close(specs)
        silent.close()
    assert ahead.dead and time.monotonic() - started < 2
