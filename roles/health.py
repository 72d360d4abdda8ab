"""The health gate's wait: poll a unit's health URL on its own host until 200, or say why not (journal lines).

Shared by the launch's gates (roles/launch.py) and the rolling change (roles/rolling.py). Host data:
``health_poll_s``, ``health_progress_s``, ``health_journal_lines`` (ironserve/hostdata.py).
"""

from __future__ import annotations

import shlex
import time

from roles.common import uses_sudo
from roles.context import host_data
from roles.host_state import run_unread


def wait_healthy(
    state, host, unit: str, url: str, timeout_s: int, poll_s: float | None = None, restarts_allowed: int = 0
) -> bool:
    return await_health(state, host, unit, url, timeout_s, poll_s, restarts_allowed)[0]


def await_health(
    state, host, unit: str, url: str, timeout_s: int, poll_s: float | None = None, restarts_allowed: int = 0
) -> tuple[bool, str]:
    """Poll the unit's /health from the host until 200; (False, why) with the journal on timeout or death.

    Death: the unit failed or stopped, or systemd restarted it more than ``restarts_allowed`` times since the gate
    began (0: the first automatic restart; a unit that stopped counts only when seen twice in a row then, a
    group restart passes through inactive)."""
    poll_s = float(poll_s if poll_s is not None else host_data(host).health_poll_s)
    progress_s = host_data(host).health_progress_s
    sudo = uses_sudo(host)
    start = last = time.monotonic()
    probe = (
        f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' {shlex.quote(url)}; echo; "
        f"systemctl show -p ActiveState -p SubState -p NRestarts {shlex.quote(unit)}.service"
    )
    host.log(f"{unit}: waiting for {url} (up to {timeout_s}s)")
    seen, counted, stopped = None, 0, False
    while True:
        _, out = run_unread(host, probe)  # a probe: reads only
        code, active, sub = _parse_probe(out.stdout_lines)
        restarts = _restarts(out.stdout_lines)
        # automatic restarts since the gate began; NRestarts falls back to 0 when the unit is restarted on purpose
        # (a group restart by its rank guard): count on from there
        if restarts is not None:
            counted += 0 if seen is None else (restarts - seen if restarts >= seen else restarts)
            seen = restarts
        elapsed = int(time.monotonic() - start)
        if code == 200:
            host.log_styled(f"{unit}: healthy after {elapsed}s", fg="green")
            return True, ""
        if restarts_allowed:
            dead = active == "failed" or (active == "inactive" and stopped) or counted > restarts_allowed
            stopped = active == "inactive"
        else:
            dead = active in ("failed", "inactive") or sub == "auto-restart"
        if dead or elapsed >= timeout_s:
            why = (
                f"the unit died ({active}/{sub}, {counted} restart(s) during the gate)"
                if dead
                else f"no healthy answer within {timeout_s}s"
            )
            lines = host_data(host).health_journal_lines
            _, journal = run_unread(
                host, f"journalctl -u {shlex.quote(unit)}.service -n {lines} --no-pager", _sudo=sudo
            )
            host.log_styled(f"{unit}: {why} ({url}); last journal lines:\n{journal.stdout}", fg="red")
            return False, why
        if time.monotonic() - last >= progress_s:
            last = time.monotonic()
            host.log(
                f"{unit}: still waiting for {url}: {elapsed}s of {timeout_s}s, unit {active}/{sub}, "
                f"http {code or 'no answer'}"
            )
        _sleep(poll_s)


def _restarts(lines: list[str]) -> int | None:
    for line in lines:
        key, _, value = line.strip().partition("=")
        if key == "NRestarts" and value.isdigit():
            return int(value)
    return None


def _parse_probe(lines: list[str]) -> tuple[int | None, str | None, str | None]:
    code = active = sub = None
    for line in lines:
        line = line.strip()
        if line.isdigit():
            code = int(line) or None
        elif line.startswith("ActiveState="):
            active = line.split("=", 1)[1]
        elif line.startswith("SubState="):
            sub = line.split("=", 1)[1]
    return code, active, sub


def _sleep(seconds: float) -> None:
    # pyinfra runs hosts in gevent greenlets: a gevent sleep lets the other hosts' gates poll meanwhile
    try:
        import gevent

        gevent.sleep(seconds)
    except ImportError:  # pragma: no cover
        time.sleep(seconds)
