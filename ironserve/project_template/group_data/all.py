"""Host data of every host (pyinfra's group_data/all.py). `ironserve schema --host-data` lists every key."""

# the hardware profile of these hosts: `ironserve render --list` shows the catalogue's recipes and their
# profiles (rtx6000-pro, rtx6000-pro-maxq, h100-sxm, h200, b200, gb200, gb300, atlas-800i-a3); a profile of your
# own goes in recipes/hardware.yaml
hardware = "rtx6000-pro"

# the interface of the cluster network: GLOO/NCCL socket traffic of multi-node groups is pinned to it
nic = "eth0"

# how pyinfra (and ironserve audit/status, which connect the same way) reach the hosts
ssh_user = "ubuntu"
_sudo = True
# ssh_key = "~/.ssh/id_ed25519"
# ssh_config_file = "ssh_config"            # ProxyJump to a bastion, per-host users and keys
# ssh_known_hosts_file = "known_hosts"      # the hosts' keys; unknown keys are refused by audit and status
# ssh_strict_host_key_checking = "accept-new"

# secrets: files on this machine, uploaded 0600 root, never in argv, unit files or logs
# api_key_file = "~/.config/ironserve/api_key"     # servers bound to 0.0.0.0 require a key
# hf_token_file = "~/.config/ironserve/hf_token"   # with model_source = "hub"

# weights: already at the recipe's model path ("path"), or downloaded from the hub once per host ("hub")
model_source = "path"
# model_root = "/srv/models"                       # <model_root>/<model name> on every host

# air-gapped clusters: the internal mirrors (unset: the vendors' public repositories)
# nvidia_apt_mirror = "https://mirror.example.internal/nvidia/cuda/ubuntu2404/x86_64"
# docker_apt_mirror = "https://mirror.example.internal/docker/ubuntu"
# docker_registry_mirror = "registry.example.internal:5000"
# pip_index_url = "https://mirror.example.internal/pypi/simple"
# hf_endpoint = "https://hf-mirror.example.internal"
