"""Lab hosts: an overlayfs root per host over the shared base, booted with systemd-nspawn.

Each host is `systemd-nspawn -b` with:
- its own network namespace (prepared by network.py), joined with --network-namespace-path;
- --register=no --keep-unit, started from a shell that first moves itself into the host's
  own cgroup (cgroups.py), since this machine's PID 1 is not systemd (no machined);
- SYSTEMD_NSPAWN_API_VFS_WRITABLE=network, so the host may tune its own netns sysctls;
- stand-in sysctl files (vm.*, kernel.numa_balancing) bind-mounted over /proc/sys, so
  `sysctl -w` and systemd-sysctl work inside the host while the real kernel never changes.
  The bind sources are paths inside the container: nspawn mounts below /proc in the
  container after chroot, so a host path would not be found there;
- read-only binds of this machine's paths (images.py): the stand-in model checkpoints (<lab dir>/models at
  /srv/models). Recorded in <host dir>/binds.json: a host kept running by a later `up` keeps the binds it
  booted with;
- what a real Docker engine needs inside a host (dockerd, containerd and runc from Debian, installed by the
  production role): every capability (--capability=all: bridges, iptables, overlay mounts), the keyring and
  bpf syscalls nspawn's filter drops (runc joins a session keyring; cgroup v2 device rules are bpf programs),
  the unified cgroup hierarchy (SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1: this machine's v1 controllers are read-only
  in a container, cgroup v2 is delegated to the host's systemd), and /var/lib/docker on a directory of this
  machine's own filesystem (<host dir>/docker, bound read-write): overlay2 cannot stack on the host's overlay
  root. All of it goes away with the host (`lab down` removes <host dir>).

Each host's directory (its overlay's upper layer, /var/lib/docker, console log) is a filesystem of its own: a
sparse ext4 image (<hosts dir>/<name>.ext4) loop-mounted at <host dir> without online discard. Removing a host
is then an unmount and one unlink, not the kernel unlinking (and discarding) every file of its venvs and image
layers one by one, which took most of a `lab down` (16-19 s per host with an SGLang venv or image). Where loop
devices cannot be had, the host directory is a plain directory, as before.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import cgroups, cpu_runtime, network, supply
from .profiles import PROFILES
from .state import GATEWAY, Host, LabState
from .system import LabError, run, say, unmount_tree, wait_for

FAKE_PROC = "/var/lib/ironlab/fakeproc"  # inside the host
# kernel.* keys made writable when the running kernel has them (a key the kernel lacks, such as
# sched_migration_cost_ns on 5.13+, stays absent, exactly as on a real host with that kernel).
FAKE_KERNEL_KEYS = ("numa_balancing", "sched_migration_cost_ns", "sched_autogroup_enabled")
DOCKER_DATA = "/var/lib/docker"  # inside the host: a directory of this machine's filesystem (overlay2 needs one)
DOCKER_SYSCALLS = ("add_key", "keyctl", "bpf")  # nspawn's filter drops them; runc needs them


HOST_DISK_MAX = 64 * 2**30  # sparse: a host's disk takes only what it writes (an SGLang venv or image: ~4 GiB)
HOST_DISK_MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1"]
# noinit_itable: no background zeroing of the inode tables (GBs of writes for a disk thrown away at down).
# barrier=0: a host's fsync (dpkg syncs every file it unpacks; journald, dockerd and the engines sync too) stays in
# this machine's page cache instead of flushing the lab machine's own disk through the loop device: 0.2 ms instead
# of 3 ms each, measured here. The disk is scratch (thrown away at down); after a crash of this machine a host whose
# disk no longer mounts gets a new one (_mount_disk), one that mounts but lost writes is rebuilt by `down` + `up`.
HOST_DISK_MOUNT = "loop,nodiscard,noatime,noinit_itable,barrier=0"


def host_dir(root: Path, name: str) -> Path:
    return root / "hosts" / name


def disk_image(root: Path, name: str) -> Path:
    return root / "hosts" / f"{name}.ext4"


def rootfs(root: Path, name: str) -> Path:
    return host_dir(root, name) / "root"


def _mount_source(path: Path) -> str | None:
    """What is mounted at ``path`` (its device or filesystem name in /proc/mounts), None when nothing is."""
    for line in Path("/proc/mounts").read_text().splitlines():
        source, target = line.split()[:2]
        if target == str(path):
            return source
    return None


def _mounted(path: Path) -> bool:
    return _mount_source(path) is not None


def _write(rootdir: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = rootdir / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".ironlab-tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def etc_hosts(state: LabState) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{GATEWAY}\tironlab-supply"]
    lines += [f"{h.address}\t{h.name}" for h in state.hosts]
    return "\n".join(lines) + "\n"


def ensure_host_key(root: Path, name: str) -> Path:
    """A stable ed25519 host key per host name, so known_hosts survives down/up."""
    key = root / "ssh" / "hostkeys" / name
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])
    return key


def _ids(merged: Path, user: str) -> tuple[int, int]:
    for line in (merged / "etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user:
            return int(parts[2]), int(parts[3])
    raise LabError(f"user {user} missing from the base rootfs")


def _new_disk(image: Path) -> bool:
    image.unlink(missing_ok=True)
    with open(image, "wb") as disk:
        disk.truncate(min(HOST_DISK_MAX, shutil.disk_usage(image.parent).total))
    return run([*HOST_DISK_MKFS, str(image)], check=False).returncode == 0


def _direct_io(hdir: Path) -> None:
    """The loop device under ``hdir`` reads and writes its image file directly (O_DIRECT), not through this
    machine's page cache as well as the host's own: every byte a host writes (image layers, venvs) was copied and
    cached twice. Measured here: a host's pull of the parser image took 31 CPU-s instead of 36, and a reinstall of
    docker.io (dpkg syncs each file) was no slower. Where the image's filesystem refuses O_DIRECT it stays buffered."""
    device = _mount_source(hdir) or ""
    if device.startswith("/dev/loop"):
        run(["losetup", "--direct-io=on", device], check=False)


