"""up / status / down: the lab's lifecycle, tying rootfs, network, hosts and supply together."""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from . import (
    cgroups,
    cpu_runtime,
    cuda_runtime,
    gpu_images,
    hosts,
    hub,
    images,
    interpreters,
    needs,
    network,
    npu_runtime,
    oci,
    pinfiles,
    registry,
    rootfs,
    runtime,
    runtime_image,
    scratch,
    standins,
    state,
    supply,
    tiny_model,
)
from .profiles import HARDWARE_IDS, PROFILES
from .state import Host, LabState
from .system import LabError, ensure_inotify, ensure_tools, require_root, run, say, wait_for

# Real Debian packages published to the lab repo on every `up`: what tests use, and what the roles install
# (python3-venv: gpu_clocks; ca-certificates, curl, gpg: nvidia_driver's key fetch; python3-pip: uv_env runs
# `python3 -m pip`). Packages the base rootfs already has add nothing; the rest come with their dependencies.
# Debian's Docker engine (docker.io with containerd, runc, iptables as dependencies) for the docker recipes, and
# docker-registry, which the lab's registry runs (registry.py); prometheus-node-exporter, which every deploy
# installs (roles/node_exporter.py).
DEFAULT_DEBS = [
    "jq",
    "numactl",
    "pciutils",
    "python3-venv",
    "ca-certificates",
    "curl",
    "gpg",
    "python3-pip",
    "docker.io",
    "docker-registry",
    "prometheus-node-exporter",
]
# Wheel requirements published to the lab index on every `up`, each resolved on its own (requirements/index.txt:
# what the roles install beside the runtimes)
DEFAULT_WHEELS = pinfiles.read("index.txt")
UV_VERSION = pinfiles.version(DEFAULT_WHEELS, "uv")  # host data uv_version's default (roles/uv_env.py installs it)
# Where the lab index's own wheels are fetched to (under <lab dir>/build) before the main thread publishes them
INDEX_STAGING = "index-wheels"
# The lab's runtimes: each published for the hosts of its hardware profiles (runtime.py)
RUNTIMES: tuple[runtime.LabRuntime, ...] = (cpu_runtime.RUNTIME, npu_runtime.RUNTIME, cuda_runtime.RUNTIME)
# cpu-lab: the generated model's directory under the lab's model_root (recipes/tiny-cpu.yaml model.path's name)
TINY_MODEL = "tiny-llama"


def ssh_keypair(root: Path) -> Path:
    key = root / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(key.parent, 0o700)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ironserve-lab", "-f", str(key)])
    key.chmod(0o600)
    return key


