"""What several roles share: change records, run-if-changed, the unit facts, apt sources, reading facts' output,
files from text, check operations, helper scripts in the engine's runtime.

One home for each: a role that needs one of these imports it from here, never from another role, so the roles
form no import loop (roles/launch.py is only the launch stage).

Change records: which operations of this run change what a unit runs (image, venv packages: every unit of the
host; unit and env file: that unit) and which files are newer than a start when the runtime changed. The roles
that prepare a host record them on the deployment context (``ctx.changes``); the launch stage reads them to
restart exactly the units whose configuration changed.
"""

from __future__ import annotations

import functools
import json
import shlex
import time
from dataclasses import dataclass, field
from io import StringIO

import gevent
from pyinfra import context, host
from pyinfra.api import FactBase, OperationError, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files

from ironserve.derived_image import PENDING as PENDING_MARK
from ironserve.derived_image import pending_images, substitute
from ironserve.spec import DockerRuntime, Recipe
from ironserve.units import image_ref, sourcing_script, venv_path

PROGRESS_EVERY_S = 30  # how often a long wait (pull, build, download, install) says it is still running

# --------------------------------------------------------------------------- images this run pushes
# While the run plans, the deployment's derived image is named by a placeholder when the site's registry does not
# hold it yet (ironserve/derived_image.py); its builder's push records the digest here while the run executes. One
# record for every host of the run: pyinfra runs the push on the builder before any host runs the next operation.
PUSHED_IMAGES: dict[str, str] = {}  # placeholder -> REPOSITORY@sha256:...


def pushed(value):
    """``value`` (a string, or lists/dicts of them) with the images this run pushed named by their digests. While
    executing, an image still unpushed (its builder failed, or is outside the run) is an OperationError: nothing
    ever runs, writes or pulls a placeholder."""
    value = substitute(value, PUSHED_IMAGES)
    missing = pending_images(value) if getattr(context.state, "is_executing", False) else []
    if missing:
        raise OperationError(
            f"{host.name}: {missing[0].split(PENDING_MARK)[0]} was not pushed by this run (its builder failed "
            "before the push: see its error above); nothing here uses it"
        )
    return value


def with_pushed_images(op):
    """An operation's function whose arguments may name an image this run pushes: they are resolved (``pushed``)
    each time its commands are generated, so when it executes they name the pushed digest."""

    @functools.wraps(op)
    def resolved(*args, **kwargs):
        return op(*pushed(list(args)), **pushed(kwargs))

    return resolved


# --------------------------------------------------------------------------- the per-host deploy lock
# Two deploys on one host (two operators, two recipes) must not interleave the commands that build or remove what
# they share (the runtime venvs, uv): each such command runs under flock(1) on one root-owned lock file in
# /run/ironserve (root's own directory, never a world-writable one such as /run/lock). pyinfra runs one shell per
# command, so the lock is held by that command's shell alone: a killed deploy never leaves a stale lock, since
# flock releases it when its process exits, and there is no lock to clean up after a reboot (/run is a tmpfs).
DEPLOY_LOCK = "/run/ironserve/deploy.lock"
DEPLOY_LOCK_WAIT_S = 3600  # a venv install of another deploy can take this long
DEPLOY_LOCK_TIMEOUT_RC = 75


def host_locked(command: str) -> str:
    """``command`` run under the host's deploy lock (waiting for another deploy's locked command to end), as one
    quoted ``sh -c`` word; a wait past DEPLOY_LOCK_WAIT_S fails, saying so."""
    lock = shlex.quote(DEPLOY_LOCK)
    return (
        f"mkdir -p {shlex.quote(DEPLOY_LOCK.rsplit('/', 1)[0])} && flock -E {DEPLOY_LOCK_TIMEOUT_RC} "
        f"-w {DEPLOY_LOCK_WAIT_S} {lock} sh -c {shlex.quote(command)}; rc=$?; "
        f'if [ $rc -eq {DEPLOY_LOCK_TIMEOUT_RC} ]; then echo "ironserve: another deploy held {DEPLOY_LOCK} for '
        f'{DEPLOY_LOCK_WAIT_S}s" >&2; fi; exit $rc'
    )


class LongCommand(StringCommand):
    """A shell command that can run for minutes (image pulls, derived builds, weight downloads, venv installs):
    while it runs, pyinfra's logger says every PROGRESS_EVERY_S seconds what is still running, instead of
    silence. The command text is the command itself (fixtures and --dry see the plain string)."""

    def __init__(self, command: str, what: str, every: float = PROGRESS_EVERY_S):
        super().__init__(command)
        self.what, self.every = what, every

    def execute(self, state, host, connector_arguments):
        started = time.monotonic()

        def tick() -> None:
            while True:
                gevent.sleep(self.every)
                host.log(f"{self.what}: still running after {time.monotonic() - started:.0f}s")

        ticker = gevent.spawn(tick)
        try:
            return super().execute(state, host, connector_arguments)
        finally:
            ticker.kill()
            host.log(f"{self.what}: {time.monotonic() - started:.0f}s")


