"""Launch preflight: what must hold on and between the hosts of a deployment before any engine starts.

The seeds' worst failures are multi-node launches that hang for an hour: ranks that never meet because
GLOO/NCCL/HCCL_SOCKET_IFNAME names the wrong NIC, a dist-init port nobody can reach. Run by the launch stage
(roles/launch.py) after every host converged and before rank 0 starts; with ``launch=false`` only the checks
that need no peer run (NIC, memlock, ACS), so a prepared cluster is validated too. /dev/shm is not checked
here: roles/host_tuning.py sets its size (live and in fstab) in the same run.

Checks, each failing with host, what, found and the fix:

- ``nic_reaches_rank0`` (multi-node groups): every socket-ifname variable of the rank's env names an interface
  of this host with an IPv4 address, and the route to rank 0's dist-init address leaves by that interface
  (rank 0: the address is on it). Found from ``ip -o -4 addr`` and ``ip -o route get`` facts;
- ``group_rendezvous`` (multi-node groups, launching only): every rank runs files/bin/ironserve-rendezvous with
  the python of the engine's own runtime, at the same time (pyinfra runs an operation on all hosts in
  parallel): a torch.distributed gloo group through rank 0's dist-init address and port, with the env's
  GLOO_SOCKET_IFNAME, and one all_reduce. It proves the group can form before an engine spends an hour loading
  weights. Skipped when a rank of the group is running already (its port is taken; the group met on this path);
  a NIC problem found above is then still an error. Not proven: SGLang's own ports next to the dist-init port
  (dist-init + 1 .. + 6 + dp, rank 0's ZMQ endpoints) and the rank guards' port (dist-init + 100); a firewall
  between the hosts must open that range too;
- ``memlock_unlimited``: the unit's effective LimitMEMLOCK (drop-ins included) is infinity when the tuning
  asks for unlimited (docker units: the recipe's --ulimit memlock=-1, a catalogue check). Judged on the live
  units: with launch=false here, with a launch right after it made the staged units live and systemd reloaded
  them (roles/launch.py; when the operation runs if a unit file became live in this run);
- ``pcie_acs_disabled`` (NVIDIA on PCIe, more than one GPU per rank): no PCI bridge has ACS source validation
  on (``lspci -vvv`` ACSCtl SrcValid+), which routes GPU peer-to-peer traffic through the root complex
  (slow, or hangs with the IOMMU on).
- ``iommu_passthrough`` (same hosts): no IOMMU group translates DMA (``/sys/kernel/iommu_groups/*/type`` DMA or
  DMA-FQ): RTX PRO 6000 peer-to-peer hangs with the IOMMU in translated mode (NVIDIA/nccl#1999, #2079); the
  fix names the kernel parameter (``iommu=pt``, on arm64 ``iommu.passthrough=1``).

Host data (defaults in brackets): ``rendezvous`` [true], ``rendezvous_timeout_s`` [60],
``pcie_acs_check`` [true], ``iommu_check`` [true].
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, OperationError, deploy, operation

from ironserve.render import Process, Rendered
from ironserve.spec import DockerRuntime, Recipe
from roles.common import UnitState, in_run, refuse, runtime_python_argv, with_pushed_images
from roles.context import DeploymentContext
from roles.host_state import run_unread

LIB_DIR = "/usr/local/lib/ironserve"
RENDEZVOUS = f"{LIB_DIR}/ironserve-rendezvous"  # installed by roles/sglang_service.py
CONTAINER_RENDEZVOUS = "/ironserve-rendezvous"
MARK = "IRONSERVE-RENDEZVOUS "

# --------------------------------------------------------------------------- pure helpers


@dataclass
class RankGroup:
    """One multi-node engine instance: the ranks that must meet at rank 0's dist-init address."""

    key: str
    addr: str
    port: int
    world: int
    members: list[Process] = field(default_factory=list)


def rank_groups(rendered: Rendered) -> dict[str, RankGroup]:
    """Multi-node groups of a render, by key (single-node processes have nobody to meet)."""
    return {
        key: RankGroup(key, members[0].dist_init_addr, members[0].dist_init_port, members[0].nnodes, list(members))
        for key, members in rendered.groups.items()
    }


