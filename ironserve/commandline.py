"""Pasted commands: what a launch line from a guide, a script or a terminal says, as structured data.

One parser for everything that reads commands people paste (``ironserve import``, ``ironserve lint --``, the
real-parser check's launcher detection), so the three agree on what is a wrapper, what is the container, what is
the engine and what is an environment variable:

    [VAR=value ...] [sudo] [nohup|exec|time|env ...|numactl ...|taskset ...|uv run ...]
    [docker run OPTIONS IMAGE | bash -c '...'] [VAR=value ...]
    python3 [-u] -m sglang.launch_server | sglang serve | python -m sglang_router.launch_router |
    python -m sglang_router.launch_server   --flags ...   [> log 2>&1 &]

Also: shell scripts (line continuations, comments, ``export``, variables set earlier in the script, several
launch commands). Pure and offline: no engine, no host.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from .nvidia import cdi_gpus, is_cdi_gpu


class CommandError(ValueError):
    """A pasted command ironserve cannot read: what was found, what was expected, the fix."""

    def __init__(self, message: str, fix: str, where: str = "command"):
        super().__init__(message)
        self.fix = fix
        self.where = where


ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
SGLANG_BIN = re.compile(r"^(.*/)?sglang$")
# a shell variable or a documentation placeholder in a value: $x, ${x}, ${x:-default}, <PREFILL_HOST_IP>
SHELL_VAR = re.compile(
    r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}"  # ${x}, ${x:-default}: groups 1, 2
    r"|\$([A-Za-z_][A-Za-z0-9_]*)"  # $x: group 3
    r"|<([A-Za-z_][A-Za-z0-9_]*)>"  # <PLACEHOLDER> of a guide: group 4
    r"|\$\{([A-Za-z_][A-Za-z0-9_]*)\[(\d+|\$?[A-Za-z_][A-Za-z0-9_]*)\]\}"
)  # ${x[0]}, ${x[$i]}: 5, 6
# NAME=(a b c): a bash array, whose elements launch lines name as ${NAME[0]}
ARRAY_ASSIGNMENT = re.compile(r"^(?:export\s+|declare\s+-a\s+|local\s+)?([A-Za-z_][A-Za-z0-9_]*)=\((.*)\)$", re.S)


def var_name(m: re.Match) -> str:
    """The variable a SHELL_VAR match names, as a recipe input: x, X, or x_0 for ${x[0]}."""
    if m.group(5):
        return f"{m.group(5)}_{m.group(6).lstrip('$')}"
    return m.group(1) or m.group(3) or m.group(4)


# Secrets in pasted commands (env names and values that are keys or tokens): never copied into a recipe
SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|API_KEY|APIKEY|SECRET|SECRET_KEY|PASSWORD|PASSWD|ACCESS_KEY|PRIVATE_KEY)"
    r"(?:_|$)",
    re.I,
)
SECRET_FLAGS = ("--api-key", "--admin-api-key")
SECRET_VALUE = re.compile(
    r"^(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{16,}|gh[pousr]_[A-Za-z0-9]{30,}|"
    r"AKIA[0-9A-Z]{16}|xox[abp]-[A-Za-z0-9-]{10,})$"
)

# launcher module -> (kind, launcher). kind: server (one engine), router (sglang-router alone),
# router-server (sglang_router.launch_server: the router and --dp-size engines in one process)
LAUNCHERS = {
    "sglang.launch_server": ("server", "launch_server"),
    "sglang_router.launch_router": ("router", "launch_router"),
    "sglang_router.launch_server": ("router-server", "router_launch_server"),
}
# real SGLang entry points that are not a server launch ironserve manages, with what to use instead
OTHER_SGLANG = {
    "sglang.srt.disaggregation.mini_lb": "python3 -m sglang_router.launch_router --pd-disaggregation --mini-lb",
    "sglang.srt.disaggregation.launch_lb": "python3 -m sglang_router.launch_router --pd-disaggregation --mini-lb",
    "sglang.bench_serving": "a benchmark, not a server: see `ironserve bench`",
    "sglang.bench_one_batch": "a benchmark, not a server: see `ironserve bench`",
    "sglang.check_env": "a diagnostic, not a server",
}

WRAPPERS = {"nohup", "exec", "time", "command", "stdbuf", "nice", "ionice", "setsid", "chrt"}
# wrapper -> options that take a separate value
_WRAPPER_VALUE_OPTS = {
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user", "--group"},
    "env": {"-u", "--unset", "-C", "--chdir", "-S", "--split-string"},
    "numactl": {
        "-N",
        "-m",
        "-C",
        "-p",
        "-i",
        "--cpunodebind",
        "--membind",
        "--physcpubind",
        "--preferred",
        "--interleave",
        "--cpubind",
    },
    "taskset": set(),
    "uv": {
        "--with",
        "--python",
        "-p",
        "--project",
        "--directory",
        "--env-file",
        "--index",
        "--extra",
        "--group",
        "--with-requirements",
        "--default-index",
        "--extra-index-url",
        "--index-url",
        "-i",
        "--package",
    },
    "nice": {"-n", "--adjustment"},
    "ionice": {"-c", "-n", "--class", "--classdata"},
    "stdbuf": {"-i", "-o", "-e"},
    "chrt": set(),
}
_PYTHON_VALUE_OPTS = {"-X", "-W", "-c"}

# docker run options that take a value (everything else starting with '-' is a switch)
_DOCKER_VALUE_OPTS = {
    "-e",
    "--env",
    "--env-file",
    "-v",
    "--volume",
    "--device",
    "--gpus",
    "--shm-size",
    "--ipc",
    "--network",
    "--net",
    "--ulimit",
    "--name",
    "--entrypoint",
    "-p",
    "--publish",
    "--cpuset-cpus",
    "--cpuset-mems",
    "--runtime",
    "--security-opt",
    "--cap-add",
    "--cap-drop",
    "-w",
    "--workdir",
    "-u",
    "--user",
    "--mount",
    "--restart",
    "--pids-limit",
    "-m",
    "--memory",
    "-h",
    "--hostname",
    "-l",
    "--label",
    "--log-driver",
    "--log-opt",
    "--group-add",
    "--add-host",
    "--dns",
    "--pid",
    "--uts",
    "--cgroupns",
    "--platform",
    "--pull",
    "--stop-signal",
    "--stop-timeout",
    "--cpus",
    "--device-cgroup-rule",
    "--memory-swap",
    "--oom-score-adj",
    "--label-file",
    "--annotation",
    "--tmpfs",
    "--volumes-from",
    "--link",
    "--cidfile",
    "--sysctl",
    "--storage-opt",
    "--health-cmd",
    "--health-interval",
    "--userns",
    "--cgroup-parent",
    "--expose",
    "--mac-address",
    "--ip",
}
_DOCKER_SWITCHES = {
    "-d",
    "--detach",
    "-i",
    "--interactive",
    "-t",
    "--tty",
    "--rm",
    "--privileged",
    "--init",
    "-P",
    "--publish-all",
    "--read-only",
    "--no-healthcheck",
    "--oom-kill-disable",
    "--sig-proxy",
}
# what ends the command proper: pipes, lists, redirections, backgrounding
_SHELL_END = {"|", "||", "&&", ";", "&", "|&"}
_REDIRECT = re.compile(r"^(\d*|&)>>?(&\d+)?.*$|^<<?$")


@dataclass
class DockerOptions:
    """`docker run` options in the pasted line, by meaning (the image and what follows are not options)."""

    image: str = ""
    digest: str | None = None
    detach: bool = False
    shm_size: str | None = None
    ipc: str | None = None
    network: str | None = None
    gpus: str | None = None
    privileged: bool = False
    cpuset_cpus: str | None = None
    ulimits: dict[str, str] = field(default_factory=dict)
    volumes: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_from_host: list[str] = field(default_factory=list)  # -e NAME: the value comes from the caller's env
    env_files: list[str] = field(default_factory=list)
    entrypoint: str | None = None
    name: str | None = None
    other: list[str] = field(default_factory=list)  # options kept as written (-p, --runtime, --cap-add, ...)
    dropped: list[str] = field(default_factory=list)  # interactive switches a service does not use (-it, --rm)
    cli_env: dict[str, str] = field(default_factory=dict)  # NAME=value in front of docker: not the container's


@dataclass
class Command:
    """One launch command: environment, wrappers, container and the engine's own argv."""

    env: dict[str, str]
    wrappers: list[str]
    docker: DockerOptions | None
    interpreter: list[str]  # ['python3', '-u'] or ['sglang']
    module: str  # sglang.launch_server, sglang serve, sglang_router.launch_router, ...
    kind: str  # server | router | router-server
    launcher: str  # launch_server | serve | launch_router | router_launch_server
    flags: list[str]
    tail: list[str] = field(default_factory=list)  # redirections, '&', pipes: not part of the launch
    env_unset: list[str] = field(default_factory=list)  # env -u NAME: removed from the engine's environment

    @property
    def argv(self) -> list[str]:
        """The engine's argv as a service runs it: interpreter, launcher, flags."""
        if self.launcher == "serve":
            return (
                [*self.interpreter, "serve", *self.flags]
                if self.interpreter[-1:] != ["serve"]
                else [*self.interpreter, *self.flags]
            )
        return [*self.interpreter, "-m", self.module, *self.flags]


