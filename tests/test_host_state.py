"""Batched facts (roles/host_state.py, ironserve/batch.py): one read answers every fact the stage asks, with the
values the facts would have read on their own; a change on a host drops them; fixtures supply the batched fact."""

from __future__ import annotations

import subprocess

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.util import get_kwargs_str
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.server import Arch, Hostname
from pyinfra_testing.util import FakeState, create_host

from ironserve import batch
from ironserve.hostdata import HostData
from roles import host_state, host_tuning
from roles.host_state import HostFacts, HostState, Request, changes_made, run_unread

NONCE = "ironserve-batch-0123456789abcdef"


def run_sh(script: str) -> list[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()


def test_compose_and_split_give_each_read_its_own_lines_and_status():
    reads = [
        "printf 'a\\nb\\n'",
        "printf 'no newline'",
        "true",
        "echo x; exit 3",
        "printf 'x\\n\\n'",
        "cat",
        f"echo '{NONCE} 0 0'",
    ]  # a forged marker: another nonce or index is plain output
    answers = batch.split(run_sh(batch.compose(reads, NONCE)), len(reads), NONCE)
    assert answers == [
        batch.Answer(0, ("a", "b")),
        batch.Answer(0, ("no newline",)),
        batch.Answer(0, ()),
        batch.Answer(3, ("x",)),
        batch.Answer(0, ("x", "")),
        batch.Answer(0, ()),
        batch.Answer(0, (f"{NONCE} 0 0",)),
    ]
    cut = batch.split(run_sh(batch.compose(reads[:2], NONCE))[:4], 2, NONCE)
    assert cut[0] == batch.Answer(0, ("a", "b")) and cut[1] is None


def test_host_state_fact_reads_the_markers_it_was_given():
    script = HostState().command(reads=["echo one", "exit 2"], nonce=NONCE)
    assert HostState().process(run_sh(script)) == [{"rc": 0, "lines": ["one"]}, {"rc": 2, "lines": []}]
    assert HostState().process([]) == []


# --------------------------------------------------------------------------- on a real pyinfra host (@local)


@pytest.fixture
def local(tmp_path):
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    real = inventory.get_host("@local")
    sent = []
    run = real.connector.run_shell_command

    def counting(*args, **kwargs):
        sent.append(str(args[0]))
        return run(*args, **kwargs)

    real.connector.run_shell_command = counting
    sample = tmp_path / "sample.conf"
    sample.write_text("x = 1\n")

    def facts() -> HostFacts:
        for name in ("get_fact", "run_shell_command", "put_file"):
            real.__dict__.pop(name, None)
        hf = HostFacts(real, tmp_path / "cache" / "local.json")
        real.get_fact, real.run_shell_command, real.put_file = hf.get_fact, hf.run_shell_command, hf.put_file
        return hf

    with ctx_state.use(state), ctx_host.use(real):
        yield {"host": real, "sent": sent, "facts": facts, "path": str(sample), "state": state}


def ask_all(host, path):
    info = dict(host.get_fact(File, path=path))
    info.pop("atime")  # reading the file (its hash) may move its atime between two reads
    return [info, host.get_fact(Sha1File, path=path), host.get_fact(Arch), host.get_fact(Hostname)]


def test_second_run_reads_every_fact_in_one_command_with_the_same_values(local):
    host, sent = local["host"], local["sent"]
    first = local["facts"]()
    alone = ask_all(host, local["path"])
    first.end_planning()
    assert (local["path"] in json_text(first.cache_file)) and "values" not in json_text(first.cache_file)
    sent.clear()
    second = local["facts"]()
    assert ask_all(host, local["path"]) == alone
    assert len(sent) == 1 and second.counts == {"batch": 1, "cached": 4}
    # asked again (pyinfra 3 asks again when the operation executes): no command at all
    assert ask_all(host, local["path"]) == alone and len(sent) == 1


def json_text(path) -> str:
    return path.read_text()


def test_a_command_on_a_host_drops_the_answers(local):
    host, sent = local["host"], local["sent"]
    local["facts"]()
    ask_all(host, local["path"])
    facts = local["facts"]()
    assert host.get_fact(Sha1File, path=local["path"]) is not None
    host.run_shell_command(f"echo 'y = 2' >> {local['path']}")
    sent.clear()
    changed = host.get_fact(Sha1File, path=local["path"])  # read again, alone, as pyinfra would
    assert (
        len(sent) == 1
        and changed == subprocess.run(["sha1sum", local["path"]], capture_output=True, text=True).stdout.split()[0]
    )
    assert host.get_fact(Sha1File, path=local["path"]) == changed and len(sent) == 1  # kept until the next command
    assert facts.counts == {"batch": 1, "cached": 2, "single": 1}


def test_not_batched_after_planning_outside_the_stage_or_with_other_connector_arguments(local):
    host, sent = local["host"], local["sent"]
    local["facts"]()
    ask_all(host, local["path"])
    facts = local["facts"]()
    facts.end_planning()
    sent.clear()
    host.get_fact(Arch)  # no operation of the prepare stage asks: the launch stage reads as before
    assert len(sent) == 1 and facts.counts == {"single": 1}
    facts = local["facts"]()
    host.get_fact(Arch)
    host.get_fact(Arch, _env={"X": "1"})
    assert facts.counts["single"] == 1


def test_a_probe_is_asked_alone_and_never_kept(local):
    """A fact that acts (the parser check runs SGLang's parser) must never join the next no-op's read."""
    from roles.sglang_service import ParseCheck

    host = local["host"]
    facts = local["facts"]()
    host.get_fact(Arch)
    assert host.get_fact(ParseCheck, probe="echo probed")["rc"] == 0
    facts.end_planning()
    kept = json_text(facts.cache_file)
    assert "Arch" in kept and "ParseCheck" not in kept and facts.counts["single"] == 1


def test_questions_the_run_did_not_ask_are_not_kept_for_the_next(local):
    """Another recipe's questions (kept from its run on this host) are read once more, then dropped: a host that
    saw many recipes of one model never gets a batched read longer than a shell's argument list."""
    host = local["host"]
    facts = local["facts"]()
    stale = Request(File, {"path": "/etc/ironserve/another-recipe.env"})
    facts.asked[stale.key] = stale
    facts.kept.add(stale.key)
    host.get_fact(Arch)
    facts.end_planning()
    kept = json_text(facts.cache_file)
    assert "Arch" in kept and "another-recipe" not in kept


def test_a_failed_batched_read_is_read_again_alone(local):
    facts = local["facts"]()
    bad = Request(File, {"path": "/nonexistent/x"})
    bad.shell = lambda: "exit 1"  # noqa: E731 - its batched read fails
    facts.asked[bad.key] = bad
    facts.kept.add(bad.key)
    assert local["host"].get_fact(File, path="/nonexistent/x") is None
    assert facts.counts["single"] == 1


def test_install_is_switched_off_by_host_data(local):
    class Ctx:
        model = "glm5"

        def __init__(self, data):
            self.host = HostData(**data)

    assert host_state.install(Ctx({"batch_facts": False})) is None
    installed = host_state.install(Ctx({"host_state_cache": ""}))
    assert installed is not None and installed.cache_file is None
    assert host_state.install(Ctx({})) is installed


# --------------------------------------------------------------------------- the fixture supplies the batched fact


def test_sysctl_file_converged_no_op_from_the_batched_fact(monkeypatch):
    """host_tuning.sysctl_file's converged case, its facts answered by one HostState read the fixture supplies."""
    values = {"vm.swappiness": 0, "kernel.numa_balancing": 0}
    path = "/etc/sysctl.d/90-ironserve.conf"
    text = host_tuning.sysctl_text(values)
    sha1 = __import__("hashlib").sha1(text.encode()).hexdigest()
    lines = {
        Request(File, {"path": path}): [
            f"user=root group=root mode=-rw-r--r-- atime=1 mtime=1 ctime=1 size=9 '{path}'"
        ],
        Request(Sha1File, {"path": path}): [f"{sha1}  {path}"],
        Request(Directory, {"path": "/etc/sysctl.d"}): [
            "user=root group=root mode=drwxr-xr-x atime=1 mtime=1 ctime=1 size=9 '/etc/sysctl.d'"
        ],
        Request(host_tuning.SysctlValues, {"keys": sorted(values)}): [f"{k}={v}" for k, v in sorted(values.items())],
    }
    reads = [r.shell() for r in lines]
    answers = [{"rc": 0, "lines": v} for v in lines.values()]
    monkeypatch.setattr(batch, "new_nonce", lambda: NONCE)
    fake = create_host(
        FakeState(), facts={"host_state.HostState": {get_kwargs_str({"reads": reads, "nonce": NONCE}): answers}}
    )
    facts = HostFacts(fake, None)
    for req in lines:  # as kept by the last run
        facts.asked[req.key] = req
        facts.kept.add(req.key)
    fake.get_fact = facts.get_fact
    with ctx_state.use(fake.state), ctx_host.use(fake):
        commands = list(host_tuning.sysctl_file._inner(values=values, path=path))
    assert commands == [] and fake.noop_description == "2 sysctls set"
    assert facts.counts == {"batch": 1, "cached": 4}


# --------------------------------------------------------------------------- the pyinfra CLI, on this machine

DEPLOY = """
import os
from io import StringIO

from pyinfra.operations import files

from ironserve.hostdata import HostData
from roles import host_state


class Ctx:
    model = "local-test"
    host = HostData(host_state_cache=os.environ["HS_CACHE"])


host_state.install(Ctx())
base = os.environ["HS_BASE"]
files.directory(name="dir", path=f"{base}/d")
files.put(name="put a", src=StringIO("a\\n"), dest=f"{base}/d/a.conf", mode="644")
files.put(name="put b", src=StringIO("b\\n"), dest=f"{base}/d/b.conf", mode="600")
files.line(name="line", path=f"{base}/line.conf", line="^y=", replace="y=1")
host_state.end_planning()
"""


def test_pyinfra_runs_no_op_in_one_command_and_still_repairs_drift(tmp_path):
    """The pyinfra CLI on @local (files under tmp_path): a first run converges, a no-op (-y: facts are read while
    executing) and a dry run send one command, drift is repaired with the reads after the change made alone."""
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY)
    base = tmp_path / "base"
    (tmp_path / "base").mkdir()
    (base / "line.conf").write_text("y=0\n")
    env = {**os.environ, "PYTHONPATH": str(root), "HS_CACHE": str(tmp_path / "cache"), "HS_BASE": str(base)}

    def pyinfra(*args):
        out = subprocess.run(
            [str(Path(sys.executable).parent / "pyinfra"), "--debug", *args, "@local", str(deploy)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        log = out.stdout + out.stderr
        return log.count("Running command on localhost"), log

    pyinfra("-y")
    assert (base / "d/b.conf").read_text() == "b\n" and (base / "line.conf").read_text() == "y=1\n"
    sent, log = pyinfra("-y")
    assert sent == 1 and "Grand total   4       -         -       4" in log
    sent, _ = pyinfra("--dry")
    assert sent == 1
    (base / "d/b.conf").write_text("drift\n")
    (base / "d/a.conf").chmod(0o666)
    pyinfra("-y")
    assert (base / "d/b.conf").read_text() == "b\n" and (base / "d/a.conf").stat().st_mode & 0o777 == 0o644
    sent, _ = pyinfra("-y")
    assert sent == 1


def test_a_planted_cache_entry_never_runs(local, tmp_path, caplog):
    """The kept questions are a file on the controller: only ironserve's batchable fact classes (its roles', and
    pyinfra's read-only ones its operations ask) with plain JSON arguments are read back; anything else is
    ignored with a warning, never run."""
    import json

    pwned = tmp_path / "pwned"
    planted = [
        ["pyinfra.facts.server", "Command", {"command": f"touch {pwned}1"}],
        ["roles.sglang_service", "ParseCheck", {"probe": f"touch {pwned}2"}],  # a probe that acts
        ["os", "system", {"command": f"touch {pwned}3"}],
        ["roles.host_state", "File", {"path": "/etc/hostname"}],  # pyinfra's class under another module
        ["roles.host_tuning", "SysctlValues", "keys"],
        ["pyinfra.facts.server", "Arch", {}],
    ]
    cache = tmp_path / "cache" / "local.json"
    cache.parent.mkdir()
    cache.write_text(json.dumps({"host": "@local", "facts": planted}))
    with caplog.at_level("WARNING"):
        facts = local["facts"]()
    assert [r.key for r in facts.asked.values()] == ["pyinfra.facts.server.Arch({})"]
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(ignored) == 5 and "pyinfra.facts.server.Command is not one of ironserve's fact classes" in ignored[0]
    local["host"].get_fact(Arch)  # the batched read of what was kept
    assert facts.counts["batch"] == 1 and not list(tmp_path.glob("pwned*"))
    from pyinfra.facts.server import Command

    from roles.sglang_service import ParseCheck

    assert host_state.kept_fact(host_tuning.SysctlValues) and host_state.kept_fact(File)
    assert not host_state.kept_fact(ParseCheck) and not host_state.kept_fact(Command)


# --------------------------------------------------------------------------- killing mutation survivors


def test_every_command_drops_the_answers_read_after_the_one_before(local):
    """Not only the first command of a run: a value read between two commands is gone after the second."""
    host, path = local["host"], local["path"]
    local["facts"]()
    host.get_fact(Sha1File, path=path)
    facts = local["facts"]()
    for line in ("y = 2", "z = 3", "w = 4"):
        host.run_shell_command(f"echo {line!r} >> {path}")
        now = subprocess.run(["sha1sum", path], capture_output=True, text=True).stdout.split()[0]
        assert host.get_fact(Sha1File, path=path) == now
    assert facts.counts == {"batch": 1, "cached": 1, "single": 2}


def test_an_upload_drops_the_answers(local, tmp_path):
    from io import StringIO

    host, path = local["host"], local["path"]
    local["facts"]()
    host.get_fact(Sha1File, path=path)
    facts = local["facts"]()
    before = host.get_fact(Sha1File, path=path)
    host.put_file(StringIO("uploaded\n"), path)
    after = host.get_fact(Sha1File, path=path)
    assert (
        after != before and after == subprocess.run(["sha1sum", path], capture_output=True, text=True).stdout.split()[0]
    )
    assert facts.counts == {"batch": 1, "cached": 1, "single": 1}


def test_plain_json_is_text_numbers_booleans_null_lists_and_text_keyed_objects_eight_deep():
    deep = lambda n: 1 if n == 0 else [deep(n - 1)]  # noqa: E731 - n nested lists
    for plain in (None, "x", True, 0, 1.5, [], {}, ["a", 1, None], {"a": {"b": [1, "c"]}}, deep(8)):
        assert host_state.json_plain(plain), plain
    for other in (object(), ("a",), {"a"}, {1: "x"}, {"a": [b"x"]}, [1, {"b": ("t",)}], deep(9), {"a": deep(8)}):
        assert not host_state.json_plain(other), other


def test_the_questions_are_kept_in_a_private_directory_created_as_needed(local, tmp_path):
    host = local["host"]
    for name in ("get_fact", "run_shell_command", "put_file"):
        host.__dict__.pop(name, None)
    deep = tmp_path / "a" / "b" / "local.json"
    for _ in range(2):  # the second run finds the directory there
        facts = HostFacts(host, deep)
        host.get_fact = facts.get_fact
        host.get_fact(Arch)
        facts.end_planning()
        assert "Arch" in deep.read_text()
        deep.unlink()
    assert (deep.parent.stat().st_mode & 0o777) == 0o700


def test_the_questions_file_is_one_per_model_host_and_address_under_the_cache_directory(tmp_path, monkeypatch):
    import re

    monkeypatch.setenv("HOME", str(tmp_path))
    path = host_state.cache_file("~/hs", "glm5", "node 1/a", "10.0.0.1")
    assert path.parent == tmp_path / "hs" and re.fullmatch(r"node_1_a-[0-9a-f]{16}\.json", path.name), path
    others = {
        host_state.cache_file("~/hs", *k)
        for k in (
            ("glm5", "node 1/a", "10.0.0.2"),
            ("glm5x", "node 1/a", "10.0.0.1"),
            ("glm", "5node 1/a", "10.0.0.1"),
            ("glm5", "node 1/", "a10.0.0.1"),
        )
    }
    assert path not in others and len(others) == 4
    assert path == host_state.cache_file("~/hs", "glm5", "node 1/a", "10.0.0.1")
    assert len(host_state.cache_file("~/hs", "m", "h" * 100, "a").name) == 40 + 1 + 16 + 5
    assert host_state.cache_file("", "m", "h", "a") is None and host_state.cache_file(None, "m", "h", "a") is None


def test_install_keys_the_questions_by_the_address_and_routes_the_host_through_them(local, tmp_path):
    class Ctx:
        model = "glm5"

        def __init__(self, data):
            self.host = HostData(**data)

    host = local["host"]
    facts = host_state.install(Ctx({"host_state_cache": str(tmp_path / "hs"), "ssh_hostname": "10.0.0.9"}))
    assert facts.cache_file == host_state.cache_file(str(tmp_path / "hs"), "glm5", host.name, "10.0.0.9")
    assert facts.cache_file != host_state.cache_file(str(tmp_path / "hs"), "glm5", host.name, host.name)
    from io import StringIO

    host.get_fact(Arch)
    host.run_shell_command("true")
    host.get_fact(Arch)
    assert facts.counts == {"batch": 1, "cached": 1, "single": 1} and local["state"].ironserve_changes == 1
    host.put_file(StringIO("x\n"), str(tmp_path / "uploaded"))
    assert local["state"].ironserve_changes == 2
    del host.ironserve_host_facts
    for name in ("get_fact", "run_shell_command", "put_file"):
        host.__dict__.pop(name, None)
    plain = host_state.install(Ctx({"host_state_cache": str(tmp_path / "hs")}))
    assert plain.cache_file == host_state.cache_file(str(tmp_path / "hs"), "glm5", host.name, host.name)


def test_a_kept_entry_is_refused_saying_why(local, tmp_path, caplog):
    import json

    deep = {"a": 1}
    for _ in range(9):
        deep = {"a": deep}
    planted = [
        (["pyinfra.facts.server", "Arch", {}, "extra"], "not [module, class, arguments]"),
        (["pyinfra.facts.server", "Arch"], "not [module, class, arguments]"),
        (
            ["roles.sglang_service", "LIB_DIR", {}],
            "roles.sglang_service.LIB_DIR is not one of ironserve's batchable fact classes",
        ),
        (["pyinfra.facts.server", "Arch", deep], "the arguments of pyinfra.facts.server.Arch are not plain JSON"),
    ]
    kept = ["roles.host_tuning", "SysctlValues", {"keys": ["vm.swappiness"]}]
    cache = tmp_path / "cache" / "local.json"
    cache.parent.mkdir()
    cache.write_text(json.dumps({"host": "@local", "facts": [entry for entry, _ in planted] + [kept]}))
    with caplog.at_level("WARNING"):
        facts = local["facts"]()
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert [m.rsplit(" (", 1)[-1] for m in ignored] == [f"{why})" for _, why in planted]
    assert [r.as_json() for r in facts.asked.values()] == [kept]


def test_a_file_asked_about_brings_its_hash_and_directory_checks_to_the_next_run(local):
    host = local["host"]
    facts = local["facts"]()
    host.get_fact(File, path=local["path"])
    facts.end_planning()
    kept = json_text(facts.cache_file)
    assert all(f'"{name}"' in kept for name in ("File", "Sha1File", "Directory")), kept


def test_a_question_first_asked_while_the_stage_executes_is_kept(local):
    host = local["host"]
    facts = local["facts"]()
    host.get_fact(Arch)
    facts.end_planning()
    facts.stage_ops.add(host.current_op_hash)  # an operation of the prepare stage, executing
    host.get_fact(Hostname)
    assert "Hostname" in json_text(facts.cache_file)
    facts = local["facts"]()  # the next run: both kept; Hostname asked only once its operation executes
    host.get_fact(Arch)
    facts.end_planning()
    assert "Hostname" not in json_text(facts.cache_file)
    facts.stage_ops.add(host.current_op_hash)
    host.get_fact(Hostname)
    assert "Hostname" in json_text(facts.cache_file)


def test_what_a_run_asks_again_is_kept_run_after_run(local):
    host = local["host"]
    for _ in range(3):
        facts = local["facts"]()
        host.get_fact(Arch)
        facts.end_planning()
        assert "Arch" in json_text(facts.cache_file)
    assert facts.counts == {"batch": 1, "cached": 1}


def test_answers_handed_out_are_copies_whoever_changes_them(local):
    from pyinfra.facts.server import Users

    host = local["host"]
    local["facts"]()
    host.get_fact(Users)
    facts = local["facts"]()
    for _ in range(2):  # from the batched read, then read alone after a command
        first = host.get_fact(Users)
        name = next(iter(first))
        first[name]["groups"].append("planted")
        assert "planted" not in host.get_fact(Users)[name]["groups"]
        host.run_shell_command("true")
    assert facts.counts["single"] == 1


def test_a_command_before_the_first_question_does_not_waste_the_batched_read(local):
    host, sent = local["host"], local["sent"]
    first = local["facts"]()
    ask_all(host, local["path"])
    first.end_planning()
    local["facts"]()
    host.run_shell_command("true")
    sent.clear()
    ask_all(host, local["path"])
    assert len(sent) == 1


def test_a_command_is_run_with_its_arguments(local):
    ok, output = local["host"].run_shell_command("echo $HS_X", _env={"HS_X": "given"})
    assert ok and output.stdout == "given"


def test_a_fact_whose_arguments_are_not_plain_data_is_read_alone(local):
    import shutil

    from pyinfra.api import StringCommand
    from pyinfra.facts.server import Which

    facts = local["facts"]()
    assert local["host"].get_fact(Which, command=StringCommand("sh")) == shutil.which("sh")
    assert facts.counts == {"single": 1} and not facts.asked


def test_a_fact_asked_with_positional_arguments_is_read_alone_with_them(local):
    host, path = local["host"], local["path"]
    facts = local["facts"]()
    digest = subprocess.run(["sha1sum", path], capture_output=True, text=True).stdout.split()[0]
    assert host.get_fact(Sha1File, path) == digest  # batched while planning
    facts.end_planning()
    host.run_shell_command("true")
    assert host.get_fact(Sha1File, path) == digest and facts.counts == {"batch": 1, "cached": 1, "single": 1}


def test_an_operation_added_while_planning_has_its_questions_batched_when_it_executes(local):
    from pyinfra.api.operation import add_op
    from pyinfra.operations import server

    host, state = local["host"], local["state"]
    first = local["facts"]()
    host.get_fact(Arch)
    first.end_planning()
    facts = local["facts"]()
    add_op(state, server.shell, commands=["true"])
    facts.end_planning()
    (op_hash,) = state.ops[host]
    host.current_op_hash = op_hash  # as pyinfra sets it while that operation executes
    try:
        host.get_fact(Arch)
    finally:
        host.current_op_hash = None
    assert facts.counts == {"batch": 1, "cached": 1}


def test_a_failed_read_in_the_batch_leaves_the_others_answered(local):
    host, path = local["host"], local["path"]
    facts = local["facts"]()
    for req in (Request(File, {"path": path}), Request(Arch, {})):
        facts.asked[req.key] = req
        facts.kept.add(req.key)
    failing = facts.asked[Request(File, {"path": path}).key]
    failing.shell = lambda: "echo 'user=x group=y mode=-rw-rw-rw- atime=1 mtime=1 ctime=1 size=1'; exit 1"  # noqa: E731
    assert host.get_fact(File, path=path)["mode"] == 644  # its output is not believed: read again alone
    assert host.get_fact(Arch)
    assert facts.counts == {"batch": 1, "single": 1, "cached": 1}


def test_answers_whose_markers_are_out_of_place_answer_nothing():
    lines = run_sh(HostState().command(reads=["echo one", "echo two"], nonce=NONCE))
    assert HostState().process(lines) == [{"rc": 0, "lines": ["one"]}, {"rc": 0, "lines": ["two"]}]
    assert HostState().process([line for line in lines if line != f"{NONCE} 0 0"]) == [None, None]


def test_a_question_is_the_same_whatever_the_order_of_its_arguments():
    from pyinfra.facts.files import FindInFile

    assert (
        Request(FindInFile, {"path": "/p", "pattern": "x"}).key
        == Request(FindInFile, {"pattern": "x", "path": "/p"}).key
    )


def test_a_fact_that_needs_a_binary_is_answered_in_the_batch(local):
    from pyinfra.facts.deb import DebPackages

    host = local["host"]
    alone = host.get_fact(DebPackages)
    first = local["facts"]()
    host.get_fact(DebPackages)
    first.end_planning()
    facts = local["facts"]()
    assert host.get_fact(DebPackages) == alone and facts.counts == {"batch": 1, "cached": 1}


def test_a_command_from_a_host_that_read_nothing_yet_drops_every_hosts_answers(local):
    host, path = local["host"], local["path"]
    local["facts"]()
    host.get_fact(Sha1File, path=path)
    facts = local["facts"]()
    host.get_fact(Sha1File, path=path)
    other = HostFacts(host, None)  # another host of the run, which has not read anything
    other.run_shell_command(f"echo 'y = 2' >> {path}")
    now = subprocess.run(["sha1sum", path], capture_output=True, text=True).stdout.split()[0]
    assert host.get_fact(Sha1File, path=path) == now and facts.counts["single"] == 1


def test_a_cache_file_that_is_not_a_list_of_questions_is_ignored(local, tmp_path):
    import json

    cache = tmp_path / "cache" / "local.json"
    cache.parent.mkdir()
    for facts in (5, "Arch", None):
        cache.write_text(json.dumps({"host": "@local", "facts": facts}))
        assert not local["facts"]().asked


def test_an_ignored_entry_is_named_in_the_warning_cut_at_120_characters(local, tmp_path, caplog):
    import json

    entry = ["x" * 200, "Fact", {}]
    cache = tmp_path / "cache" / "local.json"
    cache.parent.mkdir()
    cache.write_text(json.dumps({"host": "@local", "facts": [entry]}))
    with caplog.at_level("WARNING"):
        local["facts"]()
    (message,) = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert f"entry {json.dumps(entry)[:120]} ignored" in message


def test_a_failed_read_whose_output_parses_is_still_not_believed(local):
    host = local["host"]
    facts = local["facts"]()
    req = Request(Hostname, {})
    facts.asked[req.key] = req
    facts.kept.add(req.key)
    req.shell()  # the fact built, as for every question read in a batch
    req.shell = lambda: "echo not-this-host; exit 1"  # noqa: E731 - a value, and a failed status
    real = subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip()
    assert host.get_fact(Hostname) == real and facts.counts == {"batch": 1, "single": 1}


def test_plain_json_counts_an_objects_depth_like_a_lists():
    deep = lambda n: 1 if n == 0 else [deep(n - 1)]  # noqa: E731 - n nested lists
    assert host_state.json_plain({"a": deep(7)}) and host_state.json_plain([deep(7)])
    assert not host_state.json_plain({"a": {"b": deep(7)}})


def test_commands_and_uploads_reach_the_host_with_all_their_arguments(local):
    host = local["host"]
    for name in ("get_fact", "run_shell_command", "put_file"):
        host.__dict__.pop(name, None)
    given = []
    host.run_shell_command = lambda *args, **kwargs: given.append(("run", args, kwargs)) or (True, None)
    host.put_file = lambda *args, **kwargs: given.append(("put", args, kwargs)) or True
    facts = HostFacts(host, None)
    assert facts.run_shell_command("true", _sudo=True, print_output=True) == (True, None)
    assert facts.put_file("src", "/dest", remote_temp_filename="/tmp/x", _sudo=True) is True
    assert given == [
        ("run", ("true",), {"_sudo": True, "print_output": True}),
        ("put", ("src", "/dest"), {"remote_temp_filename": "/tmp/x", "_sudo": True}),
    ]


def test_the_deploys_end_of_planning_reaches_the_hosts_installed_facts(local):
    host = local["host"]
    host_state.end_planning()  # nothing installed on this host: nothing to do
    facts = local["facts"]()
    host.ironserve_host_facts = facts
    try:
        host.get_fact(Arch)
        host_state.end_planning()
        assert facts.planning is False and "Arch" in json_text(facts.cache_file)
    finally:
        del host.ironserve_host_facts


def test_a_hosts_name_keeps_its_letters_in_the_questions_file(tmp_path):
    path = host_state.cache_file(str(tmp_path), "glm5", "Node-A.rack_2", "10.0.0.1")
    assert path.name.startswith("Node-A.rack_2-")


# --------------------------------------------------------------------------- what a run asked (roles/converged.py)


def test_with_noting_on_every_question_of_the_run_is_noted_batched_or_alone(local):
    from roles.sglang_service import ParseCheck

    host = local["host"]
    facts = local["facts"]()
    facts.noting = True
    ask_all(host, local["path"])
    facts.end_planning()
    host.get_fact(Arch)  # after planning, outside the stage: read alone, noted all the same
    host.get_fact(ParseCheck, probe="echo probed")  # a probe that acts: never replayable
    host.get_fact(Hostname, _sudo_user="nobody")  # another user's read: not replayable either
    keys = set(facts.run_requests())
    assert {f"{File.__module__}.File", f"{Sha1File.__module__}.Sha1File"} <= {k.split("(")[0] for k in keys}
    assert any(k.startswith("pyinfra.facts.server.Arch(") for k in keys)
    assert facts.unreplayable == {"ParseCheck", "Hostname"}


def test_a_hosts_reads_asked_by_a_peers_plan_before_its_own_stage_are_noted_and_passed_on(local):
    host = local["host"]
    for name in ("get_fact", "run_shell_command", "put_file"):
        host.__dict__.pop(name, None)
    host_state.note_early_reads([host])
    host.get_fact(Arch)  # an engine host's plan asks the router host before the router host's stage starts
    host.get_fact(Hostname, _sudo_user="nobody")
    facts = local["facts"]()
    facts.noting = True
    assert any(k.startswith("pyinfra.facts.server.Arch(") for k in facts.run_requests())
    assert facts.unreplayable == {"Hostname"} and "ironserve_early_reads" not in host.__dict__
    host.ironserve_host_facts = facts
    try:
        host_state.note_early_reads([host])  # installed already: its own facts note what it is asked
        assert host.get_fact == facts.get_fact
    finally:
        del host.ironserve_host_facts


def test_with_noting_off_nothing_is_noted(local):
    facts = local["facts"]()
    ask_all(local["host"], local["path"])
    assert facts.noted == {} and facts.unreplayable == set()


def test_a_read_only_command_keeps_the_answers_and_is_no_change(local):
    host, sent = local["host"], local["sent"]
    facts = host.ironserve_host_facts = local["facts"]()  # as install() leaves it
    ask_all(host, local["path"])
    sent.clear()
    ok, out = run_unread(host, "echo read")
    assert ok and out.stdout_lines == ["read"]
    assert not changes_made(local["state"])
    assert host.get_fact(Sha1File, path=local["path"]) is not None and len(sent) == 1  # still the batched answer
    host.run_shell_command("true")
    assert changes_made(local["state"]) and facts.counts["batch"] == 1
