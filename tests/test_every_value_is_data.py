"""Every value is data: hostile or careless recipe and host data is refused with file, field and fix (exit 2, no
traceback), or reaches its sink inert and quoted. The property test at the end renders arbitrary strings for every
string field and checks them with the sinks' own readers: systemd's unit parser (systemd-analyze verify), systemd's
env-file reader (libsystemd-shared's load_env_file), docker's --env-file reader (the docker CLI against a stand-in
daemon socket) and bash.
"""

from __future__ import annotations

import copy
import ctypes
import glob
import http.server
import json
import os
import re
import shlex
import shutil
import socketserver
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

from ironserve import catalogue
from ironserve.catalogue import SpecError
from ironserve.cli import main

RECIPES = catalogue.recipes_dir()
TP2 = yaml.safe_load((RECIPES / "tiny-cpu-tp2.yaml").read_text())
TP2_HOSTS = [
    ("n0", {"hardware": "cpu-lab", "ssh_hostname": "10.0.0.10", "nic": "host0"}),
    ("n1", {"hardware": "cpu-lab", "ssh_hostname": "10.0.0.11", "nic": "host0"}),
]


def _recipe_file(tmp_path: Path, mutate=None, base=TP2, name=None) -> Path:
    data = copy.deepcopy(base)
    if mutate:
        mutate(data)
    path = tmp_path / f"{name or data['id']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def _inventory_file(tmp_path: Path, hosts=TP2_HOSTS, text: str | None = None) -> Path:
    path = tmp_path / "inventory.py"
    path.write_text(text if text is not None else f"nodes = {hosts!r}\n")
    return path


def _cli(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.err


def _refused(capsys, *argv, field: str = "", words: tuple = ()) -> str:
    """Exit 2, a file: field: message. Fix: line on stderr, no traceback."""
    rc, err = _cli(capsys, *argv)
    assert rc == 2, err
    assert "Traceback" not in err and "Fix:" in err, err
    if field:
        assert f" {field}" in err, err
    for word in words:
        assert word in err, err
    return err


# --------------------------------------------------------------------------- recipe strings


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d["engine"].__setitem__("sglang", "0.5.23\nExecStartPre=/bin/touch /tmp/x"), "engine.sglang"),
        (lambda d: d.__setitem__("env_unset", ["FOO\nLD_PRELOAD=/tmp/x.so"]), "env_unset.0"),
        (lambda d: d["server"]["extra_args"].append("x\nExecStartPre=/bin/sh"), "server.extra_args"),
        (
            lambda d: d["server"].__setitem__("served_model_name", "tiny\nExecStartPre=/bin/sh"),
            "server.served_model_name",
        ),
        (
            lambda d: d.__setitem__("tuning", {"sysctls": {"vm.swappiness": "0\nkernel.core_pattern=|/tmp/x"}}),
            "tuning.sysctls",
        ),
        (lambda d: d["env"].__setitem__("A", "1\nLD_PRELOAD=/tmp/x.so"), "env.A"),
        (lambda d: d.__setitem__("env_unset", ["BAR; touch /tmp/x"]), "env_unset.0"),
        (lambda d: d["model"].__setitem__("path", "models/tiny"), "model.path"),
        (lambda d: d["model"].__setitem__("path", "/var/lib/../../etc"), "model.path"),
        (lambda d: d["runtime"].__setitem__("index_url", "http://mirror.example/simple"), "runtime.index_url"),
        (lambda d: d["server"].__setitem__("host", "0.0.0.0 --api-key x"), "server.host"),
        (lambda d: d["env"].__setitem__("B", " padded "), "env.B"),
        (lambda d: d["env"].__setitem__("C", "a\\b"), "env.C"),
    ],
)
def test_hostile_recipe_strings_are_refused(tmp_path, capsys, mutate, field):
    path = _recipe_file(tmp_path, mutate)
    _refused(capsys, "render", str(path), "--format", "systemd", field=field)


def test_shell_metacharacters_are_legal_data_and_inert(tmp_path, capsys):
    hostile = "$(touch /tmp/ironserve-pwned); `id` | & > /tmp/x"
    path = _recipe_file(
        tmp_path,
        lambda d: (d["env"].__setitem__("SGLANG_X", hostile), d["server"]["extra_args"].extend(["--weird", hostile])),
    )
    assert main(["render", str(path), "--format", "shell"]) == 0
    script = capsys.readouterr().out
    assert f"export SGLANG_X={shlex.quote(hostile)}" in script
    assert main(["render", str(path), "--format", "systemd"]) == 0
    units = capsys.readouterr().out
    assert '"$$(touch /tmp/ironserve-pwned); `id` | & > /tmp/x"' in units  # systemd-quoted, $ doubled


