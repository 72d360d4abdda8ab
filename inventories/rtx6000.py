"""Example inventory: one or more RTX PRO 6000 Blackwell servers (8 GPUs each, PCIe).

    pyinfra inventories/rtx6000.py deploys/glm5.py               # default recipe for GLM-5 on this hardware
    pyinfra inventories/rtx6000.py deploys/qwen35.py --data recipe=qwen3.5-nvfp4-rtx6000-tp4
    pyinfra inventories/rtx6000.py deploys/glm5.py --data launch=false   # prepare in a maintenance window

Every key below is ordinary host data; ironserve reads it through roles/context.py. Copy this file and
change the addresses, the NIC and the mirrors for your cluster. Single-node recipes run one independent
copy per host; multi-node recipes take the hosts in the order listed (the first is rank 0).
"""

_common = {
    "ssh_user": "ubuntu",
    "_sudo": True,
    # rtx6000-pro (Server Edition) or rtx6000-pro-maxq (Max-Q: the only cards with memory-clock offsets)
    "hardware": "rtx6000-pro-maxq",
    # the interface of the cluster network: GLOO/NCCL socket traffic is pinned to it for multi-node groups
    "nic": "enp65s0f0",
    # weights already on shared storage ("path"), or downloaded once per host from the hub ("hub")
    "model_source": "hub",
    "hf_token_file": "~/.config/ironserve/hf_token",  # on this machine; uploaded 0600, never in argv
    "api_key_file": "~/.config/ironserve/api_key",  # servers bound to 0.0.0.0 require a key
    # air-gapped clusters: point these at the internal mirrors (unset = the vendors' public repositories)
    # "nvidia_apt_mirror": "https://mirror.internal.example/nvidia/cuda/ubuntu2404/x86_64",
    # "docker_apt_mirror": "https://mirror.internal.example/docker/ubuntu",
    # "pip_index_url": "https://mirror.internal.example/pypi/simple",
}

gpu_nodes = [
    ("gpu-a", {**_common, "ssh_hostname": "192.0.2.10"}),
]
