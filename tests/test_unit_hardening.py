"""Engine and rank guard units: hardened (figures from systemd-analyze's own scoring), restart storms bounded on
every systemd version (files/bin/ironserve-backoff, run for real), and no API served to every network
without a key unless the inventory says so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import OperationError

from ironserve.catalogue import get_recipe
from ironserve.render import render
from ironserve.spec import UvRuntime
from ironserve.units import in_container, rank_guard_files, unit_files
from roles import sglang_service as ss
from roles.context import build_context

from .host_scripts import load_script

BACKOFF = Path(__file__).resolve().parent.parent / "files" / "bin" / "ironserve-backoff"
# systemd-analyze security's overall exposure of each unit, as the README claims them (offline, systemd 252)
EXPOSURE = {"engine": 2.8, "docker": 2.8, "guard": 3.1}
# and on a served lab host, a rank group's engine and guard units (tests/e2e/test_rank_group_lab.py measures them)
LAB_EXPOSURE = {"engine": 2.6, "guard": 2.9}
README = Path(__file__).resolve().parent.parent / "README.md"


def tp2_units() -> tuple[str, str]:
    """Rank 0's engine and guard units of tiny-cpu-tp2 on two hosts with IP addresses (as an inventory has them)."""
    ctx = _ctx("n0", recipe="tiny-cpu-tp2")
    recipe, proc = ctx.recipe, ctx.processes[0]
    engine = unit_files(recipe, proc, recipe.tuning or _tuning(), {"IRONSERVE_API_KEY": "x"}).unit_text
    guard = rank_guard_files(recipe, proc, ctx.rendered.rank_group(proc)).unit_text
    return engine, guard


def _tuning():
    from ironserve.spec import HostTuning

    return HostTuning()


def exposure(tmp_path: Path, name: str, text: str) -> float:
    path = tmp_path / name
    path.write_text(text)
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(path)], capture_output=True, text=True, cwd=tmp_path
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout + out.stderr)
    assert match, out.stdout[-2000:] + out.stderr[-2000:]
    return float(match.group(1))


def _offline_analyze() -> bool:
    if not shutil.which("systemd-analyze"):
        return False
    version = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True).stdout.split()
    return len(version) > 1 and version[1].isdigit() and int(version[1]) >= 250


def test_the_readme_claims_the_figures_the_exposure_tests_hold():
    """The thresholds here and in the lab's test are the README's figures, offline and on a served lab host."""
    readme = " ".join(README.read_text().split())
    offline = f"rates them {EXPOSURE['engine']}, {EXPOSURE['docker']} and {EXPOSURE['guard']} (offline scoring"
    served = f"on a served lab host the engine and guard units of a rank group rate {LAB_EXPOSURE['engine']} and "
    served += f"{LAB_EXPOSURE['guard']}"
    assert offline in readme and served in readme, (offline, served)


@pytest.mark.skipif(not _offline_analyze(), reason="systemd-analyze security --offline needs systemd >= 250")
def test_engine_and_guard_units_score_within_the_exposure_budget(tmp_path):
    """The figures the README claims are the test's thresholds (README.md, Secrets)."""
    engine, guard = tp2_units()
    engine_score = exposure(tmp_path, "sglang-tiny-cpu-tp2-server.service", engine)
    guard_score = exposure(tmp_path, "sglang-tiny-cpu-tp2-server-rank-guard.service", guard)
    print(f"\nsystemd-analyze security --offline: engine unit {engine_score}, rank guard unit {guard_score}")
    assert engine_score <= EXPOSURE["engine"] and guard_score <= EXPOSURE["guard"]
    assert "IPAddressDeny=any" in guard.splitlines()  # scored with its network filter, as the lab's addresses give


