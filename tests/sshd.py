"""An SSH server on loopback in the test's process, for what reaches hosts through pyinfra's SSH connector: one
host key, password auth ("pw"), every command run with /bin/sh as sshd would. Each command it is sent is recorded
(``execs``) when its exec request arrives, before the client hears back."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

import paramiko
import pyinfra_cli  # noqa: F401 - it patches threading for gevent when imported: before the server's threads start
import pytest


class _Server(paramiko.ServerInterface):
    def __init__(self, execs: list[str]):
        self.execs = execs

    def check_auth_password(self, username, password):
        return paramiko.AUTH_SUCCESSFUL if password == "pw" else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username):
        return "password"

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        self.execs.append(command.decode())

        def run():
            proc = subprocess.run(["/bin/sh", "-c", command.decode()], capture_output=True, timeout=30)
            channel.sendall(proc.stdout)
            channel.sendall_stderr(proc.stderr)
            channel.send_exit_status(proc.returncode)
            channel.close()

        threading.Thread(target=run, daemon=True).start()
        return True


@pytest.fixture(scope="module")
def sshd():
    """An SSH server on 127.0.0.1 (one host key; password auth) answering every connection it gets."""
    key = paramiko.RSAKey.generate(2048)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    stop = threading.Event()
    execs: list[str] = []

    def serve():
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                continue
            transport = paramiko.Transport(sock)
            transport.add_server_key(key)
            transport.start_server(server=_Server(execs))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield {"port": listener.getsockname()[1], "key": key, "execs": execs}
    stop.set()
    thread.join(5)
    listener.close()


def connection_data(tmp_path: Path, sshd: dict, known: bool = True) -> dict:
    """An inventory host's data reaching the server: its address and port, root with the password, and a
    known_hosts file in ``tmp_path`` holding the server's key (empty unless ``known``)."""
    known_hosts = tmp_path / "known_hosts"
    keys = paramiko.HostKeys()
    if known:
        keys.add(f"[127.0.0.1]:{sshd['port']}", sshd["key"].get_name(), sshd["key"])
    keys.save(str(known_hosts))
    return {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": sshd["port"],
        "ssh_user": "root",
        "ssh_password": "pw",
        "ssh_known_hosts_file": str(known_hosts),
    }
