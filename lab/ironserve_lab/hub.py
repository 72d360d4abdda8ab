"""The lab's Hugging Face-compatible hub (hubd.py) on the lab bridge: which models it serves, start, stop, status.

`lab up` starts it on the bridge address (http://GATEWAY:HUB_PORT) once the lab's models exist, serving each model
the lab generates under the hub id of the recipes that generate it (recipes/tiny-cpu.yaml: model.hub_id with
model.generate), from the directory the hosts' /srv/models mounts. The inventory names it as ``hf_endpoint``, so a
deploy with ``model_source=hub`` downloads from it as from a site's mirror. It counts the bytes it serves (since it
started): `ironserve lab status --format json` gives them as ``hub`` {url, bytes_served, model_bytes, repos,
running}.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .state import GATEWAY, HUB_PORT
from .system import daemon_pid, listening, say, spawn_daemon, stop_daemon, wait_for

HUBD = Path(__file__).with_name("hubd.py")


def hub_dir(root: Path) -> Path:
    return root / "hub"


def url() -> str:
    return f"http://{GATEWAY}:{HUB_PORT}"


def served_repos(models_dir: Path, generated: list[str]) -> dict[str, str]:
    """{hub id: directory} of the models the lab generates (``generated``: their names) that a catalogue recipe
    names a hub id for."""
    from ironserve import catalogue

    repos = {}
    for _, recipe in sorted(catalogue.catalogue().items()):
        model = recipe.model
        if model.generate in generated and model.hub_id:
            repos[model.hub_id] = str(models_dir / model.generate)
    return repos


def _pidfile(root: Path) -> Path:
    return hub_dir(root) / "hubd.pid"


def _status_file(root: Path) -> Path:
    return hub_dir(root) / "served.json"


def server_pid(root: Path) -> int | None:
    return daemon_pid(_pidfile(root), "hubd.py", str(hub_dir(root)))


def hubd_argv(bind: str, port: int, repos: dict[str, str], status: Path, pidfile: Path) -> list[str]:
    """The hub server's command line: ``repos`` {hub id: directory}, its byte counts written to ``status``."""
    return [
        sys.executable,
        str(HUBD),
        "--bind",
        bind,
        "--port",
        str(port),
        "--repos",
        json.dumps(repos, sort_keys=True),
        "--status",
        str(status),
        "--pidfile",
        str(pidfile),
    ]


def start_local(bind: str, port: int, repos: dict[str, str], status: Path, pidfile: Path) -> subprocess.Popen:
    """A hub of a test or benchmark (a child, its output dropped), once it listens (its pidfile is written then)."""
    proc = subprocess.Popen(
        hubd_argv(bind, port, repos, status, pidfile), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for(pidfile.exists, 20, interval=0.05, what="the hub's pidfile")
    return proc


def start_server(root: Path, repos: dict[str, str]) -> str:
    """The hub serving ``repos`` (restarted when they changed); its URL."""
    directory = hub_dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    wanted = json.dumps(repos, sort_keys=True)
    config = directory / "repos.json"
    if server_pid(root) and config.exists() and config.read_text() == wanted:
        return url()
    stop_server(root)
    config.write_text(wanted)
    spawn_daemon(hubd_argv(GATEWAY, HUB_PORT, repos, _status_file(root), _pidfile(root)), directory / "hubd.log")
    wait_for(lambda: server_pid(root) and listening(GATEWAY, HUB_PORT), 30, what="the lab hub")
    say(f"hub: {url()} serving {', '.join(sorted(repos)) or 'no model'}")
    return url()


def stop_server(root: Path) -> None:
    stop_daemon(_pidfile(root), "hubd.py", str(hub_dir(root)), what="hub")


def status(root: Path, hub_url: str) -> dict:
    """{url, running, bytes_served, model_bytes, requests, repos} (counts since the hub started)."""
    try:
        served = json.loads(_status_file(root).read_text())
    except (OSError, ValueError):
        served = {}
    return {
        "url": hub_url,
        "running": bool(server_pid(root)),
        "bytes_served": served.get("bytes_served", 0),
        "model_bytes": served.get("model_bytes", 0),
        "requests": served.get("requests", 0),
        "repos": served.get("repos", {}),
    }
