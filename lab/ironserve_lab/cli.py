"""`ironserve lab up|build|status|reset|down` argument parsing and handlers.

The product's command line (ironserve/cli.py) adds this parser when the lab's package is installed (a checkout's
environment: it is a dev dependency of the workspace); `python -m ironserve_lab up|build|status|reset|down` is the same.
"""

from __future__ import annotations

import argparse
import json
import sys

from .profiles import HARDWARE_IDS
from .state import DEFAULT_HARDWARE
from .system import LabError


def add_lab_parser(subparsers) -> argparse.ArgumentParser:
    lab = subparsers.add_parser(
        "lab",
        help="local multi-host lab (systemd-nspawn hosts, air-gapped supply)",
        description="Boot several local hosts with real systemd and sshd on a private "
        "bridge, to test deploys for real. Needs root.",
    )
    add_lab_arguments(lab)
    lab.set_defaults(func=run_lab)
    return lab


def add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="lab_command", required=True)
    up = sub.add_parser("up", help="bring the lab up (idempotent; builds the base rootfs on first use)")
    _plan_arguments(up)
    up.add_argument(
        "--for",
        dest="for_names",
        action="append",
        default=[],
        metavar="NAME",
        help="build only what this needs: a recipe ID, a model family (its default recipe for the hardware) or a "
        "deploy file (deploys/glm5.py); repeatable (default: everything the profile's recipes need)",
    )
    build = sub.add_parser(
        "build",
        help="build into this machine's caches what `up` with these arguments would (wheelhouses, images), no lab "
        "touched",
        description="Build the runtimes' wheelhouses, the CPU runtime or parser image and the stand-in images' layers "
        "that `lab up` with the same --nodes/--hardware/--plus uses, into this machine's caches, without touching a "
        "lab (no state, index, registry or host): run beside a running lab, the next `up` only publishes and boots.",
    )
    _plan_arguments(build)
    st = sub.add_parser("status", help="show lab hosts")
    st.add_argument("--format", choices=("text", "json"), default="text")
    reset = sub.add_parser(
        "reset",
        help="replace one host with a fresh OS (same name and address), keep the others",
        description="Stop HOST, discard everything written on it and boot it again from the "
        "base image: a host rebuilt from scratch. Rebuild it with the production "
        "deploy: pyinfra inventories/lab.py DEPLOY --limit HOST.",
    )
    reset.add_argument("host", help="lab host name (see `ironserve lab status`)")
    sub.add_parser("down", help="stop every host and remove every trace (keeps the rootfs cache)")


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The hosts of a lab: --nodes of --hardware, then --plus PROFILE:N each."""
    parser.add_argument("--nodes", type=int, default=2, help="number of hosts (default 2)")
    parser.add_argument(
        "--hardware",
        choices=HARDWARE_IDS,
        default=None,
        help=f"stand-in hardware profile (default: keep current, else {DEFAULT_HARDWARE})",
    )
    parser.add_argument(
        "--plus",
        action="append",
        default=[],
        type=_plus,
        metavar="PROFILE:N",
        help="a mixed lab: N more hosts of PROFILE after the --nodes of --hardware (repeatable, in host order: "
        "--nodes 5 --hardware gb200 --plus rtx6000-pro-maxq:2 makes lab1-5 gb200, lab6-7 rtx6000-pro-maxq); "
        "each builds everything its profile's recipes use",
    )


def _plus(text: str) -> tuple[str, int]:
    """--plus PROFILE:N as (profile, count)."""
    profile, _, count = text.partition(":")
    if profile not in HARDWARE_IDS or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: PROFILE:N, N at least 1 and PROFILE one of {', '.join(HARDWARE_IDS)} (e.g. gb200:5)"
        )
    return profile, int(count)


def run_lab(args: argparse.Namespace) -> int:
    from . import cluster  # imported late: `--help` needs nothing but argparse

    try:
        if args.lab_command == "up":
            cluster.up(args.nodes, args.hardware, tuple(args.for_names), tuple(args.plus))
        elif args.lab_command == "build":
            cluster.build(args.nodes, args.hardware, tuple(args.plus))
        elif args.lab_command == "reset":
            cluster.reset(args.host)
        elif args.lab_command == "down":
            cluster.down()
        elif args.lab_command == "status":
            data = cluster.status()
            if args.format == "json":
                print(json.dumps(data, indent=2))
            elif not data["hosts"]:
                print("lab is down")
            else:
                for h in data["hosts"]:
                    state = "running" if h.get("running") else "stopped"
                    print(f"{h['name']:8} {h['address']:15} {h['hardware']:18} {state}")
                print(
                    f"ssh: ssh -i {data['hosts'][0]['ssh_key']} -o UserKnownHostsFile={data['known_hosts']} "
                    f"{data['hosts'][0]['ssh_user']}@ADDRESS"
                )
                print(f"apt mirror: {data['apt_mirror']}  pip index: {data['pip_index']}")
                if data.get("built_for") is not None:
                    print(f"built for: {', '.join(data['built_for'])} (lab up --for; other recipes need another up)")
        return 0
    except LabError as exc:
        print(f"[lab] error: {exc}", file=sys.stderr)
        if args.lab_command == "up" and "needs root" not in str(exc):
            print("[lab] hosts already started keep running; `ironserve lab down` removes everything", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ironserve_lab", description="ironserve lab")
    add_lab_arguments(parser)
    return run_lab(parser.parse_args(argv))