def test_hardening_leaves_what_gpu_serving_needs():
    engine, guard = tp2_units()
    # the JIT cache: systemd's CacheDirectory= (created and handed to the engine's user before the sandbox, and
    # writable in it), no ReadWritePaths= root would have to create
    assert "CacheDirectory=ironserve/jit/tiny-cpu-tp2/0.5.23" in engine.splitlines()
    assert "CacheDirectoryMode=0750" in engine.splitlines()
    # the guard's records: a runtime directory systemd creates before the sandbox (a ReadWritePaths= path that
    # does not exist yet fails every start with 226/NAMESPACE, its ExecStartPre=+ included)
    assert "RuntimeDirectory=ironserve/rank-groups ironserve/backoff" in guard.splitlines()
    # the engine's backoff record is written by its ExecStartPre=+/ExecStopPost=+ (outside the sandbox): no
    # RuntimeDirectory=, which systemd would chown to the engine's user
    assert "ReadWritePaths" not in guard + engine
    assert not [x for x in engine.splitlines() if x.startswith("RuntimeDirectory")]
    for line in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "RestrictSUIDSGID=yes",
    ):
        assert line in engine.splitlines() and line in guard.splitlines(), line
    # GPUs are devices: nothing that closes the device policy (ProtectClock= and PrivateDevices= do)
    assert "PrivateDevices" not in engine and "ProtectClock" not in engine and "DeviceAllow" not in engine
    # caches under HOME land in the JIT directory; the engine's user creates HOME there itself: root never
    # creates, chowns or follows a path inside a directory the engine's user can write (a link planted there)
    assert "HOME=/var/cache/ironserve/jit/tiny-cpu-tp2/0.5.23/home" in engine
    # Python's bytecode there too: the venv is installed without it (root's, unwritable to the engine's user)
    assert " PYTHONPYCACHEPREFIX=/var/cache/ironserve/jit/tiny-cpu-tp2/0.5.23/bytecode" in engine
    assert "ExecStartPre=/usr/bin/mkdir -p /var/cache/ironserve/jit/tiny-cpu-tp2/0.5.23/home" in engine.splitlines()
    root_steps = [x for x in engine.splitlines() if x.startswith(("ExecStartPre=+", "ExecStopPost=+", "ExecStart=+"))]
    assert root_steps and not [x for x in root_steps if "/var/cache" in x or "install" in x or "chown" in x]
    # root's Python never reads what the engine's user writes: isolated from the environment those lines set
    root_python = [x for x in [*root_steps, *guard.splitlines()] if "/usr/bin/python3" in x]
    assert len(root_python) == 5 and all("/usr/bin/python3 -I " in x for x in root_python), root_python


def test_roots_backoff_step_runs_nothing_the_engines_user_wrote(tmp_path):
    """The engine unit's root step, as systemd runs it (the unit's environment: HOME and the bytecode cache in the
    engine's JIT directory): a .pth the engine's user left in ~/.local is not run, and no bytecode is written there."""
    engine, _ = tp2_units()
    step = next(x for x in engine.splitlines() if x.startswith("ExecStartPre=+"))
    argv = step.removeprefix("ExecStartPre=+").split()
    assert argv[0] == "/usr/bin/python3"
    home, cache, marker = tmp_path / "home", tmp_path / "bytecode", tmp_path / "ran-as-root"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = home / ".local" / "lib" / version / "site-packages"
    site.mkdir(parents=True)
    (site / "planted.pth").write_text(f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "systemctl").chmod(0o755)
    env = {
        "HOME": str(home),
        "PYTHONPYCACHEPREFIX": str(cache),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "IRONSERVE_BACKOFF_DIR": str(tmp_path),
    }
    # a system interpreter as /usr/bin/python3 is (a venv's never reads a user site)
    run = [getattr(sys, "_base_executable", sys.executable), *argv[1:]]
    run[run.index(argv[2])] = str(BACKOFF)  # the script as installed: the repository's copy
    subprocess.run(run, env=env, check=True, capture_output=True, timeout=30)
    assert not marker.exists() and not cache.exists()
    # the same step without -I runs the planted file: the test sees what it guards against
    subprocess.run([x for x in run if x != "-I"], env=env, check=True, capture_output=True, timeout=30)
    assert marker.exists() and cache.exists()


