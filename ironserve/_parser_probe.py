"""Probe run INSIDE an ironserve parser venv (sglang or sglang-router installed there).

It is executed as a script by that venv's interpreter (``python -I -W ignore _parser_probe.py``):
a JSON request on stdin, one JSON answer on stdout. It must not import ironserve (the package is
not installed in the venv) and it must work across SGLang versions, so it only relies on APIs that
every 0.5.x release has: ``ServerArgs.add_cli_args(parser)`` / ``ServerArgs.from_cli_args(ns)`` and,
for the router, ``RouterArgs.add_cli_args(parser, use_router_prefix=False)`` /
``RouterArgs.from_cli_args(ns, use_router_prefix=False)``.

Request::

    {"kind": "server" | "router",
     "argvs": [[...flags without launcher...], ...],
     "launchers": ["launch_server" | "serve" | "launch_router", ...],   # optional, per argv
     "post_init": false,          # also run from_cli_args for the server (see _post_init)
     "dump_flags": false}         # also return every option string with its choices

Answer::

    {"ok": true, "package": "sglang", "version": "0.5.9", "import_s": 12.3,
     "results": [{"findings": [{rule, severity, message, fix, where}, ...]}, ...],
     "flags": {...}}                                            # when dump_flags
    {"ok": false, "missing_module": "zmq", "error": "..."}      # import chain incomplete

The parser is the version's own, with ``allow_abbrev=False`` (recursively on subparsers) so that a
prefix such as ``--tp`` is not silently expanded; abbreviations are then reported as findings naming
the full flag (argparse's ``allow_abbrev`` makes a prefix that is unique *today* ambiguous or wrong
once a flag with the same prefix is added).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import sys
import time
import traceback

_REAL_STDOUT = sys.stdout
ANSWER = "IRONSERVE-PROBE-ANSWER "  # --serve: marks the answer lines (ironserve/parser_probes.py reads them)


class _ParseError(Exception):
    """argparse.error() turned into an exception (argparse would print usage and exit(2))."""


class _ProbeParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        kwargs["exit_on_error"] = False
        kwargs.setdefault("add_help", True)
        super().__init__(*args, **kwargs)

    def error(self, message):  # noqa: D401 - argparse API
        raise _ParseError(message)

    def exit(self, status=0, message=None):
        raise _ParseError(message or f"exit({status})")


def _disable_abbrev(parser: argparse.ArgumentParser) -> None:
    """allow_abbrev=False and exit_on_error=False on the parser and every subparser."""
    parser.allow_abbrev = False
    parser.exit_on_error = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _disable_abbrev(sub)


def _finding(rule, severity, message, fix="", where=""):
    return {"rule": rule, "severity": severity, "message": message, "fix": fix, "where": where}


def _choices_list(choices):
    if choices is None:
        return None
    try:
        items = list(choices)
    except TypeError:
        return None
    out = [str(getattr(c, "value", c)) for c in items]
    return out if isinstance(choices, (list, tuple)) else sorted(out)


def _is_value_token(tok: str) -> bool:
    if not tok.startswith("-") or tok == "-":
        return True
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _drop_option(argv: list[str], index: int) -> list[str]:
    """argv without the option at ``index`` and the values that follow it."""
    end = index + 1
    if "=" not in argv[index]:
        while end < len(argv) and _is_value_token(argv[end]):
            end += 1
    return argv[:index] + argv[end:]


def _find_option(argv: list[str], option_strings) -> int | None:
    for i, tok in enumerate(argv):
        if tok.split("=", 1)[0] in option_strings:
            return i
    return None


def _locate(argv: list[str], tok: str, opts) -> int:
    """Index of the unconsumed ``tok`` (skip copies that are the value of a known option)."""
    hits = [i for i, t in enumerate(argv) if t == tok]
    for i in hits:
        prev = opts.get(argv[i - 1].split("=", 1)[0]) if i else None
        if prev is None or prev.nargs == 0 or "=" in argv[i - 1]:
            return i
    return hits[0]


def _deprecation(action) -> str | None:
    cls = type(action).__name__
    text = (action.help or "").strip()
    if "deprecat" in cls.lower() or text.lower().startswith(("deprecated", "(deprecated")):
        new = getattr(action, "new_flag", None)
        return text + (f" (use {new})" if new and str(new) not in text else "")
    return None


def check_argv(parser: argparse.ArgumentParser, argv: list[str], kind: str):
    """Parse ``argv`` with ``parser`` (abbreviations off); return (findings, namespace or None).

    argparse stops at the first problem, so each one is reported and taken out of argv (an abbreviation spelled
    out, an unknown flag or a bad value dropped with its values) and the rest parsed again: one run names every
    problem of the command. The namespace is what is left parsed; None where the parse could not go on."""
    findings = []
    opts = parser._option_string_actions
    long_opts = sorted(o for o in opts if o.startswith("--"))
    argv = list(argv)
    seen_errors = set()
    namespace = None
    for _ in range(200):
        try:
            namespace, extras = parser.parse_known_args(argv)
        except (argparse.ArgumentError, _ParseError) as err:
            namespace = None
            argv = _after_parse_error(err, argv, opts, kind, findings, seen_errors)
            if argv is None:
                break
            continue
        if not extras:
            break
        argv = _after_unknown_token(extras[0], argv, opts, long_opts, findings)
        namespace = None
    if namespace is not None:
        findings += _deprecated_spellings(argv, opts)
    return findings, namespace


def _after_parse_error(err, argv: list[str], opts, kind: str, findings: list, seen_errors: set) -> list[str] | None:
    """The error argparse raised, as a finding; argv without the option it names, to parse again, or None to stop
    (it names no option, or the same error came back)."""
    msg = str(err.message if isinstance(err, argparse.ArgumentError) else err)
    action = _failed_action(err, opts)
    if action is None:
        findings.append(_unnamed_error(msg, kind))
        return None
    idx = _find_option(argv, action.option_strings)
    flag = argv[idx].split("=", 1)[0] if idx is not None else action.option_strings[-1]
    findings.append(_bad_value(action, flag, msg))
    if idx is None or (flag, msg) in seen_errors:
        return None
    seen_errors.add((flag, msg))
    return _drop_option(argv, idx)


def _failed_action(err, opts):
    """The option an argparse error names, None when it names none (a missing required flag, ...)."""
    if isinstance(err, argparse.ArgumentError) and err.argument_name:
        for name in err.argument_name.split("/"):
            if name in opts:
                return opts[name]
    return None


def _unnamed_error(msg: str, kind: str) -> dict:
    if "required" in msg:  # e.g. "the following arguments are required: --model-path"
        missing = msg.split(":", 1)[-1].strip()
        return _finding("engine-missing-required", "error", f"{msg} ({kind} parser)", f"add {missing}", missing)
    return _finding("engine-bad-value", "error", msg)


def _bad_value(action, flag: str, msg: str) -> dict:
    """A value the option refuses: a choice it does not offer (with the near ones), or one it cannot convert."""
    if "invalid choice" in msg:
        choices = _choices_list(action.choices) or []
        bad = msg.split("invalid choice:", 1)[1].split("(choose", 1)[0].strip().strip("'\"")
        close = difflib.get_close_matches(bad, choices, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        fix = f"{hint}valid choices: {', '.join(choices)}"
        return _finding("engine-bad-choice", "error", f"{flag} {bad!r} is not a valid choice", fix, flag)
    expects = f" (expects {action.metavar or action.dest}, nargs={action.nargs})" if action.nargs is not None else ""
    return _finding("engine-bad-value", "error", f"{flag}: {msg}", f"check the value given to {flag}{expects}", flag)


def _after_unknown_token(tok: str, argv: list[str], opts, long_opts: list[str], findings: list) -> list[str]:
    """The first token the parser did not know, as a finding; argv to parse again: a stray value or unknown flag
    dropped, a unique abbreviation spelled out (it works today, so the rest is still checked)."""
    idx = _locate(argv, tok, opts)
    if _is_value_token(tok):
        findings.append(
            _finding(
                "engine-bad-value",
                "error",
                f"unexpected positional argument {tok!r}",
                "remove it or put it after the flag it belongs to",
                tok,
            )
        )
        return argv[:idx] + argv[idx + 1 :]
    name, eq, value = tok.partition("=")
    prefixed = [o for o in long_opts if o.startswith(name)] if name.startswith("--") else []
    if len(prefixed) == 1:
        full = prefixed[0]
        findings.append(
            _finding(
                "engine-abbreviated-flag",
                "warning",
                f"{name} is an abbreviation of {full}; it only works because argparse expands "
                "unique prefixes (allow_abbrev) and breaks when a flag with the same prefix is added",
                f"write {full} in full",
                name,
            )
        )
        return argv[:idx] + [full + eq + value] + argv[idx + 1 :]
    findings.append(_ambiguous_flag(name, prefixed) if prefixed else _unknown_flag(name, long_opts))
    return _drop_option(argv, idx)


def _ambiguous_flag(name: str, prefixed: list[str]) -> dict:
    return _finding(
        "engine-abbreviated-flag",
        "error",
        f"{name} is an ambiguous abbreviation (could be {', '.join(prefixed[:6])}"
        + (", ..." if len(prefixed) > 6 else "")
        + "); the server refuses to start",
        f"write the full flag, e.g. {difflib.get_close_matches(name, prefixed, n=1, cutoff=0)[0]}",
        name,
    )


def _unknown_flag(name: str, long_opts: list[str]) -> dict:
    close = difflib.get_close_matches(name, long_opts, n=3, cutoff=0.6)
    fix = (
        (f"did you mean {close[0]}?" + (f" (or {', '.join(close[1:])})" if close[1:] else ""))
        if close
        else "remove it; this version's parser has no such option"
    )
    return _finding("engine-unknown-flag", "error", f"unknown flag {name}", fix, name)


def _deprecated_spellings(argv: list[str], opts) -> list[dict]:
    """Deprecated spellings in a command that parsed (0.5.2x registers them with Deprecated*Action classes)."""
    out = []
    for tok in argv:
        flag = tok.split("=", 1)[0]
        action = opts.get(flag)
        note = _deprecation(action) if action is not None else None
        if note:
            out.append(
                _finding("engine-deprecated-flag", "warning", f"{flag}: {note}", "use the replacement flag", flag)
            )
    return out


def _post_init(args_cls, namespace, **kw):
    """Run the dataclass post-init (validation + derived defaults), stdout/stderr captured.

    ServerArgs.__post_init__ detects the accelerator (get_device(): no CUDA/NPU here -> RuntimeError),
    queries GPU memory and reads the model's HF config, so on this CPU-only machine it cannot run
    for a GPU/NPU command; callers get an info finding saying so instead of a false error.
    RouterArgs.from_cli_args + _validate_router_args need no device and always run.
    """
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        obj = args_cls.from_cli_args(namespace, **kw)
        validate = getattr(obj, "_validate_router_args", None)
        if validate is not None:
            validate()
    return obj


_ENV_ERRORS = (
    "accelerator",
    "cuda",
    "npu",
    "gpu",
    "device",
    "nvidia",
    "torch_npu",
    "huggingface",
    "config.json",
    "no such file",
    "repo",
    "connection",
    "offline",
)


def _server_parser():
    from sglang.srt.server_args import ServerArgs

    parser = _ProbeParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    _disable_abbrev(parser)
    return parser, ServerArgs


def _router_parser():
    from sglang_router.router_args import RouterArgs

    parser = _ProbeParser(prog="sglang_router.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    _disable_abbrev(parser)
    return parser, RouterArgs


def _serve_prepare(argv: list[str], findings: list) -> list[str]:
    """What ``sglang serve`` does to argv before prepare_server_args (version-specific helpers)."""
    try:
        from sglang.cli import serve as serve_mod
    except Exception:  # noqa: BLE001 - old versions have no `sglang serve`
        findings.append(
            _finding(
                "engine-unknown-launcher",
                "error",
                "this sglang version has no `sglang serve` command",
                "use python3 -m sglang.launch_server",
                "sglang serve",
            )
        )
        return argv
    out = []
    i = 0
    while i < len(argv):  # --model-type is consumed by the serve dispatcher, not ServerArgs
        if argv[i] == "--model-type" and i + 1 < len(argv):
            if argv[i + 1] == "diffusion":
                findings.append(
                    _finding(
                        "engine-not-checked", "info", "diffusion serve arguments are not checked", "", "--model-type"
                    )
                )
            i += 2
            continue
        if argv[i].startswith("--model-type="):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    norm = getattr(serve_mod, "_normalize_positional_model_path", None)
    if norm is not None:
        out = list(norm(out)[0])
    return out


def dump_flags(parser) -> dict:
    options = {}
    for action in parser._actions:
        if not action.option_strings:
            continue
        entry = {
            "dest": action.dest,
            "aliases": list(action.option_strings),
            "choices": _choices_list(action.choices),
            "nargs": action.nargs if isinstance(action.nargs, (int, str, type(None))) else str(action.nargs),
            "takes_value": action.nargs != 0,
            "deprecated": _deprecation(action),
            "help": (action.help or "")[:300] if action.help != argparse.SUPPRESS else "",
        }
        for opt in action.option_strings:
            options[opt] = entry
    return options


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def main(argv: list[str]) -> int:
    sys.stdout = sys.stderr  # imports print banners; only the answer goes to the real stdout
    os.environ.setdefault("SGLANG_IS_IN_CI", "false")
    if argv[1:] == ["--serve"]:
        return serve(sys.stdin)
    answer, rc = respond(json.loads(sys.stdin.read() or "{}"))
    _answer(answer)
    return rc


def serve(requests) -> int:
    """One answer line (marked ANSWER) per request line, until the input ends or an import fails: the import is
    paid once (ironserve/parser_probes.py keeps this process for its caller's life)."""
    for line in requests:
        answer, rc = respond(json.loads(line))
        _answer(answer, ANSWER)
        if rc:
            return rc
    return 0


def respond(request: dict) -> tuple[dict, int]:
    """The answer to one request, and the exit status a one-shot probe ends with."""
    kind = request.get("kind", "server")
    t0 = time.time()
    try:
        parser, args_cls = _router_parser() if kind == "router" else _server_parser()
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        return {"ok": False, "missing_module": missing, "error": traceback.format_exc()[-4000:]}, 3
    except Exception:  # noqa: BLE001
        return {"ok": False, "missing_module": None, "error": traceback.format_exc()[-4000:]}, 4
    import_s = time.time() - t0
    dist = "sglang-router" if kind == "router" else "sglang"
    answer = {
        "ok": True,
        "package": dist,
        "version": _version(dist),
        "import_s": round(import_s, 2),
        "python": sys.version.split()[0],
        "results": [],
    }
    launchers = request.get("launchers") or []
    post_init = kind == "router" or bool(request.get("post_init"))
    for n, argv in enumerate(request.get("argvs", [])):
        launcher = launchers[n] if n < len(launchers) else None
        answer["results"].append(_check_command(parser, args_cls, kind, list(argv), launcher, post_init))
    if request.get("dump_flags"):
        answer["flags"] = dump_flags(parser)
    return answer, 0


def _check_command(parser, args_cls, kind: str, argv: list[str], launcher: str | None, post_init: bool) -> dict:
    """One command's result: the parser's findings, then (when asked, and the command parsed) the post-init's."""
    t1 = time.time()
    findings = []
    if launcher == "serve":
        argv = _serve_prepare(argv, findings)
    more, namespace = check_argv(parser, list(argv), kind)
    findings += more
    post = None
    if namespace is not None and post_init:
        post, finding = _post_init_result(args_cls, namespace, kind)
        findings += [finding] if finding else []
    return {"findings": findings, "post_init": post, "seconds": round(time.time() - t1, 3)}


def _post_init_result(args_cls, namespace, kind: str) -> tuple[str, dict | None]:
    """("ok" | "skipped" | "failed", its finding or None)."""
    kw = {"use_router_prefix": False} if kind == "router" else {}
    try:
        _post_init(args_cls, namespace, **kw)
        return "ok", None
    except Exception as err:  # noqa: BLE001
        return _post_init_failure(err, args_cls, kind)


def _post_init_failure(err: Exception, args_cls, kind: str) -> tuple[str, dict]:
    """The server's post-init needs the target hardware and model: failing for want of them here is no verdict on
    the command (skipped, said as info); any other failure is the command's (failed, an error)."""
    text = f"{type(err).__name__}: {err}".strip()
    env_problem = isinstance(err, (ImportError, OSError, RuntimeError)) or any(k in text.lower() for k in _ENV_ERRORS)
    if kind != "router" and env_problem:
        message = f"{args_cls.__name__}.from_cli_args needs the target hardware/model here: {text[:300]}"
        return "skipped", _finding("engine-post-init-skipped", "info", message, "", "")
    message = f"{args_cls.__name__} rejects this combination: {text[:500]}"
    return "failed", _finding("engine-bad-value", "error", message, "fix the values named in the message", "")


def _answer(obj, mark: str = "") -> None:
    _REAL_STDOUT.write(mark + json.dumps(obj) + "\n")
    _REAL_STDOUT.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
