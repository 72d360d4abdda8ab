"""Secrets never in ``--dry``/``--diff``/``-v`` output, offline: the unit stage of a deploy is planned for a keyed
3-host tiny deployment (roles/sglang_service.install_units, the real function, with pyinfra's files operations,
``staged_text`` and ``secret_file`` recorded instead of queued), then what pyinfra would print for it is read:
every operation's name, a staged file's content (what --diff shows), and the commands a secret_file operation
yields when the host holds another secret (what --dry -v shows). The key must be in none of it, and must reach the
host (through secret_file) all the same. A file holding a secret written as a plain staged file, or a secret in an
operation's name or arguments, fails here."""

from __future__ import annotations

from io import StringIO
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from roles import secret_file as secret_role
from roles import sglang_service
from roles.context import build_context
from roles.secret_file import Secret

KEY = "sk-diff-test-" + "k" * 32


class Planned:
    """Records the operations install_units asks for, with what pyinfra would print of each."""

    def __init__(self):
        self.printed: list[str] = []  # names, destinations, uploaded content: what --diff / -v can show
        self.secrets: list[tuple[str, Secret]] = []

    def put(self, name, src, dest, **kwargs):
        content = src.getvalue() if isinstance(src, StringIO) else str(src)
        self.printed += [name, dest, content, repr(kwargs)]
        return SimpleNamespace(changed=True)

    def text(self, name, text, dest, **kwargs):
        self.printed += [name, dest, text, repr(kwargs)]
        return SimpleNamespace(changed=True)

    def directory(self, name, path, **kwargs):
        self.printed += [name, path, repr(kwargs)]
        return SimpleNamespace(changed=True)

    def secret_file(self, name, path, secret, **kwargs):
        self.printed += [name, path, repr(secret), repr(kwargs)]
        self.secrets.append((path, secret))
        return SimpleNamespace(changed=True)

    def other(self, *args, **kwargs):
        self.printed += [repr(args), repr(kwargs)]
        return SimpleNamespace(changed=True)


@pytest.fixture
def planned(tmp_path, monkeypatch):
    key_file = tmp_path / "api_key"
    key_file.write_text(KEY + "\n")
    data = {
        "hardware": "cpu-lab",
        "api_key_file": str(key_file),
        "secret_dir": str(tmp_path / "secrets"),
        "parse_check": False,
    }
    hosts = [
        ("r0", {**data, "ssh_hostname": "10.0.0.12", "ironserve_role": "router"}),
        ("n0", {**data, "ssh_hostname": "10.0.0.10"}),
        ("n1", {**data, "ssh_hostname": "10.0.0.11"}),
    ]
    plan = Planned()
    monkeypatch.setattr(sglang_service, "files", SimpleNamespace(put=plan.put, directory=plan.directory))
    monkeypatch.setattr(sglang_service, "staged_text", plan.text)
    monkeypatch.setattr(sglang_service, "secret_file", plan.secret_file)
    monkeypatch.setattr(sglang_service, "argv_parses", plan.other)  # parse_check=false: asked for nothing
    for host in ("n0", "r0"):
        ctx = build_context("tiny", host, hosts)
        procs = [p for p in ctx.rendered.processes if p.host == host]
        assert procs, host
        sglang_service.install_units(ctx, procs)
    return plan


def test_the_planned_unit_stage_prints_no_key(planned):
    assert planned.printed and not [text for text in planned.printed if KEY in text]


def test_the_key_reaches_every_env_file_through_secret_file_only(planned):
    keyed = [path for path, secret in planned.secrets if KEY in secret.reveal()]
    # the engine's env file on n0 and the router's on r0, both staged 0600
    assert len(keyed) == 2 and all(
        path.startswith("/etc/ironserve/staged/") and path.endswith(".env") for path in keyed
    ), keyed


def test_a_changed_secret_file_plans_commands_that_print_no_secret():
    """What --dry -v prints for secret_file when the host holds another key: the FunctionCommand's repr."""
    state = FakeState()
    host = create_host(
        state,
        facts={
            "secret_file.SecretFileState": {
                "path=/etc/ironserve/x.env": {"mode": "600", "user": "root", "group": "root", "sha256": "0" * 64}
            }
        },
    )
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(secret_role.secret_file._inner(path="/etc/ironserve/x.env", secret=Secret(KEY)))
    assert commands and not [c for c in commands if KEY in repr(c) or KEY in str(c)]
    assert all(KEY not in repr(arg) for c in commands for arg in getattr(c, "args", ()))
