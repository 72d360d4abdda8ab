"""Evaluators: read one check's subject on a host through testinfra and say what was found.

Each returns (ok, found). `found` is short text for the table: a value, a digest prefix, "missing".
"""

from __future__ import annotations

import hashlib
import json

from ironserve.units import API_KEY_ENV

from .checks import Check

# env keys whose values the deploy writes from secret files: the audit's expected text holds placeholders for them
SECRET_KEYS = {API_KEY_ENV}


def _short(value, n=12) -> str:
    return value[:n] if isinstance(value, str) and len(value) == 64 else str(value)


def governor(host, check: Check):
    out = host.run("cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null")
    values = sorted(set(out.stdout.split()))
    if not values:
        return False, "no cpufreq"
    return values == [check.expected], ",".join(values)


def sysctl(host, check: Check):
    key = check.params["key"]
    if host.run(f"test -e /proc/sys/{key.replace('.', '/')}").rc != 0:
        # e.g. kernel.sched_migration_cost_ns moved to debugfs in Linux 5.13: nothing there can drift
        return True, "absent in this kernel"
    out = host.run(f"sysctl -n {key}")
    found = out.stdout.strip() if out.rc == 0 else "unreadable"
    return found == str(check.expected), found


def file(host, check: Check):
    f = host.file(check.params["path"])
    if not f.exists:
        return False, "missing"
    found = f.sha256sum
    problems = []
    if found != check.expected:
        problems.append(f"content {_short(found)} != {_short(check.expected)}")
    mode = check.params.get("mode")
    if mode is not None and f.mode != mode:
        problems.append(f"mode {oct(f.mode)} != {oct(mode)}")
    owner = check.params.get("owner")
    if owner and f.user != owner:
        problems.append(f"owner {f.user}")
    return not problems, "; ".join(problems) or _short(found)


def _env(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key] = value
    return out


def env_file(host, check: Check):
    """Mode, and which keys differ: by NAME only. An env file holds secrets (the API key, or whatever someone put
    there by hand), so no value read from the host is ever printed, in the table, the JSON or JUnit. Keys the
    deploy writes as secrets (placeholders in the expected text) are compared by presence only."""
    f = host.file(check.params["path"])
    if not f.exists:
        return False, "missing"
    problems = []
    if f.mode != check.params["mode"]:
        problems.append(f"mode {oct(f.mode)} (secrets readable)" if f.mode & 0o077 else f"mode {oct(f.mode)}")
    want, have = _env(check.expected), _env(f.content_string)
    secret = {k for k in want if k in SECRET_KEYS}
    missing = sorted(set(want) - set(have))
    unexpected = sorted(set(have) - set(want))
    changed = sorted(k for k in set(want) & set(have) if k not in secret and want[k] != have[k])
    for label, keys in (("missing", missing), ("not declared", unexpected), ("value differs", changed)):
        if keys:
            problems.append(f"{label}: {', '.join(keys[:6])}" + (f" (+{len(keys) - 6})" if len(keys) > 6 else ""))
    return not problems, "; ".join(problems) or "same"


def service_enabled(host, check: Check):
    enabled = host.service(check.params["name"]).is_enabled
    return enabled == check.expected, "enabled" if enabled else "disabled"


def service_active(host, check: Check):
    running = host.service(check.params["name"]).is_running
    return running == check.expected, "active" if running else "inactive"


def daemon_reloaded(host, check: Check):
    out = host.run(f"systemctl show -p NeedDaemonReload --value {check.params['name']}")
    need = out.stdout.strip()
    return (need == "no") == check.expected, f"NeedDaemonReload={need or 'unknown'}"


def package(host, check: Check):
    pkg = host.package(check.params["name"])
    if not pkg.is_installed:
        return False, "not installed"
    return pkg.version == check.expected, pkg.version


# one nvidia-smi run answers the GPU and the persistence checks (each run costs a host tens of ms of CPU)
GPU_STATE = "nvidia-smi --query-gpu=name,persistence_mode --format=csv,noheader"


def _gpu_rows(host) -> list[tuple[str, str]] | None:
    """(name, persistence mode) per GPU; None when nvidia-smi fails."""
    out = host.run(GPU_STATE)
    if out.rc != 0:
        return None
    rows = [line.rpartition(",") for line in out.stdout.splitlines() if line.strip()]
    return [(name.strip(), mode.strip()) for name, _, mode in rows]


