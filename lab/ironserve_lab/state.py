"""Lab state: where the lab lives on disk, its fixed network plan, and state.json.

Everything the lab creates sits under one state directory (default /var/lib/ironserve-lab,
override with IRONSERVE_LAB_DIR) so that `down` knows exactly what to remove and the
inventory (inventories/lab.py) can read the hosts without importing this package.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_LAB_DIR = "/var/lib/ironserve-lab"

# Network plan. The subnet exists only on the lab bridge; hosts get no default route, so
# nothing can leave it. Gateway .1 is the bridge address, where the supply server listens.
BRIDGE = "ironlab0"
SUBNET_PREFIX = "10.213.7"
GATEWAY = f"{SUBNET_PREFIX}.1"
PREFIX_LEN = 24
SUPPLY_PORT = 8780
REGISTRY_PORT = 5000  # the lab's container registry (registry.py), https on the gateway
HUB_PORT = 8781  # the lab's Hugging Face-compatible hub (hub.py), http on the gateway
FIRST_HOST_OCTET = 10  # lab1 = .11, lab2 = .12, ...
MAX_HOSTS = 200

SSH_USER = "ironserve"
DEFAULT_HARDWARE = "cpu-lab"


def lab_dir() -> Path:
    return Path(os.environ.get("IRONSERVE_LAB_DIR") or DEFAULT_LAB_DIR)


def cache_dir() -> Path:
    """This machine's cache of what the lab supplies (built or downloaded once, kept across labs)."""
    return Path(os.environ.get("IRONSERVE_CACHE") or Path.home() / ".cache" / "ironserve")


def host_name(index: int) -> str:
    return f"lab{index}"


def host_address(index: int) -> str:
    if not 1 <= index <= MAX_HOSTS:
        raise ValueError(f"host index {index} out of range 1..{MAX_HOSTS}")
    return f"{SUBNET_PREFIX}.{FIRST_HOST_OCTET + index}"


def supply_url(path: str = "") -> str:
    return f"http://{GATEWAY}:{SUPPLY_PORT}/{path}"


@dataclass
class Host:
    name: str
    address: str
    node_index: int
    hardware: str


@dataclass
class LabState:
    hosts: list[Host] = field(default_factory=list)
    hardware: str = DEFAULT_HARDWARE
    ssh_user: str = SSH_USER
    ssh_key: str = ""
    known_hosts: str = ""
    bridge: str = BRIDGE
    gateway: str = GATEWAY
    apt_mirror: str = supply_url("apt")
    pip_index: str = supply_url("simple/")
    ascend_files: str = supply_url("ascend/")
    # uv's download list of the interpreters the lab packages (interpreters.py); empty when none was published
    python_downloads: str = ""
    apt_signed_by: str = ""  # keyring path inside hosts; empty when the repo is unsigned (trusted=yes)
    # the fingerprint of the lab's archive key (the key a role that fetches the mirror's key must find there)
    apt_key_fingerprint: str = ""
    # {file: sha256} of the Ascend .run installers the lab publishes (host data ascend_package_sha256)
    ascend_sha256: dict = field(default_factory=dict)
    # stand-in checkpoints (images.py): the directory in every host, and {name: {path, recipes}}
    model_root: str = ""
    models: dict = field(default_factory=dict)
    # the lab's container registry (host:port, https) and the CA file that signs its certificate (this machine)
    registry: str = ""
    registry_ca: str = ""
    # NVIDIA profiles: the site lock naming the lab registry's digests of the stand-in GPU images (gpu_images.py)
    image_lock: str = ""
    # the lab's Hugging Face-compatible hub (hub.py), serving the models the lab generates; empty when it serves none
    hub_url: str = ""
    # the recipe IDs `lab up --for` built the runtimes and images of (needs.py); None: every recipe of the profile
    built_for: list | None = None

    def status(self) -> dict:
        """The public shape printed by `lab status --format json`."""
        return {
            "hosts": [
                {
                    "name": h.name,
                    "address": h.address,
                    "ssh_user": self.ssh_user,
                    "ssh_key": self.ssh_key,
                    "hardware": h.hardware,
                    "node_index": h.node_index,
                }
                for h in self.hosts
            ],
            "known_hosts": self.known_hosts,
            "apt_mirror": self.apt_mirror,
            "pip_index": self.pip_index,
            "ascend_files": self.ascend_files,
            "python_downloads": self.python_downloads,
            "apt_signed_by": self.apt_signed_by,
            "apt_key_fingerprint": self.apt_key_fingerprint,
            "ascend_sha256": self.ascend_sha256,
            "model_root": self.model_root,
            "models": self.models,
            "registry": self.registry,
            "registry_ca": self.registry_ca,
            "image_lock": self.image_lock,
            "hub_url": self.hub_url,
            "built_for": self.built_for,
        }


def state_path(root: Path | None = None) -> Path:
    return (root or lab_dir()) / "state.json"


def load(root: Path | None = None) -> LabState | None:
    path = state_path(root)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    hosts = [Host(**h) for h in data.pop("hosts", [])]
    known = {k: v for k, v in data.items() if k in LabState.__dataclass_fields__}
    return LabState(hosts=hosts, **known)


def save(state: LabState, root: Path | None = None) -> None:
    path = state_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(tmp, path)  # atomic: the inventory never reads a half-written file


def remove(root: Path | None = None) -> None:
    state_path(root).unlink(missing_ok=True)
