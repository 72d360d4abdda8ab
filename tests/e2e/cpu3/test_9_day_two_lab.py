"""Day two on the lab: change what serves without an outage (roles/rolling.py, roles/undeclared.py, the audit).

Runs last in the cpu3 package, on the deployment the modules before it leave serving (router on lab1, the two
tiny-cpu replicas on lab2 and lab3; keyed when the serving module's key tests ran). A client process sends chat
completions through the router the whole time of each deploy (bounded in count and time, lab addresses only):

(a) a changed server option of the same recipe rolls: 0 failed requests, both replicas report the new value in
    SGLang's /get_server_info; the canary is benchmarked before and after its change (canary_bench, bench_serving
    of the recipe's shape cut to 4 prompts) and judged against its own figures before (bench_min_ratio 0.02 here: the
    lab's hosts share two cores with the client and the other replica, so only a gross slowdown fails it);
(b) a configuration SGLang's parser accepts but that cannot start (--tokenizer-path to a missing directory): the
    canary fails, is rolled back and put back into the router, the deploy fails saying CANARY FAILED, 0 failed
    requests, both replicas on the previous configuration, the second replica's engine never restarted;
(c) a copy of the recipe under another id: afterwards no unit of the old recipe is active, enabled or on disk on
    any host, and the new one serves;
(d) a stray unit of ironserve's naming planted by hand is named by the audit (exit 1).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ..labcli import ROOT, ironserve, pyinfra, run_log, ssh
from .fleet import RECIPE, ROUTER_UNIT, SERVER_UNIT, chat, router_base
from .load_client import CHAT_TIMEOUT_S

pytestmark = pytest.mark.lab

LAB_KEY = "lab-s3cret-key"  # the key the serving module deploys (test_1_serve_tiny_lab.LAB_KEY)
NEW_ID = f"{RECIPE}-b"
# the canary's judgement in (a): only a gross slowdown (a canary that crawls or hangs) fails it. The two benchmarks
# run minutes apart on two cores the other replica (serving the client) and the lab's other hosts share: measured
# 0.58x alone, and 0.14x (TTFT 70 -> 494 ms, output 82 -> 24 tok/s) while the rank group module's engines started
MIN_RATIO = 0.02


class Client:
    """The load client (load_client.py) in a process of its own, sending through the router until stopped."""

    def __init__(self, base: str, key: str | None, results: Path):
        self.results_path = results
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text("")
        env = {**os.environ, "LOAD_CLIENT_KEY": key or ""}
        argv = [sys.executable, "-m", "tests.e2e.cpu3.load_client", base, str(results)]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> tuple[int, int, list]:
        """(failed, total, first failures). The request in flight when the deploy ended is waited for (bounded);
        one that never answers counts as failed, with where the client waits for it."""
        self.proc.send_signal(signal.SIGTERM)
        stuck = ""
        try:
            # urllib's timeout bounds each read: a connect and two reads at most
            self.proc.wait(2 * CHAT_TIMEOUT_S + 5)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # the client writes its stack to stderr
            time.sleep(1)
            self.proc.kill()
            stuck = self.proc.communicate(timeout=30)[1].decode(errors="replace")[-1500:]
        results = [json.loads(line) for line in self.results_path.read_text().splitlines() if line.strip()]
        failed = [r for r in results if r[1] != 200]
        if stuck:
            failed.append((time.monotonic(), 0, f"no answer when stopped, waiting in:\n{stuck}"))
        return len(failed), len(results) + bool(stuck), failed[:5]


@pytest.fixture(scope="module")
def day_two(deployed, tmp_path_factory):
    base = router_base(deployed)
    keyed = chat(base)[0] == 401
    data = []
    if keyed:
        key_file = tmp_path_factory.mktemp("day-two-key") / "api-key"
        key_file.write_text(LAB_KEY + "\n")
        data = ["--data", f"api_key_file={key_file}"]
    recipes = ROOT / "build" / "day-two-recipes"
    shutil.rmtree(recipes, ignore_errors=True)
    try:
        yield {
            "lab": deployed,
            "base": base,
            "key": LAB_KEY if keyed else None,
            "data": data,
            "recipes": recipes,
            "figures": [],
        }
    finally:
        shutil.rmtree(recipes, ignore_errors=True)


def variant(ctx, name: str, recipe_id: str = RECIPE, **server) -> str:
    """A copy of the lab recipe with other server options, as a file the deploy takes (host data recipe=)."""
    data = yaml.safe_load((ROOT / "recipes" / f"{RECIPE}.yaml").read_text())
    data["id"] = recipe_id
    extra = server.pop("extra_args", [])
    data["server"].update(server)
    data["server"]["extra_args"] = list(data["server"].get("extra_args", [])) + extra
    path = ctx["recipes"] / name / f"{recipe_id}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path.relative_to(ROOT))


def deploy_under_load(ctx, recipe: str, check: bool = True, data: tuple[str, ...] = ()):
    client = Client(ctx["base"], ctx["key"], ctx["recipes"].parent / "day-two-client.jsonl")
    time.sleep(3)  # the client is sending before the deploy starts
    started = time.monotonic()
    out = pyinfra("-y", "deploys/tiny.py", "--data", f"recipe={recipe}", *ctx["data"], *data, check=False, timeout=2400)
    took = time.monotonic() - started
    time.sleep(3)
    failed, total, samples = client.stop()
    text = out.stdout + out.stderr
    if check and out.returncode != 0:  # the roll's own lines, then what the hosts said before the results table
        raise AssertionError(f"the deploy failed ({out.returncode}): {roll_figures(text)}\n{run_log(text, 5000)}")
    return out, text, failed, total, samples, took


def server_info(ctx, host: dict) -> dict:
    auth = f"-H 'Authorization: Bearer {ctx['key']}' " if ctx["key"] else ""
    out = ssh(host, f"curl -s -m 10 {auth}http://127.0.0.1:30000/get_server_info", check=False)
    if out.returncode != 0:  # what the engine did since the deploy: its unit's restarts and its journal's last lines
        units = ssh(host, "systemctl list-units 'sglang-*' --all --no-legend --no-pager", check=False)
        journal = ssh(host, f"journalctl -u '{SERVER_UNIT}-*' -n 80 --no-pager -o short-precise", check=False)
        raise AssertionError(f"{host['name']}: curl exit {out.returncode}\n{units.stdout}\n{journal.stdout[-6000:]}")
    return json.loads(out.stdout)


def main_pid(host: dict, unit: str) -> tuple[str, str]:
    out = ssh(host, f"systemctl show -p MainPID -p ActiveEnterTimestampMonotonic --value {unit}").stdout.split()
    return out[0], out[1]


def roll_figures(text: str) -> list[str]:
    """The roll's own lines: the change plan's steps, time out of the router, drain times, in-flight requests
    cut, the canary's benchmark."""
    keep = re.compile(
        r"(Change plan of [^\n]*|  step [0-9]+: [^\n]*|out of the router; drained .*|"
        r"back in the router after [0-9.]+s out of it.*|canary benchmark [^\n]*|"
        r"CANARY FAILED: [^\n]*|ROLLED BACK [^\n]*|NOT ROLLED[^\n]*)"
    )
    return [m.group(0)[:400] for m in keep.finditer(text)]


