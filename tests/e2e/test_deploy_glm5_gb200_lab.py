"""End to end on the lab: GLM-5 disaggregated on five stand-in GB200 hosts (one NVLink domain).

`pyinfra -y inventories/lab.py deploys/glm5.py` takes fresh hosts through the real-host NVIDIA steps against
stand-ins that fail like the real packages (lab/ironserve_lab/standins.py): the driver's DKMS build needs the running
kernel's headers, the driver refuses while nouveau holds the GPUs, persistenced's packaged unit runs without
persistence mode, nvidia-imex reads its nodes config, nvidia-ctk writes the CDI spec. The real Docker engine
(Debian's docker.io) pulls the stand-in image of the Dynamo runtime (lab/ironserve_lab/gpu_images.py) from the lab
registry by the site lock's digest, under the lab registry's name for it (Docker mirrors Docker Hub names only).
The router's own venv (on the router host's python3, beside the docker runtime) is locked first (`ironserve lock
--router` against the lab index, into a copy of the catalogue) and installed hash-checked under require_locks.
Then a host reporting another NVLink clique is refused before any change.
About 8 minutes cold on 2 cores (lab up of 5 hosts, two deploys, a dry run, one refused plan, one audit).
"""

from __future__ import annotations

import json
import shlex

import pytest

from ironserve.units import UNIT_DIR, staged_path

from ..catalogue_copy import unlocked_catalogue
from . import labcli
from .labcli import ironserve, lab_down, pyinfra

pytestmark = pytest.mark.lab

RECIPE = "glm5-nvfp4-gb200-disagg"
IMAGE = "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.1.1-cuda13"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    recipes = unlocked_catalogue(tmp_path_factory.mktemp("catalogue"))
    env = {"IRONSERVE_CATALOGUE": str(recipes)}
    try:
        hosts, api_key_file = labcli.up_with_api_key(tmp_path_factory, 5, "gb200", timeout=2400)
        # the router runs (and is probed) in its own venv with the pinned sglang-router: the Dynamo runtime image
        # has no sglang_router (roles/router_runtime.py); its resolution locked with hashes for the hosts' machine
        # and python3 (Debian 12's 3.11), so require_locks lets the deploy through
        lock = ["lock", RECIPE, "--router", "--arch", "x86_64", "--router-python", "3.11"]
        ironserve(*lock, "--inventory", "inventories/lab.py", env=env)
        data = ["--data", f"api_key_file={api_key_file}", "--data", "require_locks=true"]
        pyinfra("-y", "deploys/glm5.py", *data, timeout=2400, env=env)
        yield {"hosts": hosts, "data": data, "env": env, "recipes": recipes}
    finally:
        lab_down()


def test_the_router_venv_is_installed_hash_checked_from_the_lock(lab):
    lock = json.loads((lab["recipes"] / f"{RECIPE}.lock.json").read_text())
    locked = lock["router"]["platforms"]["x86_64"]["3.11"]
    assert "sglang-router==0.3.2" in locked and len(locked) > 5  # its dependencies too (fastapi, uvicorn, aiohttp...)
    assert "docker" not in lock  # --router: the image stays the site lock's
    venv = "/opt/ironserve/venvs/sglang-router-0.3.2"
    routers = [h for h in lab["hosts"] if sh(h, f"test -d {venv}", check=False).returncode == 0]
    assert len(routers) == 1, [h["name"] for h in routers]
    record = sh(routers[0], f"cat {venv}/ironserve-requirements.txt").stdout
    assert "# --require-hashes" in record, record
    constraints = sh(routers[0], f"cat {venv}/ironserve-requirements.lock.txt").stdout
    assert all(f"--hash={h}" in constraints for h in locked["sglang-router==0.3.2"])
    listing = sh(routers[0], f"ls {venv}/lib/python3.11/site-packages").stdout.split()
    installed = {n.split("-")[0].lower().replace("_", "-") for n in listing if n.endswith(".dist-info")}
    assert installed <= {req.split("==")[0] for req in locked}, installed


def sh(host: dict, command: str, check: bool = True):
    return labcli.ssh(host, command, check=check)


def engine_unit(host: dict) -> tuple[str, str]:
    """The host's engine unit (the prefill node's or a decode rank's) and its file: staged, as launch=false
    leaves it (roles/sglang_service.py)."""
    for role in ("prefill", "decode"):
        unit = f"sglang-{RECIPE}-{role}.service"
        path = staged_path(f"{UNIT_DIR}/{unit}")
        if sh(host, f"test -e {path}", check=False).returncode == 0:
            return unit, path
    raise AssertionError(f"{host['name']}: no engine unit")


