#!/usr/bin/env python3
"""ironserve: set (or read) the GDDR7 memory clock offset of every NVIDIA GPU through NVML.

Installed by roles/gpu_clocks.py and run by ironserve-gpu-clocks.service at boot (after
nvidia-persistenced), only on Max-Q profiles: the only cards where the offset is supported
(seed 000: nvmlDeviceSetMemClkVfOffset(handle, 4000) gains several percent of decode speed).

    ironserve-gpu-clocks.py --offset 4000   # set on every GPU, read back, exit 1 on a mismatch
    ironserve-gpu-clocks.py --read          # print "<index> <offset MHz>" per GPU

Runs in /opt/ironserve/tools (nvidia-ml-py, pinned). The offset does not survive a driver
reload or reboot, hence a boot-time unit rather than a one-off call.
"""

import argparse
import sys

import pynvml


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--offset", type=int, help="memory clock VF offset in MHz, for every GPU")
    mode.add_argument("--read", action="store_true", help="print the current offset of every GPU")
    args = parser.parse_args()

    pynvml.nvmlInit()
    try:
        mismatches = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            if args.offset is not None:
                pynvml.nvmlDeviceSetMemClkVfOffset(handle, args.offset)
            offset = pynvml.nvmlDeviceGetMemClkVfOffset(handle)
            print(f"{index} {offset}")
            if args.offset is not None and offset != args.offset:
                mismatches += 1
                print(f"GPU {index}: memory clock offset reads {offset} MHz after setting {args.offset} MHz",
                      file=sys.stderr)
        return 1 if mismatches else 0
    except pynvml.NVMLError as exc:
        print(f"NVML: {exc}", file=sys.stderr)
        return 2
    finally:
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    sys.exit(main())
