"""Batched facts: what the prepare stage reads of a host, in one command per host, cached for the run.

A no-op run used to cost ~90 ssh commands per host, all fact reads and most of them repeats: pyinfra 3 reads
every fact twice (once to plan, once to execute) and caches nothing (``files.File`` 17 times, a full ``dpkg -l``
7 times). Here the operations stay as they are (facts in, commands or ``host.noop(why)`` out); what changes is
where their facts come from:

- ``HostState``: one fact that runs many facts' own commands in one shell command (ironserve/batch.py) and
  answers each with its exit status and stdout lines; each fact's own ``process()`` then reads its lines, so a
  batched value is exactly the value the fact would have read on its own.
- ``HostFacts``: this host's facts for the run. The first fact an operation of the prepare stage asks for
  (roles/deployment.py: the operations added between ``install`` and ``end_planning``; while planning, or while
  executing under ``pyinfra -y``) reads in one ``HostState`` command everything the stage asked for in the last
  runs, and this question; the answers are kept for the run and handed to the same operations each time they
  ask (pyinfra 3 asks again when an operation executes). Any command run on any host of the run (an operation's,
  an upload) drops every host's answers (a step may write shared storage): from then on facts are read alone, as
  pyinfra reads them, each kept until the next command. An operation never sees a value from before a change; a
  run that changes nothing reads each host once.
- What the stage asks (fact classes and their arguments: paths, unit names, sysctl keys; never values) is kept
  per host on the controller (host data ``host_state_cache``), so the next run reads it all at once; a file asked
  about brings its hash and directory checks (asked once it exists). A question kept but not asked costs one
  read in the batch and is not kept again (the read stays one recipe's size when recipes change on a host); a new
  question costs its own round trip, once.

Not batched, read as before: facts of the launch stage (health, unit states that change while it waits), probes
that act (``batched = False``: the parser check), facts run with other connector arguments (``_sudo_user``,
``_env``...), facts with preconditions of their own, and a fact whose batched read failed (read again alone, so
its error is reported as pyinfra reports it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
from collections import Counter
from importlib import import_module
from pathlib import Path

from pyinfra import host as current_host
from pyinfra import logger
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.facts import _MISSING_COMMAND_MARKER, ShortFactBase, _handle_fact_kwargs
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory, File, FindInFile, Link, Md5File, Sha1File, Sha256File
from pyinfra.facts.server import (
    Arch,
    Date,
    Groups,
    Hostname,
    KernelVersion,
    LinuxDistribution,
    LinuxName,
    Os,
    Users,
    Which,
)
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from ironserve import batch

_MARKER = re.compile(r"^(ironserve-batch-[0-9a-f]{16}) ([0-9]+) (-?[0-9]+)$")

# A file the stage asks about is asked about whole: a path that did not exist when it was learned (fresh host)
# is hashed by files.put once it exists, and a directory check comes with it.
_COMPANIONS = {File.name: (Sha1File, Directory)}


class HostState(FactBase):
    """Many reads in one command, in order: ``[{"rc": exit status, "lines": [stdout lines]} | None, ...]``.

    ``reads`` are shell commands (the batched facts' own); ``nonce`` marks where each answer ends.
    """

    def command(self, reads: list[str], nonce: str) -> str:
        return batch.compose(reads, nonce)

    def process(self, output):
        last = _MARKER.match(output[-1]) if output else None
        if not last:
            return []
        answers = batch.split(list(output), int(last.group(2)) + 1, last.group(1))
        return [None if a is None else {"rc": a.rc, "lines": list(a.lines)} for a in answers]

    @staticmethod
    def default():
        return []


# --------------------------------------------------------------------------- one fact request


def _fact_class(module: str, name: str) -> type[FactBase]:
    return getattr(import_module(module), name)


class Request:
    """A fact class with its (canonical) arguments: what an operation asked, without the answer."""

    def __init__(self, cls: type[FactBase], kwargs: dict):
        self.cls, self.kwargs = cls, {k: v for k, v in kwargs.items() if k != "self"}  # getcallargs names self
        # arguments that are not plain data (json.dumps raises) are never batched: their text could collide
        self.key = f"{cls.__module__}.{cls.__qualname__}({json.dumps(self.kwargs, sort_keys=True)})"

    def shell(self) -> str | None:
        """The fact's own command, as pyinfra would run it (with its binary guard); None: not batchable."""
        # one instance for command() and process(), as pyinfra's get_fact: some facts keep their arguments
        self._fact = fact = self.cls()
        command = fact.command(**self.kwargs) if callable(fact.command) else fact.command
        needs = fact.requires_command(**self.kwargs) if callable(fact.requires_command) else None
        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        if needs:
            needs = needs.get_raw_value() if isinstance(needs, StringCommand) else str(needs)
            text = (
                f"if command -v {shlex.quote(needs)} >/dev/null 2>&1; then ( {text} ); "
                f"else echo '{_MISSING_COMMAND_MARKER}'; fi"
            )
        return text

    def value(self, answer: dict | None):
        """The fact's value from its batched answer, as pyinfra's get_fact makes it; raises LookupError when only
        a read of its own can answer (failed, missing binary, cut off)."""
        if answer is None or answer["rc"] != 0 or answer["lines"] == [_MISSING_COMMAND_MARKER]:
            raise LookupError(self.key)
        fact = getattr(self, "_fact", None)
        if fact is None:
            self.shell()
            fact = self._fact
        return fact.process(answer["lines"]) if answer["lines"] else fact.default()

    def as_json(self) -> list:
        return [self.cls.__module__, self.cls.__qualname__, self.kwargs]

    @classmethod
    def from_json(cls, item) -> Request | None:
        """A kept question, read back from the controller's cache; None: a fact class renamed since (forgotten).
        Raises ValueError, saying why, for anything but one of the allowed fact classes (kept_fact) with plain
        JSON arguments: the cache is a file, and what it names runs on the hosts."""
        if not (isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item[:2])):
            raise ValueError("not [module, class, arguments]")
        module, name, kwargs = item
        fact_cls = _PYINFRA_READS.get((module, name))
        if fact_cls is None:
            if not _ROLE_MODULE.fullmatch(module):
                raise ValueError(f"{module}.{name} is not one of ironserve's fact classes")
            try:
                fact_cls = _fact_class(module, name)
            except (ImportError, AttributeError):
                return None
        if getattr(fact_cls, "__module__", None) != module or not kept_fact(fact_cls):
            raise ValueError(f"{module}.{name} is not one of ironserve's batchable fact classes")
        if not (isinstance(kwargs, dict) and json_plain(kwargs)):
            raise ValueError(f"the arguments of {module}.{name} are not plain JSON")
        return cls(fact_cls, kwargs)


