"""Read a pyinfra inventory file offline, the way pyinfra does, for render/lint/audit/status.

A pyinfra inventory is a Python module whose top-level lists hold hosts: ``"name"`` or ``("name", {data})``.
The list's variable name is the host group. Every host's data is validated against the typed host-data model
(ironserve/hostdata.py: the keys, their types, defaults and the roles that read them) before anything renders.
An inventory that raises, exits or interrupts is reported as such, never as an empty or partial result.
"""

from __future__ import annotations

import runpy
from dataclasses import dataclass, field
from pathlib import Path

from .problems import Problem, SpecError


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
    def nic(self) -> str | None:
        value = self.data.get("nic")
        return None if value is None else str(value)

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
    except SystemExit as exc:  # sys.exit(0) in an inventory is not "no hosts, all fine"
        raise SpecError([Problem(str(path), "", f"the inventory exited (sys.exit({exc.code!r})) while being read",
                                 "an inventory defines host lists; make it run to the end")])
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the inventory is user code: report, do not crash
        raise SpecError([Problem(str(path), "", f"inventory raised {type(exc).__name__}: {str(exc)[:200]}",
                                 "fix the inventory")])
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
    from .hostdata import validate_inventory_data

    validate_inventory_data([(h.name, h.data) for h in hosts.values()], str(path))
    return list(hosts.values())
