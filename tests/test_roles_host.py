"""Pure helpers of the host roles (preflight, host tuning, NVIDIA driver/CUDA, GPU clocks, NCCL, Ascend).

The facts and operations themselves are covered by the pyinfra-testing fixtures under tests/facts and
tests/operations; these tests pin the text the roles put on hosts and the decisions they make.
"""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pyinfra.api import OperationError

from ironserve.hostdata import DEFAULTS
from ironserve.spec import ServerOptions, devices_per_node
from roles import ascend, cuda, gpu_clocks, host_tuning, nccl, nvidia_driver, preflight
from roles.context import build_context

ROOT = Path(__file__).resolve().parents[1]
UBUNTU = {"name": "Ubuntu", "release_meta": {"ID": "ubuntu", "VERSION_ID": "24.04"}}
DEBIAN = {"name": "Debian", "release_meta": {"ID": "debian", "VERSION_ID": "12"}}


# --------------------------------------------------------------------------- preflight


def test_devices_needed_from_rendered_processes():
    ctx = build_context("glm5", "h1", [("h1", {"hardware": "rtx6000-pro-maxq"})])
    assert preflight.devices_needed(ctx.processes) == 8


def test_devices_needed_multinode_dp_attention():
    hosts = [(f"a{i}", {"hardware": "atlas-800i-a3", "nic": "eth0"}) for i in range(2)]
    ctx = build_context("glm5.1", "a0", hosts)
    # --tp-size 32 --dp-size 16 --enable-dp-attention over 2 nodes: 16 dies per node
    assert preflight.devices_needed(ctx.processes) == 16


def test_devices_needed_counts_dp_without_attention_and_skips_router():
    class P:
        def __init__(self, role, server):
            self.role, self.devices = role, devices_per_node(server, 1)

    procs = [P("server", ServerOptions(tp_size=2, dp_size=2)), P("router", ServerOptions(tp_size=64))]
    assert preflight.devices_needed(procs) == 4


def test_platform_allows_x86_standins_only_when_emulated_arch_is_allowed():
    assert preflight.platform_problems("h", "aarch64", "x86_64", UBUNTU, allow_emulated_arch=True) == []
    assert "expected aarch64, found x86_64" in preflight.platform_problems("h", "aarch64", "x86_64", UBUNTU)[0]
    # it does not excuse the opposite mismatch
    assert preflight.platform_problems("h", "x86_64", "aarch64", UBUNTU, allow_emulated_arch=True)


def test_platform_os_must_be_debian_or_ubuntu():
    problems = preflight.platform_problems(
        "gpu-a", "x86_64", "x86_64", {"name": "Rocky", "release_meta": {"ID": "rocky"}}
    )
    assert problems == [
        "gpu-a: operating system: expected Debian or Ubuntu, found Rocky. "
        "Fix: reinstall the host with Debian 12 or Ubuntu 24.04"
    ]


def test_device_problems_name_host_expected_found_fix():
    devs = [{"name": "NVIDIA GB200"}] * 3
    (problem,) = preflight.device_problems("gb-1", "nvidia", "NVIDIA GB200", 4, 0, devs)
    assert problem.startswith("gb-1: accelerator count: expected 4, found 3. Fix:")


def test_device_problems_npu_counts_dies():
    cards = [{"name": "Ascend910", "chip_count": 2}] * 8
    assert preflight.device_problems("a3", "huawei", "Ascend910", 16, 16, cards) == []


def test_device_problems_driver_not_loaded_says_reboot():
    (problem,) = preflight.device_problems("h", "nvidia", "X", 8, 8, [])
    assert "reboot" in problem and "allow_reboot=true" in problem


# --------------------------------------------------------------------------- host tuning


def test_size_kib():
    assert host_tuning.size_kib("8g") == 8 * 1024 * 1024
    assert host_tuning.size_kib("512M") == 512 * 1024
    assert host_tuning.size_kib("65536") == 64


