"""End to end on the lab: GLM-5 on two hosts with stand-in RTX PRO 6000 Max-Q GPUs.

The production deploy (`pyinfra -y inventories/lab.py deploys/glm5.py`) takes fresh lab hosts to enabled,
validated units; a second run plans no change; the audit derived from the same declaration is clean, finds
each injected drift on the right host and check, and is clean again after a redeploy.
"""

from __future__ import annotations

import json
import runpy
import shlex
import subprocess
import time

import pytest

from ironserve import catalogue
from ironserve.inventory import InventoryHost
from ironserve.render import render
from roles import sglang_service as ss

from . import labcli
from .labcli import ROOT, ironserve, lab_down, pyinfra, run  # noqa: F401

pytestmark = pytest.mark.lab

RECIPE = "glm5-nvfp4-mtp-rtx6000-tp8"
UNIT = f"sglang-{RECIPE}-server"
# launch=false (stand-in GPUs): the configuration is staged and validated, nothing of it live (roles/launch.py)
STAGED_UNIT = f"/etc/ironserve/staged/etc/systemd/system/{UNIT}.service"
STAGED_ENV = f"/etc/ironserve/staged/etc/ironserve/{UNIT}.env"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    hosts, api_key_file = labcli.up_with_api_key(tmp_path_factory, 2, "rtx6000-pro-maxq")
    try:
        yield {"hosts": hosts, "api_key_file": api_key_file}
    finally:
        lab_down()


def ssh(lab, host: dict, command: str, check: bool = True) -> subprocess.CompletedProcess:
    return labcli.ssh(host, command, check=check)


@pytest.fixture(scope="module")
def deployed(lab):
    started = time.monotonic()
    first = pyinfra("-y", "deploys/glm5.py", "--data", f"api_key_file={lab['api_key_file']}")
    lab["first_run_s"] = time.monotonic() - started
    lab["first_run_output"] = first.stdout + first.stderr
    return lab


def changes(plan: list[dict]) -> list[str]:
    return [
        f"{op['name']} on {op['hosts_with_change'] + op['hosts_with_conditional_change']}"
        for op in plan
        if op["hosts_with_change"] or op["hosts_with_conditional_change"]
    ]


def test_real_engine_pulls_the_site_locked_image_and_builds_the_derived_one(deployed):
    """The real Docker engine (Debian's docker.io) on both hosts: the same stand-in image pulled by the site
    lock's digest from the lab registry, and the recipe's derived image built for real (its RUN lines ran: the
    pip install from the lab index, the sed edit of the image's SGLang checkout)."""
    lock = json.loads(ironserve("lab", "status", "--format", "json").stdout)["image_lock"]
    site = json.loads(open(lock).read())["docker"]["lmsysorg/sglang:glm5-blackwell"]
    assert site["replaces"] == "sha256:426d1fa4b10722688678b99d817c2caa92a89eed4a8ee2927ab44a848bbe77df"
    derived = f"ironserve/{RECIPE}:derived"
    for host in deployed["hosts"]:
        assert ssh(deployed, host, "head -c 4 /usr/sbin/dockerd | od -An -c").stdout.split() == ["177", "E", "L", "F"]
        assert "Server Version: 20.10" in ssh(deployed, host, "docker info").stdout
        digests = ssh(
            deployed,
            host,
            f"docker image inspect --format '{{{{json .RepoDigests}}}}' lmsysorg/sglang@{site['digest']}",
        ).stdout
        assert f"lmsysorg/sglang@{site['digest']}" in digests
        # one container per host (each start imports SGLang): the sed edit, then the versions the pip install left
        out = ssh(
            deployed,
            host,
            f"docker run --rm --network none --entrypoint /bin/sh {derived} -c 'grep -c "
            '"DEEPGEMM_SCALE_UE8M0 = False" /sgl-workspace/sglang/python/sglang/srt/layers/'
            'deep_gemm_wrapper/configurer.py && python3 -c "import sglang, transformers; '
            "print(sglang.__version__, transformers.__version__)\"'",
        ).stdout.split()
        assert out == ["1", "0.5.9", "5.2.0"]


