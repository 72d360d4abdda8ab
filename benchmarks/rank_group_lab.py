"""A multi-node group in the lab, timed: rendezvous, group formation, recovery of the whole group after a rank fails.

Run as root: `python benchmarks/rank_group_lab.py [ROUNDS]`. A fresh 2-host cpu-lab, recipes/tiny-cpu-tp2.yaml
(real SGLang on CPU, TP2 over gloo, one rank per host) deployed with the production deploy; then, ROUNDS times
(default 2), rank 1's engine is hit (SIGKILL, then SIGSTOP: a dead and a hung rank) and the time until the group
restarted as a whole (rank 0's systemd invocation changed) and serves a chat completion again is measured.
Prints figures and one JSON line; the lab is taken down after.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RECIPE = "tiny-cpu-tp2"
UNIT = f"sglang-{RECIPE}-server"


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True)
    if check and proc.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def on(host: dict, command: str) -> str:
    return run(
        "ssh",
        "-i",
        host["ssh_key"],
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        f"{host['ssh_user']}@{host['address']}",
        f"sudo sh -c {json.dumps(command)}",
        check=False,
    ).stdout.strip()


def answers(host: dict) -> bool:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    req = urllib.request.Request(
        f"http://{host['address']}:30000/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status == 200
    except OSError:
        return False


def recovery(rank0: dict, rank1: dict, signal: str, limit_s: float = 420) -> float | None:
    before = on(rank0, f"systemctl show -p InvocationID --value {UNIT}")
    start = time.monotonic()
    on(rank1, f"systemctl kill -s {signal} {UNIT}")
    while time.monotonic() - start < limit_s:
        time.sleep(3)
        if on(rank0, f"systemctl show -p InvocationID --value {UNIT}") != before and answers(rank0):
            return time.monotonic() - start
    return None


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    run(str(BIN / "ironserve"), "lab", "down", check=False)
    run(str(BIN / "ironserve"), "lab", "up", "--nodes", "2", "--hardware", "cpu-lab")
    try:
        hosts = json.loads(run(str(BIN / "ironserve"), "lab", "status", "--format", "json").stdout)["hosts"]
        started = time.monotonic()
        out = run(str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/tiny.py", "--data", f"recipe={RECIPE}")
        deploy_s = time.monotonic() - started
        text = out.stdout + out.stderr
        rendezvous = [float(s) for s in re.findall(r"met its group of 2 via \S+ in ([0-9.]+)s", text)]
        formed = re.search(r"healthy after (\d+)s", text)
        figures = {
            "deploy_s": round(deploy_s, 1),
            "rendezvous_s": rendezvous,
            "group_healthy_after_start_s": int(formed.group(1)) if formed else None,
            "recoveries": [],
        }
        for _ in range(rounds):
            for signal in ("KILL", "STOP"):
                took = recovery(hosts[0], hosts[1], signal)
                figures["recoveries"].append({"signal": signal, "s": round(took, 1) if took else None})
                if took is None:  # keep what the guards and engines said before the lab goes away
                    for host in hosts:
                        print(f"--- {host['name']}: journal of the failed SIG{signal} round")
                        print(on(host, f"journalctl -u {UNIT}-rank-guard -u {UNIT} -n 60 --no-pager"))
    finally:
        run(str(BIN / "ironserve"), "lab", "down", check=False)
    print(
        f"first deploy (fresh hosts) {figures['deploy_s']} s; gloo rendezvous per rank {figures['rendezvous_s']} s; "
        f"group healthy {figures['group_healthy_after_start_s']} s after its start"
    )
    for r in figures["recoveries"]:
        print(f"SIG{r['signal']} on rank 1: group restarted and serving again after {r['s']} s")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
