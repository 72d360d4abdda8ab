"""Read a pyinfra inventory file offline, the way pyinfra does, for render/lint/audit.

A pyinfra inventory is a Python module whose top-level lists hold hosts: ``"name"`` or ``("name", {data})``.
The list's variable name is the host group. ironserve reads these host data keys:

- ``ssh_hostname``: the address other nodes use to reach this one (dist-init, router URLs); default: the name
- ``nic``: network interface for GLOO/NCCL/HCCL socket traffic (GLOO_SOCKET_IFNAME, ...)
- ``ironserve_role``: ``router`` for a host that runs only the router; workers need nothing
- ``model_path``: where the weights are on this host (overrides the recipe's path)
- ``model_root``: a directory holding one folder per model (``<model_root>/<last part of the recipe's path>``)
- ``hardware``: hardware profile id
"""

from __future__ import annotations

import runpy
from dataclasses import dataclass, field
from pathlib import Path

from .catalogue import Problem, SpecError


@dataclass
class InventoryHost:
    name: str
    data: dict = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    placeholder: bool = False  # node0..N-1 when rendering without an inventory

    @property
    def address(self) -> str:
        return str(self.data.get("ssh_hostname") or self.name)

    @property
    def is_router(self) -> bool:
        return self.data.get("ironserve_role") == "router"


def _entries(value):
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict) and isinstance(value[0], list):
        value = value[0]  # pyinfra's (hosts, group_data) form
    if not isinstance(value, (list, tuple)):
        return None
    out = []
    for item in value:
        if isinstance(item, str):
            out.append((item, {}))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict):
            out.append(item)
        else:
            return None
    return out


def load_inventory(path: str | Path) -> list[InventoryHost]:
    path = Path(path)
    if not path.exists():
        raise SpecError([Problem(str(path), "", "inventory file not found", "give the path of a pyinfra inventory .py")])
    try:
        namespace = runpy.run_path(str(path))
    except Exception as exc:  # the inventory is user code: report, do not crash
        raise SpecError([Problem(str(path), "", f"inventory raised {type(exc).__name__}: {exc}", "fix the inventory")])
    hosts: dict[str, InventoryHost] = {}
    for group, value in namespace.items():
        if group.startswith("_"):
            continue
        entries = _entries(value)
        if not entries:
            continue
        for name, data in entries:
            host = hosts.setdefault(name, InventoryHost(name))
            host.data.update(data)
            host.groups.append(group)
    if not hosts:
        raise SpecError([Problem(str(path), "", "no hosts found", "define a list like: gpu_nodes = [('node0', {...})]")])
    return list(hosts.values())
