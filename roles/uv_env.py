"""uv runtime (uv recipes): a pinned uv, and a venv with the recipe's Python and packages.

The venv is versioned by what goes into it (ironserve.units.venv_path: /opt/ironserve/venvs/runtime-<digest of
the runtime>, shared by the recipes of one runtime): a changed package set is installed into a new venv beside the
one the live unit runs, never into it, and the staged unit names the new one, so nothing that runs changes before
the launch stage makes it live. Runtime venvs that no live, staged or last good unit of any recipe names any more
are removed (``unused_venvs_removed``), and the recipe's venvs of earlier releases (<recipe>-<digest>, <recipe>), and
routers' venvs of other versions (sglang-router-<version>[-py<python>], roles/router_runtime.py).
Every command that builds or removes a venv (or installs uv) runs under the host's deploy lock
(roles/common.host_locked), and the removal decides again under it, keeping a venv another deploy prepared within
PREPARED_MINUTES (its mark, touched by the same locked command): two deploys on one host never delete each other's.

Host data (defaults in brackets):

- ``uv_version`` [the pinned default in ironserve/hostdata.py]: the uv installed at /usr/local/bin/uv
- ``uv_url`` [none]: a uv release tarball (uv-<arch>-unknown-linux-gnu.tar.gz) on the cluster's file mirror,
  with ``uv_sha256``, its sha256 (required: checked on the host before root unpacks it); without it uv comes from
  the package index: ``python3 -m pip install --target /opt/ironserve/uv/<version>``
- ``require_locks`` [false]: refuse a uv recipe that has no current lock file (below) instead of warning
- ``pip_index_url`` [none]: the air-gapped mirror. When set it is the ONLY index used, for uv itself and for
  the venv (the recipe's index_url / extra_index_urls / index_strategy are ignored: a mirror cannot reach them)
- ``package_indexes`` [{}]: index:NAME -> URL for the recipe's named indexes (ironserve.spec.resolve_index)
- ``uv_python_install_mirror`` [none]: UV_PYTHON_INSTALL_MIRROR, where uv fetches a managed Python when the
  host has no interpreter of the recipe's version (air-gapped clusters): a mirror of uv's own download list,
  whose archives uv checks against the hashes it ships
- ``uv_python_downloads_json_url`` [none]: UV_PYTHON_DOWNLOADS_JSON_URL, a download list of your own (uv's
  format: URL and sha256 of each install_only archive), for interpreters built in house

Interpreters: the OS's Python when its version is the recipe's ``runtime.python``; else, on an air-gapped host
(``pip_index_url`` set), a managed Python from ``uv_python_install_mirror`` or ``uv_python_downloads_json_url``;
else ``python_available`` (run by the preflight, before anything changes) refuses the host, naming host, version
and both fixes. uv never tries the internet for an interpreter on an air-gapped host (UV_PYTHON_DOWNLOADS=never
there without a source).

Overrides and excludes (``runtime.overrides``, ``runtime.excludes``) go to ``uv pip install --overrides/--excludes``
from files in the venv, exactly what lint's resolution check passes (ironserve/pins.py).

Hashes: with a lock file beside the recipe (``ironserve lock RECIPE``: ironserve/imagelock.py) the venv gets exactly
the lock's resolution for the host's machine, every distribution (transitive ones included) with the sha256 of its
files: ``uv pip install --require-hashes --no-deps -r <venv>/ironserve-requirements.lock.txt``, so a file the index
serves that is not the one locked is refused. Without a lock (none, a stale one, none for this machine) the deploy
prints a warning naming the recipe and the fix, and installs the pins as before, unchecked; host data
``require_locks`` makes that an error before any host is touched (roles/context.require_locked_runtime).

Idempotent where pyinfra's uv.venv is not: the venv is created only when missing or of another Python
(major.minor), and ``uv pip install`` runs only for the pinned packages whose installed version differs (an
install a killed run left unfinished, in a venv no unit runs yet).
The requirements as installed (with the index options) are written to <venv>/ironserve-requirements.txt for
audit; its mtime also tells the launch stage that the runtime changed under a running unit.
"""

from __future__ import annotations

import json
import re
import shlex

from pyinfra import host
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Arch
from pyinfra.operations import apt, files

