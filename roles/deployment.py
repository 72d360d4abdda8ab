"""The whole provisioning of one model, in order: the stages every deploys/*.py runs.

    prepare (every host, in parallel, op by op):
        preflight -> host tuning -> accelerator stack (NVIDIA driver + CUDA + clocks + NCCL [+ IMEX] | Ascend)
        -> runtime (docker image | uv venv) -> model weights -> service units (argv parsed by the installed SGLang)
        -> router unit
    launch (only when every host converged, and unless launch=false):
        gate -> rank 0 of each group -> other ranks -> router, each behind a health gate

pyinfra runs each operation on all hosts before the next one, so the launch gate sees every host's outcome
of the prepare stage.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from ironserve.spec import DockerRuntime
from roles import (
    ascend,
    container_runtime,
    cuda,
    deploy_clock,
    gpu_clocks,
    host_state,
    host_tuning,
    imex,
    launch,
    model_weights,
    nccl,
    node_exporter,
    nvidia_driver,
    preflight,
    router,
    sglang_service,
    uv_env,
)
from roles.context import DeploymentContext, current


def _always(ctx: DeploymentContext) -> bool:
    return True


def _nvidia(ctx: DeploymentContext) -> bool:
    return ctx.vendor == "nvidia"


def _docker(ctx: DeploymentContext) -> bool:
    return isinstance(ctx.recipe.runtime, DockerRuntime)


# The one role registry: the prepare stage's roles in order, each with when it applies to a host. The deploy runs
# them; the audit collects what they put on a host (their desired_files/packages/runtime) from the same list.
PREPARE_ROLES: list[tuple[ModuleType, Callable[[DeploymentContext], bool]]] = [
    (preflight, _always),
    (host_tuning, _always),
    (nvidia_driver, _nvidia),
    (cuda, _nvidia),
    (gpu_clocks, _nvidia),
    (nccl, _nvidia),
    (imex, imex.wanted),  # multi-node NVLink only: IMEX serving before any engine unit exists
    (ascend, lambda ctx: ctx.vendor == "huawei"),
    (container_runtime, _docker),
    (uv_env, lambda ctx: not _docker(ctx)),
    (model_weights, lambda ctx: not ctx.is_router_only),
    (sglang_service, _always),
    (router, _always),
    (node_exporter, _always),
]


def roles_for(ctx: DeploymentContext) -> list[ModuleType]:
    """The prepare stage's roles that apply to this host, in order."""
    return [role for role, applies in PREPARE_ROLES if applies(ctx)]


def prepare(ctx: DeploymentContext) -> None:
    # what the stage reads of the host: one batched read, kept for the run (roles/host_state.py)
    host_state.install(ctx)
    applies, called = roles_for(ctx), []

    def run(role: ModuleType) -> None:
        called.append(role)
        deploy_clock.role_stage(ctx, role.__name__.rsplit(".", 1)[-1])  # its operations' stage: their timing
        if role in applies:
            role.apply(ctx)

    # one call line per role, in the registry's order: pyinfra orders operations by the line numbers of their
    # call stack, so a loop over the registry would order the roles' operations by their lines in each role file
    run(preflight)
    run(host_tuning)
    run(nvidia_driver)
    run(cuda)
    run(gpu_clocks)
    run(nccl)
    run(imex)
    run(ascend)
    run(container_runtime)
    run(uv_env)
    run(model_weights)
    run(sglang_service)
    run(router)
    run(node_exporter)
    host_state.end_planning()
    if called != [role for role, _ in PREPARE_ROLES]:
        raise RuntimeError(
            "roles/deployment.py: prepare() calls the roles "
            f"{[r.__name__ for r in called]}, the registry lists {[r.__name__ for r, _ in PREPARE_ROLES]}"
        )


def deploy_model(model: str) -> DeploymentContext:
    """Entry point for deploys/*.py: the model comes from the deploy, the hardware from the inventory."""
    ctx = current(model)
    deploy_clock.stage(ctx, "preflight")
    prepare(ctx)
    deploy_clock.stage(ctx, "launch_preflight")
    launch.apply(ctx)
    deploy_clock.stage(ctx, None)  # the deploy ends with its timing table and each host's ironserve_* metrics
    return ctx
