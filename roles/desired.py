"""What a role puts on a host, as data for the audit: files with their content hash, packages at their version,
runtime state checked by a command.

Each role builds these from the same functions its operations use (roles/deployment.py registers them with the
role), so `ironserve audit` (ironserve/audit/checks.py) compares exactly what the deploy writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ironserve.units import sha256_text


@dataclass(frozen=True)
class DesiredFile:
    """A file the role writes: its path, the sha256 of its content, its mode (owned by root)."""

    path: str
    sha256: str
    mode: int
    gate: str = "host"  # the audit's gate (ironserve.audit.checks.GATES)


@dataclass(frozen=True)
class DesiredPackage:
    """A package the role installs, at its pinned version."""

    name: str
    version: str
    gate: str = "driver"


@dataclass(frozen=True)
class RuntimeCheck:
    """State of the host the role sets up, read by a command: its output must be ``expected`` (``kind`` command: the
    text, stripped; json_command: the JSON it prints; listed: ``item`` among its words, so that several checks can
    share one command, run once). Checked in the audit's runtime gate."""

    id: str
    expected: Any
    cmd: str
    kind: Literal["command", "json_command", "listed"] = "command"
    item: str = ""  # listed: the word the command's output must name ("present"), else "missing"


def text_file(path: str, text: str, mode: int = 0o644, gate: str = "host") -> DesiredFile:
    """The file a role writes from ``text`` (the text its operation uploads)."""
    return DesiredFile(path, sha256_text(text), mode, gate)


def listed_check(check_id: str, read: str, item: str) -> RuntimeCheck:
    """``item`` is among the words ``read`` prints ("present", else "missing"): a read several checks share."""
    return RuntimeCheck(check_id, "present", read, kind="listed", item=item)


def present_check(check_id: str, test: str) -> RuntimeCheck:
    """A shell test that holds on a converged host (an image present, a device node, a lock file)."""
    return RuntimeCheck(check_id, "present", f"{test} && echo present || echo missing")
