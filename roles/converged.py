"""Knowing that nothing changed, at fleet scale: one light read per host instead of the whole plan.

With host data ``converged_fast_path: true``, a run that planned and ran no change on any host ends by leaving on
each host a record (files/bin/ironserve_converged.py, root's 0600 ``/var/lib/ironserve/converged.json``): the
digest of the deployment's inputs, and the digest of a light read of everything that run read of the host. The
next run, before planning anything, checks every host in one command each (all hosts at once): when each host's
record names these inputs and its reads answer as they did, that run would change nothing again, and it plans no
operation on any host. Otherwise (any host differs, has no record, or cannot say) every host is planned in full,
as without the fast path: a file edited on a host, a package or unit changed, a unit restarted, a controller file
changed, all make some read or the inputs differ.

Why this cannot skip a change: an operation's plan is a function of the deployment's inputs and of the facts it
reads. The record certifies a run that, from these inputs and these facts, found nothing to do; the light read
changes whenever a fact's value can (a file's inode status changes with any write to it; the package database
with any package change; facts with no light form are read whole). Any run that acts forgets the records first,
so a run that failed half-way leaves none; a host that asked a fact the record cannot replay gets none.

The inputs: the product's own files (this release's roles, templates, catalogue), the model, the recipe and
hardware profile, the derived image, every inventory host's data, and the contents of the controller files that
host data names (API key, token, secrets, CA, lock, apt key, Ascend packages: a rotated key must roll out).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
from dataclasses import asdict, is_dataclass
from pathlib import Path

import gevent
from gevent.event import AsyncResult
from pyinfra import context, logger
from pyinfra.api import FactBase, deploy
from pyinfra.api.facts import get_fact
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory, File, FindInFile, Link, Md5File, Sha1File, Sha256File
from pyinfra.facts.pip import PipPackages
from pyinfra.facts.server import Groups, Users
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import files

from ironserve import resources
from roles import converged_check, host_state
from roles.common import uses_sudo
from roles.context import DeploymentContext, host_data
from roles.desired import DesiredFile, text_file
from roles.uv_env import venv_reads

SCRIPT = converged_check.SCRIPT  # in LIB_DIR, with ironserve's other host scripts
# host data naming files on the controller whose contents the deploy puts on hosts
CONTROLLER_FILES = (
    "api_key_file",
    "hf_token_file",
    "secret_dir",
    "nvidia_apt_key_file",
    "docker_registry_ca",
    "docker_derived_registry_auth_file",
    "docker_image_lock",
    "ascend_package_store",
)
_WHOLE_FILE_MAX = 4 << 20  # larger files (and directories' files) by size and mtime

# pyinfra facts whose value is a function of files: read by their inode status
_FILE_FACTS = (File, Sha1File, Sha256File, Md5File, Link, FindInFile)


def _venv_paths(executable: str | None) -> dict[str, list[str]] | None:
    """A tool given as VENV/bin/NAME read as its venv; None otherwise."""
    if not executable or not executable.startswith("/") or "/bin/" not in executable:
        return None
    return venv_reads(executable.rsplit("/bin/", 1)[0], executable)


def _units(kwargs: dict, prop: str) -> dict | None:
    """systemd's facts of the system manager for named units, as one read of the units' property (all such reads
    of a host in one ``systemctl show``); None: another manager or every unit (read by their own command)."""
    services = kwargs.get("services")
    services = [services] if isinstance(services, str) else services
    if kwargs.get("user_mode") or kwargs.get("machine") or kwargs.get("user_name") or not services:
        return None
    return {"units": sorted(services), "props": [prop]}


_PATHS_OF = {
    SystemdEnabled: lambda kw: _units(kw, SystemdEnabled.state_key),
    SystemdStatus: lambda kw: _units(kw, SystemdStatus.state_key),
    PipPackages: lambda kw: _venv_paths(kw.get("pip")),
    DebPackages: lambda kw: ["/var/lib/dpkg/status"],
    Users: lambda kw: ["/etc/passwd", "/etc/group", "/etc/shadow"],  # their lastlog is no input of any operation
    Groups: lambda kw: ["/etc/group"],
}


# --------------------------------------------------------------------------- the check


class ConvergedCheck(FactBase):
    """This host's record checked now against this run's inputs: {"inputs": recorded inputs or None, "changed":
    [read labels], "why": ...}; a record of other inputs answers at once, without its reads. (The check sent before
    the roles load, roles/converged_check.py, is this one without the inputs.)"""

    batched = False  # never batched or kept: it decides whether anything else is read

    def command(self, inputs: str):
        return converged_check.command(inputs)

    @staticmethod
    def default():
        return {"inputs": None, "changed": [], "why": "no answer"}

    def process(self, output):
        return converged_check.parse(output)


def _printable(value) -> str:
    """A host's text as the controller's log shows it: printable, short (a host never writes to our terminal)."""
    return re.sub(r"[^\x20-\x7e]", "?", str(value))[:300]


def why_not(answer, inputs: str) -> str | None:
    """Why a host's check does not vouch for these inputs; None: it does."""
    if not isinstance(answer, dict) or answer.get("inputs") is None:
        return _printable((answer or {}).get("why") or "no record")
    if answer["inputs"] != inputs:
        return "the deployment's inputs changed since its record"
    changed = answer.get("changed")
    if not isinstance(changed, list):
        return "an answer that is not the checker's"
    if changed:
        more = f" (+{len(changed) - 3})" if len(changed) > 3 else ""
        return f"changed since its record: {', '.join(map(_printable, changed[:3]))}{more}"
    return None