def test_uv_engines_run_as_the_engine_user_with_their_device_groups():
    """A dedicated system user, never root: CPU engines with no extra group, NVIDIA GPUs with video/render,
    Ascend NPUs with the driver's group; the router with none; a host key file handed over by systemd."""
    from ironserve import catalogue

    engine, guard = tp2_units()
    assert "User=ironserve-engine" in engine.splitlines() and "Group=ironserve-engine" in engine.splitlines()
    assert "SupplementaryGroups" not in engine and "LoadCredential" not in engine  # CPU; the key is in the env file
    assert "User=" not in guard  # the guard restarts units: root, confined
    seen = {}
    for recipe in catalogue.catalogue().values():
        for proc in render(recipe).processes:
            text = unit_files(recipe, proc, recipe.tuning or _tuning()).unit_text
            # whatever runs from a venv on the host runs as the engine user (a docker recipe's router from its
            # own venv too); a docker unit runs the client as root
            assert ("User=ironserve-engine" in text.splitlines()) == (not in_container(recipe, proc)), (
                recipe.id,
                proc.unit,
            )
            assert "User=None" not in text
            if not isinstance(recipe.runtime, UvRuntime):
                continue
            groups = next((line for line in text.splitlines() if line.startswith("SupplementaryGroups=")), "")
            seen.setdefault(
                (recipe.group_server(recipe.topology.groups[proc.group]).device if proc.role != "router" else "router"),
                set(),
            ).add(groups)
    assert seen[None] == {"SupplementaryGroups=video render"}, seen
    assert seen["npu"] == {"SupplementaryGroups=HwHiAiUser"} and seen["cpu"] == {""}, seen
    assert seen.get("router", {""}) == {""}
    recipe = get_recipe("tiny-cpu-tp2")
    proc = render(recipe).processes[0]
    keyed = unit_files(recipe, proc, _tuning(), {"IRONSERVE_API_KEY_FILE": "/etc/keys/api%key"}).unit_text
    assert "LoadCredential=ironserve-api-key:/etc/keys/api%%key" in keyed.splitlines()


def test_the_launcher_reads_a_host_key_file_through_systemds_credential(tmp_path):
    """The engine's user cannot open the root-only key file: ironserve-exec reads the copy systemd hands it."""
    module = load_script("ironserve-exec")
    (tmp_path / "ironserve-api-key").write_text("from-credential\n")
    env = {"IRONSERVE_API_KEY_FILE": "/nonexistent/root-only", "CREDENTIALS_DIRECTORY": str(tmp_path)}
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        assert module.api_key() == "from-credential"
        assert "IRONSERVE_API_KEY_FILE" not in os.environ  # children do not inherit where it is
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _docker_unit() -> str:
    from ironserve import catalogue
    from ironserve.spec import DockerRuntime

    docker = next(r for r in catalogue.catalogue().values() if isinstance(r.runtime, DockerRuntime))
    proc = render(docker).processes[0]
    return unit_files(docker, proc, docker.tuning or _tuning()).unit_text


def test_docker_units_confine_the_client_as_far_as_it_allows():
    text = _docker_unit()
    assert "ironserve-backoff wait" in text and "User=" not in text  # the daemon's socket: root
    for line in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "RestrictSUIDSGID=yes",
        "RestrictNamespaces=yes",
        "CapabilityBoundingSet=",
    ):
        assert line in text.splitlines(), line
    assert "ReadWritePaths" not in text  # the client writes nothing on the host


@pytest.mark.skipif(not _offline_analyze(), reason="systemd-analyze security --offline needs systemd >= 250")
def test_docker_unit_scores_within_the_exposure_budget(tmp_path):
    score = exposure(tmp_path, "sglang-docker.service", _docker_unit())
    print(f"\nsystemd-analyze security --offline: docker engine unit {score}")
    assert score <= EXPOSURE["docker"]


def test_restart_storms_are_bounded_without_restart_steps():
    engine, guard = tp2_units()
    assert "RestartSteps" not in engine  # ignored before systemd 254: the backoff helper works everywhere
    for unit, text in (("sglang-tiny-cpu-tp2-server", engine), ("sglang-tiny-cpu-tp2-server-rank-guard", guard)):
        assert f"ExecStartPre=+/usr/bin/python3 -I /usr/local/lib/ironserve/ironserve-backoff wait {unit} " in text
        assert f"ExecStopPost=+/usr/bin/python3 -I /usr/local/lib/ironserve/ironserve-backoff record {unit}" in text
    # the wait stays well inside TimeoutStartSec, which counts it
    assert "ironserve-backoff wait sglang-tiny-cpu-tp2-server 450" in engine and "TimeoutStartSec=900" in engine


