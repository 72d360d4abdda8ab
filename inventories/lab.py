"""Inventory of the local lab (`ironserve lab up`): an ordinary pyinfra inventory read from the lab's state.

    ironserve lab up --nodes 2 --hardware rtx6000-pro-maxq     # as root
    pyinfra inventories/lab.py exec -- hostname
    pyinfra inventories/lab.py deploys/tiny.py

Hosts are systemd-nspawn machines with real systemd and sshd on a private bridge, air-gapped: their only
package sources are the lab's mirrors (an apt repository, a PEP 503 index and a file store on the bridge),
passed below as ordinary mirror data, exactly as for a cluster with internal mirrors. Stand-in GPU/NPU
packages in the lab repository answer for the hardware profile (see lab/ironserve_lab/standins.py).
The state directory is /var/lib/ironserve-lab unless IRONSERVE_LAB_DIR says otherwise. Reads JSON only,
so it works without ironserve importable.

Weights: by default every host finds the lab's checkpoints on the read-only /srv/models mount (model_root, like
shared storage). The lab's Hugging Face-compatible hub on the bridge (`lab status`: hub.url) is every host's
hf_endpoint; with IRONSERVE_LAB_MODEL_SOURCE=hub in the environment the hosts get their weights from it instead
(model_source=hub, at the recipe's own model path on each host's disk): one host reads the hub, the others fetch
from it (roles/weights_peers.py).

Hosts: every host of the lab, or with IRONSERVE_LAB_HOSTS=lab4,lab5 in the environment only those (in that order),
as if the lab had no others: one lab can carry independent deployments on disjoint hosts side by side (the test
suite runs its cpu-lab modules so, scripts/test).
"""

import json
import os
from pathlib import Path

_state_file = Path(os.environ.get("IRONSERVE_LAB_DIR") or "/var/lib/ironserve-lab") / "state.json"
if not _state_file.exists():
    raise SystemExit(f"no lab is up ({_state_file} missing): run `ironserve lab up --nodes N` first (as root)")
_state = json.loads(_state_file.read_text())
_hub_weights = os.environ.get("IRONSERVE_LAB_MODEL_SOURCE") == "hub"


def _selected(hosts: list[dict]) -> list[dict]:
    names = [n for n in os.environ.get("IRONSERVE_LAB_HOSTS", "").split(",") if n]
    if not names:
        return hosts
    by_name = {h["name"]: h for h in hosts}
    unknown = [n for n in names if n not in by_name]
    if unknown or len(set(names)) != len(names):
        raise SystemExit(
            f"IRONSERVE_LAB_HOSTS={','.join(names)}: each name once, among the lab's hosts "
            f"({', '.join(by_name) or 'none'}); unknown: {', '.join(unknown) or 'none'}"
        )
    return [by_name[n] for n in names]


_hosts = _selected(_state["hosts"])
if _hub_weights and not _state.get("hub_url"):
    raise SystemExit("IRONSERVE_LAB_MODEL_SOURCE=hub, but this lab serves no model on its hub (cpu-lab profiles do)")