def nic_problems(
    host_name: str, rank: int, env: dict[str, str], where: tuple[str, int], path: dict | None
) -> list[str]:
    """What is wrong with a rank's socket interfaces (``env``: the NIC variables of its env), one line each
    with the fix; [] when all is right. ``path``: the NetworkPath fact towards rank 0's address ``where``."""
    path = path or {}
    addrs: dict[str, list[str]] = path.get("addrs") or {}
    target = path.get("target")
    route_dev = path.get("route_dev")
    head = f"{where[0]}:{where[1]}"
    have = ", ".join(f"{dev} {' '.join(a)}" for dev, a in sorted(addrs.items())) or "none"
    problems = []
    for var, ifname in env.items():
        names = [n for n in ifname.lstrip("^=").split(",") if n]
        if ifname.startswith("^"):
            continue  # an exclusion list: nothing to verify by name
        found = [
            n for n in names if any(dev == n or (not ifname.startswith("=") and dev.startswith(n)) for dev in addrs)
        ]
        if not found:
            problems.append(
                f"{host_name} (rank {rank}): {var}={ifname} names no interface with an IPv4 "
                f"address on this host (interfaces: {have}); fix: set host data nic= the interface "
                f"on rank 0's network" + (f" ({route_dev}, the route to {head})" if route_dev else "")
            )
            continue
        if target is None:
            problems.append(
                f"{host_name} (rank {rank}): rank 0's address {where[0]} "
                f"does not resolve on this host; fix: use an address or a name in /etc/hosts"
            )
        elif route_dev and route_dev != "lo" and not any(route_dev == n or route_dev.startswith(n) for n in found):
            problems.append(
                f"{host_name} (rank {rank}): {var}={ifname}, but the route to rank 0 "
                f"({head}) leaves by {route_dev}; the ranks would not meet; fix: set host data "
                f"nic={route_dev} (or route rank 0's network over {ifname})"
            )
        elif route_dev == "lo" and not any(target in addrs.get(n, []) for n in found):
            holder = next((dev for dev, a in sorted(addrs.items()) if target in a), None)
            problems.append(
                f"{host_name} (rank {rank}): {var}={ifname}, but this host's rank-0 address {target} "
                f"is not on {ifname} (interfaces: {have}); the other ranks would not reach it; fix: set "
                f"host data nic={holder or 'the interface that holds ' + target}"
            )
    return problems


def rendezvous_argv(recipe: Recipe, proc: Process, group: RankGroup, timeout_s: int) -> list[str]:
    """The rendezvous in the engine's own runtime (its torch, its python), with the rank's socket env."""
    args = [
        "--addr",
        group.addr,
        "--port",
        str(group.port),
        "--rank",
        str(proc.node_rank),
        "--world",
        str(group.world),
        "--timeout",
        str(timeout_s),
    ]
    return runtime_python_argv(
        recipe, RENDEZVOUS, CONTAINER_RENDEZVOUS, args, "rendezvous", "host", proc.socket_interfaces
    )


def parse_rendezvous(stdout_lines: list[str]) -> dict:
    for line in reversed(stdout_lines):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    return {"ok": False, "error": "the rendezvous printed no result: " + " | ".join(stdout_lines[-5:])}


# --------------------------------------------------------------------------- facts


class NetworkPath(FactBase):
    """IPv4 addresses per interface and the route towards ``target`` (a name or an address).

    {addrs: {ifname: [ip, ...]}, target: resolved ip or None, route_dev, route_src}
    """

    def command(self, target):
        quoted = shlex.quote(target)
        return (
            'ip -o -4 addr show 2>/dev/null | awk \'{split($4, a, "/"); print "addr", $2, a[1]}\'; '
            f"t=$(getent ahostsv4 {quoted} 2>/dev/null | awk 'NR==1 {{print $1}}'); "
            '[ -n "$t" ] && echo "target $t" && ip -o route get "$t" 2>/dev/null; true'
        )

    def process(self, output):
        state = {"addrs": {}, "target": None, "route_dev": None, "route_src": None}
        for line in output:
            words = line.split()
            if words[:1] == ["addr"] and len(words) == 3:
                state["addrs"].setdefault(words[1], []).append(words[2])
            elif words[:1] == ["target"] and len(words) == 2:
                state["target"] = words[1]
            elif "dev" in words:
                state["route_dev"] = words[words.index("dev") + 1]
                if "src" in words:
                    state["route_src"] = words[words.index("src") + 1]
        return state