def _mount_disk(root: Path, name: str) -> None:
    """<host dir> on the host's own loop-mounted ext4 image: the one it has (a host kept over a reboot of this
    machine), else a new one; where neither mounts, a plain directory."""
    hdir, image = host_dir(root, name), disk_image(root, name)
    hdir.mkdir(parents=True, exist_ok=True)
    if _mounted(hdir) or any(hdir.iterdir()):  # mounted, or a plain host directory in use: kept as it is
        return

    def mounted() -> bool:
        if run(["mount", "-o", HOST_DISK_MOUNT, str(image), str(hdir)], check=False).returncode != 0:
            return False
        _direct_io(hdir)
        return True

    if (image.exists() and mounted()) or (_new_disk(image) and mounted()):
        return
    image.unlink(missing_ok=True)
    say(f"warning: no loop device for {name}'s disk: its files live in {hdir} (a down unlinks them one by one)")


def prepare(root: Path, base: Path, state: LabState, host: Host, pubkey: str) -> None:
    hdir = host_dir(root, host.name)
    merged = rootfs(root, host.name)
    _mount_disk(root, host.name)
    for sub in ("upper", "work", "root", "docker"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    if not _mounted(merged):
        run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={base},upperdir={hdir / 'upper'},workdir={hdir / 'work'}",
                str(merged),
            ]
        )
    _write(merged, "/etc/hostname", host.name + "\n")
    _write(merged, "/etc/hosts", etc_hosts(state))
    # Empty resolv.conf: no DNS exists here; anything else makes sudo and ssh stall on lookups.
    _write(merged, "/etc/resolv.conf", "")
    mid = merged / "etc/machine-id"
    if not mid.exists() or not mid.read_text().strip():
        _write(merged, "/etc/machine-id", secrets.token_hex(16) + "\n", 0o444)
    key = ensure_host_key(root, host.name)
    _write(merged, "/etc/ssh/ssh_host_ed25519_key", key.read_text(), 0o600)
    _write(merged, "/etc/ssh/ssh_host_ed25519_key.pub", key.with_suffix(".pub").read_text())
    for home, owner in (("/root", None), (f"/home/{state.ssh_user}", state.ssh_user)):
        _write(merged, f"{home}/.ssh/authorized_keys", pubkey, 0o600)
        (merged / home.lstrip("/") / ".ssh").chmod(0o700)
        if owner:
            uid, gid = _ids(merged, owner)
            for path in (merged / home.lstrip("/") / ".ssh", merged / home.lstrip("/") / ".ssh/authorized_keys"):
                os.chown(path, uid, gid)
    _write(merged, "/etc/ironlab/hardware", host.hardware + "\n")
    _write(merged, "/etc/ironlab/node_index", f"{host.node_index}\n")
    if PROFILES.get(host.hardware, {}).get("kind") == "nvidia":
        # a fresh OS on a GPU host boots with nouveau bound to the cards: the stand-in driver refuses to load
        # until /etc/modprobe.d blacklists it (assets/nvidia_smi.py)
        _write(merged, "/etc/ironlab/nouveau", "nouveau bound to the GPUs at boot (lab stand-in state)\n")
    # Air-gapped supply: the lab mirror is the only package source (mirror URLs are data).
    keyring = supply.keyring(root)
    if keyring and state.apt_signed_by:
        _write(merged, state.apt_signed_by, "")
        (merged / state.apt_signed_by.lstrip("/")).write_bytes(keyring.read_bytes())
        option = f"signed-by={state.apt_signed_by}"
    else:
        option = "trusted=yes"
    _write(merged, "/etc/apt/sources.list.d/ironlab.list", f"deb [{option}] {state.apt_mirror} ./\n")
    host_part = state.pip_index.split("//", 1)[1].split("/", 1)[0].split(":")[0]
    _write(merged, "/etc/pip.conf", f"[global]\nindex-url = {state.pip_index}\ntrusted-host = {host_part}\n")
    if PROFILES.get(host.hardware, {}).get("kind") == "none":
        # cpu-lab: uv's system configuration keeps the CUDA-only distributions out of resolution and takes
        # the CPU build of torch (lab runtime, not product: see cpu_runtime.uv_config)
        _write(merged, "/etc/uv/uv.toml", cpu_runtime.uv_config())
    _prepare_fake_proc(merged)