def batchable(cls) -> bool:
    """A fact that reads state with a command of its own; a probe that acts (``batched = False``: the parser
    check) is asked alone, only when its operation needs it, and never kept."""
    return (
        isinstance(cls, type)
        and issubclass(cls, FactBase)
        and not issubclass(cls, ShortFactBase)
        and cls is not HostState
        and not cls.shell_executable
        and getattr(cls, "batched", True)
        and cls.check_preconditions is FactBase.check_preconditions
    )


# pyinfra's own facts that the prepare stage's pyinfra operations read (files.put, systemd.service, apt.packages,
# ...): read-only, their arguments quoted by pyinfra. With the batchable facts of ironserve's roles, the only
# classes a kept question may name (a planted cache entry naming any other, pyinfra.facts.server.Command say, is
# ignored with a warning, never run).
_PYINFRA_READS = {
    (c.__module__, c.__qualname__): c
    for c in (
        File,
        Sha1File,
        Sha256File,
        Md5File,
        Directory,
        Link,
        FindInFile,
        DebPackages,
        LinuxDistribution,
        LinuxName,
        Os,
        Arch,
        KernelVersion,
        Hostname,
        Date,
        Which,
        Users,
        Groups,
        SystemdStatus,
        SystemdEnabled,
    )
}
_ROLE_MODULE = re.compile(r"roles\.[a-z_]+")


