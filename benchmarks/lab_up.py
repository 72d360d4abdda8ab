"""Time to bring lab hosts up and down (base rootfs and supply already cached).

    sudo python benchmarks/lab_up.py [--nodes 2 8] [--repeat 1] [--docker]

Prints one line per run: hosts, `up` wall time (hosts booted to systemd `running` and answering SSH),
and `down` wall time. Runs the lab CLI as a user would. Refuses if a lab is already up.
--docker: also, once, on lab1 of a 1-host rtx6000-pro-maxq lab: apt-get install of the Docker stand-ins
from the lab repo, a `docker pull`, and the glm5 recipe's parse probe (`docker run` of its image: the real
SGLang parser, CPU import included), as the roles run them.
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


def docker_timings() -> None:
    import json
    import shlex

    sys.path.insert(0, str(REPO))
    from ironserve import catalogue
    from ironserve.render import render
    from roles import sglang_service as ss

    lab("up", "--nodes", "1", "--hardware", "rtx6000-pro-maxq")
    try:
        status = json.loads(subprocess.run([sys.executable, "-m", "ironserve.lab", "status", "--format", "json"],
                                           cwd=REPO, capture_output=True, text=True, check=True).stdout)
        host = status["hosts"][0]
        ssh = ["ssh", "-i", host["ssh_key"], "-o", f"UserKnownHostsFile={status['known_hosts']}", "-o", "BatchMode=yes",
               "-o", "LogLevel=ERROR", f"{host['ssh_user']}@{host['address']}"]

        def timed(command: str, stdin: bytes | None = None) -> float:
            start = time.monotonic()
            proc = subprocess.run([*ssh, command], input=stdin, capture_output=True)
            if proc.returncode != 0:
                sys.exit(f"{command} failed:\n{proc.stdout.decode()}\n{proc.stderr.decode()}")
            return time.monotonic() - start

        apt = "sudo DEBIAN_FRONTEND=noninteractive apt-get -q -y"
        t_apt = timed(f"{apt} update >/dev/null && {apt} install docker-ce docker-ce-cli containerd.io >/dev/null")
        recipe = catalogue.get_recipe("glm5-nvfp4-mtp-rtx6000-tp8")
        t_pull = timed(f"sudo docker pull -q {recipe.runtime.pinned_ref} && sudo docker tag {recipe.runtime.pinned_ref} "
                       f"ironserve/{recipe.id}:derived")
        timed(f"sudo install -d {ss.LIB_DIR} && sudo tee {ss.PARSE_CHECK} >/dev/null && sudo chmod 755 {ss.PARSE_CHECK}",
              (REPO / "files/bin/ironserve-parse-check").read_bytes())
        probe = shlex.join(ss.parse_check_argv(recipe, render(recipe).processes[0]))
        t_probe = timed(f"sudo {probe} >/dev/null 2>&1")
        print(f"docker stand-ins: apt-get install {t_apt:.1f}s, pull + tag {t_pull:.1f}s, "
              f"parse probe (docker run, real sglang {recipe.engine.check_version} parser) {t_probe:.1f}s", flush=True)
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
    if args.docker:
        docker_timings()


if __name__ == "__main__":
    main()
