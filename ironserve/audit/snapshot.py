"""One connection and a few batched commands per host: what the audit's checks read, read at once.

The evaluators (ironserve.audit.evaluate) read a host through testinfra (``host.run``, ``host.file``,
``host.service``, ``host.package``), and testinfra's modules run one command per question. Here each host's
checks are first evaluated against a testinfra host whose backend only *records* the commands they ask for;
those are sent as one batched command (ironserve/batch.py) over the host's one connection, and the checks are
evaluated again with the answers, until they ask nothing new (an answer can lead to a further question:
``test -e`` before ``sysctl -n``; two or three rounds). The checks the pytest session then reports run the same
evaluators against the final answers: the same checks, the same parsers, one connection per host.

A question that never got an answer by then is asked on its own over the same connection. Answers stay in this
process's memory (env files hold secrets: nothing read is written anywhere; the evaluators print key names).
"""

from __future__ import annotations

from typing import Any

from testinfra.backend.base import BaseBackend, CommandResult
from testinfra.host import Host

from ironserve import batch
from ironserve.audit import connection, fold

MAX_ROUNDS = 5

# What testinfra asks to learn what kind of host it reads (uname, os-release, which tools are where) and whether a
# package is there, answered while recording as a converged systemd Debian-family host answers, so that the
# questions that depend on them (dpkg-query's version, systemctl, ss) are asked in the same batch: a typical host is
# read in one round trip. The guesses are asked for real in that batch too and the checks are evaluated again on the
# real answers: a host unlike the guess costs one more round, never a wrong result.
GUESSES = {
    "uname -s": batch.Answer(0, ("Linux",)),
    "cat /etc/os-release": batch.Answer(0, ("ID=debian",)),
    "command -v dpkg-query": batch.Answer(0, ("/usr/bin/dpkg-query",)),
    "command -v systemctl": batch.Answer(0, ("/usr/bin/systemctl",)),
    "test -d /run/systemd/system/": batch.Answer(0, ()),
    "command -v ss": batch.Answer(0, ("/usr/bin/ss",)),
}
GUESSED_PREFIXES = {
    "dpkg-query -f '${Status}' -W ": batch.Answer(0, ("install ok installed",)),
    # a file's mode and owner: a mode that parses lets the owner, and an env file's contents, be asked in the same
    # batch (a placeholder's empty mode ended the check there, and they took a round of their own)
    "stat -Lc %a ": batch.Answer(0, ("644",)),
    "stat -Lc %U ": batch.Answer(0, ("root",)),
}


def _guess(cmd: str) -> batch.Answer:
    """A recording round's answer to a command not read yet: a guess, else a placeholder (rc 0, no output)."""
    if cmd in GUESSES:
        return GUESSES[cmd]
    return next((a for prefix, a in GUESSED_PREFIXES.items() if cmd.startswith(prefix)), batch.Answer(0, ()))


class SnapshotBackend(BaseBackend):
    """A testinfra backend answering each command from the batched reads of one real host."""

    NAME = "ironserve-snapshot"

    def __init__(self, real: BaseBackend | None, answers: dict[str, batch.Answer], record: bool):
        super().__init__(real.hostname if real else "planned")  # None: recording only (first_questions)
        self.real, self.answers, self.record = real, answers, record
        self.asked: list[str] = []  # commands without an answer (recording), in order
        self.single = 0  # commands asked on their own (final pass)

    def run(self, command: str, *args: str, **kwargs: Any) -> CommandResult:
        cmd = self.quote(command, *args)
        answer = self.answers.get(cmd)
        if answer is None and self.record:
            if cmd not in self.asked:
                self.asked.append(cmd)
            # a guess or a placeholder: this round's results are thrown away
            answer = _guess(cmd)
        elif answer is None:
            self.single += 1
            return self.real.run(command, *args, **kwargs)
        return self.result(answer.rc, self.encode(cmd), answer.stdout, "")


def _host(real: BaseBackend | None, answers: dict, record: bool) -> tuple[Host, SnapshotBackend]:
    backend = SnapshotBackend(real, answers, record)
    host = Host(backend)  # a new testinfra host per round: it caches what it learnt of the system
    backend.set_host(host)
    return host, backend


def asked(checks: list, evaluate, answers: dict, real: BaseBackend | None = None) -> list[str]:
    """The commands ``checks`` ask that ``answers`` does not answer yet (a recording round: guesses stand in)."""
    host, backend = _host(real, answers, record=True)
    for check in checks:
        evaluate(host, check)
    return backend.asked


def first_questions(checks: list, evaluate) -> list[str]:
    """A host's first batch: what its checks ask before any answer. It needs no host, so the audit's plan (made in
    a forked child beside the handshakes) computes it, and the host's read starts with its batch at once."""
    return asked(checks, evaluate, {})


class HostSnapshot:
    """The answers for one host's checks, read over its one connection."""

    def __init__(self, spec: str):
        self.spec = spec
        self.answers: dict[str, batch.Answer] = {}
        self.batches = 0
        self.error: str | None = None
        self.fold = True  # a batch's file questions asked as one stat and one sha256sum (ironserve/audit/fold.py)
        self._final: tuple[Host, SnapshotBackend] | None = None

    @property
    def real(self) -> BaseBackend:
        return connection.backend(self.spec)

    def read(self, checks: list, evaluate, first: list[str] | None = None) -> HostSnapshot:
        """Evaluate ``checks`` against recorded answers until they ask nothing new (at most MAX_ROUNDS reads);
        ``first``: the first round's questions where they are known (first_questions)."""
        try:
            for _ in range(MAX_ROUNDS):
                questions = first if first is not None else asked(checks, evaluate, self.answers, self.real)
                first = None
                if not questions:
                    break
                self._read(questions)
        except Exception as exc:  # noqa: BLE001 - unreachable, refused, timed out: said once per host
            self.error = f"{type(exc).__name__}: {exc}"[:160]
        return self

    def _read(self, commands: list[str]) -> None:
        folded = fold.fold(commands) if self.fold else fold.Folded(commands)
        nonce = batch.new_nonce()
        out = self.real.run(batch.compose(folded.sent, nonce))
        answers = batch.split(out.stdout.splitlines(), len(folded.sent), nonce)
        if all(a is None for a in answers):
            raise ConnectionError(f"the batched read answered nothing (rc={out.rc})")
        self.batches += 1
        read = {cmd: answer for cmd, answer in zip(folded.sent, answers) if answer is not None}
        self.answers.update(read)
        unfolded = fold.unfold(folded, read)
        if unfolded is None:  # a stat unlike GNU's: the next round asks each file's questions as they are
            self.fold = False
        self.answers.update(unfolded or {})

    def host(self) -> Host:
        """The testinfra host the reported checks run against (a question still unanswered is asked alone)."""
        if self._final is None:
            self._final = _host(self.real, self.answers, record=False)
        return self._final[0]

    @property
    def commands(self) -> int:
        """ssh commands this host was sent (batched reads and questions asked alone)."""
        return self.batches + (self._final[1].single if self._final else 0)
