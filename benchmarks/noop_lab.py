"""What knowing that nothing changed costs: fast path, no-op run, dry run and audit against one ssh per host, in the lab.

    sudo .venv/bin/python benchmarks/noop_lab.py [N ...] [--rounds 3]        # default: 2, 4 and 8 hosts

For each size: a fresh lab of stand-in RTX PRO 6000 Max-Q hosts, one apply of deploys/glm5.py (prepare stage:
launch=false on stand-ins), one no-op run that records (roles/converged.py, on by default), then
``--rounds`` alternating rounds of, side by side on the same converged hosts:

- fast: ``pyinfra -y inventories/lab.py deploys/glm5.py`` (the default: plans nothing, every host's record still
  vouches);
- no-op: the same with ``--data converged_fast_path=false`` (plans every operation, changes nothing);
- dry run: that with ``--dry``;
- audit: ``ironserve audit inventories/lab.py deploys/glm5.py`` (must be clean);
- light: one ``ssh`` per host, all hosts at once, running the fast path's one read (``ironserve-converged check``);
- floor: one ``ssh`` per host, all at once, running the one command that reads what the no-op reads (the batched
  facts ironserve keeps per host, roles/host_state.py);
- short: one ``ssh`` per host, all at once, running the short state check the fleet issue measured (hashes of the
  managed unit, env, sysctl and apt files, ``dpkg-query -W``, unit enablement, two sysctls, the governors);
- Ansible, where ``ansible-playbook`` is installed (this repository has no playbook: said so, not timed).

Prints the median seconds of each, their ratio to the light read, the ssh commands each sent per host (counted on
the hosts themselves: sudo's journal lines between the marks of a run), and the controller's CPU seconds (user +
system of the pyinfra or ironserve process) per run, with its slope per host across the sizes. The lab is taken
down after each size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

KINDS = ("fast", "noop", "dry", "audit", "light", "floor", "short")
FULL = ("--data", "converged_fast_path=false")  # the whole plan, as before the fast path
CHECKER = "/usr/local/lib/ironserve/ironserve-converged"
# as an operator's machine runs them: Python's bytecode cache in use (without it every run compiles pyinfra first)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
LABELS = {
    "fast": "fast path",
    "noop": "no-op",
    "dry": "dry run",
    "audit": "audit",
    "light": "light read",
    "floor": "full read",
    "short": "short check",
}
# the short state check: what a no-op must know at the least, by hand
SHORT = "sudo -n sh -c " + shlex.quote(
    "sha256sum /etc/systemd/system/*.service /etc/ironserve/*.env /etc/sysctl.d/*.conf /etc/apt/sources.list.d/* "
    "/etc/docker/daemon.json /etc/default/prometheus-node-exporter 2>/dev/null; dpkg-query -W; "
    "cd /etc/systemd/system && systemctl is-enabled *.service; sysctl -n vm.swappiness kernel.numa_balancing; "
    "cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null; true"
)


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


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(kind: str, status: dict, floors: dict[str, str]) -> tuple[float, float]:
    """Seconds of the kind's run, and the controller CPU seconds its process used."""
    started, cpu = time.monotonic(), child_cpu()
    if kind == "fast":
        out = run(str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/glm5.py")
        if "no change" not in out.stdout + out.stderr:
            sys.exit(f"the fast path planned in full:\n{(out.stdout + out.stderr)[-3000:]}")
    elif kind == "noop":
        run(str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/glm5.py", *FULL)
    elif kind == "dry":
        run(str(BIN / "pyinfra"), "--dry", "inventories/lab.py", "deploys/glm5.py", *FULL)
    elif kind == "audit":
        out = run(str(BIN / "ironserve"), "audit", "inventories/lab.py", "deploys/glm5.py", check=False)
        if out.returncode != 0:
            sys.exit(f"audit not clean ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-2000:]}")
    else:
        command = {"light": f"sudo -n {CHECKER} check", "short": SHORT}.get(kind)
        procs = [
            subprocess.Popen(
                ssh_args(status, h) + [command or floors[h["name"]]],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for h in status["hosts"]
        ]
        if any(p.wait() != 0 for p in procs):
            sys.exit(f"a {LABELS[kind]} failed")
    return time.monotonic() - started, child_cpu() - cpu


def sudo_times(status: dict, host: dict) -> list[float]:
    """When sudo ran a command on this host (its journal), as unix seconds."""
    out = run(*ssh_args(status, host), "sudo -n journalctl -q --no-pager -o short-unix _COMM=sudo")
    return [float(line.split()[0]) for line in out.stdout.splitlines() if "COMMAND=" in line]


def no_changes_planned() -> int:
    out = run(str(BIN / "pyinfra"), "inventories/lab.py", "deploys/glm5.py", "--dry", "--json", *FULL)
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
        recorded = run(str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/glm5.py")
        if "converged fast path: no record:" in recorded.stdout + recorded.stderr:
            sys.exit(f"the no-op after the apply recorded nothing:\n{(recorded.stdout + recorded.stderr)[-3000:]}")
        floors = floor_commands(status)
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        cpus: dict[str, list[float]] = {k: [] for k in KINDS}
        windows: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
        for r in range(rounds):
            order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))  # alternating: no kind always goes first
            for kind in order:
                time.sleep(0.2)
                t0 = time.time()
                seconds, cpu = timed(kind, status, floors)
                times[kind].append(seconds)
                cpus[kind].append(cpu)
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
        "cpu": {k: statistics.median(v) for k, v in cpus.items()},
        "commands": commands,
        "changes_planned_after": changes,
    }


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of CPU seconds over host count (0 with fewer than two sizes)."""
    if len({n for n, _ in points}) < 2:
        return 0.0
    mean_n = statistics.mean(n for n, _ in points)
    mean_c = statistics.mean(c for _, c in points)
    return sum((n - mean_n) * (c - mean_c) for n, c in points) / sum((n - mean_n) ** 2 for n, _ in points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the lab needs root")
    results = [bench(n, args.rounds) for n in args.sizes]
    print(f"\nmedian of {args.rounds} alternating rounds; ssh commands per host (min-max) counted on the hosts")
    print(f"{'hosts':>5} | " + " | ".join(f"{LABELS[k]:>16}" for k in KINDS) + " | changes after")
    for r in results:
        light = r["median"]["light"]
        cells = []
        for k in KINDS:
            lo, hi = r["commands"][k]
            count = f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"
            ratio = "" if k == "light" else f" {r['median'][k] / light:4.1f}x"
            cells.append(f"{r['median'][k]:5.2f} s{ratio} {count:>3}c".rjust(16))
        print(f"{r['nodes']:>5} | " + " | ".join(cells) + f" | {r['changes_planned_after']}")
        print(f"        (apply from fresh hosts: {r['apply_s']:.1f} s)")
    for r in results:
        short = r["median"]["short"]
        cells = ", ".join(f"{LABELS[k]} {r['median'][k] / short:.1f}x" for k in ("fast", "noop", "audit"))
        print(f"{r['nodes']:>5} hosts against the short state check ({short:.2f} s): {cells}")
    print("\ncontroller CPU seconds per run (user + system), median")
    for kind in ("fast", "noop", "dry", "audit"):
        per_size = [(r["nodes"], r["cpu"][kind]) for r in results]
        cells = "  ".join(f"{n} hosts {cpu:5.2f} s" for n, cpu in per_size)
        print(f"  {LABELS[kind]:>9}: {cells}  slope {slope(per_size):.3f} s/host")
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
