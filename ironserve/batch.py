"""One round trip for many reads: several shell commands composed into one script, their outputs split back.

Knowing that nothing changed should cost about one round trip per host. The deploy's batched facts
(roles/host_state.py) and the audit's batched reads (ironserve/audit/snapshot.py) both send their reads as one
script built here and get back, per read, its exit status and its stdout lines exactly as a command of its own
would have printed them (pyinfra's and testinfra's parsers read them unchanged).

Each read runs in a subshell with stdin from /dev/null and stderr dropped (a failed read is answered by its exit
status; its caller reads it again on its own to report the error); a marker line with a per-call random nonce
closes each read, so no output can forge a boundary. Pure: no pyinfra, no I/O.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """One read's result: its exit status and its stdout lines (no trailing newline)."""

    rc: int
    lines: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def stdout(self) -> str:
        return "".join(line + "\n" for line in self.lines)


def new_nonce() -> str:
    return "ironserve-batch-" + secrets.token_hex(8)


def compose(commands: list[str], nonce: str) -> str:
    """One POSIX sh script running each command in turn; read the output back with :func:`split`.

    ``echo`` before the closing marker ends an unterminated last line; :func:`split` drops the empty line it
    leaves after a terminated one.
    """
    parts = [
        f'( {command}\n) </dev/null 2>/dev/null; __rc=$?; echo; echo "{nonce} {i} $__rc"'
        for i, command in enumerate(commands)
    ]
    return "\n".join(parts) + "\n"


def split(lines: list[str], count: int, nonce: str) -> list[Answer | None]:
    """The answers of a composed script, in order; ``None`` for a read whose marker never came (script cut off)."""
    answers: list[Answer | None] = [None] * count
    current: list[str] = []
    expect = 0  # markers close the reads in order: any other marker line is output
    for line in lines:
        if expect < count and line.startswith(f"{nonce} {expect} "):
            rc = line[len(f"{nonce} {expect} ") :]
            if rc.lstrip("-").isdigit():
                if current and current[-1] == "":
                    current.pop()
                answers[expect] = Answer(int(rc), tuple(current))
                current, expect = [], expect + 1
                continue
        current.append(line)
    return answers
