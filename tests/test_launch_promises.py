"""The launch's promises, executed offline (roles/launch.py): rank 0 of every group first, the other ranks next, the
routers last; every rank made live in one wave before any of them starts; a running unit restarted only when stale;
a rank already following rank 0's invocation not restarted again, a stale one restarted; a failed gate rolls its
group back, a gate that did not run vouches for nothing; the last good configuration saved only after a pass.

The hosts are small fakes answering by command text and recording each command (with its sudo); the pyinfra
operations the launch calls are replaced by recorders, so what is checked is what the launch asks for, in order."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ironserve import catalogue
from ironserve.render import Process
from ironserve.units import deliberate, following_path
from roles import launch
from roles.common import UnitState
from roles.context import build_context

PD = "glm5.1-w4a8-a3-2p1d-48-128k-prefix90"  # 2 prefill groups and a decode group of 2 ranks each, a router
ROUTER = ("r", {"ssh_hostname": "10.0.0.9", "ironserve_role": "router", "hardware": "cpu-lab"})


# --------------------------------------------------------------------------- fakes


class _Host:
    """A host answering each command by the first key of ``answers`` found in it (lines, or a callable of the
    command giving (ok, lines)); every command is recorded with its sudo, every log line kept."""

    def __init__(self, name: str, answers: dict | None = None, sudo: bool = False, ok=lambda command: True):
        self.name, self.answers, self.ok = name, dict(answers or {}), ok
        self.data = {"_sudo": True} if sudo else {}
        self.commands: list[str] = []
        self.sudo_of: list = []
        self.logs: list[str] = []

    def run_shell_command(self, command, _sudo=None, **kwargs):
        self.commands.append(command)
        self.sudo_of.append(_sudo)
        for key, answer in self.answers.items():
            if key in command:
                ok, lines = answer(command) if callable(answer) else (True, answer)
                return ok, SimpleNamespace(stdout_lines=list(lines), stdout="\n".join(lines), stderr_lines=[])
        return self.ok(command), SimpleNamespace(stdout_lines=[], stdout="", stderr_lines=[])

    def log(self, message):
        self.logs.append(message)

    def log_styled(self, message, **kwargs):
        self.logs.append(message)

    def restarts(self, unit: str) -> int:
        return self.commands.count(deliberate("restart", unit))


def _state(*hosts: _Host):
    by_name = {h.name: h for h in hosts}
    return SimpleNamespace(inventory=SimpleNamespace(get_host=by_name.get), activated_hosts=set(hosts))


class _Clock:
    """launch's time and sleep: each sleep advances the clock by what it was asked."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(launch, "time", SimpleNamespace(monotonic=c.monotonic))
    monkeypatch.setattr(launch, "_sleep", c.sleep)
    return c


def _proc(role="server", group=0, instance=0, node_rank=0, nnodes=1, host="h", unit="u", **kwargs) -> Process:
    return Process(
        host=host,
        address="10.0.0.1",
        role=role,
        node_rank=node_rank,
        argv=[],
        env={},
        group=group,
        instance=instance,
        nnodes=nnodes,
        unit=unit,
        **kwargs,
    )


# --------------------------------------------------------------------------- start order


def test_rank0_of_every_group_first_then_the_other_ranks_then_the_routers():
    procs = [
        _proc("router", group=-1, unit="router"),
        _proc("server", group=0, instance=1, node_rank=1, nnodes=2, unit="s1r1"),
        _proc("decode", group=0, node_rank=1, nnodes=2, unit="d0r1"),
        _proc("server", group=0, instance=1, node_rank=0, nnodes=2, unit="s1r0"),
        _proc("decode", group=0, node_rank=0, nnodes=2, unit="d0r0"),
        _proc("prefill", group=1, instance=1, node_rank=0, nnodes=2, unit="p1i1r0"),
        _proc("server", group=0, instance=0, unit="s0"),
        _proc("prefill", group=1, instance=0, node_rank=2, nnodes=3, unit="p1i0r2"),
        _proc("prefill", group=1, instance=0, node_rank=1, nnodes=3, unit="p1i0r1"),
        _proc("prefill", group=1, instance=0, node_rank=0, nnodes=3, unit="p1i0r0"),
        _proc("router", group=-1, instance=1, unit="router2"),
    ]
    waves = launch.start_order(procs)
    # prefill before decode before server whatever their group index; then group, instance, rank
    assert [[p.unit for p in wave] for wave in waves] == [
        ["p1i0r0", "p1i1r0", "d0r0", "s0", "s1r0"],
        ["p1i0r1", "p1i0r2", "d0r1", "s1r1"],
        ["router", "router2"],  # the routers in the order given
    ]


def test_prefill_decode_and_server_each_precede_the_next_whatever_their_group_index():
    procs = [
        _proc("server", group=0, unit="s"),
        _proc("decode", group=1, unit="d"),
        _proc("prefill", group=2, unit="p"),
    ]
    assert [p.unit for p in launch.start_order(procs)[0]] == ["p", "d", "s"]
    assert [p.unit for p in launch.start_order(procs[:2])[0]] == ["d", "s"]
    # an engine role the order does not name comes after the named ones
    other = [_proc("other", group=0, unit="o"), _proc("server", group=5, unit="s")]
    assert [p.unit for p in launch.start_order(other)[0]] == ["s", "o"]
    assert launch.start_order([]) == [[], [], []]


