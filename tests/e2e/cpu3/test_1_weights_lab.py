"""Weights once, on the lab: the package's deploys took tiny-cpu's weights from the lab's hub (model_source=hub,
conftest.py), the first engine host (lab2) downloading them with the runtime's `hf download`, lab3 fetching them
from it over the lab bridge (roles/weights_peers.py, files/bin/ironserve_weights_peer.py).

Runs after the serving module (its deploys are reruns for the weights). Checks: the hub served at most 1.2x the
model's bytes over every deploy so far (`ironserve lab status`: hub.bytes_served since lab up against
hub.model_bytes), every engine host's weights verify against the hub's hashes (and the model's own sha256 manifest),
the deploy said its progress (bytes, rate, ETA), and a rerun plans no change for the weights and reads nothing from
the hub. The replicas serving is the serving module's.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from ironserve.units import WEIGHTS_PEER

from ..labcli import ironserve, pyinfra, ssh
from .fleet import changes

pytestmark = pytest.mark.lab

REPO = "ironserve-lab/tiny-llama"
MODEL = "/var/lib/ironserve/models/tiny-llama"  # recipes/tiny-cpu.yaml model.path (no model_root with the hub)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def hub_now() -> dict:
    return json.loads(ironserve("lab", "status", "--format", "json").stdout)["hub"]


def served_since_up(lab) -> tuple[int, int]:
    """(bytes the hub served for the tiny model since lab up, the model's bytes)."""
    now = hub_now()
    before = lab["hub_at_up"]["repos"].get(REPO, {}).get("bytes_served", 0)
    return now["repos"][REPO]["bytes_served"] - before, now["repos"][REPO]["model_bytes"]


def test_the_hub_is_read_about_once_for_every_host(deployed):
    served, model = served_since_up(deployed)
    engines = len(deployed["hosts"]) - 1
    print(
        f"\nhub: {served} bytes served for {engines} engine hosts, the model is {model} bytes "
        f"({served / model:.2f}x; each host downloading would be {engines}x)"
    )
    assert model > 0 and model <= served <= 1.2 * model, (served, model)


def test_every_engine_hosts_weights_verify_against_the_hubs_hashes(deployed):
    config = shlex.quote(json.dumps({"root": MODEL, "repo": REPO, "revision": "main"}))
    for host in deployed["hosts"][1:]:
        out = ssh(host, f"{WEIGHTS_PEER} verify {config}", check=False)
        assert out.returncode == 0, f"{host['name']}: {out.stdout}{out.stderr}"
        assert "7 files verified against the hub's hashes" in out.stdout, out.stdout
        assert ssh(host, f"cd {MODEL} && sha256sum -c --quiet ironserve-manifest.sha256", check=False).returncode == 0
        assert ssh(host, "systemctl list-units --all --no-legend 'ironserve-weights-peer-*'").stdout.strip() == ""
    router = deployed["hosts"][0]
    assert ssh(router, f"test -e {MODEL}", check=False).returncode != 0  # the router host loads no weights


def test_the_first_deploy_downloaded_once_fetched_from_the_peer_and_said_its_progress(deployed):
    out = ANSI.sub("", deployed["deploy_output"])
    # the first engine host (inventory order, whatever order pyinfra planned the hosts in) reads the hub, the other
    # fetches from it
    engines = {h["name"]: h["address"] for h in deployed["hosts"][1:3]}
    readers = [name for name in engines if re.search(rf"\[{name}\].*weights from the hub \(", out)]
    seed, peer = list(engines)
    assert readers == [seed], (readers, out[-4000:])
    hub_line = re.search(rf"\[{seed}\].*weights from the hub \({REPO}\): .* \(100%\), .*/s, ETA \S+", out)
    assert hub_line, out[-4000:]
    fetch_line = re.search(rf"\[{peer}\].*weights from {engines[seed]}: .* \(100%\), .*/s, ETA", out)
    assert fetch_line, out[-4000:]
    fetched = re.search(rf"\[{peer}\].*weights: fetched from {seed} in ([0-9.]+)s", out)
    assert fetched, out[-4000:]
    assert not re.search(rf"\[{peer}\].*weights from the hub", out)  # the peer never read the hub
    print(f"\n{hub_line.group(0)}\n{fetch_line.group(0)}\n{peer}: fetched from {seed} in {fetched.group(1)}s")


def test_a_rerun_plans_no_weights_change_and_reads_nothing_from_the_hub(deployed):
    before, _model = served_since_up(deployed)
    plan = json.loads(pyinfra("deploys/tiny.py", "--dry", "--json", timeout=600).stdout)["plan"]
    weights = [op for op in plan if "eights" in op["name"]]
    assert weights and not changes(weights), changes(weights)
    assert served_since_up(deployed)[0] == before
