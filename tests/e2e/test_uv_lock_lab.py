"""A uv recipe installed from its lock, hash-checked, on lab hosts (issue 32, supply chain).

The Atlas recipe glm5.1-w4a8-a3-pd-mixed-16 on two lab hosts (x86_64 stand-ins of its aarch64 profile). Without a
lock, the deploy under require_locks=true is refused before any host is touched, naming the recipe and the fix;
without require_locks its plan warns, naming the recipe and the fix, and plans the runtime's install unchecked (every
uv deploy of the other lab modules installs so: CI does not repeat that install here). Then `ironserve lock` resolves
its runtime against the lab index for the hosts' machine (--arch x86_64: every distribution with the sha256 of its
files), into a copy of the catalogue (IRONSERVE_CATALOGUE; the repository stays untouched); the production deploy
with require_locks=true installs exactly that set with `uv pip install --require-hashes --no-deps` (and the Ascend
installers, each only after its sha256 matched the lab's sums), the venv's record says so, and a dry run of the same
deploy plans no change.
"""

from __future__ import annotations

import json

import pytest

from ironserve import catalogue
from ironserve.units import venv_path

from ..catalogue_copy import unlocked_catalogue
from . import labcli
from .labcli import lab_down, pyinfra

pytestmark = pytest.mark.lab

RECIPE = "glm5.1-w4a8-a3-pd-mixed-16"
DEPLOY = "deploys/glm51.py"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    recipes = unlocked_catalogue(tmp_path_factory.mktemp("catalogue"))
    try:
        hosts, api_key_file = labcli.up_with_api_key(tmp_path_factory, 2, "atlas-800i-a3", timeout=1800)
        yield hosts, api_key_file, {"IRONSERVE_CATALOGUE": str(recipes)}, recipes
    finally:
        lab_down()


def test_no_lock_is_refused_under_require_locks_before_any_change(lab):
    hosts, api_key_file, env, _ = lab
    before = labcli.ssh(hosts[0], "ls /opt/ironserve/venvs 2>/dev/null; true").stdout
    out = pyinfra(
        "-y",
        DEPLOY,
        "--data",
        f"recipe={RECIPE}",
        "--data",
        f"api_key_file={api_key_file}",
        "--data",
        "require_locks=true",
        check=False,
        env=env,
        timeout=900,
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"recipe {RECIPE}: runtime: no lock file with hashes ({RECIPE}.lock.json)" in text, text[-3000:]
    assert f"ironserve lock {RECIPE} --inventory INVENTORY" in text
    assert labcli.ssh(hosts[0], "ls /opt/ironserve/venvs 2>/dev/null; true").stdout == before


def planned_changes(data: list[str], env: dict) -> list[str]:
    plan = json.loads(pyinfra(DEPLOY, "--dry", "--json", *data, env=env, timeout=900).stdout)["plan"]
    assert plan, "the dry run planned no operation at all"
    return [op["name"] for op in plan if op["hosts_with_change"] or op["hosts_with_conditional_change"]]


def test_without_a_lock_the_plan_warns_and_installs_unchecked(lab):
    hosts, api_key_file, env, _ = lab
    data = ["--data", f"recipe={RECIPE}", "--data", f"api_key_file={api_key_file}"]
    out = pyinfra(DEPLOY, "--dry", "--json", *data, env=env, timeout=900)
    text = out.stdout + out.stderr
    assert f"no lock file with hashes ({RECIPE}.lock.json): its uv runtime would install without hash checks" in text
    assert f"run `ironserve lock {RECIPE} --inventory INVENTORY`" in text
    changes = [op["name"] for op in json.loads(out.stdout)["plan"] if op["hosts_with_change"]]
    # the runtime's packages, without hash checks (the locked install's operation says "hash-checked")
    assert [n for n in changes if "venv /" in n and n.endswith(" packages") and "router" not in n], changes


def test_locked_runtime_installs_hash_checked_and_converges(lab):
    hosts, api_key_file, env, recipes = lab
    labcli.ironserve("lock", RECIPE, "--inventory", "inventories/lab.py", "--arch", "x86_64", env=env, timeout=900)
    locked = json.loads((recipes / f"{RECIPE}.lock.json").read_text())["uv"]["platforms"]["x86_64"]
    assert len(locked) > 50 and all(h.startswith("sha256:") for hashes in locked.values() for h in hashes)
    data = ["--data", f"recipe={RECIPE}", "--data", f"api_key_file={api_key_file}", "--data", "require_locks=true"]
    deployed = pyinfra("-y", DEPLOY, *data, env=env, timeout=1800)
    assert "hash-checked" in deployed.stdout + deployed.stderr
    venv = venv_path(catalogue.get_recipe(RECIPE))  # the copy's recipe has the same runtime, so the same venv
    for host in hosts:
        record = labcli.ssh(host, f"cat {venv}/ironserve-requirements.txt").stdout
        assert f"--require-hashes: the lock's {len(locked)} distributions" in record
        hashed = labcli.ssh(host, f"cat {venv}/ironserve-requirements.lock.txt").stdout.splitlines()
        assert len(hashed) == len(locked) and all("--hash=sha256:" in line for line in hashed)
        # every locked distribution is installed at its locked version
        probe = (
            "import json, re, importlib.metadata as m; print(json.dumps({re.sub(r'[-_.]+', '-', "
            "d.metadata['Name']).lower(): d.version for d in m.distributions()}))"
        )
        have = json.loads(labcli.ssh(host, f"{venv}/bin/python -c {json.dumps(probe)}").stdout.strip().splitlines()[-1])
        assert {f"{name}=={have.get(name)}" for name in (r.split("==")[0] for r in locked)} == set(locked)
    assert not planned_changes(data, env)