from ironserve.hostdata import DEFAULTS
from ironserve.imagelock import hashed_requirements_text
from ironserve.problems import Problem
from ironserve.spec import UvRuntime, resolve_index
from ironserve.units import (
    HOME_DIRS,
    ROUTER_DIST,
    RUNTIME_VENV_PREFIX,
    STAGED_DIR,
    UNIT_DIR,
    router_venv,
    venv_path,
)
from roles.common import LongCommand, host_locked, put_text, refuse, run_if_changed, sha256_checked, word_lines
from roles.context import DeploymentContext, runtime_lock, unlocked_runtime
from roles.desired import RuntimeCheck
from roles.rollback import LAST_GOOD_DIR

# where unit files that may run again live: the live units, the staged ones, the last good configurations
REFERRING_DIRS = (UNIT_DIR, STAGED_DIR, LAST_GOOD_DIR)
# a venv this host's deploy built or installed into is "being prepared" for a while (touched by the same locked
# command): another deploy, running at the same time for another recipe, keeps it although no unit names it yet
PREPARED_MARK = ".ironserve-prepared"
PREPARED_MINUTES = 24 * 60
UV_BIN = "/usr/local/bin/uv"
UV_ROOT = "/opt/ironserve/uv"
PYTHON_DIR = "/opt/ironserve/python"  # the Pythons uv installs for venvs (UV_PYTHON_INSTALL_DIR)
PYPI_SIMPLE = "https://pypi.org/simple"
REQUIREMENTS_NAME = "ironserve-requirements.txt"
LOCKED_REQUIREMENTS_NAME = "ironserve-requirements.lock.txt"  # the lock's resolution, with hashes
OS_PYTHON = "/usr/bin/python3"  # the OS's interpreter, whatever its version (the router's venv)
OVERRIDES_NAME = "ironserve-overrides.txt"
EXCLUDES_NAME = "ironserve-excludes.txt"

# prints {"python": "3.12.3", "packages": {normalized name: version}} with the venv's own interpreter
_VENV_SCRIPT = (
    "import json, re, sys, importlib.metadata as m; "
    "print(json.dumps({'python': '%d.%d.%d' % sys.version_info[:3], 'base': sys.base_prefix, 'packages': "
    "{re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version for d in m.distributions() "
    "if d.metadata['Name']}}, sort_keys=True))"
)


# --------------------------------------------------------------------------- pure helpers


def normalize(name: str) -> str:
    """PEP 503 name, extras dropped: 'SGLang[all]' -> 'sglang'."""
    return re.sub(r"[-_.]+", "-", name.split("[", 1)[0]).lower()


def pins(packages: list[str]) -> dict[str, tuple[str, str]]:
    """{normalized name: (requirement as written, version)} for name==version requirements."""
    out = {}
    for req in packages:
        name, _, version = req.partition("==")
        out[normalize(name)] = (req, version)
    return out


def requirements_diff(packages: list[str], installed: dict[str, str] | None) -> list[str]:
    """The requirements (as written) whose pinned version is not the installed one, in recipe order."""
    installed = installed or {}
    return [req for name, (req, version) in pins(packages).items() if installed.get(name) != version]


def index_args(
    runtime: UvRuntime, pip_index_url: str | None = None, package_indexes: dict[str, str] | None = None
) -> list[str]:
    """uv index options: the host's mirror alone when it has one, else the recipe's indexes."""
    if pip_index_url:
        return ["--index-url", pip_index_url]
    indexes = package_indexes or {}
    args = []
    primary = resolve_index(runtime.index_url, indexes)
    if primary:
        args += ["--index-url", primary]
    for ref in runtime.extra_index_urls:
        args += ["--extra-index-url", resolve_index(ref, indexes) or PYPI_SIMPLE]
    if runtime.index_strategy:
        args += ["--index-strategy", runtime.index_strategy]
    return args


def install_args(runtime: UvRuntime, idx: list[str]) -> list[str]:
    return [*idx, *(["--prerelease", "allow"] if runtime.prerelease else [])]


