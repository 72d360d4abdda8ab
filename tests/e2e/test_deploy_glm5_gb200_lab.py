"""End to end on the lab: GLM-5 disaggregated on five stand-in GB200 hosts (one NVLink domain).

`pyinfra -y inventories/lab.py deploys/glm5.py` takes fresh hosts through the real-host NVIDIA steps against
stand-ins that fail like the real packages (lab/ironserve_lab/standins.py): the driver's DKMS build needs the running
kernel's headers, the driver refuses while nouveau holds the GPUs, persistenced's packaged unit runs without
persistence mode, nvidia-imex reads its nodes config, nvidia-ctk writes the CDI spec. The real Docker engine
(Debian's docker.io) pulls the stand-in image of the Dynamo runtime (lab/ironserve_lab/gpu_images.py) from the lab
registry by the site lock's digest, under the lab registry's name for it (Docker mirrors Docker Hub names only).
Then a host reporting another NVLink clique is refused before any change.
About 8 minutes cold on 2 cores (lab up of 5 hosts, two deploys, a dry run, one refused plan, one audit).
"""

from __future__ import annotations

import json
import shlex

import pytest

from ironserve.units import UNIT_DIR, staged_path

from . import labcli
from .labcli import ironserve, lab_down, pyinfra

pytestmark = pytest.mark.lab

RECIPE = "glm5-nvfp4-gb200-disagg"
IMAGE = "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.1.1-cuda13"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    hosts, api_key_file = labcli.up_with_api_key(tmp_path_factory, 5, "gb200", timeout=2400)
    # the router runs (and is probed) in its own venv with the pinned sglang-router: the Dynamo runtime image has
    # no sglang_router (roles/router_runtime.py)
    data = ["--data", f"api_key_file={api_key_file}"]
    try:
        pyinfra("-y", "deploys/glm5.py", *data, timeout=2400)
        yield {"hosts": hosts, "data": data}
    finally:
        lab_down()


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
    plan = json.loads(pyinfra("deploys/glm5.py", "--dry", "--json", *lab["data"], timeout=1200).stdout)["plan"]
    changed = [
        f"{op['name']} on {op['hosts_with_change'] + op['hosts_with_conditional_change']}"
        for op in plan
        if op["hosts_with_change"] or op["hosts_with_conditional_change"]
    ]
    assert plan and not changed, changed


def test_audit_is_clean(lab):
    out = ironserve("audit", "inventories/lab.py", "deploys/glm5.py", "--format", "json", *lab["data"], check=False)
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
    refused = pyinfra("-y", "deploys/glm5.py", *lab["data"], check=False, timeout=1200)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "NVLink clique" in output and f"{odd['name']}: NVLink clique" in output
    assert sh(first, "test -e /etc/modprobe.d/ironserve-blacklist-nouveau.conf", check=False).returncode != 0
    # the same rack again: the deploy goes through and repairs the drift
    sh(odd, "rm /etc/ironlab/fabric")
    pyinfra("-y", "deploys/glm5.py", *lab["data"], timeout=1200)
    assert "blacklist nouveau" in sh(first, "cat /etc/modprobe.d/ironserve-blacklist-nouveau.conf").stdout
