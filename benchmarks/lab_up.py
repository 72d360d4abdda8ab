"""Time to bring lab hosts up and down (base rootfs and supply already cached).

    sudo python benchmarks/lab_up.py [--nodes 2 8] [--repeat 1]

Prints one line per run: hosts, `up` wall time (hosts booted to systemd `running` and answering SSH),
and `down` wall time. Runs the lab CLI as a user would. Refuses if a lab is already up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def lab(*args: str) -> float:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ironserve.lab", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"lab {' '.join(args)} failed:\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the lab needs root")
    state = Path(os.environ.get("IRONSERVE_LAB_DIR") or "/var/lib/ironserve-lab") / "state.json"
    if state.exists():
        sys.exit(f"a lab is already up ({state}); run `python -m ironserve.lab down` first")
    print("warming caches (base rootfs, supply): one 1-host up/down, not timed", file=sys.stderr)
    lab("up", "--nodes", "1")
    lab("down")
    print(f"{'hosts':>5}  {'up (s)':>7}  {'down (s)':>8}")
    for n in args.nodes:
        for _ in range(args.repeat):
            t_up = lab("up", "--nodes", str(n))
            t_down = lab("down")
            print(f"{n:>5}  {t_up:>7.1f}  {t_down:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
