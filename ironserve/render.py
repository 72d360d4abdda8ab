"""Render: recipe + placement -> the processes that run on each host, with their argv and env.

This is the one place where a recipe becomes command lines. Deploy, audit, lint and the CLI all call it,
so what is checked is exactly what runs.

A process is structured: its bind address and port, its group's dist-init address, its rank and group identity
(with the host of the group's rank 0), the devices it drives on its node, its model path and its health URL are
fields, and its argv is built from them. Later stages read the fields; nothing downstream parses argv back.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field

from .hostdata import DEFAULTS
from .inventory import InventoryHost
from .nvidia import gpu_access
from .problems import Problem, SpecError
from .spec import (
    DIST_INIT_DERIVED,
    ENV_NAME,
    RANK_GUARD_PORT_OFFSET,
    SERVER_FLAGS,
    SPECULATIVE_FLAGS,
    UNSET_VALUE,
    DockerRuntime,
    Group,
    Recipe,
    ServerOptions,
    binds_every_address,
    devices_per_node,
    is_set,
)

LAUNCH_SERVER = ["python3", "-m", "sglang.launch_server"]
SERVE = ["sglang", "serve"]
LAUNCH_ROUTER = ["python3", "-m", "sglang_router.launch_router"]
ROUTER_LAUNCH_SERVER = ["python3", "-m", "sglang_router.launch_server"]
LAUNCHERS = {"launch_server": LAUNCH_SERVER, "serve": SERVE, "router_launch_server": ROUTER_LAUNCH_SERVER}
ROUTER_LAUNCHER = "launch_router"  # the router's launcher kind (LAUNCH_ROUTER)
# the variables that pin a multi-node group's socket traffic (GLOO's, and NCCL's or HCCL's) to one interface
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")


# addresses (besides every spelling of the unspecified one) a process that binds them is reached at, from its own
# host, on the loopback
_LOOPBACK_BINDS = (None, "127.0.0.1", "localhost")


@dataclass
class Process:
    host: str  # inventory name
    address: str  # the host's cluster address
    role: str  # server | prefill | decode | router
    node_rank: int
    argv: list[str]  # built from the fields below
    env: dict[str, str]
    group: int = 0  # index of its group in the recipe's topology (-1: the router)
    instance: int = 0  # which copy of its group
    nnodes: int = 1  # nodes of its group instance
    port: int | None = None  # the HTTP port (every rank has it; only rank 0 of a group answers requests)
    serves_http: bool = True  # only rank 0 of a multi-node group answers HTTP
    unit: str = ""  # the systemd unit (the same on every rank of a group)
    source_env: list[str] = field(default_factory=list)
    env_unset: list[str] = field(default_factory=list)
    gpu_access: str = ""  # docker on NVIDIA: "cdi" or "dev-char" (ironserve.nvidia.gpu_access), else ""
    launcher: list[str] = field(default_factory=list)  # argv's launcher (python3 -m sglang.launch_server, ...)
    launcher_kind: str = ""  # which one: a key of LAUNCHERS (the recipe's engine.launcher) or ROUTER_LAUNCHER
    bind: str | None = None  # the address it binds (--host); None: the engine's default
    dist_init_addr: str | None = None  # multi-node groups: rank 0's address and port (--dist-init-addr)
    dist_init_port: int | None = None
    head: str | None = None  # multi-node groups: the inventory host of rank 0
    devices: int = 0  # accelerators it drives on its node
    model_path: str | None = None  # --model-path
    metrics_port: int | None = None  # where Prometheus scrapes its /metrics (bound like the process); None: off
    # the socket-interface variables of its env (SOCKET_IFNAME_VARS) and the interface(s) each names: the host's
    # `nic` for a rank of a multi-node group, or the recipe's own value
    socket_interfaces: dict[str, str] = field(default_factory=dict)
    restart_s: int = DEFAULTS.engine_restart_s  # its unit's RestartSec=: its host's engine_restart_s

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def health_path(self) -> str:
        # sglang-router answers /health before any worker registered; /readiness waits for a healthy worker
        return "/readiness" if self.role == "router" else "/health"

    @property
    def health_url(self) -> str | None:
        """Where its own host reaches its health path (the launch's gate, the audit, status); None for ranks > 0
        of a multi-node group: only rank 0 answers requests."""
        return self.local_url(self.health_path) if self.serves_http else None

    @property
    def group_key(self) -> str:
        """Its group instance: the ranks sharing a key form one multi-node engine."""
        return f"{self.role}-g{self.group}-i{self.instance}"

    @property
    def in_rank_group(self) -> bool:
        return self.role != "router" and self.nnodes > 1

    @property
    def engine_args(self) -> list[str]:
        """argv without its launcher."""
        return self.argv[len(self.launcher) :]

    def local_url(self, path: str) -> str:
        """Where the host itself reaches the process's HTTP port: 127.0.0.1 unless it binds one specific address.
        Every rank has the port (ranks > 0 of a multi-node group answer /health there once they joined)."""
        bind = "127.0.0.1" if self.bind in _LOOPBACK_BINDS or binds_every_address(self.bind) else self.bind
        if ":" in bind:
            bind = f"[{bind}]"
        return f"http://{bind}:{self.port or 30000}{path}"


@dataclass
class Rendered:
    recipe: Recipe
    processes: list[Process]
    # multi-node group instances: group key -> its ranks in node-rank order
    groups: dict[str, list[Process]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"recipe": self.recipe.id, "processes": [p.as_dict() for p in self.processes]}

    def for_host(self, host: str) -> list[Process]:
        return [p for p in self.processes if p.host == host]

    def rank_group(self, proc: Process) -> list[Process]:
        """The processes of proc's multi-node group instance, by node rank ([] for single-node processes)."""
        return list(self.groups.get(proc.group_key, [])) if proc.in_rank_group else []

    @property
    def endpoint(self) -> str | None:
        routers = [p for p in self.processes if p.role == "router"]
        head = routers[0] if routers else next((p for p in self.processes if p.serves_http), None)
        if head is None:
            return None
        return f"http://{head.address}:{head.port}"


def server_flags(server: ServerOptions, **values) -> list[str]:
    """Typed server options as full-name flags, in the model's field order, then extra_args; ``values``
    replace fields' values (the process's own bind address)."""
    argv: list[str] = []
    data = {**server.model_dump(), **values}
    for name, flag in SERVER_FLAGS.items():
        value = data[name]
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *[str(v) for v in value]]
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(", ", ": "))]
        else:
            argv += [flag, _number(value)]
    if server.speculative:
        for key, flag in SPECULATIVE_FLAGS.items():
            value = getattr(server.speculative, key)
            if value is not None:
                argv += [flag, str(value)]
    return argv + list(server.extra_args)


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1:
        return str(int(value))
    return str(value)