# --------------------------------------------------------------------------- shell syntax in paths and URLs

SHELL_SYNTAX = [
    "$(touch /tmp/ironserve-pwned)",
    "`id`",
    ";id",
    "|id",
    "&id",
    "'x'",
    '"x"',
    "<x",
    ">x",
    "a b",
    "a\tb",
    "${HOME}",
    "*",
    "x!",
]


@pytest.mark.parametrize("bad", SHELL_SYNTAX)
def test_paths_and_urls_refuse_shell_syntax(bad):
    from ironserve.spec import check_abs_path, check_url

    with pytest.raises(ValueError, match="write the (path|URL)"):
        check_abs_path(f"/srv/models/{bad}")
    with pytest.raises(ValueError, match="write the (path|URL)"):
        check_url(f"https://mirror.example/simple/{bad}")


def test_ordinary_paths_and_urls_stay_legal():
    from ironserve.spec import check_abs_path, check_url

    for path in ("/mnt/models/GLM-5", "/srv/models/Qwen3.5-397B-A17B-NVFP4", "/opt/a_b/c+d@e,f=g~h", "/"):
        assert check_abs_path(path) == path
    for url in (
        "https://mirror.example/pypi/simple/",
        "http://10.213.7.1:8080/simple",
        "file:///srv/wheels",
        "https://[fd00::1]:8443/a/b?x=1#y",
        "https://h.example/a%20b",
    ):
        assert check_url(url) == url


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d["model"].__setitem__("path", "/srv/$(touch /tmp/ironserve-pwned)"), "model.path"),
        (lambda d: d["runtime"].__setitem__("source_env", ["/opt/env.sh;id"]), "runtime.source_env.0"),
        (lambda d: d["runtime"].__setitem__("index_url", "https://mirror.example/`id`"), "runtime.index_url"),
        (lambda d: d["env"].__setitem__("NCCL_DEBUG", "INFO\x07"), "env.NCCL_DEBUG"),
        (lambda d: d["topology"]["groups"][0].setdefault("env", {}).__setitem__("X", "1\n"), "topology.groups.0.env.X"),
    ],
)
def test_recipe_errors_name_the_exact_key_and_what_to_write(tmp_path, capsys, mutate, field):
    err = _refused(capsys, "render", str(_recipe_file(tmp_path, mutate)), field=field + ":")
    assert "Fix: write " in err and "change the value as the message says" not in err, err


@pytest.mark.parametrize(
    "key,value",
    [
        ("sysctl_file", "/etc/sysctl.d/$(id).conf"),
        ("pip_index_url", "https://mirror.example/`id`/simple"),
        ("ascend_install_path", "/usr/local/Ascend;id"),
        ("model_path", "/srv/m $(id)"),
        ("tools_venv", "/opt/t|id"),
    ],
)
def test_host_data_paths_and_urls_refuse_shell_syntax(tmp_path, capsys, key, value):
    from roles.context import build_context

    hosts = [("n0", {**TP2_HOSTS[0][1], key: value}), TP2_HOSTS[1]]
    inventory = _inventory_file(tmp_path, hosts)
    err = _refused(capsys, "render", "tiny-cpu-tp2", "--inventory", str(inventory), field=f"n0.{key}:")
    assert "Fix: write the" in err, err
    # the deploy's path: the context refuses it before any operation, naming the key and what to write
    with pytest.raises(SpecError) as refused:
        build_context("tiny", "n0", [(n, {**d, "recipe": "tiny-cpu-tp2"}) for n, d in hosts], "inventories/x.py")
    (problem,) = refused.value.problems
    assert problem.field == f"n0.{key}" and problem.fix.startswith("write the"), problem


def test_the_deploy_refuses_shell_syntax_with_exit_2_and_no_traceback():
    """pyinfra's own CLI (a dry run on @local: refused while the deploy file loads, before any fact or command)."""
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "pyinfra"),
            "--dry",
            "@local",
            "deploys/tiny.py",
            "--data",
            "hardware=cpu-lab",
            "--data",
            "sysctl_file=/etc/sysctl.d/$(id).conf",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 2, log[-2000:]
    assert "Traceback" not in log and "@local.sysctl_file:" in log and "Fix: write the path" in log, log[-2000:]


# --------------------------------------------------------------------------- contradictions


@pytest.mark.parametrize(
    "mutate,field,words",
    [
        (
            lambda d: d["topology"]["groups"][0].__setitem__("dist_init_port", 30000),
            "topology.groups[0].dist_init_port",
            ("30000",),
        ),
        (
            lambda d: d["topology"]["groups"][0].__setitem__("dist_init_port", 29997),
            "topology.groups[0].dist_init_port",
            ("SGLang's port dist_init_port + 3",),
        ),
        (
            lambda d: d["topology"]["groups"][0].__setitem__("dist_init_port", 65530),
            "topology.groups[0].dist_init_port",
            ("past 65535",),
        ),
        (
            lambda d: d["topology"]["groups"][0].__setitem__("dist_init_port", 29900),
            "topology.groups[0].dist_init_port",
            ("rank guard",),
        ),
        (lambda d: d["server"]["extra_args"].extend(["--port", "31000"]), "server.extra_args", ("--port",)),
        (lambda d: d["server"]["extra_args"].append("--tp-size=4"), "server.extra_args", ("--tp-size",)),
        (
            lambda d: d["server"]["extra_args"].extend(["--served-model-name", "other"]),
            "topology.groups[0] server.extra_args[4]",
            ("--served-model-name", "typed field"),
        ),
        (lambda d: d["server"]["extra_args"].extend(["--api-key", "k"]), "server.extra_args", ("--api-key",)),
    ],
)
def test_contradictions_are_refused(tmp_path, capsys, mutate, field, words):
    path = _recipe_file(tmp_path, mutate)
    _refused(capsys, "render", str(path), field=field, words=words)


def test_router_port_equal_to_a_server_port_is_refused(tmp_path, capsys):
    base = yaml.safe_load((RECIPES / "tiny-cpu.yaml").read_text())

    def mutate(d):
        d["topology"]["router"]["host_placement"] = "deployment_head"
        d["topology"]["router"]["port"] = d["server"].get("port", 30000)

    err = _refused(capsys, "render", str(_recipe_file(tmp_path, mutate, base)), words=("both listen on",))
    assert "router" in err and "sglang-tiny-cpu-server" in err


def test_dp_multiplies_devices_unless_dp_attention(tmp_path):
    base = yaml.safe_load((RECIPES / "glm5-nvfp4-rtx6000-tp8.yaml").read_text())
    path = _recipe_file(tmp_path, lambda d: d["server"].update({"dp_size": 2, "enable_dp_attention": False}), base)
    with pytest.raises(SpecError) as err:
        catalogue.get_recipe(str(path))
    assert any("dp_size 2" in p.message and "16 devices per node" in p.message for p in err.value.problems)
    path = _recipe_file(tmp_path, lambda d: d["server"].update({"dp_size": 2, "enable_dp_attention": True}), base)
    catalogue.get_recipe(str(path))


def test_two_ranks_on_one_address_are_refused(tmp_path, capsys):
    hosts = [("n0", {**TP2_HOSTS[0][1]}), ("n1", {**TP2_HOSTS[1][1], "ssh_hostname": "10.0.0.10"})]
    _refused(
        capsys,
        "render",
        "tiny-cpu-tp2",
        "--inventory",
        str(_inventory_file(tmp_path, hosts)),
        field="n1.ssh_hostname",
        words=("10.0.0.10",),
    )


# --------------------------------------------------------------------------- loading


def test_yaml_bomb_duplicate_keys_and_non_utf8_are_clear_errors(tmp_path, capsys):
    bomb = tmp_path / "bomb.yaml"
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 800
    _refused(capsys, "render", str(bomb), words=("aliases expand",))
    dup = tmp_path / "dup.yaml"
    dup.write_text("id: a\nserver:\n  port: 1\n  port: 2\n")
    _refused(capsys, "render", str(dup), field="line 4", words=("duplicate key 'port'",))
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"id: caf\xe9\n")
    _refused(capsys, "render", str(bad), words=("not UTF-8",))
    big = tmp_path / "big.yaml"
    big.write_text("notes: [" + ",".join(["x"] * 600_000) + "]\n")
    _refused(capsys, "render", str(big), words=("larger than",))


@pytest.mark.parametrize(
    "text,words",
    [
        ("import sys\nsys.exit(0)\n", ("exited",)),
        ("raise RuntimeError('boom')\n", ("RuntimeError", "boom")),
        ("nodes = [('n0', {'hardware': 'cpu-lab', 'nic': 'host0\\nExecStartPre=/bin/sh'})]\n", ("n0.nic",)),
        ("nodes = [('n0', {'hardware': 'cpu-lab', 'ssh_hostname': '10.0.0.1\\nx'})]\n", ("n0.ssh_hostname",)),
        ("nodes = [('n0', {'hardware': 'cpu-lab', 'model_path': 'rel/path'})]\n", ("n0.model_path",)),
        ("nodes = [('n0', {'hardware': 'cpu-lab', 'lanch': False})]\n", ("did you mean 'launch'",)),
        ("nodes = [('n0', {'hardware': 'cpu-lab', 'health_poll_s': 'often'})]\n", ("n0.health_poll_s",)),
        ("nodes = [('n0', {'hardware': 'cpu-lab', 'pip_index_url': 'http://mirror/simple'})]\n", ("allow_http_index",)),
    ],
)
def test_bad_inventories_are_reported(tmp_path, capsys, text, words):
    inventory = _inventory_file(tmp_path, text=text)
    _refused(capsys, "render", "tiny-cpu", "--inventory", str(inventory), words=words)


