"""SGLang service units: one systemd unit + 0600 env file per engine process of this host, staged and parsed.

Staged configurations: this role writes the NEXT configuration beside the live one (under /etc/ironserve/staged,
at its live path: ironserve.units.staged_path) and never touches what runs; the launch stage (roles/launch.py)
makes it live group by group, behind the launch gate and the health gate. So a crash or guard restart always
starts the live (last launched) configuration, and ``launch=false`` prepares and validates without changing
anything that runs. For every engine process of the render on this host (the router: roles/router.py, same
machinery), staged:

- /etc/ironserve/<unit>.env (0600 root:root, written by roles/secret_file.py: never shown, never readable on
  the way) from ironserve.units: the recipe's env plus the secret ``IRONSERVE_API_KEY`` (host data
  ``api_key_file``, a file on the controller; or ``IRONSERVE_API_KEY_FILE`` when the recipe's
  ``server.api_key_file`` names a file on the host, uv runtimes only). The hub token is not there: only the
  download step has it (roles/model_weights.py). With a key, ExecStart runs the engine through
  /usr/local/lib/ironserve/ironserve-exec, which appends --api-key in-process (never on a command line: ``ps``,
  /proc/PID/cmdline) and filters the key out of the engine's output (never in the journal);
- /etc/systemd/system/<unit>.service from ironserve.units.unit_files (and a rank's guard unit and config, and the
  group's shared secret: 0600, generated once on the controller, the same on every rank's host, with which the
  guards sign their reports); the JIT cache directory (ironserve.units.jit_dir, kept across restarts) is the
  unit's CacheDirectory= (systemd creates it for the engine's user);
- BEFORE enabling: the argv is parsed by the SGLang of this host's runtime (files/bin/ironserve-parse-check run
  by the venv's python3, or ``docker run --rm --entrypoint python3`` in the image). A rejected argv stops the
  deploy with the parser's message. The probe runs only when the unit or the runtime changed: a marker holding
  the sha256 of (ExecStart argv, runtime) is kept in /var/lib/ironserve/parse-ok/<unit>;
- the engine user (ironserve.units.ENGINE_USER): uv-runtime engines and routers run as this system user, never
  root, with the device groups of their accelerators (video/render for NVIDIA GPUs, the Ascend driver's group);
  it owns its JIT directory, while the env files and secrets stay 0600 root (systemd reads them; a host key file
  reaches the engine as a systemd credential). Docker units run the docker client as root, confined as far as
  the client allows;
- nothing is reloaded, enabled or started here (roles/launch.py does, once every host converged).

Host data (defaults in brackets): ``api_key_file`` [none], ``parse_check`` [true] (false skips the probe, e.g. for
an image without Python; not recommended), ``allow_open_bind`` [false] (a server or router bound to 0.0.0.0 or ::
without an API key is a deploy error unless this is true), ``secret_dir`` [~/.config/ironserve/secrets] (where
the controller keeps the secrets it generates: the rank groups' shared secrets).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from io import StringIO

from pyinfra import context, host
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.operations import files, server

from ironserve.render import ROUTER_LAUNCHER, Process
from ironserve.resources import files_dir
from ironserve.spec import DockerRuntime, Recipe, binds_every_address
from ironserve.units import (
    API_KEY_ENV,
    API_KEY_FILE_ENV,
    BACKOFF,
    DEVICE_GROUPS,
    ENGINE_USER,
    ETC_DIR,
    JIT_CACHE_ROOT,
    KEY_ENV,
    KEY_LAUNCHER,
    RANK_GUARD,
    STAGED_DIR,
    UNIT_DIR,
    container_command,
    device_groups,
    exec_argv,
    image_ref,
    in_container,
    jit_dir,
    rank_guard_files,
    router_venv,
    runs_as_user,
    staged_path,
    unit_files,
)
from roles.common import runtime_python_argv, with_pushed_images
from roles.context import DeploymentContext
from roles.desired import DesiredFile, text_file
from roles.secret_file import Secret, generated_secret, read_secret, secret_file

BIN_SRC = files_dir() / "bin"
LIB_DIR = "/usr/local/lib/ironserve"
PARSE_CHECK = f"{LIB_DIR}/ironserve-parse-check"
PARSE_OK_DIR = "/var/lib/ironserve/parse-ok"
CONTAINER_PROBE = "/ironserve-parse-check"
RENDEZVOUS = f"{LIB_DIR}/ironserve-rendezvous"  # run by roles/launch_preflight.py
# (file under files/bin, path on the host); the rank guard's source is a .py module (mutation testing imports it),
# installed under the same self-contained script name as before
HELPERS = (
    ("ironserve-exec", KEY_LAUNCHER),
    ("ironserve-parse-check", PARSE_CHECK),
    ("ironserve-rendezvous", RENDEZVOUS),
    ("ironserve_rank_guard.py", RANK_GUARD),
    ("ironserve-backoff", BACKOFF),
)


# --------------------------------------------------------------------------- pure helpers


# the parse probe's --kind for each launcher kind (ironserve.render.Process.launcher_kind)
PROBE_KINDS = {ROUTER_LAUNCHER: "router", "launch_server": "server", "serve": "serve"}


def parse_kind(proc: Process) -> str:
    """The probe kind of a process's launcher."""
    if proc.launcher_kind not in PROBE_KINDS:
        raise ValueError(f"{proc.unit}: unknown launcher {proc.launcher}")
    return PROBE_KINDS[proc.launcher_kind]


