"""Spec models: the typed, strict shape of hardware profiles and recipes.

Everything a deploy, a render, a lint or an audit knows about a deployment comes from these objects.
They are strict on purpose (``extra="forbid"``): a typo in a recipe key must fail loudly before any
host is touched, not be ignored and discovered at minute 40 of a cold start.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


Scalar = Union[str, int, float]


def _env_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        # YAML turns yes/no/on/off/true into booleans; an env var is text, and SGLang reads
        # "True" and "1" differently from "true" in places. Make the author write what they mean.
        raise ValueError(f"env {key}: write the value as quoted text ('1' or 'True'), not a YAML boolean")
    if not isinstance(value, (str, int, float)):
        raise ValueError(f"env {key}: must be a scalar, got {type(value).__name__}")
    return str(value)


def _coerce_env(value: Any) -> Any:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): _env_value(str(k), v) for k, v in value.items()}
    return value


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_env_names(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not ENV_NAME.match(key):
            raise ValueError(f"env name {key!r} is not a valid variable name")
    return env


# --------------------------------------------------------------------------- hardware


class Accelerator(Strict):
    vendor: Literal["nvidia", "huawei", "none"]
    arch: Literal["sm120", "sm100", "ascend-a3", "none"]
    name: str = Field(description="Device name as the driver reports it (nvidia-smi / npu-smi)")
    count: int = Field(ge=0, description="Devices per node (NPU dies for Ascend)")
    memory_gib: int = Field(ge=0, description="Memory per device")
    interconnect: str = Field(description="pcie, nvlink-mnnvl, hccs, ...")
    max_q: bool = Field(False, description="Max-Q cards: the only ones where memory-clock offsets are supported")


class HardwareProfile(Strict):
    id: str
    description: str
    accelerator: Accelerator
    cpu_arch: Literal["x86_64", "aarch64"]
    driver_branch: str | None = Field(None, description="NVIDIA driver branch (580 for Blackwell) or Ascend HDK version")
    toolkit: str | None = Field(None, description="CUDA toolkit (13.0) or CANN version")
    tuning: "HostTuning" = Field(default_factory=lambda: HostTuning())


# --------------------------------------------------------------------------- host tuning


class NcclGraph(Strict):
    """NCCL topology graph XML (NCCL_GRAPH_FILE): measured +11% on Genoa with 2 NUMA nodes."""

    path: str = Field(description="Where the file lives on the host; NCCL_GRAPH_FILE points here")
    source: str = Field(description="files/ path in this repo, or a URL on the cluster's mirror")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")


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
    cpuset_cpus: str | None = None
    ulimits: dict[str, str] = Field(default_factory=lambda: {"memlock": "-1", "stack": "67108864"})
    volumes: list[str] = Field(default_factory=list, description="host:container[:ro] mounts")
    devices: list[str] = Field(default_factory=list)
    env_files: list[str] = Field(default_factory=list, description="host env files passed with --env-file, by "
                                 "reference (after the unit's own env file)")
    entrypoint: str | None = Field(None, description="--entrypoint: the first words of the engine argv it replaces")
    extra_options: list[str] = Field(default_factory=list, description="other docker run options, as written "
                                     "(--runtime=nvidia, -p 30000:30000, --cap-add=...)")


class DockerRuntime(Strict):
    kind: Literal["docker"]
    image: str = Field(description="repository:tag as published")
    digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$", description="pin; resolved at deploy if absent")
    patches: list[str] = Field(
        default_factory=list,
        description="Dockerfile lines applied on top of the pinned image (a derived image is built)",
    )
    run: DockerRun = Field(default_factory=DockerRun)
    source_env: list[str] = Field(default_factory=list, description="scripts sourced before the engine starts")

    @property
    def pinned_ref(self) -> str:
        repo = self.image.rsplit(":", 1)[0] if ":" in self.image.split("/")[-1] else self.image
        return f"{repo}@{self.digest}" if self.digest else self.image


class UvRuntime(Strict):
    kind: Literal["uv"]
    python: str = Field(pattern=r"^3\.[0-9]+$")
    packages: list[str] = Field(description="pinned requirements, name==version")
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    index_strategy: Literal["first-index", "unsafe-first-match", "unsafe-best-match"] | None = None
    prerelease: bool = False
    source_env: list[str] = Field(default_factory=list, description="scripts sourced before the engine starts")

    @field_validator("index_url", "extra_index_urls")
    @classmethod
    def _index_refs(cls, value):
        for ref in [value] if isinstance(value, str) else (value or []):
            if not (ref.startswith("index:") or re.match(r"^(https?|file)://", ref)):
                raise ValueError(f"index {ref!r}: write index:NAME (mapped by the inventory's package_indexes) or a URL")
        return value

    @field_validator("packages")
    @classmethod
    def _pinned(cls, value: list[str]) -> list[str]:
        for req in value:
            if not re.match(r"^[A-Za-z0-9_.\-\[\],]+==[A-Za-z0-9_.+\-]+$", req):
                raise ValueError(f"package {req!r} is not pinned: write name==version")
        return value


Runtime = Annotated[Union[DockerRuntime, UvRuntime], Field(discriminator="kind")]


# --------------------------------------------------------------------------- engine and server


PYPI_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+|rc[0-9]+)?$")


class Engine(Strict):
    sglang: str = Field(description="A PyPI version (0.5.9) or a named image era (dev-cu13-2026-03)")
    launcher: Literal["launch_server", "serve", "router_launch_server"] = Field(
        "launch_server", description="router_launch_server: python -m sglang_router.launch_server, the router and "
        "--dp-size engines in one process")
    parser_version: str | None = Field(
        None, description="PyPI version whose parser checks this command when `sglang` is an image era"
    )
    router: str | None = Field(None, description="sglang-router PyPI version for router processes")

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
    host: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
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
    enable_metrics: bool = False
    enable_mixed_chunk: bool = False
    sleep_on_idle: bool = False
    skip_server_warmup: bool = False
    watchdog_timeout: int | None = None
    api_key_file: str | None = Field(
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
            raise ValueError("; ".join(f"{flag} does not belong in extra_args: render derives it from {where} "
                                       f"(set that instead)" for flag, where in derived))
        return value


# flags render derives from typed fields and the topology, which later stages read as the process's fields
# (bind address, dist-init address, ranks, devices, model path): in extra_args they would contradict them
DERIVED_FLAGS = {
    "--host": "server.host", "--port": "server.port", "--model-path": "server.model_path",
    "--model": "server.model_path", "--tp-size": "server.tp_size", "--tp": "server.tp_size",
    "--tensor-parallel-size": "server.tp_size", "--pp-size": "server.pp_size", "--pp": "server.pp_size",
    "--pipeline-parallel-size": "server.pp_size", "--dp-size": "server.dp_size", "--dp": "server.dp_size",
    "--data-parallel-size": "server.dp_size", "--enable-dp-attention": "server.enable_dp_attention",
    "--dist-init-addr": "topology.groups[].dist_init_port (the address is rank 0's)",
    "--nnodes": "topology.groups[].nodes", "--node-rank": "the inventory order of the group's hosts",
    "--disaggregation-mode": "topology.groups[].role",
    "--disaggregation-bootstrap-port": "topology.groups[].bootstrap_port",
}


def derived_flag_problems(extra_args: list[str]) -> list[tuple[str, str]]:
    """(flag, where it belongs) for each flag of extra_args that render derives from a typed field."""
    names = [a.split("=", 1)[0] for a in extra_args if a.startswith("--")]
    return [(n, DERIVED_FLAGS[n]) for n in names if n in DERIVED_FLAGS]


def devices_per_node(server: ServerOptions, nodes: int) -> int:
    """Accelerators one node of an engine instance drives: TP x PP, x DP unless DP attention (which runs DP
    inside the TP group), spread over the instance's nodes."""
    world = (server.tp_size or 1) * (server.pp_size or 1)
    if not server.enable_dp_attention:
        world *= server.dp_size or 1
    return -(-world // max(1, nodes))


class Router(Strict):
    policy: Literal["round_robin", "random", "cache_aware", "power_of_two"] = "round_robin"
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1, le=65535)
    extra_args: list[str] = Field(default_factory=list)
    host_placement: Literal["deployment_head", "dedicated"] = Field(
        "deployment_head",
        description="deployment_head: runs on the first worker host; dedicated: needs an inventory host with"
        " ironserve_role=router",
    )