def _cut_tail(words: list[str]) -> tuple[list[str], list[str]]:
    for n, word in enumerate(words):
        if word in _SHELL_END or _REDIRECT.match(word):
            return words[:n], words[n:]
    return words, []


def _skip_options(words: list[str], i: int, value_opts: set[str]) -> int:
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        opt = words[i]
        i += 1
        if opt in value_opts and "=" not in opt:
            i += 1
    if i < len(words) and words[i] == "--":
        i += 1
    return i


def parse_command(words: list[str]) -> Command:
    """A pasted launch (as the shell split it) -> Command. CommandError says what is wrong and how to fix it."""
    words, tail = _cut_tail(list(words))
    env: dict[str, str] = {}
    env_unset: list[str] = []
    wrappers: list[str] = []
    docker: DockerOptions | None = None
    i = 0
    while i < len(words):
        word = words[i]
        m = ASSIGNMENT.match(word)
        if m:
            env[m.group(1)] = m.group(2)
            i += 1
            continue
        if word == "export":
            raise CommandError(
                "'export' in a pasted command",
                "pass variables as NAME=VALUE before the command, "
                "or import a script with --file (export lines are read there)",
            )
        base = word.rsplit("/", 1)[-1]
        j = _wrapper_end(words, i, base)
        if j is not None:
            if base == "env":
                env_unset += _env_unsets(words[i + 1 : j])
            wrappers.append(shlex.join(words[i:j]))
            i = j
            continue
        if base in WRAPPERS:
            wrappers.append(word)
            i += 1
            continue
        if base in ("docker", "podman", "nerdctl") and (
            words[i + 1 : i + 2] == ["run"] or words[i + 1 : i + 3] == ["container", "run"]
        ):
            if docker is not None:
                raise CommandError("two 'docker run' in one command", "paste one launch per command")
            start = i + (2 if words[i + 1] == "run" else 3)
            docker, i = _parse_docker(words, start)
            docker.cli_env, env = env, {}  # NAME=value before docker reaches the docker CLI, not the container
            if docker.entrypoint:
                words = words[:i] + shlex.split(docker.entrypoint) + words[i:]
            continue
        if base in ("bash", "sh") and i + 2 < len(words) and words[i + 1] in ("-c", "-lc", "-ec"):
            inner, inner_tail = _cut_tail(shlex.split(words[i + 2]))
            tail = inner_tail + tail
            words = words[:i] + inner
            continue
        break
    rest = words[i:]
    if not rest:
        raise CommandError(
            "no command found after the environment and wrappers",
            "paste 'python3 -m sglang.launch_server --model-path ...' (or sglang serve, "
            "python3 -m sglang_router.launch_router ...)",
        )
    interpreter, module, flags = _launcher(rest)
    kind, launcher = _launch_kind(module, rest)
    return Command(env, wrappers, docker, interpreter, module, kind, launcher, flags, tail, env_unset)


