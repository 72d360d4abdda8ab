"""Flags that came and went between SGLang releases: which releases register each, and what took its place.

Read from the releases' own parser definitions (server_args.py / arg_groups of the PyPI wheels 0.4.6.post5 ..
0.5.23; docs/engine-flags.md has the real-parser tables for 0.5.9 .. 0.5.23). Import uses it, offline, to choose the
release a pasted command was written for (the newest one whose parser takes every flag, when no cached parser
answers) and to name each renamed flag's successor. Pure data: no engine, no venv.
"""

from __future__ import annotations

from dataclasses import dataclass

from .flags import canonical, split_flags

# PyPI releases ironserve knows, oldest first: the 0.4 line's last, the 0.5 releases the field guides' months map to
RELEASES = (
    "0.4.6.post5",
    "0.4.10.post2",
    "0.5.2",
    "0.5.3",
    "0.5.4",
    "0.5.5",
    "0.5.8",
    "0.5.9",
    "0.5.10.post1",
    "0.5.12.post1",
    "0.5.14",
    "0.5.16",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.23",
)


def _version(release: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(release)
    except InvalidVersion:  # an image tag, not a release: newer than any ironserve knows
        return Version("9999")


@dataclass(frozen=True)
class Span:
    """The releases that register a flag (None: from before / until after the releases ironserve knows)."""

    first: str | None
    last: str | None
    successor: str = ""  # what later releases take instead ("" where none)

    def holds(self, release: str) -> bool:
        v = _version(release)
        return (self.first is None or _version(self.first) <= v) and (self.last is None or v <= _version(self.last))

    def text(self) -> str:
        if self.first and self.last:
            return f"{self.first} .. {self.last}"
        return f"up to {self.last}" if self.last else f"from {self.first}"


SPANS = {
    # 0.4.x MoE switches, deprecated in 0.4.10 and gone in 0.5.3 (their deprecation notes name the successor)
    "--enable-deepep-moe": Span(None, "0.5.2", "--moe-a2a-backend deepep"),
    "--enable-ep-moe": Span(None, "0.5.2", "--ep-size N (the --tp-size value)"),
    "--enable-flashinfer-cutlass-moe": Span("0.4.10.post2", "0.5.2", "--moe-runner-backend flashinfer_cutlass"),
    "--enable-flashinfer-trtllm-moe": Span("0.4.10.post2", "0.5.2", "--moe-runner-backend flashinfer_trtllm"),
    "--enable-triton-kernel-moe": Span("0.4.10.post2", "0.5.2", "--moe-runner-backend triton_kernel"),
    "--moe-a2a-backend": Span("0.4.10.post2", None),
    "--moe-runner-backend": Span("0.5.2", None),
    # n-gram speculative decoding: 0.5.10 replaced the match-window bounds by the trie's depth
    "--speculative-ngram-max-match-window-size": Span("0.5.3", "0.5.9", "--speculative-ngram-max-trie-depth"),
    "--speculative-ngram-min-match-window-size": Span("0.5.3", "0.5.9"),
    "--speculative-ngram-max-trie-depth": Span("0.5.10.post1", None),
    # split into decode/prefill variants in 0.5.14; deprecated aliases until 0.5.19, ambiguous prefixes in 0.5.23
    "--cuda-graph-max-bs": Span(None, "0.5.19", "--cuda-graph-max-bs-decode (and --cuda-graph-max-bs-prefill)"),
    "--cuda-graph-bs": Span(None, "0.5.19", "--cuda-graph-bs-decode (and --cuda-graph-bs-prefill)"),
    "--cuda-graph-max-bs-decode": Span("0.5.14", None),
    "--cuda-graph-bs-decode": Span("0.5.14", None),
    "--mamba-scheduler-strategy": Span("0.5.7", "0.5.19", "--mamba-radix-cache-strategy"),
    "--mamba-radix-cache-strategy": Span("0.5.14", None),
    "--enable-nsa-prefill-context-parallel": Span(None, "0.5.19", "--enable-prefill-cp"),
    "--nsa-prefill-cp-mode": Span(None, "0.5.19", "--cp-strategy zigzag ('round-robin-split': interleave)"),
    "--nsa-decode-backend": Span(None, "0.5.19", "--dsa-decode-backend"),
    "--nsa-prefill-backend": Span(None, "0.5.19", "--dsa-prefill-backend"),
    "--prefill-round-robin-balance": Span(None, "0.5.19"),
}


@dataclass
class Fit:
    """The releases whose parsers take every flag of some commands, and the flags that decided it."""

    releases: list[str]  # oldest first; every release when no flag of the commands is in SPANS
    deciding: dict[str, Span]

    def takes(self, release: str) -> bool:
        return all(span.holds(release) for span in self.deciding.values())

    def newest(self) -> str | None:
        return self.releases[-1] if self.releases else None

    def reason(self) -> str:
        return "; ".join(f"{flag} is in SGLang {span.text()}" for flag, span in self.deciding.items())


def fit(flag_lists: list[list[str]]) -> Fit:
    """Which known releases register every flag of the commands that came or went (the others: any release)."""
    deciding = {}
    for flags in flag_lists:
        for name, _ in split_flags(flags):
            flag = canonical(name)
            if flag in SPANS:
                deciding[flag] = SPANS[flag]
    return Fit([r for r in RELEASES if all(s.holds(r) for s in deciding.values())], deciding)


def renamed(flag_lists: list[list[str]], release: str | None) -> list[tuple[str, Span]]:
    """Flags of the commands that some release dropped, with their span (the release chosen outside it first)."""
    found = {flag: span for flag, span in fit(flag_lists).deciding.items() if span.last}
    outside = [(f, s) for f, s in found.items() if release and not s.holds(release)]
    return outside + [(f, s) for f, s in found.items() if (f, s) not in outside]