# --------------------------------------------------------------------------- facts and helpers


def test_need_daemon_reload_names_each_unit_whose_file_is_not_what_systemd_loaded():
    output = [
        "NeedDaemonReload=yes",  # before any Id: belongs to no unit
        "Id=a.service",
        "NeedDaemonReload=no",
        "LoadState=loaded",
        "",
        "Id=b.service",
        "LoadState=loaded",
        "NeedDaemonReload=yes",
        "",
        "  Id=c.service  ",
        "NeedDaemonReload=no",
        "LoadState=not-found",  # known as not-found while its file exists now
        "Id=d.service",
        "LoadState=masked",
    ]
    assert launch.NeedDaemonReload().process(output) == {
        "a.service": False,
        "b.service": True,
        "c.service": True,
        "d.service": False,
    }
    assert launch.NeedDaemonReload().process([]) == {}
    assert launch.NeedDaemonReload().command(["a.service", "b c.service"]) == (
        "systemctl show -p Id -p NeedDaemonReload -p LoadState a.service 'b c.service'"
    )


def test_a_file_is_stale_only_when_written_after_the_units_start():
    mtimes = {"/b": 101, "/a": 150, "/same": 100, "/old": 99}
    assert launch.stale_paths({"since": 100, "mtimes": mtimes}) == ["/a", "/b"]  # sorted, same second not stale
    assert launch.stale_paths({"since": None, "mtimes": mtimes}) == []  # not started: nothing to be stale against
    assert launch.stale_paths({"since": 0, "mtimes": mtimes}) == []
    assert launch.stale_paths({"since": 100, "mtimes": None}) == []
    assert launch.stale_paths({"since": 100}) == []
    assert launch.stale_paths({}) == []


@pytest.mark.parametrize(
    "flag, wanted",
    [(True, True), (False, False), (None, False), (1, True), ([], False), (lambda: 1, True), (lambda: [], False)],
)
def test_a_restart_flag_is_a_value_or_a_callable_asked_when_the_operation_runs(flag, wanted):
    assert launch._wants_restart(flag) is wanted


def test_show_reads_a_units_invocation_and_state():
    h = _Host("n0", {"systemctl show": ["InvocationID=abc", "  ActiveState=active  ", "garbage", "X=a=b"]})
    assert launch._show(h.run_shell_command, "my unit") == {"InvocationID": "abc", "ActiveState": "active", "X": "a=b"}
    assert h.commands == ["systemctl show -p InvocationID -p ActiveState 'my unit'.service"]


def test_following_reads_the_guards_record_and_nothing_else():
    record = {"leader_invocation": "g", "engine_invocation": "e"}
    lines = json.dumps(record, indent=1).splitlines()  # a record over several lines
    h = _Host("n1", {"cat ": lines})
    assert launch._following(h.run_shell_command, "u") == record
    assert h.commands == [f"cat {following_path('u')} 2>/dev/null || true"]
    assert launch._following(_Host("n1", {"cat ": []}).run_shell_command, "u") == {}
    assert launch._following(_Host("n1", {"cat ": ["{not json"]}).run_shell_command, "u") == {}


# --------------------------------------------------------------------------- a rank following rank 0


def _rank(
    name="n1", invocation="r1", active="active", following=None, mtimes=None, since=100, sudo=False, ok=True, polls=0
):
    """A rank > 0: its engine's InvocationID and state, its guard's record (``polls`` reads without one first),
    the UnitState of its files."""
    reads = {"n": 0}

    def follow(command):
        reads["n"] += 1
        return True, ([json.dumps(following)] if following and reads["n"] > polls else [])

    unit_state = [f"ActiveState={active}", f"ActiveEnterTimestamp=@{since}"] + [
        f"mtime {t} {p}" for p, t in (mtimes or {}).items()
    ]
    return _Host(
        name,
        {
            "-p InvocationID": [f"InvocationID={invocation}", f"ActiveState={active}"],
            "cat /run/": follow,
            "ActiveEnterTimestamp": unit_state,
            "systemctl restart": lambda command: (ok, []),
        },
        sudo=sudo,
    )


def _head(invocation="g2", sudo=False):
    return _Host("n0", {"-p InvocationID": [f"InvocationID={invocation}", "ActiveState=active"]}, sudo=sudo)


FOLLOWS = {"leader_invocation": "g2", "engine_invocation": "r1"}


@pytest.mark.parametrize("active", ["active", "activating"])
def test_a_rank_that_follows_rank0s_invocation_is_not_restarted_again(clock, active):
    head, me = _head(), _rank(active=active, following=FOLLOWS)
    assert launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], follow_s=10) is True
    assert me.restarts("u") == 0 and clock.slept == []
    # rank 0's own unit asked on rank 0's host, the rank's on its own
    assert head.commands == ["systemctl show -p InvocationID -p ActiveState u0.service"]
    assert me.commands == [
        "systemctl show -p InvocationID -p ActiveState u.service",
        f"cat {following_path('u')} 2>/dev/null || true",
    ]
    assert "follows rank 0's invocation g2 (n0)" in me.logs[-1]


