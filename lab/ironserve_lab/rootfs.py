"""The base root filesystem every lab host boots from (read-only lower layer of its overlay).

Built once per state directory with mmdebstrap (Debian bookworm, minbase + what provisioning
and tests need), then cached. mmdebstrap, not debootstrap: apt downloads in parallel and dpkg installs
in one pass, the same packages in 25-30 s instead of 50-60 s on a 2-core machine (a cold `lab up` waits for
it before anything else can be built). It bootstraps into a tmpfs where memory allows (scratch.py: dpkg's many
small files cost ext4 here 20 s more) and is copied to disk in one pass. The Debian mirror is read at run time from
this machine's own apt sources, so the lab uses whatever archive (or internal mirror) the machine is set up with.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .scratch import clear, scratch_dir
from .system import LabError, run, say, unmount_tree

SUITE = "bookworm"
# Bump when the package list or the configuration below changes: forces a rebuild.
BASE_VERSION = "4"
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "openssh-server",
    "sudo",
    "python3",
    "python3-venv",
    "ca-certificates",
    "iproute2",
    "procps",
    "curl",
    "iputils-ping",
    "netcat-openbsd",
    "less",
    "kmod",
    "gnupg",
    "lsb-release",
    "xz-utils",
]
# the bootstrap's tmpfs (scratch.py): the rootfs is 0.25 GiB, with apt's downloads and lists under 0.5
BUILD_GIB = 1
SSH_USER = "ironserve"
ASSETS = Path(__file__).parent / "assets"

# /usr merged by a hook, as debootstrap does, instead of the usrmerge package (which pulls in perl)
MERGED_USR_HOOK = Path("/usr/share/mmdebstrap/hooks/merged-usr")
SOURCES_FILES = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")


def debian_mirror(files: list[str] | None = None) -> str:
    """First Debian (non-security) archive URI from this machine's apt sources."""
    candidates: list[str] = []
    if files is None:
        files = list(SOURCES_FILES) + [str(p) for p in sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        p = Path(path)
        if not p.is_file():
            continue
        text = p.read_text(errors="replace")
        if p.suffix == ".sources":
            for stanza in text.split("\n\n"):
                fields = {}
                for line in stanza.splitlines():
                    if ":" in line and not line.lstrip().startswith("#"):
                        key, _, value = line.partition(":")
                        fields[key.strip().lower()] = value.strip()
                if "deb" in fields.get("types", "").split() and "security" not in fields.get("suites", ""):
                    candidates += fields.get("uris", "").split()
        elif p.suffix == ".list":
            for line in text.splitlines():
                parts = line.split("#")[0].split()
                if parts[:1] == ["deb"]:
                    uri = next((x for x in parts[1:] if "://" in x), "")
                    if uri and "security" not in line:
                        candidates.append(uri)
    for uri in candidates:
        if "/debian" in uri:
            return uri
    if candidates:
        return candidates[0]
    raise LabError("no Debian archive found in this machine's apt sources; cannot build the lab base")


def base_dir(root: Path) -> Path:
    return root / "base"


def build_dir(root: Path) -> Path:
    """Where the bootstrap runs (in memory where it can): gone once the rootfs is on disk."""
    return root / "base.build"


def is_built(root: Path) -> bool:
    marker = base_dir(root) / "etc" / "ironlab-base-version"
    return marker.exists() and marker.read_text().strip() == BASE_VERSION


def ensure_base(root: Path) -> Path:
    base = base_dir(root)
    if is_built(root):
        return base
    mirror = debian_mirror()
    tmp = root / "base.tmp"
    for stale in (tmp, base):  # a killed run's, its mounts first
        clear(stale)
    root.mkdir(parents=True, exist_ok=True)
    say(f"building base rootfs (first time, ~30 s): mmdebstrap {SUITE} from this machine's apt mirror")
    start = time.monotonic()
    with scratch_dir(build_dir(root), BUILD_GIB, "base rootfs") as in_memory:
        target = build_dir(root) / "rootfs"
        _bootstrap(root, target, mirror)
        say("configuring base rootfs")
        configure(target)
        if in_memory:  # to disk in one pass: the hosts' overlays stack on it for as long as the lab lives
            run(["cp", "-a", str(target), str(tmp)])
        else:
            target.rename(tmp)
    tmp.rename(base)
    say(f"base rootfs ready in {time.monotonic() - start:.0f}s ({base})")
    return base


def _bootstrap(root: Path, target: Path, mirror: str) -> None:
    log = root / "mmdebstrap.log"
    with open(log, "w") as fh:
        rc = subprocess.run(_mmdebstrap_argv(target, mirror), stdout=fh, stderr=subprocess.STDOUT).returncode
    unmount_tree(target)  # mmdebstrap mounts /proc, /sys and /dev in its target; a failed run can leave them
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise LabError(f"mmdebstrap failed (rc={rc}); see {log}\n{tail}")


def _mmdebstrap_argv(target: Path, mirror: str) -> list[str]:
    hooks = [f"--hook-dir={MERGED_USR_HOOK}"] if MERGED_USR_HOOK.is_dir() else []
    return [
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        *hooks,
        SUITE,
        str(target),
        mirror,
    ]


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def configure(rootfs: Path) -> None:
    """Turn a bootstrapped tree into a lab host template (per-host bits come later)."""
    _configure_login(rootfs)
    _configure_apt(rootfs)
    # Per-host identity is written at up; an empty machine-id here would be shared otherwise.
    _write(rootfs, "/etc/machine-id", "")
    _configure_units(rootfs)
    _write(rootfs, "/etc/ironlab-base-version", BASE_VERSION + "\n")


def _configure_login(rootfs: Path) -> None:
    """The ssh user with passwordless sudo; sshd by key only, host keys made per host."""
    run(["chroot", str(rootfs), "useradd", "--create-home", "--shell", "/bin/bash", "--groups", "sudo", SSH_USER])
    _write(rootfs, f"/etc/sudoers.d/{SSH_USER}", f"{SSH_USER} ALL=(ALL) NOPASSWD:ALL\n", 0o440)
    _write(
        rootfs,
        "/etc/ssh/sshd_config.d/ironlab.conf",
        "PasswordAuthentication no\nPermitRootLogin prohibit-password\nUseDNS no\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n",
    )
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # each host gets its own, stable across lab restarts


def _configure_apt(rootfs: Path) -> None:
    """apt with no source, no index and no cached package: the lab repository is written per host at up."""
    # The hosts are air-gapped: apt sees only the lab repository (written per host at up).
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    for lists in (rootfs / "var/lib/apt/lists").glob("*_*"):
        lists.unlink()  # the bootstrap mirror's indexes: apt knows no package until the lab repository's update
    _write(rootfs, "/etc/apt/apt.conf.d/90ironlab", 'Acquire::Languages "none";\nAPT::Install-Recommends "false";\n')
    for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


def _configure_units(rootfs: Path) -> None:
    """Offline and container-pointless units masked, the stand-in cpufreq tree at boot, multi-user by default."""
    # Units that make no sense offline or in a container; masking keeps `running` clean.
    wants = rootfs / "etc/systemd/system"
    for unit in (
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "e2scrub_all.timer",
        "e2scrub_reap.service",
        "fstrim.timer",
        "systemd-timesyncd.service",
    ):
        link = wants / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    # Writable stand-in cpufreq tree (see assets/fake-sysfs.sh).
    _write(rootfs, "/usr/local/lib/ironlab/fake-sysfs", (ASSETS / "fake-sysfs.sh").read_text(), 0o755)
    _write(
        rootfs,
        "/etc/systemd/system/ironlab-fakesys.service",
        """\
[Unit]
Description=ironserve lab: writable stand-in cpufreq tree
DefaultDependencies=no
Before=sysinit.target systemd-sysctl.service
ConditionVirtualization=container

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/lib/ironlab/fake-sysfs

[Install]
WantedBy=sysinit.target
""",
    )
    sysinit = wants / "sysinit.target.wants"
    sysinit.mkdir(parents=True, exist_ok=True)
    (sysinit / "ironlab-fakesys.service").unlink(missing_ok=True)
    (sysinit / "ironlab-fakesys.service").symlink_to("/etc/systemd/system/ironlab-fakesys.service")
    default = wants / "default.target"
    default.unlink(missing_ok=True)
    default.symlink_to("/lib/systemd/system/multi-user.target")
