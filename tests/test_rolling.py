"""The rolling change (roles/rolling.py, files/bin/ironserve-roll) and what the audit sees of stray units.

The plan is pure (render -> groups in order, the canary, the worker URLs the router knows); the host side of each
HTTP step is the shipped script, run here with the host's python3 against a loopback stand-in of sglang-router's
worker API (GET/DELETE/POST /workers, as sglang-router 0.3.2 answers them) and of SGLang's /v1/loads and /generate.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from ironserve import catalogue
from ironserve.audit.checks import Check
from ironserve.audit.evaluate import evaluate
from ironserve.inventory import InventoryHost
from ironserve.render import render
from roles import rolling

KEY = "roll-test-key"


def _hosts(recipe, n: int, **data) -> list[InventoryHost]:
    return [
        InventoryHost(
            f"h{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "nic": "enp1s0", "hardware": recipe.hardware[0], **data}
        )
        for i in range(n)
    ]


def test_replicas_roll_in_instance_order_and_the_first_is_the_canary():
    recipe = catalogue.get_recipe("tiny-cpu")
    hosts = [
        InventoryHost("r", {"ssh_hostname": "10.0.0.9", "ironserve_role": "router", "hardware": "cpu-lab"}),
        *_hosts(recipe, 2),
    ]
    rendered = render(recipe, hosts)
    groups = rolling.roll_groups(rendered)
    assert [[p.unit for p in g] for g in groups] == [["sglang-tiny-cpu-server-0"], ["sglang-tiny-cpu-server-1"]]
    # the URL the router was started with (--worker-urls) is the one the roll removes and adds back
    router = next(p for p in rendered.processes if p.role == "router")
    assert [rolling.worker_url(g[0]) for g in groups] == router.argv[router.argv.index("--worker-urls") + 1 :][:2]
    lines = rolling.plan_lines(rendered, 1, False)
    assert "step 1: sglang-tiny-cpu-server-0 on h0: rolls; the canary, alone" in lines[1], lines
    assert lines[2] == "  step 2: sglang-tiny-cpu-server-1 on h1: rolls", lines


def test_pd_groups_move_whole_prefill_before_decode():
    recipe = catalogue.get_recipe("glm5.1-w4a8-a3-1p1d-32-16k")
    groups = rolling.roll_groups(render(recipe, _hosts(recipe, 4)))
    assert [[(p.role, p.node_rank, p.host) for p in g] for g in groups] == [
        [("prefill", 0, "h0"), ("prefill", 1, "h1")],
        [("decode", 0, "h2"), ("decode", 1, "h3")],
    ]


@pytest.mark.parametrize("recipe_id, nodes", [("tiny-cpu-tp2", 2), ("glm5-nvfp4-rtx6000-tp8", 1)])
def test_a_single_group_does_not_roll_and_the_plan_says_outage(recipe_id, nodes):
    recipe = catalogue.get_recipe(recipe_id)
    rendered = render(recipe, _hosts(recipe, nodes))
    assert rolling.roll_groups(rendered) == []
    (line,) = rolling.plan_lines(rendered, 4, True)
    assert "restarts in place: an OUTAGE" in line and "sglang-" in line, line


class _Fleet:
    """A loopback sglang-router worker API and an SGLang engine's /v1/loads and /generate, keyed."""

    def __init__(self):
        self.workers = [
            {"id": str(uuid.uuid4()), "url": u, "is_healthy": True}
            for u in ("http://10.0.0.1:30000", "http://10.0.0.2:30000")
        ]
        self.loads = [2, 1, 0]  # what /v1/loads answers, poll after poll
        self.posted = []
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self):
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self._send(401, {"error": "unauthorized"})
                    return False
                return True

            def do_GET(self):
                if not self._authorized():
                    return
                if self.path == "/workers":
                    self._send(200, {"workers": fleet.workers, "total": len(fleet.workers)})
                elif self.path == "/v1/loads":
                    n = fleet.loads.pop(0) if len(fleet.loads) > 1 else fleet.loads[0]
                    self._send(200, {"loads": [{"dp_rank": 0, "num_running_reqs": n, "num_waiting_reqs": 0}]})
                else:
                    self._send(404, {})

            def do_DELETE(self):
                if self._authorized():
                    fleet.workers = [w for w in fleet.workers if f"/workers/{w['id']}" != self.path]
                    self._send(202, {"status": "accepted"})

            def do_POST(self):
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/workers":
                    fleet.posted.append(body)
                    fleet.workers.append({"id": str(uuid.uuid4()), "url": body["url"], "is_healthy": True})
                    self._send(202, {"status": "accepted"})
                elif self.path == "/generate":
                    self._send(200, {"text": " there", "meta_info": {"completion_tokens": 4}})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fleet(tmp_path):
    f = _Fleet()
    env = tmp_path / "unit.env"
    env.write_text(f"A=1\nIRONSERVE_API_KEY={KEY}\n")
    f.env = str(env)
    yield f
    f.server.shutdown()


