"""Stand-in hardware for lab hosts: packages under the real names the roles install.

Lab only: roles and deploys never know about these; they install the same package names
from the lab mirror that they would from NVIDIA's / Huawei's repositories on a real cluster,
and the stand-ins answer the way the real tools do for the profile in /etc/ironlab/hardware
(written by `lab up --hardware ID`; the catalogue's profiles as the stand-ins answer them: profiles.py).

Apt repository (deb [signed-by=/usr/share/keyrings/ironlab-archive-keyring.gpg] http://10.213.7.1:8780/apt ./
(a key made per lab; inventory data apt_signed_by), or [trusted=yes] where gpg is missing):
  nvidia-open-580                 580.95.05-1  postinst = the DKMS build: fails (exit 10, dkms's message)
                                               without /lib/modules/$(uname -r)/build; "loads" the module
                                               (NVreg_CreateImexChannel0=1 -> /dev/nvidia-caps-imex-channels/
                                               channel0); nvidia-smi/nvidia-ctk/nvidia-imex fail like an
                                               unloaded driver without a built module or while nouveau holds
                                               the GPUs (/etc/ironlab/nouveau, until modprobe.d blacklists it)
                                               /usr/bin/nvidia-smi (python3 stand-in: plain, -L, -q + Fabric,
                                               --query-gpu=...,--format=csv[,noheader][,nounits], -i,
                                               -pm, topo -m) and /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
                                               (C stand-in NVML built by the lab: init/shutdown, count,
                                               handles, name, UUID, memory, driver/CUDA version,
                                               compute capability, Mem/Gpc clock VF offsets get/set/min-max;
                                               sets need root and persist in /var/lib/ironlab-standins/)
  cuda-toolkit-13-0               13.0.2-1     /usr/local/cuda-13.0/bin/nvcc ("release 13.0, V13.0.88"),
                                               version.json, /usr/local/cuda -> cuda-13.0
  nvidia-container-toolkit        1.18.0-1     /usr/bin/nvidia-container-runtime-hook (the prestart hook the
                                               real dockerd runs for --gpus: fails the container's start like
                                               the real one while the driver does not answer),
                                               /usr/bin/nvidia-ctk (--version; runtime configure
                                               --runtime=docker|containerd [--config=F] [--set-as-default];
                                               --cdi.enabled; cdi generate --output=F (needs a loaded driver;
                                               spec names the driver's libcuda); cdi list;
                                               system create-dev-char-symlinks --create-all)
  linux-headers-$(uname -r)       1.0-ironlab1 /lib/modules/<running kernel>/build (what DKMS builds against)
  nvidia-imex-580                 580.95.05-1  nvidia-imex (reads config.cfg + nodes_config.cfg, refuses bad
                                               ones, listens on SERVER_PORT), nvidia-imex-ctl -q/-N,
                                               nvidia-imex.service (not enabled by the package)
  nvidia-persistenced             580.95.05-1  nvidia-persistenced.service (enabled, starts in a container;
                                               the packaged unit passes --no-persistence-mode, like some real
                                               ones; without it the daemon turns persistence mode on)
  datacenter-gpu-manager-4-cuda13 1:4.4.1-1    /usr/bin/dcgmi, nv-hostengine, nvidia-dcgm.service
Files (http://10.213.7.1:8780/ascend/), self-extracting .run installers accepting the real flags
(--install/--full/--run/--upgrade, --uninstall, --check, --version, --quiet, --install-for-all,
--install-path=DIR, default /usr/local/Ascend; root required):
  Ascend-hdk-910c-npu-driver_25.2.0_linux-x86-64.run  driver/version.info, driver/tools/npu-smi,
                                                      /usr/local/sbin/npu-smi, /etc/ascend_install.info
  Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run        ascend-toolkit/set_env.sh, ascend-toolkit/latest
                                                      (+ ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info)
  Ascend-cann-nnal_8.3.RC1_linux-x86_64.run           nnal/atb/set_env.sh, nnal/atb/latest/version.info
                                                      (needs the toolkit first)
  Ascend-hdk-910c-npu-firmware_7.7.0.6.236.run        firmware/version.info (needs the driver first)
npu-smi answers `info`, `info -l` (16 x Ascend910 on atlas-800i-a3), `info -t board -i N`, `-v`.
With a profile of the other vendor (or cpu-lab) the tools fail the way they do without a device.
Inside every host (not packaged): writable /sys/devices/system/cpu/cpu*/cpufreq/ and stand-in
/proc/sys/vm/*, kernel.numa_balancing (see hosts.py, assets/fake-sysfs.sh).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from . import supply
from .profiles import ASCEND_DRIVER_VERSION, CANN_VERSION, CUDA_VERSION, DRIVER_VERSION, PROFILES
from .system import LabError, apt_install, run, say

ASSETS = Path(__file__).parent / "assets"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
NVCC_VERSION = "V13.0.88"
ASCEND_FIRMWARE_VERSION = "7.7.0.6.236"
RUN_FILES = {
    "driver": f"Ascend-hdk-910c-npu-driver_{ASCEND_DRIVER_VERSION}_linux-x86-64.run",
    "toolkit": f"Ascend-cann-toolkit_{CANN_VERSION}_linux-x86_64.run",
    "nnal": f"Ascend-cann-nnal_{CANN_VERSION}_linux-x86_64.run",
    "firmware": f"Ascend-hdk-910c-npu-firmware_{ASCEND_FIRMWARE_VERSION}.run",
}


# ---------------------------------------------------------------- builders


def _fingerprint() -> str:
    h = hashlib.sha256()
    for p in sorted(ASSETS.iterdir()) + [Path(__file__)]:
        h.update(p.name.encode() + p.read_bytes())
    h.update(_profiles_json().encode())  # what the stand-ins answer (the catalogue's profiles, profiles.py)
    h.update(os.uname().release.encode())  # the headers stand-in is for the running kernel
    return h.hexdigest()[:16]


def build_deb(
    out: Path,
    name: str,
    version: str,
    files: dict,
    description: str,
    depends: str = "",
    scripts: dict | None = None,
    extra: str = "",
) -> Path:
    """files: {"/abs/path": (bytes|str, mode)} or {"/abs/link": ("->", target)}."""
    with tempfile.TemporaryDirectory(prefix=f"ironlab-{name}-") as tmp:
        stage = Path(tmp)
        for path, (content, mode) in files.items():
            dest = stage / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if content == "->":
                dest.symlink_to(mode)
                continue
            dest.write_bytes(content.encode() if isinstance(content, str) else content)
            dest.chmod(mode)
        (stage / "DEBIAN").mkdir()
        control = [
            f"Package: {name}",
            f"Version: {version}",
            "Architecture: amd64",
            "Maintainer: ironserve lab <lab@ironserve.invalid>",
            "Section: non-free/libs",
            "Priority: optional",
        ]
        if depends:
            control.append(f"Depends: {depends}")
        if extra:
            control.append(extra)
        control.append(
            f"Description: {description}\n ironserve lab stand-in: answers like the real package for the\n"
            " hardware profile in /etc/ironlab/hardware. Never install outside the lab."
        )
        (stage / "DEBIAN/control").write_text("\n".join(control) + "\n")
        for script, body in (scripts or {}).items():
            (stage / "DEBIAN" / script).write_text("#!/bin/sh\nset -e\n" + body + "\n")
            (stage / "DEBIAN" / script).chmod(0o755)
        deb = out / f"{name}_{version.split(':')[-1]}_amd64.deb"
        run(["dpkg-deb", "-Zgzip", "--root-owner-group", "--build", str(stage), str(deb)])
    return deb


def _template(asset: str, **values: str) -> str:
    text = (ASSETS / asset).read_text()
    for key, value in values.items():
        text = text.replace(f"__{key}__", value)
    return text


def build_nvml(out: Path) -> Path:
    if not shutil.which("gcc"):
        apt_install(["gcc", "libc6-dev"], "to build the lab's stand-in libnvidia-ml.so.1")
    rows = "".join(
        f'{{"{pid}", {p["count"]}, "{p["name"]}", {p["memory_mib"]}ULL, {p["compute_cap"].split(".")[0]}, '
        f"{p['compute_cap'].split('.')[1]}}}, "
        for pid, p in PROFILES.items()
        if p["kind"] == "nvidia"
    )
    header = out / "nvml_profiles.h"
    major, minor = CUDA_VERSION.split(".")
    header.write_text(
        f'#define PROFILE_TABLE {rows}\n#define DRIVER_VERSION "{DRIVER_VERSION}"\n'
        f'#define NVML_VERSION "{major}.{DRIVER_VERSION}"\n'
        f"#define CUDA_DRIVER_VERSION {int(major) * 1000 + int(minor) * 10}\n"
    )
    lib = out / "libnvidia-ml.so.1"
    run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-include",
            str(header),
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(lib),
            str(ASSETS / "libnvidia_ml.c"),
        ]
    )
    return lib


def _profiles_json() -> str:
    return json.dumps(PROFILES)


NVIDIA_CTK = r'''#!/usr/bin/python3
"""ironserve lab stand-in for nvidia-ctk (runtime configure, cdi generate/list, system create-dev-char-symlinks)."""
import glob, json, os, re, subprocess, sys
a = sys.argv[1:]
DRIVER = "__DRIVER__"
def opt(name, default=None):
    for x in a:
        if x.startswith(name + "="):
            return x.split("=", 1)[1]
    return default
def cdi_devices():
    """nvidia.com/gpu devices of the spec files nvidia-ctk reads (the stand-in reads its own format)."""
    texts = [open(f).read() for d in ("/etc/cdi", "/var/run/cdi") for f in sorted(glob.glob(d + "/*.yaml"))]
    return [f"nvidia.com/gpu={n}" for t in texts if re.search(r"^kind: nvidia.com/gpu$", t, re.M)
            for n in re.findall(r'^- name: "?([^"\n]+?)"?$', t, re.M)]
if a[:1] in (["--version"], ["-v"]):
    print("NVIDIA Container Toolkit CLI version 1.18.0\ncommit: ironlab"); sys.exit(0)
if a[:2] == ["runtime", "configure"]:
    rt = opt("--runtime", "docker")
    if rt == "docker":
        cfg = opt("--config", "/etc/docker/daemon.json")
        data = json.load(open(cfg)) if os.path.exists(cfg) and os.path.getsize(cfg) else {}
        data.setdefault("runtimes", {})["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
        if "--set-as-default" in a:
            data["default-runtime"] = "nvidia"
        if "--cdi.enabled" in a or opt("--cdi.enabled") == "true":
            data.setdefault("features", {})["cdi"] = True
        os.makedirs(os.path.dirname(cfg), exist_ok=True)
        json.dump(data, open(cfg, "w"), indent=4)
    elif rt == "containerd":
        cfg = opt("--config", "/etc/containerd/conf.d/99-nvidia.toml")
        os.makedirs(os.path.dirname(cfg), exist_ok=True)
        open(cfg, "w").write('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
                             '  runtime_type = "io.containerd.runc.v2"\n')
    else:
        print(f"unrecognized runtime '{rt}'", file=sys.stderr); sys.exit(1)
    print(f'INFO[0000] Wrote updated config to {cfg}\nINFO[0000] It is recommended that {rt} daemon be restarted.')
    sys.exit(0)
if a[:2] == ["cdi", "generate"]:
    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if smi.returncode != 0:
        print("ERRO[0000] failed to generate CDI spec: failed to create device CDI specs: failed to initialize NVML: "
              "ERROR_DRIVER_NOT_LOADED", file=sys.stderr); sys.exit(1)
    count = len([l for l in smi.stdout.splitlines() if l.startswith("GPU ")])
    lines = ["---", "cdiVersion: 0.5.0", "kind: nvidia.com/gpu", "devices:"]
    for i in range(count):
        lines += [f'- name: "{i}"', "  containerEdits:", "    deviceNodes:", f"    - path: /dev/nvidia{i}"]
    lines += ["- name: all", "  containerEdits:", "    deviceNodes:"]
    lines += [f"    - path: /dev/nvidia{i}" for i in range(count)]
    lines += ["containerEdits:", "  deviceNodes:", "  - path: /dev/nvidiactl", "  - path: /dev/nvidia-uvm",
              "  mounts:", f"  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}",
              f"    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}",
              "    options: [ro, nosuid, nodev, bind]", "  - hostPath: /usr/bin/nvidia-smi",
              "    containerPath: /usr/bin/nvidia-smi", "    options: [ro, nosuid, nodev, bind]"]
    spec = "\n".join(lines) + "\n"
    out = opt("--output", None)
    if out:
        os.makedirs(os.path.dirname(out), exist_ok=True); open(out, "w").write(spec)
        print(f'INFO[0000] Generated CDI spec with version 0.5.0\nINFO[0000] Wrote CDI spec to "{out}"', file=sys.stderr)
    else:
        print(spec, end="")
    sys.exit(0)
if a[:2] == ["cdi", "list"]:
    devices = cdi_devices()
    print(f"INFO[0000] Found {len(devices)} CDI devices", file=sys.stderr)
    for d in devices:
        print(d)
    sys.exit(0)
if a[:2] == ["system", "create-dev-char-symlinks"]:
    os.makedirs("/dev/char", exist_ok=True)
    for dev in glob.glob("/dev/nvidia*"):
        try:
            st = os.stat(dev)
        except OSError:
            continue
        link = f"/dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        if not os.path.lexists(link):
            os.symlink(dev, link)
    sys.exit(0)
print("NAME:\n   NVIDIA Container Toolkit CLI (ironserve lab stand-in)"); sys.exit(0 if not a else 1)
'''

# dockerd registers its "nvidia" device driver (`docker run --gpus`) when this is on PATH at its start, and runs it
# as the container's OCI prestart hook; like the real hook (nvidia-container-cli underneath), it fails the
# container's start when the driver does not answer. It mounts nothing: no stand-in GPU can run code.
RUNTIME_HOOK = r"""#!/bin/sh
# ironserve lab stand-in for nvidia-container-runtime-hook (the prestart hook of `docker run --gpus`)
case "$1" in
    prestart) ;;
    poststart|poststop) exit 0 ;;
    *) echo "Usage: nvidia-container-runtime-hook [prestart|poststart|poststop]" >&2; exit 2 ;;
