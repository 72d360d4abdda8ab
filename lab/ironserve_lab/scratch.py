"""Build trees in memory: a private tmpfs for the lab's builds of many small files, when this machine can spare it.

Writing tens of thousands of small files costs this machine's disk far more than the build's own work: measured on a
2-core VM (ext4 on virtio), mmdebstrap of the lab rootfs 46-51 s (30 s of it in the kernel) against 27 s into a
tmpfs, and the parser image's venv install, strip and bytecode 44 s against 28 s. The finished tree is what lasts:
the rootfs is copied to disk in one pass (1.5 s), an image's layer is written as one blob.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .system import run, say, unmount_tree

MEMINFO = Path("/proc/meminfo")
# what the machine keeps for everything else while a build fills its tmpfs (the lab's hosts, the tests beside it)
HEADROOM_GIB = 4


def available_gib(meminfo: Path = MEMINFO) -> float:
    """MemAvailable of this machine, in GiB (0 when the kernel does not say)."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


@contextmanager
def scratch_dir(path: Path, cap_gib: int, what: str) -> Iterator[bool]:
    """``path``, empty, for the block: a tmpfs of at most ``cap_gib`` when this machine has that much memory available
    besides its headroom, else a directory on disk. Removed after either way (and first, with its mounts, when a
    killed build left it). Yields whether it is in memory."""
    clear(path)
    path.mkdir(parents=True)
    available = available_gib()
    in_memory = available >= cap_gib + HEADROOM_GIB
    if in_memory:
        run(["mount", "-t", "tmpfs", "-o", f"size={cap_gib}g,mode=0700", "ironlab-scratch", str(path)])
    else:
        say(
            f"{what}: built on disk, slower: {available:.1f} GiB of memory available, where a tmpfs for it wants "
            f"{cap_gib + HEADROOM_GIB} (at most {cap_gib} for the build, {HEADROOM_GIB} left for the rest)"
        )
    try:
        yield in_memory
    finally:
        clear(path)


def clear(path: Path) -> None:
    """A build tree gone, its mounts first (a killed build's tmpfs would hold its GiBs of memory until then)."""
    unmount_tree(path)
    shutil.rmtree(path, ignore_errors=True)