def requirements_text(runtime: UvRuntime, idx: list[str], locked: int = 0) -> str:
    """The venv's record: the runtime's alone (no recipe id: recipes of one runtime share the venv, and the record's
    mtime tells the launch stage that the runtime changed under a running unit)."""
    lines = [f"# managed by ironserve: Python {runtime.python} (installed with uv pip install)"]
    if locked:
        lines.append(f"# --require-hashes: the lock's {locked} distributions ({LOCKED_REQUIREMENTS_NAME})")
    lines += [f"# {' '.join(idx[i : i + 2])}" for i in range(0, len(idx), 2)]
    if runtime.prerelease:
        lines.append("# --prerelease allow")
    lines += [f"# --overrides: {' '.join(runtime.overrides)}"] if runtime.overrides else []
    lines += [f"# --excludes: {' '.join(runtime.excludes)}"] if runtime.excludes else []
    return "\n".join(lines + list(runtime.packages)) + "\n"


def hashes_recorded(record: list[str] | None) -> bool:
    """Does the venv's record (requirements_text) say its packages were installed hash-checked from the lock?"""
    return any(line.startswith("# --require-hashes:") for line in record or [])


def _env_prefix(env: dict[str, str] | None) -> str:
    if not env:
        return ""
    return "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + " "


def interpreter_problems(
    host_name: str, recipe_id: str, python: str, found: list[str], air_gapped: bool, mirror: bool
) -> list[str]:
    """Why the venv's interpreter cannot be had on this host ([] when it can): the OS's (or an installed managed)
    Python of that version, a mirror to install one from, or a host that may download it."""
    if python in found or mirror or not air_gapped:
        return []
    have = ", ".join(sorted(set(found))) or "none"
    return [
        f"{host_name}: recipe {recipe_id} needs Python {python} (runtime.python); this air-gapped host "
        f"(pip_index_url is set) has Python {have} and uv cannot download an interpreter here. Fix: install "
        f"python{python} from the OS's packages (the OS's Python is used when it matches), or set host data "
        "uv_python_install_mirror to a mirror of uv's Python downloads (python-build-standalone releases) "
        "or uv_python_downloads_json_url to a download list of your own builds"
    ]


def python_sources(host_data) -> dict[str, str]:
    """uv's environment for fetching a managed Python, from host data ({} when none is named)."""
    out = {}
    if host_data.uv_python_install_mirror:
        out["UV_PYTHON_INSTALL_MIRROR"] = host_data.uv_python_install_mirror
    if host_data.uv_python_downloads_json_url:
        out["UV_PYTHON_DOWNLOADS_JSON_URL"] = host_data.uv_python_downloads_json_url
    return out


def uv_env(air_gapped: bool, python_sources: dict[str, str], index_mirror: str | None) -> dict[str, str]:
    """Environment of the uv commands: the mirrors, and no interpreter download attempt where none can succeed.
    A Python uv installs goes beside the venvs, readable by the engine's user (uv's default is root's home)."""
    env = {"UV_PYTHON_INSTALL_DIR": PYTHON_DIR, **python_sources}
    if not python_sources and air_gapped:
        env["UV_PYTHON_DOWNLOADS"] = "never"
    if index_mirror:
        # uv venv may resolve seed packages; keep even that on the mirror
        env["UV_INDEX_URL"] = index_mirror
    return env


def resolution_files(path: str, runtime: UvRuntime) -> dict[str, str]:
    """{file in the venv: text} for uv's --overrides / --excludes (none when the runtime has neither)."""
    out = {}
    if runtime.overrides:
        out[f"{path}/{OVERRIDES_NAME}"] = "".join(f"{x}\n" for x in runtime.overrides)
    if runtime.excludes:
        out[f"{path}/{EXCLUDES_NAME}"] = "".join(f"{x}\n" for x in runtime.excludes)
    return out


def resolution_args(path: str, runtime: UvRuntime) -> list[str]:
    args = []
    if runtime.overrides:
        args += ["--overrides", f"{path}/{OVERRIDES_NAME}"]
    if runtime.excludes:
        args += ["--excludes", f"{path}/{EXCLUDES_NAME}"]
    return args


# --------------------------------------------------------------------------- facts


