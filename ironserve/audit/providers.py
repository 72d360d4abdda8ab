"""What the roles put on a host, as data for the audit: files with their content hash, packages, runtime state.

Each role module that manages files or packages exposes a pure `desired_files(ctx)` / `desired_packages(ctx)` /
`desired_runtime(ctx)` built from the same functions its operations use; this module collects them from the
roles the deploy runs on the host (roles.deployment's registry), so the audit compares exactly what the deploy
writes. A role that cannot be imported fails the audit: a silently skipped role would pass as clean.
"""

from __future__ import annotations


def _collect(ctx, fn_name: str) -> list[dict]:
    from roles.deployment import roles_for

    out: list[dict] = []
    for module in roles_for(ctx):
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