def changed(meta) -> bool:
    """Did (or, while planning, will) an earlier operation change something? Plain bools pass through."""
    if meta is None or isinstance(meta, bool):
        return bool(meta)
    if meta.is_complete():
        return meta.did_change()
    return bool(meta.will_change)


@dataclass
class ChangeRecords:
    """This host's record of the operations whose change means a unit must restart (see the module doc)."""

    runtime: list = field(default_factory=list)  # image, venv packages: every unit of this host runs new code
    units: dict[str, list] = field(default_factory=dict)  # unit -> its unit file and env file operations
    runtime_paths: list[str] = field(default_factory=list)  # requirements, Dockerfile, lock: newer = stale start
    image: str | None = None  # the image the docker units run
    # docker units: unit -> (image, container command, env names) the running container must have
    containers: dict[str, tuple[str, list[str], list[str]]] = field(default_factory=dict)
    rank_guard_script: object = False  # the put of the rank guard script: a new one restarts the running guards

    def record_runtime_change(self, *metas) -> None:
        self.runtime.extend(metas)

    def record_unit_change(self, unit: str, *metas) -> None:
        self.units.setdefault(unit, []).extend(metas)

    def record_runtime_paths(self, *paths: str) -> None:
        self.runtime_paths.extend(paths)

    def record_container(self, unit: str, image: str, cmd: list[str], env_names: list[str]) -> None:
        """What the running container of a docker unit must look like (checked for drift before the starts)."""
        self.containers[unit] = (image, list(cmd), sorted(env_names))

    def runtime_change_flag(self):
        """A callable: did this run change the runtime every unit of this host runs (image, venv packages)?"""
        metas = list(self.runtime)
        return lambda: any(changed(m) for m in metas)

    def unit_change_flag(self, unit: str):
        """A callable for unit_started(restart=...): evaluated when the start operation runs."""
        metas = list(self.runtime) + list(self.units.get(unit, []))
        return lambda: any(changed(m) for m in metas)


def uses_sudo(h) -> bool:
    """pyinfra's own ``_sudo`` of a host (a connector argument of the inventory, not ironserve's host data): the one
    place it is read, for the commands run on a host outside an operation (callbacks while the run executes)."""
    return bool(h.data.get("_sudo"))


def in_run(name: str) -> bool:
    """Is the inventory host ``name`` part of this run (not left out by --limit)?"""
    target = context.inventory.get_host(name) if context.inventory else None
    return target is not None and context.state.is_host_in_limit(target)


@operation()
def run_if_changed(command: str, triggers: list):
    """Run a command when any trigger (an earlier operation's result, or a bool) changed something."""
    if any(changed(t) for t in triggers):
        yield command
    else:
        host.noop(f"nothing changed: not running {command}")


def apt_update_for(what: str, sources: list, packages: list[str]) -> None:
    """``apt-get update`` when one of ``sources`` (the operations that wrote apt sources) changed, or one of
    ``packages`` is not installed yet: a run that failed after writing the sources never updated."""
    installed = host.get_fact(DebPackages) or {}
    missing = any(p.split("=", 1)[0] not in installed for p in packages)
    run_if_changed(name=f"apt update ({what})", command="apt-get update", triggers=[*sources, missing])


def word_lines(output) -> list[tuple[str, str]]:
    """(first word, the rest) of each line of a fact's output, in order (blank lines skipped; a word may come
    again), as several facts print them."""
    found = []
    for line in output:
        key, _, value = line.strip().partition(" ")
        if key:
            found.append((key, value.strip()))
    return found


def keyed_lines(output) -> dict[str, str]:
    """{first word: the rest} of a fact's "KEY VALUE" lines (the last line of a word wins)."""
    return dict(word_lines(output))


def assignments(output) -> dict[str, str]:
    """{KEY: VALUE} of a fact's "KEY=VALUE" lines, both stripped (the last line of a key wins)."""
    found = {}
    for line in output:
        key, _, value = line.partition("=")
        found[key.strip()] = value.strip()
    return found


def json_output(output, empty=None, invalid=None):
    """The JSON document a fact's command printed: ``empty`` when it printed nothing, ``invalid`` when it is not
    JSON (a file someone edited by hand)."""
    text = "\n".join(output).strip()
    if not text:
        return empty
    try:
        return json.loads(text)
    except ValueError:
        return invalid


def put_text(name: str, text: str, dest: str, mode: str = "644"):
    """``dest`` holds ``text`` (a file the role renders, uploaded from memory): the files.put operation, whose change
    others trigger on (run_if_changed, restarts)."""
    return files.put(name=name, src=StringIO(text), dest=dest, mode=mode)


