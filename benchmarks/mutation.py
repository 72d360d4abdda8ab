"""Mutation testing of the modules that carry the README's guarantees (not part of CI: minutes to an hour).

    nice -n 15 .venv/bin/python benchmarks/mutation.py [--run] [--max-children 2] [GLOB ...]

--run runs mutmut first (its configuration, [tool.mutmut] in pyproject.toml, names the modules and the fast
offline tests; for each mutant mutmut runs only the tests that reached its function); GLOBs (e.g.
"roles.secret_file*") narrow the run to some mutants. Then, from mutmut's results under mutants/, the score per
module: killed / (killed + survived + not covered by any test), and the survivors' names (``mutmut show NAME``
prints one). The survivors that are equivalent mutants, with the reason, are listed in docs/mutation.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    None: "not checked",
}


def scores(mutants: Path) -> dict[str, dict]:
    """{module path: {status: count, "survivors": [names]}} from mutmut's .meta files."""
    out = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        module = str(meta.relative_to(mutants))[: -len(".meta")]
        results = json.loads(meta.read_text()).get("exit_code_by_key", {})
        counts = Counter(STATUS.get(code, "suspicious") for code in results.values())
        out[module] = {**counts, "survivors": sorted(k for k, code in results.items() if code == 0)}
    return out


def table(found: dict[str, dict]) -> str:
    lines = [f"{'module':32} {'mutants':>7} {'killed':>7} {'survived':>8} {'no tests':>8} {'other':>6} {'score':>6}"]
    for module, c in found.items():
        killed, survived, uncovered = c.get("killed", 0), c.get("survived", 0), c.get("no tests", 0)
        total = sum(v for k, v in c.items() if k != "survivors")
        other = total - killed - survived - uncovered
        judged = killed + survived + uncovered
        score = f"{100 * killed / judged:5.1f}%" if judged else "  -"
        lines.append(f"{module:32} {total:7} {killed:7} {survived:8} {uncovered:8} {other:6} {score:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run mutmut before reading its results")
    parser.add_argument("--max-children", default="2")
    parser.add_argument("--survivors", action="store_true", help="list the surviving mutants' names")
    parser.add_argument("globs", nargs="*")
    args = parser.parse_args(argv)
    if args.run:
        mutmut = Path(sys.executable).with_name("mutmut")
        subprocess.run([str(mutmut), "run", "--max-children", args.max_children, *args.globs], cwd=ROOT, check=False)
    found = scores(ROOT / "mutants")
    print(table(found))
    if args.survivors:
        for c in found.values():
            for name in c["survivors"]:
                print(f"survived {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