def _roll(*args) -> tuple[int, dict]:
    # the command the roles run on a host, argument for argument (python3 -c, every value one quoted argument)
    argv = ["python3", "-c", rolling.ROLL_SCRIPT, *map(str, args)]
    assert rolling.roll_script(*map(str, args)) == " ".join(__import__("shlex").quote(a) for a in argv)
    out = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_remove_then_add_through_the_worker_api_with_the_key_from_the_env_file(fleet):
    url = "http://10.0.0.1:30000"
    assert _roll("remove", fleet.base, fleet.env, url) == (0, {"removed": 1})
    assert [w["url"] for w in fleet.workers] == ["http://10.0.0.2:30000"]
    assert _roll("add", fleet.base, fleet.env, url, json.dumps({"worker_type": "prefill", "bootstrap_port": 8998})) == (
        0,
        {"added": url},
    )
    assert fleet.posted == [{"worker_type": "prefill", "bootstrap_port": 8998, "url": url, "api_key": KEY}]
    # adding one that is listed already posts nothing (a rerun after a killed roll)
    assert _roll("add", fleet.base, fleet.env, url)[0] == 0 and len(fleet.posted) == 1


def test_drain_waits_for_in_flight_requests_and_says_what_was_cut(fleet):
    rc, drained = _roll("drain", fleet.base, fleet.env, 30)
    assert rc == 0 and drained["in_flight"] == 2 and drained["cut"] == 0
    fleet.loads = [3]  # never drains: cut at the timeout, and said
    rc, drained = _roll("drain", fleet.base, fleet.env, 0.5)
    assert rc == 0 and drained["cut"] == 3 and drained["drain_s"] >= 0.5


def test_generation_and_an_unreachable_router_are_said(fleet, tmp_path):
    assert _roll("generate", fleet.base, fleet.env) == (0, {"generated_tokens": 4})
    rc, answer = _roll("workers", "http://127.0.0.1:9", fleet.env)
    assert rc == 1 and "Connection refused" in answer["error"]
    keyless = tmp_path / "keyless.env"
    keyless.write_text("A=1\n")
    rc, answer = _roll("workers", fleet.base, str(keyless))
    assert rc == 1 and answer["error"].startswith("HTTP 401")


def test_own_listener_check_names_a_foreign_process_on_the_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        rc, answer = _roll("owns-port", sock.getsockname()[1], "sglang-x-server")
        assert rc == 1 and "not in sglang-x-server.service" in answer["error"]
        port = sock.getsockname()[1]
    finally:
        sock.close()
    rc, answer = _roll("owns-port", port, "sglang-x-server")
    assert rc == 1 and "nothing listens" in answer["error"]


def test_audit_names_an_undeclared_unit_of_our_naming():
    listing = "sglang-r-server-0.service\nsglang-stray-server.service\n"
    host = SimpleNamespace(run=lambda cmd: SimpleNamespace(stdout=listing, rc=0))
    check = Check("h", "units:undeclared", "undeclared_units", ["sglang-r-server-0.service"], {})
    assert evaluate(host, check) == (False, "undeclared: sglang-stray-server.service")
    check = Check(
        "h", "units:undeclared", "undeclared_units", ["sglang-r-server-0.service", "sglang-stray-server.service"], {}
    )
    assert evaluate(host, check) == (True, "none")


def test_audit_reports_reached_hosts_when_one_is_unreachable(monkeypatch, tmp_path, capsys):
    from ironserve.audit import connection, runner

    checks = [
        Check(h, "sysctl:vm.swappiness", "sysctl", "nope", {"key": "vm.swappiness"}, "host", "fix")
        for h in ("here", "gone")
    ]
    monkeypatch.setattr(
        runner,
        "plan_checks",
        lambda *a, **k: (checks, {"here": {"address": "127.0.0.1"}, "gone": {"address": "127.0.0.1"}}),
    )
    specs = {"here": "local://", "gone": "paramiko://nobody@127.0.0.1:9?timeout=2"}
    fleet = SimpleNamespace(hosts=[SimpleNamespace(name=n, groups=[]) for n in ("here", "gone")])
    monkeypatch.setattr(runner, "read_fleet", lambda *a, **k: fleet)
    monkeypatch.setattr(connection, "open_hosts", lambda fleet, names: {n: specs[n] for n in names})
    out = tmp_path / "out.json"
    with out.open("w") as fh:
        assert runner.audit("inv.py", "deploys/tiny.py", fmt="json", out=fh) == 2
    report = json.loads(out.read_text())
    assert [r["host"] for r in report["results"]] == ["here"] and list(report["unreachable"]) == ["gone"]
    junit = tmp_path / "audit.xml"
    assert runner.audit("inv.py", "deploys/tiny.py", fmt="junit", junit=str(junit)) == 2
    xml = junit.read_text()
    assert "here::sysctl:vm.swappiness" in xml and "gone::" in xml and "unreachable" in xml
    assert "unreachable: gone" in capsys.readouterr().err


