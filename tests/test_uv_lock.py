"""uv runtimes locked with hashes: `ironserve lock` records the FULL resolution of a uv runtime (transitive
distributions included) with the sha256 of each file, and the locked set installs with `uv pip install
--require-hashes --no-deps`, refusing a file the index serves in place of the locked one. Real uv against a
PEP 503 index of small wheels on loopback; the deploy's warning (no lock) and error (require_locks)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from ironserve_lab import supply
from ironserve_lab.wheels import build_wheel

from ironserve import catalogue, cli, imagelock, pins
from ironserve.problems import SpecError
from roles.context import build_context, require_locked_runtime, runtime_lock

from .catalogue_copy import unlocked_catalogue

ROOT = Path(__file__).resolve().parents[1]
UV = pins.uv_binary()
needs_uv = pytest.mark.skipif(not UV, reason="uv is not installed here (scripts/env.sh installs it)")


def _wheels(root: Path, beta_payload: bytes = b"", top: tuple[str, str] = ("alpha", "1.0")) -> dict[str, str]:
    """``top`` (alpha 1.0; requires beta>=1), beta 1.0 and 2.0, indexed as the lab's supply is; {file: sha256}."""
    wheels = supply.ensure_dirs(root) / "wheels"
    build_wheel(wheels, *top, requires=["beta>=1"])
    build_wheel(wheels, "beta", "1.0")
    build_wheel(wheels, "beta", "2.0", files={"beta/payload.txt": beta_payload})
    supply.reindex_wheels(root)
    return {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels.iterdir()}


