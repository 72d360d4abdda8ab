"""ironserve.bench and roles/bench.py, offline: the bench_serving command from a recipe's seed shape and the
expected-vs-measured ratios (bench_serving itself runs in the lab: tests/e2e/cpu3/test_1_serve_tiny_lab.py)."""

from __future__ import annotations

import shlex

import pytest

from ironserve import bench, catalogue
from ironserve.spec import Expected
from ironserve.units import venv_path
from roles.context import build_context

RESULT = {
    "completed": 512,
    "duration": 600.0,
    "input_throughput": 12000.0,
    "output_throughput": 2800.0,
    "mean_tpot_ms": 40.0,
    "mean_ttft_ms": 900.0,
}


def test_argv_reproduces_the_seed_benchmark_command():
    recipe = catalogue.get_recipe("glm5.1-w4a8-a3-1p1d-32-16k")
    argv = bench.bench_argv(recipe, "http://10.0.0.9:6688", "/models/glm")
    assert argv[:9] == [
        "python3",
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        "http://10.0.0.9:6688",
        "--tokenizer",
        "/models/glm",
    ]
    text = " ".join(argv)
    # the seed's shape: --dataset-name random --max-concurrency 128 --random-input-len 16384 ... --num-prompts 512
    for flag in (
        "--dataset-name random",
        "--random-input-len 16384",
        "--random-output-len 1024",
        "--random-range-ratio 1",
        "--max-concurrency 128",
        "--num-prompts 512",
    ):
        assert flag in text, flag
    small = bench.bench_argv(recipe, "http://x:1", "/m", {"num_prompts": 8, "dataset_name": "random-ids"})
    assert "--num-prompts 8" in " ".join(small) and "--dataset-name random-ids" in " ".join(small)


def test_ratios_are_higher_is_better_and_ranges_judge_the_low_end():
    expected = Expected(output_tok_s=(42, 85), total_output_tok_s=3000, tpot_ms=50, ttft_ms=(500, 1000))
    rows = {r.metric: r for r in bench.compare(expected, RESULT)}
    assert rows["output_tok_s"].measured == pytest.approx(25.0)  # 1000 / mean TPOT
    assert rows["output_tok_s"].ratio == pytest.approx(25 / 42) and rows["output_tok_s"].verdict == "slow"
    assert rows["total_output_tok_s"].ratio == pytest.approx(2800 / 3000)
    assert rows["tpot_ms"].ratio == pytest.approx(50 / 40) and rows["tpot_ms"].verdict == "ok"
    assert rows["ttft_ms"].ratio == pytest.approx(500 / 900) and rows["ttft_ms"].expected == "500-1000"


def test_report_fails_a_slow_node_and_only_reports_with_min_ratio_zero():
    recipe = catalogue.get_recipe("qwen3.5-nvfp4-rtx6000-tp4")  # expected output_tok_s: [42, 85]
    text, passed = bench.report(recipe, {**RESULT, "mean_tpot_ms": 40.0})
    assert not passed and "output_tok_s" in text and "0.60x" in text and "slow" in text
    assert "ironserve audit" in text
    fast, ok = bench.report(recipe, {**RESULT, "mean_tpot_ms": 15.0})  # 66.7 tok/s per stream
    assert ok and "1.59x" in fast
    assert bench.report(recipe, {**RESULT, "mean_tpot_ms": 40.0}, min_ratio=0)[1] is True


def test_report_without_expected_figures_shows_the_measurements():
    recipe = catalogue.get_recipe("tiny-cpu")
    text, passed = bench.report(recipe, RESULT)
    assert passed and "total_output_tok_s" in text and "2800.00" in text and "no expected figures" in text


def test_bench_command_runs_in_the_runtime_with_the_key_from_the_env_file():
    from roles import bench as role

    hosts = [
        ("r0", {"hardware": "cpu-lab", "ssh_hostname": "10.0.0.12", "ironserve_role": "router"}),
        ("n0", {"hardware": "cpu-lab", "ssh_hostname": "10.0.0.10"}),
        ("n1", {"hardware": "cpu-lab", "ssh_hostname": "10.0.0.11"}),
    ]
    ctx = build_context("tiny", "n0", hosts)
    assert role.bench_host(ctx) == "n0"
    cmd = role.command(ctx)
    assert f"{venv_path(ctx.recipe)}/bin/python3 -m sglang.bench_serving" in cmd
    assert "--base-url http://10.0.0.12:30000" in cmd  # the router's endpoint
    assert "/etc/ironserve/sglang-tiny-cpu-server-0.env" in cmd and "OPENAI_API_KEY" in cmd
    assert ". /etc/ironserve" not in cmd and "source /etc" not in cmd  # the env file is read as data, never sourced
    assert "--dataset-name random-ids" in cmd
    shlex.split(cmd)  # well-formed shell


@pytest.mark.parametrize("recipe", ["tiny-cpu", "tiny-cpu-docker"])
def test_bench_files_live_in_a_private_root_directory(recipe):
    """Root runs the benchmark: no fixed world-readable /tmp log, no /tmp mounted into its container."""
    from roles import bench as role

    hosts = [
        (
            n,
            {
                "hardware": "cpu-lab",
                "ssh_hostname": a,
                "recipe": recipe,
                "bench_dataset_path": "/srv/data/s.json",
                **({"ironserve_role": "router"} if n == "r0" else {}),
            },
        )
        for n, a in (("r0", "10.0.0.12"), ("n0", "10.0.0.10"), ("n1", "10.0.0.11"))
    ]
    cmd = role.command(build_context("tiny", "n0", hosts))
    assert "/tmp" not in cmd, cmd
    words = shlex.split(cmd)
    assert words[:8] == ["install", "-d", "-m", "0700", "-o", "root", "-g", "root"] and words[8] == bench.BENCH_DIR
    assert bench.LOG_FILE in words and bench.RESULT_FILE.startswith(bench.BENCH_DIR + "/")
    if recipe == "tiny-cpu-docker":
        mounts = [words[i + 1] for i, w in enumerate(words) if w == "-v"]
        assert (
            f"{bench.BENCH_DIR}:{bench.BENCH_DIR}" in mounts
            and "/srv/data/s.json:/srv/data/s.json:ro" in mounts
            and all(not m.startswith("/tmp") for m in mounts)
        ), mounts
