"""testinfra's questions about single files, asked of a whole batch at once: one ``stat`` and one ``sha256sum``.

testinfra asks four questions of each file a check reads (``test -e``, ``sha256sum | cut``, ``stat -Lc %a``,
``stat -Lc %U``), each a command of its own: on a converged GPU host about 80 of the audit's 100 reads, a subshell
and a process or two each, which cost the host more CPU than all its other reads together. Here they are sent as
two commands over every file the batch asks about, and each question gets the answer its own command would have
given: the same exit status and the same output (the tests run both and compare).

Only paths testinfra sends as they are (``shlex.quote`` leaves them unquoted: no whitespace, no quote, no
backslash) are folded, so a name read back from ``stat`` or ``sha256sum`` is the name that was asked. A host whose ``stat`` cannot
answer (not GNU's or BusyBox's) gets its questions sent one by one. Pure: no I/O.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ironserve.batch import Answer

# testinfra's command (as its backend quotes it) -> which fact of the file it asks
QUESTIONS = {
    "exists": re.compile(r"test -e (/\S*)"),
    "mode": re.compile(r"stat -Lc %a (/\S*)"),
    "owner": re.compile(r"stat -Lc %U (/\S*)"),
    "sha256": re.compile(r"sha256sum (/\S*) \| cut -d ' ' -f 1"),
}
STAT = "stat -Lc '%a %U %n' -- "  # one line per file that exists (following links, as test -e and stat -L do)
SUM = "sha256sum -- "  # "<digest>  <name>" per readable regular file
STAT_FIELD = {"mode": 0, "owner": 1}  # which of a stat line's fields answers the question


@dataclass
class Folded:
    """A batch's commands with its file questions folded: ``sent`` is what goes to the host."""

    sent: list[str]
    questions: dict[str, tuple[str, str]] = field(default_factory=dict)  # folded command -> (fact, path)
    stat: str | None = None  # the stat over all the files (one of ``sent``)
    sums: str | None = None  # the sha256sum over the files whose content is asked (one of ``sent``)


def _question(cmd: str) -> tuple[str, str] | None:
    """(fact, path) of a file question whose path shlex leaves as it is (so stat and sha256sum print it back)."""
    for fact, pattern in QUESTIONS.items():
        match = pattern.fullmatch(cmd)
        if match and shlex.quote(match.group(1)) == match.group(1):
            return fact, match.group(1)
    return None


def fold(commands: list[str]) -> Folded:
    """The commands to send for ``commands``: the file questions replaced by one stat and one sha256sum."""
    questions = {cmd: q for cmd in commands if (q := _question(cmd))}
    paths = sorted({path for _, path in questions.values()})
    if not paths:
        return Folded(list(commands))
    folded = Folded([cmd for cmd in commands if cmd not in questions], questions, STAT + shlex.join(paths))
    hashed = sorted({path for fact, path in questions.values() if fact == "sha256"})
    if hashed:
        folded.sums = SUM + shlex.join(hashed)
    folded.sent += [cmd for cmd in (folded.stat, folded.sums) if cmd]
    return folded


def _stats(answer: Answer) -> dict[str, tuple[str, str]] | None:
    """path -> (mode, owner); None when stat could not answer at all (missing files exit 1 with the others read)."""
    if answer.rc not in (0, 1):
        return None
    stats = {}
    for line in answer.lines:
        parts = line.split(" ", 2)
        if len(parts) != 3:
            return None
        stats[parts[2]] = (parts[0], parts[1])
    return stats


def _sums(answer: Answer) -> dict[str, str]:
    return {line[66:]: line[:64] for line in answer.lines if line[64:66] == "  "}


def unfold(folded: Folded, answers: dict[str, Answer]) -> dict[str, Answer] | None:
    """Each folded question's answer, as its own command would have answered, from the batch's ``answers`` (command
    -> answer, the reads that came back); None when stat could not answer (ask them one by one). Questions whose
    reads never came back (the batch was cut off) are left out."""
    stat = answers.get(folded.stat) if folded.stat else None
    if stat is None:
        return {}
    stats = _stats(stat)
    if stats is None:
        return None
    sums = answers.get(folded.sums) if folded.sums else None
    digests = _sums(sums) if sums is not None else None
    out = {}
    for cmd, (fact, path) in folded.questions.items():
        found = stats.get(path)
        if fact == "exists":
            out[cmd] = Answer(0 if found else 1, ())
        elif fact in STAT_FIELD:
            out[cmd] = Answer(0, (found[STAT_FIELD[fact]],)) if found else Answer(1, ())
        elif digests is not None:  # cut's status, the digest where sha256sum printed one
            out[cmd] = Answer(0, (digests[path],) if path in digests else ())
    return out
