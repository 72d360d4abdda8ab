"""Router unit: sglang_router in front of replicas or prefill/decode groups, on the host the render puts it.

The router Process (role "router": ``python3 -m sglang_router.launch_router --worker-urls ...`` or
``--pd-disaggregation --prefill URL PORT --decode URL``) gets the same machinery as the engines
(roles/sglang_service.install_units): 0600 env file, unit file from ironserve.units, daemon-reload, its argv
parsed by the sglang_router of the same runtime (``RouterArgs.add_cli_args``), enabled but not started
(roles/launch.py starts it last, after every engine answered /health).

With an API key for the engines (host data ``api_key_file``, or the recipe's ``server.api_key_file``), the
router's env file holds the same key and its unit runs through ironserve-exec: sglang-router sends it to the
workers it was started with and requires it from its own clients (``/health``, ``/readiness`` stay public).

Runtime: the router's own venv (roles/router_runtime.py, in the runtime stage: sglang-router==engine.router and its
dependencies, on the uv runtime's Python or the OS's python3 beside a docker runtime), whose python3 also parses the
router's argv. The Dynamo runtime image of the GB200 recipe has no sglang_router at all.

No host data of its own; the router's placement, port and policy come from the recipe (topology.router) and
the inventory (a host with ``ironserve_role=router`` for ``host_placement: dedicated``).
"""

from __future__ import annotations

from pyinfra.api import deploy

from roles.context import DeploymentContext
from roles.sglang_service import install_units, jit_cache_dirs


@deploy("SGLang router unit")
def apply(ctx: DeploymentContext) -> None:
    procs = [p for p in ctx.processes if p.role == "router"]
    if not procs:
        return
    # the helpers (parse probe, ironserve-exec) were installed by sglang_service.apply on every host
    jit_cache_dirs(ctx)
    install_units(ctx, procs)
