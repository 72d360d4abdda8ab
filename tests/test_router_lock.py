"""A docker recipe's router venv locked with hashes: `ironserve lock RECIPE --router` records the resolution of
sglang-router==engine.router for each machine and each Python minor the hosts' python3 may have, every distribution
with the sha256 of its files; the router role installs within it with `--require-hashes -c`, refusing a file the
index serves in place of the locked one; without a lock for the host's machine and python3 it warns, or refuses
under require_locks (before any host is touched where the lock file has no router entry at all). Real uv against
a PEP 503 index of small wheels on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ironserve_lab import supply
from ironserve_lab.wheels import build_wheel

from ironserve import catalogue, cli, imagelock
from ironserve.problems import SpecError
from roles.context import build_context, require_locked_runtime

from .catalogue_copy import unlocked_catalogue
from .test_uv_lock import UV, index, installs_then_refuses_a_swapped_file, needs_uv  # noqa: F401 (index: the fixture)
from .test_uv_lock import _wheels as uv_lock_wheels

RECIPE = "glm5-nvfp4-gb200-disagg"
DIGEST = "sha256:" + "d" * 64


def _wheels(root: Path, beta_payload: bytes = b"") -> dict[str, str]:
    """sglang-router 0.3.2 (requires beta>=1), beta 1.0 and 2.0; {file: sha256}."""
    return uv_lock_wheels(root, beta_payload, top=("sglang-router", "0.3.2"))


@pytest.fixture
def recipes(tmp_path, monkeypatch):
    dest = unlocked_catalogue(tmp_path)
    monkeypatch.setenv("IRONSERVE_CATALOGUE", str(dest))
    catalogue._catalogue_cached.cache_clear()
    yield dest
    catalogue._catalogue_cached.cache_clear()


def test_lock_router_records_each_machine_and_python_and_keeps_the_image(recipes, index, capsys):
    root, url = index
    sums = _wheels(root)
    image = {"image": "nvcr.io/x:1", "digest": DIGEST, "registry": "nvcr.io"}
    imagelock.write(recipes / f"{RECIPE}.lock.json", {"recipe": RECIPE, "docker": image})
    lock = ["lock", RECIPE, "--index", url, "--router", "--arch", "x86_64"]
    assert cli.main([*lock, "--router-python", "3.11", "--router-python", "3.12"]) == 0
    written = json.loads((recipes / f"{RECIPE}.lock.json").read_text())
    assert written["docker"] == image  # --router: an image a site lock pins stays as the lock file had it
    expected = {
        "sglang-router==0.3.2": [f"sha256:{sums['sglang_router-0.3.2-py3-none-any.whl']}"],
        "beta==2.0": [f"sha256:{sums['beta-2.0-py3-none-any.whl']}"],
    }
    assert written["router"] == {
        "index": url,
        "version": "0.3.2",
        "platforms": {"x86_64": {"3.11": expected, "3.12": expected}},
    }
    out = capsys.readouterr().out
    assert "the router venv's 2 distributions for x86_64 Python 3.11" in out and "Python 3.12" in out
    recipe = catalogue.get_recipe(RECIPE)
    assert imagelock.router_lock(recipe, recipes / f"{RECIPE}.yaml") == (written["router"]["platforms"], "")
    # another router version: the lock is stale, never used
    other = recipe.model_copy(update={"engine": recipe.engine.model_copy(update={"router": "0.3.3"})})
    locked, why = imagelock.router_lock(other, recipes / f"{RECIPE}.yaml")
    assert locked is None and "stale (made for sglang-router 0.3.2)" in why


def test_an_index_urls_credentials_never_reach_the_lock_file_or_the_output(recipes, index, capsys):
    root, url = index
    _wheels(root)
    secret_url = url.replace("http://", "http://mirror-user:s3cret-token@")
    assert cli.main(["lock", RECIPE, "--index", secret_url, "--router", "--arch", "x86_64"]) == 0
    text = (recipes / f"{RECIPE}.lock.json").read_text()
    out = capsys.readouterr()
    assert "s3cret-token" not in text + out.out + out.err and "mirror-user" not in text
    assert json.loads(text)["router"]["index"] == url
    assert imagelock.public_url("https://u:p@[::1]:8443/simple/") == "https://[::1]:8443/simple/"
    assert imagelock.public_url(url) == url


def test_lock_router_refuses_a_python_that_is_not_a_minor_and_a_missing_index(recipes, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["lock", RECIPE, "--router", "--index", "https://x/simple/", "--router-python", "3.11;id"])
    assert exit_.value.code == 2 and "not a Python minor version: write 3.X" in capsys.readouterr().err
    assert cli.main(["lock", RECIPE, "--router"]) == 2
    err = capsys.readouterr().err
    assert "engine.router" in err and "give --index URL or an inventory with pip_index_url" in err
    assert not (recipes / f"{RECIPE}.lock.json").exists()


def test_a_default_python_the_index_cannot_serve_is_left_out_an_asked_for_one_refused(recipes, index, capsys):
    root, url = index
    wheels = supply.ensure_dirs(root) / "wheels"
    build_wheel(wheels, "sglang-router", "0.3.2", requires_python=">=3.11")
    supply.reindex_wheels(root)
    assert cli.main(["lock", RECIPE, "--index", url, "--router", "--arch", "aarch64"]) == 0
    written = json.loads((recipes / f"{RECIPE}.lock.json").read_text())["router"]
    assert sorted(written["platforms"]["aarch64"]) == ["3.11", "3.12"] and "skipped" not in written
    out = capsys.readouterr().out
    assert "does not resolve for aarch64 Python 3.10" in out and "left out of the lock" in out
    assert cli.main(["lock", RECIPE, "--index", url, "--router", "--arch", "aarch64", "--router-python", "3.10"]) == 2
    assert "engine.router" in capsys.readouterr().err


@needs_uv
def test_the_router_installs_within_its_lock_and_a_swapped_file_is_refused(tmp_path, index):
    root, url = index
    _wheels(root)
    recipe = catalogue.get_recipe(RECIPE)
    locked = imagelock.resolve_router(recipe, url, ["x86_64"], ["3.11"])["platforms"]["x86_64"]["3.11"]
    constraints = tmp_path / "ironserve-requirements.lock.txt"
    constraints.write_text(imagelock.hashed_requirements_text(locked))

    def install(venv: Path) -> subprocess.CompletedProcess:
        env = {"UV_PYTHON_DOWNLOADS": "never", "PATH": "/usr/bin:/bin", "UV_CACHE_DIR": str(tmp_path / "cache")}
        subprocess.run([UV, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env)
        # the command roles/router_runtime.apply has roles/uv_env.venv_packages run with a router lock
        cmd = [UV, "pip", "install", "--python", str(venv / "bin/python"), "--index-url", url]
        cmd += ["--require-hashes", "-c", str(constraints), "sglang-router==0.3.2"]
        return subprocess.run(cmd, capture_output=True, text=True, env=env)

    installs_then_refuses_a_swapped_file(tmp_path, root, install, top=("sglang-router", "0.3.2"))


def _contexts(**data) -> dict:
    hosts = [
        (f"gb{i}", {"hardware": "gb200", "ssh_hostname": f"10.0.0.{i + 1}", "nic": "eth0", **data}) for i in range(5)
    ]
    return {name: build_context("glm5", name, hosts) for name, _ in hosts}


def test_the_router_host_takes_the_locks_resolution_for_its_machine_and_python3(recipes):
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra_testing.util import FakeState, create_host

    from roles.router_runtime import docker_router_lock

    locked = {"sglang-router==0.3.2": ["sha256:" + "a" * 64], "beta==2.0": ["sha256:" + "b" * 64]}
    router = {"index": "https://x/simple/", "version": "0.3.2", "platforms": {"x86_64": {"3.11": locked}}}
    imagelock.write(recipes / f"{RECIPE}.lock.json", {"recipe": RECIPE, "router": router})
    logged = []

    def resolution(python: str | None, **data):
        (ctx,) = [c for c in _contexts(**data).values() if c.runs_router]
        state = FakeState()
        fake = create_host(state, facts={})
        fake.name = "gb0"
        fake.log_styled = lambda text, **style: logged.append(text)
        with ctx_state.use(state), ctx_host.use(fake):
            return docker_router_lock(ctx, "x86_64", python)

    assert resolution("3.11") == locked and not logged
    assert resolution("3.12") is None  # installed unchecked, and the deploy says so
    (warning,) = logged
    assert "its router lock resolves x86_64 Python 3.11, not x86_64 Python 3.12" in warning
    assert f"run `ironserve lock {RECIPE} --router --inventory INVENTORY`" in warning
    assert resolution(None) is None and "this host has no /usr/bin/python3 for the router venv" in logged[-1]
    with pytest.raises(PyinfraError, match="not x86_64 Python 3.12"):
        resolution("3.12", require_locks=True)


def test_require_locks_refuses_a_router_host_without_a_router_lock_before_any_host(recipes):
    contexts = _contexts(require_locks=True)
    for ctx in contexts.values():
        if not ctx.runs_router:
            require_locked_runtime(ctx)  # the image is the only thing their runtime installs
    (router,) = [c for c in contexts.values() if c.runs_router]
    with pytest.raises(SpecError) as err:
        require_locked_runtime(router)
    text = str(err.value)
    assert f"recipe {RECIPE}: engine.router: no lock of its router venv with hashes ({RECIPE}.lock.json)" in text
    assert f"ironserve lock {RECIPE} --router --inventory INVENTORY" in text
