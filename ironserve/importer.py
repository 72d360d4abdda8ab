"""Import: pasted launch commands (or a launch script) into recipe YAML.

Reads what ``ironserve.commandline`` parsed: env, wrappers, ``docker run`` options, the engine command, router
launchers. The recipe renders back to the same engine flags (full names), env, container options and router argv.
Known flags become typed fields, the rest stay, in order, in server.extra_args; multi-node, PD and router flags
become topology. What import cannot know or must not keep (shell variables without a value, secrets) comes back as
findings next to the recipe, never as a recipe that cannot render.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from . import flag_releases
from .commandline import (
    SECRET_FLAGS,
    SECRET_NAME,
    SECRET_VALUE,
    SHELL_VAR,
    Command,
    CommandError,
    DockerOptions,
    parse_command,
    parse_script,
    shell_vars,
    var_name,
)
from .findings import Finding, Severity
from .flags import canonical, split_flags
from .lint import SEED_ERA, model_family
from .spec import (
    DERIVED_FLAGS,
    SERVER_FLAGS,
    SPECULATIVE_FLAGS,
    UNSET_VALUE,
    ModelSource,
    Recipe,
    ServerOptions,
    Speculative,
    binds_every_address,
)

# render's field -> flag tables, read backwards: SGLang flag -> the typed field it fills
_SPECULATIVE_FIELDS = {flag: name for name, flag in SPECULATIVE_FLAGS.items()}
_TYPED_FIELDS = {flag: (name, ServerOptions.model_fields[name].annotation) for name, flag in SERVER_FLAGS.items()}
_TOPOLOGY_FLAGS = {
    "--dist-init-addr",
    "--nnodes",
    "--node-rank",
    "--disaggregation-mode",
    "--disaggregation-bootstrap-port",
}
# SGLang's and sglang-router's defaults, made explicit where ironserve always emits the value
DEFAULT_BOOTSTRAP_PORT = 8998
ROUTER_DEFAULTS = {"host": "127.0.0.1", "port": 30000, "policy": "cache_aware"}
API_KEY_FILE = "/etc/ironserve/{id}.api_key"
# Ascend NPU hosts run SGLang's NPU image (CANN, torch-npu, sgl-kernel-npu inside), never the CUDA stack PyPI's
# sglang resolves to; the container gets the NPU devices and the host's driver as SGLang's Ascend docs run it.
ASCEND_IMAGE = "lmsysorg/sglang:main-cann{toolkit}-a3"
ASCEND_DEVICES = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
ASCEND_VOLUMES = [
    "/usr/local/sbin:/usr/local/sbin",
    "/usr/local/Ascend/driver:/usr/local/Ascend/driver",
    "/usr/local/Ascend/firmware:/usr/local/Ascend/firmware",
    "/etc/ascend_install.info:/etc/ascend_install.info",
]
# The image each hardware's seeds run, used when a command is imported without --engine or docker run.
ERA_IMAGE = {"sm120": "lmsysorg/sglang:dev-cu13", "sm100": "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.1.1-cuda13"}
DEFAULT_ENGINE = "0.5.23"  # newest PyPI release ironserve knows; used when no parser is cached to choose one


@dataclass
class Imported:
    data: dict
    findings: list[Finding] = field(default_factory=list)  # what to set, what was moved or added, and why
    hosts: list[str | None] = field(default_factory=list)  # worker addresses in render order, where the commands say
    engine_note: str = ""


def _note(rule: str, message: str, fix: str = "", where: str = "", severity=Severity.warning) -> Finding:
    return Finding(rule, severity, message, fix, where)


# --------------------------------------------------------------------------- values


class _Values:
    """Shell variables and secrets in values: turned into recipe inputs, each with a finding."""

    def __init__(self, recipe_id: str):
        self.findings: list[Finding] = []
        self.recipe_id = recipe_id
        self.api_key = False

    def unset(self, text: str, where: str, placeholder: str | None = None) -> str:
        """A value with $var / ${var} / <VAR> in it: the inventory placeholder when one fits, else <var>."""
        names = shell_vars(text)
        if not names:
            return text
        if placeholder:
            self.findings.append(
                _note(
                    "import-placeholder",
                    f"{where} was {text!r}: rendered per host as {placeholder}",
                    "",
                    where,
                    Severity.info,
                )
            )
            return SHELL_VAR.sub(placeholder, text)
        out = SHELL_VAR.sub(lambda m: f"<{var_name(m)}>", text)
        self.findings.append(
            _note(
                "import-set-value",
                f"{where} is the shell variable {', '.join(names)} (no value in the command); imported as {out!r}",
                f"set this value in the recipe ({where})",
                where,
            )
        )
        return out


def _placeholder_for(flag_or_env: str) -> str | None:
    if flag_or_env in ("--host",):
        return "{node_address}"
    if flag_or_env.endswith("SOCKET_IFNAME"):
        return "{nic}"
    if flag_or_env in ("--model-path",):
        return "{model_path}"
    return None


def _is_secret(name: str, value: str) -> bool:
    return bool(SECRET_NAME.search(name) and value) or bool(SECRET_VALUE.match(value))


def _env(env: dict[str, str], values: _Values, where: str) -> dict[str, str]:
    out = {}
    for key, value in env.items():
        if _is_secret(key, value) and not SHELL_VAR.fullmatch(value or ""):
            _secret_env(key, values, where)
            continue
        if SHELL_VAR.search(value) and SECRET_NAME.search(key):
            _secret_env(key, values, where)
            continue
        out[key] = values.unset(value, f"env {key}", _placeholder_for(key))
    return out


def _secret_env(key: str, values: _Values, where: str) -> None:
    if key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        fix = "put the token in a 0600 file on the controller and set host data hf_token_file to it"
    else:
        fix = f"keep {key} in a 0600 file (never in a recipe): see docs on secrets"
    values.findings.append(
        _note("import-secret", f"{where}: {key} holds a secret; it is not written into the recipe", fix, f"env {key}")
    )


# --------------------------------------------------------------------------- one engine command


def _convert(annotation, values: list[str]):
    text = str(annotation)
    if "bool" in text:
        return True if not values else None
    if "list[int]" in text:
        return [int(v) for v in values] if values and all(re.fullmatch(r"-?\d+", v) for v in values) else None
    if len(values) != 1:
        return None
    value = values[0]
    if "dict" in text:
        try:
            return json.loads(value)
        except ValueError:
            return None
    if "int" in text and "float" not in text:
        return int(value) if re.fullmatch(r"-?\d+", value) else ValueError
    if "float" in text:
        try:
            return float(value)
        except ValueError:
            return ValueError
    return value


@dataclass
class _Server:
    """One engine command, as recipe pieces."""

    server: dict[str, Any]
    model_path: str
    nnodes: int = 1
    node_rank: int = 0
    dist_init: str | None = None
    mode: str | None = None
    bootstrap_port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    explicit_nnodes: bool = False
    address: str | None = None  # the node's own address, when --host named it


def _int(flag: str, values: list[str], where: str) -> int:
    if len(values) != 1 or not re.fullmatch(r"\d+", values[0]):
        raise CommandError(f"{flag} {' '.join(values)!s}: expected one whole number", f"write e.g. {flag} 2", where)
    return int(values[0])


def _server_of(command: Command, values: _Values, where: str) -> _Server:
    """One engine command's flags, step by step: topology flags, secrets, the node's address, typed fields,
    speculative decoding, the rest in order (extra_args)."""
    out = _Server({}, "")
    speculative: dict[str, Any] = {}
    spec_words: list[str] = []
    extra: list[str] = []
    for name, vals in split_flags(command.flags):
        flag = _flag_name(name, vals, where)
        if flag == "--model-path":
            out.model_path = vals[0] if vals else ""
        elif flag in SECRET_FLAGS:
            _secret_flag(flag, values)
        elif flag in _TOPOLOGY_FLAGS:
            _topology_flag(out, flag, vals, where)
        elif flag == "--host" and vals and _is_node_address(vals[0]):
            _node_address(out, vals[0], values)
        else:
            vals = [values.unset(v, flag, _placeholder_for(flag)) for v in vals]
            if flag in _SPECULATIVE_FIELDS:
                key = _SPECULATIVE_FIELDS[flag]
                speculative[key] = int(vals[0]) if vals and vals[0].isdigit() else (vals[0] if vals else None)
                spec_words += [flag, *vals]
            elif not (flag in _TYPED_FIELDS and _typed_value(out.server, flag, vals, _TYPED_FIELDS[flag], where)):
                extra += [flag, *vals]
    if speculative:
        try:
            Speculative.model_validate(speculative)
            out.server["speculative"] = speculative
        except ValidationError:
            extra += spec_words  # an algorithm the recipe schema does not type: kept as written
    if extra:
        out.server["extra_args"] = extra
    out.env = _env({**(command.docker.env if command.docker else {}), **command.env}, values, where)
    return out


def _flag_name(name: str, vals: list[str], where: str) -> str:
    if not name:
        raise CommandError(f"{' '.join(vals)!r} before any flag", "start with a flag (--model-path ...)", where)
    if "_" in name.split("=")[0]:
        raise CommandError(
            f"flag {name}: SGLang flags are written with dashes, no release accepts {name}",
            f"write {name.replace('_', '-')} (check the name with --help)",
            where,
        )
    return canonical(name)


def _secret_flag(flag: str, values: _Values) -> None:
    values.api_key = True
    values.findings.append(
        _note(
            "import-secret",
            f"{flag} on the command line: the key is not written into the recipe",
            f"put the key in {API_KEY_FILE.format(id=values.recipe_id)} "
            "(0600) on each host: server.api_key_file points there",
            flag,
        )
    )


def _topology_flag(out: _Server, flag: str, vals: list[str], where: str) -> None:
    value = vals[0] if vals else ""
    if flag == "--nnodes":
        out.nnodes = _int(flag, vals, where)
        out.explicit_nnodes = True
    elif flag == "--node-rank":  # a variable rank: the inventory's order says which host is which
        out.node_rank = _int(flag, vals, where) if not SHELL_VAR.search(value) else 0
    elif flag == "--dist-init-addr":
        out.dist_init = value
    elif flag == "--disaggregation-mode":
        if value not in ("prefill", "decode", "null"):  # a variable role: the recipe's groups need to know it
            raise CommandError(
                f"--disaggregation-mode {value}: expected prefill or decode",
                "write --disaggregation-mode prefill (or decode): one command per role",
                where,
            )
        out.mode = value if value != "null" else None
    else:
        out.bootstrap_port = _int(flag, vals, where)


def _node_address(out: _Server, address: str, values: _Values) -> None:
    out.address = address
    values.findings.append(
        _note(
            "import-placeholder",
            f"--host {address} is this node's address: rendered "
            "per host as {node_address} (list the host in the inventory)",
            "",
            "--host",
            Severity.info,
        )
    )
    out.server["host"] = "{node_address}"


def _typed_value(server: dict, flag: str, vals: list[str], typed: tuple[str, Any], where: str) -> bool:
    """The value into its typed field; False when it stays in extra_args as written. A value import cannot know
    (<PORT>) is kept: in the field where the schema takes it (ports), else as written in extra_args; never SGLang's
    default in its place."""
    field_name, annotation = typed
    if vals and all(UNSET_VALUE.fullmatch(v) for v in vals):
        if _valid(field_name, vals[0]):
            server[field_name] = vals[0]
            return True
        if flag in DERIVED_FLAGS:  # sizes: they decide the devices per node, so the recipe needs the number
            raise CommandError(
                f"{flag} {vals[0]}: the recipe needs the number (it decides how many accelerators each node drives)",
                f"write {flag} N, the value the shell variable holds",
                where,
            )
        return False
    converted = _convert(annotation, vals)
    if converted is ValueError or (converted is not None and not _valid(field_name, converted)):
        raise CommandError(
            f"{flag} {' '.join(vals)}: {_expected(field_name)}", f"write {flag} {_example(field_name)}", where
        )
    if converted is None:
        return False
    server[field_name] = converted
    return True


def _is_node_address(value: str) -> bool:
    """A literal address of one machine (not a wildcard or loopback), which only fits one host of an inventory."""
    return (
        bool(value)
        and not SHELL_VAR.search(value)
        and not binds_every_address(value)
        and value != "localhost"
        and not value.startswith("127.")
        and value != "::1"
    )


def _valid(field_name: str, value) -> bool:
    try:
        ServerOptions.model_validate({field_name: value})
        return True
    except ValidationError:
        return False


def _expected(field_name: str) -> str:
    info = ServerOptions.model_fields[field_name]
    kind = str(info.annotation)
    bounds = {type(m).__name__: m for m in info.metadata}
    if "float" in kind:
        return "expected a fraction between 0 and 1" if "Gt" in bounds else "expected a number"
    if "int" in kind:
        return "expected a whole number" + (
            " between 1 and 65535" if field_name == "port" else " of at least 1" if "Ge" in bounds else ""
        )
    return "expected a value"


def _example(field_name: str) -> str:
    return {"port": "30000", "mem_fraction_static": "0.85"}.get(field_name, "1")


# --------------------------------------------------------------------------- docker


def docker_runtime(d: DockerOptions, values: _Values, notes: list[Finding]) -> dict:
    if SHELL_VAR.search(d.image):
        raise CommandError(
            f"the docker image is the shell variable {d.image!r}",
            "write the image as repository:tag (and @sha256:... to pin it) in the command",
            "docker",
        )
    run = _docker_run(d, values)
    _docker_notes(d, values, notes)
    runtime: dict[str, Any] = {"kind": "docker", "image": d.image}
    if d.digest:
        runtime["digest"] = d.digest
    runtime["run"] = run
    return runtime


def _docker_run(d: DockerOptions, values: _Values) -> dict:
    """docker run's options as runtime.run; a shell variable in a value becomes an input to set (values)."""
    d.volumes = [values.unset(v, "docker -v") for v in d.volumes]
    d.devices = [values.unset(v, "docker --device") for v in d.devices]
    d.env_files = [values.unset(v, "docker --env-file") for v in d.env_files]
    d.other = [values.unset(v, "docker option") for v in d.other]
    run: dict[str, Any] = {
        "shm_size": d.shm_size,
        "ipc_host": d.ipc == "host",
        "network_host": d.network == "host",
        "gpus": d.gpus,
        "privileged": d.privileged,
        "cpuset_cpus": d.cpuset_cpus,
        "ulimits": dict(d.ulimits),
        "volumes": list(d.volumes),
        "devices": list(d.devices),
    }
    for key in ("privileged", "cpuset_cpus", "volumes", "devices"):  # their defaults say the same: left out
        if not run[key]:
            del run[key]
    extra = list(d.other)
    if d.ipc and d.ipc != "host":
        extra.append(f"--ipc={d.ipc}")
    if d.network and d.network != "host":
        extra.append(f"--network={d.network}")
    if extra:
        run["extra_options"] = extra
    if d.env_files:
        run["env_files"] = list(d.env_files)
    if d.entrypoint:
        run["entrypoint"] = d.entrypoint
    return run


def _docker_notes(d: DockerOptions, values: _Values, notes: list[Finding]) -> None:
    """What a service cannot take from docker run as typed: env files by reference, -e NAME from the shell that ran
    docker, the options the systemd unit decides (-d, --name)."""
    if d.env_files:
        notes.append(
            _note(
                "import-env-file",
                f"--env-file {', '.join(d.env_files)} is passed by reference: the "
                "file must exist on each host (0600 if it holds secrets)",
                "",
                "docker",
                Severity.info,
            )
        )
    for name in d.env_from_host:
        if SECRET_NAME.search(name):
            _secret_env(name, values, "docker -e")
        else:
            values.findings.append(
                _note(
                    "import-set-value",
                    f"docker -e {name} takes the value from the shell that ran docker; a service has none",
                    f"set env {name} in the recipe",
                    f"env {name}",
                )
            )
    dropped = [*d.dropped, *(["-d"] if d.detach else []), *([f"--name {d.name}"] if d.name else [])]
    if dropped:
        notes.append(
            _note(
                "import-docker-dropped",
                f"docker run {' '.join(dropped)} not kept: the systemd unit runs "
                "the container in the foreground, removes it on exit and names it after the unit",
                "",
                "docker",
                Severity.info,
            )
        )


def _image_version(image: str) -> str | None:
    tag = image.rsplit(":", 1)[1] if ":" in image.split("/")[-1] else ""
    m = re.match(r"^v?(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)", tag)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- router


@dataclass
class _Router:
    pd: bool
    prefill: list[tuple[str, int | None]]  # (url, bootstrap port)
    decode: list[str]
    workers: list[str]
    router: dict[str, Any]


def _router_of(command: Command, values: _Values) -> _Router:
    pd, prefill, decode, workers = False, [], [], []
    router: dict[str, Any] = dict(ROUTER_DEFAULTS)
    extra: list[str] = []
    for name, vals in split_flags(command.flags):
        if name not in ("--prefill", "--decode", "--worker-urls"):  # worker URLs come from the inventory
            vals = [values.unset(v, name) for v in vals]
        if name == "--pd-disaggregation":
            pd = True
        elif name == "--prefill":
            if not vals or len(vals) > 2:
                raise CommandError(
                    f"--prefill {' '.join(vals)}: expected URL [BOOTSTRAP_PORT]",
                    "write --prefill http://HOST:PORT 8998",
                    "router",
                )
            boot = _int("--prefill bootstrap port", vals[1:], "router") if len(vals) == 2 else None
            prefill.append((vals[0], boot))
        elif name == "--decode":
            decode += vals
        elif name == "--worker-urls":
            workers += vals
        elif name in ("--host", "--policy"):
            router[name[2:]] = vals[0] if vals else ""
        elif name == "--port":  # a shell variable stays an input to set (<PORT>)
            router["port"] = vals[0] if vals and UNSET_VALUE.fullmatch(vals[0]) else _int(name, vals, "router")
        elif name in SECRET_FLAGS:
            values.api_key = True
            values.findings.append(
                _note(
                    "import-secret",
                    f"router {name}: the key is not written into the recipe",
                    "the router gets the engines' key from server.api_key_file",
                    name,
                )
            )
        else:
            extra += [name, *vals] if name else vals
    if extra:
        router["extra_args"] = extra
    env = _env({**(command.docker.env if command.docker else {}), **command.env}, values, "router")
    if env:  # the router's own (SGLANG_DP_ROUND_ROBIN=1 ...): kept as the engines' env is
        router["env"] = env
    return _Router(pd, prefill, decode, workers, router)


def _url(url: str, where: str) -> tuple[str | None, int | str]:
    """(host, port) of a worker URL; host None when it is a shell variable (the inventory says which host)."""
    m = re.match(r"^(?:[a-z]+://)?(\[[^\]]+\]|[^/:]+):(\d+|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)/?$", url)
    if not m:
        raise CommandError(
            f"{where} {url!r}: expected http://HOST:PORT", f"write {where} http://10.0.0.1:30000", "router"
        )
    host, port = m.group(1), m.group(2)
    # a variable port is the worker's port, still to set (<PORT>)
    return (None if SHELL_VAR.search(host) else host), (int(port) if port.isdigit() else f"<{shell_vars(port)[0]}>")


# --------------------------------------------------------------------------- assembling


def _groups_from_servers(
    servers: list[_Server], role: str, notes: list[Finding] | None = None
) -> tuple[list[dict], list[str | None], list[int]]:
    """Engine commands of one role -> groups: one instance per command (multi-node: per dist-init address); an
    instance identical to the one before it is that group's next instance."""
    instances: dict[str, list[_Server]] = {}
    for n, s in enumerate(servers):
        key = s.dist_init if s.nnodes > 1 and s.dist_init else f"#{n}"
        instances.setdefault(key, []).append(s)
    groups: list[dict] = []
    hosts: list[str | None] = []
    heads: list[int] = []  # index in hosts of each instance's rank 0
    last: tuple | None = None
    for members in instances.values():
        head = sorted(members, key=lambda s: s.node_rank)[0]
        group = _instance_group(head, members, role, notes)
        nodes = max(head.nnodes, 1)
        same = (json.dumps(head.server, sort_keys=True), json.dumps(head.env, sort_keys=True), nodes)
        prev = groups[-1] if groups else None
        if last == same and _next_instance_of(prev, role, group.get("bootstrap_port")):
            prev["instances"] = prev.get("instances", 1) + 1
        else:
            groups.append(group)
        last = same
        ranks = {s.node_rank: s.address for s in members}
        heads.append(len(hosts))
        hosts += [ranks.get(r) for r in range(nodes)]
    return groups, hosts, heads


def _next_instance_of(prev: dict | None, role: str, bootstrap_port: int | None) -> bool:
    """Whether an instance like group ``prev``'s can be its next one: instance i of a prefill group listens on
    bootstrap_port + i, so a prefill's port must be the next in line."""
    return prev is not None and (
        role != "prefill" or prev["bootstrap_port"] + prev.get("instances", 1) == bootstrap_port
    )


def _instance_group(head: _Server, members: list[_Server], role: str, notes: list[Finding] | None) -> dict:
    """One group instance (its rank 0's command ``head``, its ranks ``members``) as a topology group."""
    group: dict[str, Any] = {"role": role} if role != "server" else {}
    if head.nnodes > 1:
        group["nodes"] = head.nnodes
        port = _dist_init_port(members)
        if port is not None:
            group["dist_init_port"] = port
        if isinstance(port, str) and notes is not None:
            notes.append(
                _note(
                    "import-set-value",
                    f"--dist-init-addr {head.dist_init}: the port is a shell "
                    f"variable; imported as dist_init_port '{port}' (the address is rank 0's, from "
                    "the inventory)",
                    "set topology.groups[].dist_init_port in the recipe",
                    "--dist-init-addr",
                )
            )
    else:
        if head.explicit_nnodes and role != "server":
            group["explicit_single_node_rank"] = True
        if head.dist_init and notes is not None:
            notes.append(
                _note(
                    "import-dist-init-dropped",
                    f"--dist-init-addr {head.dist_init} on a one-node "
                    f"{role}: not kept (a single node needs no rendezvous; ironserve adds it for "
                    "multi-node groups from the inventory)",
                    "",
                    "--dist-init-addr",
                    Severity.info,
                )
            )
    if role == "prefill":
        group["bootstrap_port"] = head.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
    group["server"] = head.server
    if head.env:
        group["env"] = head.env
    return group


def _dist_init_port(members: list[_Server]) -> int | str | None:
    """The port of the group's --dist-init-addr, from whichever rank's command names it (a rank-1 command alone
    says it too); a shell variable there is an input to set (<DIST_PORT>), never SGLang's 5000 in its place."""
    for s in members:
        whole = SHELL_VAR.fullmatch(s.dist_init or "")
        if whole:  # --dist-init-addr $ADDR: host and port in one variable; the host is rank 0's anyway
            return f"<{var_name(whole)}_PORT>"
        if s.dist_init and ":" in s.dist_init:
            port = s.dist_init.rsplit(":", 1)[1]
            if port.isdigit():
                return int(port)
            if SHELL_VAR.fullmatch(port):
                return f"<{var_name(SHELL_VAR.fullmatch(port))}>"
    return None


def _check_bootstrap(groups: list[dict], entries: list[tuple[str, int | None]], notes: list[Finding]) -> None:
    """The router's bootstrap port for each prefill must be the one that prefill listens on."""
    ports = [g["bootstrap_port"] + i for g in groups for i in range(g.get("instances", 1))]
    for (url, boot), port in zip(entries, ports):
        if (boot or DEFAULT_BOOTSTRAP_PORT) != port:
            notes.append(
                _note(
                    "import-bootstrap-mismatch",
                    f"the router gives {url} bootstrap port "
                    f"{boot or DEFAULT_BOOTSTRAP_PORT}, the prefill command listens on {port}: as pasted, "
                    "requests would not reach it; the recipe uses the prefill's port for both",
                    "check --disaggregation-bootstrap-port on the prefill command",
                    "router",
                )
            )


def _groups_from_urls(entries: list[tuple[str, int | None]], role: str) -> tuple[list[dict], list[str | None]]:
    groups: list[dict] = []
    hosts: list[str | None] = []
    for url, boot in entries:
        host, port = _url(url, f"--{role}")
        hosts.append(host)
        prev = groups[-1] if groups else None
        if prev and prev["server"]["port"] == port and _next_instance_of(prev, role, boot or DEFAULT_BOOTSTRAP_PORT):
            prev["instances"] = prev.get("instances", 1) + 1
            continue
        group: dict[str, Any] = {"role": role, "server": {"port": port}}
        if role == "prefill":
            group["bootstrap_port"] = boot or DEFAULT_BOOTSTRAP_PORT
        groups.append(group)
    return groups, hosts


def _topology(servers: list[_Server], router: _Router | None, notes: list[Finding]) -> tuple[dict, list[str | None]]:
    if router and router.pd:
        return _pd_topology(servers, router, notes)
    modes = {s.mode for s in servers} - {None}
    if modes == {"prefill", "decode"}:
        notes.append(
            _note(
                "import-router-added",
                "PD commands without a router: the recipe adds sglang-router "
                f"(--pd-disaggregation, policy {ROUTER_DEFAULTS['policy']}, port "
                f"{ROUTER_DEFAULTS['port']}) in front of them",
                "set topology.router to your router's address, port and policy",
                "topology.router",
            )
        )
        return _pd_topology(servers, _Router(True, [], [], [], dict(ROUTER_DEFAULTS)), notes)
    if modes:
        return _pd_half(servers, modes.pop(), notes)
    if router:
        return _router_topology(servers, router, notes)
    groups, hosts, _ = _groups_from_servers(servers, "server", notes)
    if len(groups) != 1:
        raise CommandError(
            f"{len(groups)} different engine commands and no router",
            "import one launch (or one multi-node group) per recipe, or add the router command",
        )
    g = groups[0]
    if g.get("instances", 1) > 1:
        g.pop("instances")
        notes.append(
            _note(
                "import-duplicate-command",
                "the same engine command appears several times without a router: imported once",
                "",
                "command",
                Severity.info,
            )
        )
    if g.get("nodes", 1) > 1:
        return {"kind": "multinode-tp", "groups": [g]}, hosts
    return {"kind": "single", "groups": [g]}, hosts[:1]


def _pd_half(servers: list[_Server], role: str, notes: list[Finding]) -> tuple[dict, list[str | None]]:
    """Only prefill (or only decode) commands: operators run the halves on different machines and paste one at a
    time. The recipe is that half, without a router (it runs with the other half), and says how to get the whole."""
    other = "decode" if role == "prefill" else "prefill"
    if any(s.mode is None for s in servers):
        raise CommandError(
            f"{role} commands beside plain server commands",
            f"import the {role} and {other} commands of one PD deployment (and its router), or one plain server",
        )
    groups, hosts, _ = _groups_from_servers(servers, role, notes)
    notes.append(
        _note(
            "import-pd-half",
            f"only {role} commands: imported as the {role} half of a PD deployment; "
            f"its {other} half and the router are not in this recipe (deployed alone, nothing routes "
            f"requests to it)",
            f"import the whole deployment at once (--file repeated: the {role} and "
            f"{other} commands and the router, or one launch script with all of them); or add a {other} "
            "group and topology.router to this recipe",
            "topology",
            Severity.warning,
        )
    )
    return {"kind": "pd-disaggregation", "groups": groups}, hosts


def _pd_topology(servers: list[_Server], router: _Router, notes: list[Finding]) -> tuple[dict, list[str | None]]:
    groups, hosts = [], []
    for role in ("prefill", "decode"):
        mine = [s for s in servers if s.mode == role]
        entries = router.prefill if role == "prefill" else [(u, None) for u in router.decode]
        if mine:
            g, h, heads = _groups_from_servers(mine, role, notes)
            urls = [_url(u, f"--{role}")[0] for u, _ in entries]
            if len(urls) == len(heads):
                for index, address in zip(heads, urls):
                    h[index] = address
                if role == "prefill":
                    _check_bootstrap(g, entries, notes)
            elif entries:
                notes.append(
                    _note(
                        "import-router-mismatch",
                        f"the router names {len(urls)} {role} URL(s), the "
                        f"commands give {len(heads)} {role} instance(s): the recipe follows the commands",
                        "check the router's --prefill/--decode list",
                        "router",
                    )
                )
        else:
            g, h = _groups_from_urls(entries, role)
        groups += g
        hosts += h
    if not any(g["role"] == "prefill" for g in groups) or not any(g["role"] == "decode" for g in groups):
        raise CommandError(
            "--pd-disaggregation without both --prefill and --decode",
            "name every prefill (--prefill URL BOOTSTRAP) and decode (--decode URL) worker",
            "router",
        )
    return {"kind": "pd-disaggregation", "groups": groups, "router": router.router}, hosts