@pytest.fixture
def index(tmp_path):
    """(root of the supply, URL of its simple/ index on loopback)."""
    root = tmp_path / "lab"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(supply.supply_dir(root)))
    handler.log_message = lambda *a: None
    supply.ensure_dirs(root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def _recipes(tmp_path: Path, packages: list[str]) -> Path:
    """The catalogue with tiny-cpu's runtime pinned to ``packages``."""
    dest = unlocked_catalogue(tmp_path)
    data = yaml.safe_load((dest / "tiny-cpu.yaml").read_text())
    data["runtime"]["packages"] = packages
    data["runtime"].pop("overrides", None), data["runtime"].pop("excludes", None)
    (dest / "tiny-cpu.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def test_hashed_requirements_round_trip():
    text = (
        "alpha==1.0 \\\n    --hash=sha256:"
        + "a" * 64
        + "\nbeta==2.0 \\\n    --hash=sha256:"
        + "c" * 64
        + " \\\n    --hash=sha256:"
        + "b" * 64
        + "\n"
    )
    locked = imagelock.parse_hashed_requirements(text)
    assert locked == {"alpha==1.0": ["sha256:" + "a" * 64], "beta==2.0": ["sha256:" + "b" * 64, "sha256:" + "c" * 64]}
    assert imagelock.parse_hashed_requirements(imagelock.hashed_requirements_text(locked)) == locked
    with pytest.raises(ValueError, match="not a hashed pin"):
        imagelock.parse_hashed_requirements("alpha==1.0\n")  # a pin without hashes never reaches a lock


@needs_uv
def test_lock_records_the_full_resolution_with_hashes(tmp_path, index, monkeypatch, capsys):
    """The old lock kept the recipe's own pins only (alpha): beta, which alpha pulls in, installed unchecked."""
    root, url = index
    sums = _wheels(root)
    recipes = _recipes(tmp_path, ["alpha==1.0"])
    monkeypatch.setenv("IRONSERVE_CATALOGUE", str(recipes))
    assert cli.main(["lock", "tiny-cpu", "--index", url]) == 0
    lock = json.loads((recipes / "tiny-cpu.lock.json").read_text())["uv"]
    assert lock["platforms"] == {
        "x86_64": {  # cpu-lab's machine
            "alpha==1.0": [f"sha256:{sums['alpha-1.0-py3-none-any.whl']}"],
            "beta==2.0": [f"sha256:{sums['beta-2.0-py3-none-any.whl']}"],
        }
    }
    assert "2 distributions for x86_64" in capsys.readouterr().out
    recipe = catalogue.load_recipe_file(recipes / "tiny-cpu.yaml")
    assert imagelock.uv_lock(recipe, recipes / "tiny-cpu.yaml") == (lock["platforms"], "")
    # other pins: the lock is stale, never used
    other = recipe.model_copy(
        update={"runtime": recipe.runtime.model_copy(update={"packages": ["alpha==1.0", "beta==1.0"]})}
    )
    locked, why = imagelock.uv_lock(other, recipes / "tiny-cpu.yaml")
    assert locked is None and "stale" in why


@needs_uv
def test_locked_set_installs_hash_checked_and_a_swapped_file_is_refused(tmp_path, index):
    root, url = index
    _wheels(root)
    recipe = catalogue.get_recipe("tiny-cpu")
    recipe = recipe.model_copy(
        update={
            "runtime": recipe.runtime.model_copy(update={"packages": ["alpha==1.0"], "overrides": [], "excludes": []})
        }
    )
    locked = imagelock.resolve_uv(recipe, url, ["x86_64"])["platforms"]["x86_64"]
    requirements = tmp_path / "ironserve-requirements.lock.txt"
    requirements.write_text(imagelock.hashed_requirements_text(locked))

    def install(venv: Path) -> subprocess.CompletedProcess:
        subprocess.run(
            [UV, "venv", "--quiet", "--python", sys.executable, str(venv)],
            check=True,
            env={"UV_PYTHON_DOWNLOADS": "never", "PATH": "/usr/bin:/bin"},
        )
        # the command roles/uv_env.venv_packages runs with a lock
        return subprocess.run(
            [
                UV,
                "pip",
                "install",
                "--python",
                str(venv / "bin/python"),
                "--index-url",
                url,
                "--require-hashes",
                "--no-deps",
                "-r",
                str(requirements),
            ],
            capture_output=True,
            text=True,
            env={"UV_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"},
        )

    installs_then_refuses_a_swapped_file(tmp_path, root, install)


def installs_then_refuses_a_swapped_file(tmp_path: Path, root: Path, install, top=("alpha", "1.0")) -> None:
    """``install(venv)`` puts beta 2.0 in; once the index serves another beta 2.0 (same name, other bytes) it is
    refused, nothing of it installed."""
    good = install(tmp_path / "good")
    assert good.returncode == 0, good.stderr
    assert list((tmp_path / "good/lib").glob("python3*/site-packages/beta-2.0.dist-info"))
    (supply.supply_dir(root) / "wheels" / "beta-2.0-py3-none-any.whl").unlink()
    _wheels(root, beta_payload=b"not what was locked", top=top)
    shutil.rmtree(tmp_path / "cache")
    bad = install(tmp_path / "bad")
    assert bad.returncode != 0 and "hash" in bad.stderr.lower(), bad.stderr
    assert not list((tmp_path / "bad/lib").glob("python3*/site-packages/beta-2.0.dist-info"))


def _ctx(**data):
    hosts = [(h, {"hardware": "cpu-lab", "recipe": "tiny-cpu", **data}) for h in ("h1", "h2", "h3")]
    hosts[0][1]["ironserve_role"] = "router"
    return build_context("tiny", "h1", hosts)


def test_no_lock_warns_and_require_locks_refuses_before_any_host(tmp_path, monkeypatch):
    monkeypatch.setenv("IRONSERVE_CATALOGUE", str(_recipes(tmp_path, ["alpha==1.0"])))
    catalogue._catalogue_cached.cache_clear()
    try:
        ctx = _ctx()
        assert runtime_lock(ctx) == (None, "no lock file with hashes (tiny-cpu.lock.json)")
        require_locked_runtime(ctx)  # default: the uv role warns (roles/uv_env.locked_resolution)
        with pytest.raises(SpecError) as err:
            require_locked_runtime(_ctx(require_locks=True))
        text = str(err.value)
        assert "recipe tiny-cpu: runtime: no lock file with hashes" in text
        assert "ironserve lock tiny-cpu --inventory INVENTORY" in text
    finally:
        catalogue._catalogue_cached.cache_clear()


def test_the_uv_role_takes_the_locks_resolution_for_the_hosts_machine(tmp_path, monkeypatch):
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra_testing.util import FakeState, create_host

    from roles.uv_env import locked_resolution

    recipes = _recipes(tmp_path, ["alpha==1.0"])
    monkeypatch.setenv("IRONSERVE_CATALOGUE", str(recipes))
    catalogue._catalogue_cached.cache_clear()
    try:
        recipe = catalogue.get_recipe("tiny-cpu")
        x86 = {"alpha==1.0": ["sha256:" + "a" * 64], "beta==2.0": ["sha256:" + "b" * 64]}
        imagelock.write(
            recipes / "tiny-cpu.lock.json",
            {
                "recipe": "tiny-cpu",
                "uv": {
                    "index": "http://10.213.7.1:8780/simple/",
                    "runtime": imagelock.runtime_digest(recipe.runtime),
                    "platforms": {"x86_64": x86},
                },
            },
        )

        logged = []

        def resolution(arch: str, **data):
            state = FakeState()
            fake = create_host(state, facts={"server.Arch": arch})
            fake.name = "h1"
            fake.log_styled = lambda text, **style: logged.append(text)
            with ctx_state.use(state), ctx_host.use(fake):
                return locked_resolution(_ctx(**data))

        assert resolution("x86_64") == x86 and not logged
        assert resolution("aarch64") is None  # installed unchecked, and the deploy says so
        assert logged == [
            "warning: h1: its lock file resolves x86_64, not aarch64 (`ironserve lock --arch aarch64`): "
            "its uv runtime would install without hash checks. Fix: run `ironserve lock tiny-cpu "
            "--inventory INVENTORY` (writes the lock with every distribution's sha256 beside the "
            "recipe), or set require_locks=true to refuse such a deploy"
        ]
        with pytest.raises(PyinfraError, match=r"resolves x86_64, not aarch64 \(`ironserve lock --arch aarch64`\)"):
            resolution("aarch64", require_locks=True)
    finally:
        catalogue._catalogue_cached.cache_clear()