def kept_fact(cls) -> bool:
    """Whether questions to this fact class may be batched and kept on the controller across runs."""
    if not batchable(cls):
        return False
    return (cls.__module__, cls.__qualname__) in _PYINFRA_READS or bool(_ROLE_MODULE.fullmatch(cls.__module__))


def json_plain(value, depth: int = 0) -> bool:
    """Plain JSON data (text, numbers, booleans, null, lists, objects with text keys), not too deep."""
    if depth > 8:
        return False
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, list):
        return all(json_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_plain(v, depth + 1) for k, v in value.items())
    return False


# --------------------------------------------------------------------------- this host's facts for the run


def _generation(state) -> int:
    """How many commands changed a host of this run so far (any host: a prepare step may write shared storage)."""
    return getattr(state, "ironserve_changes", 0)


def _bump_generation(state) -> None:
    state.ironserve_changes = _generation(state) + 1


def changes_made(state) -> bool:
    """Whether any command other than a read ran on a host of this run."""
    return _generation(state) > 0


def _executor(global_kwargs: dict) -> dict:
    return {k: global_kwargs.get(k) for k in CONNECTOR_ARGUMENT_KEYS if k in global_kwargs}


class QuestionNotes:
    """Every question a run asks of one host, for the converged record (roles/converged.py): the replayable ones
    by key, the names of the others."""

    def __init__(self, real_host):
        self.host = real_host
        self.noted: dict[str, Request] = {}
        self.unreplayable: set[str] = set()
        self._default_executor: dict | None = None

    def _note(self, cls, args, kwargs) -> None:
        state = self.host.state
        if self._default_executor is None:
            self._default_executor = _executor(_handle_fact_kwargs(state, self.host, Arch, [], {})[1])
        try:
            fact_kwargs, global_kwargs = _handle_fact_kwargs(state, self.host, cls, list(args), dict(kwargs))
            req = Request(cls, fact_kwargs) if batchable(cls) else None
            req = req if req is not None and json_plain(req.kwargs) else None
        except (TypeError, ValueError):
            req = None
        if req is None or _executor(global_kwargs) != self._default_executor:
            self.unreplayable.add(getattr(cls, "__qualname__", str(cls)))
        else:
            self.noted.setdefault(req.key, req)

    def take_over(self, other: QuestionNotes) -> None:
        self.noted.update(other.noted)
        self.unreplayable |= other.unreplayable


class EarlyReads(QuestionNotes):
    """A host's facts asked by another host's plan before this host's own HostFacts is installed (pyinfra plans
    the hosts side by side: the rolling plan of an engine host reads the router host's workers, the fabric check a
    peer's). Noted, then handed to this host's HostFacts when it is installed; without them a converged record
    would not replay a read the run's plan depended on."""

    def __init__(self, real_host):
        super().__init__(real_host)
        self.real_get_fact = real_host.get_fact

    def get_fact(self, cls, *args, **kwargs):
        self._note(cls, args, kwargs)
        return self.real_get_fact(cls, *args, **kwargs)


