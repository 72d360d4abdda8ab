"""A host of an inventory as the core reads it: its name, merged host data and groups.

Inventories are read by pyinfra's own loader (ironserve/fleet.py: groups, group_data/, --data), outside the core;
render and the roles take these hosts. Rendering without an inventory uses placeholders (node0..N-1).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
