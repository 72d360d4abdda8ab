"""The shared 3-host cpu-lab of tests/e2e/cpu3: one bring-up and one first deploy for every module here.

`ironserve lab up --nodes 3 --hardware cpu-lab` (lab1 the router host, lab2 and lab3 the two replicas of
recipes/tiny-cpu.yaml), or, under scripts/test, three hosts of the 7-host cpu-lab it shares between modules
(IRONSERVE_LAB_HOSTS: the first named the router host), then the production deploy. The fixtures are package-scoped, so the serving, metrics,
security and day-two modules of this package share them; modules run in file-name order, and a module that changes
the deployment leaves it serving for the next (the day-two module, which switches recipes, runs last).

Every deploy of the package takes the weights from the lab's hub (IRONSERVE_LAB_MODEL_SOURCE=hub, which the lab
inventory reads: model_source=hub, hf_endpoint the hub on the bridge): the first one downloads them on lab2 and
fetches them from lab2 on lab3 (roles/weights_peers.py); the hub's byte count at lab up is kept for the weights
module.
"""

from __future__ import annotations

import os
import time

import pytest

from ..labcli import ROOT, lab_down, lab_status, lab_up, pyinfra

HUB_WEIGHTS = "IRONSERVE_LAB_MODEL_SOURCE"  # read by inventories/lab.py


@pytest.fixture(scope="package")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    started = time.monotonic()
    lab_up(3, "cpu-lab")
    status = lab_status()
    os.environ[HUB_WEIGHTS] = "hub"
    try:
        yield {"hosts": status["hosts"], "up_s": time.monotonic() - started, "hub_at_up": status["hub"]}
    finally:
        os.environ.pop(HUB_WEIGHTS, None)
        lab_down()


@pytest.fixture(scope="package")
def deployed(lab):
    started = time.monotonic()
    first = pyinfra("-y", "deploys/tiny.py")
    lab["deploy_s"] = time.monotonic() - started
    lab["deploy_output"] = first.stdout + first.stderr
    # kept for a failure's post-mortem: the assertions quote only its tail
    (ROOT / "build").mkdir(exist_ok=True)
    (ROOT / "build" / "cpu3-first-deploy.log").write_text(lab["deploy_output"])
    print(f"\nlab up {lab['up_s']:.0f}s, first deploy {lab['deploy_s']:.0f}s")
    return lab
