"""The product wheel: `uv build` it, install it into a fresh venv, and from outside the checkout build a unit file
through the role and every role's files for the audit, which reads the templates, helper scripts and host files
the wheel must carry; and install it as a user would (`uv tool install`, an empty HOME, outside the checkout):
`--version`, `render --list` from the packaged catalogue, `init`, and a site recipe on an H100 profile rendered
from the project's recipes/. The lab stays out of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest

from ironserve.resources import uv_binary

ROOT = Path(__file__).resolve().parent.parent


def _uv(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    uv = uv_binary()
    assert uv, "no uv (scripts/env.sh installs it; the project depends on the uv package)"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run([uv, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _check(_uv("build", "--wheel", "--out-dir", str(dist), cwd=ROOT))
    (built,) = dist.glob("ironserve-*.whl")
    return built


@pytest.fixture(scope="module")
def pins(tmp_path_factory) -> Path:
    """The locked dependencies (installed from uv's cache; the registry is asked only when the cache lacks one)."""
    out = tmp_path_factory.mktemp("pins") / "requirements.txt"
    out.write_text(
        _check(_uv("export", "--frozen", "--no-dev", "--no-hashes", "--no-emit-project", "--quiet", cwd=ROOT)).stdout
    )
    return out


def test_the_wheel_carries_the_catalogue_and_no_lab(wheel):
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert "ironserve/_files/templates/sglang.service.j2" in names and "ironserve/_files/bin/ironserve-exec" in names
    assert {
        "ironserve/_catalogue/hardware.yaml",
        "ironserve/_catalogue/defaults.yaml",
        "ironserve/_catalogue/glm5-nvfp4-mtp-rtx6000-tp8.yaml",
        "ironserve/_deploys/glm5.py",
        "ironserve/project_template/group_data/all.py",
    } <= set(names)
    assert not [n for n in names if n.startswith(("files/", "recipes/", "deploys/"))]
    # the lab is a package of its own (lab/, ironserve_lab): no module of it, under either name, nor a need of it
    assert not [n for n in names if n.startswith(("lab/", "ironserve/lab/")) or "ironserve_lab" in n]
    meta = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "Requires-Dist: uv" in meta
    assert not [line for line in meta.splitlines() if line.startswith("Requires-Dist: ironserve")]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_wheel_carries_the_files_and_its_roles_use_them(tmp_path, wheel, pins):
    venv, outside = tmp_path / "venv", tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / "requirements.txt").write_text(pins.read_text())
    _check(_uv("venv", "--quiet", "--python", "python3", str(venv), cwd=outside))
    install = [
        "pip",
        "install",
        "--quiet",
        "--python",
        str(venv / "bin" / "python"),
        "-r",
        str(tmp_path / "requirements.txt"),
        str(wheel),
    ]
    if _uv(*install, "--offline", cwd=outside).returncode != 0:
        _check(_uv(*install, cwd=outside))

    script = textwrap.dedent("""
        import json, sys
        from ironserve.audit.checks import derive_checks
        from ironserve.units import unit_files
        from roles import sglang_service
        from roles.context import build_context

        hosts = [("gpu-a", {"hardware": "rtx6000-pro-maxq", "ssh_hostname": "10.0.0.1"})]
        ctx = build_context("glm5", "gpu-a", hosts)
        proc = ctx.processes[0]
        files = unit_files(ctx.recipe, proc, ctx.tuning, sglang_service.process_secrets(ctx, proc, read=False))
        checks = derive_checks(ctx, "deploys/glm5.py", "inventory.py")
        print(json.dumps({"module": sglang_service.__file__, "unit": files.unit_name, "text": files.unit_text,
                          "files": sorted(c.params["path"] for c in checks if c.kind == "file")}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "IRONSERVE_RECIPES")}
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], cwd=outside, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["module"].startswith(str(venv)), "the role came from the checkout, not the installed wheel"
    assert out["unit"].startswith("sglang-") and "ExecStart=" in out["text"] and "[Install]" in out["text"]
    # helper scripts, the GPU clock script and the NCCL graph: read from the wheel's files
    assert {
        "/usr/local/lib/ironserve/ironserve-exec",
        "/usr/local/lib/ironserve/ironserve-rank-guard",
        "/usr/local/lib/ironserve/ironserve-gpu-clocks.py",
    } <= set(out["files"])


SITE_RECIPE = ROOT / "tests" / "data" / "site" / "recipes" / "llama3-8b-h100-tp1.yaml"


def test_a_tool_install_runs_from_an_empty_home(tmp_path, wheel, pins):
    """`uv tool install` of the wheel (pyinfra's executable beside it), then what a new user runs, outside the
    checkout with an empty HOME: nothing of the checkout or of a configured home is needed."""
    home, tools, bin_dir, site = tmp_path / "home", tmp_path / "tools", tmp_path / "bin", tmp_path / "site"
    for d in (home, site):
        d.mkdir()
    cache = _check(_uv("cache", "dir", cwd=tmp_path)).stdout.strip()
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(home),
        "UV_CACHE_DIR": cache,
        "UV_TOOL_DIR": str(tools),
        "UV_TOOL_BIN_DIR": str(bin_dir),
        "UV_PYTHON_DOWNLOADS": "never",
        "LANG": "C.UTF-8",
    }
    install = [
        uv_binary(),
        "tool",
        "install",
        "--python",
        "python3",
        "-c",
        str(pins),
        "--with-executables-from",
        "pyinfra",
        str(wheel),
    ]
    if subprocess.run([*install, "--offline"], cwd=site, env=env, capture_output=True).returncode != 0:
        _check(subprocess.run(install, cwd=site, env=env, capture_output=True, text=True, timeout=600))

    def ironserve(*args: str, cwd: Path = site) -> subprocess.CompletedProcess:
        return subprocess.run(["ironserve", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)

    version = _check(ironserve("--version"))
    assert version.stdout.startswith("ironserve 0.1.0"), version.stdout
    # the lab runs from a checkout: said plainly (exit 2), whatever follows `lab`
    for argv in (["lab", "up", "--nodes", "2", "--hardware", "cpu-lab"], ["lab", "--help"]):
        lab = ironserve(*argv)
        assert lab.returncode == 2 and "runs from a checkout" in lab.stderr and "Traceback" not in lab.stderr, lab
    listed = _check(ironserve("render", "--list")).stdout
    assert "glm5-nvfp4-mtp-rtx6000-tp8" in listed and "tiny-cpu" in listed, listed
    _check(ironserve("init", "cluster"))
    project = site / "cluster"
    assert {"inventory.py", "group_data/all.py", "deploys/glm5.py", "recipes/defaults.yaml"} <= {
        str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()
    }
    # the site's recipe, in the project's recipes/, for an H100 profile from the catalogue
    shutil.copy(SITE_RECIPE, project / "recipes" / SITE_RECIPE.name)
    (project / "group_data" / "all.py").write_text(
        (project / "group_data" / "all.py").read_text().replace('hardware = "rtx6000-pro"', 'hardware = "h100-sxm"')
    )
    shown = _check(
        ironserve("render", "llama3-8b-h100-tp1", "--inventory", "inventory.py", "--format", "shell", cwd=project)
    ).stdout
    assert "--model-path meta-llama/Llama-3.1-8B-Instruct" in shown and "host gpu-2 (192.0.2.12)" in shown, shown
    assert _check(ironserve("render", "--list", cwd=project)).stdout.count("llama3-8b-h100-tp1") == 1
    # pyinfra is beside it (the tool's own executable, and through ironserve)
    assert "v3." in _check(subprocess.run(["pyinfra", "--version"], env=env, capture_output=True, text=True)).stdout
    assert "v3." in _check(ironserve("pyinfra", "--version")).stdout
    closed = subprocess.run(
        "ironserve render --list | head -1", shell=True, cwd=site, env=env, capture_output=True, text=True, timeout=60
    )
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr
