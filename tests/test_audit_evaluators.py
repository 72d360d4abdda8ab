"""Every audit evaluator (ironserve/audit/evaluate.py) with a passing and a failing case: package versions,
enablement, reloads, GPUs, NPUs, clock offsets, listening ports, HTTP and (JSON) commands. Read through the real
local testinfra host where this machine has the subject (packages, sockets, HTTP, commands); GPUs, NPUs, their
clocks and systemd's unit states through a stand-in host that answers what those tools print."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from types import SimpleNamespace

import pytest
import testinfra

from ironserve.audit.checks import Check
from ironserve.audit.evaluate import EVALUATORS, digest, evaluate

CLOCKS = "/opt/ironserve/tools/bin/python /usr/local/lib/ironserve/ironserve-gpu-clocks.py --read"


@pytest.fixture(scope="module")
def local():
    return testinfra.get_host("local://")


class _Tools:
    """A host whose commands answer as the hardware tools would ({command: (rc, stdout)}) and whose units are in
    the given states; anything else fails like a missing tool."""

    def __init__(self, answers=None, units=None):
        self.answers, self.units = answers or {}, units or {}

    def run(self, command):
        rc, out = self.answers.get(command, (127, ""))
        return SimpleNamespace(rc=rc, stdout=out)

    def service(self, name):
        enabled, running = self.units.get(name, (False, False))
        return SimpleNamespace(is_enabled=enabled, is_running=running)


def check(kind, expected, **params):
    return Check("h", f"{kind}:x", kind, expected, params)


def test_every_evaluator_has_a_case_here():
    tested = {"governor", "sysctl", "file", "env_file", "file_sha256", "service_active"}  # tests/test_audit_checks.py
    tested |= {
        "package",
        "service_enabled",
        "daemon_reloaded",
        "gpus",
        "persistence_mode",
        "npus",
        "clock_offsets",
        "listening",
        "http_ok",
        "command",
        "json_command",
        "listed",
    }
    tested |= {"undeclared_units", "server_args"}  # tests/test_rolling.py (each with a passing and a failing case)
    # (under scripts/mutation, mutmut's copies of the functions are module functions too: not evaluators)
    assert {name for name in EVALUATORS if "__mutmut" not in name} == tested


def test_package_version_installed_drifted_and_absent(local):
    version = local.package("bash").version
    assert evaluate(local, check("package", version, name="bash")) == (True, version)
    assert evaluate(local, check("package", version + "~other", name="bash")) == (False, version)
    assert evaluate(local, check("package", "1.0", name="ironserve-no-such-package")) == (False, "not installed")


@pytest.mark.parametrize(
    "state, expected, ok, found",
    [
        ((True, False), True, True, "enabled"),
        ((False, False), True, False, "disabled"),
        ((True, False), False, False, "enabled"),  # launch: false expects a disabled unit
        ((False, False), False, True, "disabled"),
    ],
)
def test_service_enabled(state, expected, ok, found):
    host = _Tools(units={"u.service": state})
    assert evaluate(host, check("service_enabled", expected, name="u.service")) == (ok, found)


def test_daemon_reloaded():
    show = "systemctl show -p NeedDaemonReload --value u.service"
    assert evaluate(_Tools({show: (0, "no\n")}), check("daemon_reloaded", True, name="u.service")) == (
        True,
        "NeedDaemonReload=no",
    )
    assert evaluate(_Tools({show: (0, "yes\n")}), check("daemon_reloaded", True, name="u.service")) == (
        False,
        "NeedDaemonReload=yes",
    )
    assert evaluate(_Tools(), check("daemon_reloaded", True, name="u.service")) == (False, "NeedDaemonReload=unknown")


def test_gpus_count_and_name():
    query = "nvidia-smi --query-gpu=name,persistence_mode --format=csv,noheader"
    eight = _Tools({query: (0, "NVIDIA RTX PRO 6000, Enabled\n" * 8)})
    want = {"count": 8, "name": "NVIDIA RTX PRO 6000"}
    assert evaluate(eight, check("gpus", want)) == (True, "8x NVIDIA RTX PRO 6000")
    seven = _Tools({query: (0, "NVIDIA RTX PRO 6000, Enabled\n" * 7 + "\n")})  # one fell off the bus
    assert evaluate(seven, check("gpus", want)) == (False, "7x NVIDIA RTX PRO 6000")
    other = _Tools({query: (0, "NVIDIA H100, Enabled\n" * 8)})
    assert evaluate(other, check("gpus", want))[0] is False
    assert evaluate(_Tools(), check("gpus", want)) == (False, "nvidia-smi failed")


def test_persistence_mode_on_every_gpu_read_by_the_same_nvidia_smi_run():
    query = "nvidia-smi --query-gpu=name,persistence_mode --format=csv,noheader"
    on = _Tools({query: (0, "NVIDIA GB200, Enabled\n" * 4)})
    assert evaluate(on, check("persistence_mode", "Enabled")) == (True, "Enabled")
    # persistenced's packaged unit runs with --no-persistence-mode: one GPU left off is drift
    mixed = _Tools({query: (0, "NVIDIA GB200, Enabled\n" * 3 + "NVIDIA GB200, Disabled\n")})
    assert evaluate(mixed, check("persistence_mode", "Enabled")) == (False, "Disabled,Enabled")
    assert evaluate(_Tools({query: (0, "")}), check("persistence_mode", "Enabled")) == (False, "no GPUs")
    assert evaluate(_Tools(), check("persistence_mode", "Enabled")) == (False, "nvidia-smi failed")


def test_npus_counted_from_npu_smi():
    listing = "\tTotal Count : 2\n\n\tNPU ID : 0\n\tProduct Name : x\n\n\tNPU ID : 1\n\tProduct Name : x\n"
    host = _Tools({"npu-smi info -l": (0, listing)})
    assert evaluate(host, check("npus", {"count": 2})) == (True, "2 NPUs")
    assert evaluate(host, check("npus", {"count": 16})) == (False, "2 NPUs")
    assert evaluate(_Tools(), check("npus", {"count": 2})) == (False, "npu-smi failed")


def test_clock_offsets_all_gpus_at_the_recipes_offset():
    offsets = check("clock_offsets", 1000, cmd=CLOCKS)
    assert evaluate(_Tools({CLOCKS: (0, "0 1000\n1 1000\n")}), offsets) == (True, "1000")
    ok, found = evaluate(_Tools({CLOCKS: (0, "0 1000\n1 0\n")}), offsets)
    assert not ok and found == "0,1000"  # one GPU reset to the default
    assert evaluate(_Tools({CLOCKS: (0, "")}), offsets) == (False, "no GPUs")
    assert evaluate(_Tools(), offsets) == (False, "cannot read offsets")


def test_listening_port(local):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert evaluate(local, check("listening", True, port=port)) == (True, "listening")
    assert evaluate(local, check("listening", True, port=port)) == (False, "not listening")


def test_a_listening_port_is_matched_whole():
    """Port 80 is not listening because 8080 or 180 is, on any address form the socket list uses."""
    sockets = ["tcp://0.0.0.0:8080", "tcp://:::180", "unix:///run/x.sock"]
    host = SimpleNamespace(socket=SimpleNamespace(get_listening_sockets=lambda: sockets))
    assert evaluate(host, check("listening", True, port=80)) == (False, "not listening")
    assert evaluate(host, check("listening", True, port=8080)) == (True, "listening")
    assert evaluate(host, check("listening", True, port=180)) == (True, "listening")


@pytest.fixture()
def http_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response({"/health": 200, "/empty": 204}.get(self.path, 503))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_status(local, http_server):
    assert evaluate(local, check("http_ok", 200, url=f"{http_server}/health")) == (True, "200")
    assert evaluate(local, check("http_ok", 200, url=f"{http_server}/starting")) == (False, "503")
    # the status the check names, not any success
    assert evaluate(local, check("http_ok", 200, url=f"{http_server}/empty")) == (False, "204")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nobody = unused.getsockname()[1]
    assert evaluate(local, check("http_ok", 200, url=f"http://127.0.0.1:{nobody}/health")) == (False, "000")


def test_command_output(local):
    assert evaluate(local, check("command", "abc", cmd="echo '  abc '")) == (True, "abc")
    assert evaluate(local, check("command", "abc", cmd="echo abd")) == (False, "abd")
    assert evaluate(local, check("command", "abc", cmd="exit 3")) == (False, "rc=3")


def test_json_command(local):
    want = {"torch": "2.8.0", "sglang": "0.5.6"}
    same = check("json_command", want, cmd="""echo '{"sglang": "0.5.6", "torch": "2.8.0"}'""")
    assert evaluate(local, same) == (True, '{"sglang": "0.5.6", "torch": "2.8.0"}')
    drifted = check("json_command", want, cmd="""echo '{"sglang": "0.5.7", "torch": "2.8.0"}'""")
    assert evaluate(local, drifted) == (False, '{"sglang": "0.5.7", "torch": "2.8.0"}')
    assert evaluate(local, check("json_command", want, cmd="echo not json")) == (False, "null")


def test_listed_finds_a_whole_word_of_the_output(local):
    printed = "echo 'ironserve/r:derived'; echo '@sha256:abc'"
    assert evaluate(local, check("listed", "present", cmd=printed, item="@sha256:abc")) == (True, "present")
    assert evaluate(local, check("listed", "present", cmd=printed, item="@sha256:ab")) == (False, "missing")
    assert evaluate(local, check("listed", "present", cmd="exit 1", item="ironserve/r:derived")) == (False, "missing")


def test_an_evaluator_that_raises_is_drift_not_a_crash():
    ok, found = evaluate(_Tools(), check("listening", True, port=1))  # the stand-in has no sockets to read
    assert not ok and found.startswith("error: AttributeError")


# --------------------------------------------------------------------------- what each says, exactly


def test_gpu_names_counts_and_an_empty_bus():
    query = "nvidia-smi --query-gpu=name,persistence_mode --format=csv,noheader"
    mixed = _Tools({query: (0, "NVIDIA H100, Enabled\nNVIDIA H200, Enabled\n")})
    assert evaluate(mixed, check("gpus", {"count": 2, "name": "NVIDIA H100"})) == (True, "2x NVIDIA H100")
    assert evaluate(_Tools({query: (0, "")}), check("gpus", {"count": 0, "name": ""})) == (True, "0x ")


def test_http_without_any_answer_and_json_from_a_failed_command():
    assert evaluate(_Tools(), check("http_ok", 200, url="http://x/health")) == (False, "no answer")
    fails = _Tools({"probe": (1, '{"a": 1}')})  # a failed command's output is not its answer
    assert evaluate(fails, check("json_command", {"a": 1}, cmd="probe")) == (False, "null")
    long = {"k": "v" * 100}
    ok, found = evaluate(_Tools({"probe": (0, json.dumps(long))}), check("json_command", long, cmd="probe"))
    assert ok and found == json.dumps(long)[:60]


def test_an_evaluator_error_names_the_exception_and_its_message_cut_at_80():
    class Broken(_Tools):
        def run(self, command):
            raise OSError("x" * 200)

    assert evaluate(Broken(), check("command", "a", cmd="a")) == (False, "error: OSError: " + "x" * 80)


def test_file_content_mode_and_owner_are_said_exactly(tmp_path, local):
    path = tmp_path / "unit.service"
    path.write_text("edited\n")
    path.chmod(0o600)
    want = digest("[Unit]\n")
    have = digest("edited\n")
    ok, found = evaluate(local, check("file", want, path=str(path), mode=0o644, owner="ironserve-nobody"))
    owner = local.file(str(path)).user
    assert not ok and found == f"content {have[:12]} != {want[:12]}; mode 0o600 != 0o644; owner {owner}"
    assert evaluate(local, check("file", have, path=str(path), mode=0o600, owner=owner)) == (True, have[:12])


def test_env_files_split_at_the_first_equals_and_skip_comments(tmp_path, local):
    path = tmp_path / "x.env"
    path.write_text("# edited=by hand\nOPTS=a=c\n")
    path.chmod(0o600)
    ok, found = evaluate(local, check("env_file", "OPTS=a=b\n", path=str(path), mode=0o600))
    assert (ok, found) == (False, "value differs: OPTS")
    path.write_text("# edited=by hand\nOPTS=a=b\n")
    assert evaluate(local, check("env_file", "OPTS=a=b\n", path=str(path), mode=0o600)) == (True, "same")


def test_sysctl_value_drift_and_an_unreadable_key():
    key = "vm.swappiness"
    proc = "test -e /proc/sys/vm/swappiness"
    host = _Tools({proc: (0, ""), f"sysctl -n {key}": (0, "60\n")})
    assert evaluate(host, check("sysctl", 10, key=key)) == (False, "60")
    assert evaluate(host, check("sysctl", 60, key=key)) == (True, "60")
    unreadable = _Tools({proc: (0, ""), f"sysctl -n {key}": (1, "60\n")})
    assert evaluate(unreadable, check("sysctl", 60, key=key)) == (False, "unreadable")


@pytest.mark.parametrize(
    "running, expected, result",
    [(True, True, (True, "active")), (False, True, (False, "inactive")), (False, False, (True, "inactive"))],
)
def test_service_active(running, expected, result):
    host = _Tools(units={"u.service": (True, running)})
    assert evaluate(host, check("service_active", expected, name="u.service")) == result


def test_env_file_missing_group_readable_and_many_keys(tmp_path, local):
    path = tmp_path / "x.env"
    assert evaluate(local, check("env_file", "A=1\n", path=str(path), mode=0o600)) == (False, "missing")
    path.write_text("A=1\n")
    path.chmod(0o400)  # not the declared mode, but no one else can read it
    assert evaluate(local, check("env_file", "A=1\n", path=str(path), mode=0o600)) == (False, "mode 0o400")
    path.chmod(0o600)
    want = "".join(f"K{i}={i}\n" for i in range(8))
    assert evaluate(local, check("env_file", want, path=str(path), mode=0o600)) == (
        False,
        "missing: K0, K1, K2, K3, K4, K5 (+2); not declared: A",
    )
    want = "".join(f"K{i}={i}\n" for i in range(6))
    assert evaluate(local, check("env_file", want, path=str(path), mode=0o600)) == (
        False,
        "missing: K0, K1, K2, K3, K4, K5; not declared: A",
    )


def test_env_file_with_seven_differing_keys_names_six_and_counts_one(tmp_path, local):
    path = tmp_path / "x.env"
    path.write_text("")
    path.chmod(0o600)
    want = "".join(f"K{i}={i}\n" for i in range(7))
    assert evaluate(local, check("env_file", want, path=str(path), mode=0o600)) == (
        False,
        "missing: K0, K1, K2, K3, K4, K5 (+1)",
    )


GOVERNORS = "cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null"


@pytest.mark.parametrize(
    "printed, result",
    [
        ("performance\nperformance\n", (True, "performance")),
        ("performance\npowersave\nperformance\n", (False, "performance,powersave")),
        ("powersave\n", (False, "powersave")),
        ("", (False, "no cpufreq")),
    ],
)
def test_governor_of_every_cpu(printed, result):
    assert evaluate(_Tools({GOVERNORS: (0, printed)}), check("governor", "performance")) == result


def test_file_sha256_is_the_file_check(tmp_path, local):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"weights")
    want = digest("weights")
    assert evaluate(local, check("file_sha256", want, path=str(path))) == (True, want[:12])
    assert evaluate(local, check("file_sha256", "0" * 64, path=str(path))) == (
        False,
        f"content {want[:12]} != 000000000000",
    )
