"""A cold `bash scripts/demo`, as a newcomer's first run: the time to a provisioned, audited lab.

    sudo python benchmarks/cold_demo.py [--keep]

A fresh clone of this checkout's HEAD in a temporary directory, with every cache the project makes or fills empty
(the lab's directory with its base rootfs and supply, ironserve's cache with the wheelhouses and images, uv's
cache); the machine's own apt packages stay installed. Runs the README's demo command there, prints its wall time
and the lab bring-up's steps as `lab up` timed them, then takes the lab down and removes the directory (--keep:
leaves it). Refuses while a lab is up (one lab per machine).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# `lab up`'s own timings: "ready in 67s", "built in 80s", ", 13.5 s", "(76.6s)", "total 162.8s)"
TIMED = re.compile(r"^\[lab\] (.*(?:in \d+s\b|, \d+(?:\.\d+)? s$|\(\d+(?:\.\d+)?s\)|total \d+\.\d+s\)).*)$")
# the deploy's long commands as it timed them ("[lab1] pulling IMAGE: 91s"), the demo's steps ("[demo] deploy in 160s")
DEPLOY_TIMED = re.compile(r"^\s*\[\w+\] ((?:pulling|building|pushing) \S+: \d+s)$")
STEP = re.compile(r"^\[demo\] (.* in \d+s)$")


def lab_is_up() -> bool:
    proc = subprocess.run(
        [sys.executable, "-m", "ironserve_lab", "status"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return proc.returncode == 0 and "lab is down" not in proc.stdout


def run_demo(work: Path) -> tuple[int, float, str]:
    """(exit status, wall seconds, output) of scripts/demo in a fresh clone under ``work``."""
    clone = work / "ironserve"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    if (REPO.parent / "shared").exists():  # the seeds beside the checkout, as beside this one
        (work / "shared").symlink_to(REPO.parent / "shared")
    env = {
        **os.environ,
        "IRONSERVE_CACHE": str(work / "cache"),
        "IRONSERVE_LAB_DIR": str(work / "lab"),
        "UV_CACHE_DIR": str(work / "uv-cache"),
    }
    env.pop("VIRTUAL_ENV", None)
    start = time.monotonic()
    proc = subprocess.run(["bash", "scripts/demo"], cwd=clone, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    subprocess.run([str(clone / ".venv/bin/ironserve"), "lab", "down"], env=env, capture_output=True)
    return proc.returncode, wall, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the clone and its caches")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the lab needs root")
    if lab_is_up():
        sys.exit("a lab is up: `ironserve lab down` first (one lab per machine)")
    work = Path(tempfile.mkdtemp(prefix="ironserve-cold-demo-"))
    try:
        rc, wall, output = run_demo(work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for line in output.splitlines():
        if match := TIMED.match(line):
            print(f"  lab up: {match.group(1)}")
        elif match := DEPLOY_TIMED.match(line):
            print(f"  deploy: {line.strip()}")
        elif match := STEP.match(line):
            print(f"  demo: {match.group(1)}")
    print(f"cold demo: exit {rc} in {wall:.0f} s (scripts/demo on a fresh clone, every project cache empty)")
    if rc != 0:
        print(output[-4000:], file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
