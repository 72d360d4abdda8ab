"""Host data as a typed model: every key ironserve reads from an inventory or `--data KEY=VALUE`, in one place.

Each field has its type, its default and a one-line description; ``json_schema_extra["role"]`` names the module
that reads it. pyinfra's own connector and operation keys (``ssh_*``, ``_sudo``, ``_env``, ...) pass through
untouched; any other unknown key is an error whose fix names the nearest known key, so ``--data lanch=false``
fails the deploy before it changes anything instead of being silently ignored. Values arrive as Python objects
from an inventory or as text from ``--data`` (pyinfra turns "false"/"true"/digits/JSON into Python values); both
are validated to the same types.

Validated by the deploy (roles/context.py, before any operation), ``ironserve render --inventory``, ``lint
--inventory``, ``audit`` and ``status``. ``ironserve schema --host-data`` prints the JSON Schema; docs/host-data.md's
table is checked against it by tests/test_every_value_is_data.py.
"""

from __future__ import annotations

import difflib
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from .bench import MIN_RATIO
from .nvidia import NVIDIA_CONTAINER_TOOLKIT_VERSION
from .problems import Problem, SpecError, message_and_fix
from .spec import IMAGE_COMPONENT, AbsPath, Address, Interface, Url, Version, _grammar, _walk_strings, check_url

# pyinfra's connector and operation arguments: read by pyinfra, not by ironserve (beyond the typed ssh_* below)
PASSTHROUGH_PREFIXES = (
    "ssh_",
    "_",
    "winrm_",
    "chroot_",
    "docker_identifier",
    "dockerssh_",
    "podman_",
    "vagrant_",
    "terraform_",
    "local_",
)


DebPackage = Annotated[
    str,
    AfterValidator(
        _grammar(r"[a-z0-9][a-z0-9+.\-]*(=[A-Za-z0-9.+~:\-]+)?", "a Debian package (name or name=version)", "docker-ce")
    ),
]


Sha256 = Annotated[
    str,
    AfterValidator(
        _grammar(r"[0-9a-f]{64}", "a sha256 (64 lowercase hex digits)", "the first field of `sha256sum FILE`")
    ),
]
Fingerprint = Annotated[
    str,
    AfterValidator(
        _grammar(
            r"[0-9A-F]{40}",
            "an OpenPGP v4 fingerprint (40 uppercase hex digits, no spaces)",
            "EB693B3035CD5710E231E123A4B469963BF863CC",
        )
    ),
]
# the keys these repositories are signed with (their vendors' published fingerprints)
NVIDIA_CUDA_KEY_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"  # 3bf863cc.pub, cudatools@nvidia.com
DOCKER_KEY_FINGERPRINT = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"  # download.docker.com/linux/*/gpg
NVIDIA_CONTAINER_KEY_FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"  # libnvidia-container gpgkey


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
# HOST[:PORT][/PREFIX]: Docker reads a first component with a dot or a port (or localhost) as a registry; a bare
# name would push to a Docker Hub account instead
DerivedRegistry = Annotated[
    str,
    AfterValidator(
        _grammar(
            rf"(?:(?:localhost|{_LABEL}(?:\.{_LABEL})+)(?::[0-9]{{1,5}})?|{_LABEL}:[0-9]{{1,5}})"
            rf"(?:/{IMAGE_COMPONENT})*",
            "a registry for derived images, HOST[:PORT][/PREFIX] (a host with a dot or a port, lowercase "
            "repository path, no scheme)",
            "registry.example.internal:5000/ironserve",
        )
    ),
]


def _field(default: Any, role: str, description: str, **kw) -> Any:
    return Field(default, description=description, json_schema_extra={"role": role}, **kw)