def write_known_hosts(root: Path, lab: LabState) -> Path:
    path = root / "ssh" / "known_hosts"
    lines = []
    for h in lab.hosts:
        pub = (root / "ssh" / "hostkeys" / f"{h.name}.pub").read_text().split()
        lines.append(f"{h.name},{h.address} {pub[0]} {pub[1]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _ssh_ok(lab: LabState, host: Host) -> bool:
    proc = run(["ssh", *ssh_options(lab), f"{lab.ssh_user}@{host.address}", "true"], check=False, timeout=15)
    return proc.returncode == 0


def ssh_options(lab: LabState) -> list[str]:
    return [
        "-i",
        lab.ssh_key,
        "-o",
        f"UserKnownHostsFile={lab.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "LogLevel=ERROR",
    ]


@contextmanager
def _locked(root: Path):
    """One lab command at a time per state directory (a second `up` waits for the first)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lab.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another lab command is running; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def up(
    nodes: int, hardware: str | None = None, for_names: tuple[str, ...] = (), plus: tuple[tuple[str, int], ...] = ()
) -> LabState:
    """``nodes`` hosts of ``hardware`` (lab1..), then, for a mixed lab, each (profile, count) of ``plus`` in turn."""
    require_root()
    with _locked(state.lab_dir()):
        return _up(nodes, hardware, for_names, plus)


def build(nodes: int, hardware: str | None = None, plus: tuple[tuple[str, int], ...] = ()) -> list[str]:
    """What an ``up`` of this plan builds once per machine, built now into this machine's caches with no lab touched
    (no state, index, registry, bridge or host): the runtimes' wheelhouses, the CPU runtime or parser image, the
    stand-in images' own layers. Beside a running lab (scripts/test: during the cpu-lab stage, for the mixed lab after
    it) the later ``up`` then only publishes and boots. What it built, in the order built."""
    require_root()
    root = state.lab_dir()
    plan = host_plan(nodes, hardware or (state.load(root) or LabState()).hardware, plus)
    wanted = [needs.resolve(profile, []) for profile, _ in plan]
    ensure_tools()
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):  # the base rootfs is the lab's own: built under its lock when missing, else found at once
        base = rootfs.ensure_base(root)
    t0, built = time.monotonic(), []
    for r in dict.fromkeys([*_first_runtimes(wanted), *_runtimes(wanted)]):
        built.append(f"the {r.name} wheelhouse ({runtime.ensure(r)})")
    if _wants_cpu_image(wanted):
        built.append(f"the CPU runtime image ({runtime_image.ensure(base, runtime.ensure(cpu_runtime.RUNTIME))[0]})")
    gpu = _gpu_recipes(wanted)
    if gpu:
        parser = _parser_image(base, gpu)
        built += [f"the stand-in images' layers ({len(gpu_images.wanted(gpu))})", f"the parser image ({parser})"]
    plan_text = " + ".join(f"{profile}:{count}" for profile, count in plan)
    say(f"caches ready for {plan_text} ({time.monotonic() - t0:.0f}s): {'; '.join(built)}")
    return built


def host_plan(nodes: int, hardware: str, plus: tuple[tuple[str, int], ...] = ()) -> list[tuple[str, int]]:
    """The lab's hosts as (profile, count) in host order; LabError naming a count or profile that cannot be."""
    if nodes < 1:
        raise LabError("--nodes must be at least 1")
    plan = [(hardware, nodes), *plus]
    for profile, count in plan:
        if profile not in HARDWARE_IDS:
            raise LabError(f"unknown hardware {profile!r}; one of {', '.join(HARDWARE_IDS)}")
        if count < 1:
            raise LabError(f"--plus {profile}:{count}: at least 1 host")
    if sum(count for _, count in plan) > state.MAX_HOSTS:
        raise LabError(f"at most {state.MAX_HOSTS} hosts in a lab")
    return plan


def _up(
    nodes: int, hardware: str | None = None, for_names: tuple[str, ...] = (), plus: tuple[tuple[str, int], ...] = ()
) -> LabState:
    root = state.lab_dir()
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    lab = state.load(root) or LabState()
    hardware = hardware or lab.hardware
    plan = host_plan(nodes, hardware, plus)
    if plus and for_names:
        raise LabError("--for builds for one profile; a mixed lab (--plus) builds everything its profiles use")
    # bad names refused before anything is built
    wanted = [needs.resolve(hardware, list(for_names)), *(needs.resolve(profile, []) for profile, _ in plus)]
    ensure_tools()
    _say_needs(wanted[0])
    lab.built_for = None if plus else _built_for(lab, wanted[0])
    with ThreadPoolExecutor(max_workers=1) as beside:
        # One after another beside the rootfs bootstrap (downloads, then dpkg on one core): the wheelhouses the others
        # are built from (downloads), the lab index's own wheels (pip resolving them), this machine's CPython builds
        # packed for the hosts (gzip). None of them writes the lab index: this thread alone does.
        first = beside.submit(lambda: [runtime.ensure(r) for r in _first_runtimes(wanted)])
        fetched = beside.submit(_fetch_index_wheels, root, wanted)
        pythons = beside.submit(publish_interpreters, root)
        base = rootfs.ensure_base(root)
        key = ssh_keypair(root)
        lab.hardware, lab.ssh_key = hardware, str(key)
        _publish_supply(root)
        first.result()
        for stamp, text, files in fetched.result():
            supply.add_wheels(root, files)  # hard links: the staging directory goes
            stamp.write_text(text)
        shutil.rmtree(root / "build" / INDEX_STAGING, ignore_errors=True)
        lab.python_downloads = pythons.result()
    _build_runtimes(root, lab, wanted, base)
    binds = _publish_to_hosts(root, lab, [profile for profile, _ in plan])
    _size_hosts(root, lab, plan)
    return _boot(root, lab, base, key, binds, t0)


def _publish_supply(root: Path) -> None:
    """The lab's apt repository and wheel index, before any host boots: hosts find their mirrors as they start."""
    say("preparing lab supply (apt repo, wheelhouse, stand-ins)")
    network.ensure_bridge()
    supply.ensure_dirs(root)
    standins.publish(root)
    stamp = supply.supply_dir(root) / ".debs"
    if not stamp.exists() or stamp.read_text() != " ".join(DEFAULT_DEBS):
        say(f"publishing Debian packages to the lab repo: {' '.join(DEFAULT_DEBS)}")
        supply.publish_debs(root, DEFAULT_DEBS)
        stamp.write_text(" ".join(DEFAULT_DEBS))
    if not (supply.supply_dir(root) / "simple" / "index.html").exists():
        supply.reindex_wheels(root)
    if not (supply.supply_dir(root) / "apt" / supply.ARMORED_KEY_NAME).exists():
        supply.reindex_apt(root)  # (re)sign a repo built before signing existed or without gpg then


def _fetch_index_wheels(root: Path, wanted: needs.Needs | list[needs.Needs]) -> list[tuple[Path, str, list[Path]]]:
    """The wheels the lab index lacks, fetched: (the stamp recording them, its text, the files) for the roles' own
    (requirements/index.txt, each resolved on its own) and the pins the recipes' image patches pip-install
    (stand-ins for the CUDA builds, gpu_images.patch_wheels; the others downloaded)."""
    sup, staging = supply.ensure_dirs(root), root / "build" / INDEX_STAGING
    shutil.rmtree(staging, ignore_errors=True)  # a killed up's
    patches = sorted({req for r in _gpu_recipes(wanted) for req in patch_requirements(r.runtime.patches)})
    fetched: list[tuple[Path, str, list[Path]]] = []
    for stamp, requirements in ((sup / ".wheels", DEFAULT_WHEELS), (sup / ".patch-wheels", patches)):
        text = " ".join(requirements)
        if not requirements or (stamp.exists() and stamp.read_text() == text):
            continue
        t0 = time.monotonic()
        # the patches' CUDA builds are stand-ins built here; every other requirement is downloaded
        standins, real = gpu_images.patch_wheels(requirements, staging / f"{stamp.name[1:]}-standins")
        fetched.append((stamp, text, standins + supply.fetch_wheels(real, staging / stamp.name[1:])))
        say(f"wheels for the lab index fetched: {text} ({time.monotonic() - t0:.1f}s)")
    return fetched


def _each(wanted: needs.Needs | list[needs.Needs]) -> list[needs.Needs]:
    """A bring-up's needs, one per profile (a mixed lab has several)."""
    return wanted if isinstance(wanted, list) else [wanted]


def _gpu_recipes(wanted: needs.Needs | list[needs.Needs]) -> list:
    """The docker recipes a bring-up of NVIDIA profiles gets stand-in images for (one site lock names them all)."""
    nvidia = [w for w in _each(wanted) if PROFILES[w.hardware]["kind"] == "nvidia"]
    return [r for r in images.docker_recipes() if any(w.uses(r) for w in nvidia)]


def _say_needs(wanted: needs.Needs) -> None:
    """What a bring-up for some recipes leaves out of the profile's runtimes and images."""
    if wanted.everything:
        return
    hardware = wanted.hardware
    published = _runtimes(wanted)
    left = [f"the {r.name} wheelhouse" for r in RUNTIMES if hardware in r.hardware and r not in published]
    if PROFILES[hardware]["kind"] in ("none", "nvidia") and not wanted.runtime_image():
        left.append("the CPU runtime image" if PROFILES[hardware]["kind"] == "none" else "the parser image")
    others = [r for r in images.docker_recipes() if hardware in r.hardware and not wanted.uses(r)]
    used = {r.runtime.image for r in wanted.recipes if r.runtime.kind == "docker"}
    skipped = sorted({r.runtime.image for r in others} - used)
    if skipped:
        left.append(f"stand-in images {', '.join(skipped)}")
    say(f"building for {', '.join(wanted.ids())} only (--for); not built: {'; '.join(left) or 'nothing'}")