def _turns(monkeypatch, outcomes: dict[str, bool | None], steps: list[list[str]]) -> tuple[list, dict, list]:
    """The groups' rolls as pyinfra executes them: one operation a step, every group of a step at once (gevent
    greenlets, as pyinfra runs one operation on every host), the next step once all are done. ``outcomes``: each
    roll's result (None: the group has nothing to do, its operation a no-op). Returns (the groups whose engines
    were touched, in order, the record, the canary flags)."""
    import gevent

    touched, canaries = [], []

    def fake_roll(state, host, plan, canary, restart=True):
        touched.append(plan["group"])
        canaries.append((plan["group"], canary))
        gevent.sleep(0.05)
        return outcomes[plan["group"]]

    monkeypatch.setattr(rolling, "_roll", fake_roll)
    monkeypatch.setattr(rolling, "_changed_now", lambda state, plan: True)
    monkeypatch.setattr(rolling, "_sleep", lambda s: gevent.sleep(0.01))
    order = [g for step in steps for g in step]
    rolls = {"groups": list(order), **{f"host:{g}": f"h{i + 2}" for i, g in enumerate(order)}}
    state = SimpleNamespace(failed_hosts=set())
    hosts = {g: SimpleNamespace(name=f"h{i + 2}", log_styled=lambda *a, **k: None) for i, g in enumerate(order)}
    plans = {
        g: {"group": g, "steps": steps, "unit": f"u-{i}", "timeout_s": 5, "drain_timeout_s": 1, "bench": None}
        for i, g in enumerate(order)
    }
    for step in steps:
        jobs = []
        # the later groups' greenlets start first: the turn, not the start order, decides
        for g in reversed(step):
            if outcomes[g] is None:
                rolls[g] = "unchanged"  # what the no-op records when the step's operation runs
            else:
                jobs.append(gevent.spawn(rolling.roll_group, state, hosts[g], plans[g], rolls, True))
        gevent.joinall(jobs, timeout=10)
    return touched, rolls, canaries


TWO = [["server-g0-i0"], ["server-g0-i1"]]


def test_a_failed_canary_leaves_every_later_group_untouched(monkeypatch):
    touched, rolls, canaries = _turns(monkeypatch, {"server-g0-i0": False, "server-g0-i1": True}, TWO)
    assert touched == ["server-g0-i0"] and canaries == [("server-g0-i0", True)]
    assert rolls["server-g0-i0"] == rolls["server-g0-i1"] == "failed"


def test_groups_roll_one_after_the_other_in_order(monkeypatch):
    touched, rolls, canaries = _turns(monkeypatch, {"server-g0-i0": True, "server-g0-i1": True}, TWO)
    assert touched == ["server-g0-i0", "server-g0-i1"]
    assert canaries == [("server-g0-i0", True), ("server-g0-i1", False)]
    assert rolls["server-g0-i0"] == rolls["server-g0-i1"] == "rolled"


THREE = [["g0"], ["g1", "g2", "g3"]]


def test_a_step_moves_its_groups_at_once_after_the_canary(monkeypatch):
    touched, rolls, canaries = _turns(monkeypatch, {"g0": True, "g1": True, "g2": True, "g3": True}, THREE)
    assert touched[0] == "g0" and sorted(touched[1:]) == ["g1", "g2", "g3"]
    assert [g for g, canary in canaries if canary] == ["g0"]
    # the step's groups started together (the greenlets started last-first, none waited for another)
    assert touched[1:] == ["g3", "g2", "g1"]


def test_an_unchanged_first_group_makes_the_next_changed_one_the_canary_alone(monkeypatch):
    """The first group that restarts is the canary, even inside a step: the others of its step wait for it."""
    touched, rolls, canaries = _turns(monkeypatch, {"g0": None, "g1": True, "g2": True, "g3": True}, THREE)
    assert touched[0] == "g1" and [g for g, canary in canaries if canary] == ["g1"]
    touched, rolls, canaries = _turns(monkeypatch, {"g0": None, "g1": False, "g2": True, "g3": True}, THREE)
    assert touched == ["g1"] and rolls["g2"] == rolls["g3"] == "failed"