def refuse(problems: list[str], converged: str, heading: str | None = None) -> None:
    """What an operation that only checks does: an OperationError with one line per problem (under ``heading``,
    indented), else the no-op saying what holds."""
    if problems:
        raise OperationError(f"{heading}\n  " + "\n  ".join(problems) if heading else "\n".join(problems))
    host.noop(converged)


def runtime_python_argv(
    recipe: Recipe,
    script: str,
    container_script: str,
    args: list[str],
    label: str,
    network: str,
    env: dict[str, str] | None = None,
) -> list[str]:
    """A helper script of ironserve's (``script`` on the host) run by the python of the engine's own runtime, after
    its sourced env scripts: in the recipe's image (mounted read-only at ``container_script``, on the ``network``
    given, ``env`` passed in) or with its venv's python3 (``env`` set by env(1)). ``label`` names the bash -c
    process that sources the scripts."""
    runtime = recipe.runtime
    sourced = sourcing_script(runtime.source_env) if runtime.source_env else None
    if isinstance(runtime, DockerRuntime):
        run = ["docker", "run", "--rm", "--network", network, "-v", f"{script}:{container_script}:ro"]
        for key, value in (env or {}).items():
            run += ["-e", f"{key}={value}"]
        if sourced:
            image = ["--entrypoint", "/bin/bash", image_ref(recipe), "-c", sourced, label, "python3"]
            return run + image + [container_script, *args]
        return run + ["--entrypoint", "python3", image_ref(recipe), container_script, *args]
    core = [f"{venv_path(recipe)}/bin/python3", script, *args]
    if sourced:
        core = ["/bin/bash", "-c", sourced, label, *core]
    return core if env is None else ["env", *(f"{k}={v}" for k, v in env.items()), *core]


def sha256_checked(path: str, sha256: str, what: str, host_name: str) -> str:
    """A shell step that stops the command (and removes ``path``) unless the file's sha256 is ``sha256``: what root
    runs or unpacks is checked on the host, right before, against a value from the inventory, never one the
    download's own server supplies. The failure names host, file, expected and found sums."""
    q = shlex.quote
    message = f"{host_name}: {what} {path}: sha256 expected {sha256}, found "
    return (
        f"{{ found=$(sha256sum {q(path)} | cut -d' ' -f1); [ \"$found\" = {q(sha256)} ] || "
        f'{{ echo {q(message)}"$found" >&2; rm -f {q(path)}; exit 1; }}; }}'
    )


def deb822_source(
    uris: str,
    suite: str,
    components: str | None = None,
    signed_by: str | None = None,
    trusted: bool = False,
    comment: str = "# managed by ironserve",
) -> str:
    """An apt source in deb822 form. A flat repository (suite ending in "/") has no components; ``trusted`` (a
    cluster's own unsigned mirror, reached only inside it) replaces the keyring."""
    lines = [comment, "Types: deb", f"URIs: {uris}", f"Suites: {suite}"]
    if components and not suite.endswith("/"):
        lines.append(f"Components: {components}")
    if trusted:
        lines.append("Trusted: yes")
    elif signed_by:
        lines.append(f"Signed-By: {signed_by}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- facts


class UnitState(FactBase):
    """systemd state of a unit and the mtimes of the files it was started from.

    {active, sub, since (unix seconds of ActiveEnterTimestamp or None), mtimes {path: seconds}}
    """

    @staticmethod
    def default():
        return {"active": None, "sub": None, "since": None, "mtimes": {}}

    def command(self, unit, paths):
        stat = f"stat -c 'mtime %Y %n' {' '.join(shlex.quote(p) for p in paths)} 2>/dev/null; " if paths else ""
        return (
            f"systemctl show -p ActiveState -p SubState -p ActiveEnterTimestamp --timestamp=unix "
            f"{shlex.quote(unit)}.service 2>/dev/null; {stat}true"
        )

    def process(self, output):
        state = UnitState.default()
        for line in output:
            if line.startswith("mtime "):
                _, seconds, path = line.split(" ", 2)
                state["mtimes"][path] = int(seconds)
                continue
            key, _, value = line.partition("=")
            if key == "ActiveState":
                state["active"] = value
            elif key == "SubState":
                state["sub"] = value
            elif key == "ActiveEnterTimestamp" and value.startswith("@"):
                state["since"] = int(value[1:].split(".")[0]) or None
        return state


class HttpStatus(FactBase):
    """HTTP status of a GET from the host itself (curl), None when nothing answers."""

    def command(self, url):
        return f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' {shlex.quote(url)} || true"

    def process(self, output):
        text = "".join(output).strip()
        return int(text) if text.isdigit() and int(text) > 0 else None