class _Placeholders(dict):
    def __init__(self, values: dict, where: str):
        super().__init__(values)
        self.where = where

    def __missing__(self, key):
        raise SpecError(
            [
                Problem(
                    self.where,
                    "",
                    f"unknown placeholder {{{key}}}",
                    "use one of {node_address}, {group_head}, {deployment_head}, {nic}, {model_path}",
                )
            ]
        )


_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def _fill(text: str, values: _Placeholders) -> str:
    # Only {identifier} is a placeholder, so JSON values such as '{"num_threads": 8}' pass untouched.
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def model_path_on(recipe: Recipe, host: InventoryHost) -> str:
    """Where the weights are on a host: its model_path, else <model_root>/<name>, else the recipe's own path."""
    if host.host_data.model_path:
        return host.host_data.model_path
    source = recipe.model.path or recipe.model.hub_id or ""
    if host.host_data.model_root and source:
        return f"{host.host_data.model_root.rstrip('/')}/{source.rstrip('/').rsplit('/', 1)[-1]}"
    return source


@dataclass
class _Slot:
    host: InventoryHost
    group_index: int
    instance: int
    node_rank: int


def _placeholder_hosts(recipe: Recipe) -> list[InventoryHost]:
    hosts = [InventoryHost(f"node{i}", placeholder=True) for i in range(recipe.topology.node_count)]
    router = recipe.topology.router
    if router and router.host_placement == "dedicated":
        hosts.append(InventoryHost("router0", {"ironserve_role": "router"}, placeholder=True))
    return hosts


