"""Findings: the one result type shared by lint, real-parser validation and spec errors.

Every problem ironserve reports carries a stable rule id, a severity, what is wrong and how to fix it,
so that the CLI can print it for people and as JSON for machines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum


class Severity(str, Enum):
    error = "error"  # crashes, corrupts output or cannot start
    warning = "warning"  # runs, but slower, fragile or unsafe
    info = "info"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    message: str
    fix: str = ""
    where: str = ""  # file, recipe id, process or flag the finding is about

    def as_dict(self) -> dict:
        data = asdict(self)
        data["severity"] = self.severity.value
        return data

    def line(self) -> str:
        where = f"{self.where}: " if self.where else ""
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.severity.value} [{self.rule}] {where}{self.message}{fix}"


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity is Severity.error for f in findings)
