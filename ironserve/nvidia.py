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


def gpu_ids(gpus: str) -> list[str]:
    """docker's --gpus value as device ids: "all" -> ["all"]; '"device=0,1"' / "device=0,1" -> ["0", "1"];
    a count N -> the first N ("0" .. "N-1"), as docker picks them."""
    value = gpus.strip().strip('"').strip("'")
    if value == "all":
        return ["all"]
    if value.isdigit():
        return [str(i) for i in range(int(value))]
    return [g.strip() for g in value.removeprefix("device=").split(",") if g.strip()]


def docker_gpu_args(gpus: str, access: str) -> list[str]:
    """docker run flags that give the container ``gpus`` (docker's --gpus value)."""
    if access != "cdi":
        return ["--gpus", gpus]
    out: list[str] = []
    for name in gpu_ids(gpus):
        out += ["--device", f"{CDI_KIND}={name}"]
    return out


def cdi_gpus(devices: list[str], gpus: str | None = None) -> str | None:
    """The --gpus value that CDI GPU devices (``nvidia.com/gpu=N``) among ``devices`` stand for, merged with
    ``gpus`` ('"device=0,1"', docker's CSV form, or "all"); None when there are none."""
    ids = gpu_ids(gpus) if gpus else []
    for device in devices:
        if device.startswith(CDI_KIND + "="):
            ids.append(device.split("=", 1)[1])
    if not ids:
        return None
    if "all" in ids:
        return "all"
    return '"device=' + ",".join(dict.fromkeys(ids)) + '"'


def is_cdi_gpu(device: str) -> bool:
    return device.startswith(CDI_KIND + "=")