def _state():
    """pyinfra's state itself, not its context proxy (its greenlet pool spawns with it)."""
    return context.state._get_module()


def decided() -> bool | None:
    """This run's decision when a host planned before this one is making or made it (waits for it: pyinfra plans
    the hosts side by side); None when this host is the first and decides."""
    decision = getattr(_state(), "ironserve_converged", None)
    return None if decision is None else decision.get()


def skip(ctx: DeploymentContext) -> bool:
    """Whether this run plans nothing: every host of the run vouches for these inputs. Decided once per run: pyinfra
    plans the hosts side by side (greenlets), so the first host planned decides and the others wait for it."""
    state = _state()
    decision = getattr(state, "ironserve_converged", None)
    if decision is not None:
        return decision.get()
    decision = state.ironserve_converged = AsyncResult()  # set before any wait: the others see it
    try:
        hosts = list(state.inventory.get_active_hosts())
        if not all(host_data(h).converged_fast_path for h in hosts):
            decision.set(False)  # a host without the fast path: no record is made or read
        elif len(hosts) != len(state.inventory):
            # a host's plan reads its peers (the router's workers, a fabric peer): a record is the whole run's
            logger.info("converged fast path: off for a run of part of the inventory (--limit): planning in full")
            decision.set(False)
        else:
            state.ironserve_converged_inputs = inputs_digest(ctx)
            unchanged = _decide(state, hosts, state.ironserve_converged_inputs)
            if not unchanged:  # before any host plans: what a peer's plan reads of a host is in that host's record
                host_state.note_early_reads(hosts)
            decision.set(unchanged)
    except BaseException as exc:
        decision.set_exception(exc)
        raise
    return decision.get()


def read_all(state, hosts: list, fact, kwargs: dict | None = None) -> dict:
    """One fact of every host, all at once: greenlets of their own (pyinfra's pool is busy planning; a spawn on
    it waits for a free slot that planning never gives back)."""

    def read(h):
        with ctx_host.use(h):
            return get_fact(state, h, fact, kwargs=kwargs)

    jobs = {h: gevent.spawn(read, h) for h in hosts}
    gevent.joinall(list(jobs.values()))
    return {h: job.value if job.successful() else None for h, job in jobs.items()}


def _decide(state, hosts: list, inputs: str) -> bool:
    answers = converged_check.answers(state, hosts)  # the checks sent before the roles loaded, where they were
    rest = [h for h in hosts if h not in answers]
    if rest:
        answers.update(read_all(state, rest, ConvergedCheck, {"inputs": inputs}))
    reasons = {h.name: why_not(answers.get(h), inputs) for h in hosts}
    missed = {name: why for name, why in reasons.items() if why}
    if missed:
        for name, why in sorted(missed.items()):
            logger.info(f"[{name}] converged fast path: planning in full: {why}")
        return False
    logger.info(f"--> Every host is as the last run that changed nothing left it ({len(hosts)} checked): no change")
    return True


# --------------------------------------------------------------------------- the inputs


