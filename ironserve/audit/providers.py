"""What the roles put on a host, as data for the audit: files with their content hash, packages, runtime state.

Each role module that manages files or packages exposes a pure `desired_files(ctx)` / `desired_packages(ctx)` /
`desired_runtime(ctx)` built from the same functions its operations use; this module collects them, so the
audit compares exactly what the deploy writes.
"""

from __future__ import annotations

import importlib

ROLE_MODULES = ["host_tuning", "nvidia_driver", "imex", "cuda", "gpu_clocks", "nccl", "ascend", "container_runtime",
                "uv_env", "model_weights", "sglang_service", "router"]


def _collect(ctx, fn_name: str) -> list[dict]:
    out: list[dict] = []
    for name in ROLE_MODULES:
        try:
            module = importlib.import_module(f"roles.{name}")
        except ImportError:
            continue
        fn = getattr(module, fn_name, None)
        if fn is not None:
            out.extend(fn(ctx))
    return out


def role_files(ctx) -> list[dict]:
    """[{path, sha256, mode, owner, gate}]"""
    return _collect(ctx, "desired_files")


def role_packages(ctx) -> list[dict]:
    """[{name, version, gate}]"""
    return _collect(ctx, "desired_packages")


def runtime_checks(ctx) -> list[dict]:
    """[{id, kind, expected, params}] — image digests present and used, venv package versions."""
    return _collect(ctx, "desired_runtime")
