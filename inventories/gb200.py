"""Example inventory: GLM-5 NVFP4 disaggregated over five 4x GB200 nodes (aarch64), as in the GB200 field guide.

    pyinfra inventories/gb200.py deploys/glm5.py      # recipe glm5-nvfp4-gb200-disagg

Hosts are placed in order: the first is the prefill node (TP4), the next four form the decode group
(TP16/DP16/EP16, rank 0 first). The router runs on the first host (127.0.0.1:8000 there).
Cold starts can take an hour (weights + FlashInfer/DeepGEMM JIT): the launch health gate waits that long.
All five trays are in one NVLink domain (one NVL72 rack partition): roles/imex.py writes their addresses into
every host's IMEX nodes config, and preflight refuses the deploy when one of them reports another NVLink clique
(nvidia-smi -q, Fabric ClusterUUID/CliqueId). Trays of another rack get another nvlink_domain.
"""

_common = {
    "ssh_user": "ubuntu",
    "_sudo": True,
    "hardware": "gb200",
    "nic": "enP6p3s0f0np0",
    "model_source": "path",  # weights on the shared filesystem, downloaded once
    "model_path": "/model-store/nvidia/GLM-5-NVFP4",
    "api_key_file": "~/.config/ironserve/api_key",
    "nvlink_domain": "nvl72-rack-a",  # IMEX domain: every host with this value (and only those)
    # Secure Boot on these trays? Ubuntu's signed modules instead of DKMS:
    # "nvidia_module_source": "precompiled",
}

prefill = [("gb200-p0", {**_common, "ssh_hostname": "192.0.2.20"})]
decode = [(f"gb200-d{i}", {**_common, "ssh_hostname": f"192.0.2.{21 + i}"}) for i in range(4)]
