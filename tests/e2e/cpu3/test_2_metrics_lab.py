"""End to end on the lab: a real Prometheus scrapes every target of the 3-host cpu-lab deployment.

The deployment of tests/e2e/cpu3 (lab1 the router, lab2 and lab3 the tiny-cpu replicas; keyed when the serving
module ran before). Debian's `prometheus` (the distribution's package, its binary unpacked into the controller's
cache when none is installed: nothing is started as a service) runs on the loopback of this machine with a temporary
configuration whose only job reads the file_sd output of `ironserve status ... --format prometheus`, temporary
storage and a 2 s scrape interval. Then: every target is up; SGLang series come from both replicas, the router's
own series from the router host, ironserve_* series (the stage durations included) from all three hosts; each
query of the Grafana dashboard (docs/grafana/ironserve.json) returns data; no key or token is in the file_sd output,
the textfiles or any scraped series. A rerun of the deploy (which plans no change) writes its timings as JSON.
Requests go only to loopback and lab addresses, every wait bounded.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from ...prometheus_tools import prometheus_tool
from ..labcli import ROOT, ironserve, pyinfra, ssh
from .fleet import chat, router_base

pytestmark = pytest.mark.lab

LAB_KEY = "lab-s3cret-key"  # the key the serving module deploys (test_1_serve_tiny_lab.py)
DASHBOARD = ROOT / "docs" / "grafana" / "ironserve.json"
STAGES = {"preflight", "runtime", "units", "node_exporter", "launch_preflight", "engine_start", "router_start"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())["data"]["result"]


def key_for(lab) -> str | None:
    """The key the router wants (None: unkeyed): one chat without, then with the serving module's key."""
    base = router_base(lab)
    for _ in range(10):  # bounded: the router may still be registering workers
        code, _ = chat(base)
        if code == 200:
            return None
        if code == 401:
            return LAB_KEY
        time.sleep(3)
    raise AssertionError(f"the router at {base} does not answer")