def test_nic_none_is_absent_not_the_word_none(tmp_path, capsys):
    hosts = [("n0", {**TP2_HOSTS[0][1], "nic": None}), TP2_HOSTS[1]]
    err = _refused(
        capsys, "render", "tiny-cpu-tp2", "--inventory", str(_inventory_file(tmp_path, hosts)), field="n0.nic"
    )
    assert "=None" not in err


# --------------------------------------------------------------------------- host data model


def test_host_data_typos_and_types_fail_the_context_before_any_operation():
    from roles.context import build_context

    for data, field, fix in (
        ({"lanch": "false"}, "n0.lanch", "did you mean 'launch'"),
        ({"health_poll_s": "often"}, "n0.health_poll_s", "seconds between health probes"),
        ({"rendezvous": "perhaps"}, "n0.rendezvous", ""),
        ({"engine_restart_s": 0}, "n0.engine_restart_s", "(its RestartSec=)"),
        ({"engine_restart_s": "soon"}, "n0.engine_restart_s", "(its RestartSec=)"),
        ({"engine_restart_s": 3601}, "n0.engine_restart_s", "(its RestartSec=)"),
    ):
        hosts = [("n0", {**TP2_HOSTS[0][1], **data, "recipe": "tiny-cpu-tp2"}), TP2_HOSTS[1]]
        with pytest.raises(SpecError) as err:
            build_context("tiny", "n0", hosts, "inventories/x.py")
        (problem,) = err.value.problems
        assert problem.file == "inventories/x.py" and problem.field == field and fix in problem.fix


def test_host_data_from_the_command_line_is_typed_like_the_inventory():
    from roles.context import build_context

    # pyinfra turns --data launch=false into False and digits into ints; audit/status pass text: same result
    for launch in (False, "false", "no", "0"):
        hosts = [
            (
                "n0",
                {
                    **TP2_HOSTS[0][1],
                    "launch": launch,
                    "health_poll_s": "2.5",
                    "nvidia_driver_version": 580,
                    "_sudo": True,
                    "ssh_user": "ubuntu",
                    "ssh_known_hosts_file": "/k",
                    "recipe": "tiny-cpu-tp2",
                },
            ),
            (TP2_HOSTS[1][0], {**TP2_HOSTS[1][1], "recipe": "tiny-cpu-tp2"}),
        ]
        ctx = build_context("tiny", "n0", hosts)
        assert ctx.launch is False and ctx.host.health_poll_s == 2.5 and ctx.host.nvidia_driver_version == "580"


