"""systemd units and env files for rendered processes: what the deploy writes and the audit compares.

Pure text from spec objects, so `ironserve render --format systemd`, the sglang_service role and the audit
all see byte-identical files.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import shlex
from dataclasses import dataclass

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from .nvidia import docker_gpu_args, gpu_access
from .render import Process, Rendered
from .resources import files_dir
from .spec import RANK_GUARD_PORT_OFFSET, DockerRuntime, HostTuning, Recipe, UvRuntime

TEMPLATES = files_dir() / "templates"

ETC_DIR = "/etc/ironserve"
UNIT_DIR = "/etc/systemd/system"
VENV_ROOT = "/opt/ironserve/venvs"
# the recipe runtimes' venvs: runtime-<12 hex of the runtime> (venv_path); the router's own is
# sglang-router-<version>[-py<python>] (router_venv)
RUNTIME_VENV_PREFIX = "runtime-"
ROUTER_DIST = "sglang-router"
CACHE_ROOT = "/var/cache"  # systemd's CacheDirectory= root
JIT_CACHE_ROOT = f"{CACHE_ROOT}/ironserve/jit"
# files/bin/ironserve-exec on the host (and mounted read-only at the same path in containers): it appends
# --api-key from the environment to the engine's argv in-process, so the key never shows in `ps`.
KEY_LAUNCHER = "/usr/local/lib/ironserve/ironserve-exec"
API_KEY_ENV = "IRONSERVE_API_KEY"
API_KEY_FILE_ENV = "IRONSERVE_API_KEY_FILE"
KEY_ENV = (API_KEY_ENV, API_KEY_FILE_ENV)
# ironserve-exec's exit status when the key its unit declares is missing or empty (its NO_KEY): fails closed
NO_KEY_EXIT = 78
HF_TOKEN_ENV = "HF_TOKEN"
# files/bin/ironserve_rank_guard.py: restarts a multi-node group as a whole (see its docstring)
RANK_GUARD = "/usr/local/lib/ironserve/ironserve-rank-guard"
# files/bin/ironserve_weights_peer.py: the weights from the hub once, to the other hosts from peers, verified
WEIGHTS_PEER = "/usr/local/lib/ironserve/ironserve-weights-peer"
# uv-runtime engines and routers run as this dedicated system user (roles/sglang_service.py creates it), never as
# root; a docker unit runs the docker client, which needs root (the container's user is the image's)
ENGINE_USER = "ironserve-engine"  # not the operators' login user (the lab's ssh user is named ironserve)
# the groups that open each kind of accelerator's device nodes to a non-root user: NVIDIA's render nodes (/dev/dri)
# and video devices; Ascend's /dev/davinci*, /dev/devmm_svm and /dev/hisi_hdc (0660, the driver's own group)
DEVICE_GROUPS = {None: ("video", "render"), "cuda": ("video", "render"), "npu": ("HwHiAiUser",), "cpu": ()}
# the credential name under which systemd hands a host key file (the recipe's server.api_key_file, 0600 root) to
# the engine user ($CREDENTIALS_DIRECTORY/ironserve-api-key, read by ironserve-exec)
API_KEY_CREDENTIAL = "ironserve-api-key"
# files/bin/ironserve-backoff: restart backoff of engine and guard units on every systemd version
BACKOFF = "/usr/local/lib/ironserve/ironserve-backoff"
BACKOFF_DIR = "/run/ironserve/backoff"  # its records (the script's STATE_DIR)
BACKOFF_MAX_S = 600
RANK_GUARD_POLL_S = 5
# the guard's descriptors: a listener, a few workers' connections, its probes and systemctl's pipes
RANK_GUARD_NOFILE = 256
RANK_GUARD_FAILURES = 3
# The deploy's health gate (recipe.health_timeout_s) and its rollback decide about a new group first: the leader's
# guard gives up on a forming group only this much later, so its restart never races the gate or the rollback
# (the launch waits up to RANK_FOLLOW_S for the followers before gating; a restore takes seconds).
RANK_GUARD_GATE_MARGIN_S = 180
# how long the launch waits for a rank > 0's guard to follow rank 0's new invocation before restarting it itself
RANK_FOLLOW_S = 45
# where a follower's guard records which invocation of rank 0 its engine follows (files/bin/ironserve_rank_guard.py)
RANK_GROUP_STATE_DIR = "/run/ironserve/rank-groups"
# Staged configurations: the deploy's prepare stage writes the next unit, env and guard files here, under their
# live path (/etc/ironserve/staged/etc/systemd/system/U.service); only the launch stage makes them live.
STAGED_DIR = "/etc/ironserve/staged"
# env keys holding secrets: a rollback keeps their current values (a rotated secret never comes back)
SECRET_ENV = (API_KEY_ENV, API_KEY_FILE_ENV, HF_TOKEN_ENV)


@dataclass
class UnitFiles:
    unit_name: str  # e.g. sglang-glm5-...-server.service
    unit_text: str
    env_path: str
    env_text: str  # 0600: may hold secrets (HF_TOKEN, API key)


def sha256_text(text: str) -> str:
    """The content hash of a file ironserve writes: what the deploy compares and the audit checks."""
    return hashlib.sha256(text.encode()).hexdigest()


def sourcing_script(scripts: list[str]) -> str:
    """A bash -c script that sources the runtime's env scripts (CANN's set_env.sh, ...) and then execs its
    arguments: ``["/bin/bash", "-c", sourcing_script(s), NAME, *argv]``."""
    return "; ".join(f"source {shlex.quote(s)}" for s in scripts) + '; exec "$@"'


def venv_path(recipe: Recipe) -> str:
    """Versioned by what is installed in it (Python, pinned packages, indexes) and named by that alone: a new set of
    packages is a new venv beside the one the live unit runs, never an upgrade in place, and a unit's ExecStart names
    its venv, so a rollback of the unit is a rollback of its runtime too. Recipes with one runtime share one venv
    (the nine GLM-5.1 Atlas variants: switching between them installs and byte-compiles nothing again)."""
    return f"{VENV_ROOT}/{RUNTIME_VENV_PREFIX}{runtime_digest(recipe.runtime)[:12]}"


def runtime_digest(runtime) -> str:
    """sha256 of a runtime section: names its venv, and tells a uv lock made for other pins (ironserve/imagelock.py)."""
    return hashlib.sha256(json.dumps(runtime.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def router_venv(recipe: Recipe) -> str | None:
    """The router's own venv: sglang-router==engine.router and its few dependencies, never the engine's runtime. A
    router host then installs about 110 MB instead of the engine's stack (torch, SGLang: GBs), and a change of the
    engine's runtime (a weekly upgrade: a new runtime venv or image) leaves the router's unit, and the clients'
    connections through it, as they are. Beside a uv runtime it runs that runtime's Python (so the runtime's lock
    hash-checks it: roles/router_runtime.py), named sglang-router-<version>-py<python>; beside a docker runtime
    the OS's python3 (sglang-router's wheels are abi3), sglang-router-<version>. Shared by the recipes of that
    router version. None: the recipe has no router, or pins no router version (the router then runs in the
    engine's runtime)."""
    version = recipe.engine.router
    if not version or recipe.topology.router is None:
        return None
    runtime = recipe.runtime
    if isinstance(runtime, UvRuntime):
        return f"{VENV_ROOT}/{ROUTER_DIST}-{version}-py{runtime.python}"
    return f"{VENV_ROOT}/{ROUTER_DIST}-{version}"


def in_container(recipe: Recipe, proc: Process) -> bool:
    """Does this process run in the recipe's image (docker run), rather than from a venv on the host?"""
    return isinstance(recipe.runtime, DockerRuntime) and not (proc.role == "router" and router_venv(recipe))


def image_ref(recipe: Recipe) -> str:
    """The image the unit runs: the derived image when the recipe patches the pinned one (pulled by digest from the
    site's registry, or built on the host: ironserve/derived_image.py)."""
    runtime = recipe.runtime
    assert isinstance(runtime, DockerRuntime)
    if runtime.patches:
        return runtime.derived_ref or local_derived_ref(recipe.id)
    return runtime.pinned_ref


def local_derived_ref(recipe_id: str) -> str:
    """The derived image a host builds for itself (no registry named for derived images)."""
    return f"ironserve/{recipe_id}:derived"


def jit_dir(recipe: Recipe) -> str:
    """Per recipe and engine build: old cached kernels never meet a new engine (the seeds wipe /cache/jit by hand)."""
    runtime = recipe.runtime
    key = runtime.digest[7:19] if isinstance(runtime, DockerRuntime) and runtime.digest else recipe.engine.sglang
    return f"{JIT_CACHE_ROOT}/{recipe.id}/{key}"


def bytecode_dir(recipe: Recipe) -> str:
    """Where the engine's Python keeps its bytecode (PYTHONPYCACHEPREFIX): in its JIT directory, the engine user's
    own, since the venv is root's and installed without bytecode (roles/uv_env.py)."""
    return f"{jit_dir(recipe)}/bytecode"


def jit_cache_directory(recipe: Recipe) -> str:
    """CacheDirectory= of a unit running as ENGINE_USER: its JIT directory relative to /var/cache. systemd creates
    it (and its root-owned parents) and hands it to the user before the sandbox, so root never creates, chowns
    or follows anything inside a directory the engine's user can write."""
    path = jit_dir(recipe)
    assert path.startswith(CACHE_ROOT + "/") and " " not in path, path
    return path[len(CACHE_ROOT) + 1 :]


def _limit(value) -> str:
    return "infinity" if value in ("unlimited", -1, None) else str(value)


def with_key_launcher(proc: Process) -> list[str]:
    """The engine argv run through ironserve-exec (python3 -m M ... / sglang serve ...)."""
    launcher = proc.launcher
    if len(launcher) == 3 and launcher[:2] == ["python3", "-m"]:
        return ["python3", KEY_LAUNCHER, "-m", launcher[2], *proc.engine_args]
    if launcher and launcher[0] == "sglang":
        return ["python3", KEY_LAUNCHER, "-e", "sglang", *launcher[1:], *proc.engine_args]
    raise ValueError(f"cannot pass an API key to {launcher}: not python3 -m MODULE or sglang serve")


def exec_argv(recipe: Recipe, proc: Process, api_key: bool = False) -> list[str]:
    """The full ExecStart argv: the engine argv placed inside its runtime.

    api_key: the env file holds IRONSERVE_API_KEY(_FILE); run the engine through ironserve-exec, which adds
    --api-key in-process (SGLang only takes the key on argv, where every user could read it).
    """
    run, command = _runtime_argv(recipe, proc, api_key)
    return run + command


def container_command(recipe: Recipe, proc: Process, api_key: bool = False) -> list[str]:
    """What the container of a docker unit runs (the command after the image): what a running container is
    compared with."""
    return _runtime_argv(recipe, proc, api_key)[1]


def _runtime_argv(recipe: Recipe, proc: Process, api_key: bool) -> tuple[list[str], list[str]]:
    """(how the runtime starts it, the command it runs): (docker run ... IMAGE, command) or ([], argv)."""
    runtime = recipe.runtime
    argv = with_key_launcher(proc) if api_key else list(proc.argv)
    sourced = runtime.source_env
    if proc.role == "router" and router_venv(recipe):
        # the router needs neither the accelerator stack's env scripts nor the engine's image
        argv[0] = f"{router_venv(recipe)}/bin/{argv[0]}"
        return [], argv
    if isinstance(runtime, UvRuntime):
        bin_dir = f"{venv_path(recipe)}/bin"
        argv[0] = f"{bin_dir}/{argv[0]}"
        if sourced:
            argv = ["/bin/bash", "-c", sourcing_script(sourced), proc.unit, *argv]
        return [], argv
    assert isinstance(runtime, DockerRuntime)
    run = runtime.run
    docker = ["/usr/bin/docker", "run", "--rm", "--name", proc.unit, "--env-file", env_path(proc)]
    if run.gpus:
        # CDI devices survive a systemd daemon-reload; --gpus only with a toolkit older than CDI (ironserve.nvidia)
        docker += docker_gpu_args(run.gpus, proc.gpu_access or gpu_access(None))
    if run.ipc_host:
        docker.append("--ipc=host")
    if run.network_host:
        docker.append("--network=host")
    if run.privileged:
        docker.append("--privileged")
    if run.shm_size:
        docker += ["--shm-size", run.shm_size]
    for name, value in run.ulimits.items():
        docker += ["--ulimit", f"{name}={value}"]
    if run.cpuset_cpus:
        docker += ["--cpuset-cpus", run.cpuset_cpus]
    for volume in run.volumes:
        docker += ["-v", volume]
    weights = proc.model_path.rstrip("/") if proc.model_path and proc.model_path.startswith("/") else None
    if weights and not _mounted(weights, run.volumes):
        # the weights must be visible at the same path inside the container as on the host
        docker += ["-v", f"{weights}:{weights}:ro"]
    for device in run.devices:
        docker += ["--device", device]
    for env_file in run.env_files:
        docker += ["--env-file", env_file]
    docker += run.extra_options
    if api_key:
        docker += ["-v", f"{KEY_LAUNCHER}:{KEY_LAUNCHER}:ro"]
    if sourced:
        return (
            docker + ["--entrypoint", "/bin/bash", image_ref(recipe)],
            ["-c", sourcing_script(sourced), proc.unit, *argv],
        )
    if run.entrypoint and argv[: len(shlex.split(run.entrypoint))] == shlex.split(run.entrypoint):
        # the image's entrypoint replaced by the argv's first words, as the pasted line had it
        return docker + ["--entrypoint", run.entrypoint, image_ref(recipe)], argv[len(shlex.split(run.entrypoint)) :]
    return docker + [image_ref(recipe)], argv


HOME_DIRS = ("/home", "/root", "/run/user")


def protect_home(proc: Process) -> str:
    """ProtectHome= of an engine unit: ``yes`` (homes invisible), or ``read-only`` when its weights live in one."""
    weights = (proc.model_path or "").rstrip("/")
    return "read-only" if any(weights == d or weights.startswith(d + "/") for d in HOME_DIRS) else "yes"


def _mounted(path: str, volumes: list[str]) -> bool:
    """True when a host:container volume already shows `path` at the same place."""
    for volume in volumes:
        host_dir, _, rest = volume.partition(":")
        target = rest.split(":", 1)[0]
        if host_dir == target and (path == host_dir or path.startswith(host_dir.rstrip("/") + "/")):
            return True
    return False


def env_path(proc: Process) -> str:
    return f"{ETC_DIR}/{proc.unit}.env"


def _env_line(key: str, value: str) -> str:
    """KEY=VALUE, one line, in the subset systemd's EnvironmentFile and docker's --env-file read identically
    (spec.env_value_problem). The message names the key only: values may be secrets."""
    from .spec import ENV_NAME, env_value_problem

    why = "not a variable name" if not ENV_NAME.match(key) else env_value_problem(value)
    if why:
        raise ValueError(f"env {key}: {why}")
    return f"{key}={value}"


def read_env_text(text: str) -> dict[str, str]:
    """Read an env file written by env_text() the way both of its readers do (everything after the first '=',
    verbatim): for anything that needs the values, instead of `source`, which would run what is in them."""
    env = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, _, value = line.partition("=")
            env[key] = value
    return env


def env_text(proc: Process, secrets: dict[str, str] | None = None) -> str:
    lines = ["# managed by ironserve: do not edit (rerun the deploy)"]
    lines += [_env_line(k, v) for k, v in proc.env.items()]
    lines += [_env_line(k, v) for k, v in (secrets or {}).items()]
    return "\n".join(lines) + "\n"


@dataclass
class RankGuardFiles:
    unit_name: str  # <engine unit>-rank-guard.service
    unit_text: str
    config_path: str
    config_text: str
    secret_path: str  # the group's shared secret, 0600 (written by roles/secret_file.py, never rendered)


def runs_as_user(recipe: Recipe, proc: Process) -> bool:
    """Whether the unit of this process runs as ENGINE_USER: everything run from a venv on the host (a docker
    unit runs the docker client, which needs root)."""
    return not in_container(recipe, proc)


def device_groups(recipe: Recipe, proc: Process) -> tuple[str, ...]:
    """The supplementary groups the engine user needs for this process's accelerators (none for the router)."""
    if proc.role == "router" or not runs_as_user(recipe, proc):
        return ()
    device = recipe.group_server(recipe.topology.groups[proc.group]).device
    return DEVICE_GROUPS.get(device, DEVICE_GROUPS[None])


def deliberate(verb: str, unit: str) -> str:
    """The shell command of a start or restart asked for on purpose (a deploy, a rollback, a repair) of an engine or
    router unit: ``systemctl reset-failed`` first sets systemd's count of automatic restarts (NRestarts) back to 0,
    so the unit's restart backoff (files/bin/ironserve-backoff, which delays only automatic restarts) never
    delays it. systemd resets that count by itself on such a start, except for a unit caught waiting in
    ``auto-restart``: the one whose crash loop a deploy comes to fix."""
    assert verb in ("start", "restart"), verb
    name = shlex.quote(f"{unit}.service")
    return f"systemctl reset-failed {name} 2>/dev/null; systemctl {verb} {name}"


def rank_guard_unit(proc: Process) -> str:
    return f"{proc.unit}-rank-guard"


def rank_guard_port(proc: Process) -> int:
    return proc.dist_init_port + RANK_GUARD_PORT_OFFSET


def rank_group_secret_path(proc: Process) -> str:
    """The group's shared secret on each rank's host (0600 root): the guards sign their reports with it."""
    return f"{ETC_DIR}/{proc.unit}.rank-group.key"


def formation_timeout_s(recipe: Recipe) -> int:
    """How long the leader's guard waits for a new group: a cold start of the whole group may take the recipe's
    whole health budget, and the deploy's gate (the same budget) must decide before the guard does."""
    return recipe.health_timeout_s + RANK_GUARD_GATE_MARGIN_S


def staged_path(live: str) -> str:
    """Where the prepare stage writes the next version of a live file."""
    return f"{STAGED_DIR}{live}"


def following_path(unit: str) -> str:
    """A follower's record of the rank-0 invocation its engine joined (JSON {leader_invocation, engine_invocation})."""
    return f"{RANK_GROUP_STATE_DIR}/{unit}.following"


def guard_allowed(members: list[Process]) -> list[str]:
    """IPAddressAllow= of a rank's guard unit: every member's address and localhost (its engine's /health); empty
    when a member's address is a name, which IPAddressAllow= cannot take."""
    try:
        addresses = sorted({str(ipaddress.ip_address(m.address)) for m in members})
    except ValueError:
        return []
    return [*addresses, "localhost"]


def rank_guard_files(recipe: Recipe, proc: Process, members: list[Process]) -> RankGuardFiles:
    """The guard unit and its JSON config for one rank of a multi-node group (members: Rendered.rank_group())."""
    head = members[0]
    config = {
        "unit": proc.unit,
        "rank": proc.node_rank,
        "world": len(members),
        "guard_port": rank_guard_port(proc),
        # the leader listens on its cluster address only, and takes reports only from the members' addresses,
        # signed with the group's secret (files/bin/ironserve_rank_guard.py); followers send from their own
        "leader": head.address,
        "members": [m.address for m in members],
        "secret_file": rank_group_secret_path(proc),
        "health_url": proc.local_url("/health"),
        "poll_s": RANK_GUARD_POLL_S,
        "failure_threshold": RANK_GUARD_FAILURES,
        # a cold start of the whole group may take as long as the recipe's health budget
        "formation_timeout_s": formation_timeout_s(recipe),
        "backoff_base_s": 15,
        "backoff_max_s": 600,
        "backoff_window_s": 1800,
    }
    if proc.node_rank == 0:
        config["bind"] = head.address
    else:
        config["source"] = proc.address
    if proc.dist_init_addr and isinstance(proc.dist_init_port, int):
        # rank 0's rendezvous (torch's store, which every rank stays connected to while in the group): a follower
        # joining a new rank 0's group is never restarted out of it (files/bin/ironserve_rank_guard.py)
        config["rendezvous"] = f"{proc.dist_init_addr}:{proc.dist_init_port}"
    config_path = f"{ETC_DIR}/{proc.unit}.rank-group.json"
    text = (
        _jinja()
        .get_template("rank-guard.service.j2")
        .render(
            recipe=recipe,
            proc=proc,
            world=len(members),
            guard=RANK_GUARD,
            config_path=config_path,
            backoff=BACKOFF,
            unit=rank_guard_unit(proc),
            state_dir=RANK_GROUP_STATE_DIR,
            backoff_dir=BACKOFF_DIR,
            nofile=RANK_GUARD_NOFILE,
            allow=guard_allowed(members),
        )
    )
    return RankGuardFiles(
        f"{rank_guard_unit(proc)}.service",
        text,
        config_path,
        json.dumps(config, indent=2, sort_keys=True) + "\n",
        rank_group_secret_path(proc),
    )


def _one_line(value):
    """Every {{ value }} of a unit template: a control character would start a new directive line."""
    from .spec import control_problem

    why = control_problem(str(value))
    if why:
        raise ValueError(f"a unit file value has a {why}: {str(value)[:40]!r}")
    return value


@functools.cache  # one environment: it keeps each template compiled, not once per host and unit
def _jinja() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        undefined=StrictUndefined,
        finalize=_one_line,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["systemd_word"] = systemd_quote  # one argument of a command line (ExecStart=...)
    return env


def unit_files(recipe: Recipe, proc: Process, tuning: HostTuning, secrets: dict[str, str] | None = None) -> UnitFiles:
    # an API key among the secrets switches ExecStart to ironserve-exec (see exec_argv), which fails closed
    keyed = any(k in (secrets or {}) for k in KEY_ENV)
    argv = exec_argv(recipe, proc, api_key=keyed)
    text = (
        _jinja()
        .get_template("sglang.service.j2")
        .render(
            recipe=recipe,
            proc=proc,
            exec_start=" ".join(systemd_quote(a) for a in argv),
            env_file=env_path(proc),
            is_docker=in_container(recipe, proc),
            memlock=_limit(tuning.limits.memlock),
            stack=_limit(tuning.limits.stack),
            nofile=_limit(tuning.limits.nofile),
            unset=proc.env_unset,
            jit_dir=jit_dir(recipe),
            bytecode_dir=bytecode_dir(recipe),
            cache_directory=jit_cache_directory(recipe),
            protect_home=protect_home(proc),
            backoff=BACKOFF,
            # the backoff's wait counts against TimeoutStartSec: keep it well inside
            backoff_max=min(BACKOFF_MAX_S, recipe.health_timeout_s // 2),
            rank_guard=f"{rank_guard_unit(proc)}.service" if proc.in_rank_group else None,
            start_timeout=recipe.health_timeout_s,
            user=ENGINE_USER if runs_as_user(recipe, proc) else None,
            groups=device_groups(recipe, proc),
            key_file=(secrets or {}).get(API_KEY_FILE_ENV, "").replace("%", "%%"),
            key_credential=API_KEY_CREDENTIAL,
            keyed=keyed,
            no_key_status=NO_KEY_EXIT,
            low_port=isinstance(proc.port, int) and proc.port < 1024,
        )
    )
    return UnitFiles(f"{proc.unit}.service", text, env_path(proc), env_text(proc, secrets))


def systemd_quote(arg: str) -> str:
    # systemd splits ExecStart like a shell with its own rules: quote anything with spaces, quotes or specials,
    # and double every '%' and '$' so they are not expanded as specifiers or variables.
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and all(c.isalnum() or c in "-_./:=,+@" for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_bundle(rendered: Rendered, tuning: HostTuning) -> str:
    """All units of a render, for `ironserve render --format systemd`."""
    out = []
    for proc in rendered.processes:
        files = unit_files(rendered.recipe, proc, tuning)
        out.append(f"# ===== host {proc.host}: {UNIT_DIR}/{files.unit_name}\n{files.unit_text}")
        out.append(f"# ===== host {proc.host}: {files.env_path} (mode 0600)\n{files.env_text}")
        members = rendered.rank_group(proc)
        if members:
            guard = rank_guard_files(rendered.recipe, proc, members)
            out.append(f"# ===== host {proc.host}: {UNIT_DIR}/{guard.unit_name}\n{guard.unit_text}")
            out.append(f"# ===== host {proc.host}: {guard.config_path}\n{guard.config_text}")
    return "\n".join(out)