def _runtimes(wanted: needs.Needs | list[needs.Needs]) -> list[runtime.LabRuntime]:
    """The runtimes a bring-up publishes: those its recipes install; on cpu-lab, the CPU runtime with its image."""

    def used(w: needs.Needs, r: runtime.LabRuntime) -> bool:
        image_of_cpu = w.runtime_image() and w.hardware in cpu_runtime.RUNTIME.hardware
        return w.runtime(r) or (image_of_cpu and r is cpu_runtime.RUNTIME)

    return [r for r in RUNTIMES if any(used(w, r) for w in _each(wanted))]


def _wants_cpu_image(wanted: needs.Needs | list[needs.Needs]) -> bool:
    """cpu-lab's docker recipes run the CPU runtime image (NVIDIA profiles' stand-ins sit on the parser image)."""
    return any(w.runtime_image() and PROFILES[w.hardware]["kind"] == "none" for w in _each(wanted))


def _first_runtimes(wanted: needs.Needs | list[needs.Needs]) -> list[runtime.LabRuntime]:
    """The runtimes whose wheelhouses the others and the CPU runtime or parser image are built from; every one when
    no image is built (nothing else to build them beside but the rootfs bootstrap)."""
    if not any(w.runtime_image() for w in _each(wanted)):
        return _runtimes(wanted)
    return list(dict.fromkeys([d for r in _runtimes(wanted) for d in r.requires] + [cpu_runtime.RUNTIME]))


def _built_for(lab: LabState, wanted: needs.Needs) -> list | None:
    """What the lab has been brought up for: this `up`'s recipes, with those of earlier ones of the same lab."""
    same_lab = bool(lab.hosts) and lab.hardware == wanted.hardware
    if wanted.everything or (same_lab and lab.built_for is None):
        return None
    earlier = lab.built_for if same_lab else []
    return list(dict.fromkeys([*earlier, *wanted.ids()]))


def _build_runtimes(root: Path, lab: LabState, wanted_for: list[needs.Needs], base: Path) -> None:
    """The runtimes needed (wheelhouses, the CPU runtime or parser image, the GPU images), the servers that publish
    them."""
    cpu_image = _wants_cpu_image(wanted_for)
    wanted = _runtimes(wanted_for)
    first = _first_runtimes(wanted_for)  # built by _up, beside the rootfs bootstrap
    # The other wheelhouses (mostly downloads) are built beside the runtime images (mostly CPU): a cold `up` waits for
    # the longer of the two, not their sum. Only builds run beside: the lab index is written from this thread alone.
    with ThreadPoolExecutor(max_workers=1) as beside:
        built = [beside.submit(runtime.ensure, r) for r in wanted if r not in first]
        supply.start_server(root)
        registry.start_server(root)
        lab.registry, lab.registry_ca = registry.address(), str(registry.ca_file(root))
        if cpu_image:
            publish_runtime_image(root, base)  # cpu-lab's docker recipes run it; the stand-ins are pushed below
        gpu = _gpu_recipes(wanted_for)
        lab.image_lock = publish_gpu_images(root, base, gpu) if gpu else ""
        for done in built:
            done.result()
    for r in wanted:
        runtime.publish(root, r)


def _publish_to_hosts(root: Path, lab: LabState, profiles: list[str]) -> list:
    """What the hosts are told of the supply (apt key, Ascend sums), the images they mount, the lab hub; the binds."""
    lab.apt_signed_by = supply.HOST_KEYRING if supply.keyring(root) else ""
    lab.apt_key_fingerprint = supply.key_fingerprint(root)
    lab.ascend_sha256 = supply.file_sums(root, "ascend")
    binds = _images(root, lab, profiles)
    repos = hub.served_repos(images.models_dir(root), list(lab.models))
    lab.hub_url = hub.start_server(root, repos) if repos else ""
    if not repos:
        hub.stop_server(root)
    return binds


