"""Units of ironserve's naming that the deployment does not declare: stopped, disabled, their files removed.

A host runs what its current deployment declares. A unit file under /etc/systemd/system named ``sglang-*.service``
whose first line is ironserve's (``# managed by ironserve``, files/templates) and that the render does not place
on this host (a recipe switched to another id, a group moved away, an undeploy) is removed by the launch before
the new configuration becomes live, so the new group takes the old one's place (its port, its devices): stopped,
disabled, its unit, env, staged copies, parse marker and last good configuration removed, systemd reloaded.
Removing a running engine of the old deployment is an outage of what it served: the plan says so in the
operation's name. deploys/undeploy.py declares nothing, so it removes every such unit (idempotent: a host with
none is a no-op). The audit names the same units as drift (ironserve/audit).
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

from ironserve.units import ETC_DIR, UNIT_DIR, rank_guard_unit, staged_path
from roles.common import keyed_lines
from roles.rollback import snapshot_dir
from roles.sglang_service import marker_path

MARKER = "# managed by ironserve"


class IronserveUnits(FactBase):
    """{unit name: recipe id} of the unit files ironserve wrote under /etc/systemd/system (its first line)."""

    def command(self):
        return (
            f'for f in {UNIT_DIR}/sglang-*.service; do [ -f "$f" ] && head -n1 "$f" | '
            f'grep -q {shlex.quote("^" + MARKER)} && echo "$(basename "$f" .service) '
            f'$(head -n1 "$f" | sed -n \'s/.* recipe //p\')"; done; true'
        )

    def process(self, output):
        return keyed_lines(output)


def unit_file_paths(unit: str) -> list[str]:
    """Every file ironserve keeps for a unit (live and staged), and its parse marker."""
    live = [f"{UNIT_DIR}/{unit}.service", f"{ETC_DIR}/{unit}.env", f"{ETC_DIR}/{unit}.rank-group.json"]
    return live + [staged_path(p) for p in live] + [marker_path(unit)]


def remove_command(unit: str) -> str:
    """Stop and disable the unit, then remove its files and its last good configuration."""
    service = shlex.quote(f"{unit}.service")
    files = shlex.join(unit_file_paths(unit))
    return (
        f"systemctl disable --now {service} 2>/dev/null; systemctl reset-failed {service} 2>/dev/null; "
        f"rm -f {files} && rm -rf {shlex.quote(snapshot_dir(unit))}"
    )


RETIRED_DIR = "/var/lib/ironserve/retired"


def retire_command(unit: str) -> str:
    """Stop and disable a unit a rolling switch replaces, and move its files aside (RETIRED_DIR/<unit>, a PATHS
    list of where each came from): restore_command brings it back if its successor fails its gate."""
    service = shlex.quote(f"{unit}.service")
    d = shlex.quote(f"{RETIRED_DIR}/{unit}")
    files = shlex.join(unit_file_paths(unit))
    return (
        f"systemctl disable --now {service} 2>/dev/null; systemctl reset-failed {service} 2>/dev/null; "
        f'rm -rf {d} && mkdir -p {d} && i=0 && for f in {files}; do i=$((i+1)); if [ -e "$f" ]; then '
        f'printf \'%s %s\\n\' "$i" "$f" >> {d}/PATHS && mv "$f" {d}/$i || exit 1; fi; done; '
        f"systemctl daemon-reload"
    )


def restore_command(unit: str) -> str:
    """Put a retired unit's files back, then enable and start it."""
    service = shlex.quote(f"{unit}.service")
    d = shlex.quote(f"{RETIRED_DIR}/{unit}")
    return (
        f'while read -r i f; do mv {d}/$i "$f" || exit 1; done < {d}/PATHS && rm -rf {d} && '
        f"systemctl daemon-reload && systemctl enable {service} && systemctl start {service}"
    )


def purge_command(unit: str) -> str:
    """The successor passed its gate: the retired unit's files and last good configuration go for good."""
    return f"rm -rf {shlex.quote(f'{RETIRED_DIR}/{unit}')} {shlex.quote(snapshot_dir(unit))}"


def replaced_units(processes) -> list[str]:
    """The undeclared engine units on this host (not routers, not rank guards): what a rolling switch replaces."""
    declared = set(declared_units(processes))
    return sorted(
        u
        for u in (host.get_fact(IronserveUnits) or {})
        if u not in declared and not u.endswith(("-router", "-rank-guard"))
    )


def routers_kept(processes) -> list[str]:
    """Undeclared routers: removed at the router stage, right before the new router starts (the rolling switch
    moves the engine groups through the old router first)."""
    declared = set(declared_units(processes))
    return sorted(u for u in (host.get_fact(IronserveUnits) or {}) if u not in declared and u.endswith("-router"))


@operation()
def undeclared_removed(declared: list[str]):
    """No unit of ironserve's naming other than ``declared`` exists on the host (see the module doc)."""
    found = host.get_fact(IronserveUnits) or {}
    stray = sorted(u for u in found if u not in set(declared))
    if not stray:
        host.noop("no unit of ironserve's naming other than the deployment's")
        return
    for unit in stray:
        yield remove_command(unit)
    yield "systemctl daemon-reload"


def declared_units(processes) -> list[str]:
    """The units the render places on a host: each process's, and a multi-node rank's guard."""
    return sorted({p.unit for p in processes} | {rank_guard_unit(p) for p in processes if p.in_rank_group})


def removal_name(processes, recipe_id: str, keep: list[str] | None = None) -> str:
    """The operation's name names what goes (what `--dry` shows): the units this host has that are not declared."""
    stray = sorted(set(host.get_fact(IronserveUnits) or {}) - set(declared_units(processes)) - set(keep or ()))
    if not stray:
        return "Units of ironserve's naming this deployment does not declare: none"
    return (
        f"Remove {', '.join(stray)}: not declared by {recipe_id} (stopped, disabled, files removed; an outage "
        f"of what they served)"
    )