def test_a_changed_option_rolls_without_a_failed_request(day_two):
    recipe = variant(day_two, "a", max_running_requests=3)
    bench = (
        "--data",
        "canary_bench=true",
        "--data",
        "canary_bench_prompts=4",
        "--data",
        f"bench_min_ratio={MIN_RATIO}",
    )
    out, text, failed, total, samples, took = deploy_under_load(day_two, recipe, data=bench)
    figures = roll_figures(text)
    print(f"\n(a) changed option: {failed} failed of {total} requests through the router; deploy {took:.0f}s")
    print("\n".join(f"    {line}" for line in figures))
    assert failed == 0, samples
    assert sum("back in the router after" in f for f in figures) == 2, text[-6000:]
    # the plan said it, per group; the canary alone was benchmarked, before and after, and judged
    assert any("step 1: sglang-tiny-cpu-server-0 on " in f and "the canary, alone" in f for f in figures), figures
    assert sum(f.startswith("canary benchmark before the change: 4 requests") for f in figures) == 1, figures
    judged = [f for f in figures if f.startswith("canary benchmark after the change against before")]
    assert len(judged) == 1 and "total_output_tok_s" in judged[0] and "SLOWER" not in judged[0], figures
    for host in day_two["lab"]["hosts"][1:]:
        assert server_info(day_two, host)["max_running_requests"] == 3, host["name"]
    day_two["recipe"] = recipe