def parse_check_argv(recipe: Recipe, proc: Process) -> list[str]:
    """The probe invocation: SGLang's own parser, in the runtime the unit will run."""
    args = ["--kind", parse_kind(proc), "--", *proc.engine_args]
    if proc.role == "router" and router_venv(recipe):
        # the router's own runtime (the engine's image or venv lacks the pinned sglang-router): probed there
        return [f"{router_venv(recipe)}/bin/python3", PARSE_CHECK, *args]
    return runtime_python_argv(recipe, PARSE_CHECK, CONTAINER_PROBE, args, "parse-check", "none")


def parse_digest(exec_start: list[str], runtime_identity: str) -> str:
    """What a parse-ok marker vouches for: this ExecStart in this runtime."""
    return hashlib.sha256(json.dumps([exec_start, runtime_identity]).encode()).hexdigest()


def built_here(recipe: Recipe) -> Recipe:
    """The recipe naming its derived image as a host builds it: the parse marker's ExecStart. The runtime identity
    already holds what the image is made of (base digest, patches), and a marker written while the run pushes the
    image (named by a placeholder while planning) must match the next run's, which names it by its digest."""
    runtime = recipe.runtime
    if not isinstance(runtime, DockerRuntime) or not runtime.derived_ref:
        return recipe
    return recipe.model_copy(update={"runtime": runtime.with_derived(None)})


def runtime_identity(recipe: Recipe, pip_index_url: str | None = None) -> str:
    return json.dumps(
        [recipe.runtime.model_dump(mode="json"), recipe.engine.model_dump(mode="json"), pip_index_url], sort_keys=True
    )


def rank_group_secret_name(members: list[Process]) -> str:
    """The controller's name for a group's secret: its unit and rank 0's address (one secret per group)."""
    head = members[0]
    return f"rank-group-{head.unit}-{hashlib.sha256(head.address.encode()).hexdigest()[:12]}"


def marker_path(unit: str) -> str:
    return f"{PARSE_OK_DIR}/{unit}"


def process_secrets(ctx: DeploymentContext, proc: Process, read: bool = True) -> dict[str, str]:
    """Secrets for the env file of a process: the API key (never the hub token, which only the download step
    sees). ``read=False`` gives the same keys with placeholder values, for whoever needs to know which secrets
    exist but must not read them (the audit).

    The router gets the engines' API key (never the hub token): sglang-router uses its ``--api-key`` towards the
    workers it was started with (requests, health checks) and requires it from clients; keyed workers behind a
    keyless router would answer it 401."""

    out = {}
    if ctx.host.api_key_file:
        key = read_secret(ctx.host.api_key_file, f"{ctx.host_name}: api_key_file") if read else None
        out[API_KEY_ENV] = key.reveal() if key else "<secret>"
    else:
        groups = ctx.recipe.topology.groups
        # the router: keyed when any engine group is
        on_host = next(
            (
                ctx.recipe.group_server(g).api_key_file
                for g in (groups if proc.role == "router" else [groups[proc.group]])
                if ctx.recipe.group_server(g).api_key_file
            ),
            None,
        )
        if on_host:
            if isinstance(ctx.recipe.runtime, DockerRuntime):
                raise OperationError(
                    f"{ctx.host_name}: recipe {ctx.recipe.id}: server.api_key_file is a host file that "
                    "a container cannot read; give the key with host data api_key_file instead"
                )
            out[API_KEY_FILE_ENV] = on_host
    # no HF_TOKEN: only the download step needs the hub token (roles/model_weights.py), not a running engine
    return out


