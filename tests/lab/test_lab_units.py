"""Lab pieces that need neither root nor a running lab: mirror discovery, indexes, stand-in answers."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ironserve_lab import cli, cluster, rootfs, standins, state, supply, system
from ironserve_lab.profiles import PROFILES


def test_debian_mirror_from_deb822_and_list(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    assert rootfs.debian_mirror([str(deb822)]) == "http://mirror.example/debian"
    classic = tmp_path / "sources.list"
    classic.write_text(
        "# comment\ndeb http://mirror.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://mirror.example/debian bookworm main\n"
    )
    assert rootfs.debian_mirror([str(classic)]) == "http://mirror.example/debian"
    with pytest.raises(Exception, match="no Debian archive"):
        rootfs.debian_mirror([str(tmp_path / "missing")])


def test_host_plan_is_private_and_stable():
    assert state.host_name(3) == "lab3" and state.host_address(3) == "10.213.7.13"
    assert state.supply_url("apt") == "http://10.213.7.1:8780/apt"
    with pytest.raises(ValueError):
        state.host_address(0)


def test_pep503_index(tmp_path):
    wheels = tmp_path / "supply" / "wheels"
    wheels.mkdir(parents=True)
    for name in ("nvidia_ml_py-13.615.71-py3-none-any.whl", "Foo.Bar-1.0.tar.gz", "foo_bar-1.1-py3-none-any.whl"):
        (wheels / name).write_bytes(name.encode())
    supply.reindex_wheels(tmp_path)
    simple = tmp_path / "supply" / "simple"
    assert sorted(p.name for p in simple.iterdir() if p.is_dir()) == ["foo-bar", "nvidia-ml-py"]
    page = (simple / "foo-bar" / "index.html").read_text()
    assert 'href="../../wheels/Foo.Bar-1.0.tar.gz#sha256=' in page and "foo_bar-1.1-py3-none-any.whl" in page


def test_reindex_reuses_digests_of_unchanged_files_only(tmp_path, monkeypatch):
    wheels = supply.ensure_dirs(tmp_path) / "wheels"
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"aaaa")
    supply.reindex_wheels(tmp_path)
    digest_a = hashlib.sha256(b"aaaa").hexdigest()
    assert f"#sha256={digest_a}" in (supply.supply_dir(tmp_path) / "simple" / "a" / "index.html").read_text()
    read = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self.name) or real(self))
    (wheels / "b-1.0-py3-none-any.whl").write_bytes(b"bbbb")
    supply.reindex_wheels(tmp_path)
    assert read == ["b-1.0-py3-none-any.whl"]  # a is the same file: its digest is not computed again
    (wheels / "a-1.0-py3-none-any.whl").unlink()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"AAAA")  # replaced (another inode): hashed again
    supply.reindex_wheels(tmp_path)
    assert (
        hashlib.sha256(b"AAAA").hexdigest() in (supply.supply_dir(tmp_path) / "simple" / "a" / "index.html").read_text()
    )


def test_add_wheels_links_once_and_indexes(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    whl = house / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    whl.write_bytes(b"torch")
    lab = tmp_path / "lab"
    assert supply.add_wheels(lab, [whl]) == 1
    assert supply.add_wheels(lab, [whl]) == 0  # already there: nothing added, no reindex needed
    page = (lab / "supply" / "simple" / "torch" / "index.html").read_text()
    assert "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=" in page


def _lab_inventory(tmp_path, monkeypatch, hardware: str, nodes: int) -> list:
    import runpy

    hosts = [
        {"name": state.host_name(i), "address": state.host_address(i), "hardware": hardware, "node_index": i}
        for i in range(1, nodes + 1)
    ]
    (tmp_path / "state.json").write_text(
        json.dumps(
            {
                "ssh_user": "ironlab",
                "ssh_key": "/k",
                "known_hosts": "/kh",
                "apt_mirror": "http://m/apt",
                "pip_index": "http://m/simple/",
                "ascend_files": "http://m/ascend/",
                "model_root": "/srv/models",
                "hosts": hosts,
            }
        )
    )
    monkeypatch.setenv("IRONSERVE_LAB_DIR", str(tmp_path))
    return runpy.run_path(str(Path(__file__).resolve().parents[2] / "inventories" / "lab.py"))["lab_hosts"]


def test_lab_inventory_dedicates_the_first_cpu_lab_host_to_the_router(tmp_path, monkeypatch):
    hosts = _lab_inventory(tmp_path, monkeypatch, "cpu-lab", 3)
    assert [d.get("ironserve_role") for _, d in hosts] == ["router", None, None]
    assert all(d["launch"] is True for _, d in hosts)
    two = _lab_inventory(tmp_path, monkeypatch, "cpu-lab", 2)
    assert all("ironserve_role" not in d for _, d in two)
    gpu = _lab_inventory(tmp_path, monkeypatch, "rtx6000-pro-maxq", 3)
    assert all("ironserve_role" not in d and d["launch"] is False for _, d in gpu)


def test_lab_inventory_takes_the_named_hosts_as_a_lab_of_their_own(tmp_path, monkeypatch):
    """IRONSERVE_LAB_HOSTS: disjoint deployments side by side on one lab (scripts/test's shared cpu-lab)."""
    monkeypatch.setenv("IRONSERVE_LAB_HOSTS", "lab4,lab5")
    two = _lab_inventory(tmp_path, monkeypatch, "cpu-lab", 5)
    assert [name for name, _ in two] == ["lab4", "lab5"]
    assert all("ironserve_role" not in d for _, d in two)  # two hosts: no dedicated router host
    monkeypatch.setenv("IRONSERVE_LAB_HOSTS", "lab3,lab1,lab2")
    three = _lab_inventory(tmp_path, monkeypatch, "cpu-lab", 5)
    assert [(name, d.get("ironserve_role")) for name, d in three] == [
        ("lab3", "router"),
        ("lab1", None),
        ("lab2", None),
    ]
    for bad in ("lab1,lab9", "lab1,lab1"):
        monkeypatch.setenv("IRONSERVE_LAB_HOSTS", bad)
        with pytest.raises(SystemExit, match="each name once, among the lab's hosts"):
            _lab_inventory(tmp_path, monkeypatch, "cpu-lab", 5)


def test_cpu_lab_hosts_get_the_uv_config(tmp_path, monkeypatch):
    from ironserve_lab import cpu_runtime
    from ironserve_lab import hosts as lab_hosts

    written = {}
    real_write = lab_hosts._write

    def write(root, rel, text, mode=0o644):
        written[rel] = text
        real_write(root, rel, text, mode)

    monkeypatch.setattr(lab_hosts, "_write", write)
    monkeypatch.setattr(lab_hosts, "_mounted", lambda path: True)
    monkeypatch.setattr(lab_hosts, "ensure_host_key", lambda root, name: _key(tmp_path))
    monkeypatch.setattr(lab_hosts, "_prepare_fake_proc", lambda merged: None)
    monkeypatch.setattr(lab_hosts, "_ids", lambda merged, owner: (os.getuid(), os.getgid()))
    lab = state.LabState(hosts=[state.Host("lab1", state.host_address(1), 1, "cpu-lab")])
    for hardware, expected in (("cpu-lab", True), ("rtx6000-pro-maxq", False)):
        written.clear()
        host = state.Host("lab1", state.host_address(1), 1, hardware)
        lab_hosts.prepare(tmp_path, tmp_path / "base", lab, host, "ssh-ed25519 AAAA test")
        assert ("/etc/uv/uv.toml" in written) is expected
        if expected:
            assert written["/etc/uv/uv.toml"] == cpu_runtime.uv_config()


def _key(tmp_path):
    key = tmp_path / "hostkey"
    key.write_text("PRIVATE")
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAA host")
    return key


@pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="needs dpkg-deb")
def test_apt_index_of_a_built_deb(tmp_path):
    deb = standins.build_deb(
        tmp_path, "ironlab-probe", "1.0-1", {"/usr/share/ironlab-probe/x": ("x", 0o644)}, "probe package"
    )
    supply.add_debs(tmp_path, [deb])
    packages = (tmp_path / "supply/apt/Packages").read_text()
    assert "Package: ironlab-probe" in packages and "Filename: ./ironlab-probe_1.0-1_amd64.deb" in packages
    assert "SHA256: " in packages and (tmp_path / "supply/apt/Packages.gz").exists()
    assert "Packages.gz" in (tmp_path / "supply/apt/Release").read_text()


