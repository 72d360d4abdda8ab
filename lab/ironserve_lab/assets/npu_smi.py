#!/usr/bin/python3
"""ironserve lab stand-in for npu-smi (installed by the lab's Ascend driver .run stand-in).

Answers from the profile named in /etc/ironlab/hardware. Supported: `info`, `info -l`,
`info -t board -i N`, `-v`.
"""
import json
import os
import sys

PROFILES = json.loads(r'''__PROFILES__''')
VERSION = "__VERSION__"


def profile():
    try:
        hw = open(os.environ.get("IRONLAB_HARDWARE_FILE", "/etc/ironlab/hardware")).read().strip()
    except OSError:
        hw = "cpu-lab"
    p = PROFILES.get(hw, {})
    if p.get("kind") != "ascend":
        print("dcmi module initialize failed. ret is -8005")
        sys.exit(1)
    return p


def info_list(p):
    print(f"\tTotal Count                    : {p['count']}\n")
    for i in range(p["count"]):
        print(f"\tNPU ID                         : {i}")
        print(f"\tProduct Name                   : {p['name']}")
        print(f"\tSerial Number                  : 0339A1LAB{i:05d}")
        print("\tChip Count                     : 1\n")


def info_table(p):
    print("+------------------------------------------------------------------------------------------------+")
    print(f"| npu-smi {VERSION}                  Version: {VERSION}                                          |")
    print("+---------------------------+---------------+----------------------------------------------------+")
    print("| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|")
    print("| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |")
    print("+===========================+===============+====================================================+")
    for i in range(p["count"]):
        print(f"| {i:<5} {p['name'] + p['chip_name'][-1:]:<19} | OK            | 95.0        35                0    / 0             |")
        print(f"| 0     {i:<19} | 0000:{0x9d + i:02X}:00.0  | 0           0    / 0          3400 / {p['hbm_mib']}        |")
        print("+===========================+===============+====================================================+")
    print("+---------------------------+---------------+----------------------------------------------------+")
    print("| NPU     Chip                | Process id    | Process name             | Process memory(MB)      |")
    print("+===========================+===============+====================================================+")
    print("| No running processes found in NPU 0                                                            |")
    print("+===========================+===============+====================================================+")


def main(argv):
    if argv[:1] == ["-v"]:
        print(f"npu-smi version: {VERSION}")
        return 0
    p = profile()
    if argv[:1] != ["info"]:
        print("Usage: npu-smi info [-l | -t board -i ID]")
        return 1
    rest = argv[1:]
    if rest == ["-l"]:
        info_list(p)
    elif rest[:2] == ["-t", "board"]:
        idx = int(rest[rest.index("-i") + 1]) if "-i" in rest else 0
        if idx >= p["count"]:
            print("The input parameter is invalid.")
            return 1
        print(f"\tNPU ID                         : {idx}\n\tProduct Name                   : {p['name']}\n"
              f"\tChip Name                      : {p['chip_name']}\n\tSoftware Version               : {VERSION}")
    else:
        info_table(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
