"""A running container's drift from its rendered unit (docker recipes): image, command, env names.

Containers run under systemd units (``docker run --rm --name <unit>``); drift of a running container against the
rendered unit is detected by the fact ``ContainerConfig`` and repaired by the operation ``container_current``
(called by roles/launch.py, which owns restarts).
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

from ironserve.units import deliberate
from roles.common import assignments, with_pushed_images

CONTAINER_FORMAT = "\n".join(
    [
        "image_id={{.Image}}",
        "image={{.Config.Image}}",
        "running={{.State.Running}}",
        "cmd={{json .Config.Cmd}}",
        # names only: the values include the API key and the HF token
        'env={{range .Config.Env}}{{index (split . "=") 0}} {{end}}',
    ]
)


class ContainerConfig(FactBase):
    """The running container of a unit against the current id of the image it should run.

    {image_id, image, running, cmd, env_names, want_image_id}; None when there is no such container.
    """

    def command(self, container, image):
        return (
            f"docker container inspect --format {shlex.quote(CONTAINER_FORMAT)} {shlex.quote(container)} "
            f"2>/dev/null && echo want_image_id=$(docker image inspect --format '{{{{.Id}}}}' "
            f"{shlex.quote(image)} 2>/dev/null) || true"
        )

    def process(self, output):
        data = assignments(output)
        if "image_id" not in data:
            return None
        return {
            "image_id": data["image_id"],
            "image": data.get("image", ""),
            "running": data.get("running") == "true",
            "cmd": json.loads(data["cmd"]) if data.get("cmd") not in (None, "", "null") else [],
            "env_names": sorted(set(data.get("env", "").split())),
            "want_image_id": data.get("want_image_id") or None,
        }


# --------------------------------------------------------------------------- operations


@operation()
@with_pushed_images
def container_current(unit: str, image: str, cmd: list[str], env_names: list[str]):
    """Restart a unit whose running container differs from the rendered one (image, command, env names).

    docker.container in pyinfra compares nothing of this; the unit owns the container (docker run --rm), so
    the repair is a unit restart. A unit that is not running is left to the launch stage.
    """
    have = host.get_fact(ContainerConfig, container=unit, image=image)
    if not have or not have.get("running"):
        host.noop(f"no running container {unit}")
        return
    why = drift(have, image, cmd, env_names)
    if not why:
        host.noop(f"container {unit} runs the rendered configuration")
        return
    yield deliberate("restart", unit)


def drift(have: dict, image: str, cmd: list[str], env_names: list[str]) -> list[str]:
    """What differs between a running container and the rendered unit ([] when nothing)."""
    why = []
    if have.get("image") != image:
        why.append(f"image {have.get('image')} != {image}")
    if have.get("want_image_id") and have.get("image_id") != have.get("want_image_id"):
        why.append("the image was rebuilt or re-pulled since the container started")
    if list(have.get("cmd") or []) != list(cmd):
        why.append("command line differs")
    missing = sorted(set(env_names) - set(have.get("env_names") or []))
    if missing:
        why.append(f"env lacks {', '.join(missing)}")
    return why