def _smi(
    tmp_path,
    hardware: str,
    *args: str,
    built: bool = True,
    nouveau: bool = False,
    blacklisted: bool = False,
    fabric: str | None = None,
) -> subprocess.CompletedProcess:
    """The stand-in nvidia-smi over a temporary tree: a module built (or not) for the running kernel, nouveau
    holding the GPUs (or not) and blacklisted (or not), a fabric override."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        standins._template("nvidia_smi.py", PROFILES=json.dumps(PROFILES), DRIVER="580.95.05", CUDA="13.0")
    )
    hw = tmp_path / "hardware"
    hw.write_text(hardware + "\n")
    module = tmp_path / f"dkms/nvidia/580.95.05/{os.uname().release}/x86_64/module"
    shutil.rmtree(tmp_path / "dkms", ignore_errors=True)
    if built:
        module.mkdir(parents=True)
        (module / "nvidia.ko").write_text("")
    (tmp_path / "nouveau").unlink(missing_ok=True)
    if nouveau:
        (tmp_path / "nouveau").write_text("bound\n")
    (tmp_path / "modprobe.d").mkdir(exist_ok=True)
    (tmp_path / "modprobe.d/nouveau.conf").write_text("blacklist nouveau\n" if blacklisted else "# nothing\n")
    (tmp_path / "fabric").write_text(fabric or "")
    env = {
        "IRONLAB_HARDWARE_FILE": str(hw),
        "IRONLAB_DKMS_DIR": str(tmp_path / "dkms"),
        "IRONLAB_NOUVEAU_FILE": str(tmp_path / "nouveau"),
        "IRONLAB_MODPROBE_DIR": str(tmp_path / "modprobe.d"),
        "IRONLAB_FABRIC_FILE": str(tmp_path / "fabric"),
        "IRONLAB_LOADED_FILE": str(tmp_path / "loaded"),
    }
    (tmp_path / "loaded").unlink(missing_ok=True)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env)


def test_nvidia_smi_fails_like_an_unloaded_driver(tmp_path):
    """No module built for the running kernel (no headers at install), or nouveau holding the GPUs."""
    for kwargs in ({"built": False}, {"nouveau": True}):
        out = _smi(tmp_path, "gb200", "-L", **kwargs)
        assert out.returncode == 9 and "couldn't communicate with the NVIDIA driver" in out.stdout
    assert _smi(tmp_path, "gb200", "-L", nouveau=True, blacklisted=True).returncode == 0


def test_nvidia_smi_q_reports_the_fabric_clique(tmp_path):
    from roles.preflight import FabricInfo

    default = FabricInfo().process(_smi(tmp_path, "gb200", "-q").stdout.splitlines())
    assert len(default) == 4 and {(g["state"], g["status"], g["clique_id"]) for g in default} == {
        ("Completed", "Success", "32766")
    }
    moved = FabricInfo().process(_smi(tmp_path, "gb200", "-q", fabric="clique_id=9\n").stdout.splitlines())
    assert {g["clique_id"] for g in moved} == {"9"}


@pytest.mark.parametrize(
    "hardware,count,name,mem,cc",
    [
        ("rtx6000-pro-maxq", 8, "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 97887, "12.0"),
        ("rtx6000-pro", 8, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "12.0"),
        ("gb200", 4, "NVIDIA GB200", 189471, "10.0"),
    ],
)
def test_nvidia_smi_answers_per_profile(tmp_path, hardware, count, name, mem, cc):
    out = _smi(
        tmp_path,
        hardware,
        "--query-gpu=index,name,memory.total,driver_version,compute_cap",
        "--format=csv,noheader,nounits",
    )
    assert out.returncode == 0
    assert out.stdout.splitlines() == [f"{i}, {name}, {mem}, 580.95.05, {cc}" for i in range(count)]
    with_units = _smi(tmp_path, hardware, "--query-gpu=memory.total", "--format=csv")
    assert with_units.stdout.splitlines()[:2] == ["memory.total [MiB]", f"{mem} MiB"]
    assert len(_smi(tmp_path, hardware, "-L").stdout.splitlines()) == count
    assert "CUDA Version: 13.0" in _smi(tmp_path, hardware).stdout
    assert _smi(tmp_path, hardware, "--query-gpu=bogus", "--format=csv").returncode == 2


@pytest.mark.parametrize("hardware", ["cpu-lab", "atlas-800i-a3"])
def test_nvidia_smi_without_nvidia_gpus_fails_like_the_real_one(tmp_path, hardware):
    out = _smi(tmp_path, hardware, "-L")
    assert out.returncode == 9 and "couldn't communicate with the NVIDIA driver" in out.stdout


def test_npu_smi_lists_16_ascend910(tmp_path):
    script = tmp_path / "npu-smi"
    script.write_text(standins._template("npu_smi.py", PROFILES=json.dumps(PROFILES), VERSION="25.2.0"))
    hw = tmp_path / "hardware"
    hw.write_text("atlas-800i-a3\n")
    out = subprocess.run(
        [sys.executable, str(script), "info", "-l"],
        capture_output=True,
        text=True,
        env={"IRONLAB_HARDWARE_FILE": str(hw)},
    )
    assert "Total Count                    : 16" in out.stdout and out.stdout.count("Ascend910") == 16


def test_ascend_run_files_check_and_version(tmp_path):
    runs = standins.build_runs(tmp_path)
    assert [r.name for r in runs] == list(standins.RUN_FILES.values())
    check = subprocess.run(["sh", str(runs[1]), "--check"], capture_output=True, text=True)
    assert check.returncode == 0 and "All good" in check.stdout
    assert subprocess.run(["sh", str(runs[1]), "--version"], capture_output=True, text=True).stdout.strip() == "8.3.RC1"


def test_cli_wiring():
    parser = argparse.ArgumentParser(prog="ironserve")
    cli.add_lab_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["lab", "up", "--nodes", "3", "--hardware", "gb200"])
    assert (args.lab_command, args.nodes, args.hardware, args.func) == ("up", 3, "gb200", cli.run_lab)
    assert parser.parse_args(["lab", "status", "--format", "json"]).format == "json"


def test_refuses_without_root(monkeypatch):
    from ironserve_lab import cluster, system

    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    for action in (lambda: cluster.up(2), cluster.down):
        with pytest.raises(system.LabError, match="needs root"):
            action()


def test_refuses_without_nspawn(monkeypatch):
    from ironserve_lab import system

    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(system.shutil, "which", lambda tool: None if tool in ("systemd-nspawn", "mmdebstrap") else "/x")

    def no_apt(packages, why):
        raise system.LabError("apt-get install failed")

    monkeypatch.setattr(system, "apt_install", no_apt)
    with pytest.raises(system.LabError, match="systemd-nspawn.*required"):
        system.ensure_tools()


def test_cli_reports_errors_without_traceback(monkeypatch, capsys):
    from ironserve_lab import system

    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    assert cli.main(["down"]) == 1
    assert "[lab] error: the lab needs root" in capsys.readouterr().err


def _imex(tmp_path, nodes: str | None, driver: bool = True) -> subprocess.CompletedProcess:
    """The stand-in nvidia-imex over a temporary config (port 0: never binds a real one)."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    smi = tmp_path / "bin/nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexit {0 if driver else 9}\n")
    smi.chmod(0o755)
    script = tmp_path / "nvidia-imex"
    script.write_text(standins.IMEX)
    config = tmp_path / "config.cfg"
    config.write_text(f"SERVER_PORT=0\nIMEX_NODE_CONFIG_FILE={tmp_path / 'nodes_config.cfg'}\n")
    if nodes is not None:
        (tmp_path / "nodes_config.cfg").write_text(nodes)
    return subprocess.run(
        [sys.executable, str(script), "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=20,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"},
    )