def test_schema_and_readme_agree_with_the_model(capsys):
    from ironserve.hostdata import HostData, markdown_table

    assert main(["schema", "--host-data"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert set(schema["properties"]) == set(HostData.model_fields)
    assert all(p.get("description") and p.get("role") for p in schema["properties"].values())
    readme = (Path(__file__).resolve().parents[1] / "docs" / "host-data.md").read_text()
    block = readme.split("<!-- host-data:begin -->\n", 1)[1].split("<!-- host-data:end -->", 1)[0]
    assert block == markdown_table(), "docs/host-data.md's table is stale: ironserve schema --host-data --markdown"


def _code(root: Path) -> list[Path]:
    return [
        *root.glob("roles/*.py"),
        *root.glob("deploys/*.py"),
        *root.glob("ironserve/*.py"),
        *root.glob("ironserve/audit/*.py"),
    ]


def test_every_key_the_code_reads_is_in_the_model():
    """ctx.host.KEY, host_data(h).KEY, an inventory host's host_data.KEY and DEFAULTS.KEY across the code."""
    from ironserve.hostdata import HostData

    root = Path(__file__).resolve().parents[1]
    typed = re.compile(r"(?:ctx\.host|host_data\(\w+\)|\.host_data|DEFAULTS)\.([a-z_][a-z0-9_]*)")
    read = set()
    for path in _code(root):
        read |= set(typed.findall(path.read_text()))
    assert {"nvidia_driver_version", "health_poll_s", "rollback", "nvlink_domain", "model_root"} <= read
    missing = {k for k in read if k not in HostData.model_fields}
    assert not missing, f"host data read but not in ironserve/hostdata.py: {sorted(missing)}"


def test_roles_render_and_audit_read_host_data_typed():
    """No raw read of one of ironserve's host-data keys (data.get("KEY"), data["KEY"]) in the roles, the deploys,
    render, the inventory hosts, the commands (cli, status) or the audit: they read the validated model (ctx.host, host_data(h), an inventory
    host's host_data), so a key is typed, defaulted and described in one place."""
    from ironserve.hostdata import HostData

    root = Path(__file__).resolve().parents[1]
    raw = re.compile(r"(?:\.get\(|\[)\s*f?[\"']([a-z_][a-z0-9_]*)[\"']")
    places = [
        *root.glob("roles/*.py"),
        *root.glob("deploys/*.py"),
        *root.glob("ironserve/audit/*.py"),
        root / "ironserve" / "render.py",
        root / "ironserve" / "inventory.py",
        root / "ironserve" / "cli.py",
        root / "ironserve" / "status.py",
    ]
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in places
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "data" in line and any(key in HostData.model_fields for key in raw.findall(line))
    ]
    assert found == []


# --------------------------------------------------------------------------- sinks


def test_env_file_sink_refuses_what_its_readers_would_read_differently():
    from ironserve.units import _env_line

    for bad in ("a\nB=c", " a", "a ", "a\\b", "'a'", '"a"', "a\rb"):
        with pytest.raises(ValueError) as err:
            _env_line("K", bad)
        assert bad not in str(err.value)  # values may be secrets: the message names the key only


def test_sysctl_sink_is_one_line_per_setting():
    from roles.host_tuning import sysctl_text

    with pytest.raises(ValueError):
        sysctl_text({"vm.swappiness": "0\nkernel.core_pattern=|/tmp/x"})
    assert "vm.swappiness = 0\n" in sysctl_text({"vm.swappiness": 0})


def test_unit_template_values_cannot_add_lines():
    from ironserve.units import _jinja

    template = _jinja().from_string("Description={{ value }}\n")
    with pytest.raises(ValueError):
        template.render(value="x\nExecStartPre=/bin/sh")


def test_bench_reads_the_key_from_the_env_file_as_data(tmp_path):
    from roles.bench import READ_KEY

    env = tmp_path / "unit.env"
    marker = tmp_path / "pwned"
    env.write_text(f"# managed\nIRONSERVE_API_KEY=$(touch {marker})`touch {marker}`k\n")
    out = subprocess.run(["python3", "-c", READ_KEY, str(env)], capture_output=True, text=True, check=True).stdout
    assert out == f"$(touch {marker})`touch {marker}`k\n" and not marker.exists()


def test_shard_names_from_a_checkpoint_are_inert(tmp_path):
    from roles.model_weights import ModelCheckpoint

    model = tmp_path / "m"
    model.mkdir()
    marker = tmp_path / "pwned"
    (model / "config.json").write_text("{}")
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": f"$(touch {marker}) *.safetensors"}})
    )
    out = subprocess.run(["bash", "-c", ModelCheckpoint().command(str(model))], capture_output=True, text=True).stdout
    assert f"missing=$(touch {marker}) *.safetensors" in out and not marker.exists()


# --------------------------------------------------------------------------- property test: the sinks' own readers


def _ensure_tool(tool: str, package: str) -> str:
    """The sinks' real readers; installed like the lab installs its tools (apt, as root) when missing."""
    if not shutil.which(tool):
        from ironserve_lab.system import apt_install

        apt_install([package], f"{tool}: tests/test_every_value_is_data.py reads rendered files with it")
    return shutil.which(tool)


class _SystemdEnvFile:
    """systemd's own EnvironmentFile= reader: load_env_file() of libsystemd-shared (what PID 1 links)."""

    def __init__(self):
        _ensure_tool("systemd-analyze", "systemd")
        libs = sorted(
            glob.glob("/usr/lib/*/systemd/libsystemd-shared-*.so")
            + glob.glob("/lib/systemd/libsystemd-shared-*.so")
            + glob.glob("/usr/lib/systemd/libsystemd-shared-*.so")
        )
        assert libs, "libsystemd-shared not found (package systemd)"
        self.fn = ctypes.CDLL(libs[-1]).load_env_file
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p))]
        self.fn.restype = ctypes.c_int

    def read(self, path: str) -> dict[str, str]:
        out = ctypes.POINTER(ctypes.c_char_p)()
        assert self.fn(None, path.encode(), ctypes.byref(out)) == 0
        env, i = {}, 0
        while out[i]:
            key, _, value = out[i].decode().partition("=")
            env[key] = value
            i += 1
        return env


