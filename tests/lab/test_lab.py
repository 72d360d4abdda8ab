"""The lab end to end: hosts with real systemd and sshd, the private network, the air-gapped supply,
the stand-in hardware, idempotent up, and a down that leaves nothing behind.

Tests run in file order on one session lab; the last one tears it down and checks for traces.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import HARDWARE, lab_cli

pytestmark = pytest.mark.lab

NVIDIA_PACKAGES = "nvidia-open-580 cuda-toolkit-13-0 nvidia-container-toolkit nvidia-persistenced"
APT = "sudo DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0"


def _boot_ids(lab) -> dict:
    return {h["name"]: lab.ssh(h, "cat /proc/sys/kernel/random/boot_id").stdout.strip() for h in lab.hosts}


def test_status_json_shape(lab):
    assert [h["name"] for h in lab.hosts] == ["lab1", "lab2"]
    for h in lab.hosts:
        assert {"name", "address", "ssh_user", "ssh_key", "hardware"} <= set(h)
        assert h["hardware"] == HARDWARE
        assert h["address"].startswith("10.213.7.")
        assert oct(os.stat(h["ssh_key"]).st_mode & 0o777) == "0o600"
    assert len({h["address"] for h in lab.hosts}) == 2


def test_ssh_and_systemd_running_on_every_host(lab):
    for h in lab.hosts:
        assert lab.ssh(h, "hostname").stdout.strip() == h["name"]
        state = lab.ssh(h, "systemctl is-system-running --wait", check=False).stdout.strip()
        assert state == "running", lab.ssh(h, "systemctl --failed --no-pager", check=False).stdout
        assert lab.ssh(h, "ps -p 1 -o comm=").stdout.strip() == "systemd"
        assert lab.ssh(h, "sudo -n id -u").stdout.strip() == "0"  # passwordless sudo, no DNS stall
        assert lab.ssh(h, "id -u", user="root").stdout.strip() == "0"


def test_host_to_host_tcp(lab):
    a, b = lab.hosts
    port = 45123
    listener = subprocess.Popen(
        [
            "ssh",
            "-i",
            b["ssh_key"],
            "-o",
            f"UserKnownHostsFile={lab.status['known_hosts']}",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            f"{b['ssh_user']}@{b['address']}",
            f"timeout 30 nc -l -p {port}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while f":{port} " not in lab.ssh(b, "ss -ltnH").stdout:
            assert time.monotonic() < deadline, "listener never came up"
            time.sleep(0.2)
        lab.ssh(a, f"echo hello-from-{a['name']} | nc -q 1 -w 5 {b['name']} {port}")
        out, _ = listener.communicate(timeout=30)
    finally:
        listener.kill()
    assert out.strip() == f"hello-from-{a['name']}"


def test_hosts_are_air_gapped(lab):
    for h in lab.hosts:
        routes = lab.ssh(h, "ip route show").stdout
        assert "default" not in routes
        # route lookup only: no packet leaves the host
        probe = lab.ssh(h, "ip route get 192.0.2.1", check=False)
        assert probe.returncode != 0 and "unreachable" in probe.stderr.lower()
        assert lab.ssh(h, "cat /etc/resolv.conf").stdout.strip() == ""
        hosts = lab.ssh(h, "cat /etc/hosts").stdout
        assert all(f"{o['address']}\t{o['name']}" in hosts for o in lab.hosts)
        sources = lab.ssh(h, "cat /etc/apt/sources.list.d/*.list; ls /etc/apt/sources.list 2>/dev/null || true").stdout
        option = f"signed-by={lab.status['apt_signed_by']}" if lab.status["apt_signed_by"] else "trusted=yes"
        assert sources.strip() == f"deb [{option}] {lab.status['apt_mirror']} ./"


def test_stand_in_nvidia_from_lab_repo(lab):
    h = lab.hosts[0]
    assert lab.ssh(h, "command -v nvidia-smi", check=False).returncode != 0  # nothing until the role installs it
    # like the real DKMS package: no module build without the running kernel's headers
    failed = lab.ssh(h, f"{APT} update && {APT} install nvidia-open-580", check=False, timeout=300)
    assert failed.returncode != 0 and "Your kernel headers for kernel" in failed.stdout + failed.stderr
    lab.ssh(h, f"{APT} install linux-headers-$(uname -r) && {APT} install -f", timeout=300)
    # like the real driver: it does not load while nouveau holds the GPUs
    assert "NVIDIA-SMI has failed" in lab.ssh(h, "nvidia-smi -L", check=False).stdout
    lab.ssh(h, "echo 'blacklist nouveau' | sudo tee /etc/modprobe.d/blacklist-nouveau.conf")
    lab.ssh(h, f"{APT} install {NVIDIA_PACKAGES}", timeout=300)
    out = (
        lab.ssh(
            h, "nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv,noheader,nounits"
        )
        .stdout.strip()
        .splitlines()
    )
    assert out == [
        f"{i}, NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition, 97887, 580.95.05, 12.0" for i in range(8)
    ]
    listing = lab.ssh(h, "nvidia-smi -L").stdout.splitlines()
    assert len(listing) == 8 and listing[0].startswith("GPU 0: NVIDIA RTX PRO 6000 Blackwell Max-Q")
    table = lab.ssh(h, "nvidia-smi").stdout
    assert "Driver Version: 580.95.05" in table and "CUDA Version: 13.0" in table
    assert "release 13.0, V13.0.88" in lab.ssh(h, "/usr/local/cuda/bin/nvcc --version").stdout
    assert lab.ssh(h, "systemctl is-active nvidia-persistenced").stdout.strip() == "active"
    assert lab.ssh(h, "systemctl is-system-running").stdout.strip() == "running"
    assert "1.18.0" in lab.ssh(h, "nvidia-ctk --version").stdout


def test_stand_in_nvml_through_pynvml_from_lab_index(lab):
    h = lab.hosts[0]  # driver installed by the previous test
    lab.ssh(h, "sudo python3 -m venv /opt/nvml && sudo /opt/nvml/bin/pip install -q nvidia-ml-py", timeout=300)
    script = (
        "import pynvml as n; n.nvmlInit(); d = n.nvmlDeviceGetHandleByIndex(2); "
        "print(n.nvmlDeviceGetCount(), n.nvmlSystemGetDriverVersion(), n.nvmlDeviceGetName(d), "
        "n.nvmlDeviceGetMemoryInfo(d).total // 2**20, n.nvmlDeviceGetMemClkVfOffset(d)); "
        "import sys; len(sys.argv) > 1 and n.nvmlDeviceSetMemClkVfOffset(d, int(sys.argv[1])); n.nvmlShutdown()"
    )
    run = f"sudo /opt/nvml/bin/python -c {shlex.quote(script)}"
    assert (
        lab.ssh(h, run).stdout.strip() == "8 580.95.05 NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition 97887 0"
    )
    lab.ssh(h, f"{run} 1500")
    assert lab.ssh(h, run).stdout.strip().endswith(" 1500")  # a later process reads the write
    denied = lab.ssh(h, f"/opt/nvml/bin/python -c {shlex.quote(script)} 100", check=False)
    assert denied.returncode != 0 and "Insufficient Permissions" in denied.stderr


def test_fake_governor_and_sysctls_never_touch_this_machine(lab):
    real_swappiness = Path("/proc/sys/vm/swappiness").read_text()
    real_numa = (
        Path("/proc/sys/kernel/numa_balancing").read_text()
        if Path("/proc/sys/kernel/numa_balancing").exists()
        else None
    )
    real_gov = sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor"))
    real_gov_values = [p.read_text() for p in real_gov]
    real_dirty = Path("/proc/sys/vm/dirty_ratio").read_text()
    new_swappiness = "0" if real_swappiness.strip() != "0" else "17"
    h = lab.hosts[1]
    govs = lab.ssh(h, "cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor").stdout.split()
    assert govs and set(govs) == {"powersave"}
    lab.ssh(
        h,
        "for f in /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor; do "
        "echo performance | sudo tee $f >/dev/null; done",
    )
    assert set(lab.ssh(h, "cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor").stdout.split()) == {
        "performance"
    }
    lab.ssh(h, f"sudo sysctl -w vm.swappiness={new_swappiness}")
    assert lab.ssh(h, "sudo sysctl -n vm.swappiness").stdout.strip() == new_swappiness
    if real_numa is not None:
        lab.ssh(h, "sudo sysctl -w kernel.numa_balancing=1")
        assert lab.ssh(h, "cat /proc/sys/kernel/numa_balancing").stdout.strip() == "1"
    # boot-time path: systemd-sysctl applies /etc/sysctl.d files and succeeds
    lab.ssh(
        h,
        "echo 'vm.dirty_ratio = 7' | sudo tee /etc/sysctl.d/90-lab-test.conf >/dev/null && "
        "sudo systemctl restart systemd-sysctl",
    )
    assert lab.ssh(h, "systemctl is-active systemd-sysctl").stdout.strip() == "active"
    assert lab.ssh(h, "cat /proc/sys/vm/dirty_ratio").stdout.strip() == "7"
    # this machine's kernel knobs are untouched
    assert Path("/proc/sys/vm/swappiness").read_text() == real_swappiness
    if real_numa is not None:
        assert Path("/proc/sys/kernel/numa_balancing").read_text() == real_numa
    assert Path("/proc/sys/vm/dirty_ratio").read_text() == real_dirty
    assert [p.read_text() for p in real_gov] == real_gov_values


def test_ascend_stand_ins_follow_hardware_profile(lab):
    h = lab.hosts[1]
    before = _boot_ids(lab)
    lab_cli("up", "--nodes", "2", "--hardware", "atlas-800i-a3")
    try:
        assert _boot_ids(lab) == before  # same hosts, re-profiled in place
        store = lab.status["ascend_files"]
        names = [
            "Ascend-hdk-910c-npu-driver_25.2.0_linux-x86-64.run",
            "Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run",
            "Ascend-cann-nnal_8.3.RC1_linux-x86_64.run",
        ]
        fetch = " && ".join(f"curl -fsSO {store}{n} && chmod +x {n}" for n in names)
        lab.ssh(h, f"cd /tmp && {fetch}")
        assert "All good" in lab.ssh(h, f"/tmp/{names[1]} --check").stdout
        early = lab.ssh(h, f"sudo /tmp/{names[2]} --install --quiet", check=False)
        assert early.returncode != 0 and "toolkit first" in early.stdout  # install order enforced like the real one
        for flags, name in (
            ("--full --install-for-all --quiet", names[0]),
            ("--install --quiet", names[1]),
            ("--install --quiet", names[2]),
        ):
            lab.ssh(h, f"sudo /tmp/{name} {flags}")
        listing = lab.ssh(h, "sudo npu-smi info -l").stdout
        assert "Total Count                    : 16" in listing and listing.count("Ascend910") == 16
        env = lab.ssh(
            h,
            ". /usr/local/Ascend/ascend-toolkit/set_env.sh && . /usr/local/Ascend/nnal/atb/set_env.sh "
            "&& echo $ASCEND_TOOLKIT_HOME $ATB_HOME_PATH",
        ).stdout.split()
        assert env == ["/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1"]
        assert "Version=25.2.0" in lab.ssh(h, "cat /usr/local/Ascend/driver/version.info").stdout
    finally:
        lab_cli("up", "--nodes", "2", "--hardware", HARDWARE)
    assert lab.ssh(h, "sudo npu-smi info -l", check=False).returncode != 0  # back to an NVIDIA profile


def test_up_is_idempotent_and_grows_and_shrinks(lab):
    before = _boot_ids(lab)
    out = lab_cli("up", "--nodes", "2").stderr
    assert "keeping 2 running" in out
    assert _boot_ids(lab) == before
    # grown mixed: the new host of another profile, the running ones keep theirs
    lab_cli("up", "--nodes", "2", "--hardware", HARDWARE, "--plus", "atlas-800i-a3:1")
    lab.refresh()
    assert [(h["name"], h["hardware"]) for h in lab.hosts] == [
        ("lab1", HARDWARE),
        ("lab2", HARDWARE),
        ("lab3", "atlas-800i-a3"),
    ]
    assert lab.ssh(lab.hosts[2], "systemctl is-system-running --wait").stdout.strip() == "running"
    assert [lab.ssh(h, "cat /etc/ironlab/hardware").stdout.strip() for h in lab.hosts] == [
        HARDWARE,
        HARDWARE,
        "atlas-800i-a3",
    ]
    assert "lab3" in lab.ssh(lab.hosts[0], "cat /etc/hosts").stdout  # running hosts learn the new one
    assert {k: v for k, v in _boot_ids(lab).items() if k != "lab3"} == before
    lab_cli("up", "--nodes", "2")
    lab.refresh()
    assert [h["name"] for h in lab.hosts] == ["lab1", "lab2"]


def test_each_host_has_a_disk_of_its_own(lab):
    """A host's directory is its own loop-mounted ext4 image (hosts.disk_image): a down unmounts and unlinks it. Its
    flushes stop at this machine's page cache (nobarrier): a host's fsync does not flush this machine's disk."""
    state_dir = Path(lab.hosts[0]["ssh_key"]).parents[1]
    mounts = {line.split()[1]: line.split()[2:4] for line in Path("/proc/mounts").read_text().splitlines()}
    for h in lab.hosts:
        fstype, options = mounts.get(str(state_dir / "hosts" / h["name"]), ("", ""))
        assert fstype == "ext4", h["name"]
        assert "nobarrier" in options.split(","), (h["name"], options)
        assert (state_dir / "hosts" / f"{h['name']}.ext4").is_file()


