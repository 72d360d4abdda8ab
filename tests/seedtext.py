"""Extract the commands of a seed field guide, as text a person would copy, for faithfulness tests.

The seeds are web pages flattened to text: commands are sometimes glued to the prose around them
("--sleep-on-idleFastest reported config"), so the extraction un-glues those first.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
_ALT_SEEDS = Path(__file__).resolve().parents[1].parent / "shared" / "seeds"


def seed_path(name: str) -> Path:
    # IRONSERVE_SEEDS: the seeds' folder for a checkout that does not sit next to shared/ (a git worktree)
    override = [Path(os.environ["IRONSERVE_SEEDS"])] if os.environ.get("IRONSERVE_SEEDS") else []
    for base in (*override, SEEDS, _ALT_SEEDS, Path("../shared/seeds").resolve()):
        if (base / name).exists():
            return base / name
    raise FileNotFoundError(f"seed {name} not found next to the repository (../shared/seeds)")


@dataclass
class SeedCommand:
    kind: str  # server | prefill | decode | router | bench
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class SeedSection:
    commands: list[SeedCommand]
    unset: list[str] = field(default_factory=list)
    sourced: list[str] = field(default_factory=list)

    def of(self, kind: str) -> list[SeedCommand]:
        return [c for c in self.commands if c.kind == kind]


_COMMAND_START = re.compile(r"^(uv run )?(python3?|sglang) ")
_ENV_PREFIX = re.compile(r"^([A-Z_][A-Z0-9_]*)=(\S*)\s*\\?$")
# 'NCCL_P2P_LEVEL=4 python -m sglang.launch_server \': env assignments on the command's own line
_INLINE_ENV = re.compile(r"^((?:[A-Z_][A-Z0-9_]*=\S*\s+)+)(?=(uv run )?(python3?|sglang) )")


def _unglue(text: str) -> str:
    text = re.sub(r"(?<=[^\s])(python3? -m sglang)", r"\n\1", text)
    # '--flagProse...' / '--flagEAGLE3 ...' at the end of a command: split the flag from the sentence glued to it
    text = re.sub(r"(--[a-z0-9-]+?[a-z0-9])([A-Z][A-Za-z0-9])", r"\1\n\2", text)
    text = re.sub(r"(--[a-z0-9-]+ [0-9]+)([A-Z][A-Za-z])", r"\1\n\2", text)
    # '--flag# comment' (seed 000: "--sleep-on-idle# Environment variable (MANDATORY):")
    text = re.sub(r"(--[a-z0-9-]*[a-z0-9])(#)", r"\1\n\2", text)
    return text


def _collect_command(lines: list[str], start: int) -> tuple[list[str], int]:
    parts, i = [], start
    while i < len(lines):
        line = lines[i].rstrip()
        if line.endswith("\\"):
            parts.append(line[:-1])
            i += 1
            continue
        parts.append(line)
        break
    return shlex.split(" ".join(parts)), i + 1


def _unquote(value: str) -> str:
    return shlex.split(value)[0] if value else value


def extract(seed: str, anchor: str, end_markers: tuple[str, ...] = ("GLM-5.1 W4A8 ",)) -> SeedSection:
    """Commands after `anchor`: the first command for single-command guides, or a whole PD section."""
    text = _unglue(seed_path(seed).read_text(errors="replace"))
    at = text.find(anchor)
    if at < 0:
        raise ValueError(f"anchor {anchor!r} not in {seed}")
    body = text[at + len(anchor) :]
    ends = [body.find(m) for m in end_markers if body.find(m) > 0]
    # Seed 004 writes whole sections (exports, per-role loops, router, benchmark); the others one command each.
    multi = seed.startswith("004")
    if ends:
        body = body[: min(ends)]
    lines = body.splitlines()
    section = SeedSection(commands=[])
    common: dict[str, str] = {}
    block_env: dict[str, str] = {}
    prefix_env: dict[str, str] = {}
    kind = "server"
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        inline = _INLINE_ENV.match(line)
        if inline:
            for assignment in inline.group(1).split():
                name, _, value = assignment.partition("=")
                prefix_env[name] = value
            line = lines[i] = line[inline.end() :]
        if line.startswith("# prefill"):
            kind, block_env = "prefill", {}
        elif line.startswith("# decode"):
            kind, block_env = "decode", {}
        elif line.startswith("unset "):
            section.unset.append(line.split()[1])
        elif line.startswith("source "):
            section.sourced.append(line.split()[1])
        elif line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            (block_env if kind in ("prefill", "decode") else common)[name] = _unquote(value)
        # Shell variables, not env prefixes: seed 004 sets NODE_RANK=$i after each launch, which must not
        # leak into the next role's command.
        elif _ENV_PREFIX.match(line) and not line.startswith(("MODEL_PATH=", "P_IP=", "D_IP=", "NODE_RANK=")):
            m = _ENV_PREFIX.match(line)
            prefix_env[m.group(1)] = m.group(2)
        elif _COMMAND_START.match(line):
            argv, i = _collect_command(lines, i)
            if "sglang_router" in " ".join(argv[:4]):
                cmd_kind = "router"
            elif "bench_serving" in " ".join(argv[:4]):
                cmd_kind = "bench"
            else:
                cmd_kind = kind
            env = {**common, **block_env, **prefix_env} if cmd_kind not in ("router", "bench") else {}
            section.commands.append(SeedCommand(cmd_kind, argv, env))
            prefix_env = {}
            if not multi:
                break
            continue
        i += 1
    return section