class HostPythons(FactBase):
    """major.minor of every interpreter uv can use without downloading one: the OS's python3.X executables and
    the managed Pythons uv installed for root."""

    def command(self):
        return (
            'for p in /usr/bin/python3.* /usr/local/bin/python3.*; do case "$p" in *[0-9]) [ -x "$p" ] && '
            '"$p" -c \'import sys; print("%d.%d" % sys.version_info[:2])\' 2>/dev/null;; esac; done; '
            "ls -d /root/.local/share/uv/python/cpython-3.* 2>/dev/null; true"
        )

    def process(self, output):
        found = []
        for line in output:
            m = re.search(r"(?:^|cpython-)(3\.[0-9]+)", line.strip().rsplit("/", 1)[-1])
            if m and m.group(1) not in found:
                found.append(m.group(1))
        return found


class OsPython(FactBase):
    """major.minor of the OS's python3 (/usr/bin/python3, the interpreter of a router venv beside a docker
    runtime), None where there is none."""

    def command(self):
        return f"{OS_PYTHON} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null; true"

    def process(self, output):
        line = "".join(output).strip()
        return line if re.fullmatch(r"3\.[0-9]+", line) else None


class UvVersion(FactBase):
    """Version of /usr/local/bin/uv ('0.13.9'), None when it is not installed."""

    @staticmethod
    def light_paths():
        """What its value is read from (roles/converged.py)."""
        return [UV_BIN]

    def command(self):
        return f"{UV_BIN} --version 2>/dev/null || true"

    def process(self, output):
        parts = " ".join(output).split()
        return parts[1] if len(parts) >= 2 and parts[0] == "uv" else None


class VenvPackages(FactBase):
    """A venv's Python version and installed distributions: {python, packages {name: version}}; None when
    the venv (its bin/python) does not exist or does not run."""

    @staticmethod
    def light_paths(path):
        """What its value is read from (roles/converged.py)."""
        return venv_reads(path, f"{path}/bin/python")

    def command(self, path):
        py = shlex.quote(f"{path}/bin/python")
        return f"{py} -c {shlex.quote(_VENV_SCRIPT)} 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return None
        return json.loads(text)


def venv_reads(root: str, *executables: str) -> dict[str, list[str]]:
    """What a venv's package list is read from: its site-packages directory's entries (a package added, removed or
    upgraded renames one: its dist-info) and the contents of each distribution's metadata (name and version are
    read from there: an edit by hand changes the list without renaming anything). Contents, not inode status: uv
    hardlinks them from its cache, so another venv installing the same wheel changes their links and ctime."""
    site = f"{root}/lib/python*/site-packages"
    return {
        "paths": [*executables, f"{root}/pyvenv.cfg", site],
        "sums": [f"{site}/*.dist-info/METADATA", f"{site}/*.egg-info/PKG-INFO", f"{site}/*.egg-info"],
    }


def venv_in_use(var: str) -> str:
    """The shell test (on the venv directory in shell variable ``var``, e.g. '$d') of a venv in use: named by a
    live, staged or last good unit file, or prepared by a deploy within PREPARED_MINUTES."""
    refs = " ".join(shlex.quote(d) for d in REFERRING_DIRS)
    return (
        f"grep -rqsF --include='*.service' \"{var}/\" {refs} || "
        f'[ -n "$(find "{var}/{PREPARED_MARK}" -mmin -{PREPARED_MINUTES} 2>/dev/null)" ]'
    )


def prepared(path: str) -> str:
    """Marks the venv at ``path`` as being prepared by this deploy (see PREPARED_MARK)."""
    return f"touch {shlex.quote(f'{path}/{PREPARED_MARK}')}"


def removal_command(paths: list[str]) -> str:
    """Remove the venvs the plan found unused, each decided again under the deploy lock: another deploy may have
    named it in a unit, or prepared it for one, since."""
    return host_locked(
        f"for d in {' '.join(shlex.quote(p) for p in paths)}; do if {venv_in_use('$d')}; then "
        'echo "ironserve: $d kept: in use, or being prepared by another deploy"; '
        'else rm -rf "$d"; fi; done'
    )