class UnitMemlock(FactBase):
    """The effective LimitMEMLOCK of a unit as systemd will apply it (drop-ins included); "not-found" when systemd
    has no such unit (nothing live yet: a staged configuration is judged once the launch made it live)."""

    def command(self, unit):
        return f"systemctl show -p LoadState -p LimitMEMLOCK {shlex.quote(unit)}.service 2>/dev/null || true"

    def process(self, output):
        values = dict(line.strip().partition("=")[::2] for line in output if "=" in line)
        if values.get("LoadState") == "not-found":
            return "not-found"
        return values.get("LimitMEMLOCK") or None


class PcieAcs(FactBase):
    """PCI functions with ACS source validation on: [{bdf, acsctl}]; None without lspci (pciutils)."""

    def requires_command(self):
        return "lspci"

    def command(self):
        return "lspci -vvv 2>/dev/null | awk '/^[0-9a-f]/ {bdf = $1} /ACSCtl:/ {print bdf, $0}' || true"

    def process(self, output):
        found = []
        for line in output:
            bdf, _, rest = line.strip().partition(" ")
            if "SrcValid+" in rest:
                found.append({"bdf": bdf, "acsctl": rest.strip()})
        return found


class IommuGroups(FactBase):
    """``{types: {type: count}, cmdline}``: the DMA domain types of the IOMMU groups and the kernel command line
    (no groups: the IOMMU is off)."""

    def command(self):
        return (
            'for f in /sys/kernel/iommu_groups/*/type; do [ -r "$f" ] && echo "type $(cat "$f")"; done; '
            'echo "cmdline $(cat /proc/cmdline 2>/dev/null)"'
        )

    def process(self, output):
        types: dict[str, int] = {}
        cmdline = ""
        for line in output:
            kind, _, value = line.strip().partition(" ")
            if kind == "type" and value:
                types[value] = types.get(value, 0) + 1
            elif kind == "cmdline":
                cmdline = value
        return {"types": types, "cmdline": cmdline}


def iommu_problem(host_name: str, state: dict | None, arch: str) -> str | None:
    """Translated DMA groups (DMA, DMA-FQ) break GPU P2P; identity (passthrough) or no IOMMU is fine."""
    types = (state or {}).get("types") or {}
    translated = sum(n for t, n in types.items() if t.startswith("DMA"))
    if not translated:
        return None
    param = "iommu.passthrough=1" if arch == "aarch64" else "iommu=pt"
    return (
        f"{host_name}: the IOMMU translates DMA for {translated} device group(s) "
        f"({', '.join(f'{t}: {n}' for t, n in sorted(types.items()))}): GPU peer-to-peer over PCIe hangs or "
        f"crawls (NVIDIA/nccl#1999). Fix: add {param} to GRUB_CMDLINE_LINUX in /etc/default/grub, run "
        f"update-grub and reboot (or turn the IOMMU off in the BIOS); iommu_check=false skips this check"
    )


# --------------------------------------------------------------------------- operations


@operation()
def iommu_passthrough(arch: str = "x86_64"):
    problem = iommu_problem(host.name, host.get_fact(IommuGroups), arch)
    refuse([problem] if problem else [], "IOMMU off or in passthrough: GPU peer-to-peer is direct")
    return
    yield  # unreachable: an operation is a generator


@operation()
def nic_reaches_rank0(rank: int, env: dict[str, str], addr: str, port: int):
    """The rank's socket interfaces (``env``) exist on this host and lead to rank 0 at ``addr``."""
    refuse(
        nic_problems(host.name, rank, env, (addr, port), host.get_fact(NetworkPath, target=addr)),
        f"rank {rank}: {', '.join(f'{k}={v}' for k, v in env.items())} leads to rank 0 ({addr}:{port})",
        "the ranks of this group cannot meet:",
    )
    return
    yield  # unreachable: an operation is a generator


