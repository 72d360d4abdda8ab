"""Benchmark a deployed endpoint with the recipe's seed shape and compare with the recipe's expected figures.

Pure: the bench_serving command line from the recipe's ``benchmark`` block, and the comparison of its JSON result
(``--output-file``) with ``expected``. roles/bench.py runs it on a host of the deployment, in the engine's runtime.

Ratios are always "higher is better": measured/expected for throughputs, expected/measured for latencies, so a
ratio below ``min_ratio`` (default 0.8) means slower than the seed, whichever the metric. A range in the recipe
(``output_tok_s: [42, 85]``) is judged against its low end (the seed's worst figure) and shown whole.
``compare_runs`` judges one run against another of the same shape instead (a rolling change's canary after its
change against itself before it, roles/canary_bench.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .commandline import SECRET_NAME, SECRET_VALUE
from .spec import Benchmark, Expected, Recipe

MIN_RATIO = 0.8
# root runs the benchmark: its files live in a root-owned 0700 directory (roles/bench.py creates it), never in a
# world-writable one such as /tmp, where another user could plant a link or read the log
BENCH_DIR = "/var/lib/ironserve/bench"
RESULT_FILE = f"{BENCH_DIR}/result.jsonl"
LOG_FILE = f"{BENCH_DIR}/bench.log"


def bench_argv(
    recipe: Recipe, base_url: str, tokenizer: str, overrides: dict | None = None, output_file: str = RESULT_FILE
) -> list[str]:
    """``python3 -m sglang.bench_serving`` with the recipe's shape, as the seeds run it (``--backend sglang``).

    overrides: ``num_prompts``, ``max_concurrency``, ``dataset_name``, ``dataset_path`` (an air-gapped cluster
    has no ShareGPT download for ``random``: give the file, or use ``random-ids``)."""
    shape = recipe.benchmark or Benchmark()
    values = shape.model_dump(exclude_none=True, exclude={"tool"})
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    argv = [
        "python3",
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        base_url,
        "--tokenizer",
        tokenizer,
    ]
    served = recipe.server.served_model_name
    if served:
        argv += ["--model", served]
    for key, value in values.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv + ["--output-file", output_file, "--disable-tqdm"]


@dataclass
class Row:
    metric: str
    measured: float | None
    expected: str
    ratio: float | None  # higher is better

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "no figure"
        return "ok" if self.ratio >= MIN_RATIO else "slow"


def _low(value) -> float:
    return float(value[0]) if isinstance(value, (list, tuple)) else float(value)


def _shown(value) -> str:
    return f"{value[0]:g}-{value[1]:g}" if isinstance(value, (list, tuple)) else f"{float(value):g}"


def compare(expected: Expected, result: dict) -> list[Row]:
    """One row per figure the recipe expects, plus the measured throughputs when it expects none."""
    tpot = result.get("mean_tpot_ms")
    per_stream = 1000.0 / tpot if tpot else None  # single-stream decode speed, as the seeds quote it
    measured = {
        "output_tok_s": (per_stream, True),
        "total_output_tok_s": (result.get("output_throughput"), True),
        "input_tok_s": (result.get("input_throughput"), True),
        "tpot_ms": (tpot, False),
        "ttft_ms": (result.get("mean_ttft_ms"), False),
    }
    rows = []
    for metric, (value, higher_is_better) in measured.items():
        want = getattr(expected, metric)
        if want is None:
            continue
        ratio = None
        if value:
            ratio = value / _low(want) if higher_is_better else _low(want) / value
        rows.append(Row(metric, value, _shown(want), ratio))
    if not rows:
        rows = [Row(m, measured[m][0], "-", None) for m in ("total_output_tok_s", "input_tok_s", "tpot_ms", "ttft_ms")]
    return rows


def public_result(result: dict) -> dict:
    """bench_serving's result without anything secret (a field named like a key or token, or a value shaped like
    one): what the bench report keeps and prints. bench_serving gets the key from its environment and does not
    write it today; this keeps a future version echoing its arguments out of the report."""
    return {
        k: v
        for k, v in result.items()
        if not SECRET_NAME.search(k) and not (isinstance(v, str) and SECRET_VALUE.match(v.strip()))
    }


def compare_runs(previous: dict, current: dict) -> list[Row]:
    """The figures of one configuration's run against another's of the same shape on the same group (a canary's
    benchmark after its change against the one before it): higher is better, as ``compare``."""
    rows = []
    for metric, key, higher_is_better in (
        ("total_output_tok_s", "output_throughput", True),
        ("tpot_ms", "mean_tpot_ms", False),
        ("ttft_ms", "mean_ttft_ms", False),
    ):
        before, now = previous.get(key), current.get(key)
        ratio = None
        if before and now:
            ratio = now / before if higher_is_better else before / now
        rows.append(Row(metric, now, f"{before:g}" if before else "-", ratio))
    return rows


def table(rows: list[Row], min_ratio: float, against: str = "expected") -> tuple[list[str], bool]:
    """(lines, passed): measured vs ``against`` with ratios and verdicts; passed = no ratio below min_ratio."""
    lines = [f"{'metric':<20} {'measured':>12} {against:>12} {'ratio':>7}  verdict"]
    passed = True
    for row in rows:
        if row.ratio is None:
            verdict = "no figure"
        elif min_ratio <= 0:
            verdict = "not judged"  # bench_min_ratio=0: report only
        else:
            verdict = "ok" if row.ratio >= min_ratio else "slow"
        passed = passed and verdict != "slow"
        measured = f"{row.measured:.2f}" if row.measured is not None else "-"
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        lines.append(f"{row.metric:<20} {measured:>12} {row.expected:>12} {ratio:>7}  {verdict}")
    return lines, passed


def report(recipe: Recipe, result: dict, min_ratio: float = MIN_RATIO) -> tuple[str, bool]:
    """(text, passed): a table of measured vs expected with ratios; passed = no ratio below min_ratio."""
    rows = compare(recipe.expected, result)
    lines, passed = table(rows, min_ratio)
    lines.insert(
        0,
        f"bench_serving against {recipe.id}: {result.get('completed', '?')} requests completed in "
        f"{result.get('duration', 0):.1f}s",
    )
    if all(r.ratio is None for r in rows):
        lines.append(f"(the recipe has no expected figures: {recipe.expected.note or 'none given'})")
    elif not passed:
        lines.append(
            f"slower than the seed's figures (ratio < {min_ratio}): check the node (clocks, governor, "
            f"NCCL topology, thermal) with `ironserve audit` and compare the hosts"
        )
    return "\n".join(lines), passed