class _DockerEnvFile:
    """docker's own --env-file reader: the docker CLI parses the file and posts the result to a daemon socket;
    a stand-in daemon on a private unix socket records the container's Env and answers like dockerd."""

    def __init__(self, sock: str):
        self.docker = _ensure_tool("docker", "docker.io")
        self.sock, self.envs = sock, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self, code, body):
                self.send_response(code)
                self.send_header("Api-Version", "1.41")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self):
                self._reply(200, b"")

            def do_GET(self):
                self._reply(200, b"OK")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if "/containers/create" in self.path:
                    outer.envs.append(json.loads(body).get("Env") or [])
                self._reply(201, b'{"Id":"0123456789ab","Warnings":[]}')

            def log_message(self, *args):
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

            def get_request(self):
                request, _ = super().get_request()
                return request, ("stand-in", 0)

            def handle_error(self, request, client_address):
                pass  # the CLI hangs up once it has its answer

        self.server = Server(sock, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def read(self, path: str) -> dict[str, str]:
        self.envs.clear()
        run = subprocess.run(
            [self.docker, "create", "--env-file", path, "ironserve/stand-in"],
            capture_output=True,
            text=True,
            env={**os.environ, "DOCKER_HOST": f"unix://{self.sock}", "DOCKER_CONFIG": os.path.dirname(self.sock)},
            timeout=30,
        )
        assert run.returncode == 0 and self.envs, run.stderr
        return dict(item.partition("=")[::2] for item in self.envs[-1])

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def readers():
    with tempfile.TemporaryDirectory() as tmp:
        docker = _DockerEnvFile(f"{tmp}/docker.sock")
        try:
            yield {"systemd": _SystemdEnvFile(), "docker": docker, "tmp": Path(tmp)}
        finally:
            docker.close()


def _posix_words(text: str) -> list[str]:
    """Split a line as a POSIX shell does, without expanding anything (systemd's dump quotes like a shell:
    inside double quotes a backslash escapes $ ` " and itself; shlex only knows the last two)."""
    words, word, i, started = [], [], 0, False
    while i < len(text):
        c = text[i]
        if c in " \t":
            if started:
                words.append("".join(word))
            word, started = [], False
        elif c == "'":
            end = text.index("'", i + 1)
            word.append(text[i + 1 : end])
            i, started = end, True
        elif c == '"':
            i, started = i + 1, True
            while text[i] != '"':
                if text[i] == "\\" and text[i + 1] in '$`"\\':
                    i += 1
                word.append(text[i])
                i += 1
        elif c == "\\":
            word.append(text[i + 1])
            i, started = i + 1, True
        else:
            word.append(c)
            started = True
        i += 1
    if started:
        words.append("".join(word))
    return words


def _systemd_exec_starts(unit_path: Path) -> tuple[dict[str, list[str]], str]:
    """The command lines systemd's own unit parser made of the file: {"ExecStart": argv, ...} and its warnings."""
    run = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "--generators=no", str(unit_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "debug"},
        timeout=60,
    )
    commands, current = {}, None
    for line in run.stdout.splitlines():
        line = line.strip()
        if line.startswith("-> Exec"):
            current = line[3:].rstrip(":")
        elif line.startswith("Command Line: ") and current:
            # systemd prints the stored argv shell-quoted; `$$` becomes `$` when it runs (variables expanded then)
            words = _posix_words(line[len("Command Line: ") :])
            for word in words:
                assert not re.search(r"(?<!\$)\$(\$\$)*(?!\$)", word), f"systemd would expand a variable in {word!r}"
            commands.setdefault(current, [w.replace("$$", "$") for w in words])
            current = None
    # parse warnings name the file and line ("x.service:22: Unknown key ..."); the line number is kept out so
    # that the same warning on the same directive compares equal
    warnings = sorted(
        re.sub(r"^.*?" + re.escape(unit_path.name) + r":[0-9]+: ", "", line)
        for line in (run.stdout + run.stderr).splitlines()
        if re.search(re.escape(unit_path.name) + r":[0-9]+: ", line)
    )
    return commands, warnings


def _directives(unit_text: str) -> list[str]:
    return [line.split("=", 1)[0] for line in unit_text.splitlines() if line and not line.startswith("#")]


BASH_STUBS = r"""
__ran=0
__record() { printf '%s\0' "$@" > "$OUT/$__ran.argv"; env -0 > "$OUT/$__ran.env"; __ran=$((__ran + 1)); }
python3() { __record python3 "$@"; }
sglang() { __record sglang "$@"; }
source() { :; }
"""


