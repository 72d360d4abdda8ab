"""Last good configurations, and the rollback to them when a new configuration fails its health gate.

After a unit passed its health gate (roles/launch.py), the files it was started from (unit file, env file, its
parse-check marker, and for a rank of a multi-node group its rank guard's unit and config) are copied to
``/var/lib/ironserve/last-good/<unit>/`` with a MANIFEST (sha256 and path of each) and the time: the unit's last
good configuration. A converged rerun copies nothing (the fact compares hashes).

When a started or restarted unit then fails its gate (the unit dies, or no 200 within the recipe's
``health_timeout_s``) and a last good configuration differing from the current files exists on every host of
its group, the gate rolls back: the last good files are restored on each of those hosts (each restore checked;
env files keep the CURRENT values of their secrets, so a rotated key never comes back; never across a change
between a keyed and a keyless configuration, checked on every host before any restore), systemd reloaded, the
units restarted (rank 0 first, each restart checked) and the gate waited for again. A rank > 0 saves its files
only when rank 0's gate positively passed in this run (a gate that did not run vouches for nothing). The deploy
still fails, and says what happened:
``ROLLED BACK <unit> ...: the new configuration failed its health gate (why); the last good one from <time> is
serving again`` (or that the rollback did not become healthy either). The next run applies the new configuration
again (it is still what the recipe declares) unless the recipe is fixed.

Not rolled back: the runtime itself where it is not versioned. A derived image is rebuilt under the same tag;
a digest-pinned image change is rolled back (the digest is in the unit), and so is a venv (versioned by its
pinned packages: ironserve.units.venv_path, in the unit's ExecStart).

Host data: ``rollback`` [true] (false: a failed gate only fails the deploy).
"""

from __future__ import annotations

import shlex
import time

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, operation

from ironserve.units import KEY_ENV, SECRET_ENV, deliberate
from roles.common import uses_sudo
from roles.context import host_data
from roles.host_state import run_unread

LAST_GOOD_DIR = "/var/lib/ironserve/last-good"


def snapshot_dir(unit: str) -> str:
    return f"{LAST_GOOD_DIR}/{unit}"


def save_command(unit: str, paths: list[str]) -> str:
    """Copy the files into a fresh snapshot and swap it in (a half-written snapshot is never the last good)."""
    d = shlex.quote(snapshot_dir(unit))
    # files that do not exist (no parse marker with parse_check=false) are simply not part of the snapshot
    return (
        f'rm -rf {d}.new && mkdir -p {d}.new && for f in {shlex.join(paths)}; do if [ -e "$f" ]; then '
        f'cp -p "$f" {d}.new/ && sha256sum "$f" >> {d}.new/MANIFEST || exit 1; fi; done '
        f"&& date -u +%Y-%m-%dT%H:%M:%SZ > {d}.new/TAKEN && rm -rf {d} && mv {d}.new {d}"
    )


def key_check_command(unit: str) -> str:
    """Exits non-zero, saying why, when restoring the snapshot would cross a key/no-key change: an env file of the
    snapshot declares another set of API key variables (ironserve.units.KEY_ENV) than the live one. A keyless
    unit restored while the live env file holds a key would serve without it (its ExecStart does not run
    ironserve-exec); a keyed one restored beside a keyless env file would not start. Names only, no values."""
    d = shlex.quote(snapshot_dir(unit))
    keys = shlex.quote(f"^({'|'.join(KEY_ENV)})=")
    return (
        f'while read -r sum path; do case "$path" in *.env) src={d}/"$(basename "$path")"; '
        f'was=$(grep -Eo {keys} "$src") || [ $? -eq 1 ] || exit 1; now=; '
        f'if [ -e "$path" ]; then now=$(grep -Eo {keys} "$path") || [ $? -eq 1 ] || exit 1; fi; '
        f'if [ "$was" != "$now" ]; then echo "no rollback of {unit}: its last good configuration declares '
        f"API key variables [$(echo $was)] and the current one [$(echo $now)] ($path): a rollback never crosses a "
        f'key/no-key change" >&2; exit 3; fi;; esac; done < {d}/MANIFEST'
    )