def _size_hosts(root: Path, lab: LabState, plan: list[tuple[str, int]]) -> None:
    """The lab's hosts made those of ``plan`` (hosts beyond stopped, highest first; each its profile), their keys,
    known_hosts, the state."""
    profiles = [profile for profile, count in plan for _ in range(count)]
    nodes = len(profiles)
    for h in sorted((h for h in lab.hosts if h.node_index > nodes), key=lambda h: -h.node_index):
        say(f"stopping {h.name} (lab now has {nodes} hosts)")
        hosts.stop(root, h.name)
    existing = {h.node_index: h for h in lab.hosts if h.node_index <= nodes}
    lab.hosts = [
        existing.get(i) or Host(state.host_name(i), state.host_address(i), i, profiles[i - 1])
        for i in range(1, nodes + 1)
    ]
    for h in lab.hosts:
        h.hardware = profiles[h.node_index - 1]
        hosts.ensure_host_key(root, h.name)
    lab.known_hosts = str(write_known_hosts(root, lab))
    state.save(lab, root)


def _boot(root: Path, lab: LabState, base: Path, key: Path, binds: list, t0: float) -> LabState:
    """Every host prepared (running ones get the new /etc/hosts and hardware), the new ones booted, ssh on all."""
    pubkey = key.with_suffix(".pub").read_text()
    to_boot = [h for h in lab.hosts if not hosts.pid_of(root, h.name)]
    kept = len(lab.hosts) - len(to_boot)
    say(
        f"{'booting ' + str(len(to_boot)) if to_boot else 'no new'} host(s)"
        f"{f', keeping {kept} running' if kept else ''}"
    )
    for h in lab.hosts:  # running hosts get the new /etc/hosts and hardware too
        network.ensure_netns(h.name, h.address)
        hosts.prepare(root, base, lab, h, pubkey)
        booted = hosts.booted_binds(root, h.name) if h not in to_boot else binds
        if booted != binds:
            say(
                f"warning: {h.name} keeps running with the mounts it booted with (parser venvs, checkpoints); "
                "`ironserve lab down` and `up` to give it the current ones"
            )
    ensure_inotify(len(lab.hosts))
    t_boot = time.monotonic()
    for h in to_boot:
        hosts.spawn(root, h, binds)

    def ready(h: Host) -> None:
        hosts.wait_running(root, h.name)
        wait_for(lambda: _ssh_ok(lab, h), 60, interval=0.5, what=f"ssh on {h.name}")

    with ThreadPoolExecutor(max_workers=max(1, len(lab.hosts))) as pool:
        for fut in [pool.submit(ready, h) for h in lab.hosts]:
            fut.result()
    say(
        f"{len(lab.hosts)} host(s) up: systemd running, ssh ok "
        f"(boot {time.monotonic() - t_boot:.1f}s, total {time.monotonic() - t0:.1f}s)"
    )
    for h in lab.hosts:
        say(f"  {h.name}  {h.address}  ssh -i {lab.ssh_key} {lab.ssh_user}@{h.address}")
    return lab


def reset(name: str) -> LabState:
    """Replace one host with a fresh OS: same name, address, host key and hardware, nothing of ironserve on it
    (its overlay's upper layer is thrown away), the other hosts and the supply left running. Rebuilding it is
    the production deploy with --limit HOST."""
    require_root()
    with _locked(state.lab_dir()):
        root = state.lab_dir()
        lab = state.load(root)
        host = next((h for h in (lab.hosts if lab else []) if h.name == name), None)
        if host is None:
            known = ", ".join(h.name for h in lab.hosts) if lab and lab.hosts else "none: the lab is down"
            raise LabError(f"no lab host {name!r} (hosts: {known})")
        t0 = time.monotonic()
        # the mounts it booted with (parser venvs, checkpoints) are what the others run with too
        binds = hosts.booted_binds(root, name)
        if binds is None:
            binds = _images(root, lab, [host.hardware])
        say(f"resetting {name}: stopping it and discarding everything written on it")
        for attempt in range(4):
            try:  # engine processes still exiting can keep its overlay busy for a few seconds (as in down)
                hosts.stop(root, name)
                break
            except LabError:
                if attempt == 3:
                    raise
                time.sleep(5)
        network.ensure_netns(host.name, host.address)
        hosts.prepare(root, rootfs.ensure_base(root), lab, host, ssh_keypair(root).with_suffix(".pub").read_text())
        ensure_inotify(len(lab.hosts))  # a lab brought up by an older checkout, or limits lowered since
        hosts.spawn(root, host, binds)
        hosts.wait_running(root, name)
        wait_for(lambda: _ssh_ok(lab, host), 60, interval=0.5, what=f"ssh on {name}")
        say(
            f"{name} is a fresh host again ({host.address}, {host.hardware}) after {time.monotonic() - t0:.1f}s; "
            f"rebuild it with: pyinfra inventories/lab.py DEPLOY --limit {name}"
        )
        return lab


