"""Flag spelling: the full names ironserve emits, and the short spellings the field guides use.

SGLang's argparse accepts any unique prefix (``--tp`` for ``--tp-size``). Prefixes break the day a new flag
shares them, so ironserve always emits and stores full names; this table turns the guides' spellings into
them, offline. The real-parser check (engine_parser) confirms them per SGLang version.
"""

from __future__ import annotations

# spelling in the wild -> the full name ironserve emits
CANONICAL = {
    "--tp": "--tp-size",
    "--tensor-parallel-size": "--tp-size",
    "--pp": "--pp-size",
    "--pipeline-parallel-size": "--pp-size",
    "--dp": "--dp-size",
    "--data-parallel-size": "--dp-size",
    "--ep": "--ep-size",
    "--expert-parallel-size": "--ep-size",
    "--model": "--model-path",
    "--speculative-algo": "--speculative-algorithm",
    "--moe-dense-tp": "--moe-dense-tp-size",
    "--trust-remote": "--trust-remote-code",
    "--nccl-init-addr": "--dist-init-addr",  # the 2024 name, still a registered alias (docs/engine-flags.md)
    "--disable-overlap": "--disable-overlap-schedule",
    "--disable-radix": "--disable-radix-cache",
}

# Spellings that are prefixes accepted only through argparse's allow_abbrev (not registered names); checked
# with every SGLang parser 0.5.9 .. 0.5.23 (docs/engine-flags.md). --model and --ep are registered aliases.
ABBREVIATIONS = {
    "--tp",
    "--dp",
    "--speculative-algo",
    "--moe-dense-tp",
    "--trust-remote",
    "--disable-overlap",
    "--disable-radix",
}
# Prefixes several flags share: argparse refuses them, so the server does not start.
AMBIGUOUS = {"--pp"}


def canonical(flag: str) -> str:
    return CANONICAL.get(flag, flag)


def split_flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    """argv (without the launcher) as (flag, values) pairs; '--a=b' is split; values keep their order."""
    pairs: list[tuple[str, list[str]]] = []
    for arg in argv:
        if arg.startswith("--"):
            if "=" in arg:
                name, value = arg.split("=", 1)
                pairs.append((name, [value]))
            else:
                pairs.append((arg, []))
        elif pairs:
            pairs[-1][1].append(arg)
        else:
            pairs.append(("", [arg]))
    return pairs


def launcher_split(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split 'python3 -m sglang.launch_server --a b' into (launcher, flags). Understands 'uv run' and 'sglang serve'."""
    i = 0
    if argv[:2] == ["uv", "run"]:
        i = 2
    rest = argv[i:]
    for n, arg in enumerate(rest):
        if arg.startswith("--"):
            return rest[:n], rest[n:]
    return rest, []