def test_a_group_of_an_earlier_step_without_an_outcome_stops_the_roll(monkeypatch):
    """Its host failed before the roll had an outcome (the operation never ran there): the next steps stay."""
    import gevent

    monkeypatch.setattr(rolling, "_roll", lambda *a, **k: pytest.fail("touched"))
    rolls = {"groups": ["g0", "g1"]}
    host = SimpleNamespace(name="h3", log_styled=lambda *a, **k: None)
    plan = {"group": "g1", "steps": [["g0"], ["g1"]], "unit": "u-1", "timeout_s": 5, "drain_timeout_s": 1}
    job = gevent.spawn(rolling.roll_group, SimpleNamespace(failed_hosts=set()), host, plan, rolls, True)
    job.join(timeout=5)
    assert job.value is False and rolls["g1"] == "failed"


def test_audit_compares_the_engines_effective_arguments():
    from ironserve.audit.checks import rendered_args

    recipe = catalogue.get_recipe("tiny-cpu")
    hosts = [
        InventoryHost("r", {"ssh_hostname": "10.0.0.9", "ironserve_role": "router", "hardware": "cpu-lab"}),
        *_hosts(recipe, 2),
    ]
    engine = next(p for p in render(recipe, hosts).processes if p.role == "server")
    expected = rendered_args(engine)
    assert expected["max_running_requests"] == "4" and expected["disable_cuda_graph"] is True
    info = {
        "max_running_requests": 4,
        "mem_fraction_static": 0.1,
        "disable_cuda_graph": True,
        "other": "x",
        "model_path": "/var/lib/ironserve/models/tiny-llama",
        "context_length": 512,
    }
    check = Check("h", "server-args:u", "server_args", expected, {"cmd": "x"})

    def host(answer):
        return SimpleNamespace(run=lambda cmd: SimpleNamespace(stdout=json.dumps(answer) + "\n", rc=0))

    assert evaluate(host(info), check) == (True, "same")
    # started by hand with another flag, or a live configuration never restarted into
    ok, found = evaluate(host({**info, "max_running_requests": 3}), check)
    assert not ok and found == "differs: max_running_requests=3 (rendered 4)"
    assert evaluate(host({"error": "HTTP 401"}), check) == (False, "no server info: HTTP 401")


def test_the_staged_env_file_gives_the_key_of_a_unit_not_yet_live(fleet, tmp_path):
    """A recipe switch moves its groups through the old router before the new router's env file is live: the key
    comes from the staged one (ironserve.units.STAGED_DIR + the live path)."""
    from ironserve.units import STAGED_DIR

    assert f'STAGED = "{STAGED_DIR}"' in rolling.ROLL_SCRIPT
    rc, answer = _roll("workers", fleet.base, str(tmp_path / "not-live.env"))
    assert rc == 1 and answer["error"].startswith("HTTP 401")  # neither file: no key, and the router says so


def _sandboxed(command: str, root) -> str:
    """The host command with its absolute paths under ``root`` and systemctl recorded instead of run."""
    import re

    # each path once: the staged copies' inner /etc/... follows a word character and stays as it is
    command = re.sub(r"(?<![\w/])(/etc/systemd/system|/etc/ironserve|/var/lib/ironserve)", rf"{root}\1", command)
    return f'systemctl() {{ echo "systemctl $*" >> {root}/systemctl.log; }}; {command}'


def test_a_switch_sets_the_old_unit_aside_and_restores_it_whole(tmp_path):
    from roles import undeclared

    unit = "sglang-old-server-0"
    files = {
        f"/etc/systemd/system/{unit}.service": "[Unit]\n",
        f"/etc/ironserve/{unit}.env": "A=1\n",
        f"/etc/ironserve/staged/etc/ironserve/{unit}.env": "A=2\n",
    }
    for path, text in files.items():
        (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.lstrip("/")).write_text(text)
    subprocess.run(["bash", "-c", _sandboxed(undeclared.retire_command(unit), tmp_path)], check=True)
    assert not any((tmp_path / p.lstrip("/")).exists() for p in files)
    assert f"systemctl disable --now {unit}.service" in (tmp_path / "systemctl.log").read_text()
    subprocess.run(["bash", "-c", _sandboxed(undeclared.restore_command(unit), tmp_path)], check=True)
    assert {p: (tmp_path / p.lstrip("/")).read_text() for p in files} == files
    assert not (tmp_path / "var/lib/ironserve/retired" / unit).exists()
    assert (tmp_path / "systemctl.log").read_text().splitlines()[-1] == f"systemctl start {unit}.service"


