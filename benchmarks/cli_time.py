"""CPU time of the command line (issue: `ironserve --help` at most 0.15 s, `render --list` at most 0.3 s).

Each figure is the CPU (user + sys) of the child process, from resource.getrusage(RUSAGE_CHILDREN) around one run,
the median of --runs runs; wall time depends on the machine's load, CPU time much less. `render --list` is measured
warm (the catalogue's validated index in the cache: what every run but the first after an edit costs) and cold (an
empty cache: the whole catalogue validated, as before the index). Then the modules each command imports, from
`python -X importtime`, the heaviest first.

    python benchmarks/cli_time.py [--runs 7] [--top 12] [--checkout DIR]

--checkout measures another checkout's code with this interpreter (e.g. the main branch, for before/after).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"--help": 0.15, "render --list": 0.3}
# the console script's own code (ironserve.console:run), run by this interpreter whether or not it is installed
CONSOLE = "import sys; from ironserve.console import run; sys.exit(run())"


def _cpu(argv: list[str], env: dict) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        argv, env=env, cwd=env["PYTHONPATH"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_cpu(words: list[str], runs: int, env: dict, fresh_cache: bool = False) -> float:
    """Median CPU seconds of `ironserve WORDS`; fresh_cache: each run with its own empty cache directory."""
    samples = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            run_env = {**env, "IRONSERVE_CACHE": cache} if fresh_cache else env
            samples.append(_cpu([sys.executable, "-c", CONSOLE, *words], run_env))
    return statistics.median(samples)


def import_breakdown(words: list[str], env: dict, top: int) -> tuple[float, list[tuple[float, str]]]:
    """(total import ms, [(cumulative ms, module)] of the heaviest modules imported at top level or just below)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CONSOLE, *words],
        env=env,
        cwd=env["PYTHONPATH"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split(":", 1)[1].split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2  # two spaces a level, after the one that separates
        rows.append((int(cumulative) / 1000, name.strip(), depth))
    total = sum(ms for ms, _, depth in rows if depth == 0)
    heaviest = sorted(((ms, name) for ms, name, depth in rows if depth <= 1), reverse=True)[:top]
    return total, heaviest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--top", type=int, default=12, help="modules listed per command")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose ironserve is measured")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        # the checkout's ironserve first on the path, run from the checkout (its recipes/ is the catalogue)
        env = {**os.environ, "IRONSERVE_CACHE": cache, "PYTHONPATH": str(args.checkout.resolve())}
        env.pop("IRONSERVE_RECIPES", None)
        subprocess.run(
            [sys.executable, "-c", CONSOLE, "render", "--list"],
            env=env,
            cwd=env["PYTHONPATH"],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # the index, as any earlier listing leaves it
        floor = statistics.median(_cpu([sys.executable, "-c", "pass"], env) for _ in range(args.runs))
        figures = {
            "--help": median_cpu(["--help"], args.runs, env),
            "render --list": median_cpu(["render", "--list"], args.runs, env),
            "render --list (cold: empty cache)": median_cpu(["render", "--list"], args.runs, env, fresh_cache=True),
        }
        print(
            f"{env['PYTHONPATH']}: CPU of the child (user+sys), median of {args.runs} runs; python -c pass: {floor:.3f} s"
        )
        for what, seconds in figures.items():
            target = TARGETS.get(what)
            verdict = f"  (target <= {target:.2f} s: {'ok' if seconds <= target else 'OVER'})" if target else ""
            print(f"  ironserve {what:36s} {seconds:.3f} s{verdict}")
        for words in (["--help"], ["render", "--list"]):
            total, heaviest = import_breakdown(words, env, args.top)
            print(f"\nimports of `ironserve {' '.join(words)}` (python -X importtime): {total:.1f} ms in all")
            for ms, name in heaviest:
                print(f"  {ms:8.1f} ms  {name}")


if __name__ == "__main__":
    main()