def _bash_runs(script: str, out: Path) -> list[tuple[list[str], dict[str, str]]]:
    """Run the rendered shell in bash with the engine commands stubbed: the argv and env each one received."""
    out.mkdir(exist_ok=True)
    for old in out.glob("*"):
        old.unlink()
    run = subprocess.run(
        ["bash", "-e", "-c", BASH_STUBS + script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "OUT": str(out)},
    )
    assert run.returncode == 0, run.stderr
    runs = []
    for i in range(len(list(out.glob("*.argv")))):
        argv = (out / f"{i}.argv").read_bytes().split(b"\0")[:-1]
        env = dict(e.decode().partition("=")[::2] for e in (out / f"{i}.env").read_bytes().split(b"\0")[:-1])
        runs.append(([a.decode() for a in argv], env))
    return runs


def _render_all(data: dict, hosts: list[tuple[str, dict]]):
    """Everything the sinks get from one recipe + inventory, or SpecError."""
    from ironserve.hostdata import validate_inventory_data
    from ironserve.inventory import InventoryHost
    from ironserve.render import render, shell_script
    from ironserve.spec import effective_tuning
    from ironserve.units import env_text, exec_argv, unit_files
    from roles.host_tuning import sysctl_text

    recipe = catalogue.parse_recipe(data, "fuzz")
    catalogue.check_recipe(recipe, catalogue.hardware_profiles(), "fuzz")
    validate_inventory_data(hosts, "inventory.py")
    rendered = render(recipe, [InventoryHost(n, d) for n, d in hosts], "inventory.py")
    tuning = effective_tuning(recipe, catalogue.hardware_profiles()[recipe.hardware[0]])
    units = [(p, unit_files(recipe, p, tuning), exec_argv(recipe, p)) for p in rendered.processes]
    return (
        rendered,
        units,
        shell_script(rendered),
        sysctl_text(dict(tuning.sysctls)),
        [env_text(p) for p in rendered.processes],
        tuning,
    )


def _set(path: str):
    def mutate(data: dict, hosts: list, value: str) -> None:
        *parents, last = path.split("/")
        node = data
        for part in parents:
            node = node.setdefault(part, {}) if not part.isdigit() else node[int(part)]
        node[int(last) if last.isdigit() else last] = value

    return mutate


def _host(key: str):
    def mutate(data: dict, hosts: list, value: str) -> None:
        hosts[0][1][key] = value

    return mutate


def _env_key(data: dict, hosts: list, value: str) -> None:
    data["env"][value] = "1"


def _sysctl(data: dict, hosts: list, value: str) -> None:
    data["tuning"] = {"sysctls": {"vm.swappiness": value}}


def _docker(data: dict) -> dict:
    data = copy.deepcopy(data)
    data["runtime"] = {
        "kind": "docker",
        "image": "lmsysorg/sglang:v0.5.9",
        "run": {"gpus": None, "volumes": ["/srv/cache:/root/.cache"]},
    }
    return data


BASE = copy.deepcopy(TP2)
BASE["env_unset"] = ["http_proxy"]
BASE["runtime"]["source_env"] = ["/opt/vendor/set_env.sh"]
FIELDS = {
    # recipe strings
    "engine.sglang": (_set("engine/sglang"), "0.5.23", BASE),
    "env_unset[0]": (_set("env_unset/0"), "http_proxy", BASE),
    "server.extra_args[1]": (_set("server/extra_args/1"), "pytorch", BASE),
    "server.served_model_name": (_set("server/served_model_name"), "tiny", BASE),
    "server.attention_backend": (_set("server/attention_backend"), "torch_native", BASE),
    "server.host": (_set("server/host"), "0.0.0.0", BASE),
    "server.model_path": (_set("server/model_path"), "/srv/models/tiny", BASE),
    "env value": (_set("env/SGLANG_CPU_OMP_THREADS_BIND"), "0-1|0-1", BASE),
    "env name": (_env_key, "SGLANG_X", BASE),
    "model.path": (_set("model/path"), "/var/lib/ironserve/models/tiny-llama", BASE),
    "runtime.source_env[0]": (_set("runtime/source_env/0"), "/opt/vendor/set_env.sh", BASE),
    "tuning.sysctls value": (_sysctl, "10", BASE),
    "docker runtime.image": (_set("runtime/image"), "lmsysorg/sglang:v0.5.9", _docker(BASE)),
    "docker runtime.run.volumes[0]": (_set("runtime/run/volumes/0"), "/srv/cache:/root/.cache", _docker(BASE)),
    "docker env value": (_set("env/SGLANG_CPU_OMP_THREADS_BIND"), "0-1|0-1", _docker(BASE)),
    # host data strings
    "host nic": (_host("nic"), "host0", BASE),
    "host ssh_hostname": (_host("ssh_hostname"), "10.0.0.10", BASE),
    "host model_path": (_host("model_path"), "/srv/models/tiny", BASE),
    "host model_root": (_host("model_root"), "/srv/models", _docker(BASE)),
}
# bounded for CI (about a minute for all fields on 2 cores); raise it locally for a deeper search
EXAMPLES = int(os.environ.get("IRONSERVE_PROPERTY_EXAMPLES", "12"))


