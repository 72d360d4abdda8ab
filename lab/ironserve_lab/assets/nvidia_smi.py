#!/usr/bin/python3
"""ironserve lab stand-in for nvidia-smi (installed by the lab's nvidia-open-580 package).

Answers from the profile named in /etc/ironlab/hardware. Supported: plain, -L, -q (short, with the
Fabric section: State/Status/CliqueId/ClusterUUID; /etc/ironlab/fabric overrides clique_id= and
cluster_uuid=), --query-gpu=... --format=csv[,noheader][,nounits], -i, -pm 0|1, topo -m, --version.

Fails like the real one when "the module" cannot load: no module built for the running kernel
(the package's DKMS build needs the kernel's headers, see standins.py) or nouveau bound to the GPUs
(the lab's GPU hosts boot with nouveau, /etc/ironlab/nouveau, until /etc/modprobe.d blacklists it).
"""
import glob
import json
import os
import sys

PROFILES = json.loads(r'''__PROFILES__''')
DRIVER = "__DRIVER__"
CUDA = "__CUDA__"
STATE = "/var/lib/ironlab-standins/nvidia-smi.json"


def fail_no_driver():
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.")
    sys.exit(9)


ENV = os.environ.get  # the lab's unit tests point these at a temporary tree


def module_loadable():
    """Loaded stays loaded until the next boot (/run); loading needs a module built for the running kernel and
    nouveau not holding the GPUs."""
    loaded = ENV("IRONLAB_LOADED_FILE", "/run/ironlab-standins/nvidia-loaded")
    if os.path.exists(loaded):
        return True
    release = os.uname().release
    if not glob.glob(f"{ENV('IRONLAB_DKMS_DIR', '/var/lib/dkms')}/nvidia/{DRIVER}/{release}/*/module/nvidia.ko"):
        return False  # nothing built for this kernel: modprobe nvidia finds no module
    if os.path.exists(ENV("IRONLAB_NOUVEAU_FILE", "/etc/ironlab/nouveau")):
        modprobe_d = ENV("IRONLAB_MODPROBE_DIR", "/etc/modprobe.d")
        blacklisted = False
        for conf in glob.glob(f"{modprobe_d}/*.conf") + glob.glob("/lib/modprobe.d/*.conf"):
            try:
                blacklisted = blacklisted or any(line.split()[:2] == ["blacklist", "nouveau"] for line in open(conf))
            except OSError:
                continue
        if not blacklisted:
            return False  # nouveau holds the GPUs: the nvidia module's probe fails
    try:  # the module loads (nvidia-modprobe runs as root)
        os.makedirs(os.path.dirname(loaded), exist_ok=True)
        open(loaded, "w").close()
    except OSError:
        pass
    return True


def fabric():
    """(state, status, clique_id, cluster_uuid) of this host's GPUs."""
    values = {"clique_id": "32766", "cluster_uuid": "1ab2c3d4-0000-4000-8000-00000000a72b"}
    try:
        for line in open(ENV("IRONLAB_FABRIC_FILE", "/etc/ironlab/fabric")):
            key, _, value = line.strip().partition("=")
            if key in values and value:
                values[key] = value
    except OSError:
        pass
    return "Completed", "Success", values["clique_id"], values["cluster_uuid"]


def profile():
    try:
        hw = open(os.environ.get("IRONLAB_HARDWARE_FILE", "/etc/ironlab/hardware")).read().strip()
    except OSError:
        hw = "cpu-lab"
    p = PROFILES.get(hw, {})
    if p.get("kind") != "nvidia" or not module_loadable():
        fail_no_driver()
    return hw, p


def load_state():
    try:
        return json.load(open(STATE))
    except (OSError, ValueError):
        return {}


