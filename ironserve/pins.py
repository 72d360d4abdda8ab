"""Do a uv runtime's pins resolve? `uv pip compile` of the recipe's packages against the indexes it names.

A pin set that no resolver can satisfy (sglang 0.5.23 requires torch==2.14.1, the recipe pins torch==2.8.0) fails
only on the host, at the install step of a deploy; lint asks the resolver first, for the recipe's Python and the
platform of each hardware profile it lists, with the recipe's overrides and excludes (what the uv role passes).

Verdicts (one finding per recipe and platform):

- resolves: nothing to say;
- contradiction: ``uv-pins-unresolvable`` (error) with the resolver's own explanation;
- the resolver could not ask (no uv here, an index unreachable or offline, an ``index:NAME`` with no URL):
  ``uv-pins-not-resolved`` (warning), which says why, so an offline lint says "not resolved" and never fails.

Pure apart from running uv; the core's rule: no roles, no pyinfra.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from .findings import Finding, Severity
from .resources import uv_binary
from .spec import HardwareProfile, Recipe, UvRuntime, resolve_index

PYPI_SIMPLE = "https://pypi.org/simple"
# for `ironserve lint --rules`: rule id -> (severity, summary, source)
RULES = {
    "uv-pins-unresolvable": (
        Severity.error,
        "A uv runtime's pins cannot be installed together (uv pip compile)",
        "issue 19: Atlas pins sglang 0.5.23 with torch 2.8.0",
    ),
    "uv-pins-not-resolved": (
        Severity.warning,
        "A uv runtime's pins were not resolved (offline, an index unreachable or unmapped)",
        "issue 19",
    ),
}
# manylinux level of the oldest OS the seeds' clusters run (Ubuntu 22.04, glibc 2.35)
PLATFORMS = {"x86_64": "x86_64-manylinux_2_35", "aarch64": "aarch64-manylinux_2_35"}
TIMEOUT_S = 180
# what uv says when it could not ask an index (as opposed to a resolution that failed on the pins themselves)
_UNREACHABLE = re.compile(
    r"(dns error|failed to (fetch|connect|download)|connection (refused|reset)|"
    r"network is unreachable|offline|request failed|timed out|error sending request)",
    re.I,
)


def index_options(runtime: UvRuntime, package_indexes: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(uv index options, index:NAME references left without a URL)."""
    indexes, missing, args = package_indexes or {}, [], []
    for ref, option in [
        (runtime.index_url, "--index-url"),
        *((r, "--extra-index-url") for r in runtime.extra_index_urls),
    ]:
        if not ref:
            continue
        try:
            url = resolve_index(ref, indexes) or PYPI_SIMPLE  # index:pypi
        except KeyError:
            missing.append(ref)
            continue
        args += [option, url]
    if not runtime.index_url:
        args = ["--index-url", PYPI_SIMPLE, *args]
    if runtime.index_strategy:
        args += ["--index-strategy", runtime.index_strategy]
    if runtime.prerelease:
        args += ["--prerelease", "allow"]
    return args, missing


def compile_command(uv: str, runtime: UvRuntime, platform: str, idx: list[str], workdir: Path) -> list[str]:
    """`uv pip compile` of the pins as the uv role installs them (overrides, excludes), for one target platform."""
    (workdir / "requirements.in").write_text("".join(f"{p}\n" for p in runtime.packages))
    cmd = [
        uv,
        "pip",
        "compile",
        str(workdir / "requirements.in"),
        "--no-config",
        "--quiet",
        "--no-header",
        "--python-version",
        runtime.python,
        "--python-platform",
        platform,
        *idx,
    ]
    for option, lines in (("--overrides", runtime.overrides), ("--excludes", runtime.excludes)):
        if lines:
            path = workdir / option.strip("-")
            path.write_text("".join(f"{x}\n" for x in lines))
            cmd += [option, str(path)]
    return cmd


def _explanation(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    keep = [line for line in lines if not line.startswith("hint:")] or lines
    return " ".join(keep)[:900]


def resolve_findings(
    recipe: Recipe,
    profiles: dict[str, HardwareProfile],
    *,
    offline: bool = False,
    package_indexes: dict[str, str] | None = None,
    timeout: int = TIMEOUT_S,
) -> list[Finding]:
    runtime = recipe.runtime
    if not isinstance(runtime, UvRuntime):
        return []
    where = f"{recipe.id} runtime"
    if offline:
        return _not_resolved(
            where,
            "offline lint asks no index",
            "run `ironserve lint` without --offline where the recipe's indexes are reachable",
        )
    idx, missing = index_options(runtime, package_indexes)
    if missing:
        return _not_resolved(
            where,
            f"{', '.join(missing)} has no URL here",
            "map it with --inventory (host data package_indexes) to resolve against it",
        )
    uv = uv_binary()
    if not uv:
        return _not_resolved(where, "no uv on this machine", "install uv (scripts/env.sh does)")
    findings = []
    for arch in sorted({profiles[h].cpu_arch for h in recipe.hardware if h in profiles}):
        findings += _platform_findings(uv, runtime, PLATFORMS[arch], idx, timeout, where)
    return findings


def _not_resolved(where: str, why: str, fix: str) -> list[Finding]:
    return [Finding("uv-pins-not-resolved", Severity.warning, f"pins not resolved: {why}", fix, where)]


def _platform_findings(
    uv: str, runtime: UvRuntime, platform: str, idx: list[str], timeout: int, where: str
) -> list[Finding]:
    """uv pip compile of the runtime's pins for one machine: [] when they resolve, else why not. An index out of
    reach says nothing about the pins: a warning; pins that cannot resolve are an error."""
    with tempfile.TemporaryDirectory(prefix="ironserve-pins-") as tmp:
        cmd = compile_command(uv, runtime, platform, idx, Path(tmp))
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return _not_resolved(where, f"uv took longer than {timeout} s ({platform})", "check the index")
    if proc.returncode == 0:
        return []
    text = _explanation(proc.stderr)
    if "No solution found" in proc.stderr or "unsatisfiable" in proc.stderr:
        message = f"the runtime's pins cannot be installed together on {platform} (Python {runtime.python}): {text}"
        fix = (
            "pin versions that resolve (uv pip compile), or add runtime.overrides / runtime.excludes where the "
            "build's published metadata names another platform's dependencies"
        )
        return [Finding("uv-pins-unresolvable", Severity.error, message, fix, where)]
    if _UNREACHABLE.search(proc.stderr):
        return _not_resolved(
            where, f"an index could not be reached ({text[:300]})", "run lint where the recipe's indexes are reachable"
        )
    message = f"uv could not resolve the runtime's pins on {platform}: {text}"
    return [Finding("uv-pins-unresolvable", Severity.error, message, "fix the pins or the indexes", where)]
