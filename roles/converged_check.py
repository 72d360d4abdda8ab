"""The converged fast path's check of every host, sent before the deploy loads its roles.

In a converged no-op run the hosts' part is the check (files/bin/ironserve_converged.py ``check``: the GPUs, the
images, the files and units a record vouches for; about 0.15 s of a stand-in host's CPU) and the controller's part
is loading the roles, the recipe and the deployment's context to compute the run's inputs (0.2 s on 8 hosts).
Neither needs the other until the answers are compared. So the deploys' entry point (roles/entry.py) sends the
check first, without the inputs, and the hosts read while the controller loads; roles/converged.py compares the
answers with the inputs once it has them. This module loads pyinfra, gevent and the host data's model, nothing of
the roles.

The check is sent early only where roles/converged.py would read the records anyway: a run of the whole inventory
(no --limit) whose every host is connected over pyinfra's SSH connector and has ``converged_fast_path`` on in its
typed host data (the one module of ironserve loaded before the check goes).
The command is the one pyinfra would run for the host (its sudo, su and shell from the host's data, as a fact's),
on a channel of the connection pyinfra opened. A host whose early check fails is read again the usual way.
"""

from __future__ import annotations

import json
import shlex

import gevent
from gevent.event import Event
from pyinfra import context, logger
from pyinfra.api import StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.connectors.util import make_unix_command_for_host
from pyinfra.context import ctx_host

SCRIPT = "/usr/local/lib/ironserve/ironserve-converged"
SEND_WAIT_S = 10  # the controller waits at most this for the checks to be on their way (then loads anyway)
READ_TIMEOUT_S = 120  # a check that has not answered by then is read again the usual way
NO_RECORD = '{"inputs": null, "changed": [], "why": "%s"}'
# the arguments pyinfra's SSH connector takes for itself before it builds the command line
_NOT_FOR_THE_LINE = ("_get_pty", "_timeout", "_stdin", "_success_exit_codes")


def command(inputs: str | None = None) -> str:
    """The check as the host's shell runs it. With the run's inputs, a record of other inputs is answered at once;
    a host without this release's checker answers that it has no record (that run plans in full and installs it)."""
    script = shlex.quote(SCRIPT)
    check = f"{script} check" + ("" if inputs is None else f" {shlex.quote(inputs)}")
    return (
        f"if [ -x {script} ]; then {check} 2>/dev/null || "
        f"echo {shlex.quote(NO_RECORD % 'a checker that could not check')}; "
        f"else echo {shlex.quote(NO_RECORD % 'no checker installed')}; fi"
    )


def parse(lines: list[str]) -> dict:
    """A check's answer: {"inputs": recorded inputs or None, "changed": [read labels], "why": ...}."""
    try:
        value = json.loads(lines[-1])
    except (ValueError, IndexError):
        return {"inputs": None, "changed": [], "why": "an answer that is not the checker's"}
    return value if isinstance(value, dict) else {"inputs": None, "changed": [], "why": "no answer"}


class Sent:
    """The run's early checks: each host's greenlet (its answer, None where it failed) and whether its command has
    gone (or failed)."""

    def __init__(self, state, hosts: list) -> None:
        self.went = {h: Event() for h in hosts}
        self.jobs = {h: gevent.spawn(_check, state, h, self.went[h]) for h in hosts}


def _state():
    """pyinfra's state itself, not its context proxy."""
    return context.state._get_module()


def start() -> None:
    """Send every host's check, once per run, and wait until each has gone (or failed): the caller then loads the
    roles, a core's work with no wait in it, while the hosts read. Every host's deploy calls this first; the first
    call sends, the others wait with it (pyinfra loads the hosts' deploys side by side)."""
    state = _state()
    early = getattr(state, "ironserve_converged_sent", False)
    if early is False:
        early = state.ironserve_converged_sent = _send(state)
    if early is not None:
        gevent.wait(list(early.went.values()), timeout=SEND_WAIT_S)


def _send(state) -> Sent | None:
    hosts = list(state.inventory.get_active_hosts())
    if len(hosts) != len(state.inventory) or not all(fast_path_on(h) and _over_ssh(h) for h in hosts):
        return None
    return Sent(state, hosts)


def fast_path_on(h) -> bool:
    """The fast path on in the host's typed data (ironserve/hostdata.py: loaded here, before the roles); a host
    whose data does not validate is left to the deploy, which says why."""
    from ironserve.hostdata import validate_host_data
    from ironserve.problems import SpecError

    try:
        return validate_host_data(h.data.dict(), "inventory", h.name).converged_fast_path
    except SpecError:
        return False


def _over_ssh(h) -> bool:
    """Connected by pyinfra's SSH connector (a paramiko client)."""
    return bool(h.connected) and getattr(getattr(h.connector, "client", None), "get_transport", None) is not None


def _check(state, h, went: Event) -> dict | None:
    """One host's check on a channel of pyinfra's connection to it: its answer, or None."""
    try:
        with ctx_host.use(h):
            arguments, _ = pop_global_arguments(state, h, {})
        line = StringCommand(command())
        for_line = {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS and k not in _NOT_FOR_THE_LINE}
        channel = h.connector.client.get_transport().open_session(timeout=READ_TIMEOUT_S)
        # the request goes out at once, its answer comes once the host's sshd has started the command (its PAM
        # session, a shell): gone, not started, is what the controller waits for
        unix_command = make_unix_command_for_host(state, h, line, **for_line)
        # as pyinfra's connector says every command it runs (--debug): the early check is one of the host's commands
        logger.debug("Running command on %s: (pty=%s) %s", h.name, False, unix_command)
        started = gevent.spawn(channel.exec_command, unix_command.get_raw_value())
        gevent.sleep(0)  # (the request written, the exec now waiting for its answer)
        went.set()
        with gevent.Timeout(READ_TIMEOUT_S):
            started.get()
            out = channel.makefile("rb").read()
            channel.recv_exit_status()
        channel.close()
        return parse(out.decode(errors="replace").splitlines())
    except (Exception, gevent.Timeout) as exc:  # noqa: BLE001 - unreachable, refused, timed out: read again
        logger.debug(f"[{h.name}] converged fast path: the early check failed: {type(exc).__name__}: {exc}")
        return None
    finally:
        went.set()


def answers(state, hosts: list) -> dict:
    """The early checks' answers of these hosts, once back: {host: answer}, without the hosts whose check was not
    sent or failed."""
    early = getattr(state, "ironserve_converged_sent", None)
    if not early:
        return {}
    gevent.joinall([early.jobs[h] for h in hosts if h in early.jobs])
    return {h: early.jobs[h].value for h in hosts if h in early.jobs and early.jobs[h].value is not None}
