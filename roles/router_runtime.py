"""The router's own runtime: a venv of the recipe's pinned sglang-router (ironserve.units.router_venv), never the
engine's runtime, installed in the runtime stage beside the engine's.

- beside a uv runtime: on the runtime's Python (``sglang-router-<version>-py<python>``), with the runtime's indexes
  (or the host's mirror); where the runtime's lock (ironserve/imagelock.py) holds sglang-router==engine.router for
  this host's machine, resolved within it and every file hash-checked (``uv pip install --require-hashes -c``: the
  lock's resolution as constraints), and its record says so (a venv installed before the lock is reinstalled);
- beside a docker runtime: on the OS's python3 (``sglang-router-<version>``; sglang-router's wheels are abi3), from
  the host's mirror; where the recipe's lock file holds the router's resolution for this host's machine and the
  minor of its python3 (``ironserve lock RECIPE --router``), resolved within it, every file hash-checked, as
  above; without one, unchecked with a warning naming the fix, or refused under ``require_locks`` (before any host
  is touched where the lock has no router entry at all: roles/context.require_locked_runtime).

So a dedicated router host installs about 110 MB instead of the engine's stack; venvs no live, staged or last good
unit names any more (runtime venvs, router venvs of earlier versions: roles/uv_env.unused_venvs_removed) are
removed from every router host, so weekly router upgrades leave one or two router venvs, not one per week. An
upgrade of the engine's runtime leaves the router's unit as it is. The interpreter is checked by the preflight
(roles/uv_env.venvs_of). No host data of its own: the uv role's (``pip_index_url``, ``package_indexes``, ``uv_*``).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Arch
from pyinfra.operations import files

from ironserve.imagelock import hashed_requirements_text
from ironserve.spec import UvRuntime
from ironserve.units import ROUTER_DIST, router_venv
from roles.common import put_text
from roles.context import DeploymentContext, router_runtime_lock, runtime_lock, unlocked_router
from roles.desired import RuntimeCheck
from roles.uv_env import (
    LOCKED_REQUIREMENTS_NAME,
    OS_PYTHON,
    REQUIREMENTS_NAME,
    OsPython,
    index_args,
    python_sources,
    unchecked,
    unused_venvs_removed,
    uv_env,
    uv_present,
    venv_check,
    venv_packages,
    venv_present,
)


def router_lock(ctx: DeploymentContext, arch: str | None) -> dict[str, list[str]] | None:
    """The runtime lock's resolution for this host's machine where it holds the router's pin (a uv runtime that
    pins sglang-router==engine.router, locked): the router venv resolves within it, hash-checked. None otherwise
    (the runtime's own role warns of a missing lock, or refuses it under require_locks). Beside a docker runtime:
    the lock's router resolution for this host's machine and python3 (``docker_router_lock``)."""
    if not isinstance(ctx.recipe.runtime, UvRuntime):
        return docker_router_lock(ctx, arch, host.get_fact(OsPython))
    platforms, _ = runtime_lock(ctx)
    locked = (platforms or {}).get(arch)
    return locked if locked and f"{ROUTER_DIST}=={ctx.recipe.engine.router}" in locked else None


def docker_router_lock(ctx: DeploymentContext, arch: str | None, python: str | None) -> dict[str, list[str]] | None:
    """The lock file's router resolution for this machine and Python minor (a docker recipe's router venv runs on
    the host's python3); None, with the warning or under require_locks the error, where it has none."""
    platforms, why = router_runtime_lock(ctx)
    if platforms is not None and python is None:
        why = f"this host has no {OS_PYTHON} for the router venv"
    elif platforms is not None:
        locked = (platforms.get(arch) or {}).get(python)
        if locked and f"{ROUTER_DIST}=={ctx.recipe.engine.router}" in locked:
            return locked
        have = ", ".join(f"{a} Python {p}" for a, by_python in sorted(platforms.items()) for p in sorted(by_python))
        why = (
            f"its router lock resolves {have}, not {arch} Python {python} (`ironserve lock --router --arch {arch} "
            f"--router-python {python}`)"
        )
    return unchecked(ctx, unlocked_router(ctx, why))


def removes_unused_venvs(ctx: DeploymentContext) -> bool:
    """Whether this role removes the host's unused venvs: where the uv runtime's role does not (a dedicated router
    host, a docker recipe's router host), so that every host with venvs runs the removal once."""
    return ctx.is_router_only or not isinstance(ctx.recipe.runtime, UvRuntime)


@deploy("router runtime")
def apply(ctx: DeploymentContext) -> None:
    """The router's own venv (ironserve.units.router_venv): sglang-router at the recipe's pin, on the uv runtime's
    Python (hash-checked within the runtime's lock where it has one) or the OS's python3 beside a docker runtime.
    Unversioned by digest: it holds one pinned package and its dependencies. A host that runs only the router
    installs no engine runtime; venvs no unit names any more are removed (``removes_unused_venvs``)."""
    path = router_venv(ctx.recipe)
    if not path or not ctx.runs_router:
        return
    runtime, mirror = ctx.recipe.runtime, ctx.host.pip_index_url
    uv = isinstance(runtime, UvRuntime)
    env = uv_env(bool(mirror), python_sources(ctx.host), mirror)
    uv_present(ctx, env)
    root = path.rpartition("/")[0]
    files.directory(name="venv root", path=root, mode="755")
    created = venv_present(name=f"router venv {path}", path=path, python=runtime.python if uv else OS_PYTHON, env=env)
    # a uv runtime's own indexes (the host's mirror alone where it has one), the mirror beside a docker runtime
    idx = index_args(runtime, mirror, ctx.host.package_indexes) if uv else (["--index-url", mirror] if mirror else [])
    locked, constraints = router_lock(ctx, host.get_fact(Arch)), f"{path}/{LOCKED_REQUIREMENTS_NAME}"
    if locked:
        put_text(
            "router venv constraints with hashes (the runtime's lock)", hashed_requirements_text(locked), constraints
        )
    pin = f"{ROUTER_DIST}=={ctx.recipe.engine.router}"
    installed = venv_packages(
        name=f"router venv {path} packages" + (" (hash-checked)" if locked else ""),
        path=path,
        packages=[pin],
        args=idx,
        env=env,
        constraints=constraints if locked else None,
    )
    record = f"# --require-hashes: within the runtime's lock ({LOCKED_REQUIREMENTS_NAME})\n" if locked else ""
    put_text(
        "router venv requirements record", f"# managed by ironserve\n{record}{pin}\n", f"{path}/{REQUIREMENTS_NAME}"
    )
    ctx.changes.record_runtime_change(created, installed)
    if removes_unused_venvs(ctx):
        unused_venvs_removed(name="unused venvs removed", root=root, recipe_id=ctx.recipe.id, keep=path)


# --------------------------------------------------------------------------- audit


def desired_runtime(ctx: DeploymentContext) -> list[RuntimeCheck]:
    """The router's own venv (where this host runs a router from one) holds the pinned sglang-router."""
    path = router_venv(ctx.recipe)
    if not path or not ctx.runs_router:
        return []
    return [venv_check(path, [f"{ROUTER_DIST}=={ctx.recipe.engine.router}"])]
