"""Every seed recipe the lab can serve, deployed on lab hosts of its first hardware profile (issue 19's matrix).

For each recipe of tests/recipe_matrix.py: exactly the hosts it places, of its first hardware profile, booted once
per shape (hardware, hosts) and shared by the recipes of that shape (in the suite: picked per shape from the module's
hosts of the mixed lab, see Shapes); the production deploy
(`pyinfra -y inventories/lab.py deploys/<model>.py --data recipe=ID`: prepare and validate, the accelerators are
stand-ins) and right after it a dry run of the same deploy that must plan no change. Names and times are printed.
To keep CI within its time, a run deploys one recipe of each kind (the hardware's supply and the runtime kind; the
recipe with the fewest hosts: the others differ in flags, env, tuning values, host count and entry point, which the
offline render, lint and fixture tests check flag for flag) that no other lab module deploys, and plans each other
one with `--dry` (the plan must succeed and change what the recipe's own units need); IRONSERVE_MATRIX=full deploys
every one (and forms llama3's gloo group from its CUDA venvs).
The Python 3.12 recipes (uv runtimes of CUDA builds, lab/ironserve_lab/cuda_runtime.py) get their interpreter from the
lab's download list (host data uv_python_downloads_json_url); a multi-node uv recipe's ranks then form a
torch.distributed gloo group from their venvs (the launch preflight's rendezvous, which a prepare-only deploy does
not reach). The GB200 recipe is deployed by tests/e2e/test_deploy_glm5_gb200_lab.py (5 hosts, with its own checks),
the GLM-5 MTP recipe by tests/e2e/test_deploy_glm5_lab.py (2 hosts, its own checks) and the Atlas PD-mixed recipe by
tests/e2e/test_uv_lock_lab.py (planned without a lock, deployed from one), all counted here from there; recipes of NOT_IN_LAB are listed with the reason. Then the air-gapped interpreter of the Python 3.12 recipes
on the same host: refused before any change without a source, naming host, version and both
fixes; installed from the lab's download list when host data names it, the whole deploy passing.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from ironserve_lab import cuda_runtime

from ironserve import catalogue
from ironserve.render import render
from ironserve.spec import UvRuntime
from ironserve.units import venv_path

from ..recipe_matrix import ELSEWHERE, NOT_IN_LAB, deployed_here, matrix
from . import labcli
from .labcli import lab_down, pyinfra

pytestmark = pytest.mark.lab

MATRIX = matrix()
ENTRIES = [e for e in MATRIX if e.recipe not in ELSEWHERE]
# CI deploys one recipe of each kind (hardware supply, runtime kind) that no module of ELSEWHERE deploys, and plans
# the others; IRONSERVE_MATRIX=full deploys every one
DEPLOYED = deployed_here(MATRIX, full=os.environ.get("IRONSERVE_MATRIX") == "full")
PLANNED: dict[str, int] = {}  # recipe -> operations its dry run plans to change (the recipes not deployed)
TIMES: dict[str, tuple[float, float]] = {}
STARTED: set[str] = set()  # the matrix recipes this run's selection reached (-k may pick some)
# the Python 3.12 recipes the matrix deployed with the lab's download list: recipe -> (host, what its venv reports)
VENVS: dict[str, tuple[str, dict]] = {}
OS_PYTHON = "3.11"  # Debian bookworm's, the lab hosts' OS
RENDEZVOUS = "/usr/local/lib/ironserve/ironserve-rendezvous"  # roles/launch_preflight.py (installed by the deploy)
# The Python 3.12 checks run on one host of minimax's second profile: the matrix's last shape (no extra boot), and
# a host no Python 3.12 recipe was deployed on (the matrix deploys minimax on its first profile, rtx6000-pro)
SECOND_PROFILE = ("rtx6000-pro-maxq", 1)


class Shapes:
    """One shape at a time. On a lab of its own: booted when the next recipe needs another shape, down at the end; a
    larger shape of the same hardware grows the running lab (its first hosts keep what the smaller shape's recipes
    installed: the uv cache, the Ascend supply); another hardware starts from fresh hosts. On a shared lab (scripts/test's
    mixed stage, IRONSERVE_LAB_HOSTS naming this module's hosts): the shape's first hosts of its hardware among them,
    in their order, a host an earlier shape deployed to replaced by a fresh one; the tests of a hardware they have
    none of are deselected (marker lab_profile, tests/e2e/conftest.py), so two streams can split the matrix."""

    def __init__(self, tmp_path_factory):
        self.factory, self.shape, self.hosts = tmp_path_factory, None, []
        self.pool = labcli.shared_hosts()

    def up(self, shape: tuple[str, int]) -> list[dict]:
        if shape != self.shape:
            hardware, nodes = shape
            if self.pool:  # the inventory, lab_status and the module's pyinfra runs read the shape's hosts from it
                os.environ[labcli.SHARED] = ",".join(self.shared_of(hardware, nodes))
            elif self.shape and self.shape[0] != hardware:
                lab_down()
            self.hosts, self.api_key_file = labcli.up_with_api_key(self.factory, nodes, hardware, timeout=1800)
            self.shape = shape
        return self.hosts

    def shared_of(self, hardware: str, nodes: int) -> list[str]:
        profile = labcli.shared_profiles(self.pool)  # the module's hosts: the variable names the last shape's now
        names = [name for name in self.pool if profile[name] == hardware][:nodes]
        assert len(names) == nodes, f"{labcli.SHARED}={','.join(self.pool)}: fewer than {nodes} {hardware} host(s)"
        return names


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    lab = Shapes(tmp_path_factory)
    try:
        yield lab
    finally:
        if lab.shape:
            lab_down()


def python_downloads() -> str | None:
    return json.loads(labcli.ironserve("lab", "status", "--format", "json").stdout).get("python_downloads") or None


def interpreter_data(recipe_id: str) -> list[str]:
    """Host data naming the lab's download list for a recipe whose Python the hosts' OS lacks."""
    runtime = catalogue.get_recipe(recipe_id).runtime
    if not isinstance(runtime, UvRuntime) or runtime.python == OS_PYTHON:
        return []
    downloads = python_downloads()
    if not downloads:
        pytest.skip(
            f"{recipe_id} needs Python {runtime.python}: this machine has no CPython build for the lab to "
            "publish (IRONSERVE_PYTHONS, default /root/.pyenv/versions/3.12.*)"
        )
    return ["--data", f"uv_python_downloads_json_url={downloads}"]


def venv_report(host: dict, recipe_id: str) -> dict:
    """What the recipe's venv on ``host`` runs: its Python, sglang and torch (imported: the CUDA build over the lab's
    stub libraries), and whether torch sees a GPU."""
    venv = venv_path(catalogue.get_recipe(recipe_id))
    probe = (
        "import json, sys, importlib.metadata as m, torch; print(json.dumps({'python': '%d.%d' % "
        "sys.version_info[:2], 'sglang': m.version('sglang'), 'torch': torch.__version__, "
        "'cuda': torch.cuda.is_available()}))"
    )
    return json.loads(labcli.ssh(host, f"{venv}/bin/python -c {json.dumps(probe)}").stdout.strip().splitlines()[-1])


def venv_as_served(recipe_id: str, got: dict) -> bool:
    """The venv runs Python 3.12, the recipe's sglang and the CUDA build of the runtime's torch, without a GPU."""
    runtime = next(r for r in cuda_runtime.RUNTIMES.values() if r.recipe == recipe_id)
    return (
        got["python"] == cuda_runtime.PYTHON
        and got["sglang"] == catalogue.get_recipe(recipe_id).engine.sglang
        and got["torch"].startswith(f"{runtime.torch}+cu{runtime.cuda}")
        and got["cuda"] is False
    )


def gloo_group_from_the_venvs(hosts: list[dict], recipe_id: str) -> list[dict]:
    """Each rank of the recipe's multi-node group runs the launch preflight's rendezvous with its venv's python, at
    the same time, over the lab NIC: the torch of the installed runtime forms the gloo group and all-reduces."""
    recipe = catalogue.get_recipe(recipe_id)
    world = len([p for p in render(recipe).processes if p.role != "router"])
    ranks = hosts[:world]  # node ranks follow the inventory order of the group's hosts; rank 0 hosts the dist-init
    addr, port = ranks[0]["address"], recipe.topology.groups[0].dist_init_port

    def rank(i: int, host: dict) -> dict:
        venv = venv_path(catalogue.get_recipe(recipe_id))
        out = labcli.ssh(
            host,
            f"GLOO_SOCKET_IFNAME=host0 {venv}/bin/python3 {RENDEZVOUS} --addr {addr} "
            f"--port {port} --rank {i} --world {world} --timeout 60",
            check=False,
            timeout=180,
        ).stdout
        line = next((ln for ln in out.splitlines() if ln.startswith("IRONSERVE-RENDEZVOUS ")), None)
        assert line, out
        return json.loads(line.split(" ", 1)[1])

    with ThreadPoolExecutor(len(ranks)) as pool:
        return list(pool.map(lambda a: rank(*a), enumerate(ranks)))


def planned_changes(out: str) -> list[str]:
    plan = json.loads(out)["plan"]
    assert plan, "the dry run planned no operation at all"
    return [
        f"{op['name']} on {op['hosts_with_change'] + op['hosts_with_conditional_change']}"
        for op in plan
        if op["hosts_with_change"] or op["hosts_with_conditional_change"]
    ]


@pytest.mark.parametrize(
    "entry", [pytest.param(e, id=e.recipe, marks=pytest.mark.lab_profile(e.hardware)) for e in ENTRIES]
)
def test_recipe_deploys_and_converges(shapes, entry):
    STARTED.add(entry.recipe)
    hosts = shapes.up(entry.shape)
    data = [
        "--data",
        f"recipe={entry.recipe}",
        "--data",
        f"api_key_file={shapes.api_key_file}",
        *interpreter_data(entry.recipe),
    ]
    started = time.monotonic()
    if entry.recipe not in DEPLOYED:
        dry = pyinfra(entry.deploy, "--dry", "--json", *data, timeout=900)
        TIMES[entry.recipe] = (float("nan"), time.monotonic() - started)
        PLANNED[entry.recipe] = len(planned_changes(dry.stdout))
        assert PLANNED[entry.recipe], "another recipe on these hosts planned no change (its units are its own)"
        return
    pyinfra("-y", entry.deploy, *data, timeout=1800)
    deployed = time.monotonic()
    dry = pyinfra(entry.deploy, "--dry", "--json", *data, timeout=900)
    TIMES[entry.recipe] = (deployed - started, time.monotonic() - deployed)
    assert not planned_changes(dry.stdout), planned_changes(dry.stdout)
    recipe = catalogue.get_recipe(entry.recipe)
    if interpreter_data(entry.recipe):
        VENVS[entry.recipe] = (f"{hosts[0]['name']} ({entry.hardware})", venv_report(hosts[0], entry.recipe))
        assert venv_as_served(entry.recipe, VENVS[entry.recipe][1]), VENVS[entry.recipe]
    if isinstance(recipe.runtime, UvRuntime) and recipe.topology and recipe.topology.kind == "multinode-tp":
        ranks = gloo_group_from_the_venvs(hosts, entry.recipe)
        print(
            f"\n{entry.recipe}: gloo group of {len(ranks)} ranks from the venvs: "
            + ", ".join(f"rank {r['rank']} {r.get('seconds')}s" for r in ranks)
        )
        assert all(r["ok"] for r in ranks), ranks


@pytest.mark.lab_profile(SECOND_PROFILE[0])
def test_python_312_refused_on_an_air_gapped_host_before_any_change(shapes):
    """minimax/llama3 (seed 003: `uv venv --python 3.12`) on Debian bookworm (3.11), air-gapped, no mirror."""
    recipe = "minimax-m2.5-nvfp4-rtx6000-tp2"
    hosts = shapes.up(SECOND_PROFILE)
    before = labcli.ssh(
        hosts[0], "ls /opt/ironserve/venvs 2>/dev/null; cat /etc/sysctl.d/*.conf 2>/dev/null | md5sum", check=False
    ).stdout
    # the lab inventory names the lab's download list: not here (an air-gapped site without a mirror)
    no_list = {"IRONSERVE_LAB_PYTHON_DOWNLOADS": "off"}
    refused = pyinfra(
        "-y", "deploys/minimax_m2.py", "--data", f"recipe={recipe}", check=False, timeout=900, env=no_list
    )
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert f"recipe {recipe} needs Python 3.12" in output and "uv_python_install_mirror" in output
    assert "python3.12 from the OS's packages" in output and hosts[0]["name"] in output
    assert "dns error" not in output  # uv never asked the internet for an interpreter
    after = labcli.ssh(
        hosts[0], "ls /opt/ironserve/venvs 2>/dev/null; cat /etc/sysctl.d/*.conf 2>/dev/null | md5sum", check=False
    ).stdout
    assert before == after


@pytest.mark.lab_profile(SECOND_PROFILE[0])
def test_python_312_from_the_labs_download_list(shapes):
    """A Python 3.12 recipe with host data naming a download list (uv_python_downloads_json_url; the lab's: this
    machine's CPython 3.12 packaged as uv's managed Python): the preflight lets it through, uv installs the
    interpreter from the lab bridge, air-gapped, and the recipe's CUDA runtime from the lab index; the venv runs
    Python 3.12 with the recipe's sglang and torch, and the whole deploy passes (the parse check included). The
    matrix's deploy of a Python 3.12 recipe (minimax's in CI, every one with IRONSERVE_MATRIX=full) is that deploy
    when this run made one; else minimax's is made here, on the second profile."""
    recipe = "minimax-m2.5-nvfp4-rtx6000-tp2"
    if VENVS:  # the matrix deployed a Python 3.12 recipe just so (with the download list): that deploy is this test's
        recipe = recipe if recipe in VENVS else sorted(VENVS)[0]
        where, got = VENVS[recipe]
        print(f"\n{recipe}: deployed by the matrix on {where}; venv: {got}")
    else:
        hosts = shapes.up(SECOND_PROFILE)
        downloads = python_downloads()
        if not downloads:
            pytest.skip(
                "this machine has no CPython 3.12 build for the lab to publish (IRONSERVE_PYTHONS, "
                "default /root/.pyenv/versions/3.12.*)"
            )
        started = time.monotonic()
        out = pyinfra(
            "-y",
            "deploys/minimax_m2.py",
            "--data",
            f"recipe={recipe}",
            "--data",
            f"uv_python_downloads_json_url={downloads}",
            check=False,
            timeout=1800,
        )
        output = out.stdout + out.stderr
        assert "needs Python 3.12" not in output and "dns error" not in output
        assert out.returncode == 0, output[-4000:]
        got = venv_report(hosts[0], recipe)
        print(
            f"\n{recipe} on {hosts[0]['name']} ({shapes.shape[0]}): deployed in {time.monotonic() - started:.0f}s; "
            f"venv: {got}"
        )
    assert venv_as_served(recipe, got), got


def test_matrix_summary(capsys):
    with capsys.disabled():
        print("\nrecipe matrix (lab): recipe, hardware x hosts, deploy s, dry run s")
        for e in [e for e in ENTRIES if e.recipe in STARTED]:
            deploy_s, dry_s = TIMES.get(e.recipe, (float("nan"), float("nan")))
            planned = f"  planned only ({PLANNED[e.recipe]} changes)" if e.recipe in PLANNED else ""
            print(f"  {e.recipe:40s} {e.hardware} x{e.hosts}  {deploy_s:7.1f}  {dry_s:6.1f}{planned}")
        others = len(ENTRIES) - len(STARTED)
        if others:  # scripts/test's other matrix stream (its hosts' profiles), or -k
            print(f"  ({others} other matrix recipe(s) not selected in this run)")
        for recipe, where in ELSEWHERE.items():
            print(f"  {recipe:40s} deployed by {where}")
        for recipe, why in sorted(NOT_IN_LAB.items()):
            print(f"  {recipe:40s} NOT deployed in the lab: {why}")
    if not STARTED:
        pytest.skip("no matrix recipe was selected in this run")
    assert STARTED <= set(TIMES), f"matrix recipes that did not deploy: {sorted(STARTED - set(TIMES))}"