class HostFacts(QuestionNotes):
    """This host's batched facts for the run (see the module doc). Installed on pyinfra's host object."""

    def __init__(self, real_host, cache_file: Path | None):
        super().__init__(real_host)
        self.cache_file = cache_file
        self.asked: dict[str, Request] = {}  # every question the stage asks (learned and from the last runs)
        self.kept: set[str] = set()  # the questions kept for the next run
        # the questions this run asked: only they are kept for the next one. Questions of another recipe of the
        # same model on this host (or of an older release) fall out after one run instead of piling up run after
        # run into one read too long for a shell's argument list
        self.this_run: set[str] = set()
        self.values: dict[str, object] = {}  # answers read since the last command that changed a host
        self.values_at = 0  # the change generation of those answers
        self.batched = False  # the one batched read of the run happened
        self.reading = False
        self.planning = True  # the prepare stage's operations are being added: every question is the stage's
        self.stage_ops: set[str] = set()  # the operations of the prepare stage (their questions are batched)
        self._ops_before = set(self._ops())
        self.executor: dict | None = None
        self.counts: Counter = Counter()  # batches, single reads, cached answers (debug log, tests)
        self.noting = False  # every question of this run, batched or not, noted for the converged record
        early = real_host.__dict__.pop("ironserve_early_reads", None)  # asked before this: noted, then passed on
        self._real_get_fact = early.real_get_fact if early is not None else real_host.get_fact
        if early is not None:
            self.take_over(early)
        self._real_run = getattr(real_host, "run_shell_command", None)  # a fixture's host runs nothing
        self._real_put = getattr(real_host, "put_file", None)
        for req in self._load_cache():
            self.asked.setdefault(req.key, req)
            self.kept.add(req.key)

    # ------------------------------------------------------------ what pyinfra calls

    def get_fact(self, cls, *args, **kwargs):
        if self.noting:
            self._note(cls, args, kwargs)
        if not kept_fact(cls) or not (self.planning or self.host.current_op_hash in self.stage_ops):
            return self._single(cls, args, kwargs)
        fact_kwargs, global_kwargs = _handle_fact_kwargs(self.host.state, self.host, cls, list(args), dict(kwargs))
        executor = _executor(global_kwargs)
        if self.executor is None:
            self.executor = executor
        if executor != self.executor:
            return self._single(cls, args, kwargs)
        try:
            req = Request(cls, fact_kwargs)
        except (TypeError, ValueError):
            return self._single(cls, args, kwargs)
        if req.key not in self.kept:
            self._learn(req)
        elif req.key not in self.this_run:
            self.this_run.add(req.key)
            if not self.planning:
                self._save_cache()
        generation = _generation(self.host.state)
        if not self.batched:
            # the first question: everything the stage asked in the last runs, and this one, in one read
            self._read_batch([k for k in self.asked if k in self.kept])
        elif self.values_at != generation:
            # a command ran since: what was read is gone; what is read from now on is read alone (as pyinfra
            # would) and kept until the next command
            self.values.clear()
            self.values_at = generation
        if req.key in self.values:
            self.counts["cached"] += 1
            return copy.deepcopy(self.values[req.key])
        value = self._single(cls, args, kwargs)
        self.values[req.key] = value
        return copy.deepcopy(value)

    def run_shell_command(self, *args, **kwargs):
        if not self.reading:
            _bump_generation(self.host.state)
        return self._real_run(*args, **kwargs)

    def put_file(self, *args, **kwargs):
        _bump_generation(self.host.state)
        return self._real_put(*args, **kwargs)

    def run_read_only(self, *args, **kwargs):
        """A command that changes nothing an operation reads (the converged record's): answers stay."""
        self.reading = True
        try:
            return self._real_run(*args, **kwargs)
        finally:
            self.reading = False

    # ------------------------------------------------------------ what this run asked (the converged record)

    def run_requests(self) -> dict[str, Request]:
        """Every replayable question this run asked, by key (with the companions of the files it asked about)."""
        out = dict(self.noted)
        out.update({k: self.asked[k] for k in self.this_run if k in self.asked})
        return out

    # ------------------------------------------------------------ the stage

    def _ops(self) -> set[str]:
        ops = getattr(getattr(self.host, "state", None), "ops", None)
        return set(ops.get(self.host, {})) if isinstance(ops, dict) else set()

    def end_planning(self) -> None:
        """The prepare stage's operations are added: from here on only their questions are batched."""
        if self.planning:
            self.planning = False
            self.stage_ops = self._ops() - self._ops_before
            self._save_cache()

    # ------------------------------------------------------------ reads

    def _single(self, cls, args, kwargs):
        self.counts["single"] += 1
        self.reading = True
        try:
            return self._real_get_fact(cls, *args, **kwargs)
        finally:
            self.reading = False

    def _read_batch(self, keys: list[str]) -> None:
        self.batched, self.values_at = True, _generation(self.host.state)
        requests, reads = [], []
        for key in keys:
            req = self.asked.get(key)
            try:
                shell = req.shell() if req is not None else None
            except Exception:  # noqa: BLE001 - a question its fact cannot build any more is read on its own
                shell = None
            if shell:
                requests.append(req)
                reads.append(shell)
        if not requests:
            return
        self.counts["batch"] += 1
        self.reading = True
        try:
            answers = self._real_get_fact(HostState, reads=reads, nonce=batch.new_nonce())
        finally:
            self.reading = False
        for req, answer in zip(requests, answers or []):
            try:
                self.values[req.key] = req.value(answer)
            except Exception:  # noqa: BLE001 - LookupError, or a process() that rejects the lines: read alone
                continue
        logger.debug(f"{self.host.print_prefix}host state: {len(self.values)}/{len(requests)} facts in one read")

    # ------------------------------------------------------------ what the stage asks, across runs

    def _learn(self, req: Request) -> None:
        self.asked.setdefault(req.key, req)
        self.kept.add(req.key)
        self.this_run.add(req.key)
        for companion in _COMPANIONS.get(req.cls.name, ()):
            other = Request(companion, req.kwargs)
            self.asked.setdefault(other.key, other)
            self.kept.add(other.key)
            self.this_run.add(other.key)
        if not self.planning:
            self._save_cache()

    def _load_cache(self) -> list[Request]:
        if self.cache_file is None:
            return []
        try:
            items = json.loads(self.cache_file.read_text())["facts"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        out = []
        for item in items if isinstance(items, list) else []:
            try:
                req = Request.from_json(item)
            except ValueError as why:
                logger.warning(
                    f"{self.host.print_prefix}host state cache {self.cache_file}: entry "
                    f"{json.dumps(item)[:120]} ignored ({why})"
                )
                continue
            if req is not None:
                out.append(req)
        return out

    def _save_cache(self) -> None:
        if self.cache_file is None:
            return
        items = [r.as_json() for k, r in self.asked.items() if k in self.kept and k in self.this_run]
        try:
            self.cache_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"host": self.host.name, "facts": items}, indent=1) + "\n")
            tmp.replace(self.cache_file)
        except OSError as exc:
            logger.debug(f"{self.host.print_prefix}host state: cannot keep the questions ({exc})")


