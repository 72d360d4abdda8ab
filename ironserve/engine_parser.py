"""Real-parser validation: check an engine argv with the SGLang (or sglang-router) version's own parser.

Each engine version gets its own cached venv under
``${IRONSERVE_CACHE:-~/.cache/ironserve}/sglang-parsers/<version>/`` (router: ``router-<version>/``).
A sglang venv holds ``sglang==<version>`` installed with ``--no-deps``, CPU ``torch==2.13.0`` from a
local wheel directory (``/opt/wheels``; override with ``IRONSERVE_TORCH_WHEELS``) and only the small
packages that ``sglang.srt.server_args`` imports, discovered at build time by importing it and
installing whatever is missing (pinned to the versions sglang's own metadata asks for). A plain
``pip install sglang`` would pull gigabytes of CUDA wheels; this never happens here because torch is
pinned to the ``+cpu`` build, sglang comes with ``--no-deps`` and CUDA-only distributions are refused.

One thing is shimmed, in the venv only: ``torchvision``. PyPI's torchvision wheels are CUDA builds
that cannot load next to CPU torch, yet sglang imports ``torchvision.transforms`` at module level in
multimodal helpers that sit on server_args' import chain. Argument parsing never calls it, so an inert
placeholder package (no dist-info, so transformers still sees "torchvision unavailable") is written
into the venv; see ``_TORCHVISION_SHIM``. Nothing in sglang itself is patched.

The parse runs in a subprocess (``_parser_probe.py`` with the venv's interpreter) with
``allow_abbrev=False``; see that module for the rules it reports. Importing server_args takes
10-30 s on a small CPU, so :func:`check_many` parses many argvs in one subprocess, and that subprocess stays
for every later check against the same venv in this process (ironserve/parser_probes.py: a lint of a catalogue,
an import of a script, a test session import each release once).

Builds are safe under concurrency (an ``fcntl`` lock per venv) and atomic (built in a temporary
directory next to the final one and renamed into place only once complete and self-tested).
"""

from __future__ import annotations

import difflib
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from ironserve import parser_probes
from ironserve.findings import Finding, Severity
from ironserve.resources import uv_binary

TORCH_VERSION = "2.13.0"
TORCH_PIN = f"torch=={TORCH_VERSION}+cpu"
DEFAULT_ROUTER_VERSION = "0.3.2"  # latest sglang-router on PyPI, and the one current in March 2026
PROBE = Path(__file__).with_name("_parser_probe.py")
PROBE_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 1800

# Packages whose import sglang.srt.server_args needs (found by importing it, 0.5.9 .. 0.5.23). Installed
# in one go to save resolver rounds; anything a version additionally needs is discovered at build time.
_BASE_IMPORTS = [
    "numpy",
    "tqdm",
    "pybase64",
    "requests",
    "IPython",
    "pydantic",
    "aiohttp",
    "safetensors",
    "orjson",
    "triton",
    "zmq",
    "packaging",
    "PIL",
    "starlette",
    "openai",
    "partial_json_parser",
    "huggingface_hub",
    "transformers",
    "dill",
    "sentencepiece",
    "psutil",
    "yaml",
    "msgspec",
]
# import name -> distribution name where they differ
_DIST_OF = {
    "zmq": "pyzmq",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "IPython": "ipython",
    "google": "protobuf",
    "sklearn": "scikit-learn",
    "cv2": "opencv-python-headless",
    "dateutil": "python-dateutil",
    "multipart": "python-multipart",
    "jwt": "pyjwt",
    "sentencepiece": "sentencepiece",
    "setproctitle": "setproctitle",
    "huggingface_hub": "huggingface-hub",
    "attr": "attrs",
    "grpc": "grpcio",
    "grpc_reflection": "grpcio-reflection",
    "grpc_health": "grpcio-health-checking",
    "decord": "decord2",
    "openai_harmony": "openai-harmony",
    "compressed_tensors": "compressed-tensors",
    "prometheus_client": "prometheus-client",
    "smg_grpc_proto": "smg-grpc-proto",
    "mistral_common": "mistral-common",
    "xxhash": "xxhash",
    "zstandard": "zstandard",
}
# Never installed into a parser venv: CUDA-only, GPU kernels or torch itself. If a version's
# server_args import chain needs one of them, the build fails loudly (a shim would be needed).
_REFUSED = re.compile(
    r"^(torch|torchvision|torchaudio|nvidia-.*|cuda-.*|flashinfer.*|sgl[-_]kernel|sglang-kernel|"
    r"sgl-deep-.*|sgl-flash-mla|deep[-_]gemm|deep[-_]ep|vllm|xformers|flash[-_]attn.*|"
    r"torch[-_]memory[-_]saver|cupy.*|tilelang|humming-kernels|quack-kernels|nvshmem.*)$",
    re.I,
)
# What a PyPI version looks like (final, .postN, aN/bN/rcN pre-releases, .devN). Nightly/dev image
# tags, git builds and local versions ("+cu130", "+gitabc") are not: they have no wheel to parse with.
_RELEASE = re.compile(r"^\d+(\.\d+){1,3}((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")

