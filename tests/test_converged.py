"""The converged fast path (roles/converged.py, files/bin/ironserve_converged.py): a record that vouches for a
host only while nothing it read has changed, and a decision that plans in full whenever any host cannot vouch."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.pip import PipPackages
from pyinfra.facts.server import Users
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from roles import converged
from roles.docker_engine import DockerDaemonConfig
from roles.host_state import Request
from roles.host_tuning import SysctlValues
from roles.nvidia_container_toolkit import CdiSpec, DockerCdiEnabled, DockerRuntimes
from roles.nvidia_driver import AptHolds, AptVersions, NvidiaDriverState, PersistenceMode
from roles.preflight import GPU_STATE_READ, GpuDevices
from roles.recipe_image import IMAGES_READ, DockerImageDigests, DockerImageLabel
from roles.sglang_service import MarkerDigest
from roles.uv_env import UvVersion, VenvPackages

from .host_scripts import FILES_BIN, load_script

SCRIPT = load_script("ironserve_converged.py")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the record is root's (CI runs as root)")


@pytest.fixture
def host(tmp_path):
    """A private directory holding the record, and a managed file with a read of each kind."""
    (tmp_path / "lib").mkdir(mode=0o755)
    managed = tmp_path / "managed.conf"
    managed.write_text("vm.swappiness = 0\n")
    value = tmp_path / "value"
    value.write_text("one\n")
    reads = [
        ["file", {"paths": [str(managed)]}],
        ["glob", {"paths": [str(tmp_path / "venv*")]}],
        ["cmd", {"sh": f"cat {value}"}],
    ]
    return SimpleNamespace(stamp=str(tmp_path / "lib" / "converged.json"), managed=managed, value=value, reads=reads)


def test_a_record_vouches_until_a_read_changes(host):
    assert SCRIPT.record("D", host.reads, host.stamp) == "recorded 3 reads"
    assert SCRIPT.check(host.stamp) == {"inputs": "D", "changed": [], "reads": 3}
    host.value.write_text("two\n")
    assert SCRIPT.check(host.stamp)["changed"] == ["cmd"]


def test_a_file_written_back_with_its_old_mtime_is_still_changed(host):
    SCRIPT.record("D", host.reads, host.stamp)
    before = os.stat(host.managed)
    host.managed.write_text("vm.swappiness = 60\n")
    host.managed.write_text("vm.swappiness = 0\n")  # the same bytes back
    os.utime(host.managed, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same mtime (touch -d)
    assert SCRIPT.check(host.stamp)["changed"] == ["file"]


def test_a_path_appearing_under_a_glob_is_a_change(host, tmp_path):
    SCRIPT.record("D", host.reads, host.stamp)
    (tmp_path / "venv-new").mkdir()
    assert SCRIPT.check(host.stamp)["changed"] == ["glob"]


def test_a_directory_is_read_by_its_own_status_not_its_entries(host, tmp_path):
    reads = [["dir", {"dirs": [str(tmp_path)]}]]
    SCRIPT.record("D", reads, host.stamp)
    (tmp_path / "ironserve_deploy.prom").write_text("ironserve_x 1\n")  # metrics written in a managed directory
    assert SCRIPT.check(host.stamp)["changed"] == []
    os.chmod(tmp_path, 0o750)
    assert SCRIPT.check(host.stamp)["changed"] == ["dir"]


def test_a_files_contents_are_read_when_asked_and_nothing_but_a_regular_file(host, tmp_path):
    meta = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "torch-2.9.1.dist-info" / "METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text("Name: torch\nVersion: 2.9.1\n")
    os.symlink("/etc/shadow", meta.parent.parent / "link.dist-info")  # a venv's user's link: never followed
    reads = [["venv", {"paths": [str(tmp_path / "venv" / "lib")], "sums": [str(tmp_path / "venv/lib/*/*/*/METADATA")]}]]
    SCRIPT.record("D", reads, host.stamp)
    before = os.stat(meta)
    os.link(meta, tmp_path / "uv-cache-link")  # uv links the same file into another venv: links and ctime move
    assert os.stat(meta).st_ctime_ns != before.st_ctime_ns and SCRIPT.check(host.stamp)["changed"] == []
    meta.write_text("Name: torch\nVersion: 2.9.0\n")  # edited by hand, the same size, the directory untouched
    os.utime(meta, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert SCRIPT.check(host.stamp)["changed"] == ["venv"]
    assert "shadow" not in SCRIPT._read({"sums": [str(meta.parent.parent / "link.dist-info")]})


def test_forget_leaves_no_record(host):
    SCRIPT.record("D", host.reads, host.stamp)
    assert SCRIPT.forget(host.stamp) == "forgotten"
    assert SCRIPT.check(host.stamp)["inputs"] is None
    assert SCRIPT.forget(host.stamp) == "no record"


def test_the_record_is_born_private_and_only_a_private_one_counts(host):
    SCRIPT.record("D", host.reads, host.stamp)
    assert os.stat(host.stamp).st_mode & 0o777 == 0o600
    os.chmod(host.stamp, 0o644)
    assert SCRIPT.check(host.stamp)["inputs"] is None
    os.chmod(host.stamp, 0o600)
    os.chmod(os.path.dirname(host.stamp), 0o777)  # a directory another user can write: nothing read or written
    try:
        assert SCRIPT.check(host.stamp)["inputs"] is None
        assert SCRIPT.record("D", host.reads, host.stamp).startswith("not recorded")
    finally:
        os.chmod(os.path.dirname(host.stamp), 0o755)


def test_a_link_in_place_of_the_record_is_no_record(host, tmp_path):
    SCRIPT.record("D", host.reads, host.stamp)
    os.replace(host.stamp, tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", host.stamp)
    assert SCRIPT.check(host.stamp)["inputs"] is None


@pytest.mark.parametrize(
    "reads",
    [
        [["x", {"sh": ["true"], "paths": ["/"]}]],
        [["x", {"sums": ["/"], "other": ["/"]}]],
        [["x", {"units": ["docker.service"]}]],
        [["x", {"units": ["--host=elsewhere"], "props": ["Id"]}]],
        [["x", {"units": ["a.service; reboot"], "props": ["Id"]}]],
        [["x", {"units": [], "props": ["Id"]}]],
        [["x", {"dirs": "/etc"}]],
        [["x", {"paths": ["relative"]}]],
        [["x", {}]],
        [["x"]],
        {"x": "true"},
    ],
)
def test_reads_that_are_not_reads_are_refused(reads):
    assert not SCRIPT.valid_reads(reads)


def test_a_record_of_other_inputs_is_answered_without_running_its_reads(host, tmp_path):
    ran = tmp_path / "ran"
    reads = [["cmd", {"sh": f"touch {shlex.quote(str(ran))}"}], ["file", {"paths": [str(host.managed)]}]]
    SCRIPT.record("D", reads, host.stamp)
    ran.unlink()
    assert SCRIPT.check(host.stamp, inputs="E") == {"inputs": "D", "changed": [], "reads": 0}
    assert not ran.exists()  # the run of other inputs plans in full: nothing to read
    assert SCRIPT.check(host.stamp, inputs="D") == {"inputs": "D", "changed": [], "reads": 2} and ran.exists()


def test_a_command_several_reads_name_runs_once_and_answers_each(tmp_path):
    count = tmp_path / "count"
    command = f"echo x >> {shlex.quote(str(count))}; cat {shlex.quote(str(count))}"
    answers = SCRIPT._shell_reads([command, "echo other", command])
    assert answers[0] == answers[2] == "rc 0\nx\n" and answers[1] == "rc 0\nother\n"
    assert count.read_text() == "x\n"


def test_units_are_read_in_one_call_each_read_its_own_units_and_properties(host, monkeypatch):
    calls = []
    state = {"UnitFileState": "enabled", "SubState": "running"}

    def show(argv, **kwargs):
        calls.append(argv)
        units = argv[argv.index("--") + 1 :]
        blocks = [f"Id={u}\nSubState={state['SubState']}\nUnitFileState={state['UnitFileState']}\n" for u in units]
        return SimpleNamespace(stdout="\n".join(blocks))

    monkeypatch.setattr(SCRIPT.subprocess, "run", show)
    reads = [
        ["enabled", {"units": ["b.service", "a.service"], "props": ["UnitFileState"]}],
        ["status", {"units": ["a.service"], "props": ["SubState"]}],
    ]
    SCRIPT.record("D", reads, host.stamp)
    assert len(calls) == 1 and calls[0][-3:] == ["--", "a.service", "b.service"]
    assert "--property=SubState" in calls[0] and "--property=UnitFileState" in calls[0]
    state["SubState"] = "failed"  # the unit stopped: only the read of its running state differs
    assert SCRIPT.check(host.stamp)["changed"] == ["status"] and len(calls) == 2
    state["UnitFileState"] = "disabled"
    assert SCRIPT.check(host.stamp)["changed"] == ["enabled", "status"]


def test_the_command_line(host, tmp_path):
    script = str(FILES_BIN / "ironserve_converged.py")
    bad = subprocess.run([sys.executable, script, "record", "D", "[1]"], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a list of reads" in bad.stderr
    usage = subprocess.run([sys.executable, script], capture_output=True, text=True)
    assert usage.returncode == 2 and "ironserve-converged record" in usage.stderr
    extra = subprocess.run([sys.executable, script, "check", "D", "E"], capture_output=True, text=True)
    assert extra.returncode == 2  # an old checker answers a check with inputs the same way: the run plans in full


def test_each_shell_read_is_answered_apart_with_its_exit_status():
    reads = [["a", {"sh": "echo one"}], ["b", {"sh": "exit 3"}], ["c", {"sh": "printf 'no newline'"}]]
    assert SCRIPT._shell_reads([spec["sh"] for _, spec in reads]) == ["rc 0\none\n", "rc 3\n", "rc 0\nno newline"]


# --------------------------------------------------------------------------- the controller's side


def _site(root: str) -> str:
    return f"{root}/lib/python*/site-packages"


def _metadata(root: str) -> list[str]:
    site = _site(root)
    return [f"{site}/*.dist-info/METADATA", f"{site}/*.egg-info/PKG-INFO", f"{site}/*.egg-info"]


@pytest.mark.parametrize(
    ("cls", "kwargs", "expected"),
    [
        (File, {"path": "/etc/x"}, {"paths": ["/etc/x"]}),
        (Sha1File, {"path": "/etc/x"}, {"paths": ["/etc/x"]}),
        (Directory, {"path": "/etc"}, {"dirs": ["/etc"]}),
        (DebPackages, {}, {"paths": ["/var/lib/dpkg/status"]}),
        (Users, {}, {"paths": ["/etc/passwd", "/etc/group", "/etc/shadow"]}),
        (UvVersion, {}, {"paths": ["/usr/local/bin/uv"]}),
        (MarkerDigest, {"path": "/var/lib/m"}, {"paths": ["/var/lib/m"]}),
        (VenvPackages, {"path": "/opt/v"}, {"paths": ["/opt/v/bin/python", "/opt/v/pyvenv.cfg", _site("/opt/v")]}),
    ],
)
def test_facts_read_from_files_are_read_by_their_inode_status(cls, kwargs, expected):
    req = Request(cls, kwargs)
    if cls is VenvPackages:
        expected = {**expected, "sums": _metadata("/opt/v")}
    assert converged.light_read(req) == [req.key, expected]


def test_a_venvs_pip_is_read_by_its_site_packages_and_its_metadata_and_a_bare_pip_whole():
    tools = "/opt/ironserve/tools"
    venv = Request(PipPackages, {"pip": f"{tools}/bin/pip"})
    assert converged.light_read(venv)[1] == {
        "paths": [f"{tools}/bin/pip", f"{tools}/pyvenv.cfg", _site(tools)],
        "sums": _metadata(tools),
    }
    bare = Request(PipPackages, {"pip": "pip3"})
    assert converged.light_read(bare)[1] == {"sh": bare.shell()}


def test_units_of_the_system_manager_are_read_by_their_property_and_others_whole():
    enabled = Request(SystemdEnabled, {"services": ["docker.service", "a.service"]})
    assert converged.light_read(enabled)[1] == {"units": ["a.service", "docker.service"], "props": ["UnitFileState"]}
    status = Request(SystemdStatus, {"services": "docker.service"})
    assert converged.light_read(status)[1] == {"units": ["docker.service"], "props": ["SubState"]}
    for kwargs in ({"services": ["x.service"], "user_mode": True}, {"services": ["x.service"], "machine": "m"}, {}):
        req = Request(SystemdStatus, kwargs)
        assert converged.light_read(req)[1] == {"sh": req.shell()}


def test_facts_of_the_gpus_share_one_device_read_and_file_facts_read_their_files():
    smi = {"sh": GPU_STATE_READ}
    assert converged.light_read(Request(GpuDevices, {}))[1] == smi
    assert converged.light_read(Request(PersistenceMode, {}))[1] == smi
    driver = converged.light_read(Request(NvidiaDriverState, {"package": "nvidia-open-580"}))[1]
    assert driver["sh"] == GPU_STATE_READ and driver["sums"] == ["/sys/module/nvidia/version"]
    assert "/var/lib/dpkg/status" in driver["paths"] and "/var/run/reboot-required" in driver["paths"]
    for cls in (DockerDaemonConfig, DockerRuntimes, DockerCdiEnabled):  # one cat, through a link as dockerd reads
        assert converged.light_read(Request(cls, {}))[1] == {"sh": 'cat /etc/docker/daemon.json 2>&1; echo "rc $?"'}
    assert converged.light_read(Request(AptHolds, {}))[1] == {"paths": ["/var/lib/dpkg/status"]}
    madison = converged.light_read(Request(AptVersions, {"packages": ["nvidia-open-580"]}))[1]["paths"]
    assert "/var/lib/apt/lists/*" in madison and "/etc/apt/sources.list.d/*" in madison
    cdi = converged.light_read(Request(CdiSpec, {"path": "/etc/cdi/nvidia.yaml", "driver": "580.95.05"}))[1]
    assert {"/etc/cdi/*", "/var/run/cdi/*", "/etc/cdi/nvidia.yaml", "/var/lib/dpkg/status"} < set(cdi["paths"])
    assert "/etc/nvidia-container-runtime/config.toml" in cdi["paths"]


def test_facts_of_local_images_share_one_listing_of_every_image():
    digests = converged.light_read(Request(DockerImageDigests, {"ref": "lmsysorg/sglang@sha256:ab"}))[1]
    label = converged.light_read(Request(DockerImageLabel, {"ref": "ironserve/x:derived", "label": "l"}))[1]
    assert digests == label == {"sh": IMAGES_READ}
    assert all(field in IMAGES_READ for field in ("{{.ID}}", "{{.Repository}}", "{{.Tag}}", "{{.Digest}}", "--all"))


def test_the_listing_of_images_is_the_same_in_any_order_and_keeps_dockers_exit_status(tmp_path):
    docker = tmp_path / "docker"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    answers = []
    for body in (
        "echo 'sha256:b x <none> <none>'; echo 'sha256:a y t <none>'",
        "echo 'sha256:a y t <none>'; echo 'sha256:b x <none> <none>'",
        "echo 'Cannot connect' >&2; exit 1",
    ):
        docker.write_text(f"#!/bin/sh\n{body}\n")
        docker.chmod(0o755)
        answers.append(subprocess.run(["sh", "-c", IMAGES_READ], capture_output=True, text=True, env=env).stdout)
    assert answers[0] == answers[1] == "sha256:a y t <none>\nsha256:b x <none> <none>\nrc 0\n"
    assert answers[2] == "Cannot connect\nrc 1\n"


def test_the_gpus_one_read_is_a_superset_of_what_each_fact_asks():
    for fact in ("index", "name", "memory.total", "driver_version", "compute_cap", "persistence_mode"):
        assert fact in GPU_STATE_READ.split("--query-gpu=")[1].split()[0].split(",")


def test_a_hosts_text_reaches_the_log_printable():
    why = converged.why_not({"inputs": None, "why": "\x1b]0;pwned\x07 no record"}, "D")
    assert "\x1b" not in why and "\x07" not in why and why.endswith("no record")


def test_other_facts_are_read_whole_with_their_own_command():
    req = Request(SysctlValues, {"keys": ["vm.swappiness"]})
    assert converged.light_read(req) == [req.key, {"sh": req.shell()}]


def test_a_relative_path_cannot_be_replayed():
    assert converged.light_read(Request(File, {"path": "etc/x"})) is None


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"inputs": "D", "changed": [], "reads": 3}, None),
        ({"inputs": "E", "changed": []}, "the deployment's inputs changed since its record"),
        ({"inputs": "D", "changed": ["a", "b", "c", "d"]}, "changed since its record: a, b, c (+1)"),
        ({"inputs": None, "changed": [], "why": "no record of a converged run"}, "no record of a converged run"),
        ({"inputs": "D", "changed": "a"}, "an answer that is not the checker's"),
        ({}, "no record"),
        (None, "no record"),
    ],
)
def test_a_host_vouches_only_for_these_inputs_with_nothing_changed(answer, why):
    assert converged.why_not(answer, "D") == why


def test_the_check_fact_reads_the_checkers_line_and_nothing_else():
    fact = converged.ConvergedCheck()
    assert fact.process(['{"inputs": "D", "changed": []}']) == {"inputs": "D", "changed": []}
    assert fact.process(["sudo: python3: not found"])["inputs"] is None
    assert fact.process([])["inputs"] is None
    command = fact.command("0a1b")
    assert f"{converged.SCRIPT} check 0a1b 2>/dev/null ||" in command and "no checker installed" in command


def test_a_checker_that_cannot_check_answers_no_record_and_the_command_succeeds(tmp_path):
    old = tmp_path / "checker"
    old.write_text("#!/bin/sh\necho 'usage: ironserve-converged check' >&2\nexit 2\n")  # an older release's
    old.chmod(0o755)
    command = converged.ConvergedCheck().command("0a1b").replace(shlex.quote(converged.SCRIPT), shlex.quote(str(old)))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == ""
    answer = converged.ConvergedCheck().process(out.stdout.splitlines())
    assert converged.why_not(answer, "0a1b") == "a checker that could not check"


def _inventory(tmp_path, key_text: str):
    key = tmp_path / "api.key"
    key.write_text(key_text)

    class Data(dict):
        def dict(self):
            return dict(self)

    data = Data(hardware="cpu-lab", api_key_file=str(key))
    return [SimpleNamespace(name="h1", data=data)]


def test_the_inputs_change_with_a_controller_file_named_by_host_data(tmp_path, monkeypatch):
    ctx = SimpleNamespace(
        model="tiny",
        launch=True,
        derived=None,
        recipe=SimpleNamespace(model_dump=lambda mode: {"id": "r"}),
        profile=SimpleNamespace(model_dump=lambda mode: {"id": "p"}),
    )
    digests = []
    for text in ("key-one\n", "key-two\n", "key-two\n"):
        inventory = _inventory(tmp_path, text)
        monkeypatch.setattr(converged, "context", SimpleNamespace(inventory=inventory))
        monkeypatch.setattr(converged, "host_data", lambda h: SimpleNamespace(**h.data))
        digests.append(converged.inputs_digest(ctx))
    assert digests[0] != digests[1] == digests[2]  # a rotated API key rolls out; the same inputs, the same digest
    assert "key-two" not in json.dumps(digests)


def test_a_directory_named_by_host_data_counts_by_its_files(tmp_path):
    (tmp_path / "a.run").write_text("1")
    first = converged.controller_file_digest(str(tmp_path))
    (tmp_path / "b.run").write_text("2")
    assert converged.controller_file_digest(str(tmp_path)) != first
    assert converged.controller_file_digest(str(tmp_path / "none")) == "absent"


# --------------------------------------------------------------------------- the record's moments in a run


class _Host:
    def __init__(self, name: str, unreplayable=()):
        self.name, self.commands = name, []
        self.data = {"_sudo": True}
        req = Request(File, {"path": f"/etc/{name}.conf"})
        self.ironserve_host_facts = SimpleNamespace(run_requests=lambda: {req.key: req}, unreplayable=set(unreplayable))

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command)
        return True, SimpleNamespace(stderr="")


def _run_state(hosts, changes=0, failed=()):
    return SimpleNamespace(
        get_op_order=lambda: ["op1", "op2"],
        inventory=SimpleNamespace(get_active_hosts=lambda: hosts),
        failed_hosts=set(failed),
        ironserve_changes=changes,
        ironserve_converged_inputs="D",
    )


def _play(state, hosts):
    recorder = converged.Recorder()
    for op in ("op1", "op2"):
        recorder.operation_start(state, op)
        recorder.operation_end(state, op)
    return [[c.split()[1] for c in h.commands] for h in hosts]


def test_a_run_forgets_before_acting_and_records_when_it_changed_nothing():
    hosts = [_Host("h1"), _Host("h2")]
    assert _play(_run_state(hosts), hosts) == [["forget", "record"], ["forget", "record"]]
    recorded = hosts[0].commands[1]
    assert "'D'" in recorded or " D " in recorded
    assert json.loads(shlex.split(recorded)[-1]) == [
        [Request(File, {"path": "/etc/h1.conf"}).key, {"paths": ["/etc/h1.conf"]}]
    ]


@pytest.mark.parametrize("state_kwargs", [{"changes": 1}, {"failed": ["h2"]}])
def test_a_run_that_changed_something_or_failed_records_nothing(state_kwargs):
    hosts = [_Host("h1"), _Host("h2")]
    assert _play(_run_state(hosts, **state_kwargs), hosts) == [["forget"], ["forget"]]


def test_a_host_that_asked_what_cannot_be_replayed_gets_no_record():
    hosts = [_Host("h1", unreplayable=["ParseCheck"]), _Host("h2")]
    assert _play(_run_state(hosts), hosts) == [["forget"], ["forget", "record"]]


# --------------------------------------------------------------------------- the decision


class _Inventory(list):
    def __init__(self, hosts, active):
        super().__init__(hosts)
        self.active = active

    def get_active_hosts(self):
        return list(self.active)


def _decision(monkeypatch, hosts, active, fast=True, unchanged=False):
    state = SimpleNamespace(inventory=_Inventory(hosts, active))
    early = []
    monkeypatch.setattr(converged, "_state", lambda: state)
    monkeypatch.setattr(converged, "host_data", lambda h: SimpleNamespace(converged_fast_path=fast))
    monkeypatch.setattr(converged, "inputs_digest", lambda ctx: "D")
    monkeypatch.setattr(converged, "_decide", lambda state, hosts, inputs: unchanged)
    monkeypatch.setattr(converged.host_state, "note_early_reads", lambda hosts: early.extend(hosts))
    return converged.skip(SimpleNamespace()), state, early


def test_a_whole_run_decides_and_notes_every_hosts_reads_before_any_host_plans(monkeypatch):
    hosts = ["router", "engine1", "engine2"]
    skipped, state, early = _decision(monkeypatch, hosts, hosts)
    assert not skipped and early == hosts and state.ironserve_converged_inputs == "D"
    assert converged.decided() is False  # the hosts planned after the first wait for this decision


def test_a_run_with_every_host_as_its_record_says_plans_nothing(monkeypatch):
    hosts = ["router", "engine1", "engine2"]
    skipped, state, early = _decision(monkeypatch, hosts, hosts, unchanged=True)
    assert skipped and early == [] and converged.decided() is True


@pytest.mark.parametrize(("active", "fast"), [(["engine1"], True), (["router", "engine1", "engine2"], False)])
def test_a_limited_run_or_one_without_the_fast_path_plans_in_full_and_records_nothing(monkeypatch, active, fast):
    skipped, state, early = _decision(monkeypatch, ["router", "engine1", "engine2"], active, fast)
    assert skipped is False and early == [] and not hasattr(state, "ironserve_converged_inputs")
