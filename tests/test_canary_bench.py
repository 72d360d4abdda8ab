"""The canary's benchmark, offline (roles/canary_bench.py, ironserve.bench.compare_runs): the command it runs on
the canary's host, the figures after the change judged against the ones before, and a roll whose canary is slower
than bench_min_ratio: CANARY FAILED ... benchmark, rolled back, back in the router. bench_serving itself runs in
the lab (tests/e2e/cpu3/test_9_day_two_lab.py)."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest

from ironserve import bench
from ironserve.units import venv_path
from roles import canary_bench, rolling
from roles.context import build_context

BEFORE = {"completed": 8, "output_throughput": 100.0, "mean_tpot_ms": 20.0, "mean_ttft_ms": 50.0}
HOSTS = [
    ("r", {"ssh_hostname": "10.0.0.9", "ironserve_role": "router", "hardware": "cpu-lab"}),
    ("h0", {"ssh_hostname": "10.0.0.1", "hardware": "cpu-lab"}),
    ("h1", {"ssh_hostname": "10.0.0.2", "hardware": "cpu-lab"}),
]


def test_a_run_is_judged_against_the_one_before_higher_is_better():
    rows = {r.metric: r for r in bench.compare_runs(BEFORE, {**BEFORE, "output_throughput": 70.0, "mean_ttft_ms": 40})}
    assert rows["total_output_tok_s"].ratio == pytest.approx(0.7) and rows["total_output_tok_s"].expected == "100"
    assert rows["tpot_ms"].ratio == pytest.approx(1.0) and rows["ttft_ms"].ratio == pytest.approx(50 / 40)
    lines, passed = bench.table(list(rows.values()), 0.8, against="before")
    assert not passed and "before" in lines[0] and "0.70x  slow" in lines[1]
    assert bench.table(list(rows.values()), 0.6)[1] and bench.table(list(rows.values()), 0)[1]
    assert bench.compare_runs({}, BEFORE)[0].ratio is None  # no previous figure: nothing judged


def _plan(**data):
    hosts = [(n, {**d, **data}) for n, d in HOSTS]
    ctx = build_context("tiny", "h0", hosts)
    head = next(p for p in ctx.processes if p.role == "server")
    return ctx, canary_bench.bench_plan(ctx, head)


def test_the_canary_benchmark_is_short_and_runs_against_the_engine_with_the_key_from_its_env_file():
    ctx, plan = _plan(canary_bench=True)
    assert (plan["prompts"], plan["concurrency"], plan["timeout_s"], plan["min_ratio"]) == (8, 2, 300, 0.8)
    cmd = plan["command"]
    words = shlex.split(cmd)
    assert f"{venv_path(ctx.recipe)}/bin/python3 -m sglang.bench_serving" in cmd
    assert "--base-url http://127.0.0.1:30000" in cmd  # the engine itself, out of the router
    assert "--num-prompts 8" in cmd and "--max-concurrency 2" in cmd and "--dataset-name random-ids" in cmd
    assert "--warmup-requests 2" in cmd  # a warm-up batch at the measured concurrency: the new engine just started
    assert f"{bench.BENCH_DIR}/canary-sglang-tiny-cpu-server-0.jsonl" in words  # not the bench deploy's files
    assert "/etc/ironserve/sglang-tiny-cpu-server-0.env" in cmd and "OPENAI_API_KEY" in cmd
    assert "--api-key" not in cmd and ". /etc/ironserve" not in cmd
    # bounded: at most canary_bench_prompts prompts, never more concurrent than prompts
    _, small = _plan(canary_bench=True, canary_bench_prompts=1, bench_min_ratio=0.5)
    assert (small["prompts"], small["concurrency"], small["min_ratio"]) == (1, 1, 0.5)
    assert _plan()[1] is None  # off by default


class _Host:
    """A pyinfra host as the roll's execution sees it: what it logs, and bench_serving's output per run."""

    def __init__(self, results):
        self.name, self.data, self.said, self.results = "h0", {}, [], list(results)

    def log(self, text):
        self.said.append(text)

    def log_styled(self, text, fg=None):
        self.said.append(text)

    def run_shell_command(self, command, _sudo=False):
        if "sglang.bench_serving" in command:
            result = self.results.pop(0)
            lines = ["...", "ironserve-bench-rc=0", "ironserve-bench-result"] + ([json.dumps(result)] if result else [])
        else:
            lines = ["journal line"]
        return True, SimpleNamespace(stdout_lines=lines, stderr_lines=[])


def _roll(monkeypatch, results, canary=True):
    """A canary's roll with the router, the restart and the rollback recorded instead of run."""
    _, bench_plan = _plan(canary_bench=True)
    plan = {
        "group": "server-g0-i0",
        "unit": "sglang-tiny-cpu-server-0",
        "router": {"host": "r", "base": "http://127.0.0.1:30000", "env": "/etc/ironserve/r.env"},
        "worker": "http://10.0.0.1:30000",
        "worker_fields": {},
        "base": "http://127.0.0.1:30000",
        "env": "/etc/ironserve/sglang-tiny-cpu-server-0.env",
        "drain_timeout_s": 5,
        "health": "http://127.0.0.1:30000/health",
        "timeout_s": 5,
        "members": [{"host": "h0", "unit": "sglang-tiny-cpu-server-0", "paths": ["/etc/x"]}],
        "replaces": [],
        "bench": bench_plan,
    }
    calls, host = [], _Host(results)
    router = SimpleNamespace(name="r", data={})
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=lambda name: router if name == "r" else host))

    def run_roll(on_host, action, *args):
        calls.append(action)
        return True, {"in_flight": 0, "cut": 0, "drain_s": 0.1} if action == "drain" else {}

    def restart(state, on_host, plan):
        calls.append("restart")
        return True, ""

    monkeypatch.setattr(rolling, "run_roll", run_roll)
    monkeypatch.setattr(rolling, "_restart_on_staged", restart)
    monkeypatch.setattr(rolling.rollback, "roll_back", lambda *a: calls.append("rolled back"))
    monkeypatch.setattr(rolling.rollback, "save_command", lambda unit, paths: calls.append("saved") or "true")
    ok = rolling._roll(state, host, plan, canary=canary)
    return ok, calls, "\n".join(host.said)