def publish_runtime_image(root: Path, base: Path) -> str:
    """The CPU SGLang runtime image (runtime_image.py, built once per machine) into the lab registry: cpu-lab's
    image (the stand-in GPU images are built on the parser image, gpu_images.py, and pushed on their own)."""
    t0 = time.monotonic()
    ref, _ = runtime_image.ensure(base, runtime.ensure(cpu_runtime.RUNTIME))
    client = oci.Registry(registry.address(), registry.ca_file(root))
    seed = functools.partial(registry.seed_blob, root)  # the layers as hard links into the registry's storage
    digest = oci.push(
        client, runtime_image.cache_dir(), ref, runtime_image.REPO, [runtime_image.TAG], say=say, seed=seed
    )
    say(f"registry: {runtime_image.REPO}:{runtime_image.TAG} = {digest} ({time.monotonic() - t0:.1f}s)")
    return digest


def _parser_image(base: Path, recipes: list) -> Path:
    """The parser image the stand-in GPU images sit on (its ref file), built when missing, with the stand-ins' own
    layers (their SGLang release, compiled) made beside it."""
    with ThreadPoolExecutor(max_workers=1) as beside:
        layers = beside.submit(gpu_images.prepare_layers, recipes, base)
        ref = runtime_image.ensure(base, runtime.ensure(cpu_runtime.RUNTIME), runtime_image.PARSER)[0]
        layers.result()
    return ref


def publish_gpu_images(root: Path, base: Path, recipes: list) -> str:
    """NVIDIA profiles: a stand-in image for every image the docker recipes given name (gpu_images.py) into the
    lab registry, the site lock naming their digests (the inventory's docker_image_lock); the site lock's path. (The
    wheels their derived-image patches pip-install are in the lab index already: _fetch_index_wheels.)"""
    ref = _parser_image(base, recipes)
    client = oci.Registry(registry.address(), registry.ca_file(root))
    site_lock = root / "images" / gpu_images.SITE_LOCK
    seed = functools.partial(registry.seed_blob, root)
    gpu_images.publish(client, registry.address(), registry.ca_file(root), recipes, base, ref, site_lock, seed)
    return str(site_lock)