class VenvsInUse(FactBase):
    """The runtime venvs on this host, the routers' venvs (of any version), and the recipe's venvs of earlier
    releases: {path: in use}, where in use = named by a live, staged or last good unit file of any recipe (any of them
    may run again: a restart, a launch, a rollback; recipes of one runtime or router version share its venv)."""

    def command(self, root, recipe_id):
        # runtime-<12 hex>; sglang-router-<version>[-py<python>]; and the recipe's own venvs of earlier releases
        # (another recipe's id may start with this one's): <id>-<12 hex>, and the unversioned <id>
        digest = "[0-9a-f]" * 12  # a glob: venv_path's 12 hex digits
        patterns = [
            shlex.quote(f"{root}/{RUNTIME_VENV_PREFIX}") + digest,
            shlex.quote(f"{root}/{ROUTER_DIST}-") + "[0-9]*",
            shlex.quote(f"{root}/{recipe_id}"),
            shlex.quote(f"{root}/{recipe_id}-") + digest,
        ]
        return (
            f'for d in {" ".join(patterns)}; do [ -d "$d" ] || continue; '
            f'if {venv_in_use("$d")}; then echo "used $d"; else echo "unused $d"; fi; done; true'
        )

    def process(self, output):
        return {path: kind == "used" for kind, path in word_lines(output) if kind in ("used", "unused") and path}


# --------------------------------------------------------------------------- operations


@operation()
def python_available(recipe_id: str, python: str, venv: str, air_gapped: bool, mirror: bool = False):
    """The venv's interpreter can be had without the internet where the host has none (checked before any change)."""
    have = host.get_fact(VenvPackages, path=venv)
    if have and ".".join(have["python"].split(".")[:2]) == python:
        host.noop(f"venv {venv} has Python {have['python']}")
        return
    problems = interpreter_problems(host.name, recipe_id, python, host.get_fact(HostPythons) or [], air_gapped, mirror)
    refuse(problems, f"Python {python} for {recipe_id}: available")
    return
    yield  # a generator that changes nothing


@operation()
def uv_installed(
    version: str = DEFAULTS.uv_version, index_url: str | None = None, url: str | None = None, sha256: str | None = None
):
    """/usr/local/bin/uv at the pinned version, from a tarball on the mirror (unpacked only when its sha256 is
    ``sha256``) or from the package index."""
    have = host.get_fact(UvVersion)
    if have == version:
        host.noop(f"uv {version} is installed")
        return
    target = shlex.quote(f"{UV_ROOT}/{version}")
    binary, uv_bin = shlex.quote(f"{UV_ROOT}/{version}/uv"), shlex.quote(UV_BIN)
    if url:
        if not sha256:
            raise OperationError(
                f"{host.name}: uv_url {url} has no checksum. Fix: set host data uv_sha256 to the tarball's sha256"
            )
        tarball = f"{UV_ROOT}/{version}.tar.gz"
        q_tarball = shlex.quote(tarball)
        yield host_locked(
            f"mkdir -p {target} && curl -fsSL {shlex.quote(url)} -o {q_tarball} && "
            f"{sha256_checked(tarball, sha256, 'uv_url', host.name)} && "
            f"tar -xz -f {q_tarball} -C {target} --strip-components=1 && rm -f {q_tarball} && "
            f"install -m 755 {binary} {uv_bin}"
        )
        return
    index = f" --index-url {shlex.quote(index_url)}" if index_url else ""
    # --target: no system site-packages touched (PEP 668 hosts refuse a plain pip install)
    yield host_locked(
        f"python3 -m pip install --disable-pip-version-check --no-cache-dir --upgrade --target "
        f"{target}{index} {shlex.quote(f'uv=={version}')} && "
        f"ln -sfn {shlex.quote(f'{UV_ROOT}/{version}/bin/uv')} {uv_bin}"
    )


@operation()
def venv_present(path: str, python: str, env: dict[str, str] | None = None):
    """A venv at ``path`` with Python ``python`` (major.minor); recreated when it has another Python."""
    have = host.get_fact(VenvPackages, path=path)
    # an interpreter uv installed under root's home (its default place before PYTHON_DIR): the engine's user cannot
    # reach it, and the units' ProtectHome= hides it
    in_home = any((have or {}).get("base", "").startswith(d + "/") for d in HOME_DIRS)
    if have and (python == OS_PYTHON or ".".join(have["python"].split(".")[:2]) == python) and not in_home:
        host.noop(f"venv {path} has Python {have['python']}")
        return
    # another interpreter: every compiled wheel in it is for the wrong ABI, start over
    start_over = f"rm -rf {shlex.quote(path)} && " if have else ""
    yield host_locked(
        f"{start_over}{_env_prefix(env)}{UV_BIN} venv --python {shlex.quote(python)} "
        f"{shlex.quote(path)} && {prepared(path)}"
    )


