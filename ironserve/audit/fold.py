"""testinfra's questions about single files and packages, asked of a whole batch at once: one ``stat``, one
``sha256sum`` and one ``dpkg-query``.

testinfra asks four questions of each file a check reads (``test -e``, ``sha256sum | cut``, ``stat -Lc %a``,
``stat -Lc %U``), each a command of its own: on a converged GPU host about 80 of the audit's 100 reads, a subshell
and a process or two each, which cost the host more CPU than all its other reads together. Here they are sent as
two commands over every file the batch asks about, and each question gets the answer its own command would have
given: the same exit status and the same output (the tests run both and compare). A package's questions
(``is_installed``'s status, ``version``'s status and version; the driver's hold check asks the first too) are
likewise one ``dpkg-query`` over every package the batch names: each dpkg-query costs a host about 6 ms of CPU,
five of them on a GPU host.

Only paths testinfra sends as they are (``shlex.quote`` leaves them unquoted: no whitespace, no quote, no
backslash) are folded, so a name read back from ``stat`` or ``sha256sum`` is the name that was asked. A host whose ``stat`` cannot
answer (not GNU's or BusyBox's), or whose dpkg-query fails, gets its questions sent one by one. Only names of
Debian's package grammar are folded (no glob: ``-W`` would match other packages). Pure: no I/O.
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
# testinfra's package questions (DebianPackage, as its backend quotes them) -> which fact of the package they ask
PACKAGE_QUESTIONS = {
    "status": re.compile(r"dpkg-query -f '\$\{Status\}' -W ([a-z0-9][a-z0-9+.-]+)"),
    "status-version": re.compile(r"dpkg-query -f '\$\{Status\} \$\{Version\}' -W ([a-z0-9][a-z0-9+.-]+)"),
}
# one line per package (and per architecture of a multi-arch one), its fields apart by tabs (none holds one)
PACKAGES = "dpkg-query -f '${Package}\\t${Status}\\t${Version}\\n' -W "


@dataclass
class Folded:
    """A batch's commands with its file questions folded: ``sent`` is what goes to the host."""

    sent: list[str]
    questions: dict[str, tuple[str, str]] = field(default_factory=dict)  # folded command -> (fact, path)
    stat: str | None = None  # the stat over all the files (one of ``sent``)
    sums: str | None = None  # the sha256sum over the files whose content is asked (one of ``sent``)
    packages: dict[str, tuple[str, str]] = field(default_factory=dict)  # folded command -> (fact, package)
    dpkg: str | None = None  # the dpkg-query over all the packages (one of ``sent``)


def _question(cmd: str) -> tuple[str, str] | None:
    """(fact, path) of a file question whose path shlex leaves as it is (so stat and sha256sum print it back)."""
    for fact, pattern in QUESTIONS.items():
        match = pattern.fullmatch(cmd)
        if match and shlex.quote(match.group(1)) == match.group(1):
            return fact, match.group(1)
    return None


def _package_question(cmd: str) -> tuple[str, str] | None:
    """(fact, package) of a package question naming one package (the grammar leaves no glob and needs no quote)."""
    for fact, pattern in PACKAGE_QUESTIONS.items():
        match = pattern.fullmatch(cmd)
        if match:
            return fact, match.group(1)
    return None


def fold(commands: list[str]) -> Folded:
    """The commands to send for ``commands``: the file questions replaced by one stat and one sha256sum, the
    package questions by one dpkg-query."""
    questions = {cmd: q for cmd in commands if (q := _question(cmd))}
    packages = {cmd: q for cmd in commands if (q := _package_question(cmd))}
    folded = Folded([cmd for cmd in commands if cmd not in questions and cmd not in packages], questions)
    paths = sorted({path for _, path in questions.values()})
    if paths:
        folded.stat = STAT + shlex.join(paths)
    hashed = sorted({path for fact, path in questions.values() if fact == "sha256"})
    if hashed:
        folded.sums = SUM + shlex.join(hashed)
    if packages:
        folded.packages, folded.dpkg = packages, PACKAGES + shlex.join(sorted({p for _, p in packages.values()}))
    folded.sent += [cmd for cmd in (folded.stat, folded.sums, folded.dpkg) if cmd]
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
    -> answer, the reads that came back); None when stat or dpkg-query could not answer (ask them one by one).
    Questions whose reads never came back (the batch was cut off) are left out."""
    files = _unfold_files(folded, answers)
    packages = _unfold_packages(folded, answers)
    if files is None or packages is None:
        return None
    return files | packages


def _unfold_files(folded: Folded, answers: dict[str, Answer]) -> dict[str, Answer] | None:
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


def _package_rows(answer: Answer) -> dict[str, list[tuple[str, str]]] | None:
    """package -> its (status, version) rows, one per architecture installed; None when dpkg-query could not answer
    (a package it does not know exits 1, the others printed)."""
    if answer.rc not in (0, 1):
        return None
    rows: dict[str, list[tuple[str, str]]] = {}
    for line in answer.lines:
        parts = line.split("\t")
        if len(parts) != 3:
            return None
        rows.setdefault(parts[0], []).append((parts[1], parts[2]))
    return rows


def _unfold_packages(folded: Folded, answers: dict[str, Answer]) -> dict[str, Answer] | None:
    """A package question's answer: dpkg-query's for one package prints each matching row's fields with no newline
    between them (so a multi-arch package's rows run together), and exits 1 where no package matched."""
    dpkg = answers.get(folded.dpkg) if folded.dpkg else None
    if dpkg is None:
        return {}
    rows = _package_rows(dpkg)
    if rows is None:
        return None
    out = {}
    for cmd, (fact, package) in folded.packages.items():
        mine = rows.get(package)
        if not mine:
            out[cmd] = Answer(1, ())
            continue
        text = "".join(status if fact == "status" else f"{status} {version}" for status, version in mine)
        out[cmd] = Answer(0, (text,))
    return out