def _launch_kind(module: str, rest: list[str]) -> tuple[str, str]:
    """(server or router, the launcher's name) of a launch module; CommandError for anything that is not one."""
    if module in LAUNCHERS:
        return LAUNCHERS[module]
    if module == "sglang serve":
        return "server", "serve"
    if module in OTHER_SGLANG:
        raise CommandError(f"'{module}' is not a server launch ironserve imports", f"use {OTHER_SGLANG[module]}")
    if module.startswith(("sglang.", "sglang_router.")) or module in ("sglang", "sglang_router"):
        raise CommandError(
            f"no SGLang release has a launcher '{module}'",
            "use python3 -m sglang.launch_server (or sglang serve, "
            "python3 -m sglang_router.launch_router / launch_server)",
        )
    raise CommandError(
        f"'{shlex.join(rest[:3])}' is not an SGLang server command",
        "paste 'python3 -m sglang.launch_server ...', 'sglang serve ...' or "
        "'python3 -m sglang_router.launch_router ...' (docker run, nohup, numactl, taskset, env "
        "and uv run in front are understood)",
    )


def _wrapper_end(words: list[str], i: int, base: str) -> int | None:
    """Where a wrapper with options (sudo, env, numactl, taskset MASK, uv run, ...) at ``i`` ends; None: not one."""
    if base in ("sudo", "env", "numactl", "nice", "ionice", "stdbuf", "chrt"):
        j = _skip_options(words, i + 1, _WRAPPER_VALUE_OPTS[base])
        return j + 1 if base == "chrt" and j < len(words) and words[j].isdigit() else j
    if base == "taskset":
        return _skip_options(words, i + 1, set()) + 1  # the mask or cpu list
    if base == "uv" and words[i + 1 : i + 2] == ["run"]:
        return _skip_options(words, i + 2, _WRAPPER_VALUE_OPTS["uv"])
    return None


