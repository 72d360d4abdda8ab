"""Stand-in answer tables per hardware profile id (lab only: what the fake tools report).

These mirror what the real tools print on the real machines, closely enough for facts,
audits and roles to be exercised; they are not a hardware catalogue.
"""

from __future__ import annotations

DRIVER_VERSION = "580.95.05"
CUDA_VERSION = "13.0"

PROFILES: dict[str, dict] = {
    "rtx6000-pro-maxq": {
        "kind": "nvidia",
        "count": 8,
        "name": "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "memory_mib": 97887,
        "compute_cap": "12.0",
        "power_limit_w": 300,
        "max_sm_mhz": 2430,
        "max_mem_mhz": 14001,
        "nvlink": False,
    },
    "rtx6000-pro": {
        "kind": "nvidia",
        "count": 8,
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "memory_mib": 97887,
        "compute_cap": "12.0",
        "power_limit_w": 600,
        "max_sm_mhz": 2617,
        "max_mem_mhz": 14001,
        "nvlink": False,
    },
    "gb200": {
        "kind": "nvidia",
        "count": 4,
        "name": "NVIDIA GB200",
        "memory_mib": 189471,
        "compute_cap": "10.0",
        "power_limit_w": 1200,
        "max_sm_mhz": 2062,
        "max_mem_mhz": 3996,
        "nvlink": True,
    },
    "atlas-800i-a3": {
        "kind": "ascend",
        "count": 16,
        "name": "Ascend910",
        "chip_name": "910C",
        "hbm_mib": 65536,
        "driver_version": "25.2.0",
    },
    "cpu-lab": {"kind": "none"},
}