esac
cat >/dev/null  # the container's OCI state
if ! /usr/bin/nvidia-smi -L >/dev/null 2>&1; then
    echo "nvidia-container-cli: initialization error: nvml error: driver not loaded" >&2
    exit 1
fi
exit 0
"""

# The stand-in driver's "DKMS build": like dkms, it needs the running kernel's headers; like the driver, it honours
# NVreg_CreateImexChannel0=1 when "the module loads" (here: at configure time, unless nouveau holds the GPUs).
DRIVER_POSTINST = r"""k=$(uname -r)
if [ ! -e "/lib/modules/$k/build" ] && [ ! -e "/lib/modules/$k/source" ]; then
    echo "Error! Your kernel headers for kernel $k cannot be found at /lib/modules/$k/build or /lib/modules/$k/source."
    echo "Please install the linux-headers-$k package or use the --kernelsourcedir option to tell DKMS where it's located."
    echo "dpkg: error processing package nvidia-kernel-open-dkms (--configure): DKMS could not build the nvidia module"
    exit 10
fi
mkdir -p "/var/lib/dkms/nvidia/__DRIVER__/$k/$(uname -m)/module"
echo "ironlab stand-in module for $k" > "/var/lib/dkms/nvidia/__DRIVER__/$k/$(uname -m)/module/nvidia.ko"
ldconfig
if grep -qs '^options nvidia .*NVreg_CreateImexChannel0=1' /etc/modprobe.d/*.conf && nvidia-smi -L >/dev/null 2>&1; then
    mkdir -p /dev/nvidia-caps-imex-channels
    [ -c /dev/nvidia-caps-imex-channels/channel0 ] || mknod -m 666 /dev/nvidia-caps-imex-channels/channel0 c 234 0 || true
fi"""

PERSISTENCED = r"""#!/bin/sh
# ironserve lab stand-in for nvidia-persistenced: like the real daemon, persistence mode is on while it runs
# unless it was started with --no-persistence-mode
case " $* " in
    *" --no-persistence-mode "*) ;;
    *) nvidia-smi -pm 1 >/dev/null 2>&1 || { echo "nvidia-persistenced: failed to initialize: driver not loaded" >&2; exit 1; } ;;
esac
exec sleep infinity
"""

IMEX = r'''#!/usr/bin/python3
"""ironserve lab stand-in for nvidia-imex: reads its config and nodes config like the real service.

Refuses without a working driver, without a nodes config, with an address that is not an IP, or when none
of the nodes is an address of this host; then listens on SERVER_PORT on its own node address and reports
READY to nvidia-imex-ctl.
"""
import ipaddress, json, os, socket, subprocess, sys
args = sys.argv[1:]
config = args[args.index("-c") + 1] if "-c" in args else "/etc/nvidia-imex/config.cfg"
def die(msg):
    print(f"IMEX: {msg}", file=sys.stderr); sys.exit(1)
settings = {"SERVER_PORT": "50000", "IMEX_NODE_CONFIG_FILE": "/etc/nvidia-imex/nodes_config.cfg", "BIND_INTERFACE_IP": ""}
try:
    for line in open(config):
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            settings[k.strip()] = v.strip()
except OSError as exc:
    die(f"cannot read config file {config}: {exc}")
if subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
    die("failed to open the NVIDIA driver: is the nvidia module loaded?")
path = settings["IMEX_NODE_CONFIG_FILE"]
try:
    nodes = [l.strip() for l in open(path) if l.strip()]
except OSError:
    die(f"cannot open node config file {path}")
if not nodes:
    die(f"node config file {path} lists no nodes")
for n in nodes:
    try:
        ipaddress.ip_address(n)
    except ValueError:
        die(f"invalid IP address '{n}' in node config file {path}")
local = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
mine = [w.split("/")[0] for line in local.splitlines() for w in line.split()[3:4]]
bind = settings["BIND_INTERFACE_IP"] or next((n for n in nodes if n in mine), None)
if not bind or bind not in nodes:
    die(f"no address of this node is in the node config file {path} (local: {', '.join(mine)})")
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((bind, int(settings["SERVER_PORT"])))
srv.listen(16)
os.makedirs("/run/nvidia-imex", exist_ok=True)
json.dump({"pid": os.getpid(), "bind": bind, "port": int(settings["SERVER_PORT"]), "nodes": nodes},
          open("/run/nvidia-imex/ironlab-state.json", "w"))
print(f"IMEX: listening on {bind}:{settings['SERVER_PORT']}, {len(nodes)} nodes in {path}", flush=True)
while True:
    conn, _ = srv.accept()
    conn.sendall(f"IMEX {bind}\n".encode())
    conn.close()
'''

IMEX_CTL = r'''#!/usr/bin/python3
"""ironserve lab stand-in for nvidia-imex-ctl: -q (READY / NOT READY), -N (node connectivity)."""
import json, os, socket, sys
try:
    state = json.load(open("/run/nvidia-imex/ironlab-state.json"))
    os.kill(state["pid"], 0)
except (OSError, ValueError, KeyError):
    state = None
if "-q" in sys.argv[1:]:
    print("READY" if state else "NOT READY")
    sys.exit(0 if state else 1)
if "-N" in sys.argv[1:]:
    if not state:
        print("Connection to the local IMEX daemon failed"); sys.exit(1)
    for i, node in enumerate(state["nodes"]):
        try:
            socket.create_connection((node, state["port"]), timeout=1).close(); mark = "C"
        except OSError:
            mark = "I"
        print(f"Node #{i} - {node} - {mark}")
    sys.exit(0)
print("usage: nvidia-imex-ctl -q | -N"); sys.exit(1)
'''

IMEX_CONFIG = """# nvidia-imex configuration (ironserve lab stand-in of the packaged file)
DAEMONIZE=1
BIND_INTERFACE_IP=
SERVER_PORT=50000
IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg
IMEX_WAIT_FOR_QUORUM=RECOVERY
"""


DCGMI = r"""#!/bin/sh
# ironserve lab stand-in for dcgmi
case "$1" in
  -v|--version) echo "Version : 4.4.1"; exit 0;;
  discovery) nvidia-smi -L | sed 's/^/| /'; exit $?;;
  *) echo "dcgmi stand-in: $*"; exit 0;;
esac
"""


def build_debs(out: Path) -> list[Path]:
    lib = build_nvml(out)
    smi = _template("nvidia_smi.py", PROFILES=_profiles_json(), DRIVER=DRIVER_VERSION, CUDA=CUDA_VERSION)
    debs = [
        build_deb(
            out,
            "nvidia-open-580",
            f"{DRIVER_VERSION}-1",
            {
                "/usr/bin/nvidia-smi": (smi, 0o755),
                f"{LIBDIR}/libnvidia-ml.so.1": (lib.read_bytes(), 0o644),
                f"{LIBDIR}/libnvidia-ml.so": ("->", "libnvidia-ml.so.1"),
            },
            "NVIDIA open GPU kernel modules and driver (stand-in)",
            depends="python3",
            extra="Provides: nvidia-driver, nvidia-open, libnvidia-ml1",
            scripts={"postinst": DRIVER_POSTINST.replace("__DRIVER__", DRIVER_VERSION)},
        )
    ]
    debs.append(build_headers(out))
    debs.append(
        build_deb(
            out,
            "nvidia-imex-580",
            f"{DRIVER_VERSION}-1",
            {
                "/usr/bin/nvidia-imex": (IMEX, 0o755),
                "/usr/bin/nvidia-imex-ctl": (IMEX_CTL, 0o755),
                "/etc/nvidia-imex/config.cfg": (IMEX_CONFIG, 0o644),
                "/lib/systemd/system/nvidia-imex.service": (
                    "[Unit]\nDescription=NVIDIA IMEX service (ironserve lab stand-in)\nAfter=network-online.target\n\n"
                    "[Service]\nType=simple\nExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg\n"
                    "Restart=on-failure\nRestartSec=2\n\n[Install]\nWantedBy=multi-user.target\n",
                    0o644,
                ),
            },
            "NVIDIA IMEX service for multi-node NVLink (stand-in)",
            depends="nvidia-open-580, python3, iproute2",
        )
    )
    nvcc = (
        f'#!/bin/sh\necho "nvcc: NVIDIA (R) Cuda compiler driver"\n'
        f'echo "Copyright (c) 2005-2025 NVIDIA Corporation"\n'
        f'echo "Cuda compilation tools, release {CUDA_VERSION}, {NVCC_VERSION}"\n'
        f'echo "Build cuda_{CUDA_VERSION}.r{CUDA_VERSION}/compiler.ironlab"\n'
    )
    debs.append(
        build_deb(
            out,
            "cuda-toolkit-13-0",
            "13.0.2-1",
            {
                "/usr/local/cuda-13.0/bin/nvcc": (nvcc, 0o755),
                "/usr/local/cuda-13.0/version.json": (
                    json.dumps({"cuda": {"name": "CUDA SDK", "version": "13.0.2"}}),
                    0o644,
                ),
                "/etc/ld.so.conf.d/cuda-13-0.conf": ("/usr/local/cuda-13.0/targets/x86_64-linux/lib\n", 0o644),
            },
            "CUDA Toolkit 13.0 (stand-in)",
            scripts={
                "postinst": "[ -e /usr/local/cuda ] || ln -s /usr/local/cuda-13.0 /usr/local/cuda",
                "postrm": '[ "$(readlink /usr/local/cuda)" != /usr/local/cuda-13.0 ] || rm -f /usr/local/cuda',
            },
        )
    )
    debs.append(
        build_deb(
            out,
            "nvidia-container-toolkit",
            "1.18.0-1",
            {
                "/usr/bin/nvidia-ctk": (NVIDIA_CTK.replace("__DRIVER__", DRIVER_VERSION), 0o755),
                "/usr/bin/nvidia-container-runtime": ('#!/bin/sh\nexec runc "$@"\n', 0o755),
                "/usr/bin/nvidia-container-runtime-hook": (RUNTIME_HOOK, 0o755),
            },
            "NVIDIA container runtime hook and CLI (stand-in)",
            depends="python3",
        )
    )
    debs.append(
        build_deb(
            out,
            "nvidia-persistenced",
            f"{DRIVER_VERSION}-1",
            {
                "/usr/bin/nvidia-persistenced": (PERSISTENCED, 0o755),
                "/lib/systemd/system/nvidia-persistenced.service": (
                    "[Unit]\nDescription=NVIDIA Persistence Daemon (ironserve lab stand-in)\n\n[Service]\nType=simple\n"
                    "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose\n"
                    "\n[Install]\nWantedBy=multi-user.target\n",
                    0o644,
                ),
            },
            "NVIDIA persistence daemon (stand-in)",
            depends="nvidia-open-580",
            scripts=_unit_scripts("nvidia-persistenced.service"),
        )
    )
    debs.append(
        build_deb(
            out,
            "datacenter-gpu-manager-4-cuda13",
            "1:4.4.1-1",
            {
                "/usr/bin/dcgmi": (DCGMI, 0o755),
                "/usr/bin/nv-hostengine": ("#!/bin/sh\nexec sleep infinity\n", 0o755),
                "/lib/systemd/system/nvidia-dcgm.service": (
                    "[Unit]\nDescription=NVIDIA DCGM service (ironserve lab stand-in)\n\n[Service]\nType=simple\n"
                    "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm\n\n[Install]\nWantedBy=multi-user.target\n",
                    0o644,
                ),
            },
            "NVIDIA Datacenter GPU Manager 4 for CUDA 13 (stand-in)",
            depends="nvidia-open-580",
            scripts=_unit_scripts("nvidia-dcgm.service"),
        )
    )
    return debs


def build_headers(out: Path) -> Path:
    """linux-headers-<running kernel>: what the stand-in driver's DKMS build needs (Debian has no headers for the
    lab machine's kernel: the lab hosts share it, as containers do)."""
    release = os.uname().release
    return build_deb(
        out,
        f"linux-headers-{release}",
        "1.0-ironlab1",
        {
            f"/usr/src/linux-headers-{release}/Makefile": (f"# ironserve lab stand-in: headers of {release}\n", 0o644),
            f"/lib/modules/{release}/build": ("->", f"/usr/src/linux-headers-{release}"),
        },
        f"Header files for Linux {release} (stand-in)",
    )


def _unit_scripts(unit: str) -> dict:
    """Enable and start a unit on install, stop and disable it on removal, like the real packages do."""
    return {
        "postinst": (
            f"if [ -d /run/systemd/system ]; then systemctl daemon-reload; "
            f"systemctl enable {unit} >/dev/null 2>&1 || true; systemctl start {unit} || true; fi"
        ),
        "prerm": f"if [ -d /run/systemd/system ]; then systemctl disable --now {unit} >/dev/null 2>&1 || true; fi",
    }


RUN_HEADER = r"""#!/bin/sh
# ironserve lab stand-in for @FILE@ (self-extracting installer; accepts the real flags)
NAME="@NAME@"
VERSION="@VERSION@"
SHA256="@SHA256@"
INSTALL_PATH=/usr/local/Ascend
ACTION=""
for a in "$@"; do
    case "$a" in
        --install|--full|--run|--upgrade|--devel) ACTION=install ;;
        --uninstall) ACTION=uninstall ;;
        --check) ACTION=check ;;
        --version) ACTION=version ;;
        --install-path=*) INSTALL_PATH="${a#*=}" ;;
        --quiet|--install-for-all|--nox11|--force|--install-username=*|--install-usergroup=*) ;;
        *) echo "[ERROR] unknown option: $a" >&2; exit 1 ;;
    esac
done
payload() { tail -n +"$(awk '/^__IRONLAB_PAYLOAD__$/ {print NR + 1; exit}' "$0")" "$0"; }
case "$ACTION" in
    version) echo "$VERSION"; exit 0 ;;
    check)
        if [ "$(payload | sha256sum | cut -d' ' -f1)" = "$SHA256" ]; then
            echo "Verifying archive integrity...  100%   SHA256 checksums are OK. All good."; exit 0
        fi
        echo "Error in SHA256 checksums"; exit 1 ;;
    "") echo "usage: $0 --install|--full|--upgrade|--uninstall|--check|--version [--install-path=DIR] [--quiet]"; exit 1 ;;
esac
[ "$(id -u)" = 0 ] || { echo "[ERROR] $NAME: install as root"; exit 1; }
if [ "$ACTION" = uninstall ]; then
    rm -rf "$INSTALL_PATH/@TOP@"
    @UNINSTALL@
    echo "[INFO] $NAME uninstall success"; exit 0
fi
@PRECHECK@
mkdir -p "$INSTALL_PATH"
payload | base64 -d | tar -xzf - -C "$INSTALL_PATH" || { echo "[ERROR] $NAME: payload corrupt"; exit 1; }
for f in @SUBST@; do [ -f "$INSTALL_PATH/$f" ] && sed -i "s#@INSTALL_PATH@#$INSTALL_PATH#g" "$INSTALL_PATH/$f"; done
@POST@
echo "[INFO] $NAME $VERSION install success"
exit 0
__IRONLAB_PAYLOAD__
"""


def build_run(
    out: Path, key: str, name: str, version: str, top: str, files: dict, *, subst=(), precheck="", post="", uninstall=""
) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, (content, mode) in files.items():
            info = tarfile.TarInfo(path)
            info.mtime = 1760000000  # fixed: reproducible payloads
            if content == "->":
                info.type, info.linkname = tarfile.SYMTYPE, mode
                tar.addfile(info)
                continue
            data = content.encode() if isinstance(content, str) else content
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    payload = base64.encodebytes(buf.getvalue())
    header = RUN_HEADER
    for k, v in {
        "FILE": RUN_FILES[key],
        "NAME": name,
        "VERSION": version,
        "TOP": top,
        "SHA256": hashlib.sha256(payload).hexdigest(),
        "SUBST": " ".join(subst) or "none",
        "PRECHECK": precheck or ":",
        "POST": post or ":",
        "UNINSTALL": uninstall or ":",
    }.items():
        header = header.replace(f"@{k}@", v)
    path = out / RUN_FILES[key]
    path.write_bytes(header.encode() + payload)
    path.chmod(0o755)
    return path


def build_runs(out: Path) -> list[Path]:
    npu_smi = _template("npu_smi.py", PROFILES=_profiles_json(), VERSION=ASCEND_DRIVER_VERSION)
    version_info = (
        f"Version={ASCEND_DRIVER_VERSION}\nascendhal_version=7.35.23\npackage_version={ASCEND_DRIVER_VERSION}\n"
        "Innerversion=V100R001C25SPC001B220\ncompatible_version=[V100R001C15],[V100R001C25]\n"
    )
    driver = build_run(
        out,
        "driver",
        "Ascend-hdk-910c-npu-driver",
        ASCEND_DRIVER_VERSION,
        "driver",
        {
            "driver/version.info": (version_info, 0o644),
            "driver/tools/npu-smi": (npu_smi, 0o755),
            "driver/lib64/driver/.keep": ("", 0o644),
        },
        post=(
            'ln -sf "$INSTALL_PATH/driver/tools/npu-smi" /usr/local/sbin/npu-smi\n'
            'echo "Driver_Install_Path_Param=$INSTALL_PATH" > /etc/ascend_install.info'
        ),
        uninstall="rm -f /usr/local/sbin/npu-smi /etc/ascend_install.info",
    )
    tk_env = (
        "export ASCEND_TOOLKIT_HOME=@INSTALL_PATH@/ascend-toolkit/latest\n"
        "export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64:${ASCEND_TOOLKIT_HOME}/lib64/plugin/opskernel:"
        "@INSTALL_PATH@/driver/lib64/driver:${LD_LIBRARY_PATH}\n"
        "export PATH=${ASCEND_TOOLKIT_HOME}/bin:${ASCEND_TOOLKIT_HOME}/compiler/ccec_compiler/bin:${PATH}\n"
        "export ASCEND_AICPU_PATH=${ASCEND_TOOLKIT_HOME}\nexport ASCEND_OPP_PATH=${ASCEND_TOOLKIT_HOME}/opp\n"
        "export TOOLCHAIN_HOME=${ASCEND_TOOLKIT_HOME}/toolkit\nexport ASCEND_HOME_PATH=${ASCEND_TOOLKIT_HOME}\n"
    )
    toolkit = build_run(
        out,
        "toolkit",
        "Ascend-cann-toolkit",
        CANN_VERSION,
        "ascend-toolkit",
        {
            "ascend-toolkit/set_env.sh": (tk_env, 0o644),
            f"ascend-toolkit/{CANN_VERSION}/x86_64-linux/ascend_toolkit_install.info": (
                f"package_name=Ascend-cann-toolkit\nversion={CANN_VERSION}\narch=x86_64\nos=linux\n",
                0o644,
            ),
            f"ascend-toolkit/{CANN_VERSION}/version.cfg": (f"runtime_running_version=[{CANN_VERSION}]\n", 0o644),
            f"ascend-toolkit/{CANN_VERSION}/bin/.keep": ("", 0o644),
            f"ascend-toolkit/{CANN_VERSION}/lib64/.keep": ("", 0o644),
            "ascend-toolkit/latest": ("->", CANN_VERSION),
        },
        subst=["ascend-toolkit/set_env.sh"],
    )
    nnal_env = (
        "export ATB_HOME_PATH=@INSTALL_PATH@/nnal/atb/latest/atb/cxx_abi_1\n"
        "export LD_LIBRARY_PATH=${ATB_HOME_PATH}/lib:${ATB_HOME_PATH}/examples:${LD_LIBRARY_PATH}\n"
        "export PATH=${ATB_HOME_PATH}/bin:${PATH}\nexport ATB_STREAM_SYNC_EVERY_KERNEL_ENABLE=0\n"
    )
    nnal = build_run(
        out,
        "nnal",
        "Ascend-cann-nnal",
        CANN_VERSION,
        "nnal",
        {
            "nnal/atb/set_env.sh": (nnal_env, 0o644),
            f"nnal/atb/{CANN_VERSION}/atb/cxx_abi_1/lib/.keep": ("", 0o644),
            f"nnal/atb/{CANN_VERSION}/version.info": (f"version={CANN_VERSION}\n", 0o644),
            "nnal/atb/latest": ("->", CANN_VERSION),
        },
        subst=["nnal/atb/set_env.sh"],
        precheck=(
            '[ -f "$INSTALL_PATH/ascend-toolkit/set_env.sh" ] || { echo "[ERROR] Ascend-cann-nnal: '
            'install Ascend-cann-toolkit first (set_env.sh not found)"; exit 1; }'
        ),
    )
    firmware = build_run(
        out,
        "firmware",
        "Ascend-hdk-910c-npu-firmware",
        ASCEND_FIRMWARE_VERSION,
        "firmware",
        {
            "firmware/version.info": (f"Version={ASCEND_FIRMWARE_VERSION}\n", 0o644),
        },
        precheck=(
            '[ -f "$INSTALL_PATH/driver/version.info" ] || { echo "[ERROR] Ascend-hdk-910c-npu-firmware: '
            'install the NPU driver first"; exit 1; }'
        ),
        post='echo "[INFO] firmware takes effect after a reboot"',
    )
    return [driver, toolkit, nnal, firmware]


def publish(root: Path) -> None:
    """Build the stand-ins (once per code version) and publish them to the lab supply."""
    sup = supply.ensure_dirs(root)
    stamp = sup / ".standins"
    fp = _fingerprint()
    if stamp.exists() and stamp.read_text() == fp:
        return
    say("building stand-in packages (nvidia-smi, NVML, CUDA, the container toolkit, Ascend installers)")
    build = root / "build" / "standins"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    try:
        debs = build_debs(build)
        runs = build_runs(build)
    except LabError:
        shutil.rmtree(build, ignore_errors=True)
        raise
    for old in (sup / "apt").glob("*.deb"):  # replace earlier stand-in builds
        if "ironserve lab" in run(["dpkg-deb", "-f", str(old), "Maintainer"], check=False).stdout:
            old.unlink()
    supply.add_debs(root, debs)
    supply.add_files(root, "ascend", runs)
    stamp.write_text(fp)
