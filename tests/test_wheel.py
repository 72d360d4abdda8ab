"""The product wheel: `uv build` it, install it into a fresh venv, and from outside the checkout (recipes through
IRONSERVE_RECIPES) build a unit file through the role and every role's files for the audit, which reads the
templates, helper scripts and host files the wheel must carry. The lab's host assets stay out of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _uv(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH (scripts/env.sh installs it)"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run([uv, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_the_wheel_carries_the_files_and_its_roles_use_them(tmp_path):
    dist, venv, outside = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    outside.mkdir()
    _check(_uv("build", "--wheel", "--out-dir", str(dist), cwd=ROOT))
    (wheel,) = dist.glob("ironserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ironserve/_files/templates/sglang.service.j2" in names and "ironserve/_files/bin/ironserve-exec" in names
    assert not [n for n in names if n.startswith(("ironserve/lab/assets/", "ironserve/lab/cpu_shims/", "files/"))]

    # the locked dependencies, from uv's cache (the registry is asked only when the cache lacks one)
    pins = _check(_uv("export", "--frozen", "--no-dev", "--no-hashes", "--no-emit-project", "--quiet", cwd=ROOT))
    (tmp_path / "requirements.txt").write_text(pins.stdout)
    _check(_uv("venv", "--quiet", "--python", "python3", str(venv), cwd=outside))
    install = ["pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "-r",
               str(tmp_path / "requirements.txt"), str(wheel)]
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
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["IRONSERVE_RECIPES"] = str(ROOT / "recipes")
    run = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=outside, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["module"].startswith(str(venv)), "the role came from the checkout, not the installed wheel"
    assert out["unit"].startswith("sglang-") and "ExecStart=" in out["text"] and "[Install]" in out["text"]
    # helper scripts, the GPU clock script and the NCCL graph: read from the wheel's files
    assert {"/usr/local/lib/ironserve/ironserve-exec", "/usr/local/lib/ironserve/ironserve-rank-guard",
            "/usr/local/lib/ironserve/ironserve-gpu-clocks.py"} <= set(out["files"])