@pytest.mark.parametrize(
    "active, following",
    [
        ("failed", FOLLOWS),  # its record is of an engine that is not running
        ("inactive", FOLLOWS),
        ("reloading", FOLLOWS),
        ("active", {"leader_invocation": "g1", "engine_invocation": "r1"}),  # rank 0's previous generation
        ("active", {"leader_invocation": "g2", "engine_invocation": "r0"}),  # an engine that is gone
        ("active", {"engine_invocation": "r1"}),
        ("active", {"leader_invocation": "g2"}),
        ("active", None),
    ],
)
def test_a_rank_not_following_rank0_is_restarted_once_after_waiting_for_its_guard(clock, active, following):
    head, me = _head(), _rank(active=active, following=following)
    assert launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], follow_s=10) is True
    assert me.restarts("u") == 1 and me.commands[-1] == deliberate("restart", "u")
    # polled every 2s until follow_s passed, never longer
    assert clock.slept == [2] * 5
    assert me.logs[-1] == "u: not following rank 0's invocation g2: restarting it"


def test_a_rank_whose_guard_follows_within_the_wait_is_left_to_it(clock):
    head, me = _head(), _rank(following=FOLLOWS, polls=3)
    assert launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], follow_s=10) is True
    assert me.restarts("u") == 0 and clock.slept == [2, 2, 2]


def test_a_guard_that_follows_only_after_the_wait_is_too_late(clock):
    head, me = _head(), _rank(following=FOLLOWS, polls=3)
    launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], follow_s=4)
    assert me.restarts("u") == 1 and clock.slept == [2, 2]


def test_rank0_not_running_means_no_group_to_follow_the_rank_restarts_at_once(clock):
    head, me = _head(invocation=""), _rank(following=FOLLOWS)
    assert launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], follow_s=10) is True
    assert me.commands == [deliberate("restart", "u")] and clock.slept == []
    assert me.logs[-1] == "u: not following rank 0's invocation (none): restarting it"
    head = _Host("n0", {"-p InvocationID": ["ActiveState=inactive"]})
    me = _rank(following=FOLLOWS)
    launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], follow_s=10)
    assert me.commands == [deliberate("restart", "u")]


def test_a_rank_following_rank0_but_started_before_its_own_new_files_is_restarted(clock):
    head = _head()
    me = _rank(following=FOLLOWS, since=100, mtimes={"/etc/u.env": 150})
    assert launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], ["/etc/u.env"], follow_s=10)
    assert me.restarts("u") == 1 and clock.slept == []  # no wait: the guard cannot fix that
    assert UnitState().command("u", ["/etc/u.env"]) in me.commands
    fresh = _rank(following=FOLLOWS, since=200, mtimes={"/etc/u.env": 150})
    assert launch.restart_unless_following(_state(head, fresh), fresh, "u", ["n0", "u0"], ["/etc/u.env"], follow_s=10)
    assert fresh.restarts("u") == 0


def test_a_failed_restart_of_a_rank_fails_the_operation(clock):
    head, me = _head(), _rank(following=None, ok=False)
    assert launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], follow_s=0) is False


@pytest.mark.parametrize("sudo", [False, True])
def test_every_command_of_the_follow_check_runs_with_its_own_hosts_sudo(clock, sudo):
    head, me = _head(sudo=not sudo), _rank(following=None, sudo=sudo, mtimes={"/p": 1})
    launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"], ["/p"], follow_s=2)
    assert head.sudo_of == [not sudo]
    assert me.sudo_of == [sudo] * len(me.commands) and me.restarts("u") == 1


def test_the_default_wait_for_a_guard_is_the_guards_follow_time(clock):
    from ironserve.units import RANK_FOLLOW_S

    head, me = _head(), _rank(following=None)
    launch.restart_unless_following(_state(head, me), me, "u", ["n0", "u0"])
    assert RANK_FOLLOW_S <= sum(clock.slept) < RANK_FOLLOW_S + 2 and me.restarts("u") == 1


# --------------------------------------------------------------------------- restart only when stale


def test_a_unit_whose_files_did_not_change_in_this_run_is_not_restarted(clock):
    me = _rank(mtimes={"/etc/u.env": 90}, since=100)
    assert launch.restart_if_stale(None, me, "u", ["/etc/u.env"], None) is True
    assert me.restarts("u") == 0 and "u: its live files did not change: not restarted" in me.logs
    assert me.commands == [UnitState().command("u", ["/etc/u.env"])]


@pytest.mark.parametrize("sudo", [False, True])
def test_a_unit_whose_file_became_live_after_its_start_is_restarted_with_the_hosts_sudo(clock, sudo):
    me = _rank(mtimes={"/etc/u.env": 150}, since=100, sudo=sudo)
    assert launch.restart_if_stale(None, me, "u", ["/etc/u.env"], None) is True
    assert me.commands == [UnitState().command("u", ["/etc/u.env"]), deliberate("restart", "u")]
    assert me.sudo_of == [sudo, sudo]
    failing = _rank(mtimes={"/etc/u.env": 150}, since=100, ok=False)
    assert launch.restart_if_stale(None, failing, "u", ["/etc/u.env"], None) is False


