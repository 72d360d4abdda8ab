"""Inventories read by pyinfra's own loader, for render/lint --inventory, audit and status.

pyinfra_cli's make_inventory is what `pyinfra INVENTORY DEPLOY` runs: the inventory's groups, group_data/ (of the
working directory and of the inventory's directory), the groups' own data, and --data overrides, merged in
pyinfra's order; --limit picks hosts by group or name glob as pyinfra's --limit does. Every host's merged data is
validated against the typed host-data model (ironserve/hostdata.py) before anything renders, so these commands
see exactly the hosts, in the same order (rank order), and the data the deploy sees. An inventory that raises,
exits or interrupts is reported as such, never as an empty or partial result.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from .hostdata import validate_inventory_data
from .inventory import InventoryHost
from .problems import Problem, SpecError


def pyinfra_inventory(path: str | Path, data: dict | None = None):
    """The pyinfra Inventory of ``path`` with ``data`` as --data overrides (pyinfra's own objects)."""
    with _entry_points_read_once():  # pyinfra_cli's import patches the standard library for gevent
        from pyinfra.api import State
        from pyinfra.context import ctx_state
        from pyinfra_cli.inventory import make_inventory

    path = Path(path)
    if not path.is_file():
        raise SpecError(
            [Problem(str(path), "", "inventory file not found", "give the path of a pyinfra inventory .py")]
        )
    try:
        with ctx_state.use(State()):  # pyinfra executes inventory files within a state, as its CLI does
            # absolute: pyinfra keeps the code of files it ran by the path it was given
            return make_inventory(str(path.resolve()), override_data=dict(data or {}), cwd=os.getcwd())
    except SystemExit as exc:  # sys.exit(0) in an inventory is not "no hosts, all fine"
        raise SpecError(
            [
                Problem(
                    str(path),
                    "",
                    f"the inventory exited (sys.exit({exc.code!r})) while being read",
                    "an inventory defines host lists; make it run to the end",
                )
            ]
        ) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the inventory and its group data are user code: report, do not crash
        cause = getattr(exc, "exception", None) or exc.__cause__ or exc  # pyinfra wraps errors of exec'd files
        raise SpecError(
            [
                Problem(
                    str(path),
                    "",
                    f"inventory raised {type(cause).__name__}: {str(cause)[:200]}",
                    "fix the inventory (or its group_data/)",
                )
            ]
        ) from None


@contextlib.contextmanager
def _entry_points_read_once():
    """importlib.metadata's entry points read once while pyinfra_cli is imported: gevent's monkey patching, which
    that import runs, looks up its plugins 31 times, each a read of every installed distribution's metadata (0.2 s
    of the audit's and status's start). Each lookup gets what a read of its own would give."""
    from importlib import metadata

    original = metadata.entry_points
    everything = original()
    metadata.entry_points = lambda **params: everything.select(**params) if params else everything
    try:
        yield
    finally:
        metadata.entry_points = original


@dataclass
class Fleet:
    """An inventory as ironserve reads it (hosts with merged, validated data) and as pyinfra built it."""

    hosts: list[InventoryHost]
    pyinfra: Any  # pyinfra.api.Inventory: what audit and status connect through


def load_inventory(path: str | Path, data: dict | None = None) -> list[InventoryHost]:
    """Every host of the inventory in pyinfra's order, with its merged data (validated) and groups."""
    return read_fleet(path, data).hosts


def read_fleet(path: str | Path, data: dict | None = None) -> Fleet:
    inventory = pyinfra_inventory(path, data)
    merged = [(host.name, host.data.dict()) for host in inventory]
    if not merged:
        raise SpecError(
            [Problem(str(path), "", "no hosts found", "define a list like: gpu_nodes = [('node0', {...})]")]
        )
    typed = validate_inventory_data(merged, str(path))
    hosts = [
        InventoryHost(name, data, [g for g in host.groups if g != "all"], host_data=typed[name])
        for (name, data), host in zip(merged, inventory)
    ]
    return Fleet(hosts, inventory)


def limit_hosts(hosts: list[InventoryHost], patterns: list[str] | None, where: str) -> list[InventoryHost]:
    """pyinfra's --limit: each pattern a group name, else a glob on host names; the inventory's order kept."""
    if not patterns:
        return hosts
    unmatched = [p for p in patterns if not any(p in h.groups or fnmatch(h.name, p) for h in hosts)]
    if unmatched:
        groups = sorted({g for h in hosts for g in h.groups})
        raise SpecError(
            [
                Problem(
                    where,
                    "--limit",
                    f"no host or group matches {', '.join(unmatched)}",
                    f"name a host, a glob of names, or a group ({', '.join(groups)})",
                )
            ]
        )
    return [h for h in hosts if any(p in h.groups or fnmatch(h.name, p) for p in patterns)]
