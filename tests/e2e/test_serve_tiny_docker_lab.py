"""End to end on the lab: the Docker path serves for real, two cpu-lab hosts, one server per host.

`ironserve lab up --nodes 2 --hardware cpu-lab` (real dockerd in the hosts, the lab registry on the bridge, the CPU
SGLang runtime image built once per machine and pushed there), `ironserve lock tiny-cpu-docker --inventory
inventories/lab.py` (tag -> digest in the registry the inventory names; the lock file beside the recipe, in a copy of
the catalogue: the checkout's recipes/ stay as they are for the tests running beside this one), then
the production deploy `pyinfra -y inventories/lab.py deploys/tiny.py --data recipe=tiny-cpu-docker`: Debian's
docker.io from the lab repository, the recipe's derived image built ONCE, on the deployment's first host, from the
locked base, pushed to the lab registry (the inventory's docker_derived_registry, verified with the lab CA), and
pulled by its digest on both hosts; units, health gates. Then: the docker CLI is a real binary and dockerd answers;
both containers run one image ID, pulled by digest from the lab registry, built by one host only; the audit checks
that digest on each host; a chat completion answers 200 on each host; a SIGKILL of the engine inside the container
is recovered by systemd; a second run plans no change (nothing built or pushed again).
"""

from __future__ import annotations

import json
import os
import time

import pytest
from ironserve_lab import registry as lab_registry
from ironserve_lab.state import lab_dir

from ironserve.registry import Registry

from ..catalogue_copy import unlocked_catalogue
from .cpu3.fleet import changes, chat
from .labcli import ironserve, lab_down, lab_status, lab_up, pyinfra, run_log, ssh

pytestmark = pytest.mark.lab