def test_parse_probe_runs_the_images_own_sglang_parser(deployed):
    """The deploy's parse check (`docker run --rm IMAGE python3 ...`) is the image's SGLang parser in the real
    engine: the recipe's argv passes, an unknown flag and a bad choice get the parser's own messages."""
    host = deployed["hosts"][0]
    recipe = catalogue.get_recipe(RECIPE)
    inventory = [InventoryHost(n, d) for n, d in runpy.run_path(str(labcli.ROOT / "inventories/lab.py"))["lab_hosts"]]
    proc = render(recipe, inventory).processes[0]
    probe = ss.parse_check_argv(recipe, proc)
    assert probe[:2] == ["docker", "run"] and f"ironserve/{RECIPE}:derived" in probe
    # three probes at once (each imports SGLang)
    argvs = [probe, probe + ["--no-such-flag", "1"], probe + ["--kv-cache-dtype", "fp3"]]
    script = " ".join(
        f"( {ss.ParseCheck().command(probe=shlex.join(a))} ) > /tmp/ironlab-probe-{n} 2>&1 &"
        for n, a in enumerate(argvs)
    )
    script += " wait; " + " ".join(f"cat /tmp/ironlab-probe-{n}; echo ironlab-probe-end;" for n in range(len(argvs)))
    # quoted for the remote shell as one word: $? must reach the host's sh, not the login shell
    outputs = run(
        "ssh",
        "-i",
        host["ssh_key"],
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        f"{host['ssh_user']}@{host['address']}",
        f"sudo sh -c {shlex.quote(script)}",
        timeout=300,
    ).stdout.split("ironlab-probe-end\n")
    ok, bad, choice = (ss.ParseCheck().process(o.splitlines()) for o in outputs[:3])
    assert ok["rc"] == 0, ok["output"]
    assert bad["rc"] == 2 and "unrecognized arguments: --no-such-flag 1" in bad["output"]
    assert choice["rc"] == 2 and "argument --kv-cache-dtype: invalid choice: 'fp3'" in choice["output"]


def test_gpus_take_the_toolkits_hook_which_fails_without_a_driver(deployed):
    """dockerd registered the toolkit's hook for --gpus; with the driver unable to answer (its module gone, as
    after a kernel update without the DKMS rebuild, and not loaded) the hook fails the container's start as the
    real one does."""
    host = deployed["hosts"][0]
    image = f"ironserve/{RECIPE}:derived"
    ok = ssh(deployed, host, f"docker run --rm --gpus all --network none --entrypoint true {image}", check=False)
    assert ok.returncode == 0, ok.stderr
    ssh(deployed, host, "mv /var/lib/dkms/nvidia /var/lib/dkms/nvidia.away && rm /run/ironlab-standins/nvidia-loaded")
    try:
        bad = ssh(deployed, host, f"docker run --rm --gpus all --network none --entrypoint true {image}", check=False)
    finally:
        ssh(deployed, host, "mv /var/lib/dkms/nvidia.away /var/lib/dkms/nvidia && nvidia-smi -L >/dev/null")
    assert bad.returncode != 0 and "driver not loaded" in bad.stderr


def test_second_run_plans_no_change(deployed):
    out = pyinfra("deploys/glm5.py", "--dry", "--json", "--data", f"api_key_file={deployed['api_key_file']}")
    plan = json.loads(out.stdout)["plan"]
    assert plan, "the dry run planned no operation at all"
    assert not changes(plan), changes(plan)


def test_noop_reads_each_host_in_a_few_commands(deployed):
    """A no-op after the apply: the facts of the prepare stage come from one batched read per host
    (roles/host_state.py); the launch stage's few reads stay their own."""
    out = pyinfra("-y", "--debug", "deploys/glm5.py", "--data", f"api_key_file={deployed['api_key_file']}")
    log = out.stdout + out.stderr
    for host in deployed["hosts"]:
        sent = log.count(f"Running command on {host['name']}:")
        assert 0 < sent <= 10, f"{host['name']}: {sent} ssh commands in a no-op"


def test_units_staged_validated_not_live(deployed):
    for host in deployed["hosts"]:
        unit = ssh(deployed, host, f"cat {STAGED_UNIT}").stdout
        assert "node rank 0/1" in unit  # single-node recipe: each host runs its own instance, rank 0
        assert "--tp-size 8" in unit and "--kv-cache-dtype bf16" in unit
        # stand-in GPUs cannot serve: the lab inventory sets launch=false, which changes nothing that runs
        assert ssh(deployed, host, f"test -e /etc/systemd/system/{UNIT}.service", check=False).returncode != 0
        assert ssh(deployed, host, f"systemctl is-active {UNIT}", check=False).stdout.strip() != "active"


def test_secrets_only_in_a_root_0600_env_file(deployed):
    for host in deployed["hosts"]:
        stat = ssh(deployed, host, f"stat -c '%a %U' {STAGED_ENV}").stdout.split()
        assert stat == ["600", "root"]
        assert ssh(deployed, host, "stat -c '%a' /etc/ironserve/staged").stdout.strip() == "700"
        unit = ssh(deployed, host, f"cat {STAGED_UNIT}").stdout
        assert "s3cret" not in unit
        as_user = ssh(deployed, host, f"su -s /bin/sh nobody -c 'cat {STAGED_ENV}'", check=False)
        assert as_user.returncode != 0
        # no key-in-ps check here: launch=false starts nothing; it is made where engines run
        # (tests/e2e/cpu3/test_1_serve_tiny_lab.py, tests/e2e/test_rank_group_lab.py)


