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

from roles import (
    ascend,
    container_runtime,
    cuda,
    gpu_clocks,
    imex,
    host_tuning,
    launch,
    model_weights,
    nccl,
    nvidia_driver,
    preflight,
    router,
    sglang_service,
    uv_env,
)
from roles.context import DeploymentContext, current
from ironserve.spec import DockerRuntime


def prepare(ctx: DeploymentContext) -> None:
    preflight.apply(ctx)
    host_tuning.apply(ctx)
    if ctx.vendor == "nvidia":
        nvidia_driver.apply(ctx)
        cuda.apply(ctx)
        gpu_clocks.apply(ctx)
        nccl.apply(ctx)
        imex.apply(ctx)  # multi-node NVLink only: IMEX serving before any engine unit exists
    elif ctx.vendor == "huawei":
        ascend.apply(ctx)
    if isinstance(ctx.recipe.runtime, DockerRuntime):
        container_runtime.apply(ctx)
    else:
        uv_env.apply(ctx)
    if not ctx.is_router_only:
        model_weights.apply(ctx)
    sglang_service.apply(ctx)
    router.apply(ctx)


def deploy_model(model: str) -> DeploymentContext:
    """Entry point for deploys/*.py: the model comes from the deploy, the hardware from the inventory."""
    ctx = current(model)
    prepare(ctx)
    launch.apply(ctx)
    return ctx