def _assign(recipe: Recipe, hosts: list[InventoryHost], where: str) -> tuple[list[_Slot], InventoryHost | None]:
    workers = [h for h in hosts if not h.is_router]
    routers = [h for h in hosts if h.is_router]
    topo = recipe.topology
    need = topo.node_count
    if topo.kind == "single":
        # A single-node recipe on several hosts: every host runs its own independent copy.
        slots = [_Slot(h, 0, i, 0) for i, h in enumerate(workers)]
    else:
        if len(workers) != need:
            raise SpecError(
                [
                    Problem(
                        where,
                        "hosts",
                        f"recipe {recipe.id} needs {need} worker hosts ({topo.kind}), the inventory has {len(workers)}",
                        f"list exactly {need} worker hosts (mark a router-only host with ironserve_role='router')",
                    )
                ]
            )
        slots, it = [], iter(workers)
        for gi, group in enumerate(topo.groups):
            for inst in range(group.instances):
                for rank in range(group.nodes):
                    slots.append(_Slot(next(it), gi, inst, rank))
    if not slots:
        raise SpecError([Problem(where, "hosts", "no worker hosts", "add at least one host without ironserve_role")])
    router_host = None
    if topo.router:
        if topo.router.host_placement == "dedicated":
            if not routers:
                raise SpecError(
                    [
                        Problem(
                            where,
                            "hosts",
                            "the recipe's router needs a dedicated host",
                            "add a host with ironserve_role='router'",
                        )
                    ]
                )
            router_host = routers[0]
        else:
            router_host = routers[0] if routers else slots[0].host
    return slots, router_host


def _distinct_addresses(slots: list[_Slot], recipe: Recipe, where: str) -> None:
    """Two ranks of one multi-node group instance on one address would be one machine twice: refused."""
    seen: dict[tuple[int, int, str], str] = {}
    problems = []
    for slot in slots:
        key = (slot.group_index, slot.instance, slot.host.address)
        if key in seen and seen[key] != slot.host.name:
            problems.append(
                Problem(
                    where,
                    f"{slot.host.name}.ssh_hostname",
                    f"{slot.host.name} and {seen[key]} are "
                    f"ranks of one {recipe.id} group on the same address {slot.host.address}",
                    "give every rank of a multi-node group its own host (ssh_hostname)",
                )
            )
        seen.setdefault(key, slot.host.name)
    if problems:
        raise SpecError(problems)


def _on_every_address(bind: str | None) -> bool:
    """None: a port the engine binds itself (dist-init and its derived ports), on every address."""
    return bind is None or binds_every_address(bind)


def _listeners(recipe: Recipe, proc: Process) -> list[tuple[str | None, int, str]]:
    """(bind address, port, what) for every port a process listens on."""
    # an unset port (<PORT>, lint's unset-value) clashes with nothing yet
    out = (
        [(proc.bind, proc.port or 30000, f"{proc.unit} (node rank {proc.node_rank}) port")] if is_set(proc.port) else []
    )
    if proc.role == "router":
        return out + [(proc.bind, recipe.topology.router.prometheus_port, f"{proc.unit} Prometheus port")]
    group = recipe.topology.groups[proc.group]
    if group.bootstrap_port is not None:
        out.append((proc.bind, group.bootstrap_port + proc.instance, f"{proc.unit} bootstrap port"))
    if proc.in_rank_group and proc.node_rank == 0 and proc.dist_init_port and is_set(proc.dist_init_port):
        d, dp = proc.dist_init_port, recipe.group_server(group).dp_size or 1
        out += [
            (None, port, f"{proc.unit} dist-init port + {port - d}") for port in range(d, d + DIST_INIT_DERIVED + dp)
        ]
        out.append((proc.address, d + RANK_GUARD_PORT_OFFSET, f"{proc.unit} rank guard"))
    return out


