"""Staged files made live: the fact comparing them, the copy that makes one live, systemd's reload.

The prepare stage writes the next configuration under /etc/ironserve/staged (roles/sglang_service.py); the
launch's wave (roles/launch.py) and the rolling change (roles/rolling.py) make it live with these commands.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class StagedFiles(FactBase):
    """sha256 of each staged file and of its live counterpart: {live path: {"staged": sha|None, "live": sha|None}}."""

    @staticmethod
    def default():
        return {}  # none of the files exists yet (a switch's new units, planned by --dry): no sums

    def command(self, pairs):
        quoted = " ".join(shlex.quote(p) for pair in pairs for p in pair)
        return f"sha256sum {quoted} 2>/dev/null; true"

    def process(self, output):
        sums = {}
        for line in output:
            digest, _, path = line.strip().partition(" ")
            sums[path.lstrip(" *")] = digest
        return sums


def install_command(staged: str, live: str, mode: str) -> str:
    """Make a staged file live: a fresh temporary copy (created under umask 077: a secret is never readable by
    others, not even a leftover of a killed run), its mode, then an atomic rename. Its mtime is the moment it
    became live, which tells unit_started that a running unit started before it is stale."""
    s, dst = shlex.quote(staged), shlex.quote(live)
    tmp = shlex.quote(f"{live}.ironserve-new")
    return (
        f"cmp -s {s} {dst} || {{ rm -f {tmp} && (umask 077 && cp {s} {tmp}) && chmod {mode} {tmp} "
        f"&& chown root:root {tmp} && mv -f {tmp} {dst}; }}"
    )


def reload_command(units: list[str]) -> str:
    """daemon-reload only when systemd itself says a unit file changed under it (decided when it runs)."""
    names = " ".join(shlex.quote(u) for u in units)
    return (
        f"if systemctl show -p NeedDaemonReload -p LoadState --value {names} | grep -qx -e yes -e not-found; "
        f"then systemctl daemon-reload; fi"
    )