def _env_unsets(options: list[str]) -> list[str]:
    """Names `env -u NAME` / `env --unset=NAME` removes from the engine's environment."""
    out, it = [], iter(options)
    for opt in it:
        if opt in ("-u", "--unset"):
            out.append(next(it, ""))
        elif opt.startswith("--unset="):
            out.append(opt.split("=", 1)[1])
        elif opt.startswith("-u") and len(opt) > 2:
            out.append(opt[2:])
    return [name for name in out if name]


def _launcher(rest: list[str]) -> tuple[list[str], str, list[str]]:
    """(interpreter, module, flags) of 'python3 -u -m M --flags' or 'sglang serve --flags'."""
    first = rest[0]
    if PYTHON.match(first):
        j = 1
        while j < len(rest) and rest[j].startswith("-") and rest[j] != "-m":
            j += 2 if rest[j] in _PYTHON_VALUE_OPTS else 1
        if rest[j : j + 1] == ["-m"] and j + 1 < len(rest):
            module = rest[j + 1]
            if module in ("sglang", "sglang.cli.main") and rest[j + 2 : j + 3] == ["serve"]:
                return rest[:j] + ["-m", module], "sglang serve", rest[j + 3 :]
            return rest[:j], module, rest[j + 2 :]
        script = rest[j] if j < len(rest) else ""
        module = script[:-3].replace("/", ".").lstrip(".") if script.endswith(".py") else script
        return rest[:j], module, rest[j + 1 :]
    if SGLANG_BIN.match(first) and rest[1:2] == ["serve"]:
        return ["sglang"], "sglang serve", rest[2:]
    return [], first, rest[1:]


def _parse_docker(words: list[str], i: int) -> tuple[DockerOptions, int]:
    d = DockerOptions()
    while i < len(words) and words[i].startswith("-"):
        word = words[i]
        name, eq, inline = word.partition("=")
        if not word.startswith("--") and len(word) > 2 and not eq:
            # -it, -dit, -e=..., -v/x:/y (value glued to a short option)
            if all(f"-{c}" in _DOCKER_SWITCHES for c in word[1:]):
                for c in word[1:]:
                    _docker_switch(d, f"-{c}")
                i += 1
                continue
            name, inline, eq = word[:2], word[2:], "="
        if name in _DOCKER_SWITCHES and not eq:
            _docker_switch(d, name)
            i += 1
            continue
        if name not in _DOCKER_VALUE_OPTS and eq and name.startswith("--"):
            d.other.append(word)  # --option=value: kept as written
            i += 1
            continue
        if name not in _DOCKER_VALUE_OPTS:
            raise CommandError(
                f"docker run option {name} is not known to ironserve",
                "remove it, or write it as --option=value so it is kept as written",
            )
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(words):
                raise CommandError(f"docker run {name} without a value", f"write {name} VALUE")
            value = words[i + 1]
            i += 2
        _docker_option(d, name, value)
    if i >= len(words):
        raise CommandError("docker run without an image", "write docker run OPTIONS IMAGE python3 -m ...")
    image = words[i]
    if "@" in image:
        image, d.digest = image.split("@", 1)
    d.image = image
    return d, i + 1


def _docker_switch(d: DockerOptions, name: str) -> None:
    if name in ("-d", "--detach"):
        d.detach = True
    elif name == "--privileged":
        d.privileged = True
    elif name in ("-i", "--interactive", "-t", "--tty", "--rm"):
        d.dropped.append(name)
    else:
        d.other.append(name)