@pytest.mark.parametrize(
    "nodes,driver,why",
    [
        (None, True, "cannot open node config file"),
        ("", True, "lists no nodes"),
        ("10.0.0.1\nnot-an-ip\n", True, "invalid IP address 'not-an-ip'"),
        ("192.0.2.77\n192.0.2.78\n", True, "no address of this node is in the node config file"),
        ("192.0.2.77\n", False, "failed to open the NVIDIA driver"),
    ],
)
def test_nvidia_imex_stand_in_refuses_like_the_real_service(tmp_path, nodes, driver, why):
    out = _imex(tmp_path, nodes, driver)
    assert out.returncode == 1 and why in out.stderr, out.stderr


def test_inotify_limits_are_raised_for_the_hosts_never_lowered(tmp_path, capsys, monkeypatch):
    instances = tmp_path / "max_user_instances"
    instances.write_text("128\n")
    (tmp_path / "max_user_watches").write_text("1048576\n")
    system.ensure_inotify(20, tmp_path)  # 20 idle hosts hold ~140 instances: the kernel's default 128 is not enough
    this_machine, per_host = system.INOTIFY_NEEDS["max_user_instances"]
    raised = this_machine + 20 * per_host
    assert int(instances.read_text()) == raised
    assert (tmp_path / "max_user_watches").read_text() == "1048576\n"  # already above: left as it is
    assert "raised fs.inotify.max_user_instances from 128" in capsys.readouterr().err
    system.ensure_inotify(4, tmp_path)  # fewer hosts later: nothing lowered
    assert "raised" not in capsys.readouterr().err
    assert int(instances.read_text()) == raised

    def read_only(path, *args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(Path, "write_text", read_only)  # /proc/sys read-only (a container): say the command to run
    with pytest.raises(system.LabError, match=r"could not be raised \(Read-only file system\); run: sysctl -w "):
        system.ensure_inotify(40, tmp_path)


def test_reset_raises_the_inotify_limit_for_the_whole_lab_before_the_host_boots(tmp_path, monkeypatch):
    lab = state.LabState(hosts=[state.Host(f"lab{i}", state.host_address(i), i, "cpu-lab") for i in range(1, 21)])
    monkeypatch.setenv("IRONSERVE_LAB_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(cluster, "require_root", lambda: None)
    monkeypatch.setattr(cluster.state, "load", lambda root: lab)
    monkeypatch.setattr(cluster, "ensure_inotify", lambda hosts: calls.append(("inotify", hosts)))
    monkeypatch.setattr(cluster.hosts, "spawn", lambda root, host, binds: calls.append(("spawn", host.name)))
    for name in ("booted_binds", "stop", "prepare", "wait_running"):
        monkeypatch.setattr(cluster.hosts, name, lambda *args, **kwargs: [])
    monkeypatch.setattr(cluster.network, "ensure_netns", lambda *args: None)
    monkeypatch.setattr(cluster.rootfs, "ensure_base", lambda root: tmp_path)
    monkeypatch.setattr(cluster, "ssh_keypair", lambda root: tmp_path / "id")
    (tmp_path / "id.pub").write_text("ssh-ed25519 AAAA lab\n")
    monkeypatch.setattr(cluster, "_ssh_ok", lambda lab, host: True)
    cluster.reset("lab17")
    assert calls == [("inotify", 20), ("spawn", "lab17")]  # the other 19 hosts hold their share while lab17 boots