def refuse_open_bind(ctx: DeploymentContext, proc: Process, secrets: dict) -> None:
    """A server or router serving its API on every address (0.0.0.0, ::, 0, ::0, ...: ironserve.spec.binds_every_address)
    without an API key is a deploy error,
    raised while planning (before any host is touched), unless the inventory opts in with ``allow_open_bind``."""
    bind, port = proc.bind, proc.port
    if (
        not proc.serves_http
        or not binds_every_address(bind)
        or any(k in secrets for k in KEY_ENV)
        or ctx.host.allow_open_bind
    ):
        return
    raise OperationError(
        f"{ctx.host_name}: recipe {ctx.recipe.id}: the {proc.role} ({proc.unit}) would serve its API on {bind}:{port} "
        "to every network without an API key. Fix: give a key (host data api_key_file, a file on this machine, or "
        "the recipe's server.api_key_file), or bind 127.0.0.1, or, to serve openly on purpose, set host data "
        "allow_open_bind=true"
    )


# --------------------------------------------------------------------------- facts and operations


class ParseCheck(FactBase):
    """Run the parse probe: {rc, output} (output = the parser's message on failure)."""

    batched = False  # runs the parser (seconds): asked alone when an argv is new, never in a batched read

    def command(self, probe):
        return f"{probe} 2>&1; echo ironserve-parse-rc=$?"

    def process(self, output):
        lines = list(output)
        rc = 255
        if lines and lines[-1].startswith("ironserve-parse-rc="):
            rc = int(lines.pop().split("=", 1)[1])
        return {"rc": rc, "output": "\n".join(lines).strip()}


class MarkerDigest(FactBase):
    """First line of a marker file, None when absent."""

    @staticmethod
    def light_paths(path):
        """What its value is read from (roles/converged.py)."""
        return [path]

    def command(self, path):
        return f"head -n1 {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        return text or None


class EngineUserReads(FactBase):
    """Whether a user can read a model's config.json: readable, unreadable, absent (no such file yet) or no-user."""

    def command(self, user, path):
        who, config = shlex.quote(user), shlex.quote(f"{path.rstrip('/')}/config.json")
        return (
            f"if ! id -u {who} >/dev/null 2>&1; then echo no-user; elif ! test -e {config}; then echo absent; "
            f"elif runuser -u {who} -- test -r {config}; then echo readable; else echo unreadable; fi"
        )

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return lines[0] if lines else None


@operation()
def weights_readable(user: str, path: str):
    """The engine's user (not root) can read the weights: said before any unit starts, with the fix, instead of an
    engine failing its health gate on a permission error (weights in a private home directory, a 0700 download).
    Checked when the operation runs if the user or the weights come with this run."""
    state = host.get_fact(EngineUserReads, user=user, path=path)
    if state == "readable":
        host.noop(f"{user} reads the weights in {path}")
        return
    why = (
        f"{host.name}: the engines run as {user} (not root), which cannot read {path}/config.json. Fix: let it "
        f"read the weights (chmod -R o+rX {path}, or chgrp -R {user} {path} and chmod -R g+rX {path}; every "
        f"directory above it needs o+x or g+x too), or keep them outside private home directories"
    )
    if state == "unreadable":
        raise OperationError(why)
    config = shlex.quote(f"{path.rstrip('/')}/config.json")
    yield f"runuser -u {shlex.quote(user)} -- test -r {config} || {{ echo {shlex.quote(why)} >&2; exit 1; }}"


@operation()
@with_pushed_images
def staged_text(text: str, dest: str, mode: str):
    """A rendered file (unit, guard config) at its staged path, root-owned: files.put from memory. A unit naming an
    image this run pushes names it by its digest when this executes (roles/common.py ``with_pushed_images``)."""
    yield from files.put._inner(src=StringIO(text), dest=dest, mode=mode, user="root", group="root")