def _router_topology(servers: list[_Server], router: _Router, notes: list[Finding]) -> tuple[dict, list[str | None]]:
    """A router over plain workers: replicas of one engine command (or of the router's worker URLs)."""
    if servers:
        groups, _, _ = _groups_from_servers(servers[:1], "server")
    else:
        groups, _ = _groups_from_urls([(u, None) for u in router.workers[:1]], "server")
        groups[0].pop("role")
    hosts = [_url(u, "--worker-urls")[0] for u in router.workers]
    ports = sorted({_url(u, "--worker-urls")[1] for u in router.workers}, key=str)
    if len(ports) > 1:
        notes.append(
            _note(
                "import-worker-ports",
                f"the router's workers listen on different ports "
                f"({', '.join(map(str, ports))}); a recipe's replicas share one port: "
                f"{groups[0]['server'].get('port', ports[0])}",
                "run every replica on the same port (each on its own host)",
                "router",
            )
        )
    count = max(len(router.workers), 1)
    groups[0]["instances"] = count
    if count == 1:
        groups[0].pop("instances")
    kind = "replicas" if count > 1 else "single"
    return {"kind": kind, "groups": groups, "router": router.router}, hosts


def _flat_single(topology: dict) -> tuple[dict, dict, dict]:
    """single / multinode-tp: the group's server and env become the recipe's (the way recipes are written)."""
    g = topology["groups"][0]
    server, env = g.pop("server", {}), g.pop("env", {})
    if not g and "router" not in topology:
        topology = {"kind": topology["kind"]}
    return topology, server, env


def import_commands(
    commands: list[Command],
    hardware: str,
    recipe_id: str | None = None,
    engine: str | None = None,
    hardware_arch: str | None = None,
    detect: bool = False,
) -> Imported:
    """Commands of one deployment (engine commands, at most one router) -> recipe data and findings.

    hardware_arch defaults to the arch of the hardware profile `hardware` names ("none" for unknown ids)."""
    engines, router_command, launch = _deployment_commands(commands)
    notes: list[Finding] = []
    family = model_family(next((s for s in (_first_model(c) for c in engines) if s), "")) or "unknown"
    rid = recipe_id or re.sub(r"[^a-z0-9.]+", "-", f"{family}-{hardware}-imported".lower()).strip("-")
    values = _Values(rid)
    servers = [
        _server_of(c, values, f"command {n + 1}" if len(engines) > 1 else "command") for n, c in enumerate(engines)
    ]
    router = _router_of(router_command, values) if router_command else None
    topology, hosts = _topology(servers, router, notes)
    server: dict[str, Any] = {}
    env: dict[str, str] = {}
    if topology["kind"] in ("single", "multinode-tp"):
        topology, server, env = _flat_single(topology)
    if values.api_key:
        server["api_key_file"] = API_KEY_FILE.format(id=rid)
    model = _model(next((s.model_path for s in servers if s.model_path), ""), family, values)
    # the engines' container, else the router's (a router pasted alone)
    docker = next((c.docker for c in [*engines, *([router_command] if router_command else [])] if c.docker), None)
    arch = hardware_arch if hardware_arch is not None else _profile_arch(hardware)
    runtime, engine_data, engine_note = _engine_runtime(arch, engine, launch, docker, values, notes, commands, detect)
    if router:
        from .engine_parser import DEFAULT_ROUTER_VERSION

        engine_data["router"] = DEFAULT_ROUTER_VERSION
    data: dict[str, Any] = {
        "id": rid,
        "description": f"Imported from a pasted command ({family} on {hardware})",
        "source": {"seed": "pasted", "section": "ironserve import"},
        "hardware": [hardware],
        "model": model,
        "engine": engine_data,
        "runtime": runtime,
        "topology": topology,
        "server": server,
    }
    _process_env(data, env, commands, notes)
    _memlock(data, hardware, notes)
    _check_loads(data)
    return Imported(data, values.findings + notes, hosts, engine_note)


def _profile_arch(hardware: str) -> str:
    from .catalogue import hardware_profiles

    profile = hardware_profiles().get(hardware)
    return profile.accelerator.arch if profile else "none"


def _check_loads(data: dict) -> None:
    """What import writes must load: a recipe that does not is import's own bug, said as such."""
    try:
        Recipe.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise CommandError(
            f"the imported recipe does not validate at {'.'.join(map(str, err['loc']))}: {err['msg']}",
            "report this command: import should have refused it earlier",
        ) from exc


def _deployment_commands(commands: list[Command]) -> tuple[list[Command], Command | None, str]:
    """(engine commands, the router command, the engines' launcher) of one deployment, or why they are not one."""
    if not commands:
        raise CommandError("no SGLang launch command found", "paste 'python3 -m sglang.launch_server ...'")
    routers = [c for c in commands if c.kind == "router"]
    engines = [c for c in commands if c.kind != "router"]
    if len(routers) > 1:
        raise CommandError(f"{len(routers)} router commands", "import one router per deployment")
    launchers = {c.launcher for c in engines}
    if len(launchers) > 1:
        raise CommandError(
            f"engine commands with different launchers ({', '.join(sorted(launchers))})",
            "use one launcher for every engine of a deployment",
        )
    return engines, (routers[0] if routers else None), next(iter(launchers), "launch_server")


def _process_env(data: dict, env: dict[str, str], commands: list[Command], notes: list[Finding]) -> None:
    """The env the engines share, what `env -u` removes, and the wrappers that are not kept (said)."""
    if env:
        data["env"] = env
    env_unset = list(dict.fromkeys(name for c in commands for name in c.env_unset))
    if env_unset:
        data["env_unset"] = env_unset
    wrappers = sorted({w for c in commands for w in c.wrappers})
    if wrappers:
        notes.append(
            _note(
                "import-wrapper",
                f"launch wrappers not kept: {'; '.join(wrappers)} (the systemd unit "
                "runs the engine; CPU/NUMA placement is host tuning)",
                "",
                "command",
                Severity.info,
            )
        )


def _first_model(command: Command) -> str:
    for name, vals in split_flags(command.flags):
        if canonical(name) == "--model-path" and vals:
            return vals[0]
    return ""


