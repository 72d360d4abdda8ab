"""Time to load, validate and render the whole recipe catalogue (offline), as `ironserve render` does."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ironserve import catalogue  # noqa: E402
from ironserve.lint import lint_recipe  # noqa: E402
from ironserve.render import render  # noqa: E402


def once() -> tuple[float, float, int]:
    catalogue._catalogue_cached.cache_clear()
    t0 = time.perf_counter()
    recipes = catalogue.catalogue()
    processes = sum(len(render(r).processes) for r in recipes.values())
    t1 = time.perf_counter()
    for r in recipes.values():
        lint_recipe(r, catalogue.hardware_profiles())
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, processes


def main() -> None:
    runs = [once() for _ in range(10)]
    render_ms = [r[0] * 1000 for r in runs]
    lint_ms = [r[1] * 1000 for r in runs]
    n = len(catalogue.catalogue())
    print(f"recipes: {n}, processes rendered: {runs[0][2]}")
    print(
        f"load+validate+render whole catalogue: median {statistics.median(render_ms):.1f} ms, "
        f"max {max(render_ms):.1f} ms (10 runs)"
    )
    print(f"lint whole catalogue (offline rules): median {statistics.median(lint_ms):.1f} ms")


if __name__ == "__main__":
    main()