def _script() -> dict:
    """The shipped roll script's functions (it runs its main only as a program)."""
    namespace = {"__name__": "ironserve_roll"}
    exec(compile(rolling.ROLL_SCRIPT, "ironserve-roll", "exec"), namespace)
    return namespace


CONTAINER_ID = "4f1c" + "0" * 60
CONTAINER = {
    "Id": CONTAINER_ID,
    "State": {"Running": True, "Pid": 4242},
    "NetworkSettings": {"Networks": {"bridge": {"IPAddress": "172.17.0.2"}}, "Ports": {}},
}


@pytest.mark.parametrize(
    "cgroup",
    [
        f"0::/system.slice/docker-{CONTAINER_ID}.scope\n",  # docker's systemd cgroup driver (cgroup v2)
        f"12:pids:/docker/{CONTAINER_ID}\n0::/docker/{CONTAINER_ID}\n",  # the cgroupfs driver
    ],
)
def test_a_containers_listener_is_the_unit_its_container_started(cgroup):
    """A docker unit runs `docker run --name UNIT`: its engine is in the container's cgroup, not the unit's (the
    unit's own process is the docker client), so the gate asks docker for that container and checks the listener
    is in it (the host's network) or is the docker-proxy of a port it publishes to the container's address."""
    foreign = _script()["foreign"]
    unit = "sglang-x-server-0"
    engine = {"101": (cgroup, ["python3", "-m", "sglang.launch_server"])}
    assert foreign(engine, unit, CONTAINER) == []
    # the unit check without the container: the engine is not in the unit's cgroup
    assert foreign(engine, unit) == ["101"]
    proxy = ["/usr/bin/docker-proxy", "-proto", "tcp", "-host-port", "30000", "-container-ip", "172.17.0.2"]
    assert foreign({"7": ("0::/system.slice/docker.service\n", proxy)}, unit, CONTAINER) == []
    other = [*proxy[:-1], "172.17.0.9"]  # the proxy of another container's published port
    assert foreign({"7": ("0::/system.slice/docker.service\n", other)}, unit, CONTAINER) == ["7"]
    old = {"55": ("0::/system.slice/sglang-old-server-0.service\n", ["python3"])}  # whatever held the port before
    assert foreign(old, unit, CONTAINER) == ["55"]


def _fake_docker(tmp_path, answer: str, rc: int = 0) -> dict:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "docker").write_text(f"#!/bin/sh\necho '{answer}'\nexit {rc}\n")
    (fake / "docker").chmod(0o755)
    import os

    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}


def test_the_container_listener_check_names_what_it_finds(tmp_path):
    """owns-port PORT UNIT container, run as the roles run it, against a stand-in `docker inspect`: a listener
    outside the container is named; a stopped or missing container is said."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]

    def check(env):
        argv = ["python3", "-c", rolling.ROLL_SCRIPT, "owns-port", str(port), "sglang-x-server-0", "container"]
        out = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, env=env, timeout=60)
        return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])

    try:
        rc, answer = check(_fake_docker(tmp_path, json.dumps([CONTAINER])))
        assert rc == 1 and answer["error"].endswith("not in the container sglang-x-server-0"), answer
        assert str(__import__("os").getpid()) in answer["error"]
        stopped = {**CONTAINER, "State": {"Running": False, "Status": "exited", "Pid": 0}}
        rc, answer = check(_fake_docker(tmp_path, json.dumps([stopped])))
        assert rc == 1 and answer["error"].endswith("the container sglang-x-server-0 is not running (exited)"), answer
        rc, answer = check(_fake_docker(tmp_path, "[]", rc=1))
        assert rc == 1 and "no container sglang-x-server-0" in answer["error"], answer
    finally:
        sock.close()


def test_a_published_port_without_a_proxy_is_the_containers_when_it_listens_inside():
    """docker run -p with the userland proxy off: nothing listens on the host's port, docker's NAT sends it to
    the container; the check reads the container's own network namespace (/proc/PID/net) for the listener."""
    script = _script()
    info = {
        **CONTAINER,
        "NetworkSettings": {**CONTAINER["NetworkSettings"], "Ports": {"8000/tcp": [{"HostPort": "30000"}]}},
    }
    assert script["published"](info, 30000) == 8000 and script["published"](info, 30001) is None
    assert script["published"](CONTAINER, 30000) is None
