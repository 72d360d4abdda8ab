"""What the lab's runtimes (cpu_runtime, npu_runtime, cuda_runtime) are to its bring-up: one interface.

A runtime is what the hosts of some hardware profiles install with the production uv role, from the lab index: a
wheelhouse of real wheels and stand-ins, pinned in requirements/*.txt, built once per machine into the lab cache
(kept across labs; a runtime may be built from another's wheelhouse) and published to the lab index on `up`.
``lab up`` knows nothing else of them: :func:`ensure` builds a wheelhouse that is missing or incomplete, and
:func:`publish` puts it in the lab index.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path

from . import state, supply
from .system import LabError, say


class WheelhouseError(RuntimeError):
    """A runtime's wheelhouse could not be built (a download failed, a wheel is missing)."""


class LabRuntime(ABC):
    """One runtime of the lab: what it publishes, where its cache is, what it needs."""

    name: str  # how `lab up` names it ("CPU runtime")
    hardware: tuple[str, ...]  # the hardware profiles whose hosts install it
    cache: str  # its wheelhouse's directory under the lab cache (state.cache_dir)
    requires: tuple[LabRuntime, ...] = ()  # the runtimes whose wheelhouses its own is built from

    def wheelhouse(self) -> Path:
        """Its wheelhouse on this machine."""
        return state.cache_dir() / self.cache

    def wheels(self, wheelhouse: Path) -> list[Path]:
        """What it publishes to the lab index."""
        return sorted(wheelhouse.glob("*.whl"))

    @abstractmethod
    def contents(self) -> str:
        """What it holds, in a few words (`lab up` says it)."""

    @abstractmethod
    def problems(self, wheelhouse: Path) -> list[str]:
        """What ``wheelhouse`` lacks ([] = complete)."""

    @abstractmethod
    def build(self, wheelhouse: Path) -> dict:
        """Fill ``wheelhouse`` (what is there is kept), with the wheelhouses of ``requires`` complete; a summary
        with at least ``wheels`` and ``bytes``. Raises WheelhouseError."""


def download(command: list[str], timeout: int, env: dict | None = None) -> None:
    """Run a runtime's ``pip download`` (exact pins, no dependencies); WheelhouseError with pip's words if it fails."""
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise WheelhouseError(f"pip download failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def record(wheelhouse: Path) -> dict:
    """A built wheelhouse's SHA256SUMS, written beside its wheels; the start of its summary (path, wheels, bytes)."""
    wheels = sorted(wheelhouse.glob("*.whl"))
    sums = "".join(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in wheels)
    (wheelhouse / "SHA256SUMS").write_text(sums)
    return {"path": str(wheelhouse), "wheels": len(wheels), "bytes": sum(w.stat().st_size for w in wheels)}


def ensure(runtime: LabRuntime) -> Path:
    """The runtime's wheelhouse, built first when missing or incomplete (once per machine: the cold build's time is
    said and recorded in its build.json)."""
    wheelhouse = runtime.wheelhouse()
    if wheelhouse.is_dir() and not runtime.problems(wheelhouse):
        return wheelhouse
    for needed in runtime.requires:
        ensure(needed)
    say(f"{runtime.name} wheelhouse: {runtime.contents()} into {wheelhouse} (once per machine; minutes)")
    t0 = time.monotonic()
    try:
        summary = runtime.build(wheelhouse)
    except WheelhouseError as exc:
        raise LabError(f"the lab's {runtime.name} wheelhouse could not be built: {exc}") from exc
    summary["build_s"] = round(time.monotonic() - t0, 1)
    (wheelhouse / "build.json").write_text(json.dumps(summary, indent=1) + "\n")
    say(
        f"{runtime.name} wheelhouse built: {summary['wheels']} wheels, {summary['bytes'] / 2**30:.1f} GiB, "
        f"{summary['build_s']} s"
    )
    return wheelhouse


def publish(root: Path, runtime: LabRuntime) -> None:
    """The runtime's wheels into the lab index (its wheelhouse built first when it must be)."""
    t0 = time.monotonic()
    added = supply.add_wheels(root, runtime.wheels(ensure(runtime)))
    say(
        f"{runtime.name}: {runtime.contents()} in the lab index"
        f"{f', {added} new' if added else ', unchanged'} ({time.monotonic() - t0:.1f}s)"
    )
