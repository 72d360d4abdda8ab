"""A host of an inventory as the core reads it: its name, merged host data and groups.

Inventories are read by pyinfra's own loader (ironserve/fleet.py: groups, group_data/, --data), outside the core;
render and the roles take these hosts. Rendering without an inventory uses placeholders (node0..N-1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .hostdata import HostData, validate_host_data


@dataclass
class InventoryHost:
    name: str
    # as the inventory gives it: ironserve's keys and pyinfra's own (connector arguments such as _sudo, ssh_*)
    data: dict = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    placeholder: bool = False  # node0..N-1 when rendering without an inventory
    # ironserve's keys, typed (ironserve/hostdata.py): what render and the roles read; validated from ``data``
    # unless the caller validated the whole inventory already
    host_data: HostData | None = None

    def __post_init__(self) -> None:
        if self.host_data is None:
            self.host_data = validate_host_data(self.data, "inventory", self.name)

    @property
    def address(self) -> str:
        return self.host_data.ssh_hostname or self.name

    @property
    def nic(self) -> str | None:
        return self.host_data.nic

    @property
    def is_router(self) -> bool:
        return self.host_data.ironserve_role == "router"