def test_sysctl_text_sorted_and_headed():
    text = host_tuning.sysctl_text({"vm.swappiness": 0, "kernel.numa_balancing": 0})
    assert text.splitlines()[0].startswith("# Managed by ironserve")
    assert text.splitlines()[2:] == ["kernel.numa_balancing = 0", "vm.swappiness = 0"]


def test_sysctl_drift_separates_unknown_keys():
    values = {"vm.swappiness": 0, "kernel.sched_migration_cost_ns": 50000, "net.ipv4.tcp_rmem": "4096 131072 6291456"}
    live = {"vm.swappiness": "60", "kernel.sched_migration_cost_ns": None, "net.ipv4.tcp_rmem": "4096 131072 6291456"}
    assert host_tuning.sysctl_drift(values, live) == (["vm.swappiness"], ["kernel.sched_migration_cost_ns"])


def test_governor_unit_is_persistent_oneshot_and_escapes_dollars():
    text = host_tuning.governor_unit_text("performance")
    assert "Type=oneshot" in text and "RemainAfterExit=yes" in text and "WantedBy=multi-user.target" in text
    assert 'echo performance > "$$f"' in text  # systemd would expand a single $f itself
    assert "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor" in text


def test_limits_text_units_and_root():
    text = host_tuning.limits_text("unlimited", 67108864, 1048576)
    assert "*     soft memlock  unlimited" in text
    assert "root  hard stack    65536" in text  # limits.conf counts KiB
    assert "*     hard nofile   1048576" in text


def test_fstab_line():
    assert host_tuning.fstab_shm_line("16g") == "tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=16g 0 0"


# --------------------------------------------------------------------------- NVIDIA driver and CUDA


@pytest.mark.parametrize(
    "distro,arch,url",
    [
        (UBUNTU, "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"),
        (DEBIAN, "aarch64", "https://developer.download.nvidia.com/compute/cuda/repos/debian12/sbsa/"),
    ],
)
def test_default_repo_url(distro, arch, url):
    assert nvidia_driver.default_repo_url(distro, arch) == url


def test_default_repo_url_refuses_unknown():
    with pytest.raises(ValueError):
        nvidia_driver.default_repo_url(UBUNTU, "ppc64le")
    with pytest.raises(ValueError):
        nvidia_driver.default_repo_url({"release_meta": {}}, "x86_64")


def test_nvidia_source_signed_and_trusted():
    signed = nvidia_driver.source_text("https://mirror.example/cuda/ubuntu2404/x86_64")
    assert "URIs: https://mirror.example/cuda/ubuntu2404/x86_64/\nSuites: /\n" in signed
    assert "Signed-By: /usr/share/keyrings/ironserve-nvidia.gpg" in signed and "Trusted" not in signed
    lab = nvidia_driver.source_text("http://10.213.7.1:8780/apt", None, trusted=True)
    assert "Trusted: yes" in lab and "Signed-By" not in lab


def test_upstream_version():
    assert nvidia_driver.upstream("580.95.05-1") == "580.95.05"
    assert nvidia_driver.upstream("1:4.4.1-1") == "4.4.1"
    assert nvidia_driver.upstream("580.95.05") == "580.95.05"


def test_apt_pin_text():
    text = nvidia_driver.apt_pin_text([("nvidia-open-580", "580.95.05-1")], "roles/nvidia_driver.py")
    assert "Package: nvidia-open-580\nPin: version 580.95.05-1\nPin-Priority: 1001\n" in text


def test_dearmor_roundtrip():
    key = bytes(range(256)) * 3
    b64 = base64.encodebytes(key).decode()
    armored = f"-----BEGIN PGP PUBLIC KEY BLOCK-----\nComment: test\n\n{b64}=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n"
    assert nvidia_driver.dearmor(armored.encode()) == key
    assert nvidia_driver.dearmor(key) == key  # binary keyrings pass through


