"""Spec models: the typed, strict shape of hardware profiles and recipes.

Everything a deploy, a render, a lint or an audit knows about a deployment comes from these objects.
They are strict on purpose (``extra="forbid"``): a typo in a recipe key must fail loudly before any
host is touched, not be ignored and discovered at minute 40 of a cold start.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

# --------------------------------------------------------------------------- strings at the edge
# Every string of a recipe, a hardware profile or host data ends up in a unit file, an env file, a sysctl file or
# an argv. A control character there is never data: a newline becomes a new directive line (ExecStartPre=...,
# LD_PRELOAD=..., kernel.core_pattern=|...). Refused here, once, for every field; the grammars below narrow the
# fields whose readers have one (env names, interfaces, addresses, image references, versions, paths).

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# prose (descriptions, notes) never reaches a host: line breaks are allowed there, nothing else
PROSE_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
PROSE_FIELDS = frozenset({"description", "notes", "note", "reason", "section"})


def control_problem(value: str, prose: bool = False) -> str | None:
    """Why a string is not data (a control character, named by code point), or None."""
    found = (PROSE_CONTROL if prose else CONTROL).search(value)
    if found:
        return f"control character U+{ord(found.group()):04X} at position {found.start()}"
    return None


def _walk_strings(value: Any, prose: bool) -> None:
    if isinstance(value, str):
        why = control_problem(value, prose)
        if why:
            raise ValueError(f"{why}: write the value without line breaks, tabs or other control characters")
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk_strings(k, prose)
            _walk_strings(v, prose)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _walk_strings(item, prose)


def _grammar(pattern: str, what: str, example: str):
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not {what} (e.g. {example})")
        return value

    return check


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EnvName = Annotated[str, AfterValidator(_grammar(ENV_NAME.pattern, "an environment variable name", "NCCL_DEBUG"))]
# Linux interface names: 1-15 bytes, no '/', ':' or whitespace (dev_valid_name); '.' and '..' are not names
Interface = Annotated[
    str,
    AfterValidator(_grammar(r"(?!\.{1,2}$)[A-Za-z0-9_][A-Za-z0-9_.\-]{0,14}", "a network interface name", "enp65s0f0")),
]
# unit names are built from these: sglang-<recipe id>-<role>
UnitPart = Annotated[str, AfterValidator(_grammar(r"[a-z0-9][a-z0-9.\-]*", "a unit-name part", "glm5-nvfp4"))]
# PyPI versions, Debian versions (epoch:upstream-revision, ~), vendor versions (8.3.RC1), image eras
Version = Annotated[
    str, AfterValidator(_grammar(r"[A-Za-z0-9][A-Za-z0-9.+~_:\-]{0,127}", "a version", "0.5.9 or 580.95.05-1"))
]
# docker's reference grammar (distribution/reference): [domain[:port]/]path[:tag]
IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
ImageRef = Annotated[
    str,
    AfterValidator(
        _grammar(
            rf"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)?"
            rf"{IMAGE_COMPONENT}(?:/{IMAGE_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,127}})?",
            "an image reference",
            "lmsysorg/sglang:v0.5.9",
        )
    ),
]
_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?)*\.?"
)


def check_address(value: str) -> str:
    """A hostname (RFC 1123) or an IPv4/IPv6 address."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a hostname or an IP address (e.g. 192.0.2.10 or gpu-a.cluster)")
    return value


Address = Annotated[str, AfterValidator(check_address)]

# the classic inet_aton spellings the resolver (getaddrinfo) accepts for IPv4: 1 to 4 parts, each decimal, octal
# (leading 0) or hex (0x): "0", "0.0", "00.0x0.0" all mean 0.0.0.0
_INET_ATON_ZERO = re.compile(r"(?:0+|0[xX]0*)(?:\.(?:0+|0[xX]0*)){0,3}")


def binds_every_address(host: str | None) -> bool:
    """Whether a listener bound to ``host`` accepts connections on every interface (the unspecified address).

    Judged as the engine's and the router's resolver reads a bind address (getaddrinfo with AI_PASSIVE): every
    spelling of 0.0.0.0 and :: ("0", "0.0", "0x0", "::0", "0:0:0:0:0:0:0:0", "[::]", "0000::", "::ffff:0.0.0.0",
    "::%eth0") and the empty string. None (no --host: the engine's default, 127.0.0.1) is not one; a hostname is
    judged by its spelling only (no lookup: the core is offline)."""
    if host is None:
        return False
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]  # an IPv6 scope (::%eth0) still binds the unspecified address
    if not text or _INET_ATON_ZERO.fullmatch(text):
        return True
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:0.0.0.0 on a dual-stack socket is IPv4's any address
    return address.is_unspecified


# what a path or URL may hold: a shell would read none of these characters as syntax ($, `, ;, |, &, quotes, <>,
# parentheses, spaces, globs, ...), whether or not a sink forgets to quote (each sink quotes too)
_PATH_CHARS = re.compile(r"[A-Za-z0-9._+,@=~/\-]")
_URL_CHARS = re.compile(r"[A-Za-z0-9._+,@=~/\-:?#%\[\]]")


_WRITE_PATH = "write the path with letters, digits and . _ - + , @ = ~ only"


