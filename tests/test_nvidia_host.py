"""Real NVIDIA host steps as data: module packages, holds, NVLink clique and domain, CDI GPU access, IMEX nodes
config, and the audit checks derived from them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ironserve import catalogue
from ironserve.audit.runner import plan_checks
from ironserve.hostdata import HostData
from ironserve.inventory import InventoryHost
from ironserve.nvidia import docker_gpu_args, gpu_access
from ironserve.render import render
from ironserve.units import exec_argv
from roles.context import build_context
from roles.desired import DesiredPackage
from roles.imex import nodes_config_text
from roles.nvidia_driver import (
    desired_packages,
    desired_runtime,
    fabric_manager_package,
    fabric_manager_pins,
    hold_list,
    module_packages,
)
from roles.preflight import clique_problems, host_clique, module_problems, nvlink_domain

GB200 = "glm5-nvfp4-gb200-disagg"


def gpu(clique="7", uuid="9c6f5af3-53bf-49b5-a436-b66766c413c3", status="Success"):
    return {
        "gpu": "00000000:01:00.0",
        "state": "Completed",
        "status": status,
        "clique_id": clique,
        "cluster_uuid": uuid,
    }


def test_module_packages_follow_the_running_kernel():
    assert module_packages("dkms", "580", "6.8.0-1013-nvidia-64k") == ["linux-headers-6.8.0-1013-nvidia-64k"]
    assert module_packages("precompiled", "580", "6.8.0-45-generic") == [
        "linux-modules-nvidia-580-open-6.8.0-45-generic"
    ]


def test_hold_list_takes_installed_kernel_packages_only():
    installed = {"linux-image-6.8.0-45-generic": ["6.8.0-45.45"], "linux-generic": ["6.8.0.45.45"], "curl": ["8"]}
    assert hold_list("nvidia-open-580", ["linux-headers-6.8.0-45-generic"], "6.8.0-45-generic", installed) == [
        "linux-generic",
        "linux-headers-6.8.0-45-generic",
        "linux-image-6.8.0-45-generic",
        "nvidia-open-580",
    ]


def test_secure_boot_refuses_dkms_and_names_both_ways_out():
    problems = module_problems("h", {"release": "6.8.0-45-generic", "secure_boot": True}, "dkms", "ubuntu")
    assert len(problems) == 1 and "nvidia_module_source=precompiled" in problems[0] and "mokutil" in problems[0]
    assert module_problems("h", {"secure_boot": True}, "precompiled", "ubuntu") == []
    assert "only Ubuntu" in module_problems("h", {}, "precompiled", "debian")[0]
    assert module_problems("h", {"secure_boot": None}, "dkms", "debian") == []


def test_clique_check():
    assert host_clique([gpu(), gpu()])[0] == ("9c6f5af3-53bf-49b5-a436-b66766c413c3", "7")
    assert clique_problems({"a": [gpu()], "b": [gpu()], "c": [gpu()]}) == []
    problems = clique_problems({"a": [gpu()], "b": [gpu()], "c": [gpu(clique="9")]})
    assert problems[0].startswith("c: NVLink clique") and "a, b report" in problems[0]
    assert "nvlink_domain" in problems[-1]
    assert "fabric state" in clique_problems({"a": [gpu(status="Insufficient Resources")]})[0]
    assert "no clique" in clique_problems({"a": [gpu(clique="0")]})[0]


def gb200_hosts(n=5, **extra):
    return [
        (f"g{i}", {"hardware": "gb200", "ssh_hostname": f"10.0.0.{i + 1}", "nic": "eth0", **extra}) for i in range(n)
    ]


def test_nvlink_domain_and_nodes_config():
    hosts = gb200_hosts()
    hosts[4][1]["nvlink_domain"] = "rack-b"
    assert [h.name for h in nvlink_domain(build_context("glm5", "g0", hosts))] == ["g0", "g1", "g2", "g3"]
    assert [h.name for h in nvlink_domain(build_context("glm5", "g4", hosts))] == ["g4"]
    assert nodes_config_text(["10.0.0.1", "10.0.0.2"]) == "10.0.0.1\n10.0.0.2\n"


def test_cdi_or_gpus_by_toolkit_version():
    assert gpu_access("1.18.0-1") == "cdi" and gpu_access("1.13.5-1") == "dev-char" and gpu_access(None) == "cdi"
    assert docker_gpu_args("all", "cdi") == ["--device", "nvidia.com/gpu=all"]
    assert docker_gpu_args("0,1", "cdi") == ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]
    assert docker_gpu_args("all", "dev-char") == ["--gpus", "all"]
    recipe = catalogue.get_recipe(GB200)
    new = render(recipe, [InventoryHost(n, d) for n, d in gb200_hosts()]).processes[0]
    old = render(
        recipe, [InventoryHost(n, {**d, "nvidia_container_toolkit_version": "1.13.5-1"}) for n, d in gb200_hosts()]
    ).processes[0]
    assert "nvidia.com/gpu=all" in exec_argv(recipe, new) and "--gpus" not in exec_argv(recipe, new)
    assert exec_argv(recipe, old)[exec_argv(recipe, old).index("--gpus") + 1] == "all"


def test_audit_checks_gb200_host_steps():
    checks, _ = plan_checks("inventories/gb200.py", "deploys/glm5.py")
    found = {(c.host, c.id) for c in checks}
    for check in (
        "kernel:module-prerequisites",
        "kernel:nouveau-not-loaded",
        "apt-hold:nvidia-open-580",
        "gpu:persistence-mode",
        "imex:service-enabled",
        "imex:ready",
        "imex:channel0",
        "file:/etc/nvidia-imex/nodes_config.cfg",
        "file:/etc/modprobe.d/ironserve-blacklist-nouveau.conf",
        "file:/etc/modprobe.d/ironserve-nvidia.conf",
        "package:nvidia-imex-580",
        "dcgm:active",
        "cdi:nvidia.com/gpu=all",
    ):
        assert ("gb200-d3", check) in found, check
    rtx, _ = plan_checks("inventories/rtx6000.py", "deploys/glm5.py")
    assert not any(c.id.startswith("imex:") or c.id == "dcgm:active" for c in rtx)


def test_cdi_devices_read_back_as_the_gpus_they_ask_for():
    from ironserve.nvidia import cdi_gpus

    assert docker_gpu_args('"device=5"', "cdi") == ["--device", "nvidia.com/gpu=5"]
    assert docker_gpu_args("2", "cdi") == ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]
    assert cdi_gpus(["nvidia.com/gpu=0", "/dev/x", "nvidia.com/gpu=1"]) == '"device=0,1"'
    assert cdi_gpus(["nvidia.com/gpu=all"]) == "all" and cdi_gpus(["/dev/x"]) is None


def profile_ctx(profile_id: str, **data) -> SimpleNamespace:
    """What the driver role's pure helpers read of a context: the profile and this host's typed data."""
    profile = catalogue.hardware_profiles()[profile_id]
    return SimpleNamespace(profile=profile, vendor=profile.accelerator.vendor, host=HostData(**data))


@pytest.mark.parametrize(
    "version,package",
    [
        ("580.95.05-1", "nvidia-fabricmanager"),
        ("590.44.01-1", "nvidia-fabricmanager"),
        ("575.57.08-1", "nvidia-fabricmanager-575"),
        ("570.172.08-1", "nvidia-fabricmanager-570"),
    ],
)
def test_fabric_manager_package_follows_the_driver_branch(version, package):
    # NVIDIA's CUDA repositories: nvidia-fabricmanager-<branch> up to 575, nvidia-fabricmanager from 580 on
    assert fabric_manager_package(version) == package


def test_precompiled_modules_take_ubuntus_fabric_manager_of_the_branch():
    # Ubuntu's signed modules come with Ubuntu's driver, whose Fabric Manager is Ubuntu's nvidia-fabricmanager-580
    ctx = profile_ctx("h100-sxm", nvidia_module_source="precompiled", nvidia_driver_version="580.95.05-0ubuntu1")
    assert fabric_manager_pins(ctx) == {"nvidia-fabricmanager-580": "580.95.05-0ubuntu1"}


@pytest.mark.parametrize("profile_id", ["h100-sxm", "h200", "b200"])
def test_nvswitch_boards_install_fabric_manager_at_the_driver_version(profile_id):
    ctx = profile_ctx(profile_id, nvidia_driver_version="580.105.08-1")
    assert fabric_manager_pins(ctx) == {"nvidia-fabricmanager": "580.105.08-1"}
    assert DesiredPackage("nvidia-fabricmanager", "580.105.08-1", "driver") in desired_packages(ctx)
    checks = {c.id: c for c in desired_runtime(ctx)}
    active = checks["fabric-manager:active"]
    assert active.expected == "active"
    assert active.cmd.startswith("systemctl is-active nvidia-fabricmanager.service")
    assert checks["apt-hold:nvidia-fabricmanager"].expected == "hold ok installed"


@pytest.mark.parametrize("profile_id", ["rtx6000-pro", "rtx6000-pro-maxq", "gb200", "gb300"])
def test_pcie_and_mnnvl_profiles_do_not_install_fabric_manager(profile_id):
    ctx = profile_ctx(profile_id)
    assert fabric_manager_pins(ctx) == {}
    assert [p.name for p in desired_packages(ctx)] == [f"nvidia-open-{ctx.profile.driver_branch}"]
    assert not any("fabric" in c.id for c in desired_runtime(ctx))


def test_audit_of_the_catalogue_inventories_has_no_fabric_manager():
    for inventory in ("inventories/rtx6000.py", "inventories/gb200.py"):
        checks, _ = plan_checks(inventory, "deploys/glm5.py")
        assert checks and not any("fabric" in c.id for c in checks), inventory
