"""Every spelling of the unspecified address is judged as "every interface", by one helper
(ironserve.spec.binds_every_address) that the deploy's open-bind check, lint, render and import all use."""

from __future__ import annotations

import socket

import pytest
from pyinfra.api import OperationError

from ironserve import catalogue
from ironserve.lint import lint_recipe
from ironserve.spec import binds_every_address
from roles import sglang_service as ss
from roles.context import build_context

EVERY = [
    "0.0.0.0",
    "::",
    "[::]",
    "::0",
    "0::0",
    "0:0:0:0:0:0:0:0",
    "0000::",
    "0",
    "0.0",
    "0.0.0",
    "00",
    "0x0",
    "000.000.000.000",
    "::ffff:0.0.0.0",
    "::%eth0",
    "[::0]",
    "",
]
ONE = [
    "127.0.0.1",
    "::1",
    "10.0.0.10",
    "localhost",
    "gpu-a.cluster",
    "fe80::1",
    "0.0.0.1",
    "1",
    "0.1",
    "::2",
    "0x1",
    "node0",
]


@pytest.mark.parametrize("host", EVERY)
def test_every_spelling_of_the_unspecified_address_binds_every_interface(host):
    assert binds_every_address(host)


@pytest.mark.parametrize("host", ONE)
def test_one_address_does_not(host):
    assert not binds_every_address(host)
    assert not binds_every_address(None)  # no --host: the engine's default, 127.0.0.1


@pytest.mark.parametrize("host", [h for h in EVERY + ONE if h and "%" not in h])  # a scope names a live interface
def test_the_helper_agrees_with_the_resolver(host):
    """What the resolver itself makes of a numeric bind address (getaddrinfo with AI_PASSIVE, as uvicorn's
    asyncio server binds): all zeros exactly when the helper says every address."""
    text = host[1:-1] if host.startswith("[") else host
    try:
        infos = socket.getaddrinfo(text, 0, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE | socket.AI_NUMERICHOST)
    except socket.gaierror:
        assert not binds_every_address(host)  # not numeric: a name, judged by spelling only
        return
    resolved = {info[4][0].split("%", 1)[0] for info in infos}
    assert (resolved <= {"0.0.0.0", "::", "::ffff:0.0.0.0"}) == binds_every_address(host), resolved


def _ctx(host: str, **data):
    hosts = [
        (n, {"hardware": "cpu-lab", "ssh_hostname": a, "nic": "eth0", **data})
        for n, a in (("n0", "10.0.0.10"), ("n1", "10.0.0.11"))
    ]
    return build_context("tiny", host, hosts)


@pytest.mark.parametrize("bind", ["::0", "0", "0:0:0:0:0:0:0:0", "0.0"])
def test_open_bind_without_a_key_is_refused_on_every_spelling(bind):
    ctx = _ctx("n0", recipe="tiny-cpu-tp2")
    rank0 = ctx.processes[0]
    rank0 = type(rank0)(**{**rank0.__dict__, "bind": bind})
    with pytest.raises(OperationError, match="to every network without an API key"):
        ss.refuse_open_bind(ctx, rank0, {})
    ss.refuse_open_bind(ctx, rank0, {"IRONSERVE_API_KEY": "k"})  # keyed: fine


@pytest.mark.parametrize("bind", ["::0", "0"])
def test_lint_names_every_address_not_the_nodes_own(bind):
    recipe = catalogue.get_recipe("tiny-cpu-tp2")
    recipe = recipe.model_copy(update={"server": recipe.server.model_copy(update={"host": bind})})
    found = [f for f in lint_recipe(recipe, catalogue.hardware_profiles()) if f.rule == "bind-without-api-key"]
    assert found and all(
        "own address" not in f.message and f"--host {bind} (every address)" in f.message for f in found
    ), [f.message for f in found]


def test_health_is_probed_on_the_loopback_for_every_spelling():
    ctx = _ctx("n0", recipe="tiny-cpu-tp2")
    rank0 = ctx.processes[0]
    for bind in ("::0", "0", "0.0.0.0"):
        assert type(rank0)(**{**rank0.__dict__, "bind": bind}).local_url("/health").startswith("http://127.0.0.1:")
