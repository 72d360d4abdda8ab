"""First-run and no-op-run times of `pyinfra inventories/lab.py deploys/glm5.py` for 2 and 8 lab hosts.

Run as root: `python benchmarks/deploy_lab.py [N ...]`. Each size gets a fresh lab (stand-in RTX PRO 6000 Max-Q),
a first run from fresh hosts, then a second run that changes nothing; the lab is taken down after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def timed(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    proc = subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - started, proc


def bench(nodes: int) -> dict:
    subprocess.run([str(BIN / "ironserve"), "lab", "down"], cwd=ROOT, capture_output=True)
    up_s, _ = timed(str(BIN / "ironserve"), "lab", "up", "--nodes", str(nodes), "--hardware", "rtx6000-pro-maxq")
    try:
        first_s, _ = timed(str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/glm5.py")
        noop_s, _ = timed(str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/glm5.py")
        dry_s, dry = timed(str(BIN / "pyinfra"), "inventories/lab.py", "deploys/glm5.py", "--dry", "--json")
        planned = [op["name"] for op in json.loads(dry.stdout)["plan"] if op["hosts_with_change"]]
    finally:
        subprocess.run([str(BIN / "ironserve"), "lab", "down"], cwd=ROOT, capture_output=True)
    return {
        "nodes": nodes,
        "lab_up_s": up_s,
        "first_run_s": first_s,
        "noop_run_s": noop_s,
        "dry_run_s": dry_s,
        "changes_planned_after": len(planned),
    }


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [2, 8]
    for n in sizes:
        r = bench(n)
        print(
            f"{r['nodes']} hosts: lab up {r['lab_up_s']:.1f} s, first run {r['first_run_s']:.1f} s, "
            f"no-op run {r['noop_run_s']:.1f} s, dry run {r['dry_run_s']:.1f} s, "
            f"changes planned after: {r['changes_planned_after']}"
        )


if __name__ == "__main__":
    main()