def gpus(hw, p, state):
    out = []
    for i in range(p["count"]):
        pm = state.get("persistence", {}).get(str(i), "Disabled")
        out.append({
            "index": str(i), "name": p["name"], "count": str(p["count"]),
            "uuid": f"GPU-1ab00000-0000-4000-8000-{i:012d}",  # same as the stand-in NVML
            "serial": f"16520250{i:05d}", "pci.bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            "memory.total": str(p["memory_mib"]), "memory.used": "0", "memory.free": str(p["memory_mib"]),
            "memory.reserved": "0", "driver_version": DRIVER, "compute_cap": p["compute_cap"],
            "persistence_mode": pm, "pstate": "P8", "temperature.gpu": "31", "utilization.gpu": "0",
            "utilization.memory": "0", "power.draw": "22.50", "power.limit": f"{p['power_limit_w']:.2f}",
            "power.max_limit": f"{p['power_limit_w']:.2f}", "power.default_limit": f"{p['power_limit_w']:.2f}",
            "clocks.max.sm": str(p["max_sm_mhz"]), "clocks.max.memory": str(p["max_mem_mhz"]),
            "clocks.max.graphics": str(p["max_sm_mhz"]), "clocks.sm": "180", "clocks.mem": "405",
            "vbios_version": "98.02.5A.00.01", "mig.mode.current": "[N/A]", "mig.mode.pending": "[N/A]",
            "ecc.mode.current": "Enabled", "fan.speed": "[N/A]", "compute_mode": "Default",
            "display_mode": "Disabled", "cuda_version": CUDA,
        })
    return out


UNITS = {"memory.total": " MiB", "memory.used": " MiB", "memory.free": " MiB", "memory.reserved": " MiB",
         "temperature.gpu": "", "utilization.gpu": " %", "utilization.memory": " %", "power.draw": " W",
         "power.limit": " W", "power.max_limit": " W", "power.default_limit": " W", "clocks.max.sm": " MHz",
         "clocks.max.memory": " MHz", "clocks.max.graphics": " MHz", "clocks.sm": " MHz", "clocks.mem": " MHz"}
HEADERS = {"memory.total": "memory.total [MiB]", "memory.used": "memory.used [MiB]",
           "memory.free": "memory.free [MiB]", "utilization.gpu": "utilization.gpu [%]",
           "power.draw": "power.draw [W]", "power.limit": "power.limit [W]",
           "clocks.max.sm": "clocks.max.sm [MHz]", "clocks.max.memory": "clocks.max.memory [MHz]"}
ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id", "compute_capability": "compute_cap",
           "driver_version": "driver_version", "persistence-mode": "persistence_mode",
           "memory.total": "memory.total", "temperature.gpu": "temperature.gpu"}


def query(devs, fields, fmt):
    opts = fmt.split(",")
    if opts[0] != "csv":
        print(f'"{fmt}" is not a valid format.')
        sys.exit(2)
    keys = []
    for f in fields:
        key = ALIASES.get(f, f)
        if not devs or key not in devs[0]:
            print(f'Field "{f}" is not a valid field to query.')
            sys.exit(2)
        keys.append(key)
    if "noheader" not in opts:
        print(", ".join(HEADERS.get(k, k) for k in keys))
    for d in devs:
        vals = [d[k] + ("" if "nounits" in opts else UNITS.get(k, "")) for k in keys]
        print(", ".join(vals))


def table(p, devs):
    print("Sun Nov 22 00:00:00 2026")
    print("+-----------------------------------------------------------------------------------------+")
    print(f"| NVIDIA-SMI {DRIVER}              Driver Version: {DRIVER}      CUDA Version: {CUDA}     |")
    print("+-----------------------------------------+------------------------+----------------------+")
    print("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |")
    print("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |")
    print("|=========================================+========================+======================|")
    for d in devs:
        pm = "On" if d["persistence_mode"] == "Enabled" else "Off"
        print(f"| {d['index']:>3}  {d['name'][:26]:<26} {pm:>5} | {d['pci.bus_id']} Off |                    0 |")
        mem = f"0MiB / {d['memory.total']}MiB"
        print(f"| N/A   31C    P8         22W / {p['power_limit_w']:>4}W | {mem:>22} |      0%      Default |")
        print("+-----------------------------------------+------------------------+----------------------+")
    print("")
    print("+-----------------------------------------------------------------------------------------+")
    print("| Processes:                                                                              |")
    print("|  No running processes found                                                             |")
    print("+-----------------------------------------------------------------------------------------+")


