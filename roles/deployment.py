"""The whole provisioning of one model, in order: the stages every deploys/*.py runs.

    prepare (every host, in parallel, op by op):
        preflight -> host tuning -> accelerator stack (NVIDIA driver + CUDA + clocks + NCCL [+ IMEX] | Ascend)
        -> runtime (Docker engine + NVIDIA container toolkit + the recipe's image | uv venv) -> model weights
        -> service units (argv parsed by the installed SGLang) -> router unit
    launch (only when every host converged, and unless launch=false):
        gate -> rank 0 of each group -> other ranks -> router, each behind a health gate

pyinfra runs each operation on all hosts before the next one, so the launch gate sees every host's outcome
of the prepare stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ironserve.heap import freeze_at_exit
from ironserve.spec import DockerRuntime
from roles import (
    ascend,
    converged,
    cuda,
    deploy_clock,
    docker_engine,
    gpu_clocks,
    host_state,
    host_tuning,
    imex,
    launch,
    model_weights,
    nccl,
    node_exporter,
    nvidia_container_toolkit,
    nvidia_driver,
    preflight,
    recipe_image,
    router,
    router_runtime,
    sglang_service,
    uv_env,
)
from roles.context import DeploymentContext, current
from roles.desired import DesiredFile, DesiredPackage, RuntimeCheck


def _nothing(ctx: DeploymentContext) -> list:
    """What a role that puts nothing of a kind on a host declares of it."""
    return []


@dataclass(frozen=True)
class Role:
    """One role of the prepare stage: when it applies to a host, its operations, and what it puts on a host as data
    for the audit (built from the same functions its operations use)."""

    name: str  # its module, roles/<name>.py
    stage: str  # the deploy's timing stage its operations belong to (roles/deploy_clock.py)
    applies: Callable[[DeploymentContext], bool]
    apply: Callable[[DeploymentContext], None]  # its operations (a pyinfra @deploy)
    desired_files: Callable[[DeploymentContext], list[DesiredFile]] = _nothing
    desired_packages: Callable[[DeploymentContext], list[DesiredPackage]] = _nothing
    desired_runtime: Callable[[DeploymentContext], list[RuntimeCheck]] = _nothing


def _always(ctx: DeploymentContext) -> bool:
    return True


def _nvidia(ctx: DeploymentContext) -> bool:
    return ctx.vendor == "nvidia"


def _huawei(ctx: DeploymentContext) -> bool:
    return ctx.vendor == "huawei"


def _docker(ctx: DeploymentContext) -> bool:
    return isinstance(ctx.recipe.runtime, DockerRuntime)


def _docker_on_nvidia(ctx: DeploymentContext) -> bool:
    return _docker(ctx) and _nvidia(ctx)


def _uv(ctx: DeploymentContext) -> bool:
    """The engine's uv runtime: a host that runs only the router has its own small venv (roles/router_runtime.py)."""
    return not _docker(ctx) and not ctx.is_router_only


def _engine_host(ctx: DeploymentContext) -> bool:
    return not ctx.is_router_only