def gpus(host, check: Check):
    rows = _gpu_rows(host)
    if rows is None:
        return False, "nvidia-smi failed"
    found = {"count": len(rows), "name": rows[0][0] if rows else ""}
    return found == check.expected, f"{found['count']}x {found['name']}"


def persistence_mode(host, check: Check):
    rows = _gpu_rows(host)
    if rows is None:
        return False, "nvidia-smi failed"
    found = ",".join(sorted({mode for _, mode in rows})) or "no GPUs"
    return found == check.expected, found


def npus(host, check: Check):
    out = host.run("npu-smi info -l")
    if out.rc != 0:
        return False, "npu-smi failed"
    count = sum(1 for line in out.stdout.splitlines() if line.strip().lower().startswith("npu id"))
    return count == check.expected["count"], f"{count} NPUs"


def clock_offsets(host, check: Check):
    out = host.run(check.params["cmd"])  # the clock script read by the tools venv's python (host data tools_venv)
    if out.rc != 0:
        return False, "cannot read offsets"
    # "<index> <offset MHz>" per GPU
    values = sorted({line.split()[-1] for line in out.stdout.splitlines() if line.strip()})
    return values == [str(check.expected)], ",".join(values) or "no GPUs"


def listening(host, check: Check):
    sockets = host.socket.get_listening_sockets()
    port = f":{check.params['port']}"
    ok = any(s.endswith(port) for s in sockets)
    return ok, "listening" if ok else "not listening"


def http_ok(host, check: Check):
    out = host.run(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {check.params['url']}")
    code = out.stdout.strip() or "no answer"
    return code == str(check.expected), code


# unit files and loaded units of ironserve's naming (roles/undeclared.py removes the ones a deploy wrote)
UNITS_OF_OUR_NAMING = (
    "{ ls -1 /etc/systemd/system; systemctl list-units --all --plain --no-legend 'sglang-*' "
    "| awk '{print $1}'; } | grep -E '^sglang-.*[.]service$' | sort -u"
)


def undeclared_units(host, check: Check):
    """Drift: a unit of ironserve's naming the deployment does not declare on this host, named by unit."""
    out = host.run(UNITS_OF_OUR_NAMING)
    stray = sorted(set(out.stdout.split()) - set(check.expected))
    return not stray, f"undeclared: {', '.join(stray)}" if stray else "none"


def _same(found, want) -> bool:
    if want is True:
        return found is True
    if isinstance(want, list):
        return isinstance(found, list) and [str(x) for x in found] == want
    try:
        return float(found) == float(want)
    except (TypeError, ValueError):
        return str(found) == want


def server_args(host, check: Check):
    """Drift: the running engine's effective arguments (SGLang's own /get_server_info) differ from the rendered
    ones (an engine started by hand with other flags, a live configuration never restarted into). Fields the
    server does not report are not compared."""
    out = host.run(check.params["cmd"])
    try:
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False, "no server info"
    if "error" in info:
        return False, f"no server info: {str(info['error'])[:80]}"
    differ = [
        f"{field}={str(info[field])[:40]} (rendered {str(want)[:40]})"
        for field, want in check.expected.items()
        if field in info and not _same(info[field], want)
    ]
    return not differ, ("differs: " + "; ".join(differ)) if differ else "same"


def command(host, check: Check):
    out = host.run(check.params["cmd"])
    found = out.stdout.strip() if out.rc == 0 else f"rc={out.rc}"
    return found == str(check.expected), found


def json_command(host, check: Check):
    out = host.run(check.params["cmd"])
    try:
        found = json.loads(out.stdout) if out.rc == 0 else None
    except ValueError:
        found = None
    return found == check.expected, json.dumps(found)[:60]


def listed(host, check: Check):
    """The check's item is one of the words its command prints (the command several checks share, run once)."""
    out = host.run(check.params["cmd"])
    found = "present" if check.params["item"] in out.stdout.split() else "missing"
    return found == check.expected, found


def file_sha256(host, check: Check):
    return file(host, check)


EVALUATORS = {
    name: fn
    for name, fn in globals().items()
    if callable(fn) and not name.startswith("_") and name not in ("Check",) and fn.__module__ == __name__
}


def evaluate(host, check: Check):
    try:
        return EVALUATORS[check.kind](host, check)
    except Exception as exc:  # an unreadable subject is drift, not a crash of the audit
        return False, f"error: {type(exc).__name__}: {str(exc)[:80]}"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
