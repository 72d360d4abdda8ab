"""`ironserve audit INVENTORY DEPLOY`: derive checks, run them with pytest + testinfra across hosts, report.

Exit codes: 0 clean, 1 drift, 2 unreachable host or bad input. The checks run as a generated pytest session
(one test per check, grouped per host), so JUnit XML comes from pytest itself and CI systems read it as usual.
Before any check is reported every host is read at once, each over one connection with a few batched commands
(ironserve/audit/snapshot.py); the checks then evaluate those answers with the same testinfra evaluators.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ironserve.fleet import Fleet, limit_hosts, read_fleet
from ironserve.problems import Problem, SpecError

from .checks import GATES, Check, derive_checks
from .forked import Forked


def deploy_model(deploy: str) -> str:
    """The model a deploys/*.py provisions: the string given to deploy_model(...)."""
    path = Path(deploy)
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError) as exc:
        raise SpecError([Problem(deploy, "", f"cannot read the deploy ({exc})", "give a deploys/*.py file")]) from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "deploy_model" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return arg.value
    raise SpecError([Problem(deploy, "", 'no deploy_model("<model>") call', "audit a deploys/*.py entry point")])


def plan_checks(
    inventory: str, deploy: str, limit: list[str] | None = None, data: dict | None = None, fleet: Fleet | None = None
) -> tuple[list[Check], dict[str, dict]]:
    """The checks of the --limit'ed hosts, each derived with the whole inventory (ranks, addresses) as the deploy
    derives it: pyinfra's loader, group_data/ and --data included."""
    from ironserve.derived_image import pushed_digest
    from roles.context import build_context

    model = deploy_model(deploy)
    fleet = fleet or read_fleet(inventory, data)
    pairs = [(h.name, h.data) for h in fleet.hosts]
    checks: list[Check] = []
    connections: dict[str, dict] = {}
    for h in limit_hosts(fleet.hosts, limit, inventory):
        # the digest of the deployment's derived image, asked of its registry once: the units and containers name it
        ctx = build_context(model, h.name, pairs, inventory, lookup=pushed_digest)
        checks += derive_checks(ctx, deploy, inventory)
        connections[h.name] = {"address": h.address}
    return checks, connections


def warm_plan() -> None:
    """What every plan loads before its first host: the roles (pyinfra's facts and operations) and the catalogue."""
    from ironserve.catalogue import layered
    from ironserve.derived_image import pushed_digest  # noqa: F401
    from roles.context import build_context  # noqa: F401
    from roles.deployment import roles_for  # noqa: F401

    layered()


def plan_with_questions(
    inventory: str, deploy: str, limit: list[str] | None, data: dict | None, fleet: Fleet
) -> tuple[list[Check], dict[str, dict], dict[str, list[str]]]:
    """plan_checks, and each host's first batch (snapshot.first_questions): what the audit's forked plan hands
    back, so that each host's read starts with its batch."""
    from .evaluate import evaluate
    from .snapshot import first_questions

    checks, connections = plan_checks(inventory, deploy, limit, data, fleet)
    mine = {name: [c for c in checks if c.host == name] for name in connections}
    return checks, connections, {name: first_questions(found, evaluate) for name, found in mine.items()}


@dataclass
class Result:
    check: Check
    ok: bool
    found: str

    def as_dict(self) -> dict:
        return {
            "host": self.check.host,
            "check": self.check.id,
            "gate": self.check.gate,
            "ok": self.ok,
            "expected": _show(self.check.expected),
            "found": self.found,
            "fix": "" if self.ok else self.check.fix,
        }


def _show(value) -> str:
    if isinstance(value, str) and len(value) == 64:
        return value[:12]
    if isinstance(value, str) and "\n" in value:
        return f"{len(value.splitlines())} lines"
    return str(value)


_TEST_MODULE = """
import json, os
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import pytest

from ironserve.audit.checks import Check
from ironserve.audit.evaluate import evaluate
from ironserve.audit.snapshot import HostSnapshot

PLAN = json.load(open(os.environ["IRONSERVE_AUDIT_PLAN"]))
CHECKS = [Check(**c) for c in PLAN["checks"]]


def _read(name):
    first = PLAN["questions"].get(name)  # the first batch, where the plan computed it
    snapshot = HostSnapshot(PLAN["hosts"][name]).read([c for c in CHECKS if c.host == name], evaluate, first)
    # how the host was read (the parent reports unreachable hosts and the commands each was sent)
    _write({"host": name, "read": True, "error": snapshot.error, "commands": snapshot.batches})
    return snapshot


def _write(row):
    with open(os.path.join(PLAN["results"], f"{os.getpid()}.jsonl"), "a") as fh:
        fh.write(json.dumps(row) + "\\n")


# every host read at once, each over its one connection; a host's checks are reported as soon as its read is back,
# while the hosts still reading go on (the collection waits for the first read: until then the reads run)
POOL = ThreadPoolExecutor(max_workers=max(1, min(len(PLAN["hosts"]), PLAN["parallel"])))
READS = {name: POOL.submit(_read, name) for name in PLAN["hosts"]}
wait(READS.values(), return_when=FIRST_COMPLETED)


FOUND = {}  # (host, check id) -> what was found: the JUnit property "found" (runner.FoundProperty)


@pytest.mark.parametrize("check", CHECKS, ids=[f"{c.host}::{c.id}" for c in CHECKS])
def test_check(check):
    snapshot = READS[check.host].result()
    if snapshot.error:
        ok, found = False, f"unreachable: {snapshot.error}"
    else:
        ok, found = evaluate(snapshot.host(), check)
    FOUND[(check.host, check.id)] = found
    _write({"host": check.host, "id": check.id, "ok": ok, "found": found})
    assert ok, f"{check.host} {check.id}: expected {check.expected!r}, found {found}. Fix: {check.fix}"
"""


# pytest's plugins the generated session has no use for, each a cost per test or per session (the logging and
# warnings capture around every test, a full garbage collection at its end: 1.1 -> 0.5 s of CPU for 336 checks; skip
# marks, tmp_path, monkeypatch, doctests, --pdb, stepwise, pastebin, setup plans, subtests: 12% less again for
# 288), with output capture off (the session's output is redirected whole) and the plugins of other packages not
# loaded either (PYTEST_DISABLE_PLUGIN_AUTOLOAD, _pytest)
UNUSED_PLUGINS = (
    "unraisableexception",
    "threadexception",
    "logging",
    "warnings",
    "faulthandler",
    "skipping",
    "tmpdir",
    "monkeypatch",
    "doctest",
    "debugging",
    "legacypath",
    "stepwise",
    "pastebin",
    "setuponly",
    "setupplan",
    "subtests",
)
QUIET_PLUGINS = ["-s"] + [arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")]


@dataclass
class Reads:
    """How each host was read: the error of an unreachable one, the ssh commands each was sent."""

    unreachable: dict[str, str]
    commands: dict[str, int]


def run_checks(
    checks: list[Check],
    specs: dict[str, str],
    junit: str | None = None,
    parallel: int | None = None,
    reads: Reads | None = None,
    questions: dict[str, list[str]] | None = None,
) -> list[Result]:
    """Read every host at once (one connection each, batched commands) and report each check through pytest;
    ``questions``: each host's first batch, where the plan computed it."""
    with tempfile.TemporaryDirectory(prefix="ironserve-audit-") as tmp:
        results_dir = Path(tmp, "results")
        results_dir.mkdir()
        plan = Path(tmp, "plan.json")
        plan.write_text(
            json.dumps(
                {
                    "checks": [c.as_dict() for c in checks],
                    "hosts": specs,
                    "results": str(results_dir),
                    "parallel": parallel or 32,
                    "questions": questions or {},
                }
            )
        )
        test_file = Path(tmp, "test_ironserve_audit.py")
        test_file.write_text(_TEST_MODULE)
        args = [
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            *QUIET_PLUGINS,
            "--rootdir",
            tmp,
            str(test_file),
            "-o",
            "junit_family=xunit2",
            "--tb=no",
            "-rN",
        ]
        if junit:
            args.append(f"--junitxml={os.path.abspath(junit)}")
        _pytest(args, plan, [FoundProperty()] if junit else [])
        found = _rows(results_dir, reads)
    results = []
    for c in checks:
        row = found.get((c.host, c.id))
        results.append(Result(c, bool(row and row["ok"]), row["found"] if row else "not run"))
    return results


def _rows(results_dir: Path, reads: Reads | None) -> dict[tuple[str, str], dict]:
    """The session's rows by (host, check id); how each host was read goes into ``reads``."""
    found: dict[tuple[str, str], dict] = {}
    for f in results_dir.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if not row.get("read"):
                found[(row["host"], row["id"])] = row
            elif reads is not None:
                if row["error"]:
                    reads.unreachable[row["host"]] = row["error"]
                reads.commands[row["host"]] = row["commands"]
    return found


class FoundProperty:
    """A pytest plugin: each check's found value as its JUnit property "found", written where a JUnit report is
    asked for (pytest's record_property fixture around every test took a quarter of the session's CPU)."""

    def pytest_runtest_teardown(self, item) -> None:
        check = item.callspec.params["check"]  # (the teardown report, made after this, carries the property)
        item.user_properties.append(("found", item.module.FOUND.get((check.host, check.id), "not run")))


def _pytest(args: list[str], plan: Path, plugins: list | None = None) -> None:
    """The generated session, in this process (no second interpreter to start): its output silenced, the plan
    passed as the subprocess would get it, and no other package's pytest plugin loaded (the session needs none,
    and a site's plugin must not change what the audit reports)."""
    import contextlib
    import io

    import pytest

    env = {"IRONSERVE_AUDIT_PLAN": str(plan), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            pytest.main(args, plugins=plugins or [])
    finally:
        session = sys.modules.pop("test_ironserve_audit", None)
        if session is not None:  # every read ends before its results' directory goes
            session.POOL.shutdown(wait=True, cancel_futures=True)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def table(results: list[Result]) -> str:
    rows = [r.as_dict() for r in results]
    drift = [r for r in rows if not r["ok"]]
    lines = []
    hosts = sorted({r["host"] for r in rows})
    for host in hosts:
        mine = [r for r in rows if r["host"] == host]
        bad = [r for r in mine if not r["ok"]]
        lines.append(f"{host}: {len(mine) - len(bad)}/{len(mine)} checks ok" + ("" if bad else ", no drift"))
        for r in sorted(bad, key=lambda r: GATES.index(r["gate"])):
            lines.append(f"  DRIFT [{r['gate']}] {r['check']}: expected {r['expected']}, found {r['found']}")
            lines.append(f"        fix: {r['fix']}")
    lines.append(f"audit: {len(rows) - len(drift)} ok, {len(drift)} drift, {len(hosts)} host(s)")
    return "\n".join(lines)


def audit(
    inventory: str,
    deploy: str,
    limit: list[str] | None = None,
    fmt: str = "text",
    junit: str | None = None,
    data: dict | None = None,
    out=sys.stdout,
    textfile: str | None = None,
) -> int:
    fleet, names, planned = _fleet_and_plan(inventory, deploy, limit, data)
    from . import connection  # paramiko and testinfra: imported beside the plan

    specs = connection.open_hosts(fleet, names)
    reads = Reads({}, {})
    try:
        # the handshakes go on while the plan is made; no command runs on a host before the plan is back
        connection.connect_ahead(specs)
        _import_session()
        checks, connections, questions = planned.result()
        results = run_checks(checks, specs, junit, reads=reads, questions=questions)
    finally:
        connection.close(specs)
    # an unreachable host fails the audit (exit 2) but hides nothing: every reached host's results are reported
    for name, why in reads.unreachable.items():
        print(f"unreachable: {name} ({connections[name]['address']}): {why}", file=sys.stderr)
    reached = [r for r in results if r.check.host not in reads.unreachable]
    unreachable = {
        name: {"address": connections[name]["address"], "error": why} for name, why in sorted(reads.unreachable.items())
    }
    if textfile:
        write_audit_textfile(textfile, reached)
    if fmt == "json":
        print(
            json.dumps(
                {
                    "ok": all(r.ok for r in reached) and not unreachable,
                    "results": [r.as_dict() for r in reached],
                    "unreachable": unreachable,
                },
                indent=2,
            ),
            file=out,
        )
    elif fmt == "junit":
        print(f"junit xml written to {junit}", file=out)
    else:
        print(table(reached), file=out)
        for name, item in unreachable.items():
            print(f"UNREACHABLE {name} ({item['address']}): {item['error']}", file=out)
    if unreachable:
        return 2
    return 0 if all(r.ok for r in results) else 1


def _fleet_and_plan(inventory: str, deploy: str, limit: list[str] | None, data: dict | None):
    """The inventory read here, the --limit'ed names, and the plan started on another core: its imports and the
    catalogue while this process reads the inventory, then the plan itself (its hosts sent to it) beside the
    handshakes."""
    planned = Forked(plan_with_questions, inventory, deploy, limit, data, warm=warm_plan, later=True)
    try:
        fleet = read_fleet(inventory, data)
        names = [h.name for h in limit_hosts(fleet.hosts, limit, inventory)]
    except BaseException:
        planned.cancel()
        raise
    planned.send(Fleet(fleet.hosts, None))  # (pyinfra's own inventory stays here: the plan reads the hosts)
    return fleet, names, planned


def _import_session() -> None:
    """The generated session's modules (pytest, the evaluators: 0.15 s), imported while the plan is made."""
    import pytest  # noqa: F401

    from . import evaluate, snapshot  # noqa: F401


def write_audit_textfile(path: str, results: list[Result]) -> None:
    """The audit's result as ironserve_audit_drift{host,check} (1 drift, 0 clean), for a textfile collector."""
    import time

    from ironserve.metrics import audit_samples, exposition, write_textfile

    write_textfile(
        path, exposition(audit_samples({(r.check.host, r.check.id): not r.ok for r in results}, time.time()))
    )


def add_audit_parser(sub) -> None:
    p = sub.add_parser(
        "audit", help="drift: compare hosts with the deploy's declaration (testinfra)", allow_abbrev=False
    )
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument(
        "--limit",
        action="append",
        help="only these hosts: a host name, a glob of names or a group, as pyinfra's --limit (repeatable)",
    )
    p.add_argument("--format", choices=["text", "json", "junit"], default="text")
    p.add_argument("--junit-file", default="ironserve-audit.xml", help="where --format junit writes")
    p.add_argument(
        "--prometheus-textfile",
        metavar="FILE.prom",
        help="also write the result as ironserve_audit_drift{host,check} metrics (atomically) to this file "
        "in a node exporter's textfile collector directory",
    )
    p.add_argument("--data", action="append", default=[], help="KEY=VALUE, as pyinfra's --data")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    from ironserve.hostdata import parse_data_args

    data = parse_data_args(args.data)
    return audit(
        args.inventory,
        args.deploy,
        args.limit,
        args.format,
        args.junit_file if args.format == "junit" else None,
        data,
        textfile=args.prometheus_textfile,
    )