def test_hardware_tuning_applied(deployed):
    for host in deployed["hosts"]:
        governors = set(ssh(deployed, host, "cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor").stdout.split())
        assert governors == {"performance"}
        assert ssh(deployed, host, "sysctl -n vm.swappiness").stdout.strip() == "0"
        assert "vm.swappiness = 0" in ssh(deployed, host, "cat /etc/sysctl.d/90-ironserve.conf").stdout
        assert "580.95.05" in ssh(deployed, host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout
        offsets = ssh(
            deployed, host, "/opt/ironserve/tools/bin/python /usr/local/lib/ironserve/ironserve-gpu-clocks.py --read"
        ).stdout
        assert set(offsets.split()) == {"4000"} or "4000" in offsets


def audit(deployed, *extra: str, check: bool = False):
    return ironserve(
        "audit",
        "inventories/lab.py",
        "deploys/glm5.py",
        "--format",
        "json",
        "--data",
        f"api_key_file={deployed['api_key_file']}",
        *extra,
        check=check,
    )


def test_audit_clean_then_drift_then_clean(deployed):
    first = audit(deployed)
    report = json.loads(first.stdout)
    assert first.returncode == 0, [r for r in report["results"] if not r["ok"]]
    a, b = deployed["hosts"][0], deployed["hosts"][1]
    injected = {
        (a["name"], f"unit-file:{UNIT}.service"): f"sed -i 's/--mem-fraction-static 0.85/--mem-fraction-static 0.95/'"
        f" {STAGED_UNIT}",
        (a["name"], "cpu-governor"): "echo powersave > /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
        (b["name"], "file:/etc/sysctl.d/90-ironserve.conf"): "rm /etc/sysctl.d/90-ironserve.conf",
        (b["name"], f"env-file:{UNIT}.service"): f"chmod 644 {STAGED_ENV}",
        (b["name"], "package:cuda-toolkit-13-0"): "dpkg -r --force-depends cuda-toolkit-13-0",
        (a["name"], "file:/mnt/nccl_graph_opt.xml"): "echo '<!-- edited -->' >> /mnt/nccl_graph_opt.xml",
    }
    hosts = {h["name"]: h for h in deployed["hosts"]}
    for (name, _), command in injected.items():
        ssh(deployed, hosts[name], command)
    drifted = audit(deployed)
    assert drifted.returncode == 1
    bad = {(r["host"], r["check"]) for r in json.loads(drifted.stdout)["results"] if not r["ok"]}
    assert set(injected) <= bad, set(injected) - bad
    assert all(
        r["fix"].startswith("pyinfra inventories/lab.py deploys/glm5.py --limit ")
        for r in json.loads(drifted.stdout)["results"]
        if not r["ok"]
    )
    pyinfra("-y", "deploys/glm5.py", "--data", f"api_key_file={deployed['api_key_file']}")
    again = audit(deployed)
    assert again.returncode == 0, [r for r in json.loads(again.stdout)["results"] if not r["ok"]]


def test_audit_junit_and_unreachable(deployed, tmp_path):
    junit = tmp_path / "audit.xml"
    out = ironserve(
        "audit",
        "inventories/lab.py",
        "deploys/glm5.py",
        "--format",
        "junit",
        "--junit-file",
        str(junit),
        "--data",
        f"api_key_file={deployed['api_key_file']}",
        check=False,
    )
    assert out.returncode == 0 and "<testsuite" in junit.read_text()
    # an address on the lab bridge with no host behind it: unreachable, exit 2
    bad_inventory = tmp_path / "bad.py"
    bad_inventory.write_text(
        "import runpy\n"
        f"_lab = runpy.run_path({str(ROOT / 'inventories/lab.py')!r})\n"
        "lab_hosts = [(n, {**d, 'ssh_hostname': '10.213.7.250'}) if i == 1 else (n, d)"
        " for i, (n, d) in enumerate(_lab['lab_hosts'])]\n"
    )
    assert ironserve("audit", str(bad_inventory), "deploys/glm5.py", check=False).returncode == 2


def test_status_reports_endpoint_and_prepared_units(deployed):
    out = ironserve(
        "status",
        "inventories/lab.py",
        "deploys/glm5.py",
        "--format",
        "json",
        "--data",
        f"api_key_file={deployed['api_key_file']}",
        check=False,
    )
    report = json.loads(out.stdout)
    assert out.returncode == 0, report
    assert report["served_model_name"] == "glm-5" and report["endpoint"].endswith(":5000")
    assert report["launch"] is False
    units = [u for h in report["hosts"] for u in h["units"]]
    assert len(units) == 2 and all(u["active"] == "inactive" and u["health"] is None for u in units)