@operation()
def venv_packages(
    path: str,
    packages: list[str],
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    hashed: str | None = None,
    constraints: str | None = None,
):
    """``uv pip install`` the pinned packages whose installed version differs (none: no-op). ``hashed``: a
    requirements file on the host with every one of ``packages`` and its hashes (the lock's full resolution),
    installed as it is, hash-checked (``--require-hashes --no-deps``). ``constraints``: a lock's hashed resolution
    that holds ``packages`` and their dependencies (and more): resolved within it, every file hash-checked
    (``--require-hashes -c``)."""
    have = host.get_fact(VenvPackages, path=path)
    todo = requirements_diff(packages, (have or {}).get("packages"))
    # a venv installed before it had a lock: its files were never checked, so the lock's set goes in again
    installed = set((have or {}).get("packages") or {}) & set(pins(packages))
    unchecked = bool(
        (hashed or constraints)
        and installed
        and not hashes_recorded(host.get_fact(FileContents, path=f"{path}/{REQUIREMENTS_NAME}"))
    )
    if not todo and not unchecked:
        host.noop(f"venv {path} has the {len(packages)} pinned package(s)")
        return
    reinstall = ["--reinstall"] if unchecked else []
    if hashed:
        what = ["--require-hashes", "--no-deps", *reinstall, "-r", hashed]
    elif constraints:
        what = ["--require-hashes", *reinstall, "-c", constraints, *(packages if unchecked else todo)]
    else:
        what = todo
    # no --compile-bytecode: it compiles all of a runtime's 20,000 files (90 s of CPU a host), of which an engine
    # imports a few thousand. The venv is root's and the engine's user cannot write __pycache__ in it, so its units
    # keep their bytecode in their JIT directory (PYTHONPYCACHEPREFIX, files/templates/sglang.service.j2): the
    # first start compiles what it imports, once, and every later start and spawned process reads it
    cmd = [UV_BIN, "pip", "install", "--python", f"{path}/bin/python", *(args or []), *what]
    yield LongCommand(
        host_locked(f"{_env_prefix(env)}{shlex.join(cmd)} && {prepared(path)}"),
        f"installing {len(todo)} package(s) into {path}",
    )


@operation()
def unused_venvs_removed(root: str, recipe_id: str, keep: str):
    """Runtime venvs (and the recipe's venvs of earlier releases) that no live, staged or last good unit names are
    removed (never ``keep``, the one this run prepares): a few GiB each, and a rollback only ever needs the last
    good one."""
    unused = sorted(
        p
        for p, used in (host.get_fact(VenvsInUse, root=root, recipe_id=recipe_id) or {}).items()
        if not used and p != keep
    )
    if not unused:
        host.noop("no unused venvs")
        return
    yield removal_command(unused)


# --------------------------------------------------------------------------- deploy


def venvs_of(ctx: DeploymentContext) -> list[tuple[str, str]]:
    """The uv venvs this host gets, each with its Python (major.minor): the runtime's where it runs an engine, the
    router's own (on the runtime's Python) where it runs the router; a docker runtime's router venv runs the OS's
    python3, which needs no check."""
    runtime = ctx.recipe.runtime
    if not isinstance(runtime, UvRuntime):
        return []
    router = router_venv(ctx.recipe) if ctx.runs_router else None
    engines = [] if ctx.is_router_only else [venv_path(ctx.recipe)]
    return [(path, runtime.python) for path in [*engines, *([router] if router else [])]]


def uv_present(ctx: DeploymentContext, env: dict[str, str]) -> None:
    """/usr/local/bin/uv at the pinned version (from the mirror's tarball, or pip from the package index)."""
    mirror = ctx.host.pip_index_url
    if not ctx.host.uv_url:
        # uv comes from the package index through pip; Debian's python3 has no pip module without this.
        # A fresh host may never have fetched its apt lists (or has stale ones): update only while it is missing
        missing = "python3-pip" not in (host.get_fact(DebPackages) or {})
        run_if_changed(name="apt update (python3-pip missing)", command="apt-get update", triggers=[missing])
        apt.packages(name="python3-pip for installing uv", packages=["python3-pip"], no_recommends=True)
    uv_installed(
        name=f"uv {ctx.host.uv_version}",
        version=ctx.host.uv_version,
        index_url=mirror,
        url=ctx.host.uv_url,
        sha256=ctx.host.uv_sha256,
    )


