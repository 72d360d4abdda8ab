"""Skips that would hide a failure in CI: outside CI a missing prerequisite skips with its reason; in CI (CI=true,
where the project's own files set everything up) it fails, so a run that checked nothing never passes for green."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def unavailable(reason: str):
    """Skip with ``reason``, or fail with it in CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing prerequisite fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


def need_parser_prerequisites():
    """What building a cached SGLang parser venv needs (uv, the CPU torch wheel): the parser tests skip alike
    without it outside CI (none errors while another skips), and fail in CI."""
    import shutil
    from pathlib import Path

    from ironserve import engine_parser as ep

    if not shutil.which("uv"):
        unavailable("uv is needed to build parser venvs")
    wheels = Path(os.environ.get("IRONSERVE_TORCH_WHEELS", "/opt/wheels"))
    if not list(wheels.glob(f"torch-{ep.TORCH_VERSION}+cpu-*.whl")):
        unavailable(f"no CPU torch {ep.TORCH_VERSION} wheel in {wheels}")