def test_pyinfra_inventory(lab):
    pytest.importorskip("pyinfra")
    import shutil
    import sys

    pyinfra = shutil.which("pyinfra") or str(Path(sys.executable).with_name("pyinfra"))
    if not Path(pyinfra).exists():
        pytest.skip("pyinfra CLI not installed")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [pyinfra, "-y", "inventories/lab.py", "exec", "--", "hostname"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for h in lab.hosts:
        assert f"[{h['name']}] Success" in proc.stdout + proc.stderr


def test_down_leaves_nothing(lab):
    state_dir = Path(lab.hosts[0]["ssh_key"]).parents[1]
    lab_cli("down")
    assert json.loads(lab_cli("status", "--format", "json").stdout) == {"hosts": []}
    assert "ironlab" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert "ironlab0" not in links and "ilab-" not in links
    mounts = Path("/proc/mounts").read_text()
    assert str(state_dir) + "/" not in mounts and "/run/netns/ironlab" not in mounts
    assert not list(state_dir.glob("hosts/*.ext4"))
    assert str(state_dir) not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert not [p for p in Path("/sys/fs/cgroup").glob("*/ironlab")] and not Path("/sys/fs/cgroup/ironlab").exists()
    live = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            status = (proc_dir / "status").read_text()
            cmd = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "State:\tZ" in status:
            continue  # already dead, waiting for this machine's init to reap it
        if "systemd-nspawn" in cmd or ("httpd.py" in cmd and str(state_dir) in cmd):
            live.append(cmd)
    assert live == []
    from ironserve_lab.cluster import leftovers

    assert leftovers(state_dir) == []