@operation()
@with_pushed_images
def argv_parses(unit: str, probe: list[str], digest: str):
    """The unit's argv is accepted by the SGLang parser of its runtime (checked once per argv + runtime).

    The probe itself runs when the operation executes (the runtime is installed by then); while planning the
    operation only shows that it will check. A rejected argv raises OperationError with the parser's message,
    which stops the deploy before anything is enabled or started.
    """
    marker = marker_path(unit)
    if host.get_fact(MarkerDigest, path=marker) == digest:
        host.noop(f"{unit}: argv already parsed by this runtime")
        return
    command = shlex.join(probe)
    if context.state.is_executing:
        result = host.get_fact(ParseCheck, probe=command) or {"rc": 255, "output": "the probe printed nothing"}
        if result["rc"] != 0:
            raise OperationError(
                f"{host.name}: {unit}: the SGLang in this runtime rejects the command line "
                f"(probe exit {result['rc']}):\n{result['output']}"
            )
        yield f"mkdir -p {PARSE_OK_DIR} && echo {shlex.quote(digest)} > {shlex.quote(marker)}"
        return
    yield f"{command} && mkdir -p {PARSE_OK_DIR} && echo {shlex.quote(digest)} > {shlex.quote(marker)}"


# --------------------------------------------------------------------------- shared unit machinery


def install_scripts(ctx: DeploymentContext) -> None:
    files.directory(name="ironserve helper directory", path=LIB_DIR, mode="755")
    for name, dest in HELPERS:
        op = files.put(
            name=f"{dest.rsplit('/', 1)[-1]} helper",
            src=str(BIN_SRC / name),
            dest=dest,
            mode="755",
            user="root",
            group="root",
        )
        if dest == RANK_GUARD:
            ctx.changes.rank_guard_script = op  # a new guard script restarts the running guards (launch)


def install_units(ctx: DeploymentContext, procs: list[Process]) -> None:
    """Staged env file, unit file (and a rank's guard unit and config), parse check, for each process (used by
    router.py too). Nothing here touches what runs: the files go to ironserve.units.staged_path (the live
    path under /etc/ironserve/staged); the launch stage (roles/launch.py) makes them live, reloads systemd and
    enables the unit, group by group, behind the gate. With launch=false they stay staged, validated.

    Each step is one call site over all processes, so pyinfra runs it on every host before the next step.
    """
    if not procs:
        return
    recipe = ctx.recipe
    built = []
    for proc in procs:
        secrets = process_secrets(ctx, proc)
        refuse_open_bind(ctx, proc, secrets)
        built.append((proc, unit_files(recipe, proc, ctx.tuning, secrets), secrets))
    # 0700: the staged env files hold secrets, and nothing else reads the staging area
    files.directory(name="staged configurations", path=STAGED_DIR, mode="700", user="root", group="root")
    for sub in (ETC_DIR, UNIT_DIR):
        files.directory(name=f"staged {sub}", path=staged_path(sub), mode="700", user="root", group="root")
    for proc, uf, secrets in built:
        for live, text, mode in live_files(ctx, proc, uf):
            if mode == "600":
                # a secret (the env file with the API key, the group's secret): never shown, never readable
                op = secret_file(name=f"{live} (staged, 0600)", path=staged_path(live), secret=Secret(text))
            else:
                op = staged_text(name=f"{live} (staged)", text=text, dest=staged_path(live), mode=mode)
            ctx.changes.record_unit_change(proc.unit, op)
        if in_container(recipe, proc):
            api_key = any(k in secrets for k in KEY_ENV)
            ctx.changes.record_container(
                proc.unit, image_ref(recipe), container_command(recipe, proc, api_key=api_key), [*proc.env, *secrets]
            )
    if ctx.host.parse_check:
        identity = runtime_identity(recipe, ctx.host.pip_index_url)
        for proc, _unit_files, secrets in built:
            api_key = any(k in secrets for k in KEY_ENV)
            digest = parse_digest(exec_argv(built_here(recipe), proc, api_key=api_key), identity)
            argv_parses(
                name=f"{proc.unit}: argv parsed by the installed SGLang",
                unit=proc.unit,
                probe=parse_check_argv(recipe, proc),
                digest=digest,
            )