@pytest.mark.parametrize(
    "state,reasons",
    [
        ({"module": "580.95.05", "smi": "580.95.05", "package": "580.95.05-1", "reboot_required": False}, 0),
        ({"module": None, "smi": "580.95.05", "package": "580.95.05-1", "reboot_required": False}, 0),  # lab
        ({"module": None, "smi": None, "package": None, "reboot_required": False}, 0),  # not installed yet
        ({"module": "570.172.08", "smi": None, "package": "580.95.05-1", "reboot_required": False}, 1),
        ({"module": None, "smi": None, "package": "580.95.05-1", "reboot_required": True}, 2),
    ],
)
def test_reboot_reasons(state, reasons):
    assert len(nvidia_driver.reboot_reasons(state, "580.95.05-1")) == reasons


def test_cuda_toolkit_package():
    assert cuda.toolkit_package("13.0") == "cuda-toolkit-13-0"
    assert cuda.toolkit_package(None) == "cuda-toolkit-13-0"


# --------------------------------------------------------------------------- GPU clocks


def test_clock_offset_max_q_only():
    assert gpu_clocks.clock_offset(True, 4000) == 4000
    assert gpu_clocks.clock_offset(False, None) is None
    with pytest.raises(OperationError, match="Max-Q cards only"):
        gpu_clocks.clock_offset(False, 4000, "rtx6000-pro")


def test_clock_unit_text():
    text = gpu_clocks.unit_text(4000)
    assert "After=nvidia-persistenced.service" in text
    assert (
        "ExecStart=/opt/ironserve/tools/bin/python /usr/local/lib/ironserve/ironserve-gpu-clocks.py --offset 4000"
        in text
    )


def test_offsets_drift():
    assert not gpu_clocks.offsets_drift({"0": 4000, "1": 4000}, 4000)
    assert gpu_clocks.offsets_drift({"0": 4000, "1": 0}, 4000)
    assert gpu_clocks.offsets_drift(None, 4000)


def test_clock_script_uses_nvml_set_and_read_back():
    text = (ROOT / "files/host/ironserve-gpu-clocks.py").read_text()
    compile(text, "ironserve-gpu-clocks.py", "exec")
    for call in ("nvmlInit", "nvmlDeviceSetMemClkVfOffset", "nvmlDeviceGetMemClkVfOffset", "--read"):
        assert call in text


# --------------------------------------------------------------------------- NCCL


def test_graph_env_problems():
    path = "/mnt/nccl_graph_opt.xml"
    assert nccl.graph_env_problems(path, {"u": {"NCCL_GRAPH_FILE": path}}) == []
    assert nccl.graph_env_problems(path, {"u": {}})[0].startswith("u: NCCL_GRAPH_FILE is unset")
    assert nccl.graph_env_problems(None, {"u": {"NCCL_GRAPH_FILE": path}})
    assert nccl.graph_env_problems(None, {"u": {}}) == []


def test_recipes_with_a_graph_point_nccl_at_it():
    ctx = build_context("glm5", "h1", [("h1", {"hardware": "rtx6000-pro-maxq"})])
    graph = ctx.tuning.nccl_graph
    assert graph is not None and nccl.graph_source_file(graph.source).is_file()
    envs = {p.unit: p.env for p in ctx.processes if p.role != "router"}
    assert nccl.graph_env_problems(graph.path, envs) == []


def test_shipped_graph_is_valid_nccl_xml_for_8_gpus():
    root = ET.parse(ROOT / "files/nccl/nccl_graph_opt.xml").getroot()
    assert root.tag == "graphs" and root.get("version")
    graphs = root.findall("graph")
    assert {g.get("id") for g in graphs} == {"0", "1"}
    for g in graphs:
        for attr in (
            "pattern",
            "crossnic",
            "nchannels",
            "speedintra",
            "speedinter",
            "typeintra",
            "typeinter",
            "samechannels",
        ):
            assert g.get(attr) is not None, attr
        channels = g.findall("channel")
        assert len(channels) == int(g.get("nchannels"))
        for ch in channels:
            assert sorted(int(gpu.get("dev")) for gpu in ch.findall("gpu")) == list(range(8))