def _model(model_path: str, family: str, values: _Values) -> dict:
    if not model_path:
        values.findings.append(
            _note(
                "import-set-value",
                "no --model-path in the commands (a router alone names no model)",
                "set model.hub_id or model.path in the recipe",
                "model",
            )
        )
        return {"family": family, "path": "/models/set-me"}
    if SHELL_VAR.search(model_path):  # carried as <NAME> (lint's unset-value), never a path made up here
        path = SHELL_VAR.sub(lambda m: f"<{var_name(m)}>", model_path)
        try:
            ModelSource.model_validate({"family": family, "path": path})
        except ValidationError as exc:
            raise CommandError(
                f"--model-path {model_path}: a path import cannot carry as {path!r}",
                "write the absolute path of the weights (the value the variable holds)",
                "--model-path",
            ) from exc
        values.findings.append(
            _note(
                "import-set-value",
                f"--model-path is the shell variable "
                f"{', '.join(shell_vars(model_path))}: imported as model.path {path!r}",
                "set model.hub_id or model.path in the recipe, or host data model_path in the inventory",
                "model",
            )
        )
        return {"family": family, "path": path}
    if model_path.startswith("/"):
        return {"family": family, "path": model_path}
    if model_path.startswith(("~", ".")) or model_path.count("/") > 1:  # not org/name: relative to the shell's cwd
        raise CommandError(
            f"--model-path {model_path}: a relative path (to the directory the command ran in), "
            "not a Hugging Face id (org/name)",
            "write the absolute path of the weights on the host "
            f"(e.g. /models/{model_path.rstrip('/').rsplit('/', 1)[-1]}) or the hub id",
            "--model-path",
        )
    return {"family": family, "hub_id": model_path}


def _memlock(data: dict, hardware: str, notes: list[Finding]) -> None:
    """Docker on hardware that wants unlimited locked memory: the catalogue refuses a recipe without it."""
    runtime = data["runtime"]
    if runtime["kind"] != "docker" or "run" not in runtime:  # no run: DockerRun's defaults (memlock -1)
        return
    from .catalogue import hardware_profiles

    profile = hardware_profiles().get(hardware)
    ulimits = runtime["run"]["ulimits"]
    if (
        profile
        and profile.tuning.limits.memlock == "unlimited"
        and str(ulimits.get("memlock")) not in ("-1", "unlimited")
    ):
        ulimits["memlock"] = "-1"
        notes.append(
            _note(
                "import-added-memlock",
                f"added --ulimit memlock=-1: {hardware} needs unlimited locked "
                "memory inside the container (RDMA, pinned buffers)",
                "",
                "runtime.run.ulimits",
            )
        )


def _engine_runtime(
    arch: str,
    engine: str | None,
    launch: str,
    docker: DockerOptions | None,
    values: _Values,
    notes: list[Finding],
    commands: list[Command],
    detect: bool,
) -> tuple[dict, dict, str]:
    version, how, by_flags = choose_engine(arch, engine, docker, commands, detect)
    if not how.startswith(("named with", "the newest cached")):
        how += "; not checked: `ironserve lint` runs its parser"
    note = f"sglang {version} ({how})"
    notes.append(_note("import-engine", note, "name another with --engine sglang==X.Y.Z", "engine", Severity.info))
    notes += _renamed_flags(commands, version)
    if docker:
        runtime = docker_runtime(docker, values, notes)
        tag_version = _image_version(docker.image)
        if tag_version:
            return runtime, {"sglang": tag_version, "launcher": launch}, note
        tag = docker.image.rsplit(":", 1)[1] if ":" in docker.image.split("/")[-1] else "latest"
        return runtime, {"sglang": f"image-{tag}", "launcher": launch, "parser_version": version}, note
    if arch == "ascend-a3":
        runtime = _ascend_runtime(arch, values, notes)
        tag = runtime["image"].rsplit(":", 1)[1]
        return runtime, {"sglang": f"image-{tag}", "launcher": launch, "parser_version": version}, note
    if arch in ERA_IMAGE and not engine and not by_flags:  # flags of another release: that release, from PyPI
        return (
            {"kind": "docker", "image": ERA_IMAGE[arch]},
            {"sglang": SEED_ERA[arch], "launcher": launch, "parser_version": version},
            note,
        )
    return (
        {"kind": "uv", "python": "3.12", "packages": [f"sglang=={version}"]},
        {"sglang": version, "launcher": launch},
        note,
    )


def _ascend_runtime(arch: str, values: _Values, notes: list[Finding]) -> dict:
    """SGLang's NPU image for the arch's hardware profile, run as SGLang's Ascend docs run it: every NPU die, the
    host's driver mounted."""
    from .catalogue import hardware_profiles

    profile = next(p for p in hardware_profiles().values() if p.accelerator.arch == arch)
    npu = DockerOptions(
        image=ASCEND_IMAGE.format(toolkit=(profile.toolkit or "8.3.RC1").lower()),
        privileged=True,
        network="host",
        ipc="host",
        shm_size="16g",
        devices=[f"/dev/davinci{n}" for n in range(profile.accelerator.count)] + ASCEND_DEVICES,
        volumes=list(ASCEND_VOLUMES),
    )
    runtime = docker_runtime(npu, values, notes)
    notes.append(
        _note(
            "import-npu-runtime",
            f"Ascend NPU runtime: SGLang's NPU image {npu.image} (CANN "
            f"{profile.toolkit}, torch-npu) with the {profile.accelerator.count} NPU dies and the host "
            "driver mounted, not a CUDA PyPI stack",
            "pin runtime.digest, or import the docker run line you use",
            "runtime",
            Severity.info,
        )
    )
    return runtime