def refuse_shell_syntax(value: str, allowed: re.Pattern, what: str, write: str) -> None:
    """ValueError naming the first character of ``value`` outside ``allowed`` and where it is, and what to write."""
    for i, char in enumerate(value):
        if not allowed.fullmatch(char):
            shown = repr(char) if char.isprintable() and not char.isspace() else f"U+{ord(char):04X}"
            raise ValueError(
                f"{value!r} holds {shown} at position {i}, which is not {what} character here (shell "
                f"syntax, spaces and quotes are refused); {write}"
            )


def check_abs_path(value: str) -> str:
    """Absolute and normalised: no '.', '..' or empty components (a trailing '/' is tolerated), no ':' (docker
    volumes and PATH-like lists split on it), only characters no shell reads as syntax."""
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path: write it from / (e.g. /mnt/models/GLM-5)")
    parts = value.rstrip("/").split("/")[1:]
    if value != "/" and any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{value!r} is not a normalised path: no '.', '..' or '//' (e.g. /mnt/models/GLM-5)")
    if ":" in value:
        raise ValueError(
            f"{value!r}: a path cannot hold ':' (docker volumes and search paths split on it); write "
            "it without (e.g. /mnt/models/GLM-5)"
        )
    refuse_shell_syntax(value, _PATH_CHARS, "a path", f"{_WRITE_PATH} (e.g. /mnt/models/GLM-5)")
    return value


AbsPath = Annotated[str, AfterValidator(check_abs_path)]
_URL = re.compile(r"(https?|file)://[^/?#]*(?:[/?#].*)?")


def check_url(value: str) -> str:
    if not _URL.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a URL: write https://host/path or file:///path (e.g. https://mirror.example/pypi/simple)"
        )
    refuse_shell_syntax(
        value,
        _URL_CHARS,
        "a URL",
        "write the URL without it, or percent-encoded (e.g. https://mirror.example/pypi/simple)",
    )
    return value


Url = Annotated[str, AfterValidator(check_url)]
# A value import could not know (a shell variable of the pasted command, `<PORT>`, `<MODEL_PATH>`): the recipe
# carries it so nothing is invented or dropped; lint reports it (unset-value, an error) until it is set.
UNSET_VALUE = re.compile(r"<[A-Za-z_][A-Za-z0-9_]*>")
UNSET_PATTERN = f"^{UNSET_VALUE.pattern}$"
Unset = Annotated[str, Field(pattern=UNSET_PATTERN)]


def check_unset_path(value: str) -> str:
    """<ROOT>/DeepSeek-V3 or /models/<NAME>: a path with whole components import could not know; with each <NAME>
    read as a plain component (a leading one as under /), the rest is an absolute path's grammar."""
    parts = value.split("/")
    if any("<" in p or ">" in p for p in parts if not UNSET_VALUE.fullmatch(p)):
        raise ValueError(
            f"{value!r}: a <NAME> stands for a whole path component (e.g. <MODEL_ROOT>/GLM-5); write "
            "the absolute path of the weights"
        )
    known = UNSET_VALUE.sub(lambda m: m.group(0)[1:-1], value)
    check_abs_path(known if value.startswith("/") else f"/{known}")
    return value


def check_model_path(value: str) -> str:
    """An absolute path, or one with <NAME> components import could not know (lint reports them until set)."""
    return check_unset_path(value) if UNSET_VALUE.search(value) else check_abs_path(value)


UnsetPath = Annotated[str, AfterValidator(check_unset_path)]
ModelPath = Annotated[str, AfterValidator(check_model_path)]
Port = Annotated[int, Field(ge=1, le=65535)]


def dist_name(requirement: str) -> str:
    """PEP 503 name of a requirement's distribution, extras and version dropped: 'SGLang_Router[x]==1' ->
    'sglang-router'."""
    return re.sub(r"[-_.]+", "-", requirement.partition("==")[0].split("[", 1)[0]).lower()


def is_set(value: Any) -> bool:
    """False for an Unset value (`<NAME>`), which no arithmetic or listener check can use."""
    return not (isinstance(value, str) and re.fullmatch(UNSET_PATTERN, value))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_control_characters(cls, value: Any, info) -> Any:
        _walk_strings(value, info.field_name in PROSE_FIELDS)
        return value


Scalar = str | int | float


def _env_scalar(value: Any) -> Any:
    """An env value as text: numbers become text; a YAML boolean is refused (each value on its own, so the error
    names its key: env.NAME)."""
    if isinstance(value, bool):
        # YAML turns yes/no/on/off/true into booleans; an env var is text, and SGLang reads
        # "True" and "1" differently from "true" in places. Make the author write what they mean.
        raise ValueError("the value is a YAML boolean; write the value as quoted text ('1' or 'True')")
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"the value is a {type(value).__name__}; write a scalar (text or a number)")
    return value


def _coerce_env(value: Any) -> Any:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    return value


def env_value_problem(value: str) -> str | None:
    """Why systemd's EnvironmentFile and docker's --env-file would read a KEY=VALUE line differently, or None.

    docker takes everything after the first '=' verbatim; systemd strips surrounding whitespace, treats a leading
    quote as quoting and a backslash as an escape. Values without those read the same in both (tested against
    both readers in tests/test_every_value_is_data.py), so one env file serves both runtimes."""
    if control_problem(value):
        return control_problem(value)
    if value != value.strip(" "):
        return "leading or trailing spaces (systemd strips them, docker keeps them)"
    if "\\" in value:
        return "a backslash (systemd reads it as an escape, docker verbatim)"
    if value[:1] in ("'", '"'):
        return "a leading quote (systemd reads it as quoting, docker verbatim)"
    return None