# --------------------------------------------------------------------------- Ascend


@pytest.mark.parametrize(
    "component,arch,name",
    [
        ("driver", "x86_64", "Ascend-hdk-910c-npu-driver_25.2.0_linux-x86-64.run"),
        ("driver", "aarch64", "Ascend-hdk-910c-npu-driver_25.2.0_linux-aarch64.run"),
        ("toolkit", "x86_64", "Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run"),
        ("nnal", "aarch64", "Ascend-cann-nnal_8.3.RC1_linux-aarch64.run"),
    ],
)
def test_run_file_names_match_the_lab_and_a3(component, arch, name):
    version = "25.2.0" if component == "driver" else "8.3.RC1"
    assert ascend.run_file(component, version, arch) == name


def test_version_problems():
    installed = {
        "driver": "25.2.0",
        "toolkit": "8.3.rc1",
        "nnal": None,
        "set_env": ["/usr/local/Ascend/ascend-toolkit/set_env.sh"],
    }
    problems = ascend.version_problems(installed, {"driver": "25.2.0", "toolkit": "8.3.RC1", "nnal": "8.3.RC1"})
    assert problems == [
        "nnal: expected 8.3.RC1, found nothing",
        "/usr/local/Ascend/nnal/atb/set_env.sh: expected (sourced by the service units), found missing",
    ]


def test_recipes_source_the_set_env_scripts_ascend_checks():
    hosts = [(f"a{i}", {"hardware": "atlas-800i-a3", "nic": "eth0"}) for i in range(2)]
    ctx = build_context("glm5.1", "a0", hosts)
    sourced = {s for p in ctx.processes for s in p.source_env}
    assert sourced == {f"{DEFAULTS.ascend_install_path}/{s}" for s in ascend.SET_ENV}


def test_pinned_versions_follow_the_profile():
    hosts = [(f"a{i}", {"hardware": "atlas-800i-a3", "nic": "eth0"}) for i in range(2)]
    ctx = build_context("glm5.1", "a0", hosts)
    assert ascend.pinned_versions(ctx) == {"driver": "25.2.0", "toolkit": "8.3.RC1", "nnal": "8.3.RC1"}


def test_nccl_graph_source_uploads_only_files_of_the_recipe_directories(tmp_path):
    """tuning.nccl_graph.source is uploaded 0644 to every host: never a controller file outside files/, the recipe
    catalogue or the recipe's own directory, whatever the spelling or a symlink says."""
    from pyinfra.api import OperationError

    recipe_dir = tmp_path / "site"
    recipe_dir.mkdir()
    (recipe_dir / "graph.xml").write_text("<graphs/>")
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE")
    (recipe_dir / "escape.xml").symlink_to(secret)
    recipe = str(recipe_dir / "mine.yaml")
    assert nccl.graph_source_file("graph.xml", recipe) == (recipe_dir / "graph.xml").resolve()
    for source in ("escape.xml", str(secret), "../id_rsa", "files/../../id_rsa", "graph.xml"):
        with pytest.raises(OperationError, match="NCCL graph"):
            nccl.graph_source_file(source, recipe if source != "graph.xml" else None)


@pytest.mark.parametrize(
    "source", ["/home/me/.ssh/id_rsa", "../secrets/key", "files/../../x", "~/.ssh/id_rsa", "files/nccl/$(id).xml"]
)
def test_nccl_graph_source_grammar_refuses_paths_outside(source):
    from ironserve.spec import NcclGraph

    with pytest.raises(ValueError, match="write"):
        NcclGraph(path="/mnt/g.xml", source=source)
    assert NcclGraph(path="/mnt/g.xml", source="https://mirror.example/g.xml").source.startswith("https")
