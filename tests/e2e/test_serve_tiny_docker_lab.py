"""End to end on the lab: the Docker path serves for real, two cpu-lab hosts, one server per host.

`ironserve lab up --nodes 2 --hardware cpu-lab` (real dockerd in the hosts, the lab registry on the bridge, the CPU
SGLang runtime image built once per machine and pushed there), `ironserve lock tiny-cpu-docker --inventory
inventories/lab.py` (tag -> digest in the registry the inventory names; the lock file beside the recipe), then
the production deploy `pyinfra -y inventories/lab.py deploys/tiny.py --data recipe=tiny-cpu-docker`: Debian's
docker.io from the lab repository, the image pulled by its locked digest through the registry mirror, the derived
image built with its RUN lines executed, units, health gates. Then: the docker CLI is a real binary and dockerd
answers; both hosts run the same image at the locked digest; a chat completion answers 200 on each host; a
SIGKILL of the engine inside the container is recovered by systemd; a second run plans no change.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from ironserve.registry import Registry

from .cpu3.fleet import changes, chat
from .labcli import ROOT, ironserve, lab_down, lab_up, pyinfra, ssh

pytestmark = pytest.mark.lab

RECIPE = "tiny-cpu-docker"
UNIT = f"sglang-{RECIPE}-server"
IMAGE = "ironserve-lab/sglang-cpu:0.5.23"
LOCK = ROOT / "recipes" / f"{RECIPE}.lock.json"
DEPLOY = ("deploys/tiny.py", "--data", f"recipe={RECIPE}")


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    started = time.monotonic()
    up = lab_up(2, "cpu-lab")
    status = json.loads(ironserve("lab", "status", "--format", "json").stdout)
    try:
        yield {"hosts": status["hosts"], "status": status, "up_s": time.monotonic() - started, "up_output": up.stderr}
    finally:
        LOCK.unlink(missing_ok=True)
        lab_down()


@pytest.fixture(scope="module")
def deployed(lab):
    out = ironserve("lock", RECIPE, "--inventory", "inventories/lab.py", timeout=300)
    lab["lock"] = json.loads(LOCK.read_text())
    started = time.monotonic()
    first = pyinfra("-y", *DEPLOY, timeout=2400)
    lab["deploy_s"] = time.monotonic() - started
    lab["deploy_output"] = first.stdout + first.stderr
    built = [line for line in lab["up_output"].splitlines() if "runtime image" in line and "built in" in line]
    print(
        f"\n{out.stdout.strip()}\nlab up {lab['up_s']:.0f}s{' (' + built[0].strip() + ')' if built else ''}, "
        f"first deploy {lab['deploy_s']:.0f}s"
    )
    return lab


def test_lock_pins_the_tag_to_the_registry_digest(deployed):
    lock = deployed["lock"]["docker"]
    status = deployed["status"]
    assert lock["image"] == IMAGE and lock["registry"] == status["registry"]
    repo, _, tag = IMAGE.rpartition(":")
    assert Registry(status["registry"], status["registry_ca"]).digest(repo, tag) == lock["digest"]
    # unpinned and unlocked, the deploy refuses before touching a host
    LOCK.rename(LOCK.with_suffix(".held"))
    try:
        out = pyinfra(*DEPLOY, "--dry", check=False, timeout=300)
    finally:
        LOCK.with_suffix(".held").rename(LOCK)
    assert out.returncode != 0 and "no lock file pins it" in out.stdout + out.stderr, out.stderr[-2000:]


def test_docker_is_the_real_engine(deployed):
    for host in deployed["hosts"]:
        cli = ssh(host, "head -c 4 /usr/bin/docker | od -An -c | tr -d ' '; dpkg -S /usr/bin/docker").stdout
        assert cli.splitlines()[0] == "177ELF" and "docker.io: /usr/bin/docker" in cli, cli
        info = ssh(
            host,
            "docker info --format '{{.ServerVersion}} {{.Driver}} {{.CgroupVersion}} {{json .RegistryConfig.Mirrors}}'",
        ).stdout.split(" ", 3)
        assert info[0].startswith("20.10.") and info[1] == "overlay2" and info[2] == "2", info
        assert json.loads(info[3]) == [f"https://{deployed['status']['registry']}/"], info


def test_both_hosts_run_the_locked_image(deployed):
    digest = deployed["lock"]["docker"]["digest"]
    repo = IMAGE.rpartition(":")[0]
    layers = []
    for host in deployed["hosts"]:
        assert ssh(host, f"systemctl is-active {UNIT}").stdout.strip() == "active"
        pulled = json.loads(
            ssh(host, f"docker image inspect --format '{{{{json .RepoDigests}}}}' {repo}@{digest}").stdout
        )
        assert f"{repo}@{digest}" in pulled, pulled
        running = ssh(host, f"docker inspect --format '{{{{.Config.Image}}}} {{{{.Image}}}}' {UNIT}").stdout.split()
        assert running[0] == f"ironserve/{RECIPE}:derived", running
        # the derived image is the locked base plus the patch layers: base layers identical on both hosts
        base = json.loads(
            ssh(host, f"docker image inspect --format '{{{{json .RootFS.Layers}}}}' {repo}@{digest}").stdout
        )
        derived = json.loads(
            ssh(host, f"docker image inspect --format '{{{{json .RootFS.Layers}}}}' {running[1]}").stdout
        )
        assert derived[: len(base)] == base, (base, derived)
        layers.append(base)
        # the patch's RUN lines ran in the build
        mark = ssh(host, f"docker exec {UNIT} cat /etc/ironserve-derived").stdout
        assert mark == "tiny-cpu-docker derived image\n", mark
    assert layers[0] == layers[1]


def test_chat_completion_on_each_host(deployed):
    for host in deployed["hosts"]:
        code, text = 0, ""
        for _ in range(10):  # bounded
            code, text = chat(f"http://{host['address']}:30000")
            if code == 200:
                break
            time.sleep(3)
        assert code == 200 and text.strip(), f"{host['name']}: {code} {text}"


def test_engine_killed_inside_the_container_is_recovered(deployed):
    host = deployed["hosts"][1]
    pid = ssh(host, f"docker inspect --format '{{{{.State.Pid}}}}' {UNIT}").stdout.strip()
    assert pid and pid != "0"
    comm = ssh(host, f"cat /proc/{pid}/cmdline | tr '\\0' ' '").stdout
    assert "sglang.launch_server" in comm, comm
    before = ssh(host, f"systemctl show -p NRestarts --value {UNIT}").stdout.strip()
    killed = time.monotonic()
    ssh(host, f"kill -KILL {pid}")
    recovered, state = None, None
    while time.monotonic() - killed < 420:
        state = ssh(
            host,
            f"systemctl is-active {UNIT}; systemctl show -p NRestarts --value {UNIT}; "
            "curl -s -o /dev/null -m 5 -w '%{http_code}' http://127.0.0.1:30000/health",
            check=False,
        )
        lines = state.stdout.split()
        if len(lines) >= 3 and lines[0] == "active" and lines[1] != before and lines[2] == "200":
            recovered = time.monotonic() - killed
            break
        time.sleep(3)
    assert recovered is not None, f"{UNIT} not restarted and healthy within 420s: {state.stdout if state else ''}"
    code, text = chat(f"http://{host['address']}:30000")
    assert code == 200, text
    print(f"\n{UNIT} on {host['name']}: engine SIGKILLed inside the container, healthy again after {recovered:.0f}s")


def test_second_run_plans_no_change(deployed):
    out = pyinfra(*DEPLOY, "--dry", "--json", timeout=600)
    plan = json.loads(out.stdout)["plan"]
    assert plan, "the dry run planned no operation at all"
    assert not changes(plan), changes(plan)
