#!/usr/bin/python3
"""ironserve lab stand-in for dockerd (package docker-ce). Runs no engine.

Like dockerd at start: refuses an invalid /etc/docker/daemon.json (or --config-file) and a runtime entry
without a path, then holds /var/run/docker.sock (root:docker 0660) until stopped, so the stand-in
`docker` CLI can tell whether the daemon runs. Tells systemd it is ready (Type=notify), as dockerd does.
"""

import grp
import json
import os
import signal
import socket
import sys

SOCK = "/var/run/docker.sock"
args = sys.argv[1:]
if args[:1] in (["-v"], ["--version"]):
    print("Docker version 28.5.1, build ironlab")
    sys.exit(0)
config = "/etc/docker/daemon.json"
for n, a in enumerate(args):
    if a.startswith("--config-file="):
        config = a.split("=", 1)[1]
    elif a == "--config-file" and n + 1 < len(args):
        config = args[n + 1]
if os.path.exists(config):
    try:
        with open(config) as fh:
            text = fh.read()
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        print(f"unable to configure the Docker daemon with file {config}: {exc}", file=sys.stderr)
        sys.exit(1)
    for name, runtime in (data.get("runtimes") or {}).items():
        if not isinstance(runtime, dict) or not runtime.get("path"):
            print(f"unable to configure the Docker daemon with file {config}: runtime {name}: path is required",
                  file=sys.stderr)
            sys.exit(1)
    if data.get("default-runtime") and data["default-runtime"] not in (data.get("runtimes") or {}) | {"runc": 1}:
        print(f"failed to start daemon: default runtime {data['default-runtime']} not configured", file=sys.stderr)
        sys.exit(1)

try:
    os.unlink(SOCK)
except FileNotFoundError:
    pass
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(SOCK)
os.chmod(SOCK, 0o660)
try:
    os.chown(SOCK, 0, grp.getgrnam("docker").gr_gid)
except (KeyError, PermissionError):
    pass
server.listen(64)


def stop(signum, frame):
    try:
        os.unlink(SOCK)
    except FileNotFoundError:
        pass
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
notify = os.environ.get("NOTIFY_SOCKET")
if notify:
    address = "\0" + notify[1:] if notify.startswith("@") else notify
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"READY=1\nSTATUS=ironserve lab stand-in: no engine", address)
print(f"API listen on {SOCK} (ironserve lab stand-in: no engine, images in /var/lib/docker-standin)", flush=True)
while True:
    conn, _ = server.accept()
    conn.close()