@pytest.fixture(scope="module")
def prom(deployed, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prometheus")
    out = ironserve("status", "inventories/lab.py", "deploys/tiny.py", "--format", "prometheus", timeout=300)
    targets = json.loads(out.stdout)
    (tmp / "targets.json").write_text(out.stdout)
    config = {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [
            {
                "job_name": "ironserve",
                "file_sd_configs": [{"files": [str(tmp / "targets.json")], "refresh_interval": "5s"}],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            prometheus_tool("prometheus"),
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "prometheus.log", "w"),
    )
    base = f"http://127.0.0.1:{port}"
    key = key_for(deployed)
    for _ in range(4):  # traffic, so the engines' and the router's request series exist
        chat(router_base(deployed), key=key)
    try:
        yield {"base": base, "targets": targets, "text": out.stdout, "key": key, "tmp": tmp}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def wait_for(base: str, expr: str, ok, timeout_s: float = 90) -> list[dict]:
    deadline, result = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        try:
            result = query(base, expr)
        except OSError:
            result = []
        if ok(result):
            return result
        time.sleep(2)
    return result


def test_file_sd_names_every_engine_router_and_node_exporter(prom, deployed):
    roles = sorted((g["labels"]["role"], g["labels"]["host"]) for g in prom["targets"])
    names = [h["name"] for h in deployed["hosts"]]
    assert roles == sorted(
        [("node", n) for n in names] + [("router", names[0])] + [("server", n) for n in names[1:]]
    ), roles
    for group in prom["targets"]:
        assert set(group["labels"]) >= {"recipe", "role", "host"}
        if group["labels"]["role"] != "node":
            assert set(group["labels"]) >= {"group", "rank"}


def test_metrics_every_target_up(prom):
    want = len(prom["targets"])
    up = wait_for(
        prom["base"], 'up{job="ironserve"}', lambda r: len(r) == want and all(s["value"][1] == "1" for s in r)
    )
    assert len(up) == want and all(s["value"][1] == "1" for s in up), (
        up,
        (prom["tmp"] / "prometheus.log").read_text()[-2000:],
    )
    print(f"\nPrometheus: {want} targets, all up")


def test_metrics_engines_router_and_ironserve_series(prom, deployed):
    names = [h["name"] for h in deployed["hosts"]]
    base = prom["base"]
    # (Prometheus asks for escaped names: SGLang's sglang:x series are stored as sglang_x)
    sglang = wait_for(base, 'count by (host) ({__name__=~"sglang_.+"})', lambda r: len(r) == 2)
    assert sorted(s["metric"]["host"] for s in sglang) == names[1:], sglang
    router = wait_for(base, 'count by (host) ({role="router",__name__=~"smg_.+"})', lambda r: len(r) == 1)
    assert [s["metric"]["host"] for s in router] == names[:1], router
    own = wait_for(base, 'count by (host) ({__name__=~"ironserve_.+"})', lambda r: len(r) == 3)
    assert sorted(s["metric"]["host"] for s in own) == names, own
    stages = query(base, "ironserve_deploy_stage_seconds")
    for name in names:
        seen = {s["metric"]["stage"] for s in stages if s["metric"]["host"] == name}
        assert seen >= STAGES, (name, seen)
    assert all(s["value"][1] == "1" for s in query(base, "ironserve_deploy_last_success")), "a deploy failed"
    units = query(base, "ironserve_unit_live_info")
    assert sorted(s["metric"]["host"] for s in units) == names and all(
        len(s["metric"]["generation"]) == 12 for s in units
    ), units
    counts = {
        family: int(query(base, f'count({{__name__=~"{family}.+"}})')[0]["value"][1])
        for family in ("sglang_", "smg_", "ironserve_", "node_")
    }
    worst = max(stages, key=lambda s: float(s["value"][1]))
    print(
        f"\nseries: {counts}; engines' hosts {[s['metric']['host'] for s in sglang]}, "
        f"{int(sglang[0]['value'][1])} sglang series each; slowest stage {worst['metric']['stage']} "
        f"{float(worst['value'][1]):.1f}s on {worst['metric']['host']}"
    )


def test_metrics_dashboard_queries_return_data(prom):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    empty = []
    for expr in exprs:
        if not wait_for(prom["base"], expr, bool, timeout_s=60):
            empty.append(expr)
    assert not empty, f"dashboard queries without data: {empty}"
    print(f"\ndashboard: {len(exprs)} queries, each with data")


def _secret_values(deployed) -> set[str]:
    values = {LAB_KEY}
    for host in deployed["hosts"]:
        out = ssh(host, "cat /etc/ironserve/*.env 2>/dev/null; true").stdout
        for line in out.splitlines():
            name, _, value = line.partition("=")
            if any(word in name.upper() for word in ("KEY", "TOKEN", "SECRET")) and len(value.strip('"')) >= 8:
                values.add(value.strip('"'))
    return values


def test_metrics_and_file_sd_hold_no_secret(prom, deployed):
    secrets = _secret_values(deployed)
    texts = [prom["text"]]
    for host in deployed["hosts"]:
        texts.append(ssh(host, "cat /var/lib/prometheus/node-exporter/*.prom").stdout)
    match = urllib.parse.urlencode({"match[]": '{job="ironserve"}'})
    url = f"{prom['base']}/api/v1/series?{match}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        texts.append(resp.read().decode())
    for host in deployed["hosts"][1:]:
        texts.append(urllib.request.urlopen(f"http://{host['address']}:30000/metrics", timeout=10).read().decode())
    for text in texts:
        for secret in secrets:
            assert secret not in text, text[:2000]
    assert "ironserve_deploy_stage_seconds" in texts[1]
    print(f"\nno secret ({len(secrets)} value(s) checked) in file_sd, textfiles, series, engine /metrics")


def test_metrics_rerun_writes_timings_json_and_fresh_metrics(prom, deployed, tmp_path):
    before = {
        s["metric"]["host"]: float(s["value"][1])
        for s in query(prom["base"], "ironserve_deploy_last_timestamp_seconds")
    }
    report = tmp_path / "timings.json"
    args = ["-y", "deploys/tiny.py", "--data", f"deploy_timings_json={report}"]
    key = prom["key"]
    if key:
        key_file = tmp_path / "api-key"
        key_file.write_text(key + "\n")
        args += ["--data", f"api_key_file={key_file}"]
    out = pyinfra(*args)
    text = out.stdout + out.stderr
    assert "Deploy timings (time to serving)" in text, text[-3000:]
    assert "Deploy timings (time to serving)" in deployed["deploy_output"]
    data = json.loads(report.read_text())
    assert data["recipe"] == "tiny-cpu" and data["success"] is True and data["time_to_serving_s"] > 0
    assert {s["stage"] for s in data["stages"]} >= STAGES
    after = wait_for(
        prom["base"],
        "ironserve_deploy_last_timestamp_seconds",
        lambda r: len(r) == 3 and all(float(s["value"][1]) > before.get(s["metric"]["host"], 0) for s in r),
        timeout_s=30,
    )
    assert len(after) == 3 and all(float(s["value"][1]) > before.get(s["metric"]["host"], 0) for s in after)
    first = deployed["deploy_output"]
    table = first[first.index("Deploy timings (time to serving)") :].split("\n\n")[0]
    print(f"\nfirst deploy:\n{table[:1500]}\nrerun: {data['time_to_serving_s']:.1f}s to serving")
