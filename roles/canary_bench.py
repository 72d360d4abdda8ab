"""The canary's benchmark: with host data ``canary_bench``, a rolling change's canary is measured before and after.

The previous figures are the canary group's own, measured in the same roll: once the group is out of the router
and drained (no client request competes with the benchmark), its engine still on the previous configuration, a
short bench_serving (the recipe's shape and seed, at most ``canary_bench_prompts`` prompts after a warm-up batch,
within ``canary_bench_timeout_s``) runs against the engine itself; after the change has passed its gate and one real
generation, the same benchmark runs again, still out of the router. Same host, same weights, same client (the
new runtime's bench_serving both times), same load (none): what differs is the configuration. Stored figures of
an earlier run (the recipe's ``expected``, or a report kept on the host) were measured on other days, other
engine builds and other loads, so a ratio against them judges more than the change.

A figure below ``bench_min_ratio`` of the previous one fails the canary (``CANARY FAILED ... benchmark``): it is
rolled back like a failed gate and no other group moves. When there are no previous figures (the group was not
running: a rerun after a killed roll; or that benchmark failed), the new figures are reported, not judged. The
API key reaches bench_serving from the unit's 0600 env file through its environment (roles/bench.py), never
argv. The canary is out of the router for both benchmarks: each adds its length to the canary's time out of it
(bench_serving's own start, an import of SGLang, counts: on the 2-core lab each benchmark of 8 prompts took ~75 s).

Host data: ``canary_bench``, ``canary_bench_prompts``, ``canary_bench_timeout_s``, ``bench_min_ratio``, and the
benchmark's ``bench_max_concurrency``, ``bench_dataset_name``, ``bench_dataset_path``.
"""

from __future__ import annotations

from ironserve import bench
from ironserve.render import Process
from ironserve.spec import Benchmark
from ironserve.units import env_path
from roles.bench import bench_command, run_bench
from roles.common import uses_sudo
from roles.context import DeploymentContext


def bench_plan(ctx: DeploymentContext, head: Process) -> dict | None:
    """The canary benchmark of the group ``head`` is rank 0 of, as plain data for the roll's plan (None: off)."""
    if not ctx.host.canary_bench:
        return None
    shape = ctx.recipe.benchmark or Benchmark()
    cap = ctx.host.canary_bench_prompts
    prompts = min(ctx.host.bench_num_prompts or shape.num_prompts or cap, cap)
    concurrency = min(ctx.host.bench_max_concurrency or shape.max_concurrency or prompts, prompts)
    overrides = {
        "num_prompts": prompts,
        "max_concurrency": concurrency,
        "dataset_name": ctx.host.bench_dataset_name,
        "dataset_path": ctx.host.bench_dataset_path,
        # a batch at the measured concurrency first: the engine after the change has just started, the one before
        # has served for a while; one warm-up request alone leaves the first batch's cold start in the figures
        "warmup_requests": concurrency,
    }
    files = f"{bench.BENCH_DIR}/canary-{head.unit}"
    return {
        "command": bench_command(
            ctx.recipe, head.local_url(""), ctx.model_path, env_path(head), overrides, f"{files}.jsonl", f"{files}.log"
        ),
        "prompts": prompts,
        "concurrency": concurrency,
        "timeout_s": ctx.host.canary_bench_timeout_s,
        "min_ratio": ctx.host.bench_min_ratio,
    }


def _measure(host, plan: dict) -> dict:
    return run_bench(host, plan["bench"]["command"], plan["bench"]["timeout_s"], sudo=uses_sudo(host))


def _figures(result: dict) -> str:
    return (
        f"{result.get('completed', '?')} requests, {result.get('output_throughput') or 0:.2f} output tok/s, "
        f"TPOT {result.get('mean_tpot_ms') or 0:.2f} ms, TTFT {result.get('mean_ttft_ms') or 0:.2f} ms"
    )


def before(host, plan: dict) -> dict | None:
    """The group's figures on its previous configuration (out of the router, drained, still running), or None
    (said) when that benchmark gives none: the one after the change is then reported, not judged."""
    try:
        result = _measure(host, plan)
    except RuntimeError as exc:
        host.log_styled(
            f"{plan['unit']}: canary benchmark before the change gave no figures, so the one after it is reported, "
            f"not judged: {str(exc)[-300:]}",
            fg="yellow",
        )
        return None
    host.log(f"{plan['unit']}: canary benchmark before the change: {_figures(result)}")
    return result


def judged(host, plan: dict, previous: dict | None) -> tuple[bool, str]:
    """The benchmark after the change, against ``previous``: (passed, why not). No result at all fails it."""
    settings = plan["bench"]
    try:
        result = _measure(host, plan)
    except RuntimeError as exc:
        return False, f"the canary benchmark of the new configuration gave no result ({str(exc)[-300:]})"
    shape = f"{settings['prompts']} prompts, concurrency {settings['concurrency']}"
    if previous is None:
        host.log_styled(
            f"{plan['unit']}: canary benchmark after the change ({shape}): {_figures(result)} (no previous figures: "
            f"not judged)",
            fg="yellow",
        )
        return True, ""
    rows = bench.compare_runs(previous, result)
    lines, passed = bench.table(rows, settings["min_ratio"], against="before")
    host.log_styled(
        f"{plan['unit']}: canary benchmark after the change against before ({shape}; bench_min_ratio "
        f"{settings['min_ratio']}): {_figures(result)}; "
        + ", ".join(f"{r.metric} {r.ratio:.2f}x" for r in rows if r.ratio is not None)
        + ("" if passed else ": SLOWER")
        + "\n"
        + "\n".join(lines),
        fg="green" if passed else "red",
    )
    if passed:
        return True, ""
    slow = [f"{r.metric} {r.ratio:.2f}x" for r in rows if r.ratio is not None and r.ratio < settings["min_ratio"]]
    return False, (
        f"the canary benchmark is below bench_min_ratio {settings['min_ratio']} of the previous configuration's "
        f"figures ({', '.join(slow)})"
    )
