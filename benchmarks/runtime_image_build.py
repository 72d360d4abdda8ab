"""Where the cold build of the lab's CPU runtime image spends its time (lab/ironserve_lab/runtime_image.py).

    sudo python benchmarks/runtime_image_build.py [--keep]

Builds the image once into a scratch cache (the lab's own cache is left alone; the CPU wheelhouse and the base
rootfs must exist, i.e. a cpu-lab `lab up` ran once) and prints one line per phase: the Debian base layer
(tar + gzip of the rootfs), the venv install (uv, bytecode included), the venv layer (tar + gzip), and how
much of each layer step is tar alone (the rest is compression). Run it with the lab idle: it uses both cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "lab")]  # this checkout's product and lab


def tar_only(src: Path, excludes: tuple[str, ...]) -> tuple[float, int]:
    """Seconds and bytes of the layer's tar stream alone (the same tar flags as oci.layer_from_dir)."""
    cmd = [
        "tar",
        "--sort=name",
        "--numeric-owner",
        "--one-file-system",
        "-C",
        str(src),
        "-cf",
        "-",
        *(f"--exclude={p}" for p in excludes),
        ".",
    ]
    start, size = time.monotonic(), 0
    with subprocess.Popen(cmd, stdout=subprocess.PIPE) as tar:
        while chunk := tar.stdout.read(1 << 20):
            size += len(chunk)
    return time.monotonic() - start, size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", action="store_true", help="keep the scratch cache (its path is printed)")
    args = parser.parse_args()
    from ironserve_lab import cpu_runtime, oci, runtime_image, state

    wheelhouse = cpu_runtime.RUNTIME.wheelhouse()
    base = state.lab_dir() / "base"
    if not (wheelhouse / "SHA256SUMS").is_file() or not (base / "etc/ironlab-base-version").is_file():
        sys.exit("run `ironserve lab up --hardware cpu-lab` once first (wheelhouse and base rootfs)")
    scratch = Path(tempfile.mkdtemp(prefix="ironserve-image-bench-"))
    os.environ["IRONSERVE_CACHE"] = str(scratch)
    try:
        store = runtime_image.cache_dir()
        t0 = time.monotonic()
        layer0 = oci.layer_from_dir(store, base, runtime_image.BASE_EXCLUDES)
        t_base = time.monotonic() - t0
        tar0, raw0 = tar_only(base, runtime_image.BASE_EXCLUDES)
        work = store / "build"
        t0 = time.monotonic()
        upper = runtime_image._install_venv(base, wheelhouse, work)
        t_venv = time.monotonic() - t0
        tar1, raw1 = tar_only(upper, ("./tmp/*",))
        t0 = time.monotonic()
        layer1 = oci.layer_from_dir(store, upper, ("./tmp/*",), normalize_mtime=True)
        t_layer = time.monotonic() - t0
        print(
            f"base layer:  {t_base:6.1f}s  ({raw0 / 2**20:.0f} MiB tar -> {layer0['size'] / 2**20:.0f} MiB gzip; "
            f"tar alone {tar0:.1f}s)"
        )
        print(f"venv install: {t_venv:6.1f}s")
        print(
            f"venv layer:  {t_layer:6.1f}s  ({raw1 / 2**20:.0f} MiB tar -> {layer1['size'] / 2**20:.0f} MiB gzip; "
            f"tar alone {tar1:.1f}s)"
        )
        print(f"total:       {t_base + t_venv + t_layer:6.1f}s")
    finally:
        if args.keep:
            print(f"scratch cache kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