def _check_sinks(readers, data: dict, hosts: list, baseline) -> str:
    """'rejected' or 'rendered'; an assertion error when a sink would read something other than intended."""
    try:
        rendered, units, script, sysctls, envs, tuning = _render_all(data, hosts)
    except SpecError as err:
        assert err.problems and all(p.file and p.fix for p in err.problems)
        return "rejected"
    tmp: Path = readers["tmp"]
    for (proc, files, argv), (_, base_files, _) in zip(units, baseline[1]):
        # systemd's unit parser: the same directives and warnings as with a harmless value (this systemd may not
        # know every key), and ExecStart exactly the intended argv
        assert _directives(files.unit_text) == _directives(base_files.unit_text), files.unit_text
        unit_path = tmp / files.unit_name
        unit_path.write_text(files.unit_text)
        commands, warnings = _systemd_exec_starts(unit_path)
        assert warnings == baseline[6][files.unit_name], warnings
        assert commands["ExecStart"] == argv
        # the env file: systemd's and docker's readers both see exactly the process's env
        env_path = tmp / "unit.env"
        env_path.write_text(files.env_text)
        assert readers["systemd"].read(str(env_path)) == proc.env
        if files.env_text not in baseline[4]:
            assert readers["docker"].read(str(env_path)) == proc.env
    # the shell block: bash hands each engine command exactly its argv and env
    runs = _bash_runs(script, tmp / "bash")
    assert len(runs) == len(rendered.processes)
    for (argv, env), proc in zip(runs, rendered.processes):
        assert argv == proc.argv
        assert {k: env.get(k) for k in proc.env} == proc.env
        assert not any(name in env for name in proc.env_unset)
    # the sysctl file: one `key = value` line per setting
    settings = dict(line.split(" = ", 1) for line in sysctls.splitlines() if line and not line.startswith("#"))
    assert settings == {k: str(v) for k, v in tuning.sysctls.items()}
    return "rendered"


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

# pieces the sinks treat specially: line breaks, quotes, escapes, shell metacharacters, systemd specifiers and
# variables, env-file comment and quote starts, C1 controls and Unicode line separators
_PRINTABLE = list(" \\\"'$%;&|`(){}<>*?#=:,@!~^-./_aZ09é") + ["%n", "%%", "$$", "${X}", "$(id)", "\\\\", "--port"]
PRINTABLE = st.lists(st.sampled_from(_PRINTABLE), max_size=8).map("".join)
NASTY = st.lists(
    st.sampled_from(_PRINTABLE + ["\n", "\r", "\t", "\x00", "\x7f", "\x85", "\u2028", "\\\n"]), max_size=8
).map("".join)


@pytest.mark.parametrize("field", list(FIELDS))
def test_every_string_field_is_refused_or_reaches_its_sinks_intact(readers, field):
    mutate, harmless, base = FIELDS[field]
    hosts = copy.deepcopy(TP2_HOSTS)
    baseline_data = copy.deepcopy(base)
    mutate(baseline_data, hosts, harmless)
    baseline = _render_all(baseline_data, hosts)
    warnings = {}
    for _, files, _ in baseline[1]:
        (readers["tmp"] / files.unit_name).write_text(files.unit_text)
        warnings[files.unit_name] = _systemd_exec_starts(readers["tmp"] / files.unit_name)[1]
    baseline = (*baseline, warnings)
    outcomes = []

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.example(harmless + "\nExecStartPre=/bin/sh -c id")  # a directive injection: always refused
    @hypothesis.given(
        st.one_of(
            PRINTABLE.map(lambda t: harmless + t),
            PRINTABLE,
            NASTY.map(lambda t: t + harmless),
            PRINTABLE.map(lambda t: t + harmless),
            st.text(max_size=12),
        )
    )
    def check(value):
        data, inventory = copy.deepcopy(base), copy.deepcopy(TP2_HOSTS)
        mutate(data, inventory, value)
        outcomes.append(_check_sinks(readers, data, inventory, baseline))

    check()
    assert "rejected" in outcomes and "rendered" in outcomes, outcomes