def _docker_option(d: DockerOptions, name: str, value: str) -> None:
    if name in ("-e", "--env"):
        m = ASSIGNMENT.match(value)
        if m:
            d.env[m.group(1)] = m.group(2)
        else:
            d.env_from_host.append(value)
    elif name == "--env-file":
        d.env_files.append(value)
    elif name in ("-v", "--volume"):
        d.volumes.append(value)
    elif name == "--device":
        if is_cdi_gpu(value):  # the CDI form of --gpus (what ironserve's own units write)
            d.gpus = cdi_gpus([value], d.gpus)
        else:
            d.devices.append(value)
    elif name == "--gpus":
        d.gpus = value  # '"device=0,1"' keeps its quotes: docker reads the value as CSV
    elif name == "--shm-size":
        d.shm_size = value
    elif name == "--ipc":
        d.ipc = value
    elif name in ("--network", "--net"):
        d.network = value
    elif name == "--ulimit":
        key, _, limit = value.partition("=")
        d.ulimits[key] = limit
    elif name == "--cpuset-cpus":
        d.cpuset_cpus = value
    elif name == "--entrypoint":
        d.entrypoint = value or None
    elif name == "--name":
        d.name = value
    else:
        d.other += [f"{name}={value}"] if name.startswith("--") else [name, value]


# --------------------------------------------------------------------------- scripts


@dataclass
class Script:
    """A launch script: its launch commands with variables set in the script filled in, and what else it does."""

    commands: list[tuple[Command, list[str]]]  # (command, its words after expansion)
    variables: dict[str, str]  # set in the script (export or plain)
    skipped: list[str]  # lines that are not launches (echo, sysctl, source, ...)
    sourced: list[str]  # scripts sourced before the launches


def logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined."""
    return text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines()


def expand(word: str, variables: dict[str, str]) -> str:
    """$x / ${x} / ${x:-default} filled from the script's variables; unknown ones stay as written."""

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3) or (f"{m.group(5)}[{m.group(6)}]" if m.group(5) else None)
        if name and name in variables:
            return variables[name]
        if m.group(1) and m.group(2) is not None:
            return m.group(2)
        return m.group(0)

    return SHELL_VAR.sub(sub, word)


def parse_script(text: str) -> Script:
    variables: dict[str, str] = {}
    exported: dict[str, str] = {}
    unset: list[str] = []
    commands, skipped, sourced = [], [], []
    for line in logical_lines(text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise CommandError(f"cannot split the line {line.strip()[:60]!r}: {exc}", "close the quotes") from exc
        array = ARRAY_ASSIGNMENT.match(line.strip())
        if array:  # D_IP=(10.0.0.1 10.0.0.2): ${D_IP[0]}, ${D_IP[1]} in the launch lines
            for n, element in enumerate(shlex.split(array.group(2))):
                variables[f"{array.group(1)}[{n}]"] = expand(element, variables)
            continue
        for part in _split_list(words):
            if not part:
                continue
            if part[0] == "export" or all(ASSIGNMENT.match(w) for w in part):
                for w in part[1:] if part[0] == "export" else part:
                    m = ASSIGNMENT.match(w)
                    if m:
                        variables[m.group(1)] = expand(m.group(2), variables)
                        if part[0] == "export":
                            exported[m.group(1)] = variables[m.group(1)]
                continue
            if part[0] == "unset":
                for name in part[1:]:
                    if name not in variables:  # unset of the caller's environment (proxies, ...): the engine's too
                        unset.append(name)
                    variables.pop(name, None)
                    exported.pop(name, None)
                continue
            if part[0] in ("source", ".") and len(part) > 1:
                sourced.append(expand(part[1], variables))
                continue
            expanded = [expand(w, variables) for w in part]
            try:
                command = parse_command(expanded)
            except CommandError:
                skipped.append(shlex.join(part)[:80])
                continue
            if command.docker is None:  # exported variables do not cross into a container (only -e does)
                command.env = {**exported, **command.env}
                command.env_unset = list(dict.fromkeys([*unset, *command.env_unset]))
            commands.append((command, expanded))
    return Script(commands, variables, skipped, sourced)


def _split_list(words: list[str]) -> list[list[str]]:
    """Split a line at ';', '&&', '||' and a trailing '&' (redirections stay with their command)."""
    parts, current = [], []
    for word in words:
        if word in (";", "&&", "||"):
            parts.append(current)
            current = []
        else:
            current.append(word)
    parts.append(current)
    return parts


def shell_vars(text: str) -> list[str]:
    """Names of the shell variables or <PLACEHOLDERS> a value still holds."""
    return [var_name(m) for m in SHELL_VAR.finditer(text)]