def _port_clashes(recipe: Recipe, processes: list[Process], where: str) -> None:
    """Two listeners of the deployment on one host and port (the same bind address, or either on all of them)."""
    by_address: dict[str, list[tuple[str | None, int, str, Process]]] = {}
    problems = []
    for proc in processes:
        mine = by_address.setdefault(proc.address, [])
        for bind, port, what in _listeners(recipe, proc):
            for other_bind, other_port, other_what, _other in mine:
                if port == other_port and (
                    bind == other_bind or _on_every_address(bind) or _on_every_address(other_bind)
                ):
                    problems.append(
                        Problem(
                            where,
                            f"{proc.host}",
                            f"{what} and {other_what} both listen on {proc.address}:{port}",
                            "give one of them another port (recipe "
                            "server.port, topology.router.port, dist_init_port, bootstrap_port) or "
                            "the router a host of its own (ironserve_role='router')",
                        )
                    )
                    break
            mine.append((bind, port, what, proc))
    if problems:
        raise SpecError(problems[:1] + [p for p in problems[1:] if p.message != problems[0].message])


def _unit_name(recipe: Recipe, role: str, group_index: int, instance: int, groups: list[Group]) -> str:
    same_role = [i for i, g in enumerate(groups) if g.role == role]
    suffix = role if len(same_role) == 1 else f"{role}{same_role.index(group_index)}"
    if groups[group_index].instances > 1:
        suffix += f"-{instance}"
    return f"sglang-{recipe.id}-{suffix}"


def render(recipe: Recipe, hosts: list[InventoryHost] | None = None, where: str = "inventory") -> Rendered:
    hosts = hosts if hosts is not None else _placeholder_hosts(recipe)
    slots, router_host = _assign(recipe, hosts, where)
    _distinct_addresses(slots, recipe, where)
    heads = {(slot.group_index, slot.instance): slot.host for slot in slots if slot.node_rank == 0}
    deployment_head = slots[0].host.address
    processes = [
        _slot_process(recipe, slot, heads[(slot.group_index, slot.instance)], deployment_head, where) for slot in slots
    ]
    if recipe.topology.router and router_host is not None:
        processes.append(_router_process(recipe, processes, router_host))
    _port_clashes(recipe, processes, where)
    rank_groups: dict[str, list[Process]] = {}
    for proc in processes:
        if proc.in_rank_group:
            rank_groups.setdefault(proc.group_key, []).append(proc)
    return Rendered(recipe, processes, {k: sorted(v, key=lambda p: p.node_rank) for k, v in rank_groups.items()})


def _topology_flags(
    recipe: Recipe, group: Group, node_rank: int, instance: int, dist_init: tuple[str, int] | None
) -> list[str]:
    """Where the engine stands in the deployment: dist-init, nodes and rank, its disaggregation role."""
    argv: list[str] = []
    if dist_init:
        argv += ["--dist-init-addr", _host_port(*dist_init)]
    if group.nodes > 1 or (recipe.topology.kind != "single" and group.explicit_single_node_rank):
        argv += ["--nnodes", str(group.nodes), "--node-rank", str(node_rank)]
    if group.role in ("prefill", "decode"):
        argv += ["--disaggregation-mode", group.role]
    if group.role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(group.bootstrap_port + instance)]
    return argv