# The one role registry: the prepare stage's roles in order. The deploy runs them; the audit collects what they put
# on a host from the same list (ironserve/audit/providers.py).
PREPARE_ROLES: list[Role] = [
    Role("preflight", "preflight", _always, preflight.apply),
    Role("host_tuning", "host_tuning", _always, host_tuning.apply, desired_files=host_tuning.desired_files),
    Role(
        "nvidia_driver",
        "accelerator",
        _nvidia,
        nvidia_driver.apply,
        desired_files=nvidia_driver.desired_files,
        desired_packages=nvidia_driver.desired_packages,
        desired_runtime=nvidia_driver.desired_runtime,
    ),
    Role("cuda", "accelerator", _nvidia, cuda.apply, desired_packages=cuda.desired_packages),
    Role("gpu_clocks", "accelerator", _nvidia, gpu_clocks.apply, desired_files=gpu_clocks.desired_files),
    Role("nccl", "accelerator", _nvidia, nccl.apply, desired_files=nccl.desired_files),
    # multi-node NVLink only: IMEX serving before any engine unit exists
    Role(
        "imex",
        "accelerator",
        imex.wanted,
        imex.apply,
        desired_files=imex.desired_files,
        desired_packages=imex.desired_packages,
        desired_runtime=imex.desired_runtime,
    ),
    Role("ascend", "accelerator", _huawei, ascend.apply),
    Role("docker_engine", "runtime", _docker, docker_engine.apply),
    Role(
        "nvidia_container_toolkit",
        "runtime",
        _docker_on_nvidia,
        nvidia_container_toolkit.apply,
        desired_runtime=nvidia_container_toolkit.desired_runtime,
    ),
    Role("recipe_image", "runtime", _docker, recipe_image.apply, desired_runtime=recipe_image.desired_runtime),
    Role("uv_env", "runtime", _uv, uv_env.apply, desired_runtime=uv_env.desired_runtime),
    # the router's own venv (ironserve.units.router_venv), timed with the runtimes it stands beside
    Role(
        "router_runtime",
        "runtime",
        lambda ctx: ctx.runs_router,
        router_runtime.apply,
        desired_runtime=router_runtime.desired_runtime,
    ),
    Role("model_weights", "weights", _engine_host, model_weights.apply, desired_files=model_weights.desired_files),
    Role("sglang_service", "units", _always, sglang_service.apply, desired_files=sglang_service.desired_files),
    Role("router", "units", _always, router.apply),
    Role("node_exporter", "node_exporter", _always, node_exporter.apply, desired_files=node_exporter.desired_files),
    # every host, with the fast path or not: turning it on then needs no run that installs it
    Role("converged", "node_exporter", _always, converged.apply, desired_files=converged.desired_files),
]
ROLES = {role.name: role for role in PREPARE_ROLES}


def roles_for(ctx: DeploymentContext) -> list[Role]:
    """The prepare stage's roles that apply to this host, in order."""
    return [role for role in PREPARE_ROLES if role.applies(ctx)]


def prepare(ctx: DeploymentContext) -> None:
    # what the stage reads of the host: one batched read, kept for the run (roles/host_state.py)
    host_state.install(ctx)
    applies, called = roles_for(ctx), []

    def run(name: str) -> None:
        role = ROLES[name]
        called.append(role)
        deploy_clock.stage(ctx, role.stage)  # its operations' stage: their timing
        if role in applies:
            role.apply(ctx)

    # one call line per role, in the registry's order: pyinfra orders operations by the line numbers of their
    # call stack, so a loop over the registry would order the roles' operations by their lines in each role file
    run("preflight")
    run("host_tuning")
    run("nvidia_driver")
    run("cuda")
    run("gpu_clocks")
    run("nccl")
    run("imex")
    run("ascend")
    run("docker_engine")
    run("nvidia_container_toolkit")
    run("recipe_image")
    run("uv_env")
    run("router_runtime")
    run("model_weights")
    run("sglang_service")
    run("router")
    run("node_exporter")
    run("converged")
    host_state.end_planning()
    if called != PREPARE_ROLES:
        raise RuntimeError(
            "roles/deployment.py: prepare() calls the roles "
            f"{[r.name for r in called]}, the registry lists {[r.name for r in PREPARE_ROLES]}"
        )


def deploy_model(model: str) -> DeploymentContext | None:
    """Entry point for deploys/*.py: the model comes from the deploy, the hardware from the inventory. Plans
    nothing when every host is as the last run that changed nothing left it (roles/converged.py); None then for
    the hosts planned after the first."""
    freeze_at_exit()  # pyinfra's exit skips collecting what the run leaves (a no-op's 0.15 s to 0.03 s)
    if converged.decided():
        return None  # every host is as the last run that changed nothing left it: nothing to build or plan
    ctx = current(model)
    if converged.skip(ctx):
        return ctx
    deploy_clock.stage(ctx, "preflight")
    prepare(ctx)
    deploy_clock.stage(ctx, "launch_preflight")
    launch.apply(ctx)
    deploy_clock.stage(ctx, None)  # the deploy ends with its timing table and each host's ironserve_* metrics
    return ctx