class HostData(BaseModel):
    """What one host of an inventory says about itself (all optional except ``hardware`` for a deploy)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, frozen=True)

    # ---------------------------------------------------------------- placement (render, every role)
    hardware: str | None = _field(
        None,
        "roles/context.py",
        "hardware profile id (recipes/hardware.yaml); required to deploy",
        pattern=r"^[a-z0-9][a-z0-9.\-]*$",
    )
    recipe: str | None = _field(
        None,
        "roles/context.py",
        "recipe id (or YAML file, relative or absolute), overriding the catalogue default for (model, hardware)",
        pattern=r"^[A-Za-z0-9_./][A-Za-z0-9_./\-]*$",
    )
    model: str | None = _field(
        None, "deploys/bench.py", "model family to benchmark (deploys/bench.py only)", pattern=r"^[a-z0-9][a-z0-9.\-]*$"
    )
    launch: bool = _field(True, "roles/launch.py", "false: prepare and validate everything, start nothing")
    ssh_hostname: Address | None = _field(
        None,
        "ironserve/render.py",
        "address other nodes reach this one at (dist-init, router URLs); default: the host's name",
    )
    ssh_user: str | None = _field(
        None,
        "ironserve/audit/runner.py",
        "SSH user (pyinfra's; read by audit and status)",
        pattern=r"^[a-z_][a-z0-9_.\-]*$",
    )
    ssh_port: int | None = _field(
        None, "ironserve/audit/runner.py", "SSH port (pyinfra's; read by audit and status)", ge=1, le=65535
    )
    ssh_key: str | None = _field(None, "ironserve/audit/runner.py", "SSH private key on the controller (pyinfra's)")
    nic: Interface | None = _field(
        None,
        "ironserve/render.py",
        "interface of the cluster network: GLOO/NCCL/HCCL socket traffic of multi-node groups is pinned to it",
    )
    ironserve_role: Literal["router"] | None = _field(
        None, "ironserve/render.py", "router: this host runs only the router; workers need nothing"
    )
    allow_emulated_arch: bool = _field(
        False, "roles/preflight.py", "accept an x86_64 host for a profile of another architecture (stand-in hosts)"
    )

    # ---------------------------------------------------------------- model weights
    model_path: AbsPath | None = _field(
        None,
        "roles/model_weights.py",
        "where the weights are on this host (overrides the recipe's path; also what --model-path says)",
    )
    model_root: AbsPath | None = _field(
        None,
        "roles/model_weights.py",
        "a directory with one folder per model: <model_root>/<last part of the recipe's path>",
    )
    model_source: Literal["path", "hub"] = _field(
        "path",
        "roles/model_weights.py",
        "path: the weights are already at the model path; hub: download recipe.model.hub_id there",
    )
    model_shared: bool = _field(
        False, "roles/model_weights.py", "the model path is one shared filesystem: download from the first host only"
    )
    hf_token_file: str | None = _field(
        None,
        "roles/model_weights.py",
        "file on the controller holding the Hugging Face token (uploaded 0600, never in argv)",
    )
    hf_transfer: bool = _field(False, "roles/model_weights.py", "HF_HUB_ENABLE_HF_TRANSFER for the download")
    hf_endpoint: Url | None = _field(None, "roles/model_weights.py", "HF_ENDPOINT: a hub mirror")
    weights_peers: bool = _field(
        True,
        "roles/weights_peers.py",
        "model_source=hub without model_shared: one host of the run reads the hub, the others fetch from peers "
        "(false: every host downloads from the hub)",
    )
    weights_peer_port: int = _field(
        8790, "roles/weights_peers.py", "port a host lends its verified weights on while peers fetch", ge=1, le=65535
    )
    weights_peer_fanout: int = _field(
        4, "roles/weights_peers.py", "peers one host lends its weights to at once", ge=1, le=64
    )

    # ---------------------------------------------------------------- service units
    api_key_file: str | None = _field(
        None,
        "roles/sglang_service.py",
        "file on the controller holding the servers' API key (kept in the units' 0600 env files)",
    )
    allow_open_bind: bool = _field(
        False, "roles/sglang_service.py", "allow a server or router bound to 0.0.0.0 or :: without an API key"
    )
    secret_dir: str | None = _field(
        None,
        "roles/secret_file.py",
        "controller directory of generated group secrets (default: ~/.config/ironserve/secrets)",
    )
    parse_check: bool = _field(True, "roles/sglang_service.py", "check each argv with the installed SGLang's parser")
    rollback: bool = _field(
        True, "roles/rollback.py", "restore the last good configuration when a new one fails its health gate"
    )
    health_poll_s: float = _field(10, "roles/launch.py", "seconds between health probes", gt=0)
    engine_restart_s: int = _field(
        15,
        "ironserve/render.py",
        "seconds systemd waits before restarting an engine or router unit that exited or was killed (its "
        "RestartSec=); a multi-node group's other ranks are restarted by the rank guard",
        ge=1,
        le=3600,
    )
    roll_max_groups: int = _field(
        1,
        "roles/rolling.py",
        "engine groups a rolling change moves out of the router at once after the canary, which moves alone (the "
        "smallest value among the deployment's hosts; at most all but one group of each role: the router keeps one)",
        ge=1,
    )
    drain_timeout_s: float = _field(
        120,
        "roles/rolling.py",
        "seconds a group out of the router waits for its "
        "in-flight requests before it stops (the rest are cut, and said)",
        gt=0,
    )
    canary_bench: bool = _field(
        False,
        "roles/canary_bench.py",
        "a rolling change benchmarks its canary group before and after its change (bench_serving, the recipe's "
        "shape, out of the router) and fails it below bench_min_ratio of the figures before (on when any host of "
        "the deployment asks)",
    )
    canary_bench_prompts: int = _field(
        16, "roles/canary_bench.py", "prompts of each canary benchmark (at most; fewer when the recipe's are)", ge=1
    )
    canary_bench_timeout_s: int = _field(300, "roles/canary_bench.py", "seconds each canary benchmark may run", ge=1)
    health_progress_s: float = _field(
        60, "roles/launch.py", "seconds between progress lines while waiting (0: every probe)", ge=0
    )
    health_journal_lines: int = _field(40, "roles/launch.py", "journal lines shown when a unit fails its gate", ge=0)
    pcie_acs_check: bool = _field(True, "roles/launch_preflight.py", "refuse PCIe ACS redirects between a rank's GPUs")
    rendezvous: bool = _field(
        True, "roles/launch_preflight.py", "prove a multi-node group's gloo rendezvous before its engines start"
    )
    rendezvous_timeout_s: int = _field(60, "roles/launch_preflight.py", "seconds the rendezvous may take", ge=1)

    # ---------------------------------------------------------------- batched facts
    batch_facts: bool = _field(
        True,
        "roles/host_state.py",
        "read what the prepare stage needs of a host in one "
        "batched command, kept for the run (false: one command per fact)",
    )
    host_state_cache: str | None = _field(
        "~/.cache/ironserve/host-state",
        "roles/host_state.py",
        "controller "
        "directory keeping which facts each host's prepare stage reads (never "
        "their values); empty: learn them anew in every run",
    )
    converged_fast_path: bool = _field(
        True,
        "roles/converged.py",
        "after a run that changed nothing, plan nothing while every host's light read (inode status of what it "
        "manages, venvs' package metadata, package database, unit states) and the deployment's inputs are as that "
        "run left them; false: plan every host in full every run",
    )

    # ---------------------------------------------------------------- host tuning
    governor_unit: str = _field(
        "ironserve-cpu-governor.service",
        "roles/host_tuning.py",
        "unit that sets the CPU governor at boot",
        pattern=r"^[A-Za-z0-9:_.\-]+\.service$",
    )
    sysctl_file: AbsPath = _field("/etc/sysctl.d/90-ironserve.conf", "roles/host_tuning.py", "the sysctl.d file")
    limits_file: AbsPath = _field(
        "/etc/security/limits.d/90-ironserve.conf", "roles/host_tuning.py", "the limits.d file"
    )

    # ---------------------------------------------------------------- package sources (air-gapped clusters)
    apt_trusted: bool = _field(
        False, "roles/nvidia_driver.py", "mirrors are trusted=yes (unsigned); prefer apt_signed_by"
    )
    apt_signed_by: AbsPath | None = _field(
        None, "roles/nvidia_driver.py", "keyring on the hosts that signs the mirrors"
    )
    nvidia_apt_mirror: Url | None = _field(None, "roles/nvidia_driver.py", "mirror of NVIDIA's CUDA apt repository")
    nvidia_apt_key_file: str | None = _field(
        None, "roles/nvidia_driver.py", "NVIDIA's apt key, a file on the controller"
    )
    nvidia_apt_key_name: str = _field(
        "3bf863cc.pub",
        "roles/nvidia_driver.py",
        "file name of the key next to the repository index",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
    )
    nvidia_apt_key_fingerprint: Fingerprint = _field(
        NVIDIA_CUDA_KEY_FINGERPRINT,
        "roles/apt_keys.py",
        "the only key a fetched NVIDIA apt key may be (NVIDIA's CUDA repository key)",
    )
    docker_apt_mirror: Url | None = _field(None, "roles/docker_engine.py", "mirror of Docker's apt repository")
    docker_apt_key_url: Url | None = _field(
        None, "roles/docker_engine.py", "Docker's apt key URL (default: Docker's for the distro)"
    )
    docker_apt_key_fingerprint: Fingerprint = _field(
        DOCKER_KEY_FINGERPRINT,
        "roles/apt_keys.py",
        "the only key the downloaded Docker apt key may be (Docker's release key)",
    )
    docker_apt_suite: str | None = _field(
        None,
        "roles/docker_engine.py",
        "suite (default: the distro codename; ending in / = flat repository)",
        pattern=r"^[A-Za-z0-9_.\-/]+$",
    )
    docker_apt_components: str = _field(
        "stable", "roles/docker_engine.py", "components of the suite", pattern=r"^[A-Za-z0-9_.\- ]+$"
    )
    docker_packages: list[DebPackage] = _field(
        ["docker-ce", "docker-ce-cli", "containerd.io"], "roles/docker_engine.py", "Docker packages to install"
    )
    docker_registry_mirror: str | None = _field(
        None,
        "roles/docker_engine.py",
        "host[:port] of an https "
        "registry mirroring Docker Hub (daemon.json registry-mirrors; "
        "`ironserve lock` resolves tags there)",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.\-]*(:[0-9]{1,5})?$",
    )
    docker_registry_ca: str | None = _field(
        None,
        "roles/docker_engine.py",
        "CA certificate of that registry and of docker_derived_registry, a file on the controller (installed in "
        "/etc/docker/certs.d/, and verified by the controller)",
    )
    docker_derived_registry: DerivedRegistry | None = _field(
        None,
        "roles/recipe_image.py",
        "HOST[:PORT][/PREFIX] of an https registry (its CA docker_registry_ca) that a recipe's derived image "
        "(runtime.patches) is pushed to: built once per deployment, pulled and run by digest on every host; "
        "unset: each host builds its own",
    )
    docker_derived_registry_auth_file: str | None = _field(
        None,
        "roles/recipe_image.py",
        "file on the controller, mode 0600, of one line USER:PASSWORD for docker_derived_registry: the builder "
        "pushes and every host pulls with it (a 0600 Docker config on the host, never in argv or logs)",
    )
    docker_image_lock: str | None = _field(
        None,
        "ironserve/imagelock.py",
        "site lock, a file on the controller: "
        "the digests this site's registry holds for the recipes' images "
        "(`ironserve lock --all --site FILE`)",
    )
    docker_allow_unpinned: bool = _field(
        False,
        "roles/recipe_image.py",
        "deploy a docker recipe with neither runtime.digest nor a lock file (each host resolves the tag itself)",
    )
    nvidia_apt_key_url: Url | None = _field(
        None, "roles/nvidia_container_toolkit.py", "NVIDIA container toolkit key URL"
    )
    nvidia_container_key_fingerprint: Fingerprint = _field(
        NVIDIA_CONTAINER_KEY_FINGERPRINT,
        "roles/apt_keys.py",
        "the only key the downloaded container toolkit key may be",
    )
    nvidia_apt_suite: str = _field(
        "/",
        "roles/nvidia_container_toolkit.py",
        "suite of the container toolkit repository",
        pattern=r"^[A-Za-z0-9_.\-/]+$",
    )
    nvidia_container_packages: list[DebPackage] = _field(
        ["nvidia-container-toolkit"], "roles/nvidia_container_toolkit.py", "NVIDIA container packages to install"
    )
    pip_index_url: Url | None = _field(None, "roles/uv_env.py", "PyPI mirror for uv and the parser check")
    package_indexes: dict[str, Url] = _field({}, "roles/uv_env.py", "index:NAME in recipes -> URL")
    allow_http_index: bool = _field(
        False,
        "roles/uv_env.py",
        "accept plain-http package indexes (an internal mirror on a trusted network); https otherwise",
    )
    ascend_package_store: str | None = _field(
        None, "roles/ascend.py", "URL, or directory on the controller, holding the Ascend .run packages"
    )
    ascend_package_sha256: dict[str, Sha256] = _field(
        {}, "roles/ascend.py", ".run file name -> its sha256: an installer runs as root only when its file matches"
    )
    require_locks: bool = _field(
        False,
        "roles/uv_env.py",
        "refuse a uv recipe without a current lock file, or a docker recipe's router host without its router "
        "venv's lock (`ironserve lock`): its packages would install without hash checks",
    )

    # ---------------------------------------------------------------- pinned versions and paths
    nvidia_driver_version: Version = _field("580.95.05-1", "roles/nvidia_driver.py", "NVIDIA driver package version")
    allow_reboot: bool = _field(False, "roles/nvidia_driver.py", "reboot when a new driver needs it")
    reboot_timeout: int = _field(900, "roles/nvidia_driver.py", "seconds to wait for a rebooted host", ge=1)
    nvidia_module_source: Literal["dkms", "precompiled"] = _field(
        "dkms",
        "roles/nvidia_driver.py",
        "dkms: modules built for the running kernel; precompiled: Ubuntu's signed ones",
    )
    dcgm: bool | None = _field(
        None, "roles/nvidia_driver.py", "install and run NVIDIA DCGM (default: on for multi-node NVLink profiles)"
    )
    nvidia_container_toolkit_version: Version = _field(
        NVIDIA_CONTAINER_TOOLKIT_VERSION,
        "roles/nvidia_container_toolkit.py",
        "nvidia-container-toolkit package version",
    )
    nvlink_domain: str = _field(
        "default",
        "roles/preflight.py",
        "hosts with the same value form one NVLink/IMEX domain",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
    )
    imex_address: Address | None = _field(
        None, "roles/imex.py", "address the IMEX daemons of the domain reach this host at (default: ssh_hostname)"
    )
    imex_ready_timeout_s: int = _field(120, "roles/imex.py", "seconds nvidia-imex may take to report READY", ge=1)
    iommu_check: bool = _field(
        True, "roles/launch_preflight.py", "refuse an IOMMU that translates GPU peer-to-peer traffic"
    )
    cuda_toolkit_version: Version = _field("13.0.2-1", "roles/cuda.py", "CUDA toolkit package version")
    tools_venv: AbsPath = _field("/opt/ironserve/tools", "roles/gpu_clocks.py", "venv of ironserve's host tools")
    nvidia_ml_py_version: Version = _field("13.580.82", "roles/gpu_clocks.py", "nvidia-ml-py in the tools venv")
    uv_version: Version = _field("0.13.9", "roles/uv_env.py", "uv on the hosts")
    uv_url: Url | None = _field(None, "roles/uv_env.py", "where to fetch uv from (default: the package index)")
    uv_sha256: Sha256 | None = _field(None, "roles/uv_env.py", "sha256 of the uv_url tarball (required with it)")
    uv_python_install_mirror: Url | None = _field(None, "roles/uv_env.py", "UV_PYTHON_INSTALL_MIRROR")
    uv_python_downloads_json_url: Url | None = _field(
        None, "roles/uv_env.py", "UV_PYTHON_DOWNLOADS_JSON_URL: uv's list of Python downloads (your own builds)"
    )
    ascend_driver_version: Version | None = _field(None, "roles/ascend.py", "Ascend driver (default: the profile's)")
    ascend_firmware_version: Version | None = _field(None, "roles/ascend.py", "Ascend firmware (default: not managed)")
    ascend_toolkit_version: Version | None = _field(None, "roles/ascend.py", "CANN toolkit (default: the profile's)")
    ascend_nnal_version: Version | None = _field(None, "roles/ascend.py", "CANN NNAL (default: the profile's toolkit)")
    ascend_install_path: AbsPath = _field("/usr/local/Ascend", "roles/ascend.py", "Ascend install prefix")

    # ---------------------------------------------------------------- benchmark (deploys/bench.py)
    bench_num_prompts: int | None = _field(None, "roles/bench.py", "--num-prompts (default: the recipe's)", ge=1)
    bench_max_concurrency: int | None = _field(
        None, "roles/bench.py", "--max-concurrency (default: the recipe's)", ge=1
    )
    bench_dataset_name: str | None = _field(
        None, "roles/bench.py", "--dataset-name (default: the recipe's)", pattern=r"^[a-z][a-z0-9\-]*$"
    )
    bench_dataset_path: AbsPath | None = _field(None, "roles/bench.py", "--dataset-path on the bench host")
    bench_timeout_s: int = _field(3600, "roles/bench.py", "seconds the benchmark may run", ge=1)
    bench_min_ratio: float = _field(
        MIN_RATIO,
        "roles/bench.py",
        "fail when a figure is below this ratio of the expected (the canary's benchmark: of its previous configuration's)",
        ge=0,
    )
    bench_report: str | None = _field(None, "roles/bench.py", "write the report as JSON to this controller path")

    # ---------------------------------------------------------------- metrics
    node_exporter: bool = _field(
        True,
        "roles/node_exporter.py",
        "install the distribution's prometheus-node-exporter "
        "(bound to the host's address, textfile collector for ironserve_* metrics); false: "
        "skip it",
    )
    node_exporter_port: int = _field(9100, "roles/node_exporter.py", "the node exporter's port", ge=1, le=65535)
    deploy_timings_json: str | None = _field(
        None, "roles/deploy_clock.py", "write the deploy's per-stage timings as JSON to this controller path"
    )

    @field_validator("*", mode="after")
    @classmethod
    def _no_control_characters(cls, value: Any) -> Any:
        _walk_strings(value, False)
        return value

    @field_validator("ascend_package_store")
    @classmethod
    def _store(cls, value: str | None) -> str | None:
        return check_url(value) if value and "://" in value else value

    def index_url_allowed(self, url: str) -> bool:
        return not url.startswith("http://") or self.allow_http_index


DEFAULTS = HostData()  # every key's default, for the roles' own constants (one place)


def is_passthrough(key: str) -> bool:
    return key not in HostData.model_fields and key.startswith(PASSTHROUGH_PREFIXES)


def validate_host_data(data: dict, where: str, host: str) -> HostData:
    """One host's data as HostData, or a SpecError naming the file, the host's key and the fix."""
    known = {k: v for k, v in data.items() if not is_passthrough(str(k))}
    problems = [
        Problem(where, f"{host}.{key!r}", "host data keys are names", "use a string key")
        for key in known
        if not isinstance(key, str)
    ]
    try:
        model = HostData.model_validate(known)
    except ValidationError as err:
        raise SpecError(problems + [_problem(e, where, host) for e in err.errors()]) from None
    problems = problems or _cross_key_problems(model, where, host)
    if problems:
        raise SpecError(problems)
    return model


def _problem(error: dict, where: str, host: str) -> Problem:
    """A pydantic error of one key as a Problem: an unknown key names the nearest known one; a bad value what was
    given and what the key is."""
    key = ".".join(str(p) for p in error["loc"])
    name = str(error["loc"][0]) if error["loc"] else ""
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(name, list(HostData.model_fields), n=1, cutoff=0.6)
        fix = f"did you mean '{close[0]}'?" if close else "remove it (`ironserve schema --host-data` lists the keys)"
        return Problem(where, f"{host}.{key}", f"unknown host data key '{name}'", fix)
    given = error.get("input")
    shown = given if isinstance(given, (int, float, bool)) or given is None else str(given)[:60]
    msg, write = message_and_fix(error["msg"].removeprefix("Value error, "))
    described = HostData.model_fields[name].description if name in HostData.model_fields else ""
    what = f"{name} is {described}" if described else "see `ironserve schema --host-data`"
    return Problem(where, f"{host}.{key}", f"{msg} (got {shown!r})", f"{write} ({what})" if write else what)


def _cross_key_problems(model: HostData, where: str, host: str) -> list[Problem]:
    """What no single key says wrong: a plain-http index not allowed, a uv tarball without its checksum (the first
    one found)."""
    bad = [u for u in [model.pip_index_url, *model.package_indexes.values()] if u and not model.index_url_allowed(u)]
    if bad:
        return [
            Problem(
                where,
                f"{host}.pip_index_url",
                f"plain-http package index {bad[0]} (pip verifies nothing fetched over http)",
                "use https, or set allow_http_index=true for a mirror on a trusted network",
            )
        ]
    if model.uv_url and not model.uv_sha256:
        return [
            Problem(
                where,
                f"{host}.uv_sha256",
                f"uv_url {model.uv_url} has no checksum: root would unpack whatever the URL serves",
                "set uv_sha256 to the tarball's sha256 (the first "
                "field of `sha256sum uv-<arch>-unknown-linux-gnu.tar.gz`)",
            )
        ]
    return []


def validate_inventory_data(hosts: list[tuple[str, dict]], where: str) -> dict[str, HostData]:
    """Every host's data at once, so one run reports every problem of the inventory."""
    out, problems = {}, []
    for name, data in hosts:
        try:
            out[name] = validate_host_data(data, where, name)
        except SpecError as err:
            problems += err.problems
    if problems:
        raise SpecError(problems)
    return out