def restore_command(unit: str) -> str:
    """Put every file of the snapshot back where its MANIFEST says, then reload systemd.

    Secrets stay current: an env file is restored with the snapshot's settings but the secret lines
    (ironserve.units.SECRET_ENV) of the live file, so a rotated key or token never comes back; never across a
    key/no-key change (key_check_command). Every file is first written beside its live path from a 0600-born
    copy, each write checked (grep's "no line" is its status 1, an error is 2: a full disk fails the restore);
    only when all are written are they renamed over the live files. Any failure exits non-zero with the live
    files as they were and no copy left behind (the rollback checks it)."""
    d = shlex.quote(snapshot_dir(unit))
    secret = shlex.quote(f"^({'|'.join(SECRET_ENV)})=")
    staged = '"$path.ironserve-restore"'
    each = f'while read -r sum path; do src={d}/"$(basename "$path")"; tmp={staged}; '
    return (
        f"set -e; umask 077; {key_check_command(unit)}; "
        f"cleanup() {{ while read -r sum path; do rm -f {staged}; done < {d}/MANIFEST; }}; trap cleanup EXIT; "
        f'{each}rm -f "$tmp"; case "$path" in *.env) '
        f'grep -Ev {secret} "$src" > "$tmp" || [ $? -eq 1 ]; if [ -e "$path" ]; then '
        f'grep -E {secret} "$path" >> "$tmp" || [ $? -eq 1 ]; fi;; *) cp "$src" "$tmp";; esac; '
        f'chmod --reference="$src" "$tmp"; done < {d}/MANIFEST; '
        f'{each}mv -f "$tmp" "$path"; done < {d}/MANIFEST; trap - EXIT; systemctl daemon-reload'
    )


class LastGood(FactBase):
    """{current: {path: sha256}, snapshot: {path: sha256} | None, taken: str | None} for a unit's files."""

    def command(self, unit, paths):
        d = shlex.quote(snapshot_dir(unit))
        return (
            f"sha256sum {shlex.join(paths)} 2>/dev/null | sed 's/^/current /'; "
            f"[ -f {d}/MANIFEST ] && sed 's/^/snapshot /' {d}/MANIFEST; "
            f"[ -f {d}/TAKEN ] && sed 's/^/taken /' {d}/TAKEN; true"
        )

    def process(self, output):
        state = {"current": {}, "snapshot": None, "taken": None}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "taken":
                state["taken"] = rest.strip()
                continue
            digest, _, path = rest.strip().partition(" ")
            path = path.lstrip(" *")
            if kind == "current":
                state["current"][path] = digest
            elif kind == "snapshot":
                state["snapshot"] = {**(state["snapshot"] or {}), path: digest}
        return state


def differs(state: dict) -> bool:
    """Is there a last good configuration, and is it not what the unit has now?"""
    state = state or {}
    return bool(state.get("snapshot")) and state["snapshot"] != state.get("current")


@operation()
def last_good_saved(
    unit: str, paths: list[str], restart=False, gate: tuple[str, str] | None = None, gate_results: dict | None = None
):
    """The unit's current files are its last good configuration (run right after its health gate passed; for a
    rank > 0, ``gate`` names rank 0's (host, unit) whose gate must have passed: the ranks > 0 of a multi-node
    group have no gate of their own). ``gate_results``: the deployment context's, {(host, unit): passed}, filled
    by the gates while the run executes."""
    state = host.get_fact(LastGood, unit=unit, paths=list(paths))
    changing = bool(restart() if callable(restart) else restart)
    if not changing and state.get("snapshot") == state.get("current") and state.get("current"):
        host.noop(f"{unit}: the last good configuration is the current one")
        return
    if gate is None:
        yield save_command(unit, list(paths))
        return
    yield FunctionCommand(_save_if_gate_passed, (unit, list(paths), list(gate), gate_results), {})


def _save_if_gate_passed(
    state, host, unit: str, paths: list[str], gate: list[str], gate_results: dict | None = None
) -> bool:
    # positively true: a gate that did not run (its host dropped out of the run) vouches for nothing
    if (gate_results or {}).get(tuple(gate)) is not True:
        host.log(
            f"{unit}: not saved as the last good configuration: the gate of {gate[1]} on {gate[0]} did not "
            f"pass in this run"
        )
        return True
    status, _ = host.run_shell_command(save_command(unit, paths), _sudo=uses_sudo(host))
    return bool(status)


