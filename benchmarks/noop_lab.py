"""What knowing that nothing changed costs: no-op run, dry run and audit against the one-ssh floor, in the lab.

    sudo .venv/bin/python benchmarks/noop_lab.py [N ...] [--rounds 3]        # default: 2 and 8 hosts

For each size: a fresh lab of stand-in RTX PRO 6000 Max-Q hosts, one apply of deploys/glm5.py (prepare stage:
launch=false on stand-ins), then ``--rounds`` alternating rounds of, side by side on the same converged hosts:

- no-op: ``pyinfra -y inventories/lab.py deploys/glm5.py`` (must change nothing);
- dry run: the same with ``--dry``;
- audit: ``ironserve audit inventories/lab.py deploys/glm5.py`` (must be clean);
- floor: one ``ssh`` per host, all hosts at once, running the one command that reads the same state the no-op
  reads (the batched facts ironserve keeps per host, roles/host_state.py);
- Ansible, where ``ansible-playbook`` is installed (this repository has no playbook: said so, not timed).

Prints the median seconds of each, their ratio to the floor and the ssh commands each sent per host, counted on
the hosts themselves (every command runs through sudo; sudo's journal lines between the marks of a run). The lab
is taken down after each size.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

KINDS = ("noop", "dry", "audit", "floor")
# as an operator's machine runs them: Python's bytecode cache in use (without it every run compiles pyinfra first)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
LABELS = {"noop": "no-op", "dry": "dry run", "audit": "audit", "floor": "one ssh"}


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, env=ENV)
    if check and proc.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def lab_status() -> dict:
    return json.loads(run(str(BIN / "ironserve"), "lab", "status", "--format", "json").stdout)


def ssh_args(status: dict, host: dict) -> list[str]:
    return [
        "ssh",
        "-i",
        host["ssh_key"],
        "-o",
        f"UserKnownHostsFile={status['known_hosts']}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
        f"{host['ssh_user']}@{host['address']}",
    ]


def floor_commands(status: dict) -> dict[str, str]:
    """Per host: the one command reading what its no-op reads (the facts its prepare stage asks, as kept)."""
    from ironserve import batch
    from ironserve.hostdata import DEFAULTS
    from roles.host_state import Request, cache_file

    out = {}
    for host in status["hosts"]:
        path = cache_file(DEFAULTS.host_state_cache, "glm5", host["name"], host["address"])
        items = json.loads(path.read_text())["facts"]
        reads = [r.shell() for r in (Request.from_json(i) for i in items) if r is not None]
        out[host["name"]] = "sudo -n sh -c " + shlex.quote(batch.compose(reads, batch.new_nonce()))
    return out


def timed(kind: str, status: dict, floors: dict[str, str]) -> float:
    started = time.monotonic()
    if kind == "noop":
        run(str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/glm5.py")
    elif kind == "dry":
        run(str(BIN / "pyinfra"), "--dry", "inventories/lab.py", "deploys/glm5.py")
    elif kind == "audit":
        out = run(str(BIN / "ironserve"), "audit", "inventories/lab.py", "deploys/glm5.py", check=False)
        if out.returncode != 0:
            sys.exit(f"audit not clean ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-2000:]}")
    else:
        procs = [
            subprocess.Popen(
                ssh_args(status, h) + [floors[h["name"]]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for h in status["hosts"]
        ]
        if any(p.wait() != 0 for p in procs):
            sys.exit("a floor read failed")
    return time.monotonic() - started


def sudo_times(status: dict, host: dict) -> list[float]:
    """When sudo ran a command on this host (its journal), as unix seconds."""
    out = run(*ssh_args(status, host), "sudo -n journalctl -q --no-pager -o short-unix _COMM=sudo")
    return [float(line.split()[0]) for line in out.stdout.splitlines() if "COMMAND=" in line]


def no_changes_planned() -> int:
    out = run(str(BIN / "pyinfra"), "inventories/lab.py", "deploys/glm5.py", "--dry", "--json")
    plan = json.loads(out.stdout)["plan"]
    return sum(1 for op in plan if op["hosts_with_change"] or op.get("hosts_with_conditional_change"))


def bench(nodes: int, rounds: int) -> dict:
    run(str(BIN / "ironserve"), "lab", "down", check=False)
    run(str(BIN / "ironserve"), "lab", "up", "--nodes", str(nodes), "--hardware", "rtx6000-pro-maxq")
    try:
        status = lab_status()
        started = time.monotonic()
        run(str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/glm5.py")
        apply_s = time.monotonic() - started
        floors = floor_commands(status)
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        windows: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
        for r in range(rounds):
            order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))  # alternating: no kind always goes first
            for kind in order:
                time.sleep(0.2)
                t0 = time.time()
                times[kind].append(timed(kind, status, floors))
                windows[kind].append((t0, time.time()))
                print(f"  {nodes} hosts, round {r + 1}: {LABELS[kind]} {times[kind][-1]:.2f} s", flush=True)
        changes = no_changes_planned()
        stamps = {h["name"]: sudo_times(status, h) for h in status["hosts"]}
        commands = {}
        for kind in KINDS:
            per_host = [sum(1 for t in stamps[h] for a, b in windows[kind] if a <= t <= b) / rounds for h in stamps]
            commands[kind] = (min(per_host), max(per_host))
    finally:
        run(str(BIN / "ironserve"), "lab", "down", check=False)
    return {
        "nodes": nodes,
        "apply_s": apply_s,
        "median": {k: statistics.median(v) for k, v in times.items()},
        "commands": commands,
        "changes_planned_after": changes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[2, 8])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the lab needs root")
    results = [bench(n, args.rounds) for n in args.sizes]
    print(f"\nmedian of {args.rounds} alternating rounds; ssh commands per host (min-max) counted on the hosts")
    print(f"{'hosts':>5} | " + " | ".join(f"{LABELS[k]:>16}" for k in KINDS) + " | changes after")
    for r in results:
        floor = r["median"]["floor"]
        cells = []
        for k in KINDS:
            lo, hi = r["commands"][k]
            count = f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"
            ratio = "" if k == "floor" else f" {r['median'][k] / floor:4.1f}x"
            cells.append(f"{r['median'][k]:5.2f} s{ratio} {count:>3}c".rjust(16))
        print(f"{r['nodes']:>5} | " + " | ".join(cells) + f" | {r['changes_planned_after']}")
        print(f"        (apply from fresh hosts: {r['apply_s']:.1f} s)")
    print(
        "Ansible: "
        + (
            "installed, but this repository has no playbook to time"
            if shutil.which("ansible-playbook")
            else "not installed"
        )
    )


if __name__ == "__main__":
    main()