# rank 0 of a multi-node group runs its rank guard (files/bin/ironserve-rank-guard) on the group's dist-init
# port + 100: SGLang itself takes dist-init .. dist-init + 6 + dp
RANK_GUARD_PORT_OFFSET = 100


class Group(Strict):
    """A set of identical engine instances: one server, one prefill or one decode group."""

    role: Literal["server", "prefill", "decode"] = "server"
    instances: int = Field(1, ge=1, description="independent copies (replicas) of this group")
    nodes: int = Field(1, ge=1, description="nodes per instance (multi-node TP when > 1)")
    dist_init_port: int = Field(5000, ge=1, le=65535)
    bootstrap_port: int | None = Field(
        None, description="prefill only: --disaggregation-bootstrap-port of the first instance (+1 per instance)"
    )
    explicit_single_node_rank: bool = Field(
        False, description="emit --nnodes 1 --node-rank 0 even for one node (as some seeds do)"
    )
    server: ServerOptions = Field(default_factory=ServerOptions)
    env: dict[str, str] = Field(default_factory=dict)

    _coerce = field_validator("env", mode="before")(lambda cls, v: _coerce_env(v))
    _names = field_validator("env")(lambda cls, v: _check_env_names(v))


class Topology(Strict):
    kind: Literal["single", "multinode-tp", "replicas", "pd-disaggregation"] = "single"
    groups: list[Group] = Field(default_factory=lambda: [Group()])
    router: Router | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "Topology":
        roles = [g.role for g in self.groups]
        if self.kind == "pd-disaggregation":
            if "prefill" not in roles or "decode" not in roles:
                raise ValueError("pd-disaggregation needs a prefill group and a decode group")
            if self.router is None:
                raise ValueError("pd-disaggregation needs a router (topology.router)")
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
    reason: str

    @model_validator(mode="after")
    def _one(self) -> "Deviation":
        if bool(self.env) == bool(self.flag):
            raise ValueError("a deviation names exactly one env var or one flag")
        return self