def _prepare_fake_proc(merged: Path) -> None:
    """Snapshot the real vm.* values (first boot only) into writable stand-in files."""
    vm = merged / FAKE_PROC.lstrip("/") / "vm"
    if not vm.exists():
        vm.mkdir(parents=True)
        for src in Path("/proc/sys/vm").iterdir():
            try:
                value = src.read_text()
            except OSError:  # write-only knobs (drop_caches, compact_memory)
                value = ""
            (vm / src.name).write_text(value)
    kernel = merged / FAKE_PROC.lstrip("/") / "kernel"
    kernel.mkdir(parents=True, exist_ok=True)
    for key in FAKE_KERNEL_KEYS:
        real, fake = Path("/proc/sys/kernel") / key, kernel / key
        if real.exists() and not fake.exists():
            fake.write_text(real.read_text())


def nspawn_command(root: Path, host: Host, binds: list[tuple[str, str]] | None = None) -> list[str]:
    """binds: (path on this machine, path in the host) pairs mounted read-only."""
    merged = rootfs(root, host.name)
    cmd = [
        "systemd-nspawn",
        "--boot",
        f"--directory={merged}",
        f"--machine={host.name}",
        f"--network-namespace-path={network.netns_path(host.name)}",
        "--register=no",
        "--keep-unit",
        "--console=read-only",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        f"--bind={FAKE_PROC}/vm:/proc/sys/vm",
        # a real Docker engine inside (see the module docstring)
        "--capability=all",
        f"--system-call-filter={' '.join(DOCKER_SYSCALLS)}",
        f"--bind={host_dir(root, host.name) / 'docker'}:{DOCKER_DATA}",
    ]
    for key in FAKE_KERNEL_KEYS:
        if (merged / FAKE_PROC.lstrip("/") / "kernel" / key).exists():
            cmd.append(f"--bind={FAKE_PROC}/kernel/{key}:/proc/sys/kernel/{key}")
    for src, dst in binds or []:
        if ":" in src or ":" in dst:
            raise LabError(f"cannot bind {src} into lab hosts: nspawn bind paths cannot contain ':'")
        cmd.append(f"--bind-ro={src}:{dst}")
    return cmd


def booted_binds(root: Path, name: str) -> list[tuple[str, str]] | None:
    """The read-only binds a running host was booted with (None: unknown, booted by an older lab)."""
    try:
        return [tuple(b) for b in json.loads((host_dir(root, name) / "binds.json").read_text())]
    except (OSError, ValueError):
        return None