def test_a_stale_rank_restarts_unless_it_already_follows_rank0(clock):
    head = _head()
    me = _rank(mtimes={"/etc/u.env": 150}, since=100, following=None)
    assert launch.restart_if_stale(_state(head, me), me, "u", ["/etc/u.env"], ["n0", "u0"]) is True
    assert head.commands and me.restarts("u") == 1
    # its guard follows rank 0, but the rank started before its own new files: restarted all the same
    head, me = _head(), _rank(mtimes={"/etc/u.env": 150}, since=100, following=FOLLOWS)
    assert launch.restart_if_stale(_state(head, me), me, "u", ["/etc/u.env"], ["n0", "u0"]) is True
    assert me.restarts("u") == 1
    # not stale: rank 0 is not even asked
    head, me = _head(), _rank(mtimes={"/etc/u.env": 50}, since=100, following=None)
    assert launch.restart_if_stale(_state(head, me), me, "u", ["/etc/u.env"], ["n0", "u0"]) is True
    assert head.commands == [] and me.restarts("u") == 0


# --------------------------------------------------------------------------- the gate and its rollback


def _probe(code, active="active", sub="running", restarts=0):
    return [str(code), f"ActiveState={active}", f"SubState={sub}", f"NRestarts={restarts}"]


def _gated_host(probes, name="n0"):
    answers = iter(probes)
    h = _Host(name, {"curl": lambda command: (True, next(answers)), "journalctl": ["a journal line"]})
    h.data.update(health_poll_s=0.01, health_progress_s=3600)
    return h


@pytest.fixture
def rollbacks(monkeypatch):
    calls = []
    monkeypatch.setattr(launch.rollback, "roll_back", lambda *args: calls.append(args))
    monkeypatch.setattr(launch, "_sleep", lambda s: None)
    import roles.health

    monkeypatch.setattr(roles.health, "_sleep", lambda s: None)
    return calls


MEMBERS = [("n0", "u", ["/etc/systemd/system/u.service"]), ("n1", "u", ["/etc/systemd/system/u.service"])]


def test_a_gate_that_passes_is_recorded_and_rolls_nothing_back(rollbacks):
    h, results = _gated_host([_probe(0), _probe(200)]), {}
    assert launch.gate_or_roll_back(None, h, "u", "http://127.0.0.1:1/health", 60, MEMBERS, results) is True
    assert results == {("n0", "u"): True} and rollbacks == []
    assert " http://127.0.0.1:1/health; " in h.commands[0] and "-p NRestarts u.service" in h.commands[0]
    # no record to fill: the gate still gates
    assert launch.gate_or_roll_back(None, _gated_host([_probe(200)]), "u", "url", 60, MEMBERS, None) is True


def test_a_failed_gate_rolls_its_group_back_and_fails_even_when_the_rollback_healed(rollbacks):
    h, results = _gated_host([_probe(0, "failed", "failed")]), {("n0", "u"): True}
    state = object()
    assert launch.gate_or_roll_back(state, h, "u", "http://127.0.0.1:1/health", 60, MEMBERS, results) is False
    assert results == {("n0", "u"): False}  # a gate that failed vouches for nothing, whatever an earlier one said
    [(s, host, unit, url, timeout, members, why, wait)] = rollbacks
    assert (s, host, unit, url, timeout, members) == (state, h, "u", "http://127.0.0.1:1/health", 60, MEMBERS)
    assert "the unit died (failed/failed" in why
    # the rollback's own gate allows the group's restarts too
    again = _gated_host([_probe(0, restarts=1), _probe(0, "activating", "auto-restart", 2), _probe(200, restarts=3)])
    assert wait(None, again, "u", "url", 60) is True


def test_a_failed_gate_without_members_rolls_nothing_back(rollbacks):
    results = {}
    assert launch.gate_or_roll_back(None, _gated_host([_probe(0, "failed")]), "u", "url", 60, [], results) is False
    assert results == {("n0", "u"): False} and rollbacks == []


def test_a_groups_gate_lets_it_restart_while_it_forms_a_single_unit_gets_none(rollbacks):
    forming = [
        _probe(0, restarts=1),
        _probe(0, "activating", "auto-restart", 2),
        _probe(0, restarts=3),
        _probe(200, restarts=3),
    ]
    assert launch.gate_or_roll_back(None, _gated_host(forming), "u", "url", 60, MEMBERS, {}) is True
    assert launch.gate_or_roll_back(None, _gated_host(forming), "u", "url", 60, MEMBERS[:1], {}) is False
    # a single unit's first automatic restart fails its gate, whatever comes after
    once = [_probe(0, restarts=1), _probe(0, "activating", "auto-restart", 2), _probe(200, restarts=2)]
    assert launch.gate_or_roll_back(None, _gated_host(once), "u", "url", 60, MEMBERS[:1], {}) is False
    assert launch.gate_or_roll_back(None, _gated_host(once), "u", "url", 60, MEMBERS, {}) is True
    # a group's third restart during its gate is a crash loop: failed, even if it answers right after
    loop = [_probe(0, restarts=n) for n in range(1, 5)] + [_probe(200, restarts=4)]
    assert launch.gate_or_roll_back(None, _gated_host(loop), "u", "url", 60, MEMBERS, {}) is False
    assert launch.gate_or_roll_back(None, _gated_host(loop[1:]), "u", "url", 60, MEMBERS, {}) is True


