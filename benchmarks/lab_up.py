"""Time to bring lab hosts up and down (base rootfs and supply already cached).

    sudo python benchmarks/lab_up.py [--nodes 2 8] [--repeat 1] [--docker]

Prints one line per run: hosts, `up` wall time (hosts booted to systemd `running` and answering SSH),
and `down` wall time. Runs the lab CLI as a user would. Refuses if a lab is already up.
--docker: also, once, on a 1-host rtx6000-pro-maxq lab: `lab up` (the parser and stand-in GPU images
built once per machine and pushed), then the production GLM-5 deploy, whose long steps (Debian's docker.io, the
pull of the stand-in image by the site lock's digest, the derived build, the parse check in the image) print
their own times.
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
    proc = subprocess.run(
        [sys.executable, "-m", "ironserve_lab", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"lab {' '.join(args)} failed:\n{proc.stderr}")
    return elapsed


def docker_timings() -> None:
    t_up = lab("up", "--nodes", "1", "--hardware", "rtx6000-pro-maxq")
    try:
        start = time.monotonic()
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("pyinfra")), "-y", "inventories/lab.py", "deploys/glm5.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            sys.exit(f"the glm5 deploy failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        steps = [
            line.strip()
            for line in proc.stdout.splitlines()
            if line.strip().endswith("s") and ": " in line and ("pulling" in line or "building" in line)
        ]
        print(
            f"docker (real engine): lab up {t_up:.1f}s, glm5 deploy {time.monotonic() - start:.1f}s; "
            + "; ".join(steps),
            flush=True,
        )
    finally:
        lab("down")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--docker", action="store_true", help="also time the Docker stand-ins and the parse probe")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the lab needs root")
    state = Path(os.environ.get("IRONSERVE_LAB_DIR") or "/var/lib/ironserve-lab") / "state.json"
    if state.exists():
        sys.exit(f"a lab is already up ({state}); run `python -m ironserve_lab down` first")
    print("warming caches (base rootfs, supply): one 1-host up/down, not timed", file=sys.stderr)
    lab("up", "--nodes", "1")
    lab("down")
    print(f"{'hosts':>5}  {'up (s)':>7}  {'down (s)':>8}")
    for n in args.nodes:
        for _ in range(args.repeat):
            t_up = lab("up", "--nodes", str(n))
            t_down = lab("down")
            print(f"{n:>5}  {t_up:>7.1f}  {t_down:>8.1f}", flush=True)
    if args.docker:
        docker_timings()


if __name__ == "__main__":
    main()