def pid_of(root: Path, name: str) -> int | None:
    """PID of the host's systemd-nspawn if it is running."""
    pidfile = host_dir(root, name) / "nspawn.pid"
    try:
        pid = int(pidfile.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if cmdline and cmdline[0].endswith(b"systemd-nspawn") and f"--machine={name}".encode() in cmdline:
        return pid
    return None


def leader_of(nspawn_pid: int) -> int | None:
    """PID of the host's init (the nspawn child)."""
    try:
        for task in Path(f"/proc/{nspawn_pid}/task").iterdir():
            children = (task / "children").read_text().split()
            if children:
                return int(children[0])
    except OSError:
        return None
    return None


def spawn(root: Path, host: Host, binds: list[tuple[str, str]] | None = None) -> int:
    hdir = host_dir(root, host.name)
    (hdir / "binds.json").write_text(json.dumps([list(b) for b in binds or []]) + "\n")
    paths = cgroups.create(host.name)
    # The shell moves itself into the host's cgroups, then becomes systemd-nspawn.
    moves = "; ".join(f"echo $$ > {p}/cgroup.procs" for p in paths)
    script = f'{moves}; exec "$@"'
    env = {**os.environ, "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "network", "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    with open(hdir / "console.log", "ab") as log:
        proc = subprocess.Popen(
            ["sh", "-c", script, "sh", *nspawn_command(root, host, binds)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    (hdir / "nspawn.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def in_host(root: Path, name: str, cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command inside a host through its namespaces (no SSH needed)."""
    pid = pid_of(root, name)
    leader = leader_of(pid) if pid else None
    if not leader:
        raise LabError(f"host {name} is not running")
    return subprocess.run(
        ["nsenter", "-t", str(leader), "-m", "-u", "-i", "-n", "-p", *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_running(root: Path, name: str, timeout: float = 120) -> None:
    """Wait until the host's systemd reports `running`; explain what failed otherwise."""
    deadline = time.monotonic() + timeout
    wait_for(lambda: pid_of(root, name) and leader_of(pid_of(root, name)), 30, what=f"{name} to start")
    state = ""
    while time.monotonic() < deadline:
        if not pid_of(root, name):
            log = (host_dir(root, name) / "console.log").read_text(errors="replace")[-2000:]
            raise LabError(f"host {name} exited during boot; console:\n{log}")
        try:
            proc = in_host(root, name, ["systemctl", "is-system-running"], timeout=10)
            state = proc.stdout.strip()
        except (subprocess.TimeoutExpired, LabError):
            state = "unreachable"
        if state == "running":
            return
        if state in ("degraded", "maintenance"):
            failed = in_host(root, name, ["systemctl", "--failed", "--no-legend", "--plain"]).stdout
            raise LabError(f"host {name} booted {state}; failed units:\n{failed}")
        time.sleep(0.2)
    raise LabError(f"host {name} did not reach systemd 'running' in {timeout:.0f}s (last: {state!r})")


def stop(root: Path, name: str, timeout: float = 20) -> None:
    """Orderly poweroff (SIGTERM makes nspawn halt the container), then force, then clean up."""
    t0 = time.monotonic()
    pid = pid_of(root, name)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_of(root, name) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_of(root, name):
            say(f"{name}: did not halt in {timeout:.0f}s, killing")
            os.kill(pid, signal.SIGKILL)
    halted = time.monotonic()
    cgroups.kill_all(name)
    wait_for(lambda: not any(cgroups.pids(p) for p in cgroups.host_cgroups(name)), 10, what=f"{name} processes to exit")
    exited = time.monotonic()
    hdir = host_dir(root, name)
    unmount_tree(hdir)
    unmounted = time.monotonic()
    cgroups.remove(name)
    network.remove_netns(name)
    # nspawn's per-machine propagation directory (left behind when it is killed).
    shutil.rmtree(f"/run/systemd/nspawn/propagate/{name}", ignore_errors=True)
    shutil.rmtree(hdir, ignore_errors=True)  # empty once its disk is unmounted (else: every file of the host)
    disk_image(root, name).unlink(missing_ok=True)
    done = time.monotonic()
    say(
        f"{name}: stopped in {done - t0:.1f}s (halt {halted - t0:.1f}s, processes {exited - halted:.1f}s, "
        f"unmount {unmounted - exited:.1f}s, files {done - unmounted:.1f}s)"
    )