# --------------------------------------------------------------------------- config paths and members


def _pd_ctx(host="h1", **data):
    recipe = catalogue.get_recipe(PD)
    hosts = [
        (
            f"h{i}",
            {"ssh_hostname": f"10.0.0.{i + 1}", "nic": "enp1s0", "hardware": recipe.hardware[0], "recipe": PD, **data},
        )
        for i in range(6)
    ]
    return build_context("glm", host, hosts)


def _tiny_ctx(host="h0"):
    hosts = [ROUTER, *[(f"h{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "hardware": "cpu-lab"}) for i in range(2)]]
    return build_context("tiny", host, hosts)


def test_the_files_a_unit_starts_from_are_what_a_rollback_restores():
    single = _proc(unit="sglang-x")
    assert launch.config_paths(single) == [
        "/etc/systemd/system/sglang-x.service",
        "/etc/ironserve/sglang-x.env",
        "/var/lib/ironserve/parse-ok/sglang-x",
    ]
    rank = _proc(unit="sglang-x", nnodes=2, node_rank=1)
    assert launch.config_paths(rank) == [
        *launch.config_paths(single),
        "/etc/systemd/system/sglang-x-rank-guard.service",
        "/etc/ironserve/sglang-x.rank-group.json",
    ]
    assert launch.config_paths(_proc("router", unit="sglang-x", nnodes=2)) == launch.config_paths(single)


def test_a_rank_rolls_back_with_its_whole_group_in_rank_order_a_single_unit_alone():
    ctx = _pd_ctx("h1")
    rank1 = ctx.processes[0]
    unit = rank1.unit
    assert launch.rollback_members(ctx, rank1) == [
        ("h0", unit, launch.config_paths(rank1)),
        ("h1", unit, launch.config_paths(rank1)),
    ]
    router = next(p for p in ctx.rendered.processes if p.role == "router")
    assert launch.rollback_members(ctx, router) == [(router.host, router.unit, launch.config_paths(router))]


# --------------------------------------------------------------------------- the waves, recorded


class _Meta:
    """An operation's result as changed() reads it."""

    def __init__(self, name, changed=False):
        self.name, self.changed = name, changed

    def is_complete(self):
        return True

    def did_change(self):
        return self.changed


class _Ops:
    """Recorders for the operations the launch calls: [(operation, kwargs)] in call order."""

    def __init__(self, monkeypatch, live_changed=(), run=None):
        self.calls: list[tuple[str, dict]] = []
        self.contexts: list = []
        self.live_changed = set(live_changed)
        self.run = run
        for name in ("unit_started", "health_gate", "wave_barrier", "daemon_reloaded", "run_if_changed", "launch_gate"):
            monkeypatch.setattr(launch, name, self.recorder(name))
        monkeypatch.setattr(launch, "config_live", self.config_live)
        monkeypatch.setattr(launch, "systemd", SimpleNamespace(service=self.recorder("service")))
        monkeypatch.setattr(launch.rollback, "last_good_saved", self.recorder("last_good_saved"))
        monkeypatch.setattr(launch.undeclared, "undeclared_removed", self.recorder("undeclared_removed"))
        monkeypatch.setattr(
            launch.launch_preflight, "memlock_checks", lambda ctx, changing: self.of_ctx("memlock", ctx, changing)
        )
        monkeypatch.setattr(launch.launch_preflight, "apply", lambda ctx: self.of_ctx("preflight", ctx, {}))
        monkeypatch.setattr(launch, "container_current", self.recorder("container_current"))
        monkeypatch.setattr(
            launch.deploy_clock, "stage", lambda ctx, stage: self.of_ctx("stage", ctx, {"stage": stage})
        )
        # what the host runs now: an old recipe's router and engine (undeclared units)
        found = {"sglang-old-router": "old", "sglang-old-server": "old"}
        monkeypatch.setattr(launch.undeclared, "host", SimpleNamespace(get_fact=lambda fact, **kw: found))
        if run is not None:
            monkeypatch.setattr(launch, "in_run", lambda name: name in run)

    def of_ctx(self, op, ctx, kwargs):
        """A call given the deployment's context: which context it was given is kept apart."""
        self.calls.append((op, kwargs))
        self.contexts.append(ctx)

    def recorder(self, op):
        def record(*args, **kwargs):
            self.calls.append((op, kwargs))
            return _Meta(op)

        return record

    def config_live(self, **kwargs):
        self.calls.append(("config_live", kwargs))
        return _Meta(kwargs["unit"], kwargs["unit"] in self.live_changed)

    def of(self, op):
        return [kw for name, kw in self.calls if name == op]

    def names(self):
        return [name for name, _ in self.calls]


def test_make_live_makes_every_staged_file_live_reloads_enables_and_refreshes_the_guards(monkeypatch):
    ctx = _pd_ctx("h1")
    ops = _Ops(monkeypatch, live_changed={"nothing"})
    rank1 = ctx.processes[0]
    live = launch.make_live(ctx, [rank1])
    assert set(live) == {rank1.unit}
    [made] = ops.of("config_live")
    assert made["unit"] == rank1.unit and made["name"] == f"{rank1.unit}: staged configuration made live"
    assert made["files"] == [
        [f"/etc/ironserve/staged{path}", path, mode] for path, _, mode in launch.live_files(ctx, rank1)
    ]
    assert callable(made["changing"]) and made["changing"]() is False
    ctx.changes.record_unit_change(rank1.unit, _Meta("env", True))
    launch.make_live(ctx, [rank1])
    assert ops.of("config_live")[-1]["changing"]() is True
    [reload, _] = ops.of("daemon_reloaded")
    assert reload["units"] == [f"{rank1.unit}.service", f"{rank1.unit}-rank-guard.service"]
    assert reload["changing"]() is False
    assert ops.of("service")[0] == {
        "name": f"{rank1.unit}.service enabled",
        "service": f"{rank1.unit}.service",
        "running": None,
        "enabled": True,
    }
    guard = ops.of("run_if_changed")[0]
    assert guard["command"] == f"systemctl try-restart {rank1.unit}-rank-guard.service"
    assert guard["name"] == f"{rank1.unit}-rank-guard picks up its new config"
    # the order: every file live, then one reload, then the units enabled, then the guards told
    assert ops.names()[:4] == ["config_live", "daemon_reloaded", "service", "run_if_changed"]
    assert launch.make_live(ctx, []) == {}


def test_make_live_reloads_when_any_unit_became_live_and_touches_no_guard_of_a_single_unit(monkeypatch):
    ctx = _tiny_ctx("h0")
    procs = ctx.rendered.processes
    ops = _Ops(monkeypatch, live_changed={procs[1].unit})
    live = launch.make_live(ctx, procs)
    assert list(live) == [p.unit for p in procs]
    assert [c["unit"] for c in ops.of("config_live")] == [p.unit for p in procs]
    [reload] = ops.of("daemon_reloaded")
    assert reload["units"] == [f"{p.unit}.service" for p in procs] and reload["changing"]() is True
    assert reload["name"] == "systemd loaded the live unit files (NeedDaemonReload=no)"
    assert [s["service"] for s in ops.of("service")] == [f"{p.unit}.service" for p in procs]
    assert ops.of("run_if_changed") == []
    ops.live_changed.clear()
    launch.make_live(ctx, procs)
    assert ops.of("daemon_reloaded")[-1]["changing"]() is False


def test_a_guard_picks_up_a_new_config_or_a_new_guard_script(monkeypatch):
    ctx = _pd_ctx("h1")
    ops = _Ops(monkeypatch)
    ctx.changes.rank_guard_script = "the script's put"
    live = launch.make_live(ctx, ctx.processes)
    [guard] = ops.of("run_if_changed")
    assert guard["triggers"] == [live[ctx.processes[0].unit], "the script's put"]


def test_a_rank_is_started_gated_on_joining_only_when_its_rank0_is_outside_the_run(monkeypatch):
    ctx = _pd_ctx("h1")
    rank1 = ctx.processes[0]
    ops = _Ops(monkeypatch, run={"h0", "h1"})
    rank0 = next(p for p in _pd_ctx("h0").processes if p.unit == rank1.unit)
    launch._start(ctx, rank0, wait=False, live={})
    kw = ops.of("unit_started")[-1]
    # rank 0 is started (or restarted) by the launch itself, never left to a guard; its gate comes with its group
    assert kw["rank0"] is None and kw["url"] == rank0.health_url and kw["wait"] is False
    assert kw["name"] == f"Start {rank0.unit} (rank 0)"
    launch._start(ctx, rank1, wait=False, live={})
    kw = ops.of("unit_started")[-1]
    assert kw["url"] is None and kw["wait"] is False
    assert kw["rank0"] == ["h0", rank1.unit]  # restarted only if not already following rank 0
    assert kw["name"] == f"Start {rank1.unit} (rank 1)"
    assert kw["timeout_s"] == ctx.recipe.health_timeout_s and kw["gate_results"] is ctx.gate_results
    assert kw["members"] == launch.rollback_members(ctx, rank1)
    ops.run = {"h1"}
    monkeypatch.setattr(launch, "in_run", lambda name: name in ops.run)
    launch._start(ctx, rank1, wait=True, live={})
    kw = ops.of("unit_started")[-1]
    assert kw["url"] == "http://10.0.0.2:8000/health" and kw["wait"] is True  # its own /health: it joined
    assert kw["rank0"] is None


def test_a_start_restarts_on_a_runtime_change_or_a_file_made_live_and_judges_its_own_and_the_runtimes_files(
    monkeypatch,
):
    ctx = _tiny_ctx("h0")
    [proc] = ctx.processes
    ops = _Ops(monkeypatch, run={"h0", "h1", "r"})
    ctx.changes.record_runtime_paths("/opt/venv/requirements.txt")
    launch._start(ctx, proc, wait=True, live={proc.unit: _Meta("live", False)})
    kw = ops.of("unit_started")[-1]
    assert kw["paths"] == [
        f"/etc/systemd/system/{proc.unit}.service",
        f"/etc/ironserve/{proc.unit}.env",
        "/opt/venv/requirements.txt",
    ]
    assert kw["url"] == proc.health_url and kw["rank0"] is None and kw["name"] == f"Start {proc.unit}"
    assert kw["restart"]() is False and kw["live_changing"]() is False
    launch._start(ctx, proc, wait=True, live={proc.unit: _Meta("live", True)})
    assert ops.of("unit_started")[-1]["live_changing"]() is True
    ctx.changes.record_runtime_change(_Meta("image", True))
    launch._start(ctx, proc, wait=True, live={})
    kw = ops.of("unit_started")[-1]
    assert kw["restart"]() is True and kw["live_changing"]() is False


def test_the_only_engine_group_says_its_change_is_an_outage_a_router_or_a_rolling_group_does_not():
    ctx = _tiny_ctx("h0")
    router = next(p for p in ctx.rendered.processes if p.role == "router")
    assert launch._in_place(ctx, ctx.processes[0]) == "" and launch._in_place(ctx, router) == ""
    hosts = [
        (f"n{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "nic": "host0", "hardware": "cpu-lab", "recipe": "tiny-cpu-tp2"})
        for i in range(2)
    ]
    single = build_context("tiny", "n0", hosts)
    assert launch._in_place(single, single.processes[0]) == (
        " (a change restarts it in place: the deployment's only engine group, an outage for its length)"
    )


@pytest.mark.parametrize("head_in_run", [True, False])
def test_the_last_good_configuration_is_saved_behind_the_gate_that_vouches_for_it(monkeypatch, head_in_run):
    ctx = _pd_ctx("h1")
    rank1 = ctx.processes[0]
    rank0 = next(p for p in ctx.rendered.processes if p.unit == rank1.unit and p.node_rank == 0)
    ops = _Ops(monkeypatch, run={"h0", "h1"} if head_in_run else {"h1"})
    launch._save_last_good(ctx, [rank0, rank1], {rank1.unit: _Meta("live", False)})
    saved0, saved1 = ops.of("last_good_saved")
    assert saved0["gate"] is None  # rank 0 saves right after its own gate
    assert saved1["gate"] == (("h0", rank1.unit) if head_in_run else ("h1", rank1.unit))
    for saved, proc in ((saved0, rank0), (saved1, rank1)):
        assert saved["unit"] == proc.unit and saved["paths"] == launch.config_paths(proc)
        assert saved["name"] == f"{proc.unit}: last good configuration"
        assert saved["gate_results"] is ctx.gate_results
        assert saved["restart"]() is False
    launch._save_last_good(ctx, [rank1], {rank1.unit: _Meta("live", True)})
    assert ops.of("last_good_saved")[-1]["restart"]() is True
    ctx.changes.record_unit_change(rank1.unit, _Meta("unit file", True))
    launch._save_last_good(ctx, [rank1], {})
    assert ops.of("last_good_saved")[-1]["restart"]() is True


def test_the_wave_makes_every_rank_live_then_starts_rank0_then_the_others_then_gates_each_group(monkeypatch):
    ctx = _pd_ctx("h0")
    everything = [p for p in ctx.rendered.processes if p.role != "router"]
    ctx.processes = everything + [p for p in ctx.rendered.processes if p.role == "router"]
    ops = _Ops(monkeypatch, run={f"h{i}" for i in range(6)})
    launch._engine_wave(ctx, rolls=[])
    names = ops.names()
    started = [(kw["unit"], kw["rank0"] is not None, kw["wait"]) for kw in ops.of("unit_started")]
    # every rank live before the first start, the router not at all (it starts last)
    assert {kw["unit"] for kw in ops.of("config_live")} == {p.unit for p in everything}
    assert len(ops.of("config_live")) == len(everything)
    assert names.index("unit_started") > max(i for i, n in enumerate(names) if n in ("config_live", "memlock"))
    assert names.index("undeclared_removed") < names.index("config_live")
    ranks0 = [p for p in everything if p.node_rank == 0]
    others = [p for p in everything if p.node_rank]
    # rank 0s first, not gated alone (multi-node: rank 0 answers once its group joined), then the others
    assert started[: len(ranks0)] == [(p.unit, False, False) for p in launch.start_order(ranks0)[0]]
    assert started[len(ranks0) :] == [(p.unit, True, False) for p in launch.start_order(others)[1]]
    barriers = [i for i, n in enumerate(names) if n == "wave_barrier"]
    # one name each, the same on every host (pyinfra lists one operation per name): what the run shows
    assert [b["name"] for b in ops.of("wave_barrier")] == [
        "Launch: the engines' staged configurations become live (all hosts passed the preflight)",
        "Launch: rank 0 of each group",
        "Launch: the other ranks (rank 0 of every group started)",
    ]
    first_other = len(names) - 1 - names[::-1].index("unit_started") - len(others) + 1
    assert len(barriers) == 3 and barriers[1] < names.index("unit_started") and barriers[2] < first_other
    assert ops.of("stage") == [{"stage": "engine_start"}] and names[0] == "stage"
    # each group's gate after all its ranks started, then the whole group's last good
    gates = ops.of("health_gate")
    assert [g["unit"] for g in gates] == [p.unit for p in launch.start_order(ranks0)[0]]
    for gate in gates:
        proc = next(p for p in ranks0 if p.unit == gate["unit"])
        assert gate["url"] == proc.health_url and gate["members"] == launch.rollback_members(ctx, proc)
        assert gate["timeout_s"] == ctx.recipe.health_timeout_s and gate["gate_results"] is ctx.gate_results
        assert gate["name"] == f"Health of {proc.unit} (all ranks started)"
    first_gate = names.index("health_gate")
    assert first_gate > first_other + len(others) - 1
    saved = [kw["unit"] for kw in ops.of("last_good_saved")]
    assert sorted(saved) == sorted(p.unit for p in everything)
    assert names.index("last_good_saved") > max(i for i, n in enumerate(names) if n == "health_gate")
    memlock = next(kw for name, kw in ops.calls if name == "memlock")
    assert set(memlock) == {p.unit for p in everything} and not any(f() for f in memlock.values())
    assert ops.contexts == [ctx, ctx]
    [removed] = ops.of("undeclared_removed")
    assert "sglang-old-router" in removed["declared"] and "sglang-old-server" not in removed["declared"]
    assert removed["name"].startswith(f"Remove sglang-old-server: not declared by {PD}")


def test_single_node_groups_are_gated_at_their_start_and_saved_before_the_other_ranks(monkeypatch):
    ctx = _tiny_ctx("h0")
    ctx.processes = [p for p in ctx.rendered.processes if p.role != "router"]
    ops = _Ops(monkeypatch, live_changed={ctx.processes[0].unit}, run={"h0", "h1", "r"})
    # the rolling group takes the old engine's place through the router (which lists its URL, where the old
    # engine answers): the old one stays until then
    listed = {"urls": [launch.rolling.worker_url(ctx.processes[1])]}
    monkeypatch.setattr(launch.rolling, "router_workers", lambda router: listed if router["host"] == "r" else None)
    launch._engine_wave(ctx, rolls=[ctx.processes[1]])
    [start] = ops.of("unit_started")
    assert start["unit"] == ctx.processes[0].unit and start["wait"] is True
    assert [c["unit"] for c in ops.of("config_live")] == [ctx.processes[0].unit]  # a rolling group is not in the wave
    assert ops.of("health_gate") == []
    names = ops.names()
    assert names.index("last_good_saved") < [i for i, n in enumerate(names) if n == "wave_barrier"][2]
    assert [s["unit"] for s in ops.of("last_good_saved")] == [ctx.processes[0].unit]  # saved once, after its gate
    assert ops.contexts == [ctx, ctx]  # the stage's clock and the memlock checks: this deployment's
    memlock = next(kw for name, kw in ops.calls if name == "memlock")
    assert memlock[ctx.processes[0].unit]() is True
    [removed] = ops.of("undeclared_removed")
    # an old router stays until the routers' stage (the engines move through it meanwhile), an old engine until
    # the group that replaces it rolls
    assert {ctx.processes[0].unit, "sglang-old-router", "sglang-old-server"} <= set(removed["declared"])
    assert removed["name"] == "Units of ironserve's naming this deployment does not declare: none"


def test_the_routers_start_last_made_live_gated_and_saved(monkeypatch):
    ctx = _tiny_ctx("r")
    ops = _Ops(monkeypatch, run={"h0", "h1", "r"})
    launch._routers(ctx)
    router = next(p for p in ctx.processes if p.role == "router")
    names = ops.names()
    assert names[:3] == ["stage", "wave_barrier", "undeclared_removed"] and ops.of("stage") == [
        {"stage": "router_start"}
    ]
    assert ops.of("wave_barrier") == [{"name": "Launch: the routers (every engine group healthy)"}]
    assert ops.contexts == [ctx]
    assert [c["unit"] for c in ops.of("config_live")] == [router.unit]
    [start] = ops.of("unit_started")
    assert start["unit"] == router.unit and start["wait"] is True and start["url"] == router.health_url
    assert [s["unit"] for s in ops.of("last_good_saved")] == [router.unit]
    assert names.index("config_live") < names.index("unit_started") < names.index("last_good_saved")
    [removed] = ops.of("undeclared_removed")
    assert router.unit in removed["declared"] and "sglang-old-router" not in removed["declared"]
    assert removed["name"].startswith("Remove sglang-old-router, sglang-old-server: not declared by tiny-cpu")
    ops.calls.clear()
    launch._routers(_tiny_ctx("h0"))
    assert ops.of("config_live") == [] and ops.of("unit_started") == []


def test_the_launch_gate_names_every_host_of_the_deployment_before_the_preflight(monkeypatch):
    ctx = _tiny_ctx("h1")
    ops = _Ops(monkeypatch)
    ctx.changes.record_container("u", "img@sha256:1", ["serve"], ["B", "A"])
    launch._gate_and_preflight(ctx)
    assert ops.names() == ["launch_gate", "container_current", "preflight"] and ops.contexts == [ctx]
    assert ops.of("launch_gate") == [{"name": "Launch gate: every host converged", "hosts": ["h0", "h1", "r"]}]
    assert ops.of("container_current") == [
        {
            "name": "Container of u matches its unit",
            "unit": "u",
            "image": "img@sha256:1",
            "cmd": ["serve"],
            "env_names": ["A", "B"],
        }
    ]