# The torchvision placeholder (single source shared with the lab's CPU runtime): see its docstring.
_TORCHVISION_SHIM = Path(__file__).with_name("shims") / "torchvision"


class EngineNotAvailable(RuntimeError):
    """The engine version is not a PyPI release (nightly/dev image, git build) or not on PyPI.

    ``nearest`` is the PyPI release of the same month when the version names one (e.g.
    ``dev-cu13-2026-03`` -> ``0.5.9``), else None.
    """

    def __init__(self, message: str, nearest: str | None = None):
        super().__init__(message)
        self.nearest = nearest


class ParserEnvError(RuntimeError):
    """A parser venv could not be built or its probe failed."""


class UvMissing(ParserEnvError):
    """No uv anywhere (neither on PATH nor the `uv` package beside ironserve): the fix is to install it."""


# --------------------------------------------------------------------------------------------
# venvs
# --------------------------------------------------------------------------------------------


def cache_root() -> Path:
    return Path(os.environ.get("IRONSERVE_CACHE") or Path.home() / ".cache" / "ironserve")


def parsers_dir() -> Path:
    return cache_root() / "sglang-parsers"


def normalize_version(version: str, package: str = "sglang") -> str:
    """'sglang==0.5.9', 'v0.5.9', '0.5.9' -> '0.5.9'; EngineNotAvailable for non-releases."""
    v = str(version).strip()
    for prefix in (f"{package}==", f"{package.replace('-', '_')}==", "=="):
        if v.startswith(prefix):
            v = v[len(prefix) :]
    v = v.lstrip("vV")
    if not _RELEASE.match(v):
        era = release_for_era(v) if package == "sglang" else None
        raise EngineNotAvailable(
            f"{package} {version!r} is not a PyPI release (nightly/dev images, git builds and local "
            f"versions have no wheel to take the parser from); pin the engine to a released "
            f"{package}==X.Y.Z to get real-parser validation"
            + (f" -- the newest release of that month is {era} (--engine sglang=={era})" if era else ""),
            era,
        )
    return v


def env_dir(version: str, *, router: bool = False) -> Path:
    package = "sglang-router" if router else "sglang"
    v = normalize_version(version, package)
    return parsers_dir() / (f"router-{v}" if router else v)


def _manifest(path: Path) -> Path:
    return path / "ironserve-env.json"


def _python(path: Path) -> Path:
    return path / "bin" / "python"