def roll_back(
    state, gate_host, unit: str, url: str, timeout_s: int, members: list[tuple[str, str, list[str]]], why: str, wait
) -> None:
    """Restore the last good configuration of every member (host name, unit, paths), restart and wait for the
    gate again; logs the outcome on the gated host. ``wait``: roles.launch.wait_healthy."""
    if not host_data(gate_host).rollback:
        return
    hosts = _members_in_run(state, gate_host, unit, members)
    taken = _last_good_of_every_member(gate_host, unit, hosts) if hosts else None
    if taken is None:
        return
    gate_host.log_styled(
        f"{unit}: rolling back {len(hosts)} unit(s) to the last good configuration from {taken}", fg="yellow"
    )
    where = ", ".join(sorted({h.name for h, _, _ in hosts}))
    if not _restored(gate_host, unit, hosts, where, taken):
        return
    start = time.monotonic()
    if wait(state, gate_host, unit, url, timeout_s):
        gate_host.log_styled(
            f"ROLLED BACK {unit} on {where}: the new configuration failed its health gate ({why}); the last good "
            f"one from {taken} is serving again (healthy after {time.monotonic() - start:.0f}s). The deploy "
            f"fails: fix the recipe and rerun",
            fg="yellow",
        )
    else:
        gate_host.log_styled(
            f"ROLLBACK FAILED {unit} on {where}: the last good configuration from {taken} is "
            f"restored but not healthy either",
            fg="red",
        )


def _members_in_run(state, gate_host, unit: str, members: list[tuple[str, str, list[str]]]) -> list | None:
    """[(pyinfra host, unit, paths)] of the group's members, or None (said) when one is not in this run: a group is
    rolled back whole or not at all."""
    hosts = [(state.inventory.get_host(name), member_unit, paths) for name, member_unit, paths in members]
    outside = sorted(
        name
        for (name, _, _), (h, _, _) in zip(members, hosts)
        if h is None or h not in getattr(state, "activated_hosts", {h})
    )
    if outside:
        # e.g. --limit left them out
        gate_host.log_styled(f"{unit}: no rollback: {', '.join(outside)} of its group not in this run", fg="red")
        return None
    return hosts


def _last_good_of_every_member(gate_host, unit: str, hosts: list) -> str | None:
    """When the first member's last good configuration was taken, or None (said) when a member has none that
    differs from the failed one."""
    snapshots = []
    for member_host, member_unit, paths in hosts:
        found = _last_good(member_host, member_unit, paths)
        if not differs(found):
            gate_host.log_styled(
                f"{unit}: no rollback: {member_host.name} has no last good configuration of "
                f"{member_unit} that differs from the failed one",
                fg="red",
            )
            return None
        snapshots.append(found)
    return snapshots[0].get("taken") or "an earlier run"


def _restored(gate_host, unit: str, hosts: list, where: str, taken: str) -> bool:
    """Every member's key check, then restore, then restart, each step on every member before the next one (the
    key check everywhere before anything is restored anywhere: never half a group across a key change); False
    (said) when one failed."""
    steps = (("restore (key check)", key_check_command), ("restore", restore_command), ("restart", _restart_command))
    for step, command in steps:
        # each restore and restart checked: a member left on the failed configuration is said, not assumed away
        failed = []
        for member_host, member_unit, _ in hosts:  # rank 0 (the gated unit) first: members are in rank order
            ok, out = member_host.run_shell_command(command(member_unit), _sudo=uses_sudo(member_host))
            if not ok:
                failed.append(f"{member_host.name} ({member_unit}): {' '.join(out.stderr_lines)[-300:]}")
        if failed:
            gate_host.log_styled(
                f"ROLLBACK FAILED {unit} on {where}: the {step} of the last good configuration "
                f"from {taken} failed on {'; '.join(failed)}",
                fg="red",
            )
            return False
    return True


def _restart_command(unit: str) -> str:
    return deliberate("restart", unit)


def _last_good(member_host, unit: str, paths: list[str]) -> dict:
    _, out = run_unread(member_host, LastGood().command(unit, paths), _sudo=uses_sudo(member_host))
    return LastGood().process(out.stdout_lines)