def _slot_process(recipe: Recipe, slot, head: InventoryHost, deployment_head: str, where: str) -> Process:
    """The engine process one slot (a host's place in a group instance) runs, its argv built from its fields."""
    groups = recipe.topology.groups
    group = groups[slot.group_index]
    server = recipe.group_server(group)
    launcher = LAUNCHERS[recipe.engine.launcher]
    host_model_path = model_path_on(recipe, slot.host)
    values = _Placeholders(
        {
            "node_address": slot.host.address,
            "group_head": head.address,
            "deployment_head": deployment_head,
            "nic": slot.host.nic or NIC_FROM_INVENTORY,
            "model_path": host_model_path,
        },
        f"{where}: {slot.host.name}",
    )
    model_path = _fill(server.model_path or host_model_path, values)
    bind = _fill(server.host, values) if server.host else None
    dist_init = (head.address, group.dist_init_port) if group.nodes > 1 else None
    argv = list(launcher) + ["--model-path", model_path]
    argv += [_fill(a, values) for a in server_flags(server, host=bind)]
    argv += _topology_flags(recipe, group, slot.node_rank, slot.instance, dist_init)
    env = {k: _fill(v, values) for k, v in recipe.group_env(group).items()}
    if group.nodes > 1:
        env.update(_socket_ifname_env(recipe, slot.host, env, where))
    runtime = recipe.runtime
    return Process(
        host=slot.host.name,
        address=slot.host.address,
        role=group.role,
        node_rank=slot.node_rank,
        argv=argv,
        env=env,
        group=slot.group_index,
        instance=slot.instance,
        nnodes=group.nodes,
        port=server.port or 30000,
        serves_http=slot.node_rank == 0,
        unit=_unit_name(recipe, group.role, slot.group_index, slot.instance, groups),
        source_env=list(runtime.source_env),
        env_unset=list(recipe.env_unset),
        launcher=list(launcher),
        launcher_kind=recipe.engine.launcher,
        bind=bind,
        dist_init_addr=dist_init[0] if dist_init else None,
        dist_init_port=dist_init[1] if dist_init else None,
        head=head.name if group.nodes > 1 else None,
        devices=devices_per_node(server, group.nodes, recipe.engine.launcher),
        model_path=model_path,
        gpu_access=_gpu_access(runtime, slot.host),
        metrics_port=(server.port or 30000) if server.enable_metrics and slot.node_rank == 0 else None,
        socket_interfaces={name: env[name] for name in SOCKET_IFNAME_VARS if env.get(name)},
        restart_s=slot.host.host_data.engine_restart_s,
    )


def _host_port(address: str, port: int) -> str:
    return f"{address}:{port}"


NIC_FROM_INVENTORY = "<nic>"


def _gpu_access(runtime, host: InventoryHost) -> str:
    """How a docker unit on this host asks for its GPUs: decided by the host's pinned container toolkit."""
    if not isinstance(runtime, DockerRuntime) or not runtime.run.gpus:
        return ""
    return gpu_access(host.host_data.nvidia_container_toolkit_version)


def _socket_ifname_env(recipe: Recipe, host: InventoryHost, env: dict[str, str], where: str) -> dict[str, str]:
    """Pin the ranks' socket traffic to the host's cluster NIC, unless the recipe already does.

    A multi-node group whose ranks pick different NICs never meets and hangs without an error; the inventory's
    `nic` host data names the right one. Without an inventory (placeholder hosts) nothing is added.
    """
    if host.nic is None:
        if not host.placeholder:
            raise SpecError(
                [
                    Problem(
                        where,
                        f"{host.name}.nic",
                        f"{host.name} is in a multi-node group of {recipe.id} but has no 'nic' host data",
                        "set nic='<interface of the cluster network>' so GLOO/NCCL/HCCL use it",
                    )
                ]
            )
        return {}
    names = ["GLOO_SOCKET_IFNAME"]
    names.append(
        "HCCL_SOCKET_IFNAME"
        if recipe.server.device == "npu" or any(g.server.device == "npu" for g in recipe.topology.groups)
        else "NCCL_SOCKET_IFNAME"
    )
    return {n: host.nic for n in names if n not in env}