def locked_resolution(ctx: DeploymentContext) -> dict[str, list[str]] | None:
    """The lock's {"name==version": hashes} for this host's machine; None (with the warning, or the error under
    require_locks) when there is none."""
    platforms, why = runtime_lock(ctx)
    arch = host.get_fact(Arch)
    if platforms is not None and arch not in platforms:
        why = f"its lock file resolves {', '.join(sorted(platforms))}, not {arch} (`ironserve lock --arch {arch}`)"
    elif platforms is not None:
        return platforms[arch]
    return unchecked(ctx, unlocked_runtime(ctx, why))


def unchecked(ctx: DeploymentContext, problem: Problem) -> None:
    """A venv this host would install without hash checks: an error under require_locks (before any change: hosts
    are planned before any runs), else a warning naming the fix."""
    if ctx.host.require_locks:
        raise PyinfraError(f"bad recipe or host data, nothing was changed:\n  {problem.line()}")
    host.log_styled(f"warning: {host.name}: {problem.message}. Fix: {problem.fix}", fg="yellow")


@deploy("uv runtime")
def apply(ctx: DeploymentContext) -> None:
    runtime = ctx.recipe.runtime
    assert isinstance(runtime, UvRuntime)
    mirror = ctx.host.pip_index_url
    env = uv_env(bool(mirror), python_sources(ctx.host), mirror)
    uv_present(ctx, env)
    path = venv_path(ctx.recipe)
    files.directory(name="venv root", path=path.rsplit("/", 1)[0], mode="755")
    idx = index_args(runtime, mirror, ctx.host.package_indexes)
    created = venv_present(name=f"venv {path} (Python {runtime.python})", path=path, python=runtime.python, env=env)
    for dest, text in resolution_files(path, runtime).items():
        put_text(f"venv {dest.rsplit('/', 1)[1]}", text, dest)
    locked = locked_resolution(ctx)
    if locked:
        hashed = f"{path}/{LOCKED_REQUIREMENTS_NAME}"
        put_text("venv requirements with hashes (lock)", hashed_requirements_text(locked), hashed)
        installed = venv_packages(
            name=f"venv {path} packages (hash-checked)",
            path=path,
            packages=sorted(locked),
            args=install_args(runtime, idx),
            env=env,
            hashed=hashed,
        )
    else:
        installed = venv_packages(
            name=f"venv {path} packages",
            path=path,
            packages=list(runtime.packages),
            args=install_args(runtime, idx) + resolution_args(path, runtime),
            env=env,
        )
    put_text(
        "venv requirements record", requirements_text(runtime, idx, len(locked or {})), f"{path}/{REQUIREMENTS_NAME}"
    )
    ctx.changes.record_runtime_change(created, installed)
    ctx.changes.record_runtime_paths(f"{path}/{REQUIREMENTS_NAME}")
    root, _, _ = path.rpartition("/")
    unused_venvs_removed(name="unused venvs removed", root=root, recipe_id=ctx.recipe.id, keep=path)


# --------------------------------------------------------------------------- audit


def venv_check(path: str, packages: list[str]) -> RuntimeCheck:
    """An audit check: every pinned package at its version in the venv at ``path``."""
    wanted = {name: version for name, (_, version) in pins(packages).items()}
    names = json.dumps(sorted(wanted))
    script = (
        "import json, importlib.metadata as m\n"
        f"out = {{}}\nfor n in {names}:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))"
    )
    cmd = f"{path}/bin/python -c {shlex.quote(script)}"
    return RuntimeCheck(f"venv-packages:{path}", wanted, cmd, "json_command")


def desired_runtime(ctx: DeploymentContext) -> list[RuntimeCheck]:
    """Every pinned package at its version in the venv, for `ironserve audit`."""
    runtime = ctx.recipe.runtime
    if not isinstance(runtime, UvRuntime):
        return []
    return [venv_check(venv_path(ctx.recipe), list(runtime.packages))]