def test_b_config_that_cannot_start_fails_the_canary(day_two):
    assert day_two.get("recipe"), "needs (a)"
    first, second = day_two["lab"]["hosts"][1:]
    before = main_pid(second, f"{SERVER_UNIT}-1")
    recipe = variant(
        day_two,
        "b",
        max_running_requests=3,
        extra_args=["--tokenizer-path", "/var/lib/ironserve/models/no-such-tokenizer"],
    )
    out, text, failed, total, samples, took = deploy_under_load(day_two, recipe, check=False)
    figures = roll_figures(text)
    print(
        f"\n(b) a configuration that cannot start: {failed} failed of {total} requests; deploy exit "
        f"{out.returncode} after {took:.0f}s"
    )
    print("\n".join(f"    {line}" for line in figures))
    assert out.returncode != 0, text[-4000:]
    assert "CANARY FAILED" in text and "Last journal lines" in text.split("CANARY FAILED", 1)[1], text[-6000:]
    assert "NOT ROLLED" in text, text[-6000:]  # the second replica's turn never came
    assert failed == 0, samples
    assert main_pid(second, f"{SERVER_UNIT}-1") == before, "the second replica was restarted"
    for host in (first, second):
        info = server_info(day_two, host)
        assert info["max_running_requests"] == 3 and not (info.get("tokenizer_path") or "").endswith(
            "no-such-tokenizer"
        ), host["name"]
    workers = ssh(
        day_two["lab"]["hosts"][0],
        "curl -s -m 10 "
        + (f"-H 'Authorization: Bearer {day_two['key']}' " if day_two["key"] else "")
        + "http://127.0.0.1:30000/workers",
    )
    urls = sorted(w["url"] for w in json.loads(workers.stdout)["workers"])
    assert urls == sorted(f"http://{h['address']}:30000" for h in (first, second)), urls


def test_c_switching_recipes_leaves_nothing_of_the_old_one(day_two):
    recipe = variant(day_two, "c", recipe_id=NEW_ID, max_running_requests=3)
    out, text, failed, total, samples, took = deploy_under_load(day_two, recipe)
    figures = roll_figures(text)
    print(
        f"\n(c) switch to {NEW_ID}: {failed} failed of {total} requests (the engine groups roll through the old "
        f"router; the router itself is replaced: its restart is the gap); deploy {took:.0f}s"
    )
    print("\n".join(f"    {line}" for line in figures))
    assert sum("back in the router after" in f for f in figures) == 2, text[-6000:]
    old = [ROUTER_UNIT, f"{SERVER_UNIT}-0", f"{SERVER_UNIT}-1"]
    for host in day_two["lab"]["hosts"]:
        for unit in old:
            state = ssh(
                host,
                f"systemctl is-active {unit}; systemctl is-enabled {unit}; ls /etc/systemd/system/{unit}.service",
                check=False,
            ).stdout.split()
            assert "active" not in state[:1] and "enabled" not in state[1:2], (host["name"], unit, state)
            assert f"/etc/systemd/system/{unit}.service" not in state, (host["name"], unit)
    code, answer = 0, ""
    for _ in range(10):  # bounded: the new router may still be registering its workers
        code, answer = chat(day_two["base"], key=day_two["key"])
        if code == 200:
            break
        time.sleep(3)
    assert code == 200, answer
    assert ssh(day_two["lab"]["hosts"][1], f"systemctl is-active sglang-{NEW_ID}-server-0").stdout.strip() == "active"
    day_two["recipe"] = recipe


def test_d_stray_unit_is_named_by_the_audit(day_two):
    assert day_two.get("recipe", "").endswith(f"{NEW_ID}.yaml"), "needs (c)"
    host = day_two["lab"]["hosts"][2]
    stray = "sglang-stray-server"
    unit = (
        "# managed by ironserve: do not edit (rerun the deploy). recipe stray\\n[Unit]\\nDescription=stray\\n"
        "[Service]\\nExecStart=/bin/sleep infinity\\n"
    )
    ssh(
        host,
        f"printf '{unit}' > /etc/systemd/system/{stray}.service && systemctl daemon-reload && systemctl start {stray}",
    )
    try:
        out = ironserve(
            "audit",
            "inventories/lab.py",
            "deploys/tiny.py",
            "--format",
            "json",
            "--data",
            f"recipe={day_two['recipe']}",
            *day_two["data"],
            check=False,
            timeout=600,
        )
        assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
        report = json.loads(out.stdout)
        drift = [r for r in report["results"] if not r["ok"]]
        strays = [r for r in drift if r["check"] == "units:undeclared"]
        assert [(r["host"], r["found"]) for r in strays] == [(host["name"], f"undeclared: {stray}.service")], drift
        print(
            f"\n(d) the audit names the stray unit: {strays[0]['host']} {strays[0]['found']}; other drift: "
            f"{[(r['host'], r['check'], r['found']) for r in drift if r not in strays]}"
        )
    finally:
        ssh(
            host,
            f"systemctl disable --now {stray}; rm -f /etc/systemd/system/{stray}.service; systemctl daemon-reload",
            check=False,
        )