RECIPE = "tiny-cpu-docker"
UNIT = f"sglang-{RECIPE}-server"
IMAGE = "ironserve-lab/sglang-cpu:0.5.23"
DEPLOY = ("deploys/tiny.py", "--data", f"recipe={RECIPE}")
DERIVED = f"lab-derived/{RECIPE}"  # the repository under the inventory's docker_derived_registry
DOCKERFILE = f"/etc/ironserve/images/{RECIPE}/Dockerfile"
WAITS = ("building", "pushing", "pulling")  # what the deploy times (roles/common.py LongCommand)


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory):
    """A copy of the catalogue for this module's commands (IRONSERVE_CATALOGUE): `ironserve lock` writes the lock
    beside the recipe, and the offline tests run beside the lab's read the checkout's recipes/ unlocked."""
    recipes = unlocked_catalogue(tmp_path_factory.mktemp("catalogue"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("IRONSERVE_CATALOGUE", str(recipes))
        yield recipes


@pytest.fixture(scope="module")
def lock(catalogue):
    return catalogue / f"{RECIPE}.lock.json"


@pytest.fixture(scope="module")
def lab(catalogue):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    started = time.monotonic()
    up = lab_up(2, "cpu-lab")
    status = lab_status()
    try:
        yield {"hosts": status["hosts"], "status": status, "up_s": time.monotonic() - started, "up_output": up.stderr}
    finally:
        lab_down()


@pytest.fixture(scope="module")
def deployed(lab, lock):
    out = ironserve("lock", RECIPE, "--inventory", "inventories/lab.py", timeout=300)
    lab["lock"] = json.loads(lock.read_text())
    # the lab registry keeps what was pushed across `lab down`: this deploy must build and push it itself (the
    # repository's layers stay: only a first push ever uploads the base's)
    lab_registry.forget_tags(lab_dir(), DERIVED)
    started = time.monotonic()
    lab["first_plan"] = json.loads(pyinfra(*DEPLOY, "--dry", "--json", timeout=600).stdout)["plan"]
    lab["plan_s"] = time.monotonic() - started
    started = time.monotonic()
    first = pyinfra("-y", *DEPLOY, timeout=2400)
    lab["deploy_s"] = time.monotonic() - started
    lab["deploy_output"] = first.stdout + first.stderr
    built = [line for line in lab["up_output"].splitlines() if "runtime image" in line and "built in" in line]
    steps = [
        line.strip()
        for line in lab["deploy_output"].splitlines()
        if any(f"{what} 10.213." in line or f"{what} {lab['status']['registry']}" in line for what in WAITS)
        and line.rstrip().endswith("s")
    ]
    print(
        f"\n{out.stdout.strip()}\nlab up {lab['up_s']:.0f}s{' (' + built[0].strip() + ')' if built else ''}, "
        f"first plan (--dry) {lab['plan_s']:.0f}s, first deploy {lab['deploy_s']:.0f}s\n" + "\n".join(steps)
    )
    return lab


def test_lock_pins_the_tag_to_the_registry_digest(deployed, lock):
    locked = deployed["lock"]["docker"]
    status = deployed["status"]
    assert locked["image"] == IMAGE and locked["registry"] == status["registry"]
    repo, _, tag = IMAGE.rpartition(":")
    assert Registry(status["registry"], status["registry_ca"]).digest(repo, tag) == locked["digest"]
    # unpinned and unlocked, the deploy refuses before touching a host
    lock.rename(lock.with_suffix(".held"))
    try:
        out = pyinfra(*DEPLOY, "--dry", check=False, timeout=300)
    finally:
        lock.with_suffix(".held").rename(lock)
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


def _derived_digest(deployed) -> tuple[str, str]:
    """(the derived image's repository, the digest the lab registry gives its content-addressed tag)."""
    status, builder = deployed["status"], deployed["hosts"][0]
    sha = ssh(builder, f"sha256sum {DOCKERFILE}").stdout.split()[0]
    digest = Registry(status["registry"], status["registry_ca"]).digest(DERIVED, f"dockerfile-{sha}")
    assert digest, f"{DERIVED}:dockerfile-{sha} is not in the lab registry"
    return f"{status['registry']}/{DERIVED}", digest


def test_one_build_one_image_pulled_by_digest(deployed):
    """Both containers run one image ID: the derived image the first host built and pushed, pulled by its digest
    from the lab registry on both hosts (the units name that digest); the other host built nothing."""
    repo, digest = _derived_digest(deployed)
    ref = f"{repo}@{digest}"
    image_ids = []
    for host in deployed["hosts"]:
        assert ssh(host, f"systemctl is-active {UNIT}").stdout.strip() == "active"
        running = ssh(host, f"docker inspect --format '{{{{.Config.Image}}}} {{{{.Image}}}}' {UNIT}").stdout.split()
        assert running[0] == ref, running
        image_ids.append(running[1])
        pulled = json.loads(ssh(host, f"docker image inspect --format '{{{{json .RepoDigests}}}}' {ref}").stdout)
        assert ref in pulled, pulled
        assert ref in ssh(host, f"cat /etc/systemd/system/{UNIT}.service").stdout
        # the patch's RUN lines ran in the build
        mark = ssh(host, f"docker exec {UNIT} cat /etc/ironserve-derived").stdout
        assert mark == "tiny-cpu-docker derived image\n", mark
    assert len(set(image_ids)) == 1, image_ids
    builder, other = deployed["hosts"]
    # one build: the builder's Dockerfile and local tag; the other host only pulled the digest (no base image either)
    assert ssh(builder, f"test -s {DOCKERFILE}", check=False).returncode == 0
    assert ssh(other, f"test -e {DOCKERFILE}", check=False).returncode != 0
    base = f"{IMAGE.rpartition(':')[0]}@{deployed['lock']['docker']['digest']}"
    assert ssh(other, f"docker image inspect {base}", check=False).returncode != 0
    builds = [line for line in deployed["deploy_output"].splitlines() if f"building {repo}:" in line]
    assert builds and all(f"[{builder['name']}]" in line for line in builds), builds
    # the derived image is the locked base plus the patch layers
    layers = {
        name: json.loads(ssh(builder, f"docker image inspect --format '{{{{json .RootFS.Layers}}}}' {name}").stdout)
        for name in (base, ref)
    }
    assert layers[ref][: len(layers[base])] == layers[base], layers
    # the push sent only the patches' layers: the base's were mounted from where the registry holds the base (the
    # Docker Hub name through it as the hosts' mirror), never gzipped and uploaded again
    repository = IMAGE.rpartition(":")[0]
    mounted = f"{len(layers[base])} of {len(layers[base])} base layer(s) mounted from {repository} in the registry"
    assert mounted in deployed["deploy_output"], run_log(deployed["deploy_output"])
    registry = Registry(deployed["status"]["registry"], deployed["status"]["registry_ca"])
    derived_path = repo.partition("/")[2]
    for layer in registry.layers(repository, deployed["lock"]["docker"]["digest"]):
        assert registry.has_blob(derived_path, layer), layer
    print(f"\n{ref}: image {image_ids[0][:19]} on both hosts, built on {builder['name']} only; {mounted}")


def test_the_first_plan_says_one_host_builds_and_every_host_pulls(deployed):
    """The plan of the first deploy (--dry) is the run's: the builder builds and pushes, both hosts pull the image
    this run pushes (named by its placeholder until then), both units change."""
    builder, other = (h["name"] for h in deployed["hosts"])
    planned = {op["name"]: op["hosts_with_change"] for op in deployed["first_plan"]}
    pushed = [name for name in planned if f"Derived image {deployed['status']['registry']}/" in name]
    assert [planned[name] for name in pushed if "built and pushed by" in name] == [[builder]], pushed
    assert sorted(next(planned[n] for n in pushed if n.endswith("pulled by digest"))) == [builder, other]
    assert not [name for name in planned if "(built on this host)" in name]


def test_the_audit_checks_the_digest_on_each_host(deployed):
    repo, digest = _derived_digest(deployed)
    audit = ironserve(
        "audit", "inventories/lab.py", "deploys/tiny.py", "--data", f"recipe={RECIPE}", "--format", "json", check=False
    )
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-2000:]
    results = json.loads(audit.stdout)["results"]
    for host in deployed["hosts"]:
        mine = {r["check"]: r for r in results if r["host"] == host["name"]}
        assert mine[f"container-image:{UNIT}"]["ok"], mine[f"container-image:{UNIT}"]
        assert mine[f"derived-image:{repo}@{digest[:19]}"]["ok"]
        assert not [c for c in mine if c.startswith("image:")], "a host that pulls the derived image needs no base"


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