class Source(Strict):
    seed: str = Field(description="seed file the recipe reproduces")
    section: str = Field(description="heading or lead-in text of the seed section")
    deviations: list[Deviation] = Field(default_factory=list)


Range = Union[float, tuple[float, float]]


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
        "random", description="random samples ShareGPT texts (a download, or --dataset-path); random-ids needs no file")
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
    hub_id: str | None = Field(None, description="Hugging Face repository id")
    path: str | None = Field(None, description="path of the weights on the host (as in the seed)")
    revision: str | None = None
    has_mtp_weights: bool | None = Field(None, description="checkpoint ships MTP/NEXTN layers")
    family: str = Field(description="model family: glm5, glm5.1, qwen3.5, kimi-k2.5, minimax-m2.5, llama3, tiny")
    generate: Literal["tiny-llama"] | None = Field(None, description="weights generated locally (lab), no hub")

    @model_validator(mode="after")
    def _some_source(self) -> "ModelSource":
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
    env: dict[str, str] = Field(default_factory=dict)
    env_unset: list[str] = Field(default_factory=list, description="variables removed from the service env")
    tuning: HostTuning | None = None
    expected: Expected = Field(default_factory=Expected)
    benchmark: Benchmark | None = None
    health_timeout_s: int = Field(3600, ge=10, description="cold start budget: weights + JIT can take an hour")
    notes: list[str] = Field(default_factory=list)

    _coerce = field_validator("env", mode="before")(lambda cls, v: _coerce_env(v))
    _names = field_validator("env")(lambda cls, v: _check_env_names(v))

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
