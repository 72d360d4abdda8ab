"""Every seed recipe the lab can serve, deployed on lab hosts of its first hardware profile (issue 19's matrix).

For each recipe of tests/recipe_matrix.py: exactly the hosts it places, of its first hardware profile, booted once
per shape (hardware, hosts) and shared by the recipes of that shape; the production deploy
(`pyinfra -y inventories/lab.py deploys/<model>.py --data recipe=ID`: prepare and validate, the accelerators are
stand-ins) and right after it a dry run of the same deploy that must plan no change. Names and times are printed.
The GB200 recipe is deployed by tests/e2e/test_deploy_glm5_gb200_lab.py (5 hosts, with its own checks) and counted
here from there; recipes of NOT_IN_LAB are listed with the reason. Then the air-gapped interpreter of the Python 3.12
recipes on the same host: refused before any change without a source, naming host, version and both fixes; installed
from the lab's download list when host data names it.
"""

from __future__ import annotations

import json
import time

import pytest

from ..recipe_matrix import NOT_IN_LAB, matrix
from . import labcli
from .labcli import lab_down, pyinfra

pytestmark = pytest.mark.lab

# deployed by their own lab test module (more checks than the matrix makes), counted here
ELSEWHERE = {"glm5-nvfp4-gb200-disagg": "tests/e2e/test_deploy_glm5_gb200_lab.py"}
ENTRIES = [e for e in matrix() if e.recipe not in ELSEWHERE]
TIMES: dict[str, tuple[float, float]] = {}


class Shapes:
    """One lab at a time: booted when the next recipe needs another shape, down at the end. A larger shape of the
    same hardware grows the running lab (its first hosts keep what the smaller shape's recipes installed: the uv
    cache, the Ascend supply); another hardware starts from fresh hosts."""

    def __init__(self, tmp_path_factory):
        self.factory, self.shape, self.hosts = tmp_path_factory, None, []

    def up(self, shape: tuple[str, int]) -> list[dict]:
        if shape != self.shape:
            if self.shape and self.shape[0] != shape[0]:
                lab_down()
            hardware, nodes = shape
            self.hosts, self.api_key_file = labcli.up_with_api_key(self.factory, nodes, hardware, timeout=1800)
            self.shape = shape
        return self.hosts


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    lab = Shapes(tmp_path_factory)
    try:
        yield lab
    finally:
        if lab.shape:
            lab_down()


def planned_changes(out: str) -> list[str]:
    plan = json.loads(out)["plan"]
    assert plan, "the dry run planned no operation at all"
    return [f"{op['name']} on {op['hosts_with_change'] + op['hosts_with_conditional_change']}"
            for op in plan if op["hosts_with_change"] or op["hosts_with_conditional_change"]]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.recipe for e in ENTRIES])
def test_recipe_deploys_and_converges(shapes, entry):
    shapes.up(entry.shape)
    data = ["--data", f"recipe={entry.recipe}", "--data", f"api_key_file={shapes.api_key_file}"]
    started = time.monotonic()
    pyinfra("-y", entry.deploy, *data, timeout=1800)
    deployed = time.monotonic()
    dry = pyinfra(entry.deploy, "--dry", "--json", *data, timeout=900)
    TIMES[entry.recipe] = (deployed - started, time.monotonic() - deployed)
    assert not planned_changes(dry.stdout), planned_changes(dry.stdout)


def test_python_312_refused_on_an_air_gapped_host_before_any_change(shapes):
    """minimax/llama3 (seed 003: `uv venv --python 3.12`) on Debian bookworm (3.11), air-gapped, no mirror."""
    recipe = "minimax-m2.5-nvfp4-rtx6000-tp2"
    # on the single host of the last shape when the recipe fits it (no extra boot)
    fits = shapes.shape and shapes.shape[1] == 1 and shapes.shape[0] in ("rtx6000-pro", "rtx6000-pro-maxq")
    hosts = shapes.up(shapes.shape if fits else ("rtx6000-pro", 1))
    before = labcli.ssh(hosts[0], "ls /opt/ironserve/venvs 2>/dev/null; cat /etc/sysctl.d/*.conf 2>/dev/null | md5sum",
                        check=False).stdout
    refused = pyinfra("-y", "deploys/minimax_m2.py", "--data", f"recipe={recipe}", check=False, timeout=900)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert f"recipe {recipe} needs Python 3.12" in output and "uv_python_install_mirror" in output
    assert "python3.12 from the OS's packages" in output and hosts[0]["name"] in output
    assert "dns error" not in output  # uv never asked the internet for an interpreter
    after = labcli.ssh(hosts[0], "ls /opt/ironserve/venvs 2>/dev/null; cat /etc/sysctl.d/*.conf 2>/dev/null | md5sum",
                       check=False).stdout
    assert before == after


def test_python_312_from_the_labs_download_list(shapes):
    """The same recipe with host data naming a download list (uv_python_downloads_json_url; the lab's: this
    machine's CPython 3.12 packaged as uv's managed Python): the preflight lets it through and uv installs the
    interpreter from the lab bridge, air-gapped; the venv runs Python 3.12. The install of its packages then fails
    on the lab index, which does not serve its CUDA runtime (NOT_IN_LAB), and says so, not the interpreter."""
    recipe = "minimax-m2.5-nvfp4-rtx6000-tp2"
    fits = shapes.shape and shapes.shape[1] == 1 and shapes.shape[0] in ("rtx6000-pro", "rtx6000-pro-maxq")
    hosts = shapes.up(shapes.shape if fits else ("rtx6000-pro", 1))
    downloads = json.loads(labcli.ironserve("lab", "status", "--format", "json").stdout).get("python_downloads")
    if not downloads:
        pytest.skip("this machine has no CPython 3.12 build for the lab to publish (IRONSERVE_PYTHONS, "
                    "default /root/.pyenv/versions/3.12.*)")
    out = pyinfra("-y", "deploys/minimax_m2.py", "--data", f"recipe={recipe}", "--data",
                  f"uv_python_downloads_json_url={downloads}", check=False, timeout=1200)
    output = out.stdout + out.stderr
    assert "needs Python 3.12" not in output and "dns error" not in output
    venv = labcli.ssh(hosts[0], "ls -d /opt/ironserve/venvs/minimax-m2.5-nvfp4-rtx6000-tp2-* | head -1").stdout.strip()
    version = labcli.ssh(hosts[0], f"{venv}/bin/python -c 'import sys; print(sys.version_info[:2])'").stdout
    assert version.strip() == "(3, 12)", version
    assert out.returncode != 0 and "sglang" in output  # the CUDA runtime the lab index does not serve


def test_matrix_summary(capsys):
    with capsys.disabled():
        print("\nrecipe matrix (lab): recipe, hardware x hosts, deploy s, dry run s")
        for e in ENTRIES:
            deploy_s, dry_s = TIMES.get(e.recipe, (float("nan"), float("nan")))
            print(f"  {e.recipe:40s} {e.hardware} x{e.hosts}  {deploy_s:7.1f}  {dry_s:6.1f}")
        for recipe, where in ELSEWHERE.items():
            print(f"  {recipe:40s} deployed by {where}")
        for recipe, why in sorted(NOT_IN_LAB.items()):
            print(f"  {recipe:40s} NOT deployed in the lab: {why}")
    assert set(TIMES) == {e.recipe for e in ENTRIES}, "a matrix recipe did not deploy"
