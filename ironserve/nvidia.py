"""NVIDIA platform choices that render, the roles and the audit must agree on (pure, no host access).

GPU access in containers: the NVIDIA Container Toolkit is pinned (host data ``nvidia_container_toolkit_version``,
default below). From toolkit 1.14 on ironserve generates a CDI spec (``nvidia-ctk cdi generate``) and the units
request GPUs as CDI devices (``--device nvidia.com/gpu=all``): the device nodes are then part of the container's
own spec, so a ``systemctl daemon-reload`` with the systemd cgroup driver does not take them away
(NVIDIA/nvidia-container-toolkit#48, #1227), and toolkit 1.18's CDI mode no longer meets ``--gpus``
(#1456, #1246). Older toolkits keep ``--gpus`` and get the documented /dev/char symlink fix
(``nvidia-ctk system create-dev-char-symlinks --create-all`` plus its udev rule).
"""

from __future__ import annotations

import re

NVIDIA_CONTAINER_TOOLKIT_VERSION = "1.18.0-1"
CDI_SINCE = (1, 14)
CDI_KIND = "nvidia.com/gpu"


def version_tuple(version: str) -> tuple[int, ...]:
    """``1.18.0-1`` / ``1.14.6`` -> (1, 18, 0); epoch and Debian revision dropped."""
    upstream = version.split(":", 1)[-1].split("-", 1)[0].split("~", 1)[0]
    return tuple(int(p) for p in re.findall(r"\d+", upstream)[:3])


def gpu_access(toolkit_version: str | None) -> str:
    """``cdi`` or ``dev-char`` for the pinned container toolkit version."""
    return "cdi" if version_tuple(toolkit_version or NVIDIA_CONTAINER_TOOLKIT_VERSION) >= CDI_SINCE else "dev-char"


def docker_gpu_args(gpus: str, access: str) -> list[str]:
    """docker run flags that give the container ``gpus`` ("all" or "0,1,...")."""
    if access != "cdi":
        return ["--gpus", gpus]
    names = ["all"] if gpus == "all" else [g.strip() for g in gpus.removeprefix("device=").split(",") if g.strip()]
    out: list[str] = []
    for name in names:
        out += ["--device", f"{CDI_KIND}={name}"]
    return out
