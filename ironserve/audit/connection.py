"""How audit and status reach hosts: through pyinfra's own SSH connector, as the deploy does.

pyinfra's connector opens each host's connection from the inventory's data (ssh_hostname, ssh_user, ssh_port,
ssh_key, ssh_config_file with its ProxyJump/ProxyCommand bastions, ssh_known_hosts_file, ssh_paramiko_connect_kwargs);
testinfra's paramiko backend then runs the checks' commands over that client (exit codes, sudo), so the checks'
evaluators stay testinfra's. One difference from a deploy, on purpose: a host key that is not known is refused
(ssh_strict_host_key_checking "yes") unless the inventory sets ssh_strict_host_key_checking itself; pyinfra's own
default, accept-new, would trust and record any key an attacker on the path offers.
"""

from __future__ import annotations

import functools

import paramiko
import testinfra
from testinfra.backend.base import BaseBackend
from testinfra.backend.paramiko import ParamikoBackend

from ironserve.fleet import Fleet
from ironserve.problems import Problem, SpecError

SCHEME = "ironserve-pyinfra://"
STRICT_UNLESS_SAID = "yes"
_BACKENDS: dict[str, BaseBackend] = {}  # spec -> backend, for the generated pytest session in this process


class PyinfraBackend(ParamikoBackend):
    """testinfra's paramiko backend over the client pyinfra's SSH connector connected."""

    NAME = "ironserve-pyinfra"

    def __init__(self, host, sudo: bool):
        super().__init__("localhost", sudo=sudo)  # the hostspec is unused: pyinfra's host says where to connect
        self.pyinfra_host = host
        self.ahead = None  # the handshake started by connect_ahead (a greenlet), taken by the first read

    @functools.cached_property
    def client(self) -> paramiko.SSHClient:
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return self.connect()
        client, error = ahead.get()
        if error is not None:
            raise error  # said at the host's first read, as a handshake started then would say it
        return client

    def connect(self) -> paramiko.SSHClient:
        if self.pyinfra_host.connected:  # testinfra dropped a dead transport: connect again
            self.pyinfra_host.disconnect()
        self.pyinfra_host.connect(raise_exceptions=True, show_errors=False)
        return self.pyinfra_host.connector.client

    def connect_quietly(self) -> tuple[paramiko.SSHClient | None, Exception | None]:
        """connect(), its error returned rather than raised (a greenlet's error would be printed by gevent)."""
        try:
            return self.connect(), None
        except Exception as exc:  # noqa: BLE001 - unreachable, refused, timed out: raised at the first read
            return None, exc


def open_hosts(fleet: Fleet, names: list[str]) -> dict[str, str]:
    """A backend per named host, connected on first use; returns name -> spec (HostSnapshot and status take it)."""
    from pyinfra.api import Config, State

    from roles.common import uses_sudo

    State(fleet.pyinfra, Config())  # pyinfra's connectors are made for a state, as in a pyinfra run
    typed = {h.name: h.host_data for h in fleet.hosts}
    specs = {}
    for name in names:
        host = fleet.pyinfra.get_host(name)
        if not host.connector_cls.__module__.endswith(".ssh"):
            raise SpecError(
                [
                    Problem(
                        "inventory",
                        name,
                        f"connector {host.connector_cls.__name__} is not SSH",
                        "audit and status reach hosts over SSH: give them ssh_hostname",
                    )
                ]
            )
        # pyinfra's own connector setting: its default (accept-new) is not taken unless the inventory says so
        if "ssh_strict_host_key_checking" not in host.data.dict():
            host.connector.data["ssh_strict_host_key_checking"] = STRICT_UNLESS_SAID
        spec = f"{SCHEME}{name}"
        _BACKENDS[spec] = PyinfraBackend(host, sudo=uses_sudo(host) or (typed[name].ssh_user or "root") != "root")
        specs[name] = spec
    return specs


def connect_ahead(specs: dict[str, str]) -> None:
    """Start the opened hosts' SSH handshakes now, all at once (gevent greenlets, as pyinfra connects its hosts),
    so that they go on while the audit's plan is made; nothing runs on a host before its first read."""
    import gevent

    for spec in specs.values():
        found = _BACKENDS.get(spec)
        if isinstance(found, PyinfraBackend) and found.ahead is None:
            found.ahead = gevent.spawn(found.connect_quietly)


def backend(spec: str) -> BaseBackend:
    """The backend of a spec: a host opened by open_hosts, else a testinfra URL (ssh://, paramiko://, local://)."""
    return _BACKENDS.get(spec) or testinfra.get_host(spec).backend


def close(specs: dict[str, str]) -> None:
    for spec in specs.values():
        found = _BACKENDS.pop(spec, None)
        if not isinstance(found, PyinfraBackend):
            continue
        if found.ahead is not None:
            found.ahead.kill()  # a handshake never used (the plan failed): ended, not left running
        if found.pyinfra_host.connected:
            found.pyinfra_host.disconnect()
