"""Every sink quotes, whatever validation let through: values built directly (bypassing the grammars of
ironserve.spec) reach the host's shell as data. Each command is run by bash in a scratch directory holding the
hostile path, and must neither run what the value spells nor lose it (the pyinfra-testing fixtures
tests/operations/*/hostile_* show the same for the operations' rendered commands)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from ironserve.units import WEIGHTS_PEER
from roles import ascend, gpu_clocks, host_tuning, model_weights, nvidia_driver, weights_peers

# each spelling would create a file named pwned* in the working directory if a shell read it as syntax
HOSTILE = [
    "x;touch pwned1",
    "$(touch pwned2)",
    "`touch pwned3`",
    "x|touch pwned4",
    "x&&touch pwned5",
    'x"$(touch pwned6)"',
    "x'$(touch pwned7)'",
    "x\ntouch pwned8",
    "x>pwned9",
]


def _bash(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=30)


def _nothing_ran(cwd: Path) -> None:
    assert not list(cwd.glob("pwned*")), sorted(p.name for p in cwd.glob("pwned*"))


@pytest.mark.parametrize("bad", HOSTILE)
def test_manifest_check_failure_message_runs_nothing(tmp_path, bad):
    """The recipe's model.path once reached a root shell inside an echo's double quotes when the check failed."""
    weights = tmp_path / f"w{bad}"
    weights.mkdir()
    (weights / model_weights.MANIFEST).write_text("0" * 64 + "  config.json\n")
    (weights / "config.json").write_text("{}")
    out = _bash(model_weights.manifest_check_command(str(weights)), tmp_path)
    assert out.returncode == 1 and str(weights) in out.stderr, out.stderr
    _nothing_ran(tmp_path)


@pytest.mark.parametrize("bad", HOSTILE)
def test_the_hub_download_quotes_path_and_venv(tmp_path, bad):
    """The helper runs `hf download` from its argv (no shell but the venv's own `sh -c`, the venv quoted in it)."""
    argv, env = model_weights.hf_download(
        "org/model", f"{tmp_path}/m{bad}", venv=f"{tmp_path}/v{bad}", endpoint=f"https://hub.example/{bad}"
    )
    out = subprocess.run(
        [*argv, "--revision", "0" * 40],
        cwd=tmp_path,
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0  # no hub client in the venv: the download fails, running nothing else
    _nothing_ran(tmp_path)


@pytest.mark.parametrize("bad", HOSTILE)
def test_the_weights_helper_gets_paths_and_addresses_as_words(bad):
    config = {"root": f"/m{bad}", "repo": "org/model", "peer": f"10.0.0.2{bad}"}
    assert shlex.split(weights_peers.helper_command("fetch", config)) == [
        WEIGHTS_PEER,
        "fetch",
        json.dumps(config, sort_keys=True),
    ]
    words = shlex.split(weights_peers.lend_command(f"/m{bad}", "10.0.0.1", 8790, "/etc/k", ["10.0.0.2"], 2))
    assert f"/m{bad}" in words and "10.0.0.1" in words


@pytest.mark.parametrize("bad", HOSTILE)
def test_ascend_versions_fact_quotes_the_install_path(tmp_path, bad):
    root = tmp_path / f"A{bad}"
    for script in ascend.SET_ENV:
        (root / script).parent.mkdir(parents=True, exist_ok=True)
        (root / script).write_text("")
    (root / "driver").mkdir()
    (root / "driver" / "version.info").write_text("Version=25.2.0\n")
    out = _bash(ascend.AscendVersions().command(str(root)), tmp_path)
    _nothing_ran(tmp_path)
    if "\n" not in bad:  # a newline in the path splits the fact's own output lines; it still runs nothing
        fact = ascend.AscendVersions().process(out.stdout.splitlines())
        assert fact["driver"] == "25.2.0" and fact["set_env"] == [f"{root}/{s}" for s in ascend.SET_ENV]


def test_ascend_installer_gets_the_install_path_as_one_word():
    command = ascend.run_command("driver", "/var/cache/ironserve/ascend/d.run", "/opt/A;touch /tmp/pwned")
    assert shlex.split(command) == [
        "/var/cache/ironserve/ascend/d.run",
        "--full",
        "--quiet",
        "--install-path=/opt/A;touch /tmp/pwned",
    ]
    assert ascend.run_command("toolkit", "/c/t.run") == "/c/t.run --install --quiet"


@pytest.mark.parametrize("bad", HOSTILE)
def test_gpu_clock_fact_and_index_are_quoted(tmp_path, bad):
    out = _bash(
        gpu_clocks.MemClockOffsets().command(python=f"{tmp_path}/p{bad}", script=f"{tmp_path}/s{bad}"), tmp_path
    )
    assert out.returncode == 0
    _nothing_ran(tmp_path)
    index = f"https://mirror.example/{bad}"
    assert shlex.split(gpu_clocks.index_args(index)) == ["--index-url", index]
    assert gpu_clocks.index_args(None) is None


def test_gpu_clock_unit_quotes_its_paths_for_systemd():
    text = gpu_clocks.unit_text(1000, python="/opt/t v/bin/python", script="/usr/lib/$x.py")
    assert 'ExecStart="/opt/t v/bin/python" "/usr/lib/$$x.py" --offset 1000' in text


@pytest.mark.parametrize("bad", HOSTILE)
def test_sysctl_and_apt_facts_quote_their_names(tmp_path, bad):
    _bash(host_tuning.SysctlValues().command([f"vm.{bad}"]), tmp_path)
    _bash(nvidia_driver.AptVersions().command([f"pkg{bad}"]), tmp_path)
    _bash(nvidia_driver.NvidiaDriverState().command(f"pkg{bad}"), tmp_path)
    _nothing_ran(tmp_path)