@functools.cache
def product_digest() -> str:
    """This release's own files: the roles, the core, the templates and scripts, the catalogue, the deploys."""
    import roles

    digest = hashlib.sha256()
    roots = [Path(resources.__file__).parent, Path(roles.__file__).parent, resources.files_dir()]
    roots += [resources.catalogue_dir(), resources.deploys_dir()]
    for root in dict.fromkeys(roots):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(f"{path.relative_to(root)}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def controller_file_digest(path: str) -> str:
    """A controller file's contents (a directory: its files' names, sizes and mtimes; a large file: the same)."""
    target = Path(path).expanduser()
    if target.is_file() and target.stat().st_size <= _WHOLE_FILE_MAX:
        return hashlib.sha256(target.read_bytes()).hexdigest()
    if not target.exists():
        return "absent"
    found = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    listing = "\n".join(f"{p} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in found)
    return hashlib.sha256(listing.encode()).hexdigest()


def inputs_digest(ctx: DeploymentContext) -> str:
    """One digest of everything the deployment's plan is made from on the controller."""
    hosts = []
    for h in context.inventory:
        data = host_data(h)
        named = {key: getattr(data, key) for key in CONTROLLER_FILES if getattr(data, key, None)}
        files_seen = {key: controller_file_digest(str(value)) for key, value in named.items()}
        raw = h.data.dict() if hasattr(h.data, "dict") else dict(h.data)
        hosts.append([h.name, raw, files_seen])
    derived = asdict(ctx.derived) if is_dataclass(ctx.derived) else ctx.derived
    text = json.dumps(
        [
            product_digest(),
            ctx.model,
            ctx.launch,
            ctx.recipe.model_dump(mode="json"),
            ctx.profile.model_dump(mode="json"),
            derived,
            hosts,
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------- the record


def light_read(req) -> list | None:
    """A fact question as a read of the record: [label, {"paths": [...], "sums": [...]}] (inode status, contents)
    or [label, {"dirs": [...]}] or [label, {"sh": its own command}]; None: a question the record cannot replay."""
    cls, kwargs = req.cls, req.kwargs
    kind = "paths"
    if cls is Directory:
        # its operations act on its mode and owner; what others write in it (metrics, a guard's state) is no input
        paths, kind = [kwargs.get("path")], "dirs"
    elif cls in _FILE_FACTS:
        paths = [kwargs.get("path")]
    elif cls in _PATHS_OF and _PATHS_OF[cls](kwargs) is not None:
        paths = _PATHS_OF[cls](kwargs)
    elif callable(getattr(cls, "light_paths", None)):
        paths = cls.light_paths(**kwargs)
    else:
        try:
            return [req.key, {"sh": req.shell()}]
        except Exception:  # noqa: BLE001 - a question its fact cannot build any more
            return None
    spec = paths if isinstance(paths, dict) else {kind: paths}
    return [req.key, spec] if spec and all(_valid_part(k, v) for k, v in spec.items()) else None


def _valid_part(kind: str, value) -> bool:
    if kind == "sh":
        return isinstance(value, str) and bool(value)
    if kind in ("units", "props"):
        return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    return _absolute_paths(value)


def _absolute_paths(paths) -> bool:
    return isinstance(paths, list) and all(isinstance(p, str) and p.startswith("/") for p in paths)


def reads_of(facts) -> tuple[list, list[str]]:
    """The light reads of what this run asked of a host, and the questions that have none."""
    reads, missing = {}, []
    for req in facts.run_requests().values():
        read = light_read(req)
        if read is None:
            missing.append(req.key)
        else:
            reads[read[0]] = read
    return [reads[k] for k in sorted(reads)], missing + sorted(facts.unreplayable)


class Recorder(BaseStateCallback):
    """Forgets every host's record when the run starts acting; records each host's after a run with no change."""

    def __init__(self) -> None:
        self.started = False
        self.last_op: str | None = None

    def operation_start(self, state, op_hash) -> None:
        if not self.started:
            self.started = True
            self.last_op = state.get_op_order()[-1]
            hosts = state.inventory.get_active_hosts()
            _run_all({h: [SCRIPT, "forget"] for h in hosts}, "record not forgotten")

    def operation_end(self, state, op_hash) -> None:
        if op_hash != self.last_op:
            return
        if state.failed_hosts or host_state.changes_made(state):
            return
        inputs, commands = state.ironserve_converged_inputs, {}
        for h in state.inventory.get_active_hosts():
            facts = getattr(h, "ironserve_host_facts", None)
            reads, missing = reads_of(facts) if facts is not None else ([], ["no batched facts on this host"])
            if missing:
                names = ", ".join(sorted({m.split("(")[0] for m in missing}))
                logger.info(
                    f"[{h.name}] converged fast path: no record: it asked what the record cannot replay ({names})"
                )
                continue
            commands[h] = [SCRIPT, "record", inputs, json.dumps(reads, sort_keys=True)]
        _run_all(commands, "not recorded")


def _run_all(commands: dict, failed: str) -> None:
    """Each host's command of the record's, all hosts at once (a fleet waits for its slowest host, not their sum)."""
    gevent.joinall([gevent.spawn(_run, h, argv, failed) for h, argv in commands.items()])


def _run(h, argv: list[str], failed: str) -> None:
    """A command of the record's; it never fails the deploy (without a record the next run plans in full)."""
    try:
        ok, out = host_state.run_unread(h, shlex.join(argv), _sudo=uses_sudo(h))
    except Exception as exc:  # noqa: BLE001
        ok, out = False, f"{type(exc).__name__}: {exc}"
    if not ok:
        logger.warning(f"[{h.name}] converged fast path: {failed} ({getattr(out, 'stderr', out)})")


def watch(state) -> None:
    """Record after this run (once per run). Registered after the deploy's clock (roles/deploy_clock.py), whose
    metrics it writes at the same moment: the record reads the textfile directory as they leave it."""
    if getattr(state, "ironserve_converged_recorder", None) is None:
        state.ironserve_converged_recorder = Recorder()
        state.add_callback_handler(state.ironserve_converged_recorder)


# --------------------------------------------------------------------------- the checker on the host


@deploy("The converged record's checker")
def apply(ctx: DeploymentContext) -> None:
    if getattr(_state(), "ironserve_converged_inputs", None):  # every host of the run has the fast path
        watch(_state())
    files.put(
        name="ironserve-converged: the record of a run that changed nothing",
        src=str(resources.files_dir() / "bin" / "ironserve_converged.py"),
        dest=SCRIPT,
        mode="755",
        user="root",
        group="root",
    )


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    """For `ironserve audit`: the checker."""
    return [text_file(SCRIPT, (resources.files_dir() / "bin" / "ironserve_converged.py").read_text(), 0o755)]