def topo(p, devs):
    link = "NV18" if p.get("nvlink") else "NODE"
    head = "\t" + "\t".join(f"GPU{d['index']}" for d in devs) + "\tCPU Affinity\tNUMA Affinity"
    print(head)
    for d in devs:
        row = ["X" if d is e else link for e in devs]
        print(f"GPU{d['index']}\t" + "\t".join(row) + "\t0-1\t0")
    print("\nLegend:\n  X    = Self\n  NODE = Connection traversing PCIe and the interconnect between PCIe Host Bridges"
          " within a NUMA node\n  NV#  = Connection traversing a bonded set of # NVLinks")


def main(argv):
    if argv[:1] in (["--version"], ["-V"]):
        print(f"NVIDIA-SMI version  : {DRIVER}\nNVML version        : {DRIVER.split('.')[0]}.95\n"
              f"DRIVER version      : {DRIVER}\nCUDA Version        : {CUDA}")
        return 0
    hw, p = profile()
    state = load_state()
    devs = gpus(hw, p, state)
    fields, fmt, pm, listing, detail = None, "csv", None, False, False
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--query-gpu="):
            fields = a.split("=", 1)[1].split(",")
        elif a == "--query-gpu":
            i += 1
            fields = args[i].split(",")
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format":
            i += 1
            fmt = args[i]
        elif a in ("-i", "--id"):
            i += 1
            wanted = set(args[i].split(","))
            devs = [d for d in devs if d["index"] in wanted or d["uuid"] in wanted or d["pci.bus_id"] in wanted]
            if not devs:
                print("No devices were found")
                return 6
        elif a.startswith("--id="):
            wanted = set(a.split("=", 1)[1].split(","))
            devs = [d for d in devs if d["index"] in wanted]
        elif a in ("-pm", "--persistence-mode"):
            i += 1
            pm = args[i]
        elif a in ("-L", "--list-gpus"):
            listing = True
        elif a in ("-q", "--query"):
            detail = True
        elif a == "topo":
            topo(p, devs)
            return 0
        elif a in ("-m", "--matrix"):
            pass
        else:
            print(f"Invalid combination of input arguments. Please run 'nvidia-smi -h' for help. ({a})")
            return 2
        i += 1
    if pm is not None:
        if os.geteuid() != 0:
            print("Unable to set persistence mode for GPU 00000000:18:00.0: Insufficient Permissions")
            return 4
        value = "Enabled" if pm in ("1", "ENABLED", "Enabled") else "Disabled"
        state.setdefault("persistence", {})
        for d in devs:
            state["persistence"][d["index"]] = value
            print(f"{value} persistence mode for GPU {d['pci.bus_id']}.")
        os.makedirs(os.path.dirname(STATE), exist_ok=True)
        json.dump(state, open(STATE, "w"))
        print("All done.")
        return 0
    if listing:
        for d in devs:
            print(f"GPU {d['index']}: {d['name']} (UUID: {d['uuid']})")
        return 0
    if fields:
        query(devs, fields, fmt)
        return 0
    if detail:
        print(f"==============NVSMI LOG==============\n\nDriver Version                            : {DRIVER}\n"
              f"CUDA Version                              : {CUDA}\n\nAttached GPUs                             : {len(devs)}")
        for d in devs:
            print(f"GPU {d['pci.bus_id']}\n    Product Name                          : {d['name']}\n"
                  f"    Persistence Mode                      : {d['persistence_mode']}\n"
                  f"    GPU UUID                              : {d['uuid']}\n"
                  f"    FB Memory Usage\n        Total                             : {d['memory.total']} MiB")
            if p.get("nvlink"):
                state, status, clique, uuid = fabric()
                print(f"    Fabric\n        State                             : {state}\n"
                      f"        Status                            : {status}\n"
                      f"        CliqueId                          : {clique}\n"
                      f"        ClusterUUID                       : {uuid}\n"
                      f"        Health\n            Bandwidth                     : Full")
            else:
                print("    Fabric\n        State                             : N/A\n"
                      "        Status                            : N/A")
        return 0
    table(p, devs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