def test_a_canary_slower_than_before_fails_is_rolled_back_and_back_in_the_router(monkeypatch):
    ok, calls, said = _roll(monkeypatch, [BEFORE, {**BEFORE, "output_throughput": 50.0}])
    assert not ok
    assert calls == ["workers", "remove", "drain", "restart", "rolled back", "add"], calls
    assert "CANARY FAILED: sglang-tiny-cpu-server-0 on h0: the canary benchmark is below bench_min_ratio 0.8" in said
    assert "total_output_tok_s 0.50x" in said and "Last journal lines" in said and "SLOWER" in said
    assert "back in the router after" in said and "(on its last good configuration)" in said


def test_a_canary_within_the_ratio_passes_and_is_saved(monkeypatch):
    ok, calls, said = _roll(monkeypatch, [BEFORE, {**BEFORE, "output_throughput": 95.0}])
    assert ok and calls == ["workers", "remove", "drain", "restart", "saved", "add"], calls
    assert "canary benchmark before the change: 8 requests, 100.00 output tok/s" in said
    assert "total_output_tok_s 0.95x, tpot_ms 1.00x, ttft_ms 1.00x" in said and "CANARY FAILED" not in said


def test_without_figures_before_the_change_the_canary_is_reported_not_judged(monkeypatch):
    ok, calls, said = _roll(monkeypatch, [None, {**BEFORE, "output_throughput": 1.0}])
    assert ok and "saved" in calls and "reported, not judged" in said and "(no previous figures: not judged)" in said
    # a new configuration whose benchmark gives no result at all fails the canary
    ok, calls, said = _roll(monkeypatch, [BEFORE, None])
    assert not ok and "rolled back" in calls and "benchmark of the new configuration gave no result" in said


def test_only_the_canary_is_benchmarked(monkeypatch):
    ok, calls, said = _roll(monkeypatch, [], canary=False)
    assert ok and "canary benchmark" not in said