def _type_name(annotation) -> str:
    """A short type for the README: path, url, address, interface, version, bool, int, ..."""
    import types
    import typing

    named = [(AbsPath, "path"), (Url, "url"), (Address, "address"), (Interface, "interface"), (Version, "version")]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        parts = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(_type_name(a) for a in parts)
    for alias, name in named:
        if annotation == alias:
            return name
    if typing.get_origin(annotation) is typing.Annotated:  # constraints (pattern, ge): the base type
        return _type_name(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(f"`{v}`" for v in typing.get_args(annotation))
    if typing.get_origin(annotation) in (list, dict):
        return f"{typing.get_origin(annotation).__name__} of " + ", ".join(
            _type_name(a) for a in typing.get_args(annotation)
        )
    return getattr(annotation, "__name__", str(annotation))


def markdown_table() -> str:
    """docs/host-data.md's table (checked against this model by tests/test_every_value_is_data.py)."""
    lines = ["| key | type | default | read by | what |", "|---|---|---|---|---|"]
    for name, f in HostData.model_fields.items():
        default = (
            ""
            if f.default is None
            else f"`{f.default}`"
            if not isinstance(f.default, list)
            else f"`{', '.join(f.default)}`"
        )
        role = (f.json_schema_extra or {}).get("role", "")
        lines.append(f"| `{name}` | {_type_name(f.rebuild_annotation())} | {default} | {role} | {f.description} |")
    return "\n".join(lines) + "\n"


def parse_data_args(items: list[str], where: str = "--data") -> dict:
    """`--data KEY=VALUE` as pyinfra reads it (true/false, integers and JSON become values, the rest text), for
    audit and status, which take the same options as the deploy; malformed items are a SpecError."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SpecError([Problem(where, item, "not of the form KEY=VALUE", "write e.g. --data launch=false")])
        value: Any = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            try:
                value = int(text)
            except ValueError:
                try:
                    value = json.loads(text) if text[:1] in '[{"' else text
                except ValueError:
                    value = text
        out[key] = value
    return out


def json_schema() -> dict:
    schema = HostData.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["additionalProperties"] = False
    schema["patternProperties"] = {
        "^(" + "|".join(p.rstrip("_") + "_" if p.endswith("_") else p for p in PASSTHROUGH_PREFIXES) + ")": {}
    }
    schema["description"] = (
        "ironserve host data (inventory or --data KEY=VALUE); pyinfra's connector and "
        f"operation keys ({', '.join(p + '*' for p in PASSTHROUGH_PREFIXES)}) pass through"
    )
    return schema