def choose_engine(
    arch: str, engine: str | None, docker: DockerOptions | None, commands: list[Command], detect: bool
) -> tuple[str, str, bool]:
    """(release, why, chosen by the command's flags): --engine, else the image tag's release, else the newest cached
    parser that accepts every command (online), else the release the command's flags belong to (the hardware's
    seed-era release when its parser takes them, the newest one that does otherwise), else the seed era's."""
    from .engine_parser import release_for_era

    if engine:
        return engine, "named with --engine", False
    if docker and _image_version(docker.image):
        return _image_version(docker.image), f"the release in the image tag ({docker.image})", False
    releases = flag_releases.fit([c.flags for c in commands if c.kind != "router"])
    cached_note = ""
    if detect:
        version, cached_note = detect_engine([c.argv for c in commands], releases)
        if version:
            return version, cached_note, False
    era = SEED_ERA.get(arch, "")
    unchecked = f" ({cached_note})" if cached_note else ""
    if releases.deciding and release_for_era(era) not in releases.releases:
        if not releases.releases:
            return (
                release_for_era(era) or DEFAULT_ENGINE,
                f"no release takes every flag ({releases.reason()}){unchecked}",
                False,
            )
        return (
            releases.newest(),
            f"the newest release whose parser takes every flag: {releases.reason()}{unchecked}",
            True,
        )
    if release_for_era(era):
        fits = f", whose parser takes the command's flags ({releases.reason()})" if releases.deciding else ""
        return (
            release_for_era(era),
            f"the PyPI release of the seeds' {era} era for this hardware{fits}{unchecked}",
            False,
        )
    if releases.deciding:
        return (
            releases.newest(),
            f"the newest release whose parser takes every flag: {releases.reason()}{unchecked}",
            True,
        )
    return DEFAULT_ENGINE, f"the newest release ironserve knows{unchecked}", False


def _renamed_flags(commands: list[Command], version: str) -> list[Finding]:
    """Flags a release renamed or dropped, each named with its successor."""
    out = []
    for flag, span in flag_releases.renamed([c.flags for c in commands if c.kind != "router"], version):
        later = f"later releases take {span.successor}" if span.successor else "later releases have no such flag"
        severity = Severity.info if span.holds(version) else Severity.warning
        out.append(
            _note(
                "import-renamed-flag",
                f"{flag} is a flag of SGLang {span.text()}: {later}",
                f"write {span.successor} to run a newer release"
                if span.successor
                else f"remove {flag} to run a newer release",
                flag,
                severity,
            )
        )
    return out


def detect_engine(argvs: list[list[str]], releases: flag_releases.Fit | None = None) -> tuple[str | None, str]:
    """The newest cached SGLang parser that accepts every command (of the releases the flags belong to, when they
    say), said how it was chosen; (None, what was tried) when none does."""
    from . import engine_parser

    cached = engine_parser.cached_versions()
    fitting = [v for v in cached if releases is None or releases.takes(v)]
    if not fitting:
        return (
            None,
            f"no cached parser of those releases ({', '.join(cached)} cached)" if cached else "no parser cached",
        )
    for version in fitting:
        try:
            results = engine_parser.check_many(version, argvs)
        except (engine_parser.ParserEnvError, engine_parser.EngineNotAvailable):
            continue
        if not any(f.severity is Severity.error for found in results for f in found):
            return version, f"the newest cached SGLang parser that accepts the command ({', '.join(cached)} cached)"
    return None, f"no cached parser ({', '.join(fitting)}) accepts the command"


# --------------------------------------------------------------------------- entry points


def import_command(words: list[str], hardware: str, recipe_id: str | None = None, **options) -> dict:
    """One pasted command (as the shell split it) -> recipe data; ``options`` are import_commands' (engine,
    hardware_arch, detect)."""
    return import_commands([parse_command(words)], hardware, recipe_id, **options).data


def import_script(text: str, hardware: str, recipe_id: str | None = None, **options) -> Imported:
    """A launch script (the engine commands and the router of one deployment) -> recipe data and findings;
    ``options`` are import_commands' (engine, hardware_arch, detect)."""
    script = parse_script(text)
    if not script.commands:
        raise CommandError(
            "no SGLang launch command in the script",
            "the script must run python3 -m "
            "sglang.launch_server, sglang serve or python3 -m sglang_router.launch_router",
            "file",
        )
    result = import_commands([c for c, _ in script.commands], hardware, recipe_id, **options)
    if script.sourced:
        runtime = result.data["runtime"]
        runtime["source_env"] = list(dict.fromkeys([*runtime.get("source_env", []), *script.sourced]))
    if script.skipped:
        result.findings.append(
            _note(
                "import-skipped",
                f"{len(script.skipped)} line(s) of the script are not launches "
                f"and were not imported (first: {script.skipped[0]!r})",
                "host tuning lines (sysctl, governor) are in the hardware profile",
                "file",
                Severity.info,
            )
        )
    return result


def inventory_text(result: Imported) -> str:
    """A pyinfra inventory for the imported recipe: one host per worker slot in render order, at the addresses the
    commands named (router URLs, --host), SET-ME where they named none."""
    from .spec import Recipe

    recipe = Recipe.model_validate(result.data)
    lines = [
        f"# pyinfra inventory for recipe {recipe.id} (written by ironserve import): hosts in render order.",
        "# Replace every SET-ME; multi-node groups need each host's cluster NIC (nic).",
    ]
    n = 0
    for group in recipe.topology.groups:
        env = recipe.group_env(group)
        nic = next(
            (v for k, v in env.items() if k.endswith("SOCKET_IFNAME") and not v.startswith(("{", "<"))), "SET-ME"
        )
        hosts = []
        for _instance in range(group.instances):
            for _rank in range(group.nodes):
                address = result.hosts[n] if n < len(result.hosts) and result.hosts[n] else "SET-ME"
                data = {"ssh_hostname": address}
                if group.nodes > 1:
                    data["nic"] = nic
                hosts.append((f"{group.role}{len(hosts)}" if group.role != "server" else f"node{n}", data))
                n += 1
        lines.append(f"{group.role}_hosts = {hosts!r}")
    return "\n".join(lines) + "\n"


def to_yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
