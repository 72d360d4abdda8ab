"""The lab's stand-in hardware: the catalogue's hardware profiles (recipes/hardware.yaml), as the stand-in tools
(nvidia-smi, libnvidia-ml, npu-smi, the driver and toolkit packages: standins.py) report them.

What a profile says (vendor, device name and count, memory, interconnect, architecture, driver branch, toolkit) is
read from the catalogue, never copied here. What the real tools print beyond it is in DEVICES, per device name: the
exact MiB a card reports, its power limit and maximum clocks, the Ascend chip's name. The lab stands in for the
catalogue's profiles without accelerators and for those whose device DEVICES describes.
"""

from __future__ import annotations

from ironserve import catalogue, resources

# device name (the catalogue's accelerator.name) -> what its real tools report that the catalogue does not say
DEVICES: dict[str, dict] = {
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": {
        "memory_mib": 97887,
        "power_limit_w": 300,
        "max_sm_mhz": 2430,
        "max_mem_mhz": 14001,
    },
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": {
        "memory_mib": 97887,
        "power_limit_w": 600,
        "max_sm_mhz": 2617,
        "max_mem_mhz": 14001,
    },
    "NVIDIA GB200": {"memory_mib": 189471, "power_limit_w": 1200, "max_sm_mhz": 2062, "max_mem_mhz": 3996},
    "Ascend910": {"chip_name": "910C"},
}
# the stand-in NVIDIA driver's release on the catalogue's driver branch (580 -> 580.95.05)
DRIVER_RELEASE = "95.05"
# interconnects whose GPUs meet over NVLink (nvidia-smi's NVLink answers)
NVLINK = ("nvlink-mnnvl", "nvswitch")


def _compute_cap(arch: str) -> str:
    """smNNN -> "NN.N" (sm120 -> 12.0, sm90 -> 9.0): what nvidia-smi's compute_cap prints."""
    digits = arch.removeprefix("sm")
    return f"{digits[:-1]}.{digits[-1]}"


def _stand_in(profile) -> dict | None:
    """What the stand-in tools answer on a host of ``profile`` (None: the lab has no stand-in for its device)."""
    acc = profile.accelerator
    if acc.vendor == "none":
        return {"kind": "none"}
    device = DEVICES.get(acc.name)
    if device is None:
        return None
    if acc.vendor == "huawei":
        return {
            "kind": "ascend",
            "count": acc.count,
            "name": acc.name,
            "chip_name": device["chip_name"],
            "hbm_mib": acc.memory_gib * 1024,
            "driver_version": profile.driver_branch,
        }
    return {
        "kind": "nvidia",
        "count": acc.count,
        "name": acc.name,
        "memory_mib": device["memory_mib"],
        "compute_cap": _compute_cap(acc.arch),
        "power_limit_w": device["power_limit_w"],
        "max_sm_mhz": device["max_sm_mhz"],
        "max_mem_mhz": device["max_mem_mhz"],
        "nvlink": acc.interconnect in NVLINK,
    }


def _one(field: str, vendor: str) -> str:
    """The one value of ``field`` over the stand-in profiles of ``vendor``: one stand-in driver and toolkit each."""
    values = {
        getattr(CATALOGUE[pid], field) for pid, p in PROFILES.items() if CATALOGUE[pid].accelerator.vendor == vendor
    }
    if len(values) != 1:
        raise ValueError(
            f"the lab's {vendor} stand-in profiles need one {field} (recipes/hardware.yaml has {sorted(values)}): "
            "the stand-in packages are one release"
        )
    return values.pop()


# the catalogue shipped with ironserve (not a site's recipe directories): the profiles the lab stands in for
CATALOGUE = catalogue.load_hardware(resources.catalogue_dir() / "hardware.yaml")
PROFILES: dict[str, dict] = {pid: s for pid, s in ((pid, _stand_in(p)) for pid, p in CATALOGUE.items()) if s}
HARDWARE_IDS = tuple(PROFILES)
DRIVER_VERSION = f"{_one('driver_branch', 'nvidia')}.{DRIVER_RELEASE}"
CUDA_VERSION = _one("toolkit", "nvidia")
ASCEND_DRIVER_VERSION = _one("driver_branch", "huawei")
CANN_VERSION = _one("toolkit", "huawei")