def test_done_when_on_every_host(lab):
    addresses = [h["address"] for h in lab["hosts"]]
    lock = json.loads(ironserve("lab", "status", "--format", "json").stdout)["image_lock"]
    site = json.loads(open(lock).read())["docker"][IMAGE]
    assert site["replaces"] is None and site["repository"].endswith("/nvidia/ai-dynamo/sglang-runtime")
    pinned = f"{site['repository']}@{site['digest']}"
    for h in lab["hosts"]:
        # module prerequisites of the running kernel (the stand-in DKMS build needs them, and ran)
        assert (
            sh(
                h,
                "test -e /lib/modules/$(uname -r)/build && ls /var/lib/dkms/nvidia/*/$(uname -r)/*/module/"
                "nvidia.ko >/dev/null && echo ok",
            ).stdout.strip()
            == "ok"
        )
        assert "blacklist nouveau" in sh(h, "cat /etc/modprobe.d/ironserve-blacklist-nouveau.conf").stdout
        assert "nvidia-open-580" in sh(h, "apt-mark showhold").stdout.split()
        assert "Package-Blacklist" in sh(h, "cat /etc/apt/apt.conf.d/51ironserve-hold-kernel-and-nvidia").stdout
        assert (
            sh(h, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader | sort -u").stdout.strip() == "Enabled"
        )
        # IMEX: enabled, READY, nodes config naming all 5 hosts, every peer connected; channel 0 provided
        assert sh(h, "systemctl is-enabled nvidia-imex").stdout.strip() == "enabled"
        assert sh(h, "nvidia-imex-ctl -q").stdout.strip() == "READY"
        assert sh(h, "cat /etc/nvidia-imex/nodes_config.cfg").stdout.split() == addresses
        assert sh(h, "nvidia-imex-ctl -N").stdout.count(" - C") == 5
        assert sh(h, "test -c /dev/nvidia-caps-imex-channels/channel0 && echo ok").stdout.strip() == "ok"
        # GPUs by CDI: the unit asks for nvidia.com/gpu=all, never --gpus (Debian's Docker 20.10 predates CDI: the
        # device flags are covered by the fixture tests), and runs the site-locked image from the lab registry
        unit, path = engine_unit(h)
        text = sh(h, f"cat {path}").stdout
        assert "--device nvidia.com/gpu=all" in text and "--gpus" not in text
        assert "nvidia.com/gpu=all" in sh(h, "nvidia-ctk cdi list").stdout.split()
        assert pinned in text
        probe = f"docker run --rm --network none --entrypoint python3 {pinned} -c {shlex.quote('print(42)')}"
        assert sh(h, probe).stdout.strip() == "42"
        assert "After=nvidia-imex.service" in sh(h, f"cat {UNIT_DIR}/{unit}.d/ironserve-imex.conf").stdout


def test_second_run_plans_no_change(lab):
    out = pyinfra("deploys/glm5.py", "--dry", "--json", *lab["data"], timeout=1200, env=lab["env"])
    plan = json.loads(out.stdout)["plan"]
    changed = [
        f"{op['name']} on {op['hosts_with_change'] + op['hosts_with_conditional_change']}"
        for op in plan
        if op["hosts_with_change"] or op["hosts_with_conditional_change"]
    ]
    assert plan and not changed, changed


def test_audit_is_clean(lab):
    audit = ["audit", "inventories/lab.py", "deploys/glm5.py", "--format", "json", *lab["data"]]
    out = ironserve(*audit, check=False, env=lab["env"])
    bad = [r for r in json.loads(out.stdout)["results"] if not r["ok"]]
    assert out.returncode == 0, bad
    ids = {r["check"] for r in json.loads(out.stdout)["results"]}
    assert {
        "imex:ready",
        "imex:channel0",
        "gpu:persistence-mode",
        "kernel:module-prerequisites",
        "cdi:nvidia.com/gpu=all",
    } <= ids


def test_other_clique_refused_before_any_change(lab):
    first, odd = lab["hosts"][0], lab["hosts"][3]
    # drift the deploy would repair on the first host (the loaded driver stays loaded until a reboot)
    sh(first, "rm /etc/modprobe.d/ironserve-blacklist-nouveau.conf")
    sh(odd, "printf 'clique_id=9\\n' > /etc/ironlab/fabric")
    refused = pyinfra("-y", "deploys/glm5.py", *lab["data"], check=False, timeout=1200, env=lab["env"])
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "NVLink clique" in output and f"{odd['name']}: NVLink clique" in output
    assert sh(first, "test -e /etc/modprobe.d/ironserve-blacklist-nouveau.conf", check=False).returncode != 0
    # the same rack again: the deploy goes through and repairs the drift
    sh(odd, "rm /etc/ironlab/fabric")
    pyinfra("-y", "deploys/glm5.py", *lab["data"], timeout=1200, env=lab["env"])
    assert "blacklist nouveau" in sh(first, "cat /etc/modprobe.d/ironserve-blacklist-nouveau.conf").stdout