def env_value_fix(why: str) -> str:
    """What to write instead of a value env_value_problem refuses."""
    if why.startswith("control character"):
        return "write it on one line, without tabs or other control characters"
    if why.startswith("leading or trailing spaces"):
        return "write it without leading or trailing spaces"
    if why.startswith("a backslash"):
        return "write it without backslashes"
    return "write it without the leading quote (YAML's own quotes are not part of the value)"


def _check_env_value(value: str) -> str:
    why = env_value_problem(value)
    if why:
        raise ValueError(f"the value has {why}; {env_value_fix(why)}")
    return value


# env maps: each key and each value validated on its own, so an error names the exact key (env.NAME)
EnvValue = Annotated[str, BeforeValidator(_env_scalar), AfterValidator(_check_env_value)]
EnvKey = Annotated[
    str,
    AfterValidator(
        _grammar(ENV_NAME.pattern, "an environment variable name (letters, digits, _; not first a digit)", "NCCL_DEBUG")
    ),
]


# --------------------------------------------------------------------------- hardware


# Compute architectures: NVIDIA's SM versions (sm80 A100, sm86/sm89 Ampere/Ada workstation, sm90 Hopper, sm100
# B200/GB200,
# sm103 B300/GB300, sm120 RTX PRO 6000 Blackwell, ...), Huawei's Ascend generations (ascend-a3), or none (CPU only).
ARCH_PATTERN = r"sm[0-9]{2,3}[a-z]?|ascend-[a-z0-9]+|none"
ARCH_VENDOR = {"sm": "nvidia", "ascend-": "huawei", "none": "none"}
Arch = Annotated[
    str,
    AfterValidator(
        _grammar(
            ARCH_PATTERN,
            "an accelerator architecture (smNN for NVIDIA, ascend-NAME for Huawei, none)",
            "sm90, sm100, sm120, ascend-a3",
        )
    ),
]


class Accelerator(Strict):
    vendor: Literal["nvidia", "huawei", "none"]
    arch: Arch = Field(
        description=f"compute architecture, one of the forms {ARCH_PATTERN} (e.g. sm80, sm86, sm89, "
        "sm90, sm100, sm103, sm120, ascend-a3, none)",
        json_schema_extra={"pattern": f"^({ARCH_PATTERN})$"},
    )
    name: str = Field(description="Device name as the driver reports it (nvidia-smi / npu-smi)")
    count: int = Field(ge=0, description="Devices per node (NPU dies for Ascend)")
    memory_gib: int = Field(ge=0, description="Memory per device")
    interconnect: str = Field(description="pcie, nvlink-mnnvl, hccs, ...")
    max_q: bool = Field(False, description="Max-Q cards: the only ones where memory-clock offsets are supported")

    @model_validator(mode="after")
    def _arch_of_vendor(self) -> Accelerator:
        expected = next(v for prefix, v in ARCH_VENDOR.items() if self.arch.startswith(prefix))
        if expected != self.vendor:
            raise ValueError(
                f"arch {self.arch} is not an architecture of vendor {self.vendor} (smNN: nvidia, "
                "ascend-NAME: huawei, none: none)"
            )
        return self


class HardwareProfile(Strict):
    id: str
    description: str
    accelerator: Accelerator
    cpu_arch: Literal["x86_64", "aarch64"]
    driver_branch: str | None = Field(
        None, description="NVIDIA driver branch (580 for Blackwell) or Ascend HDK version"
    )
    toolkit: str | None = Field(None, description="CUDA toolkit (13.0) or CANN version")
    fabric_manager: bool = Field(
        False,
        description="NVIDIA Fabric Manager must run (HGX/DGX boards whose GPUs meet "
        "through NVSwitch: without it CUDA cannot use them); not on PCIe cards nor on "
        "GB200/GB300 trays, whose NVLink switches are managed outside the node (IMEX there)",
    )
    tuning: HostTuning = Field(default_factory=lambda: HostTuning())

    @model_validator(mode="after")
    def _fabric_manager_on_nvswitch(self) -> HardwareProfile:
        if self.fabric_manager and (self.accelerator.vendor, self.accelerator.interconnect) != ("nvidia", "nvswitch"):
            raise ValueError(
                f"fabric_manager: true is for NVIDIA boards with interconnect nvswitch, not "
                f"{self.accelerator.vendor} {self.accelerator.interconnect}; write fabric_manager: false "
                "(or leave it out)"
            )
        return self


# --------------------------------------------------------------------------- host tuning


class NcclGraph(Strict):
    """NCCL topology graph XML (NCCL_GRAPH_FILE): measured +11% on Genoa with 2 NUMA nodes."""

    path: AbsPath = Field(description="Where the file lives on the host; NCCL_GRAPH_FILE points here")
    source: str = Field(
        description="files/ path in this repo, a file beside the recipe or in the recipe catalogue "
        "(a relative path, never outside them), or a URL on the cluster's mirror"
    )
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if "://" in value:
            return check_url(value)
        # a controller file uploaded to every host, world-readable: only from the directories ironserve owns
        # (roles/nccl.graph_source_file confines it, symlinks resolved)
        if value.startswith(("/", "~")) or ".." in value.split("/"):
            raise ValueError(
                f"{value!r} names a file outside the recipe directories; write a path relative to the "
                "checkout's files/ or to the recipe's directory, without '..' (e.g. "
                "files/nccl/nccl_graph_opt.xml)"
            )
        refuse_shell_syntax(value, _PATH_CHARS, "a path", f"{_WRITE_PATH} (e.g. files/nccl/nccl_graph_opt.xml)")
        return value


