"""What ironserve/units.py writes, word for word: the docker run line of a unit with every run option set (the
flags docker reads, in order), the uv and router argvs, the API key launcher, the weights' mount, a unit's
limits, user, groups, low ports, backoff and guard lines, the rank guard's config as the guard reads it, and the
venv, JIT and router venv paths. Each expected value is written out here, not computed the way units.py does."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import pytest
from jinja2 import UndefinedError

from ironserve import catalogue, units
from ironserve.inventory import InventoryHost
from ironserve.render import render
from ironserve.spec import HostTuning, Limits, UvRuntime

KEY = "/usr/local/lib/ironserve/ironserve-exec"
WEIGHTS = "/var/lib/ironserve/models/tiny-llama"
UNIT = "sglang-tiny-cpu-docker-server"


def docker_recipe(runtime: dict | None = None, **run):
    """tiny-cpu-docker, its image pinned by digest (no patches), with the given run options."""
    recipe = catalogue.get_recipe("tiny-cpu-docker")
    rt = recipe.runtime
    changed = rt.model_copy(
        update={"patches": [], "digest": "sha256:0123456789ab" + "c" * 52, "run": rt.run.model_copy(update=run)}
    )
    return recipe.model_copy(update={"runtime": changed.model_copy(update=runtime or {})})


EVERY_OPTION = {
    "gpus": '"device=0,1"',
    "privileged": True,
    "shm_size": "2g",
    "cpuset_cpus": "0-7",
    "ulimits": {"memlock": "-1", "stack": "67108864"},
    "volumes": ["/models:/models:ro", "/cache:/root/.cache"],
    "devices": ["/dev/infiniband"],
    "env_files": ["/etc/site.env"],
    "extra_options": ["--cap-add=IPC_LOCK"],
}
IMAGE = "ironserve-lab/sglang-cpu@sha256:0123456789ab" + "c" * 52
HEAD = ["/usr/bin/docker", "run", "--rm", "--name", UNIT, "--env-file", f"/etc/ironserve/{UNIT}.env"]
OPTIONS = [
    "--ipc=host",
    "--network=host",
    "--privileged",
    "--shm-size",
    "2g",
    "--ulimit",
    "memlock=-1",
    "--ulimit",
    "stack=67108864",
    "--cpuset-cpus",
    "0-7",
    "-v",
    "/models:/models:ro",
    "-v",
    "/cache:/root/.cache",
    "-v",
    f"{WEIGHTS}:{WEIGHTS}:ro",  # not under a volume: mounted at the same path, read-only
    "--device",
    "/dev/infiniband",
    "--env-file",
    "/etc/site.env",
    "--cap-add=IPC_LOCK",
]


def test_a_docker_unit_runs_every_run_option_docker_reads_in_order():
    recipe = docker_recipe(**EVERY_OPTION)
    proc = render(recipe).processes[0]
    cdi = ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]  # no toolkit version: CDI's
    assert units.exec_argv(recipe, proc) == HEAD + cdi + OPTIONS + [IMAGE, *proc.argv]
    # an older container toolkit: docker's own --gpus
    old = dataclasses.replace(proc, gpu_access="dev-char")
    assert units.exec_argv(recipe, old) == HEAD + ["--gpus", '"device=0,1"'] + OPTIONS + [IMAGE, *proc.argv]
    # keyed: the launcher mounted read-only, the engine started through it
    keyed = HEAD + cdi + OPTIONS + ["-v", f"{KEY}:{KEY}:ro", IMAGE, "python3", KEY, "-m", "sglang.launch_server"]
    assert units.exec_argv(recipe, proc, api_key=True) == keyed + proc.engine_args
    assert units.container_command(recipe, proc) == proc.argv
    assert units.container_command(recipe, proc, api_key=True) == ["python3", KEY, "-m", "sglang.launch_server"] + (
        proc.engine_args
    )


def test_a_docker_unit_without_options_runs_only_what_docker_needs():
    recipe = docker_recipe(ipc_host=False, network_host=False, gpus=None, shm_size=None, ulimits={})
    proc = render(recipe).processes[0]
    assert units.exec_argv(recipe, proc) == HEAD + ["-v", f"{WEIGHTS}:{WEIGHTS}:ro", IMAGE, *proc.argv]


@pytest.mark.parametrize(
    "volumes, mounted",
    [
        (["/var/lib/ironserve/models:/var/lib/ironserve/models:ro"], True),
        ([f"{WEIGHTS}:{WEIGHTS}"], True),
        (["/var/lib/ironserve/models/:/var/lib/ironserve/models/"], True),
        (["/var/lib/ironserve/models:/models:ro"], False),  # elsewhere in the container
        (["/var/lib/ironserve/mod:/var/lib/ironserve/mod"], False),  # a name's prefix is not its parent
        (["/data:/data", "/var/lib/ironserve:/var/lib/ironserve:ro"], True),
    ],
)
def test_the_weights_are_mounted_unless_a_volume_shows_them_at_the_same_path(volumes, mounted):
    recipe = docker_recipe(ipc_host=False, network_host=False, gpus=None, shm_size=None, ulimits={}, volumes=volumes)
    proc = render(recipe).processes[0]
    own = ["-v", f"{WEIGHTS}:{WEIGHTS}:ro"]
    volume_words = [w for v in volumes for w in ("-v", v)]
    assert units.exec_argv(recipe, proc) == HEAD + volume_words + ([] if mounted else own) + [IMAGE, *proc.argv]


@pytest.mark.parametrize(
    "model_path, mount",
    [
        ("/srv/modelX/", ["-v", "/srv/modelX:/srv/modelX:ro"]),  # one path, whatever its last letter
        ("meta-llama/Llama-3.1-8B-Instruct", []),  # a hub id: downloaded inside the container, nothing to mount
        (None, []),
    ],
)
def test_only_weights_on_the_host_are_mounted_once_at_their_path(model_path, mount):
    recipe = docker_recipe(ipc_host=False, network_host=False, gpus=None, shm_size=None, ulimits={})
    proc = dataclasses.replace(render(recipe).processes[0], model_path=model_path)
    assert units.exec_argv(recipe, proc) == HEAD + mount + [IMAGE, *proc.argv]
    dataX = docker_recipe(
        ipc_host=False, network_host=False, gpus=None, shm_size=None, ulimits={}, volumes=["/dataX:/dataX"]
    )
    proc = dataclasses.replace(proc, model_path="/dataX/m")
    assert units.exec_argv(dataX, proc) == HEAD + ["-v", "/dataX:/dataX", IMAGE, *proc.argv]


def test_a_runtimes_digest_names_its_venv_alike_in_every_release():
    """The venv's name (and a uv lock's runtime) comes from this digest: a new serialization would rename every
    venv and refuse every uv lock at the next deploy after an upgrade."""
    runtime = UvRuntime(kind="uv", python="3.11", packages=["sglang==0.5.9", "torch==2.8.0"])
    # a field added to the runtime section changes it as well: update this value knowingly
    assert units.runtime_digest(runtime) == "d299292e8cd4823304c31cb490ab25e447b794c0670ca239f5ec7f4d6077f5a2"


def test_a_docker_entrypoint_replaces_the_argvs_first_words():
    recipe = docker_recipe(
        ipc_host=False, network_host=False, gpus=None, shm_size=None, ulimits={}, entrypoint="python3"
    )
    proc = render(recipe).processes[0]
    mount = ["-v", f"{WEIGHTS}:{WEIGHTS}:ro"]
    assert units.exec_argv(recipe, proc) == HEAD + mount + ["--entrypoint", "python3", IMAGE, *proc.argv[1:]]
    # an entrypoint the argv does not start with is not used
    other = docker_recipe(ipc_host=False, network_host=False, gpus=None, shm_size=None, ulimits={}, entrypoint="sglang")
    assert units.exec_argv(other, proc) == HEAD + mount + [IMAGE, *proc.argv]


def test_a_docker_unit_sources_the_runtimes_env_scripts_in_bash():
    recipe = docker_recipe(
        {"source_env": ["/usr/local/Ascend/set_env.sh", "/opt/x y/env.sh"]},
        ipc_host=False,
        network_host=False,
        gpus=None,
        shm_size=None,
        ulimits={},
    )
    proc = render(recipe).processes[0]
    script = "source /usr/local/Ascend/set_env.sh; source '/opt/x y/env.sh'; exec \"$@\""
    assert units.exec_argv(recipe, proc) == HEAD + ["-v", f"{WEIGHTS}:{WEIGHTS}:ro"] + [
        "--entrypoint",
        "/bin/bash",
        IMAGE,
        "-c",
        script,
        UNIT,
        *proc.argv,
    ]


def test_uv_units_run_the_venvs_python_sourcing_their_env_scripts_first():
    recipe = catalogue.get_recipe("glm5.1-w4a8-a3-pd-mixed-16")
    proc = render(recipe).processes[0]
    venv = units.venv_path(recipe)
    script = "source /usr/local/Ascend/ascend-toolkit/set_env.sh; source /usr/local/Ascend/nnal/atb/set_env.sh; "
    assert units.exec_argv(recipe, proc) == [
        "/bin/bash",
        "-c",
        script + 'exec "$@"',
        proc.unit,
        f"{venv}/bin/python3",
        *proc.argv[1:],
    ]
    tiny = catalogue.get_recipe("tiny-cpu")
    proc = render(tiny).processes[0]
    assert units.exec_argv(tiny, proc) == [f"{units.venv_path(tiny)}/bin/python3", *proc.argv[1:]]


def test_a_router_with_its_own_venv_runs_from_it_outside_the_engines_image():
    recipe = catalogue.get_recipe("glm5-nvfp4-gb200-disagg")
    rendered = render(recipe)
    (router,) = [p for p in rendered.processes if p.role == "router"]
    engine = next(p for p in rendered.processes if p.role != "router")
    assert units.exec_argv(recipe, router) == ["/opt/ironserve/venvs/sglang-router-0.3.2/bin/python3", *router.argv[1:]]
    assert not units.in_container(recipe, router) and units.runs_as_user(recipe, router)
    assert units.in_container(recipe, engine) and not units.runs_as_user(recipe, engine)


def test_the_key_launcher_takes_python_modules_and_the_sglang_command():
    serve = SimpleNamespace(launcher=["sglang", "serve"], engine_args=["--model-path", "/m"])
    assert units.with_key_launcher(serve) == ["python3", KEY, "-e", "sglang", "serve", "--model-path", "/m"]
    module = SimpleNamespace(launcher=["python3", "-m", "sglang.launch_server"], engine_args=["--port", "1"])
    assert units.with_key_launcher(module) == ["python3", KEY, "-m", "sglang.launch_server", "--port", "1"]
    for launcher in ([], ["bash", "-c", "x"], ["python3", "-u", "x"], ["python3", "-m"]):
        with pytest.raises(ValueError, match=re.escape(f"cannot pass an API key to {launcher}: not python3 -m")):
            units.with_key_launcher(SimpleNamespace(launcher=launcher, engine_args=[]))


def _unit(recipe, proc, tuning=None, **update) -> list[str]:
    return units.unit_files(recipe, dataclasses.replace(proc, **update), tuning or HostTuning()).unit_text.splitlines()


def test_a_units_env_file_limits_and_backoff_lines():
    recipe = catalogue.get_recipe("tiny-cpu").model_copy(update={"health_timeout_s": 901})
    proc = render(recipe).processes[0]
    files = units.unit_files(recipe, proc, HostTuning(limits=Limits(memlock=65536, stack=8388608, nofile=4096)))
    lines = files.unit_text.splitlines()
    assert files.env_path == f"/etc/ironserve/{proc.unit}.env" and f"EnvironmentFile={files.env_path}" in lines
    assert ["LimitMEMLOCK=65536", "LimitSTACK=8388608", "LimitNOFILE=4096"] == [
        line for line in lines if line.startswith("Limit")
    ]
    # the backoff waits at most half the start budget, in whole seconds
    assert f"ExecStartPre=+/usr/bin/python3 -I {units.BACKOFF} wait {proc.unit} 450" in lines
    unlimited = units.unit_files(recipe, proc, HostTuning(limits=Limits(memlock="unlimited", stack=None, nofile=None)))
    assert [line for line in unlimited.unit_text.splitlines() if line.startswith("Limit")] == [
        "LimitMEMLOCK=infinity",
        "LimitSTACK=infinity",
        "LimitNOFILE=infinity",
    ]


def _restart_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("RestartSec=")]


def test_an_engine_or_router_unit_restarts_after_its_hosts_engine_restart_s_a_guard_after_5():
    tiny = catalogue.get_recipe("tiny-cpu")
    hosts = [
        InventoryHost("n0", {"engine_restart_s": 7}),
        InventoryHost("n1", {}),
        InventoryHost("r0", {"ironserve_role": "router", "engine_restart_s": "9"}),
    ]
    texts = {p.host: units.unit_files(tiny, p, HostTuning()).unit_text for p in render(tiny, hosts).processes}
    assert {host: _restart_lines(text) for host, text in texts.items()} == {
        "n0": ["RestartSec=7"],
        "n1": ["RestartSec=15"],
        "r0": ["RestartSec=9"],
    }
    # the default renders the unit as before the key was host data
    assert _restart_lines(units.unit_files(tiny, render(tiny).processes[0], HostTuning()).unit_text) == [
        "RestartSec=15"
    ]
    tp2 = catalogue.get_recipe("tiny-cpu-tp2")
    rendered = render(tp2, [InventoryHost(n, {"nic": "host0", "engine_restart_s": 7}) for n in ("n0", "n1")])
    for proc in rendered.processes:
        assert _restart_lines(units.unit_files(tp2, proc, HostTuning()).unit_text) == ["RestartSec=7"]
        guard = units.rank_guard_files(tp2, proc, rendered.rank_group(proc)).unit_text
        assert _restart_lines(guard) == ["RestartSec=5"]


@pytest.mark.parametrize("port, binds_low", [(80, True), (1023, True), (1024, False), (30000, False)])
def test_only_a_port_below_1024_gets_the_capability_to_bind_it(port, binds_low):
    recipe = catalogue.get_recipe("tiny-cpu")
    lines = _unit(recipe, render(recipe).processes[0], port=port)
    assert ("AmbientCapabilities=CAP_NET_BIND_SERVICE" in lines) == binds_low


def test_a_rank_wants_its_guard_a_single_engine_none():
    recipe = catalogue.get_recipe("tiny-cpu-tp2")
    proc = render(recipe).processes[0]
    assert "Wants=sglang-tiny-cpu-tp2-server-rank-guard.service" in _unit(recipe, proc)
    single = catalogue.get_recipe("tiny-cpu")
    assert not [line for line in _unit(single, render(single).processes[0]) if "rank-guard" in line]


def test_the_engine_user_and_its_device_groups():
    tiny = catalogue.get_recipe("tiny-cpu")
    lines = _unit(tiny, render(tiny).processes[0])
    assert "User=ironserve-engine" in lines and not [line for line in lines if line.startswith("SupplementaryGroups")]
    docker = docker_recipe()
    assert not [line for line in _unit(docker, render(docker).processes[0]) if line.startswith(("User=", "Group="))]
    for device, groups in (
        ("npu", "HwHiAiUser"),
        ("cuda", "video render"),
        (None, "video render"),
        ("xpu", "video render"),
    ):
        recipe = tiny.model_copy(update={"server": tiny.server.model_copy(update={"device": device})})
        assert f"SupplementaryGroups={groups}" in _unit(recipe, render(recipe).processes[0]), device


def test_unit_templates_lay_out_one_directive_a_line_and_refuse_undefined_names():
    recipe = catalogue.get_recipe("tiny-cpu-tp2")
    rendered = render(recipe)
    proc = rendered.processes[1]
    guard = units.rank_guard_files(recipe, proc, rendered.rank_group(proc)).unit_text
    for text in (units.unit_files(recipe, proc, HostTuning()).unit_text, guard):
        lines = text.splitlines()
        assert text.endswith("\n") and not text.endswith("\n\n")
        # block tags leave nothing behind: no indented or blank line but the one before a section
        assert all(line == line.lstrip() for line in lines), [line for line in lines if line != line.lstrip()]
        blanks = [i for i, line in enumerate(lines) if not line]
        assert blanks and all(lines[i + 1].startswith("[") for i in blanks), blanks
    with pytest.raises(UndefinedError):
        units._jinja().from_string("Description={{ no_such_value }}\n").render()


def test_a_unit_value_with_a_control_character_is_refused_naming_its_first_40_characters():
    value = "x" * 45 + "\nExecStartPre=/bin/sh"
    with pytest.raises(ValueError) as err:
        units._one_line(value)
    assert str(err.value) == f"a unit file value has a control character U+000A at position 45: {'x' * 40!r}"


def test_the_rank_guards_config_holds_what_the_guard_reads():
    recipe = catalogue.get_recipe("tiny-cpu-tp2")
    rendered = render(recipe)
    rank0, rank1 = rendered.processes[:2]
    common = {
        "unit": "sglang-tiny-cpu-tp2-server",
        "world": 2,
        "guard_port": 29600,
        "leader": "node0",
        "members": ["node0", "node1"],
        "secret_file": "/etc/ironserve/sglang-tiny-cpu-tp2-server.rank-group.key",
        "health_url": "http://127.0.0.1:30000/health",
        "poll_s": 5,
        "failure_threshold": 3,
        "formation_timeout_s": recipe.health_timeout_s + 180,
        "backoff_base_s": 15,
        "backoff_max_s": 600,
        "backoff_window_s": 1800,
        "rendezvous": "node0:29500",
    }
    guard0 = units.rank_guard_files(recipe, rank0, rendered.rank_group(rank0))
    guard1 = units.rank_guard_files(recipe, rank1, rendered.rank_group(rank1))
    assert json.loads(guard0.config_text) == {**common, "rank": 0, "bind": "node0"}
    assert json.loads(guard1.config_text) == {**common, "rank": 1, "source": "node1"}
    assert guard1.secret_path == common["secret_file"]
    assert guard1.config_path == "/etc/ironserve/sglang-tiny-cpu-tp2-server.rank-group.json"
    assert guard1.unit_name == "sglang-tiny-cpu-tp2-server-rank-guard.service"
    assert (
        "Description=ironserve rank guard of sglang-tiny-cpu-tp2-server (node rank 1 of 2): restarts the group as a "
        "whole" in guard1.unit_text.splitlines()
    )
    # a group without torch's rendezvous address (none renders one today) has no rendezvous for followers to keep
    alone = dataclasses.replace(rank1, dist_init_addr=None)
    assert "rendezvous" not in json.loads(units.rank_guard_files(recipe, alone, rendered.rank_group(rank1)).config_text)


def test_the_rank_guards_config_is_written_alike_in_every_release():
    """The deploy stages the guard's config and makes it live with the group's other files, and the audit compares
    it with the host's copy byte for byte: a new layout or key order would change the file on every host of a
    multi-node group at the first deploy after an upgrade (a new configuration for the group to start from) and
    show as drift until then. Keys sorted, two spaces an indent level, one newline at the end."""
    recipe = catalogue.get_recipe("tiny-cpu-tp2")
    rendered = render(recipe)
    rank1 = rendered.processes[1]
    config = units.rank_guard_files(recipe, rank1, rendered.rank_group(rank1)).config_text
    assert config == (
        "{\n"
        '  "backoff_base_s": 15,\n'
        '  "backoff_max_s": 600,\n'
        '  "backoff_window_s": 1800,\n'
        '  "failure_threshold": 3,\n'
        f'  "formation_timeout_s": {recipe.health_timeout_s + 180},\n'
        '  "guard_port": 29600,\n'
        '  "health_url": "http://127.0.0.1:30000/health",\n'
        '  "leader": "node0",\n'
        '  "members": [\n'
        '    "node0",\n'
        '    "node1"\n'
        "  ],\n"
        '  "poll_s": 5,\n'
        '  "rank": 1,\n'
        '  "rendezvous": "node0:29500",\n'
        '  "secret_file": "/etc/ironserve/sglang-tiny-cpu-tp2-server.rank-group.key",\n'
        '  "source": "node1",\n'
        '  "unit": "sglang-tiny-cpu-tp2-server",\n'
        '  "world": 2\n'
        "}\n"
    )


def test_venv_jit_and_router_venv_paths():
    tiny = catalogue.get_recipe("tiny-cpu")
    assert re.fullmatch(r"/opt/ironserve/venvs/runtime-[0-9a-f]{12}", units.venv_path(tiny)), units.venv_path(tiny)
    assert units.jit_dir(tiny) == "/var/cache/ironserve/jit/tiny-cpu/0.5.23"
    # a docker runtime pinned by digest: the digest's first 12 hex digits (a new image, a new JIT directory)
    assert units.jit_dir(docker_recipe()) == "/var/cache/ironserve/jit/tiny-cpu-docker/0123456789ab"
    assert units.jit_cache_directory(docker_recipe()) == "ironserve/jit/tiny-cpu-docker/0123456789ab"
    gb200 = catalogue.get_recipe("glm5-nvfp4-gb200-disagg")
    assert units.router_venv(gb200) == "/opt/ironserve/venvs/sglang-router-0.3.2"
    assert (
        units.router_venv(gb200.model_copy(update={"engine": gb200.engine.model_copy(update={"router": None})})) is None
    )
    no_router = gb200.model_copy(update={"topology": gb200.topology.model_copy(update={"router": None})})
    assert units.router_venv(no_router) is None
    # beside a uv runtime, on its Python (whether the runtime pins sglang-router too or not)
    a3 = catalogue.get_recipe("glm5.1-w4a8-a3-1p1d-32-16k")
    packages = [p for p in a3.runtime.packages if not p.lower().startswith("sglang-router")]
    for pins in (packages, [*packages, "sglang_router==" + a3.engine.router]):
        recipe = a3.model_copy(update={"runtime": a3.runtime.model_copy(update={"packages": pins})})
        assert units.router_venv(recipe) == f"/opt/ironserve/venvs/sglang-router-{a3.engine.router}-py3.11", pins


@pytest.mark.parametrize(
    "model_path, protect",
    [
        ("/home/u/models/m/", "read-only"),
        ("/home", "read-only"),
        ("/root/m", "read-only"),
        ("/run/user/0/m", "read-only"),
        ("/homes/m", "yes"),
        ("/homeX", "yes"),
        ("/var/lib/ironserve/models/m", "yes"),
        (None, "yes"),
    ],
)
def test_homes_are_hidden_unless_the_weights_live_in_one(model_path, protect):
    assert units.protect_home(SimpleNamespace(model_path=model_path)) == protect


def test_the_systemd_bundle_names_each_hosts_files_in_order():
    recipe = catalogue.get_recipe("tiny-cpu-tp2")
    rendered = render(recipe)
    bundle = units.systemd_bundle(rendered, HostTuning())
    heads = [line for line in bundle.splitlines() if line.startswith("# ===== host ")]
    unit, env = "sglang-tiny-cpu-tp2-server", "/etc/ironserve/sglang-tiny-cpu-tp2-server"
    assert heads == [
        line
        for host in ("node0", "node1")
        for line in (
            f"# ===== host {host}: /etc/systemd/system/{unit}.service",
            f"# ===== host {host}: {env}.env (mode 0600)",
            f"# ===== host {host}: /etc/systemd/system/{unit}-rank-guard.service",
            f"# ===== host {host}: {env}.rank-group.json",
        )
    ]
    proc = rendered.processes[1]
    files = units.unit_files(recipe, proc, HostTuning())
    guard = units.rank_guard_files(recipe, proc, rendered.rank_group(proc))
    assert bundle.endswith(
        "\n".join(
            [
                f"# ===== host node1: /etc/systemd/system/{unit}.service\n{files.unit_text}",
                f"# ===== host node1: {env}.env (mode 0600)\n{files.env_text}",
                f"# ===== host node1: /etc/systemd/system/{unit}-rank-guard.service\n{guard.unit_text}",
                f"# ===== host node1: {env}.rank-group.json\n{guard.config_text}",
            ]
        )
    )
    single = catalogue.get_recipe("tiny-cpu")
    assert "rank-guard" not in units.systemd_bundle(render(single), HostTuning())