@operation()
@with_pushed_images
def group_rendezvous(
    key: str, rank: int, unit: str, command: str, timeout_s: int, problems: list[str], ranks_running: dict | None = None
):
    """All ranks of the group form a gloo group through rank 0's dist-init address (see the module doc).

    ``ranks_running`` (the deployment context's, shared by every host of the run): {group key: {rank: running}},
    filled while planning and read while executing (every host's plan is complete by then): a rank that is
    running keeps the whole group from a rendezvous on its port."""
    state = host.get_fact(UnitState, unit=unit, paths=[])
    running = (state or {}).get("active") in ("active", "activating", "reloading")
    ranks_running = {} if ranks_running is None else ranks_running
    ranks_running.setdefault(key, {})[rank] = running
    if running:
        if problems:
            raise OperationError("the ranks of this group cannot meet:\n  " + "\n  ".join(problems))
        host.noop(f"{key}: rank {rank} is running; its group met on this path already")
        return
    yield FunctionCommand(_rendezvous, (key, rank, command, timeout_s, problems, ranks_running), {})


def _rendezvous(
    state, host, key: str, rank: int, command: str, timeout_s: int, problems: list[str], ranks_running: dict
) -> bool:
    running = sorted(r for r, up in ranks_running.get(key, {}).items() if up)
    if running:
        host.log(f"{key}: rank(s) {running} already running: no rendezvous (the launch restarts the group)")
        return True
    host.log(f"{key}: rank {rank} joining the gloo rendezvous (up to {timeout_s}s)")
    _, out = host.run_shell_command(f"timeout {int(timeout_s) + 30} {command} 2>&1")
    result = parse_rendezvous(out.stdout_lines)
    if result.get("ok"):
        host.log_styled(
            f"{key}: rank {rank} met its group of {result.get('world')} via "
            f"{result.get('ifname') or 'the default interface'} in {result.get('seconds')}s",
            fg="green",
        )
        for line in problems:
            host.log_styled(f"warning: {line}", fg="yellow")
        return True
    lines = [
        f"{key}: rank {rank} on {host.name} could not form its group through "
        f"{result.get('addr', '?')}:{result.get('port', '?')} with GLOO_SOCKET_IFNAME="
        f"{result.get('ifname') or '(unset)'}: {result.get('error')}"
    ]
    lines += problems or [
        f"fix: check that {result.get('addr')}:{result.get('port')} is open between the hosts and "
        f"that host data nic names the interface on rank 0's network on every host"
    ]
    host.log_styled("\n".join(lines), fg="red")
    return False


def _memlock_problem(host_name: str, unit: str, found: str | None) -> str | None:
    if found in ("infinity", "not-found"):
        return None
    return (
        f"{host_name}: {unit} would run with LimitMEMLOCK={found or 'unknown'}, the engine needs unlimited "
        f"locked memory (pinned buffers for NCCL/HCCL); fix: remove the drop-in that lowers it "
        f"(systemctl cat {unit}) and rerun the deploy"
    )


@operation()
def memlock_unlimited(unit: str, changing=False):
    """The unit's effective LimitMEMLOCK is infinity. ``changing`` (bool or callable): the unit file changes in
    this run, so systemd's current view is stale until the daemon-reload: judge when the operation runs."""
    if bool(changing() if callable(changing) else changing):
        yield FunctionCommand(_memlock_now, (unit,), {})
        return
    problem = _memlock_problem(host.name, unit, host.get_fact(UnitMemlock, unit=unit))
    refuse([problem] if problem else [], f"{unit}: LimitMEMLOCK=infinity")


def _memlock_now(state, host, unit: str) -> bool:
    _, out = run_unread(host, UnitMemlock().command(unit))
    problem = _memlock_problem(host.name, unit, UnitMemlock().process(out.stdout_lines))
    if problem:
        host.log_styled(problem, fg="red")
        return False
    return True