class Limits(Strict):
    memlock: Literal["unlimited"] | int | None = "unlimited"
    stack: int | None = Field(67108864, description="bytes; the seeds' docker --ulimit stack=67108864")
    nofile: int | None = 1048576


class HostTuning(Strict):
    governor: Literal["performance", "powersave", "schedutil", "ondemand"] | None = None
    sysctls: dict[str, Scalar] = Field(default_factory=dict)
    limits: Limits = Field(default_factory=Limits)
    shm_size: str | None = Field(None, pattern=r"^[0-9]+[kmgKMG]?$", description="/dev/shm size, e.g. 8g")
    nccl_graph: NcclGraph | None = None
    gpu_memory_clock_offset_mhz: int | None = Field(
        None, description="GDDR7 memory clock offset set with nvmlDeviceSetMemClkVfOffset; Max-Q cards only"
    )
    cpu_affinity: bool = Field(False, description="SGLANG_SET_CPU_AFFINITY=1: bind ranks to cores for less jitter")

    @field_validator("sysctls")
    @classmethod
    def _sysctl_names(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for key in value:
            if not re.match(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$", key):
                raise ValueError(f"sysctl name {key!r} is not of the form vm.swappiness")
        return value


HardwareProfile.model_rebuild()


# --------------------------------------------------------------------------- runtime


class DockerRun(Strict):
    shm_size: str | None = "8g"
    ipc_host: bool = True
    network_host: bool = True
    gpus: str | None = "all"
    privileged: bool = False
    cpuset_cpus: str | None = Field(None, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")
    ulimits: dict[
        Annotated[str, Field(pattern=r"^[a-z]+$")], Annotated[str, Field(pattern=r"^(-?[0-9]+(:-?[0-9]+)?|unlimited)$")]
    ] = Field(default_factory=lambda: {"memlock": "-1", "stack": "67108864"})
    volumes: list[str] = Field(default_factory=list, description="host:container[:ro] mounts")
    devices: list[AbsPath] = Field(default_factory=list)
    env_files: list[AbsPath] = Field(
        default_factory=list,
        description="host env files passed with --env-file, by reference (after the unit's own env file)",
    )
    entrypoint: str | None = Field(None, description="--entrypoint: the first words of the engine argv it replaces")
    extra_options: list[str] = Field(
        default_factory=list,
        description="other docker run options, as written (--runtime=nvidia, -p 30000:30000, --cap-add=...)",
    )

    @field_validator("ulimits", mode="before")
    @classmethod
    def _ulimit_text(cls, value: Any) -> Any:
        return {k: str(v) for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, value: list[str]) -> list[str]:
        for volume in value:
            parts = volume.split(":")
            if len(parts) not in (2, 3) or (len(parts) == 3 and not re.fullmatch(r"[a-z,]+", parts[2])):
                raise ValueError(f"volume {volume!r} is not host:container[:ro]")
            # docker reads a host part that is not absolute as a named volume; `..` climbs out of what was meant
            if ".." in parts[0].split("/") or ".." in parts[1].split("/"):
                raise ValueError(f"volume {volume!r} climbs with '..': write normalised paths")
            check_abs_path(parts[1])
        return value


class DockerRuntime(Strict):
    kind: Literal["docker"]
    image: ImageRef = Field(description="repository:tag as published")
    digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$", description="pin; resolved at deploy if absent")
    patches: list[str] = Field(
        default_factory=list,
        description="Dockerfile lines applied on top of the pinned image (a derived image is built)",
    )
    run: DockerRun = Field(default_factory=DockerRun)
    source_env: list[AbsPath] = Field(default_factory=list, description="scripts sourced before the engine starts")

    # the derived image in the site's registry (REPOSITORY@sha256:..., or the placeholder of one this run pushes):
    # set by the deploy and the audit from host data docker_derived_registry (ironserve/derived_image.py), never
    # by a recipe (a private attribute: no recipe key, no schema)
    _derived: str | None = PrivateAttr(None)

    @property
    def pinned_ref(self) -> str:
        repo = self.image.rsplit(":", 1)[0] if ":" in self.image.split("/")[-1] else self.image
        return f"{repo}@{self.digest}" if self.digest else self.image

    @property
    def derived_ref(self) -> str | None:
        """The derived image every host pulls from the site's registry (None: each host builds its own)."""
        return self._derived

    def with_derived(self, ref: str | None) -> DockerRuntime:
        """A copy naming ``ref`` as its derived image (None: the image each host builds)."""
        copy = self.model_copy()
        copy._derived = ref
        return copy


class UvRuntime(Strict):
    kind: Literal["uv"]
    python: str = Field(pattern=r"^3\.[0-9]+$")
    packages: list[str] = Field(description="pinned requirements, name==version")
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    index_strategy: Literal["first-index", "unsafe-first-match", "unsafe-best-match"] | None = None
    prerelease: bool = False
    source_env: list[AbsPath] = Field(default_factory=list, description="scripts sourced before the engine starts")
    overrides: list[str] = Field(
        default_factory=list,
        description="pins that replace every requirement on the "
        "same package, the packages' own included (uv --overrides): a build whose published "
        "metadata names another platform's dependencies (SGLang's NPU path)",
    )
    excludes: list[str] = Field(
        default_factory=list,
        description="distributions left out of resolution (uv "
        "--excludes): the CUDA-only dependencies a non-CUDA build never imports",
    )

    @field_validator("index_url", "extra_index_urls")
    @classmethod
    def _index_refs(cls, value):
        for ref in [value] if isinstance(value, str) else (value or []):
            if ref.startswith("index:") and re.fullmatch(r"index:[a-z0-9][a-z0-9_.\-]*", ref):
                continue
            if ref.startswith("http://"):
                # pip verifies nothing it fetches over plain http: a recipe never names one; an inventory may map
                # index:NAME to an internal http mirror with allow_http_index=true
                raise ValueError(f"index {ref!r} is plain http: use https, or index:NAME mapped by the inventory")
            if not (ref.startswith("index:") or re.match(r"^(https|file)://", ref)):
                raise ValueError(
                    f"index {ref!r}: write index:NAME (mapped by the inventory's package_indexes) or a URL"
                )
            check_url(ref)
        return value

    @field_validator("packages", "overrides", "excludes")
    @classmethod
    def _pinned(cls, value: list[str], info) -> list[str]:
        # excludes name distributions; packages and overrides pin them
        names = info.field_name == "excludes"
        pattern = r"[A-Za-z0-9][A-Za-z0-9_.\-]*" if names else r"[A-Za-z0-9_.\-\[\],]+==[A-Za-z0-9_.+\-]+"
        for req in value:
            if not re.fullmatch(pattern, req):
                raise ValueError(
                    f"exclude {req!r} is not a distribution name"
                    if names
                    else f"package {req!r} is not pinned: write name==version"
                )
        return value

    def pinned(self) -> dict[str, str]:
        """{distribution name (dist_name): pinned version} of ``packages``."""
        return {dist_name(req): req.partition("==")[2] for req in self.packages}

    @model_validator(mode="after")
    def _consistent(self) -> UvRuntime:
        # a package pinned at one version and overridden to another can never install as written
        pinned = self.pinned()
        for req in self.overrides:
            name, _, version = req.partition("==")
            if dist_name(name) in pinned and pinned[dist_name(name)] != version:
                raise ValueError(f"override {req!r} contradicts the pin {name}=={pinned[dist_name(name)]} of packages")
        for name in self.excludes:
            if dist_name(name) in pinned:
                raise ValueError(f"exclude {name!r} is also pinned in packages: drop one of them")
        return self


Runtime = Annotated[DockerRuntime | UvRuntime, Field(discriminator="kind")]


# --------------------------------------------------------------------------- engine and server


PYPI_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+|rc[0-9]+)?$")


class Engine(Strict):
    sglang: Version = Field(description="A PyPI version (0.5.9) or a named image era (dev-cu13-2026-03)")
    launcher: Literal["launch_server", "serve", "router_launch_server"] = Field(
        "launch_server",
        description="router_launch_server: python -m sglang_router.launch_server, the router and "
        "--dp-size engines in one process",
    )
    parser_version: Version | None = Field(
        None, description="PyPI version whose parser checks this command when `sglang` is an image era"
    )
    router: Version | None = Field(None, description="sglang-router PyPI version for router processes")

    @property
    def is_pypi(self) -> bool:
        return bool(PYPI_VERSION.match(self.sglang))

    @property
    def check_version(self) -> str | None:
        return self.sglang if self.is_pypi else self.parser_version


class Speculative(Strict):
    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM"]
    num_steps: int | None = Field(None, ge=1)
    eagle_topk: int | None = Field(None, ge=1)
    num_draft_tokens: int | None = Field(None, ge=1)
    draft_model_path: str | None = None
    draft_model_quantization: str | None = None


class ServerOptions(Strict):
    """Typed knobs for the common flags; ``extra_args`` keeps the rest in order.

    Field ``x_y`` renders as ``--x-y``. ``None`` means "not on the command line" (SGLang's default).
    String values may use placeholders filled per node: {node_address}, {group_head}, {deployment_head},
    {nic}, {model_path}.
    """

    model_path: str | None = None
    served_model_name: str | None = None
    host: str | None = Field(None, description="bind address, or a placeholder such as {node_address}")
    port: Port | Unset | None = None
    device: str | None = None
    tp_size: int | None = Field(None, ge=1)
    pp_size: int | None = Field(None, ge=1)
    dp_size: int | None = Field(None, ge=1)
    ep_size: int | None = Field(None, ge=1)
    enable_dp_attention: bool = False
    trust_remote_code: bool = False
    dtype: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    moe_runner_backend: str | None = None
    moe_a2a_backend: str | None = None
    deepep_mode: str | None = None
    fp4_gemm_backend: str | None = None
    fp8_gemm_backend: str | None = None
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    context_length: int | None = Field(None, ge=1)
    max_running_requests: int | None = Field(None, ge=1)
    max_prefill_tokens: int | None = Field(None, ge=1)
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = Field(None, ge=1)
    cuda_graph_bs: list[int] | None = None
    disable_cuda_graph: bool = False
    page_size: int | None = Field(None, ge=1)
    load_balance_method: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    speculative: Speculative | None = None
    model_loader_extra_config: dict[str, Any] | None = None
    mamba_scheduler_strategy: str | None = None
    disaggregation_transfer_backend: str | None = None
    enable_pcie_oneshot_allreduce: bool = False
    enable_metrics: bool = Field(
        True, description="SGLang's Prometheus /metrics on the engine's own port (on by default; false turns it off)"
    )
    enable_mixed_chunk: bool = False
    sleep_on_idle: bool = False
    skip_server_warmup: bool = False
    watchdog_timeout: int | None = None
    api_key_file: AbsPath | None = Field(
        None, description="file on the host holding the API key; passed via the unit's 0600 env file, never in argv"
    )
    extra_args: list[str] = Field(default_factory=list, description="other flags, in order, full names")

    @field_validator("extra_args", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [str(v) for v in value]
        return value

    @field_validator("extra_args")
    @classmethod
    def _flags_first(cls, value: list[str]) -> list[str]:
        if value and not value[0].startswith("--"):
            raise ValueError(f"extra_args must start with a flag (--name), got {value[0]!r}")
        derived = derived_flag_problems(value)
        if derived:
            raise ValueError(
                "; ".join(
                    f"{flag} does not belong in extra_args: render derives it from {where} (set that instead)"
                    for flag, where in derived
                )
            )
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return value if value is None or re.fullmatch(r"\{[a-z_]+\}", value) else check_address(value)

    @field_validator("model_path")
    @classmethod
    def _model_path(cls, value: str | None) -> str | None:
        if value and value.startswith("/"):
            check_abs_path(value)
        elif value and ".." in value.split("/"):
            raise ValueError(f"model_path {value!r} climbs with '..': write an absolute path or a hub id")
        return value


# flags render derives from typed fields and the topology, which later stages read as the process's fields
# (bind address, dist-init address, ranks, devices, model path): in extra_args they would contradict them
DERIVED_FLAGS = {
    "--host": "server.host",
    "--port": "server.port",
    "--model-path": "server.model_path",
    "--model": "server.model_path",
    "--tp-size": "server.tp_size",
    "--tp": "server.tp_size",
    "--tensor-parallel-size": "server.tp_size",
    "--pp-size": "server.pp_size",
    "--pp": "server.pp_size",
    "--pipeline-parallel-size": "server.pp_size",
    "--dp-size": "server.dp_size",
    "--dp": "server.dp_size",
    "--data-parallel-size": "server.dp_size",
    "--enable-dp-attention": "server.enable_dp_attention",
    "--dist-init-addr": "topology.groups[].dist_init_port (the address is rank 0's)",
    "--nnodes": "topology.groups[].nodes",
    "--node-rank": "the inventory order of the group's hosts",
    "--disaggregation-mode": "topology.groups[].role",
    "--disaggregation-bootstrap-port": "topology.groups[].bootstrap_port",
}


def derived_flag_problems(extra_args: list[str]) -> list[tuple[str, str]]:
    """(flag, where it belongs) for each flag of extra_args that render derives from a typed field."""
    names = [a.split("=", 1)[0] for a in extra_args if a.startswith("--")]
    return [(n, DERIVED_FLAGS[n]) for n in names if n in DERIVED_FLAGS]


# The typed options that are not one "--name value" flag of their own: speculative (its table below), extra_args
# (flags as written), api_key_file (the key reaches the engine through its 0600 env file, never argv), model_path
# (render writes it first, per host)
NOT_FLAG_FIELDS = frozenset({"speculative", "extra_args", "api_key_file", "model_path"})
# One two-way table of typed field <-> SGLang flag: render reads it to write argv, import reads it backwards to turn
# argv into fields, so a field added to ServerOptions or Speculative is both rendered and imported. SGLang names
# its flags after its ServerArgs fields (x_y is --x-y; speculative_x_y is --speculative-x-y).
SERVER_FLAGS: dict[str, str] = {
    name: "--" + name.replace("_", "-") for name in ServerOptions.model_fields if name not in NOT_FLAG_FIELDS
}
SPECULATIVE_FLAGS: dict[str, str] = {
    name: "--speculative-" + name.replace("_", "-") for name in Speculative.model_fields
}


@dataclass(frozen=True)
class Parallelism:
    """How one engine instance spreads over accelerators, as SGLang reads its sizes.

    Each data-parallel replica is a TP x PP group of devices. Without --enable-dp-attention, SGLang's DP
    controller starts --dp-size replicas, each on devices of its own (its base GPU moves on by TP x PP); with it,
    the DP ranks split attention inside one TP group and share its devices. sglang_router.launch_server always
    starts --dp-size separate servers (each dp_size 1, its base GPU moved on by TP), DP attention or not."""

    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    dp_attention: bool = False
    launcher: str = "launch_server"

    @classmethod
    def of(cls, server: ServerOptions, launcher: str = "launch_server") -> Parallelism:
        return cls(server.tp_size or 1, server.pp_size or 1, server.dp_size or 1, server.enable_dp_attention, launcher)

    @property
    def replicas(self) -> int:
        """TP x PP groups that each need devices of their own."""
        own_devices = self.launcher == "router_launch_server" or not self.dp_attention
        return self.dp_size if own_devices else 1

    def devices_per_node(self, nodes: int) -> int:
        """Accelerators one node of the instance drives: all its replicas' devices, spread over its nodes."""
        return -(-(self.tp_size * self.pp_size * self.replicas) // max(1, nodes))


def devices_per_node(server: ServerOptions, nodes: int, launcher: str = "launch_server") -> int:
    """Accelerators one node of an engine instance of ``server`` drives (Parallelism: the one rule)."""
    return Parallelism.of(server, launcher).devices_per_node(nodes)


class Router(Strict):
    policy: Literal["round_robin", "random", "cache_aware", "power_of_two"] = "round_robin"
    host: Address | Unset = "127.0.0.1"
    port: Port | Unset = 30000
    prometheus_port: int = Field(
        29000,
        ge=1,
        le=65535,
        description="sglang-router's Prometheus endpoint, bound to the router's own address (--prometheus-host)",
    )
    extra_args: list[str] = Field(default_factory=list)
    env: dict[EnvKey, EnvValue] = Field(
        default_factory=dict, description="the router's own environment (SGLANG_DP_ROUND_ROBIN=1, RUST_LOG=...)"
    )
    host_placement: Literal["deployment_head", "dedicated"] = Field(
        "deployment_head",
        description="deployment_head: runs on the first worker host; dedicated: needs an inventory host with"
        " ironserve_role=router",
    )

    _coerce = field_validator("env", mode="before")(lambda cls, v: _coerce_env(v))


# rank 0 of a multi-node group runs its rank guard (files/bin/ironserve_rank_guard.py) on the group's dist-init
# port + 100: SGLang itself takes dist-init .. dist-init + 6 + dp
RANK_GUARD_PORT_OFFSET = 100
# SGLang derives its own ports from a multi-node group's dist-init port: dist-init .. dist-init + 6 (+ one per dp
# rank); ironserve's rank guard listens on dist-init + RANK_GUARD_PORT_OFFSET
DIST_INIT_DERIVED = 6


class Group(Strict):
    """A set of identical engine instances: one server, one prefill or one decode group."""

    role: Literal["server", "prefill", "decode"] = "server"
    instances: int = Field(1, ge=1, description="independent copies (replicas) of this group")
    nodes: int = Field(1, ge=1, description="nodes per instance (multi-node TP when > 1)")
    dist_init_port: Port | Unset = 5000
    bootstrap_port: int | None = Field(
        None, description="prefill only: --disaggregation-bootstrap-port of the first instance (+1 per instance)"
    )
    explicit_single_node_rank: bool = Field(
        False, description="emit --nnodes 1 --node-rank 0 even for one node (as some seeds do)"
    )
    server: ServerOptions = Field(default_factory=ServerOptions)
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict)

    _coerce = field_validator("env", mode="before")(lambda cls, v: _coerce_env(v))


class Topology(Strict):
    kind: Literal["single", "multinode-tp", "replicas", "pd-disaggregation"] = "single"
    groups: list[Group] = Field(default_factory=lambda: [Group()])
    router: Router | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        roles = [g.role for g in self.groups]
        if self.kind == "pd-disaggregation":
            halves = {"prefill", "decode"} & set(roles)
            if not halves:
                raise ValueError("pd-disaggregation needs a prefill group and a decode group")
            # one half alone: the prefill (or decode) machines of a deployment whose other half and router are
            # another recipe's; both halves: the router in front of them is this recipe's
            if len(halves) == 2 and self.router is None:
                raise ValueError("pd-disaggregation needs a router (topology.router)")
            if len(halves) == 1 and self.router is not None:
                other = ({"prefill", "decode"} - halves).pop()
                raise ValueError(
                    f"a {halves.pop()}-only pd-disaggregation (no {other} group) has no router: it "
                    f"runs with the {other} half (add a {other} group, or leave topology.router out)"
                )
            for g in self.groups:
                if g.role == "prefill" and g.bootstrap_port is None:
                    raise ValueError("prefill groups need bootstrap_port (--disaggregation-bootstrap-port)")
        else:
            if any(r != "server" for r in roles):
                raise ValueError(f"topology {self.kind} has only role 'server' groups; use pd-disaggregation")
            if len(self.groups) != 1:
                raise ValueError(f"topology {self.kind} has exactly one group")
            g = self.groups[0]
            if self.kind == "single" and (g.nodes != 1 or g.instances != 1):
                raise ValueError("topology single is one instance on one node; use multinode-tp or replicas")
            if self.kind == "multinode-tp" and g.nodes < 2:
                raise ValueError("multinode-tp needs groups[0].nodes >= 2")
            if self.kind == "replicas" and (g.instances < 2 or self.router is None):
                raise ValueError("replicas needs groups[0].instances >= 2 and a router")
        return self

    @property
    def node_count(self) -> int:
        return sum(g.instances * g.nodes for g in self.groups)


# --------------------------------------------------------------------------- recipe


class Deviation(Strict):
    """A place where the recipe knowingly differs from its seed command, and why (usually the seed's own rule)."""

    env: str | None = Field(None, description="env var added or changed")
    flag: str | None = Field(None, description="flag added or changed (full name)")
    runtime: str | None = Field(
        None,
        description="runtime field chosen where the seed names no install (runtime.packages, runtime.overrides, ...)",
    )
    reason: str

    @model_validator(mode="after")
    def _one(self) -> Deviation:
        if sum(bool(x) for x in (self.env, self.flag, self.runtime)) != 1:
            raise ValueError("a deviation names exactly one env var, one flag or one runtime field")
        return self


class Source(Strict):
    seed: str = Field(description="seed file the recipe reproduces")
    section: str = Field(description="heading or lead-in text of the seed section")
    deviations: list[Deviation] = Field(default_factory=list)


Range = float | tuple[float, float]


class Expected(Strict):
    """The seed's own figures, to compare benchmark results against."""

    output_tok_s: Range | None = Field(None, description="single-stream decode tokens/s")
    total_output_tok_s: float | None = Field(None, description="aggregate output tokens/s under the benchmark")
    input_tok_s: Range | None = None
    tpot_ms: float | None = None
    ttft_ms: Range | None = None
    note: str = ""


class Benchmark(Strict):
    tool: Literal["bench_serving", "aiperf"] = "bench_serving"
    dataset_name: Literal["random", "random-ids", "generated-shared-prefix", "sharegpt"] = Field(
        "random", description="random samples ShareGPT texts (a download, or --dataset-path); random-ids needs no file"
    )
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    gsp_num_groups: int | None = None
    gsp_prompts_per_group: int | None = None
    gsp_system_prompt_len: int | None = None
    gsp_question_len: int | None = None
    gsp_output_len: int | None = None
    max_concurrency: int | None = None
    num_prompts: int | None = None
    request_rate: str | None = None


class ModelSource(Strict):
    hub_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$",
        description="Hugging Face repository id",
    )
    path: ModelPath | None = Field(None, description="path of the weights on the host (as in the seed)")
    revision: Version | None = None
    has_mtp_weights: bool | None = Field(None, description="checkpoint ships MTP/NEXTN layers")
    family: str = Field(description="model family: glm5, glm5.1, qwen3.5, kimi-k2.5, minimax-m2.5, llama3, tiny")
    generate: Literal["tiny-llama"] | None = Field(
        None, description="weights generated locally (lab); the lab's hub serves them under hub_id"
    )

    @model_validator(mode="after")
    def _some_source(self) -> ModelSource:
        if not (self.hub_id or self.path or self.generate):
            raise ValueError("model needs hub_id, path or generate")
        return self


class Recipe(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    description: str
    source: Source
    hardware: list[str] = Field(min_length=1, description="hardware profile ids this recipe is for")
    model: ModelSource
    engine: Engine
    runtime: Runtime
    topology: Topology = Field(default_factory=Topology)
    server: ServerOptions = Field(default_factory=ServerOptions)
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict)
    env_unset: list[EnvName] = Field(default_factory=list, description="variables removed from the service env")
    tuning: HostTuning | None = None
    expected: Expected = Field(default_factory=Expected)
    benchmark: Benchmark | None = None
    health_timeout_s: int = Field(3600, ge=10, description="cold start budget: weights + JIT can take an hour")
    notes: list[str] = Field(default_factory=list)

    _coerce = field_validator("env", mode="before")(lambda cls, v: _coerce_env(v))

    @field_validator("runtime")
    @classmethod
    def _router_pin_is_the_engines(cls, runtime: Runtime, info: ValidationInfo) -> Runtime:
        """The router runs sglang-router==engine.router (ironserve.units.router_venv): a uv runtime that pins
        another sglang-router would have the lock and the parse check vouch for a version no router runs."""
        router = getattr(info.data.get("engine"), "router", None)
        if not isinstance(runtime, UvRuntime) or not router:
            return runtime
        version = runtime.pinned().get("sglang-router", router)
        if version != router:
            raise ValueError(
                f"packages pins sglang-router=={version} but engine.router is {router}; write the same version in "
                f"both (sglang-router=={router} in runtime.packages, or engine.router: {version})"
            )
        return runtime

    def group_server(self, group: Group) -> ServerOptions:
        """The recipe-wide server options with the group's overrides on top."""
        merged = self.server.model_dump(exclude_unset=True)
        override = group.server.model_dump(exclude_unset=True)
        extra = merged.pop("extra_args", []) + override.pop("extra_args", [])
        merged.update(override)
        merged["extra_args"] = extra
        return ServerOptions.model_validate(merged)

    def group_env(self, group: Group) -> dict[str, str]:
        env = dict(self.env)
        env.update(group.env)
        return env


def effective_tuning(recipe: Recipe, profile: HardwareProfile) -> HostTuning:
    """The hardware profile's tuning with the recipe's on top (sysctls merged key by key)."""
    base = profile.tuning.model_dump(exclude_unset=True)
    own = recipe.tuning.model_dump(exclude_unset=True) if recipe.tuning else {}
    sysctls = {**base.pop("sysctls", {}), **own.pop("sysctls", {})}
    base.update(own)
    base["sysctls"] = sysctls
    return HostTuning.model_validate(base)


def resolve_index(ref: str | None, package_indexes: dict[str, str]) -> str | None:
    """index:NAME -> URL from the inventory's package_indexes; index:pypi -> None (the installer's default)."""
    if ref is None or not ref.startswith("index:"):
        return ref
    name = ref.split(":", 1)[1]
    if name in package_indexes:
        return package_indexes[name]
    if name == "pypi":
        return None
    raise KeyError(f"package index '{name}' has no URL: set package_indexes={{'{name}': URL}} in the inventory")