def patch_requirements(patches: list[str]) -> list[str]:
    """The pinned requirements (name==version) of a recipe's ``RUN pip install`` patch lines."""
    found = []
    for line in patches:
        words = line.split()
        if words[:3] == ["RUN", "pip", "install"]:
            found += [w for w in words[3:] if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*==[A-Za-z0-9_.+!\-]+", w)]
    return found


def publish_interpreters(root: Path) -> str:
    """This machine's CPython builds the hosts' Debian lacks (3.12), as uv's managed Pythons on the lab bridge;
    the URL of uv's download list, or "" when this machine has none (the recipes that need one say so)."""
    cache = state.cache_dir() / "lab-python"
    published = interpreters.publish(supply.supply_dir(root) / "python", state.supply_url("python"), cache)
    if not published:
        say(f"no CPython 3.12 build under {interpreters.PYTHONS_DIR}: the lab publishes no managed Python")
        return ""
    say(f"managed Pythons on the lab bridge: {', '.join(published.values())}")
    return state.supply_url(f"python/{interpreters.LIST_NAME}")


def _images(root: Path, lab: LabState, profiles: list[str]) -> list[tuple[str, str]]:
    """Stand-in checkpoints (and cpu-lab's generated model); the hosts' read-only binds."""
    try:
        lab.models = images.publish_models(root)
    except Exception as exc:  # noqa: BLE001
        say(f"warning: no stand-in checkpoints: {exc}")
        lab.models = {}
    if any(PROFILES[profile]["kind"] == "none" for profile in profiles):
        # the CPU recipes' generated model (real weights, stdlib-generated, same bytes every time), shared
        # read-only with every host under model_root like the stand-in checkpoints
        target = images.models_dir(root) / TINY_MODEL
        say(f"tiny model: {target} (hosts: {images.MODEL_ROOT}/{TINY_MODEL})")
        tiny_model.generate(target)
        lab.models[TINY_MODEL] = {"path": f"{images.MODEL_ROOT}/{TINY_MODEL}", "recipes": ["tiny-cpu"]}
    lab.model_root = images.MODEL_ROOT
    return [(str(images.models_dir(root)), images.MODEL_ROOT)]


def status() -> dict:
    root = state.lab_dir()
    lab = state.load(root)
    if not lab:
        return {"hosts": []}
    data = lab.status()
    for entry in data["hosts"]:
        entry["running"] = bool(hosts.pid_of(root, entry["name"]))
    data["supply_running"] = bool(supply.server_pid(root))
    data["hub"] = hub.status(root, lab.hub_url)
    return data


def down() -> None:
    require_root()
    with _locked(state.lab_dir()):
        _down()


def _down() -> None:
    root = state.lab_dir()
    lab = state.load(root)
    names = {h.name for h in lab.hosts} if lab else set()
    hosts_dir = root / "hosts"
    if hosts_dir.exists():
        names |= {p.name for p in hosts_dir.iterdir() if p.is_dir()} | {p.stem for p in hosts_dir.glob("*.ext4")}
    names |= {ns.removeprefix("ironlab-") for ns in network.lab_netns()}
    if names:
        say(f"stopping {len(names)} host(s): {' '.join(sorted(names))}")
    pending = sorted(names)
    for attempt in range(4):
        # A host whose engine processes are still exiting can keep its overlay busy for a few seconds:
        # retry those before giving up, so a down never stops half way and leaves state behind.
        with ThreadPoolExecutor(max_workers=max(1, len(pending))) as pool:
            futures = {n: pool.submit(hosts.stop, root, n) for n in pending}
        failed = {n: f.exception() for n, f in futures.items() if f.exception() is not None}
        if not failed:
            break
        if attempt == 3:
            raise LabError("lab down could not stop: " + "; ".join(f"{n}: {e}" for n, e in failed.items()))
        say(f"retrying {len(failed)} host(s) still busy: {' '.join(sorted(failed))}")
        time.sleep(5)
        pending = sorted(failed)
    say("stopping supply server, registry and hub, removing bridge")
    supply.stop_server(root)
    registry.stop_server(root)
    hub.stop_server(root)
    network.remove_bridge()
    left = cgroups.remove()
    for tree in _build_trees(root):  # a killed `lab up`'s build (its tmpfs holds GiBs of memory)
        scratch.clear(tree)
    state.remove(root)
    problems = leftovers(root)
    if left or problems:
        raise LabError("lab down left traces behind:\n" + "\n".join(left + problems))
    say("lab is down (base rootfs and supply cache kept in " + str(root) + ")")


def _build_trees(root: Path) -> list[Path]:
    """Where `lab up` builds the rootfs and the images' venvs."""
    return [rootfs.build_dir(root), runtime_image.build_dir()]


def leftovers(root: Path | None = None) -> list[str]:
    """Everything `down` promises to remove: returns a line per trace still present."""
    root = root or state.lab_dir()
    found = [f"netns {n}" for n in network.lab_netns()]
    found += [f"link {n}" for n in network.lab_links()]
    found += [f"cgroup {c}" for c in cgroups.leftovers()]
    trees = [str(tree) for tree in _build_trees(root)]
    for line in Path("/proc/mounts").read_text().splitlines():
        mnt = line.split()[1]
        if mnt in trees or mnt.startswith((str(root) + "/", "/run/netns/ironlab-", *(f"{t}/" for t in trees))):
            found.append(f"mount {mnt}")
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (
            ("systemd-nspawn" in cmd and "--machine=lab" in cmd)
            or ("httpd.py" in cmd and str(root) in cmd)
            or ("docker-registry" in cmd and str(root) in cmd)
            or ("hubd.py" in cmd and str(root) in cmd)
        ):
            found.append(f"process {pid_dir.name}: {cmd.strip()}")
    if Path("/run/systemd/nspawn/propagate").exists():
        found += [
            f"nspawn dir {p}" for p in Path("/run/systemd/nspawn/propagate").iterdir() if p.name.startswith("lab")
        ]
    return found