def _backoff(tmp_path: Path, *args: str, result: str | None = None, n_restarts: str | None = "1") -> str:
    """Run the real ironserve-backoff with a stand-in ``systemctl`` answering NRestarts (None: systemd unreachable)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "systemctl"
    stub.write_text("#!/bin/sh\nexit 1\n" if n_restarts is None else f"#!/bin/sh\necho {n_restarts}\n")
    stub.chmod(0o755)
    env = {**os.environ, "IRONSERVE_BACKOFF_DIR": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    if result:
        env["SERVICE_RESULT"] = result
    return subprocess.run(
        [sys.executable, str(BACKOFF), *args], env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout


def _backoff_module():
    return load_script(BACKOFF.name)


def test_backoff_counts_failures_and_a_clean_stop_clears_them(tmp_path):
    module = _backoff_module()
    assert [module.delay(n) for n in range(10)] == [0, 0, 0, 15, 30, 60, 120, 240, 480, 600]
    assert module.delay(9, limit=450) == 450
    for _ in range(4):
        _backoff(tmp_path, "record", "u", result="exit-code")
    assert len(json.loads((tmp_path / "u.json").read_text())["failures"]) == 4
    # an automatic restart (NRestarts 4): the crash loop waits (30s, capped at 1)
    assert "4 failures within 1800s: waiting 1s" in _backoff(tmp_path, "wait", "u", "1", n_restarts="4")
    # systemd cannot be asked: counted as automatic (bounded, never a storm)
    assert "waiting 1s" in _backoff(tmp_path, "wait", "u", "1", n_restarts=None)
    _backoff(tmp_path, "record", "u", result="success")  # a clean stop
    assert json.loads((tmp_path / "u.json").read_text())["failures"] == []
    assert _backoff(tmp_path, "wait", "u") == ""
    # old failures fall out of the window
    module.record("v", "signal", str(tmp_path), now=0.0)
    assert module.failures("v", str(tmp_path), now=module.WINDOW_S + 1) == []


def test_deliberate_starts_never_wait_and_forget_the_failures(tmp_path):
    """A group restart by the rank guard (SIGKILL: a failure to systemd), a follower joining rank 0's new group, a
    deploy or rollback: systemd's NRestarts is 0 at their start (systemd resets it; ironserve.units.deliberate and
    the guard run reset-failed first). Such a start never waits and clears the record; a crash loop still backs
    off."""
    for _ in range(6):  # earlier group restarts and crashes
        _backoff(tmp_path, "record", "u", result="signal")
    out = _backoff(tmp_path, "wait", "u", "1", n_restarts="0")
    assert "started on purpose" in out and "waiting" not in out
    assert json.loads((tmp_path / "u.json").read_text())["failures"] == []
    # after it, a real crash loop starts counting from zero: FREE quick retries, then waits
    waits = []
    for n in range(1, 6):
        _backoff(tmp_path, "record", "u", result="exit-code")
        waits.append("waiting 1s" in _backoff(tmp_path, "wait", "u", "1", n_restarts=str(n)))
    assert waits == [False, False, True, True, True]


def test_deliberate_restarts_reset_systemds_count_first():
    from ironserve.units import deliberate

    assert deliberate("restart", "sglang-x") == (
        "systemctl reset-failed sglang-x.service 2>/dev/null; systemctl restart sglang-x.service"
    )
    with pytest.raises(AssertionError):
        deliberate("stop", "sglang-x")


def _ctx(host: str, **data):
    hosts = [
        (n, {"hardware": "cpu-lab", "ssh_hostname": a, "nic": "eth0", **data})
        for n, a in (("n0", "10.0.0.10"), ("n1", "10.0.0.11"))
    ]
    return build_context("tiny", host, hosts)


def test_serving_on_every_address_without_a_key_is_a_deploy_error(tmp_path):
    ctx = _ctx("n0", recipe="tiny-cpu-tp2")
    rank0 = ctx.processes[0]
    with pytest.raises(OperationError) as err:
        ss.refuse_open_bind(ctx, rank0, {})
    message = str(err.value)
    assert "n0: recipe tiny-cpu-tp2" in message and "0.0.0.0:30000" in message
    assert "host data api_key_file" in message and "allow_open_bind=true" in message
    ss.refuse_open_bind(ctx, rank0, {"IRONSERVE_API_KEY": "k"})  # keyed: fine
    ss.refuse_open_bind(_ctx("n0", recipe="tiny-cpu-tp2", allow_open_bind="true"), rank0, {})  # opted in
    # rank 1 serves no API (only its /health once joined): not an open API
    ss.refuse_open_bind(_ctx("n1", recipe="tiny-cpu-tp2"), _ctx("n1", recipe="tiny-cpu-tp2").processes[0], {})


def test_weights_in_a_home_directory_stay_readable():
    import dataclasses

    from ironserve.units import protect_home

    proc = render(get_recipe("tiny-cpu-tp2")).processes[0]
    assert protect_home(dataclasses.replace(proc, model_path="/home/gpusvr/Qwen")) == "read-only"
    assert protect_home(dataclasses.replace(proc, model_path="/homework/m")) == "yes"
    assert protect_home(dataclasses.replace(proc, model_path="/mnt/models/x")) == "yes"