def _router_process(recipe: Recipe, workers: list[Process], host: InventoryHost) -> Process:
    router = recipe.topology.router
    heads = [p for p in workers if p.serves_http]
    argv = list(LAUNCH_ROUTER)
    if recipe.topology.kind == "pd-disaggregation":
        argv.append("--pd-disaggregation")
        for p in heads:
            if p.role == "prefill":
                bootstrap = recipe.topology.groups[p.group].bootstrap_port + p.instance
                argv += ["--prefill", f"http://{p.address}:{p.port}", str(bootstrap)]
        for p in heads:
            if p.role == "decode":
                argv += ["--decode", f"http://{p.address}:{p.port}"]
    else:
        argv += ["--worker-urls", *[f"http://{p.address}:{p.port}" for p in heads]]
    argv += [
        "--host",
        router.host,
        "--port",
        str(router.port),
        "--policy",
        router.policy,
        # sglang-router always serves its metrics (default 0.0.0.0:29000): bound like the router itself
        "--prometheus-host",
        router.host,
        "--prometheus-port",
        str(router.prometheus_port),
        *router.extra_args,
    ]
    return Process(
        host=host.name,
        address=host.address,
        role="router",
        node_rank=0,
        argv=argv,
        env=dict(router.env),
        group=-1,
        port=router.port,
        unit=f"sglang-{recipe.id}-router",
        launcher=list(LAUNCH_ROUTER),
        launcher_kind=ROUTER_LAUNCHER,
        bind=router.host,
        metrics_port=router.prometheus_port,
        restart_s=host.host_data.engine_restart_s,
    )


def unset_values(rendered: Rendered) -> list[tuple[str, str]]:
    """(unit, word) for each flag value or env value that is still an import's `<NAME>` (lint's unset-value): a
    deploy stops on them before any host is touched ({nic}'s stand-in `<nic>` is the inventory's to fill)."""
    out = []
    for proc in rendered.processes:
        words = [*proc.argv, *(f"{k}={v}" for k, v in proc.env.items() if v != NIC_FROM_INVENTORY)]
        out += [(proc.unit, word) for word in words if UNSET_VALUE.search(word)]
    return list(dict.fromkeys(out))  # once per unit, whatever the number of its ranks


def require_set(rendered: Rendered) -> None:
    """Units and deploys need every value: SpecError naming each one import left unset (lint lists them too)."""
    problems = [
        Problem(
            f"recipe {rendered.recipe.id}",
            unit,
            f"{word} was a shell variable when the command was imported and has no value yet",
            "set it in the recipe (ironserve lint lists each)",
        )
        for unit, word in unset_values(rendered)
    ]
    if problems:
        raise SpecError(problems)


def shell_script(rendered: Rendered) -> str:
    """One bash block per process, the way the seeds write them: env, sourced scripts, command."""
    out = [f"# recipe {rendered.recipe.id}: {len(rendered.processes)} process(es)"]
    for p in rendered.processes:
        out.append(f"\n# --- host {p.host} ({p.address}) role={p.role} node_rank={p.node_rank} unit={p.unit}")
        for name in p.env_unset:
            out.append(f"unset {shlex.quote(name)}")
        for script in p.source_env:
            out.append(f"source {shlex.quote(script)}")
        for key, value in p.env.items():
            if not ENV_NAME.match(key):  # validated at the edge (spec); a name is never quoted into shape
                raise ValueError(f"env name {key!r} is not a variable name")
            out.append(f"export {key}={shlex.quote(value)}")
        out.append(" \\\n  ".join(_pairs(p.argv)))
    return "\n".join(out) + "\n"


def _pairs(argv: list[str]) -> list[str]:
    """Group argv as 'flag value...' lines for readable shell output."""
    lines: list[str] = []
    for arg in argv:
        if arg.startswith("--") or not lines:
            lines.append(shlex.quote(arg))
        elif lines[0] in ("python3", "sglang") and len(lines) == 1:
            lines[0] += " " + shlex.quote(arg)
        else:
            lines[-1] += " " + shlex.quote(arg)
    return lines