@operation()
def pcie_acs_disabled():
    found = host.get_fact(PcieAcs)
    if found is None:
        host.noop("lspci not installed (pciutils): PCIe ACS not checked")
        return
    if found:
        bdfs = ", ".join(d["bdf"] for d in found)
        raise OperationError(
            f"{host.name}: PCIe ACS source validation is on for {bdfs}: GPU peer-to-peer traffic is redirected "
            f"through the root complex (slow, or NCCL hangs with the IOMMU on); fix: disable ACS in the BIOS, or at "
            f"every boot `setpci -s BDF ECAP_ACS+0x6.w=0000` for each of them; if peer access still fails add "
            f"--enable-p2p-check (seed 002); pcie_acs_check=false skips this check"
        )
    host.noop("PCIe ACS off on every bridge")
    return
    yield  # unreachable: an operation is a generator


# --------------------------------------------------------------------------- deploy


def memlock_checks(ctx: DeploymentContext, changing: dict) -> None:
    """Each engine unit's effective LimitMEMLOCK, as systemd loaded it (``changing``: unit -> a flag saying the
    launch made a new unit file live in this run, so the check is judged when it runs)."""
    if ctx.tuning.limits.memlock != "unlimited" or isinstance(ctx.recipe.runtime, DockerRuntime):
        return  # docker units: the container's limit is the recipe's --ulimit memlock=-1 (a catalogue check)
    for proc in (p for p in ctx.processes if p.role != "router"):
        memlock_unlimited(
            name=f"{proc.unit}: unlimited locked memory", unit=proc.unit, changing=changing.get(proc.unit, False)
        )


def peer_to_peer_checks(ctx: DeploymentContext, engines: list[Process]) -> None:
    """NVIDIA GPUs on PCIe that a rank drives several of talk peer to peer: no ACS redirect, no translating IOMMU."""
    p2p = (
        ctx.vendor == "nvidia"
        and ctx.profile.accelerator.interconnect == "pcie"
        and any(p.devices > 1 for p in engines)
    )
    if p2p and ctx.host.pcie_acs_check:
        pcie_acs_disabled(name="PCIe ACS off (GPU peer-to-peer)")
    if p2p and ctx.host.iommu_check:
        iommu_passthrough(name="IOMMU passthrough or off (GPU peer-to-peer)", arch=ctx.profile.cpu_arch)


def rank_group_checks(ctx: DeploymentContext, mine: list[tuple[RankGroup, Process]]) -> None:
    """Each rank's NIC leads to rank 0 where no rendezvous can run (prepared only; or a member outside this run:
    --limit, a rebuilt host, whose running engine's dist-init port is not to be disturbed); else the gloo
    rendezvous of the whole group, which its NIC problems explain when it fails."""
    rendezvous = ctx.launch and ctx.host.rendezvous
    timeout_s = ctx.host.rendezvous_timeout_s
    for group, proc in mine:
        if not (rendezvous and all(in_run(m.host) for m in group.members)):
            nic_reaches_rank0(
                name=f"{group.key}: rank {proc.node_rank} NIC leads to rank 0",
                rank=proc.node_rank,
                env=proc.socket_interfaces,
                addr=group.addr,
                port=group.port,
            )
    for group, proc in mine:
        if not (rendezvous and all(in_run(m.host) for m in group.members)):
            continue
        # NIC problems do not stop the rendezvous: it runs anyway (the proof), they explain its failure
        problems = nic_problems(
            host.name,
            proc.node_rank,
            proc.socket_interfaces,
            (group.addr, group.port),
            host.get_fact(NetworkPath, target=group.addr),
        )
        command = shlex.join(rendezvous_argv(ctx.recipe, proc, group, timeout_s))
        group_rendezvous(
            name=f"{group.key}: gloo rendezvous of {group.world} ranks at {group.addr}:{group.port}",
            key=group.key,
            rank=proc.node_rank,
            unit=proc.unit,
            command=command,
            timeout_s=timeout_s,
            problems=problems,
            ranks_running=ctx.ranks_running,
        )


@deploy("Launch preflight")
def apply(ctx: DeploymentContext) -> None:
    engines = [p for p in ctx.processes if p.role != "router"]
    if not engines:
        return
    if not ctx.launch:
        # the live units (a launch checks its new ones once it made them live: memlock_checks)
        memlock_checks(ctx, {})
    peer_to_peer_checks(ctx, engines)
    groups = rank_groups(ctx.rendered)
    rank_group_checks(ctx, [(groups[p.group_key], p) for p in engines if p.group_key in groups])
