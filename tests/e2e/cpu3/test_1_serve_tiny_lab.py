"""End to end on the lab: real SGLang on CPU behind the real sglang_router, three cpu-lab hosts.

`ironserve lab up --nodes 3 --hardware cpu-lab` (the first host is the router host, the others the two
replicas of recipes/tiny-cpu.yaml), then the production deploy (`pyinfra -y inventories/lab.py deploys/tiny.py`):
uv venv from the lab's index, the generated model from its verified path, units, the launch stage with its
health gates. Then: the router host runs the router from its own small venv and has no engine runtime; a second
run plans no change; `ironserve status` gives the endpoint; a chat completion through the router answers; a worker
engine killed with SIGKILL is restarted by systemd while the router keeps answering. Requests go only to lab
addresses (the router host's address on the lab bridge), with bounded retries and timeouts.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest

from ironserve import catalogue
from ironserve.units import ENGINE_USER, VENV_ROOT, bytecode_dir, router_venv, venv_path

from ..labcli import ironserve, pyinfra, ssh
from .fleet import RECIPE, ROUTER_UNIT, SERVER_UNIT, changes, chat, router_base

pytestmark = pytest.mark.lab


def test_deploy_starts_every_unit(deployed):
    router, workers = deployed["hosts"][0], deployed["hosts"][1:]
    out = deployed["deploy_output"]
    # the replicas are started (and health-gated) before the router, whatever each host's other operations
    servers = out.index(f"Starting operation: Launch | Start {SERVER_UNIT}")
    assert servers < out.index(f"Starting operation: Launch | Start {ROUTER_UNIT}"), out[servers - 2000 :]
    assert ssh(router, f"systemctl is-active {ROUTER_UNIT}").stdout.strip() == "active"
    for i, host in enumerate(workers):
        assert ssh(host, f"systemctl is-active {SERVER_UNIT}-{i}").stdout.strip() == "active"
        assert ssh(host, "cat /etc/uv/uv.toml").stdout.count("exclude-dependencies") == 1


def test_the_router_host_runs_its_own_small_venv_and_no_engine_runtime(deployed):
    recipe = catalogue.get_recipe(RECIPE)
    router, worker = deployed["hosts"][0], deployed["hosts"][1]
    venv, runtime = router_venv(recipe), venv_path(recipe)
    out = ssh(
        router, f"ls -d {shlex.quote(VENV_ROOT)}/*; systemctl show -p ExecStart --value {shlex.quote(ROUTER_UNIT)}"
    )
    assert runtime not in out.stdout and f"path={venv}/bin/python3 " in out.stdout, out.stdout
    size_mb = int(ssh(router, shlex.join(["du", "-sm", venv])).stdout.split()[0])
    # the engine's runtime on a replica host, for the figure: GBs against the router's MBs
    engine_mb = int(ssh(worker, shlex.join(["du", "-sm", runtime])).stdout.split()[0])
    print(f"\nrouter venv {size_mb} MB on {router['name']}; engine runtime {engine_mb} MB on {worker['name']}")
    assert size_mb < 300 and engine_mb > 10 * size_mb


def test_the_engine_compiled_its_imports_into_its_jit_directory(deployed):
    """The venv is installed without bytecode (root's; 20,000 files, a few thousand imported): the engine's user
    compiled what the engine imports into its JIT directory (PYTHONPYCACHEPREFIX), and nothing into the venv."""
    recipe = catalogue.get_recipe(RECIPE)
    worker, venv, cache = deployed["hosts"][1], venv_path(recipe), bytecode_dir(recipe)
    # the scheduler: imported by the engine's spawned process only (root's parse check stops at the server's args)
    scheduler = "*/sglang/srt/managers/*scheduler.cpython-*.pyc"
    counts = [
        ["find", f"{venv}/lib", "-path", scheduler],
        ["find", cache, "-path", scheduler, "-user", ENGINE_USER],
        ["find", cache, "-name", "*.pyc"],
        ["find", venv, "-name", "*.pyc"],
        ["find", cache, "!", "-user", ENGINE_USER],
    ]
    out = ssh(worker, "; ".join(f"{shlex.join(argv)} | wc -l" for argv in counts))
    in_venv, in_cache, cached, venv_pycs, not_engines = (int(x) for x in out.stdout.split())
    # nothing there is root's: root's steps in the unit (the backoff) run Python isolated from the unit's
    # environment, so they neither write into the engine's directory nor block the engine from writing there
    assert in_venv == 0 and in_cache >= 1 and not_engines == 0, out.stdout
    print(f"\n{cached} modules compiled by the engine into its JIT directory; {venv_pycs} pycs in the venv (root's)")


def test_second_run_plans_no_change(deployed):
    out = pyinfra("deploys/tiny.py", "--dry", "--json", timeout=600)
    plan = json.loads(out.stdout)["plan"]
    assert plan, "the dry run planned no operation at all"
    assert not changes(plan), changes(plan)


def test_status_gives_the_endpoint(deployed):
    out = ironserve("status", "inventories/lab.py", "deploys/tiny.py", "--format", "json", check=False, timeout=300)
    report = json.loads(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    router = deployed["hosts"][0]
    assert report["endpoint"] == f"http://{router['address']}:30000"
    assert report["served_model_name"] == "tiny"
    assert [h["name"] for h in report["hosts"]] == [h["name"] for h in deployed["hosts"]]
    units = [u for h in report["hosts"] for u in h["units"]]
    assert len(units) == 3 and all(u["active"] == "active" for u in units), units


def test_chat_completion_through_the_router(deployed):
    base = router_base(deployed)
    code, text = 0, ""
    for _ in range(10):  # bounded: the router may still be registering the workers
        t0 = time.monotonic()
        code, text = chat(base)
        if code == 200:
            break
        time.sleep(3)
    assert code == 200, text
    assert text.strip(), "empty answer"
    print(f"\nchat completion through the router: {time.monotonic() - t0:.2f}s")


def test_killed_engine_is_restarted_and_router_keeps_answering(deployed):
    base = router_base(deployed)
    worker = deployed["hosts"][1]
    unit = f"{SERVER_UNIT}-0"
    before = ssh(worker, f"systemctl show -p MainPID --value {unit}").stdout.strip()
    assert before and before != "0"
    killed = time.monotonic()
    ssh(worker, f"systemctl kill --kill-who=main -s KILL {unit}")
    codes = []
    while time.monotonic() - killed < 30:  # bounded: requests through the router meanwhile
        code, text = chat(base, timeout=30)
        codes.append(code)
        assert code == 200, f"request {len(codes)} after the kill: {code} {text}"
        time.sleep(1)
    recovered = None
    while time.monotonic() - killed < 300:
        state = ssh(
            worker,
            f"systemctl is-active {unit}; systemctl show -p MainPID --value {unit}; "
            "curl -s -o /dev/null -m 5 -w '%{http_code}' http://127.0.0.1:30000/health",
            check=False,
        )
        lines = state.stdout.split()
        if len(lines) >= 3 and lines[0] == "active" and lines[1] not in ("0", before) and lines[2] == "200":
            recovered = time.monotonic() - killed
            break
        time.sleep(3)
    assert recovered is not None, f"{unit} not active and healthy again within 300s: {state.stdout}"
    code, text = chat(base)
    assert code == 200, text
    print(
        f"\n{len(codes)} requests through the router after the kill, all 200; {unit} healthy again after "
        f"{recovered:.0f}s"
    )


LAB_KEY = "lab-s3cret-key"  # the API key the last two tests deploy


def test_keyed_workers_behind_a_keyed_router(deployed, tmp_path):
    key = LAB_KEY
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    pyinfra("-y", "deploys/tiny.py", "--data", f"api_key_file={key_file}")
    base = router_base(deployed)
    code, text = 0, ""
    for _ in range(10):  # bounded: the router may still be registering the restarted workers
        code, text = chat(base, key=key)
        if code == 200:
            break
        time.sleep(3)
    assert code == 200, f"with the key through the router: {code} {text}"
    assert chat(base)[0] == 401, "the router answered a client without the key"
    worker = deployed["hosts"][1]
    assert chat(f"http://{worker['address']}:30000")[0] == 401, "a worker answered a client without the key"
    for host in deployed["hosts"]:
        assert key not in ssh(host, "ps -eo args").stdout, f"the key is on a command line on {host['name']}"


def test_bench_serving_through_the_keyed_router_names_no_key(deployed, tmp_path):
    """With the key deployed (the test before): bench_serving runs through the router (the key read on the host)
    and reports its figures; `ironserve status` (text and JSON), the bench deploy's output and its report name no
    secret value."""
    outputs = []
    for fmt in ("text", "json"):
        out = ironserve("status", "inventories/lab.py", "deploys/tiny.py", "--format", fmt, check=False, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        outputs.append(out.stdout + out.stderr)
    report = tmp_path / "bench.json"
    out = pyinfra(
        "-y", "-v", "deploys/bench.py", "--data", "model=tiny", "--data", f"bench_report={report}", timeout=900
    )
    outputs += [out.stdout + out.stderr, report.read_text()]
    assert "bench_serving against tiny-cpu: 8 requests completed" in outputs[2], outputs[2][-3000:]
    for text in outputs:
        assert LAB_KEY not in text, text[-3000:]
    data = json.loads(report.read_text())
    assert data["endpoint"] == router_base(deployed) and data["host"] == deployed["hosts"][1]["name"]
    assert data["result"]["completed"] == 8 and data["result"]["output_throughput"] > 0
    assert {r["metric"] for r in data["rows"]} >= {"total_output_tok_s", "tpot_ms"}
    print(
        f"\nbench_serving (8 prompts, 64 in / 16 out, concurrency 2) through the keyed router: "
        f"{data['result']['output_throughput']:.1f} output tok/s, mean TPOT {data['result']['mean_tpot_ms']:.1f} ms"
    )