def parser_env(version: str, *, router: bool = False) -> Path:
    """The cached venv for ``sglang==version`` (``router=True``: ``sglang-router==version``), built once.

    Raises EngineNotAvailable when the version is not a PyPI release, ParserEnvError when the build
    fails (the half-built venv is removed; nothing is left under the final path).
    """
    final = env_dir(version, router=router)
    if _manifest(final).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.parent / f".{final.name}.lock"):
        if _manifest(final).is_file():  # built by someone else while we waited
            return final
        if final.exists():  # incomplete leftover (e.g. killed rename race): never trust it
            shutil.rmtree(final, ignore_errors=True)
        _clean_stale_tmp(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-{os.getpid()}-", dir=final.parent))
        try:
            t0 = time.time()
            if router:
                info = _build_router(tmp, final.name.removeprefix("router-"))
            else:
                info = _build_sglang(tmp, final.name)
            info["build_seconds"] = round(time.time() - t0, 1)
            info["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            info["path"] = str(final)
            _manifest(tmp).write_text(json.dumps(info, indent=1, sort_keys=True))
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def router_env(version: str = DEFAULT_ROUTER_VERSION) -> Path:
    return parser_env(version, router=True)


@contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _clean_stale_tmp(parent: Path) -> None:
    for p in parent.glob(".tmp-*"):
        try:
            pid = int(p.name.split("-")[-2])
        except (ValueError, IndexError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass


def _uv() -> str:
    uv = uv_binary()
    if not uv:
        raise UvMissing("uv is required to build parser venvs and is not installed here")
    return uv


def _run(cmd: list[str], what: str, timeout: int = BUILD_TIMEOUT_S) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.setdefault("UV_NO_PROGRESS", "1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise ParserEnvError(f"{what} failed ({shlex.join(cmd)}):\n{proc.stderr[-3000:]}")
    return proc


def _torch_wheels() -> Path:
    wheels = Path(os.environ.get("IRONSERVE_TORCH_WHEELS", "/opt/wheels"))
    if not wheels.is_dir() or not list(wheels.glob(f"torch-{TORCH_VERSION}+cpu-*.whl")):
        raise ParserEnvError(
            f"no CPU torch wheel torch-{TORCH_VERSION}+cpu-*.whl in {wheels}: parser venvs need CPU "
            "torch and the PyTorch CPU index is not reachable from here (an unpinned torch from PyPI "
            "is a multi-GB CUDA build). Put the wheel there or point IRONSERVE_TORCH_WHEELS at a "
            "directory holding it."
        )
    return wheels


def _new_venv(path: Path) -> None:
    python = sys.executable if sys.version_info[:2] == (3, 11) else "3.11"
    _run([_uv(), "venv", "--quiet", "--relocatable", "--python", python, str(path)], "uv venv")


def _pip(path: Path, *args: str, what: str, find_links: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [_uv(), "pip", "install", "--quiet", "--python", str(_python(path))]
    if find_links is not None:
        cmd += ["--find-links", str(find_links)]
    return _run(cmd + list(args), what)


def _install_release(path: Path, package: str, version: str, *extra: str, **kw) -> None:
    try:
        _pip(path, f"{package}=={version}", *extra, what=f"installing {package}=={version}", **kw)
    except ParserEnvError as err:
        raise _unreleased(package, version, err) from err


def _unreleased(package: str, version: str, err: ParserEnvError) -> Exception:
    """EngineNotAvailable when the failed install says the version is no release; else the failure itself."""
    if re.search(r"no version of|not found in the package registry|No matching distribution", str(err)):
        return EngineNotAvailable(
            f"{package}=={version} is not on PyPI; real-parser validation needs a released "
            f"version (`pip index versions {package}` lists them)"
        )
    return err


def release_only(version: str, target: Path) -> Path:
    """``sglang==version`` without its dependencies, installed into ``target`` (``uv pip install --target``): the
    release's own package and dist-info in seconds, where its parser venv takes a minute and GBs. Raises
    EngineNotAvailable or ParserEnvError as :func:`parser_env` does."""
    what = f"installing sglang=={version} alone"
    cmd = [_uv(), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--target", str(target)]
    try:
        _run([*cmd, f"sglang=={version}"], what)
    except ParserEnvError as err:
        raise _unreleased("sglang", version, err) from err
    return target


def _requires(path: Path, dist: str) -> dict[str, str]:
    """{normalized name: requirement without markers} from the installed dist's METADATA."""
    site = next((path / "lib").glob("python3*/site-packages"))
    meta = next(site.glob(f"{dist.replace('-', '_')}-*.dist-info/METADATA"))
    reqs: dict[str, str] = {}
    for line in meta.read_text(errors="replace").splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec, _, marker = line.split(":", 1)[1].partition(";")
        if "extra ==" in marker:
            continue
        spec = spec.strip()
        name = re.split(r"[\s<>=!~\[(]", spec, maxsplit=1)[0]
        reqs[_norm(name)] = spec.replace("(", "").replace(")", "")
    return reqs


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parser_distributions() -> list[str]:
    """The distributions a parser venv is built from: torch and what ``sglang.srt.server_args`` imports (the lab's
    stand-in images keep these, with what they require, and nothing else)."""
    return ["torch", *[_DIST_OF.get(m, m) for m in _BASE_IMPORTS]]


def _requirement(module: str, pins: dict[str, str]) -> str:
    dist = _DIST_OF.get(module, module)
    return pins.get(_norm(dist), dist)


def _site_packages(path: Path) -> Path:
    return next((path / "lib").glob("python3*/site-packages"))


def _write_shim(path: Path) -> None:
    root = _site_packages(path) / "torchvision"
    for source in sorted(_TORCHVISION_SHIM.rglob("*.py")):
        target = root / source.relative_to(_TORCHVISION_SHIM)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text())


def _build_sglang(tmp: Path, version: str) -> dict:
    wheels = _torch_wheels()
    _new_venv(tmp)
    constraints = tmp / "ironserve-constraints.txt"
    constraints.write_text(f"{TORCH_PIN}\n")
    # sglang first (cheap, and tells us quickly whether the version exists at all)
    _install_release(tmp, "sglang", version, "--no-deps")
    _pip(tmp, TORCH_PIN, what="installing CPU torch", find_links=wheels)
    pins = _requires(tmp, "sglang")
    base = [_requirement(m, pins) for m in _BASE_IMPORTS]
    try:
        _pip(tmp, "-c", str(constraints), *base, what="installing parser deps", find_links=wheels)
    except ParserEnvError:  # a pin of this sglang does not resolve with torch 2.13: take latest
        _pip(
            tmp,
            "-c",
            str(constraints),
            *parser_distributions()[1:],
            what="installing parser deps (unpinned)",
            find_links=wheels,
        )
    _write_shim(tmp)
    discovered = []
    for _ in range(40):
        answer = _probe_raw(tmp, {"kind": "server", "argvs": [], "dump_flags": True})
        if answer.get("ok"):
            break
        module = answer.get("missing_module")
        if not module:
            raise ParserEnvError(f"sglang {version}: importing server_args failed:\n{answer.get('error')}")
        dist = _DIST_OF.get(module, module)
        if _REFUSED.match(dist) or module in discovered:
            raise ParserEnvError(
                f"sglang {version}: server_args imports {module!r} ({dist}), which a CPU parser venv "
                f"cannot (or must not) install; a shim would be needed:\n{answer.get('error')}"
            )
        discovered.append(module)
        _pip(
            tmp,
            "-c",
            str(constraints),
            _requirement(module, pins),
            what=f"installing {dist} (imported by sglang {version})",
            find_links=wheels,
        )
    else:
        raise ParserEnvError(f"sglang {version}: import chain did not settle after 40 installs")
    return _finish_venv(
        tmp, "sglang", version, answer, torch=TORCH_PIN, discovered_imports=discovered, shims=["torchvision"]
    )


def _build_router(tmp: Path, version: str) -> dict:
    _new_venv(tmp)
    # sglang-router's own deps are small (setproctitle, aiohttp, orjson, uvicorn, fastapi): take them.
    _install_release(tmp, "sglang-router", version)
    answer = _probe_raw(tmp, {"kind": "router", "argvs": [], "dump_flags": True})
    if not answer.get("ok"):
        raise ParserEnvError(f"sglang-router {version}: import failed:\n{answer.get('error')}")
    return _finish_venv(tmp, "sglang-router", version, answer, shims=[])


def _finish_venv(tmp: Path, package: str, version: str, answer: dict, **facts) -> dict:
    """A built parser venv's last steps: no CUDA in it, its flags kept (flags.json), and its manifest (the package,
    how long the import took, what the build added, the exact freeze)."""
    _check_no_cuda(tmp)
    (tmp / "flags.json").write_text(json.dumps(answer["flags"], indent=0, sort_keys=True))
    return {"package": package, "version": version, "import_s": answer["import_s"], **facts, "freeze": _freeze(tmp)}


def _freeze(path: Path) -> list[str]:
    proc = _run([_uv(), "pip", "freeze", "--python", str(_python(path))], "uv pip freeze")
    return proc.stdout.split()


def _check_no_cuda(path: Path) -> None:
    site = _site_packages(path)
    cuda = [p.name for p in site.glob("nvidia_*.dist-info")] + [p.name for p in site.glob("nvidia") if p.is_dir()]
    if cuda:
        raise ParserEnvError(f"CUDA packages slipped into the parser venv {path}: {cuda}")


# --------------------------------------------------------------------------------------------
# probing
# --------------------------------------------------------------------------------------------


def _probe_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": "",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "SGLANG_IS_IN_CI": "false",
        }
    )
    return env


def _probe_raw(path: Path, request: dict, timeout: int = PROBE_TIMEOUT_S, warm: bool = False) -> dict:
    """The probe's answer in ``path``'s venv: a process of its own, or (``warm``, a finished venv) the venv's warm
    probe, which imports the parser once for every check of this process (ironserve/parser_probes.py)."""
    cmd = [str(_python(path)), "-I", "-W", "ignore", str(PROBE)]
    if warm:
        try:
            built = _manifest(path).stat()
            return parser_probes.ask(path, [*cmd, "--serve"], _probe_env(), request, timeout, built.st_mtime_ns)
        except parser_probes.ProbeFailed as err:
            raise ParserEnvError(f"parser probe in {path} {err}:\n{err.detail}") from err
    try:
        proc = subprocess.run(
            cmd, input=json.dumps(request), capture_output=True, text=True, timeout=timeout, env=_probe_env()
        )
    except subprocess.TimeoutExpired as err:
        raise ParserEnvError(f"parser probe in {path} timed out after {timeout}s") from err
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise ParserEnvError(f"parser probe in {path} gave no answer (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def split_launcher(argv: list[str] | str) -> tuple[str, str, list[str]]:
    """(kind, launcher, flags) for a full engine command.

    kind is "server" or "router"; launcher "launch_server", "serve", "launch_router" or "router_launch_server"
    (sglang_router.launch_server: its engine flags are checked by the server parser, its --router-* flags are not).
    Env assignments, wrappers (nohup, exec, env, numactl, taskset, uv run, sudo) and docker run in front are
    understood the way import and lint understand them (ironserve.commandline). Raises ValueError for anything
    that is no SGLang launch.
    """
    from ironserve.commandline import parse_command

    args = shlex.split(argv) if isinstance(argv, str) else list(argv)
    command = parse_command(args)
    if command.kind == "router-server":
        return "server", command.launcher, _without_router_flags(command.flags)
    return command.kind, command.launcher, command.flags


def _without_router_flags(flags: list[str]) -> list[str]:
    out, skipping = [], False
    for arg in flags:
        if arg.startswith("--"):
            skipping = arg.startswith("--router-")
        if not skipping:
            out.append(arg)
    return out


def _router_flags(argv: list[str] | str) -> list[str]:
    """The --router-X flags of a sglang_router.launch_server command, as launch_router's --X (with values)."""
    from ironserve.commandline import parse_command

    flags = parse_command(shlex.split(argv) if isinstance(argv, str) else list(argv)).flags
    out, keep = [], False
    for arg in flags:
        if arg.startswith("--"):
            keep = arg.startswith("--router-")
            if keep:
                arg = "--" + arg[len("--router-") :]
        if keep:
            out.append(arg)
    return out


def _router_prefixed(f: Finding) -> Finding:
    def back(text: str) -> str:
        return re.sub(r"(?<![\w-])--(?!router-)([a-z0-9][a-z0-9-]*)", r"--router-\1", text)

    return Finding(f.rule, f.severity, back(f.message), back(f.fix), back(f.where))


def cached_versions() -> list[str]:
    """SGLang versions with a built parser venv, newest first."""
    versions = [
        p.name for p in parsers_dir().glob("*") if not p.name.startswith((".", "router-")) and _manifest(p).is_file()
    ]
    return sorted(versions, key=_vkey, reverse=True)


def _to_finding(d: dict, version: str, package: str) -> Finding:
    msg = d["message"]
    if d["rule"].startswith("engine-") and d["rule"] != "engine-post-init-skipped":
        msg = f"{msg} [{package} {version}]"
    return Finding(
        rule=d["rule"], severity=Severity(d["severity"]), message=msg, fix=d.get("fix", ""), where=d.get("where", "")
    )


def check_many(
    version: str, argvs: list, *, router_version: str | None = None, post_init: bool = False
) -> list[list[Finding]]:
    """Check many full engine commands in one subprocess per parser venv; one findings list per argv.

    Server commands (``python3 -m sglang.launch_server ...``, ``sglang serve ...``) are parsed by
    ``sglang==version``; router commands (``python -m sglang_router.launch_router ...``) by
    ``sglang-router==router_version`` (default DEFAULT_ROUTER_VERSION). ``post_init=True`` also runs
    ServerArgs.from_cli_args, which on a CPU-only machine stops at device detection for GPU/NPU
    commands (reported as an info finding).
    """
    results: list[list[Finding]] = [[] for _ in argvs]
    groups: dict[str, list[tuple[int, str, list[str]]]] = {"server": [], "router": []}
    for n, argv in enumerate(argvs):
        try:
            kind, launcher, flags = split_launcher(argv)
        except (ValueError, IndexError) as err:
            results[n].append(
                Finding(
                    "engine-unknown-launcher",
                    Severity.error,
                    str(err),
                    getattr(err, "fix", "")
                    or "use python3 -m sglang.launch_server, sglang serve or python3 -m sglang_router.launch_router",
                    "",
                )
            )
            continue
        groups[kind].append((n, launcher, flags))
        if launcher == "router_launch_server":  # its --router-X flags are launch_router's --X: that parser checks them
            router_flags = _router_flags(argv)
            if router_flags:
                groups["router"].append((n, "launch_router", router_flags))
    for kind, items in groups.items():
        if not items:
            continue
        v = (router_version or DEFAULT_ROUTER_VERSION) if kind == "router" else version
        package = "sglang-router" if kind == "router" else "sglang"
        path = parser_env(v, router=(kind == "router"))
        v = path.name.removeprefix("router-")
        answer = _probe_raw(
            path,
            {
                "kind": kind,
                "argvs": [f for _, _, f in items],
                "launchers": [launcher for _, launcher, _ in items],
                "post_init": post_init,
            },
            warm=True,
        )
        if not answer.get("ok"):
            raise ParserEnvError(f"{package} {v} parser probe failed:\n{answer.get('error')}")
        for (n, _launcher, _), res in zip(items, answer["results"]):
            found = [_enrich(_to_finding(d, v, package), v, kind) for d in res["findings"]]
            if kind == "router" and split_launcher(argvs[n])[1] == "router_launch_server":
                found = [_router_prefixed(f) for f in found]
            results[n] += found
    return results


def check_server_argv(version: str, argv, *, post_init: bool = False) -> list[Finding]:
    """Findings for one server command parsed by sglang==version's own parser."""
    return check_many(version, [argv], post_init=post_init)[0]


def check_router_argv(version: str, argv) -> list[Finding]:
    """Findings for one ``python -m sglang_router.launch_router`` command, sglang-router==version."""
    kind, _, _ = split_launcher(argv)
    if kind != "router":
        raise ValueError("check_router_argv wants a sglang_router.launch_router command")
    return check_many(DEFAULT_ROUTER_VERSION, [argv], router_version=version)[0]


def _enrich(f: Finding, version: str, kind: str) -> Finding:
    """Unknown flag / ambiguous abbreviation: say which other cached versions accept the spelling and
    what a deprecation note names as its replacement (no builds are triggered for this)."""
    if (
        kind != "server"
        or not f.where
        or not (
            f.rule == "engine-unknown-flag" or (f.rule == "engine-abbreviated-flag" and f.severity is Severity.error)
        )
    ):
        return f
    have = sorted((v for v, flags in _cached_flag_tables().items() if v != version and f.where in flags), key=_vkey)
    if not have:
        return f
    message, fix = f.message, f.fix
    span = have[0] if len(have) == 1 else f"{have[0]} .. {have[-1]}"
    message += f" (a full flag in cached sglang {span}"
    if _vkey(have[-1]) < _vkey(version):
        message += f"; dropped by {version}"
    message += ")"
    hint = replacement_hint(f.where, version)
    if hint:
        fix = f"use {hint} (named by the flag's deprecation note); " + fix
    return Finding(f.rule, f.severity, message, fix, f.where)


# Newest stable sglang on PyPI at the end of each month (from `uv pip install --dry-run --exclude-newer`).
# Nightly/dev images of a month run code at or ahead of that release; its parser is the nearest
# PyPI stand-in, not an exact one.
RELEASE_AT_MONTH_END = {
    "2026-01": "0.5.8",
    "2026-02": "0.5.9",
    "2026-03": "0.5.9",
    "2026-04": "0.5.10.post1",
    "2026-05": "0.5.12.post1",
    "2026-06": "0.5.14",
    "2026-07": "0.5.16",
    "2026-08": "0.5.18",
    "2026-09": "0.5.20",
    "2026-10": "0.5.23",
}


def release_for_era(engine: str) -> str | None:
    """'dev-cu13-2026-03' / 'npu-a3-2026-04' -> the newest PyPI release of that month, else None."""
    m = re.search(r"(20\d\d)-(\d\d)", engine)
    return RELEASE_AT_MONTH_END.get(f"{m.group(1)}-{m.group(2)}") if m else None


# --------------------------------------------------------------------------------------------
# flag tables
# --------------------------------------------------------------------------------------------


def _vkey(v: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(v)
    except InvalidVersion:
        return Version("0")


_FLAG_IN_TEXT = re.compile(r"--[a-z0-9][a-z0-9-]*[a-z0-9]")


def replacement_hint(flag: str, new_version: str | None = None) -> str | None:
    """The replacement a deprecation note names for ``flag`` in any cached version's parser, if any.

    E.g. 0.5.15-0.5.19 register ``--cuda-graph-max-bs`` as "Deprecated alias for
    --cuda-graph-max-bs-decode"; 0.5.23 drops it. With ``new_version`` the replacement must exist there.
    """
    new = flag_table(new_version) if new_version else None
    notes = [
        (table.get(flag) or {}).get("deprecated") or ""
        for _, table in sorted(_cached_flag_tables().items(), key=lambda kv: _vkey(kv[0]), reverse=True)
    ]
    if flag in KNOWN_RENAMES:
        notes.append(KNOWN_RENAMES[flag])
    for note in notes:
        for cand in _FLAG_IN_TEXT.findall(note):
            if cand != flag and (new is None or cand in new):
                return cand
    return None


# Deprecation notes of 0.5.12-0.5.19 for seed-era flags that 0.5.23 no longer registers, verbatim, so
# that hints do not depend on which versions happen to be cached (replacement_hint reads both).
KNOWN_RENAMES = {
    "--cuda-graph-max-bs": "Deprecated alias for --cuda-graph-max-bs-decode. (0.5.15-0.5.19)",
    "--cuda-graph-bs": "Deprecated alias for --cuda-graph-bs-decode. (0.5.15-0.5.19)",
    "--mamba-scheduler-strategy": "Deprecated alias for --mamba-radix-cache-strategy. (0.5.15-0.5.19)",
    "--enable-nsa-prefill-context-parallel": "[Deprecated] Use --enable-prefill-cp instead. (0.5.15-0.5.19)",
    "--nsa-prefill-cp-mode": "[Deprecated] Use --cp-strategy {zigzag,interleave} instead. 'in-seq-split' "
    "maps to 'zigzag'; 'round-robin-split' maps to 'interleave'. (0.5.15-0.5.19)",
    "--nsa-decode-backend": "[Deprecated] Use --dsa-decode-backend instead. (0.5.15-0.5.19)",
    "--nsa-prefill-backend": "[Deprecated] Use --dsa-prefill-backend instead. (0.5.15-0.5.19)",
    "--prefill-round-robin-balance": "Note: --prefill-round-robin-balance is deprecated now. (0.5.9-0.5.19; "
    "no replacement)",
    "--hybrid-kvcache-ratio": "Please use --swa-full-tokens-ratio instead. (0.5.12)",
    "--stream-output": "[Deprecated] Use --incremental-streaming-output instead. (0.5.12)",
    "--piecewise-cuda-graph-max-tokens": "Deprecated alias for --cuda-graph-max-bs-prefill. (0.5.15)",
    "--piecewise-cuda-graph-tokens": "Deprecated alias for --cuda-graph-bs-prefill. (0.5.15)",
    "--enable-expert-distribution-metrics": "Removed. Use --expert-balancedness-report-mode. (0.5.19)",
    "--keep-mm-feature-on-device": "Deprecated. Use --mm-feature-transport=cuda_ipc. (0.5.19)",
}


def _cached_flag_tables() -> dict[str, dict]:
    out = {}
    for p in parsers_dir().glob("*/flags.json"):
        if p.parent.name.startswith("router-") or not _manifest(p.parent).is_file():
            continue
        out[p.parent.name] = _load_flags(str(p), p.stat().st_mtime)
    return out


@lru_cache(maxsize=64)
def _load_flags(path: str, _mtime: float) -> dict:
    return json.loads(Path(path).read_text())


def flag_table(version: str, *, router: bool = False) -> dict[str, dict]:
    """{option string: {dest, aliases, choices, nargs, takes_value, deprecated, help}} (cached JSON)."""
    path = parser_env(version, router=router) / "flags.json"
    return _load_flags(str(path), path.stat().st_mtime)


def known_flags(version: str, *, router: bool = False) -> set[str]:
    """Every option string the version's parser registers (aliases included)."""
    return set(flag_table(version, router=router))


CHOICE_FLAGS = (
    "--tool-call-parser",
    "--reasoning-parser",
    "--attention-backend",
    "--moe-runner-backend",
    "--fp4-gemm-backend",
    "--fp8-gemm-backend",
    "--quantization",
    "--device",
    "--moe-a2a-backend",
    "--deepep-mode",
    "--disaggregation-transfer-backend",
    "--load-balance-method",
    "--speculative-algorithm",
    "--kv-cache-dtype",
    "--mamba-scheduler-strategy",
    "--nsa-prefill-cp-mode",
    "--sampling-backend",
    "--speculative-draft-model-quantization",
)


def flag_changes(old_version: str, new_version: str, *, router: bool = False) -> dict:
    """What changed between two versions' parsers.

    {"old": v1, "new": v2,
     "removed": {flag: replacement-or-None}, "added": [flags],
     "replacement_basis": {flag: "same-dest" | "deprecation-note" | "similar-name"},
     "choices": {flag: {"removed": [...], "added": [...]}},   # for every flag with choices in both
     "now_deprecated": {flag: note}}
    The replacement is a same-dest alias in the new version, else the flag a deprecation note in any
    cached version names (see replacement_hint), else the closest new flag by name. Versions in
    between are not built for this; build them (parser_env) to get their deprecation notes.
    """
    old, new = flag_table(old_version, router=router), flag_table(new_version, router=router)
    new_by_dest: dict[str, list[str]] = {}
    for opt, e in new.items():
        new_by_dest.setdefault(e["dest"], []).append(opt)
    added_set = sorted(set(new) - set(old))
    removed, basis = {}, {}
    for opt in sorted(set(old) - set(new)):
        same = [o for o in new_by_dest.get(old[opt]["dest"], []) if o.startswith("--")]
        hint = replacement_hint(opt, new_version)
        close = difflib.get_close_matches(opt, added_set or list(new), n=1, cutoff=0.85)
        if same:
            removed[opt], basis[opt] = max(same, key=len), "same-dest"
        elif hint:
            removed[opt], basis[opt] = hint, "deprecation-note"
        elif close:
            removed[opt], basis[opt] = close[0], "similar-name"
        else:
            removed[opt] = None
    choices = {}
    for opt in sorted(set(old) & set(new)):
        a, b = old[opt].get("choices"), new[opt].get("choices")
        if a is None and b is None:
            continue
        if b is None:  # the new parser takes any string (validated later, if at all)
            choices[opt] = {"removed": [], "added": [], "unrestricted": True}
            continue
        a, b = set(a or []), set(b)
        if a != b:
            choices[opt] = {"removed": sorted(a - b), "added": sorted(b - a)}
    deprecated = {
        o: new[o]["deprecated"]
        for o in set(old) & set(new)
        if new[o].get("deprecated") and not old[o].get("deprecated")
    }
    return {
        "old": normalize_version(old_version),
        "new": normalize_version(new_version),
        "removed": removed,
        "replacement_basis": basis,
        "added": added_set,
        "choices": choices,
        "now_deprecated": dict(sorted(deprecated.items())),
    }


def env_info(version: str, *, router: bool = False) -> dict:
    """The build manifest of a parser venv (packages, build time, shims)."""
    return json.loads(_manifest(parser_env(version, router=router)).read_text())


__all__ = [
    "cached_versions",
    "DEFAULT_ROUTER_VERSION",
    "EngineNotAvailable",
    "ParserEnvError",
    "check_many",
    "check_router_argv",
    "check_server_argv",
    "env_info",
    "flag_changes",
    "flag_table",
    "KNOWN_RENAMES",
    "known_flags",
    "normalize_version",
    "parser_env",
    "release_for_era",
    "replacement_hint",
    "router_env",
    "split_launcher",
]