def cache_file(cache_dir: str | None, model: str, host_name: str, address: str) -> Path | None:
    """Where this host's questions are kept on the controller; None: batch within the run only."""
    if not cache_dir:
        return None
    digest = hashlib.sha256(f"{model}\0{host_name}\0{address}".encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host_name)[:40]
    return Path(os.path.expanduser(cache_dir)) / f"{safe}-{digest}.json"


def install(ctx) -> HostFacts | None:
    """Batch this host's facts for the run (idempotent); host data ``batch_facts: false`` turns it off."""
    real = current_host._get_module()
    if real is None or not ctx.host.batch_facts:
        return None
    existing = real.__dict__.get("ironserve_host_facts")
    if existing is not None:
        return existing
    facts = HostFacts(
        real, cache_file(ctx.host.host_state_cache, ctx.model, real.name, str(ctx.host.ssh_hostname or real.name))
    )
    facts.noting = ctx.host.converged_fast_path  # what the run asks is what roles/converged.py records
    real.ironserve_host_facts = facts
    real.get_fact = facts.get_fact
    real.run_shell_command = facts.run_shell_command
    real.put_file = facts.put_file
    return facts


def note_early_reads(hosts) -> None:
    """Note what other hosts' plans ask of each of these hosts before its own HostFacts is installed (the
    converged record must replay every read a run's plan depended on). Called once, before any host plans."""
    for h in hosts:
        if "ironserve_host_facts" not in h.__dict__ and "ironserve_early_reads" not in h.__dict__:
            h.ironserve_early_reads = EarlyReads(h)
            h.get_fact = h.ironserve_early_reads.get_fact


def run_unread(h, command: str, **kwargs):
    """Run a command that writes nothing an operation reads (the deploy's metrics, the converged record): the
    run's answers stay, and the run still counts as one that changed nothing."""
    facts = getattr(h, "ironserve_host_facts", None)  # the real host's, also through pyinfra's host proxy
    if isinstance(facts, HostFacts):
        return facts.run_read_only(command, **kwargs)
    return h.run_shell_command(command, **kwargs)


def end_planning() -> None:
    real = current_host._get_module()
    facts = real.__dict__.get("ironserve_host_facts") if real is not None else None
    if facts is not None:
        facts.end_planning()
