"""Problems with input (recipes, hardware profiles, inventories, host data): file, field, message and fix.

Its own module so that every part of the core can report one without importing the catalogue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass
class Problem:
    file: str
    field: str
    message: str
    fix: str

    def line(self) -> str:
        field = f" {self.field}:" if self.field else ""
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.file}:{field} {self.message}.{fix}"


class SpecError(Exception):
    """Bad recipe, hardware profile or inventory data. Carries every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(p.line() for p in problems))

    def __reduce__(self):
        """Pickled by its problems (the audit's plan comes back from a forked child: ironserve/audit/forked.py)."""
        return type(self), (self.problems,)

    @classmethod
    def one(cls, file: str, field: str, message: str, fix: str) -> SpecError:
        """The error of a single problem (most input has one thing wrong at a time)."""
        return cls([Problem(file, field, message, fix)])


_WRITE = re.compile(r"[;:] (write .*)$")


def message_and_fix(message: str) -> tuple[str, str | None]:
    """A validator's message split into what is wrong and what to write: the validators of ironserve.spec end a
    message with '; write ...' (or ': write ...'), which becomes the fix; None when the message has none."""
    found = _WRITE.search(message)
    return (message[: found.start()], found.group(1)) if found else (message, None)