def live_files(ctx: DeploymentContext, proc: Process, uf=None) -> list[tuple[str, str, str]]:
    """(live path, text, mode) of every file a process is started from: its unit and env file, and for a rank of
    a multi-node group its guard's unit and config. Staged by the prepare stage, made live by the launch."""
    uf = uf or unit_files(ctx.recipe, proc, ctx.tuning, process_secrets(ctx, proc))
    out = [(uf.env_path, uf.env_text, "600"), (f"{UNIT_DIR}/{uf.unit_name}", uf.unit_text, "644")]
    members = ctx.rendered.rank_group(proc)
    if members:
        gf = rank_guard_files(ctx.recipe, proc, members)
        out += [
            (gf.config_path, gf.config_text, "644"),
            (f"{UNIT_DIR}/{gf.unit_name}", gf.unit_text, "644"),
            (gf.secret_path, group_secret(ctx, members).reveal(), "600"),
        ]
    return out


def group_secret(ctx: DeploymentContext, members: list[Process]):
    """The rank group's shared secret: generated once on the controller (roles/secret_file.py), the same for
    every rank's host and every run."""
    return generated_secret(rank_group_secret_name(members), ctx.host.secret_dir)


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    """The helper scripts and the rank guards' units and configs, for `ironserve audit` (the engine units
    themselves are checked by ironserve.audit.checks, with their env files): live with launch, else staged."""
    out = [text_file(dest, (BIN_SRC / name).read_text(), 0o755, "service") for name, dest in HELPERS]
    for proc in ctx.processes:
        members = ctx.rendered.rank_group(proc)
        if members:
            gf = rank_guard_files(ctx.recipe, proc, members)
            for path, text in ((gf.config_path, gf.config_text), (f"{UNIT_DIR}/{gf.unit_name}", gf.unit_text)):
                out.append(text_file(path if ctx.launch else staged_path(path), text, gate="service"))
    return out


@deploy("SGLang service units")
def apply(ctx: DeploymentContext) -> None:
    procs = [p for p in ctx.processes if p.role != "router"]
    install_scripts(ctx)
    if not procs:
        return
    jit_cache_dirs(ctx)
    install_units(ctx, procs)


def jit_cache_dirs(ctx: DeploymentContext) -> None:
    """The engine user and the JIT cache root. A uv runtime's units run as ironserve.units.ENGINE_USER, whose
    JIT directory (keyed by engine build: ironserve.units.jit_dir) systemd creates and hands over at each start
    (the unit's CacheDirectory=; it changes the owner of what an earlier root-run engine left there): the deploy
    never creates, chowns or follows anything inside a directory the engine's user can write. A docker unit's
    client runs as root."""
    files.directory(name="JIT cache root", path=JIT_CACHE_ROOT, mode="755")
    if not any(runs_as_user(ctx.recipe, p) for p in ctx.processes):
        files.directory(name="JIT cache of this engine build", path=jit_dir(ctx.recipe), mode="755")
        return
    engine_user(ctx)
    for path in sorted(
        {p.model_path for p in ctx.processes if p.role != "router" and (p.model_path or "").startswith("/")}
    ):
        weights_readable(name=f"{ENGINE_USER} reads the weights in {path}", user=ENGINE_USER, path=path)


def engine_user(ctx: DeploymentContext) -> None:
    """The dedicated system user of uv-runtime engines and routers: no login, no home of its own (HOME is its JIT
    directory), and the groups its units add (SupplementaryGroups=: the accelerators' device groups) present."""
    server.group(name=f"{ENGINE_USER} group", group=ENGINE_USER, system=True)
    server.user(
        name=f"{ENGINE_USER} user (runs the engines)",
        user=ENGINE_USER,
        group=ENGINE_USER,
        system=True,
        home=JIT_CACHE_ROOT,
        shell="/usr/sbin/nologin",
        ensure_home=False,
        comment="ironserve engines",
    )
    needed = sorted({g for proc in ctx.processes for g in device_groups(ctx.recipe, proc)})
    for name in needed:
        if name in DEVICE_GROUPS["npu"]:
            continue  # the Ascend driver's own group: roles/ascend.py creates it with its user
        server.group(name=f"{name} group (opens the accelerators to {ENGINE_USER})", group=name, system=True)