_common = {
    "ssh_user": _state["ssh_user"],
    "ssh_key": _state["ssh_key"],
    "ssh_known_hosts_file": _state["known_hosts"],  # host keys are stable per host name across down/up
    "ssh_strict_host_key_checking": "yes",
    "_sudo": True,
    # the lab runs the aarch64 profiles (gb200, atlas-800i-a3) on x86_64 stand-in hosts
    "allow_emulated_arch": True,
    # the lab hosts' only interface: GLOO/NCCL socket traffic goes over the lab bridge
    "nic": "host0",
    # health gates poll a tiny model that starts in seconds: every 2 s rather than production's 10
    "health_poll_s": 2,
    # the lab's engines are tiny models that start in seconds, and its tests kill engines many times and wait for
    # systemd to restart them: 3 s rather than production's 15
    "engine_restart_s": 3,
    # the lab's bridge is private to this machine: its keyless recipes may serve on 0.0.0.0 (elsewhere that is a
    # deploy error without an API key); the keyed lab tests set it back to false
    "allow_open_bind": True,
    # air-gapped mirrors on the lab bridge (the lab repo also carries the stand-in NVIDIA packages)
    "nvidia_apt_mirror": _state["apt_mirror"],
    "pip_index_url": _state["pip_index"],
    "allow_http_index": True,  # the lab's index is served over http on the lab's own bridge
    "ascend_package_store": _state["ascend_files"],
    # the sums of the lab's installers, as a site writes its vendor's published ones (installed only on a match)
    "ascend_package_sha256": _state.get("ascend_sha256") or {},
    "docker_apt_mirror": _state["apt_mirror"],
    "docker_apt_suite": "/",
    # the CPython builds the lab publishes, for uv recipes whose Python the hosts' OS lacks (uv cannot download);
    # IRONSERVE_LAB_PYTHON_DOWNLOADS=off leaves them unnamed, as on an air-gapped site without a mirror
    **(
        {"uv_python_downloads_json_url": _state["python_downloads"]}
        if _state.get("python_downloads") and os.environ.get("IRONSERVE_LAB_PYTHON_DOWNLOADS") != "off"
        else {}
    ),
    # weights: the lab publishes small checkpoints on every host (read-only, like shared storage), or, with
    # IRONSERVE_LAB_MODEL_SOURCE=hub, the hosts download them from the lab's hub, the site mirror of an air-gapped lab
    **(
        {"model_source": "hub"}
        if _hub_weights
        else {"model_source": "path", **({"model_root": _state["model_root"]} if _state.get("model_root") else {})}
    ),
    **({"hf_endpoint": _state["hub_url"]} if _state.get("hub_url") else {}),
    # The lab signs its repository with a key of its own: already on every host for signed-by, and published
    # next to the index for roles that fetch the mirror's key. Unsigned (no gpg on the lab machine): trusted.
    **(
        {"apt_signed_by": _state["apt_signed_by"], "nvidia_apt_key_name": "ironlab-archive-key.asc"}
        if _state.get("apt_signed_by")
        else {"apt_trusted": True}
    ),
    # the key a role that fetches the mirror's key must find there: the lab's own, not NVIDIA's
    **({"nvidia_apt_key_fingerprint": _state["apt_key_fingerprint"]} if _state.get("apt_key_fingerprint") else {}),
}

# Stand-in accelerators answer nvidia-smi/npu-smi but cannot run an engine: prepare and validate only.
_launch = {"cpu-lab": True}

# Every profile: the real Docker engine from Debian (docker.io brings containerd, runc, iptables), pulling Docker
# Hub names through the lab's registry as their mirror, verified with the lab registry's CA (an internal
# registry's setup). NVIDIA profiles pull stand-in images there (lab/ironserve_lab/gpu_images.py), whose digests the
# lab's site lock names in place of the recipes' upstream ones, as a site that rebuilds its images would.
_docker = {
    "docker_packages": ["docker.io"],
    **(
        {"docker_registry_mirror": _state["registry"], "docker_registry_ca": _state["registry_ca"]}
        if _state.get("registry")
        else {}
    ),
    **({"docker_image_lock": _state["image_lock"]} if _state.get("image_lock") else {}),
}
# cpu-lab hosts build a recipe's derived image once per deployment, push it to the lab registry and run it by digest
# (verified with the same CA); the stand-in NVIDIA profiles keep building it on each host: both paths stay proven
# (tests/e2e/test_serve_tiny_docker_lab.py, test_deploy_glm5_lab.py)
_derived = {"docker_derived_registry": f"{_state['registry']}/lab-derived"} if _state.get("registry") else {}


def _role(h: dict) -> dict:
    # cpu-lab with 3+ hosts: the first host runs only the router (recipes with host_placement: dedicated,
    # e.g. tiny-cpu), the others the replicas
    if h["hardware"] == "cpu-lab" and len(_hosts) >= 3 and h is _hosts[0]:
        return {"ironserve_role": "router"}
    return {}


lab_hosts = [
    (
        h["name"],
        {
            **_common,
            "ssh_hostname": h["address"],
            "hardware": h["hardware"],
            "launch": _launch.get(h["hardware"], False),
            **_docker,
            **(_derived if h["hardware"] == "cpu-lab" else {}),
            **_role(h),
        },
    )
    for h in _hosts
]
