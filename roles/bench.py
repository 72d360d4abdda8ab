"""Benchmark: sglang.bench_serving with the recipe's seed shape against the deployment's endpoint.

Run by deploys/bench.py on one host of the deployment (the first engine host: it has the runtime and the
weights, whose tokenizer bench_serving needs), in the engine's own runtime (the venv's python, or the image with
the host's network). The endpoint is the router's URL, or rank 0's for a deployment without a router. The API
key, when the engines have one, is read from the unit's 0600 env file into OPENAI_API_KEY (never onto argv).

The result (bench_serving's JSON line) is compared with the recipe's ``expected`` figures by ironserve.bench:
a table with the ratio per figure is printed; a ratio below ``bench_min_ratio`` fails the run (on real
hardware: a slow node). ``bench_report`` (a path on the controller) keeps the result and the rows as JSON.

Host data (defaults in brackets): ``bench_num_prompts`` / ``bench_max_concurrency`` [the recipe's],
``bench_dataset_name`` [the recipe's], ``bench_dataset_path`` [none], ``bench_min_ratio`` [0.8; 0 only reports],
``bench_report`` [none], ``bench_timeout_s`` [3600].
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import OperationError, deploy
from pyinfra.operations import python

from ironserve import bench
from ironserve.spec import DockerRuntime, Recipe
from ironserve.units import API_KEY_ENV, API_KEY_FILE_ENV, env_path, image_ref, sourcing_script, venv_path
from roles.context import DeploymentContext


def bench_host(ctx: DeploymentContext) -> str:
    engines = [p for p in ctx.rendered.processes if p.role != "router"]
    return engines[0].host


READ_KEY = f"""import sys
env = {{}}
for line in open(sys.argv[1], encoding="utf-8").read().splitlines():
    if line and line[0] not in "#;" and "=" in line:
        key, _, value = line.partition("=")
        env[key] = value
key = env.get("{API_KEY_ENV}", "")
if not key and env.get("{API_KEY_FILE_ENV}"):
    key = open(env["{API_KEY_FILE_ENV}"], encoding="utf-8").read().strip()
print(key)
"""  # the same reading as ironserve.units.read_env_text, on the host (ironserve is not installed there)


def command(ctx: DeploymentContext) -> str:
    """The shell command on the bench host: runtime wrapper, the key from the env file, bench_serving."""
    engine = next(p for p in ctx.rendered.processes if p.host == ctx.host_name and p.role != "router")
    overrides = {
        "num_prompts": ctx.host.bench_num_prompts,
        "max_concurrency": ctx.host.bench_max_concurrency,
        "dataset_name": ctx.host.bench_dataset_name,
        "dataset_path": ctx.host.bench_dataset_path,
    }
    return bench_command(ctx.recipe, ctx.rendered.endpoint, ctx.model_path, env_path(engine), overrides)


def bench_command(
    recipe: Recipe,
    base_url: str,
    model_path: str,
    env_file: str,
    overrides: dict,
    result_file: str = bench.RESULT_FILE,
    log_file: str = bench.LOG_FILE,
) -> str:
    """bench_serving against ``base_url`` in the recipe's runtime (the venv's python, or its image with the host's
    network), the API key read from ``env_file`` into OPENAI_API_KEY (never argv); its result line and the log's
    tail on stdout (parse_result)."""
    argv = bench.bench_argv(recipe, base_url, model_path, overrides, result_file)
    runtime = recipe.runtime
    if isinstance(runtime, DockerRuntime):
        # the container sees the weights and a dataset file read-only, and only the bench's own directory
        # writable (its result file): never the host's /tmp
        dataset = overrides.get("dataset_path")
        mounts = [model_path] + ([dataset] if dataset else [])
        wrapper = [
            "docker",
            "run",
            "--rm",
            "--network",
            "host",
            "-e",
            "OPENAI_API_KEY",
            *[arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")],
            "-v",
            f"{bench.BENCH_DIR}:{bench.BENCH_DIR}",
            "--entrypoint",
            argv[0],
            image_ref(recipe),
            *argv[1:],
        ]
    else:
        wrapper = [f"{venv_path(recipe)}/bin/{argv[0]}", *argv[1:]]
    if runtime.source_env:
        wrapper = ["/bin/bash", "-c", sourcing_script(runtime.source_env), "bench", *wrapper]
    # the key from the engine's env file, read as data by python (never `.`/`source`: that would run $(...))
    key_env = f'export OPENAI_API_KEY="$(python3 -c {shlex.quote(READ_KEY)} {shlex.quote(env_file)})"; '

    run = shlex.join(wrapper)
    where, result, log = (shlex.quote(p) for p in (bench.BENCH_DIR, result_file, log_file))
    # the bench's directory: root's, 0700 (install -d sets owner and mode on an existing one too)
    return (
        f"install -d -m 0700 -o root -g root {where} || exit 1; rm -f {result}; ( {key_env}{run} ) > {log} 2>&1; "
        f"rc=$?; tail -n 40 {log}; echo ironserve-bench-rc=$rc; "
        f"echo ironserve-bench-result; tail -n 1 {result} 2>/dev/null; true"
    )


def run_bench(on_host, cmd: str, timeout_s: int, sudo: bool = True) -> dict:
    """Run a bench_command on the host within ``timeout_s``: bench_serving's result without anything secret, or
    RuntimeError with the log's last lines."""
    _, out = on_host.run_shell_command(f"timeout {timeout_s} sh -c {shlex.quote(cmd)}", _sudo=sudo)
    lines = out.stdout_lines
    marker = lines.index("ironserve-bench-result") if "ironserve-bench-result" in lines else len(lines)
    log, tail = lines[:marker], lines[marker + 1 :]
    result = None
    for line in tail:
        try:
            result = json.loads(line)
        except ValueError:
            continue
    if not result:
        raise RuntimeError("bench_serving gave no result:\n" + "\n".join(log[-40:]))
    return bench.public_result(result)


def _run(ctx: DeploymentContext, cmd: str) -> None:
    """Runs inside python.call: a failure raises (pyinfra reports the operation failed with the message)."""
    timeout = ctx.host.bench_timeout_s
    host.log(f"bench_serving against {ctx.rendered.endpoint} (up to {timeout}s)")
    result = run_bench(host, cmd, timeout)
    text, passed = bench.report(ctx.recipe, result, ctx.host.bench_min_ratio)
    print(text, flush=True)
    host.log_styled(text, fg="green" if passed else "red")
    target = ctx.host.bench_report
    if target:
        rows = [dict(r.__dict__, verdict=r.verdict) for r in bench.compare(ctx.recipe.expected, result)]
        Path(target).write_text(
            json.dumps(
                {
                    "recipe": ctx.recipe.id,
                    "endpoint": ctx.rendered.endpoint,
                    "host": ctx.host_name,
                    "result": result,
                    "rows": rows,
                    "passed": passed,
                },
                indent=2,
            )
        )
    if not passed:
        raise RuntimeError(f"{ctx.recipe.id}: slower than the recipe's expected figures (see the table above)")


@deploy("Benchmark")
def apply(ctx: DeploymentContext) -> None:
    if ctx.host_name != bench_host(ctx):
        return
    if ctx.derived and not ctx.derived.digest:
        raise OperationError(
            f"{ctx.derived.tagged} is not in the registry yet: deploy the recipe before benchmarking it"
        )
    python.call(
        name=f"bench_serving ({ctx.recipe.id}) against {ctx.rendered.endpoint}",
        function=_run,
        ctx=ctx,
        cmd=command(ctx),
    )
