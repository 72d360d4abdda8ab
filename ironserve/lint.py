"""Lint: the field guides' pitfalls as rules, run on recipes and on pasted commands.

Each rule reads one launch (hardware, engine, env, flags, model, runtime) and returns findings.
Errors are what crashes, corrupts output or cannot start; everything else is a warning. Every rule cites
the seed statement it encodes, so a finding can be traced to the field experience behind it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .commandline import SECRET_FLAGS, SECRET_NAME, SECRET_VALUE, CommandError, parse_command
from .findings import Finding, Severity
from .flags import ABBREVIATIONS, AMBIGUOUS, canonical, launcher_split, split_flags
from .pins import RULES as PIN_RULES
from .spec import (
    UNSET_VALUE,
    DockerRuntime,
    HardwareProfile,
    HostTuning,
    Parallelism,
    Recipe,
    UvRuntime,
    binds_every_address,
)

# The engine era the seeds use per accelerator arch, for pasted commands linted without --engine.
SEED_ERA = {"sm120": "dev-cu13-2026-03", "sm100": "dynamo-1.1.1", "ascend-a3": "ascend-2026-04", "none": "0.5.23"}
LATEST_ERA = SEED_ERA["none"]  # architectures no seed covers (sm90, sm103, ...): the newest release ironserve knows


def seed_era(arch: str) -> str:
    return SEED_ERA.get(arch, LATEST_ERA)


# Flags the seeds use that SGLang 0.5.23 no longer accepts, found by its own parser (docs/engine-flags.md).
DROPPED_IN = {
    "0.5.23": {
        "--enable-pcie-oneshot-allreduce": "no PyPI release has it (a patched nightly image did): remove it",
        "--cuda-graph-max-bs": "now an ambiguous prefix: use --cuda-graph-max-bs-decode",
        "--cuda-graph-bs": "now an ambiguous prefix: use --cuda-graph-bs-decode",
        "--mamba-scheduler-strategy": "renamed: use --mamba-radix-cache-strategy",
        "--enable-nsa-prefill-context-parallel": "renamed: use --enable-prefill-cp",
        "--nsa-prefill-cp-mode": "renamed: use --cp-strategy (in-seq-split -> zigzag)",
        "--prefill-round-robin-balance": "removed (deprecated since 0.5.9): drop it",
        "--nsa-decode-backend": "renamed: use --dsa-decode-backend",
        "--nsa-prefill-backend": "renamed: use --dsa-prefill-backend",
        "--torchao-config": "removed in 0.5.19: drop it",
    }
}
DROPPED_CHOICES = {"0.5.23": {("--tool-call-parser", "qwen3"): "use --tool-call-parser qwen3_coder"}}


# model path pattern -> family, first match wins (more specific first)
FAMILIES = (
    (r"glm-?5\.1", "glm5.1"),
    (r"glm-?5", "glm5"),
    (r"kimi", "kimi-k2.5"),
    (r"minimax", "minimax-m2.5"),
    (r"qwen3[._-]?5", "qwen3.5"),
    (r"qwen3-?next", "qwen3-next"),
    (r"llama-?4", "llama4"),
    (r"deepseek-(v3|r1)", "deepseek-v3"),
    (r"llama", "llama3"),
    (r"qwen3", "qwen3"),
)


def model_family(model_path: str) -> str:
    """The model family a checkpoint name says (glm5, qwen3.5, llama4, ...), '' when none is known."""
    m = model_path.lower()
    return next((family for pattern, family in FAMILIES if re.search(pattern, m)), "")


@dataclass
class Launch:
    """One engine command as lint sees it: canonical flags plus what is known around it."""

    hardware: HardwareProfile
    flags: dict[str, list[str]]
    env: dict[str, str]
    engine: str
    written_flags: list[str] = field(default_factory=list)  # as typed, for abbreviation checks
    model_path: str = ""
    has_mtp_weights: bool | None = None
    runtime: DockerRuntime | UvRuntime | None = None
    tuning: HostTuning | None = None
    where: str = ""
    from_recipe: bool = False  # recipes get per-host values (NIC, ranks) from the inventory at render time
    has_api_key: bool = False
    launcher: str = "launch_server"  # router_launch_server runs --dp-size engines of --tp-size devices each
    launch_error: str = ""  # the command is no SGLang launch of any release (commandline.CommandError)
    launch_fix: str = ""

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def value(self, flag: str) -> str | None:
        values = self.flags.get(flag)
        return values[0] if values else None

    def int_value(self, flag: str, default: int = 1) -> int:
        try:
            return int(self.value(flag) or default)
        except ValueError:
            return default

    @property
    def arch(self) -> str:
        return self.hardware.accelerator.arch

    @property
    def sm120_pcie(self) -> bool:
        """RTX PRO 6000 on PCIe: the seeds' custom-allreduce findings are about its patched images only."""
        return self.arch == "sm120" and self.hardware.accelerator.interconnect == "pcie"

    @property
    def family(self) -> str:
        return model_family(self.model_path)

    @property
    def nvfp4(self) -> bool:
        return self.value("--quantization") == "modelopt_fp4" or "nvfp4" in self.model_path.lower()


Rule = Callable[[Launch], list[Finding]]


@dataclass(frozen=True)
class RuleInfo:
    severity: Severity
    summary: str
    fn: Rule
    scope: str  # where the field observed it: hardware, model family, engine era ("any" when universal)
    source: str  # the seed (or document) the rule encodes


RULES: dict[str, RuleInfo] = {}


def rule(rule_id: str, severity: Severity, summary: str, scope: str = "any launch", source: str = "ironserve"):
    def register(fn: Rule) -> Rule:
        RULES[rule_id] = RuleInfo(severity, summary, fn, scope, source)
        return fn

    return register


def _f(rule_id: str, launch: Launch, message: str, fix: str, severity: Severity | None = None) -> Finding:
    info = RULES[rule_id]
    return Finding(
        rule_id, severity or info.severity, f"{message} [scope: {info.scope}; source: {info.source}]", fix, launch.where
    )


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------- model/hardware pitfalls


@rule(
    "glm5-kv-cache-sm120",
    Severity.error,
    "GLM-5 on SM120 needs --kv-cache-dtype bf16; FP8 KV garbles output",
    scope="GLM-5 on SM120 (RTX PRO 6000), 2026-03 images",
    source="seed 000 (GLM-5 NVFP4 commands)",
)
def glm5_kv_cache(launch: Launch) -> list[Finding]:
    if launch.family != "glm5" or launch.arch != "sm120":
        return []
    kv = launch.value("--kv-cache-dtype")
    if kv and kv.startswith("fp8"):
        return [
            _f(
                "glm5-kv-cache-sm120",
                launch,
                f"--kv-cache-dtype {kv} on GLM-5/SM120 produces garbled output or stops after 1 token",
                "use --kv-cache-dtype bf16",
            )
        ]
    if kv != "bf16":
        return [
            _f(
                "glm5-kv-cache-sm120",
                launch,
                "GLM-5 on SM120 without --kv-cache-dtype bf16 (mandatory on SM120)",
                "add --kv-cache-dtype bf16",
                Severity.warning,
            )
        ]
    return []


# Where seed 000 saw NEXTN fall back to EAGLE and load the model twice: these families on 96 GB SM120 cards.
SPEC_V2_FAMILIES = ("glm5", "glm5.1", "qwen3.5")


@rule(
    "nextn-needs-spec-v2",
    Severity.error,
    "NEXTN/EAGLE without SGLANG_ENABLE_SPEC_V2 loads the model twice (OOM)",
    scope="GLM-5/GLM-5.1/Qwen3.5 on 96 GB SM120 cards (RTX PRO 6000), engines of 2026-03 and later; a warning for "
    "other models on SM120",
    source="seed 000 (SGLANG_ENABLE_SPEC_V2 table and 'Critical' note)",
)
def nextn_spec_v2(launch: Launch) -> list[Finding]:
    algo = launch.value("--speculative-algorithm")
    if algo not in ("NEXTN", "EAGLE") or launch.arch != "sm120" or _truthy(launch.env.get("SGLANG_ENABLE_SPEC_V2")):
        return []
    if launch.family in SPEC_V2_FAMILIES:
        return [
            _f(
                "nextn-needs-spec-v2",
                launch,
                f"--speculative-algorithm {algo} without SGLANG_ENABLE_SPEC_V2: SGLang "
                "converts NEXTN to EAGLE and loads a second copy of the model as draft (instant OOM: 57 GB x 2 per "
                "GPU on 96 GB cards)",
                "set SGLANG_ENABLE_SPEC_V2=True",
            )
        ]
    return [
        _f(
            "nextn-needs-spec-v2",
            launch,
            f"--speculative-algorithm {algo} without SGLANG_ENABLE_SPEC_V2 on 96 GB "
            "SM120 cards: for GLM-5/Qwen3.5 this loaded a second copy of the model as draft (OOM); not observed "
            "for this model",
            "set SGLANG_ENABLE_SPEC_V2=True if memory runs out at load",
            Severity.warning,
        )
    ]


# Checkpoints whose MTP layers the seeds state; recipes carry model.has_mtp_weights instead.
KNOWN_MTP = {"lukealonso/glm-5-nvfp4": False, "festr2/glm-5-nvfp4-mtp": True, "nvidia/qwen3.5-397b-a17b-nvfp4": True}


@rule(
    "mtp-without-mtp-weights",
    Severity.error,
    "MTP speculative decoding on a checkpoint without MTP weights",
    scope="NEXTN on any hardware; checkpoints the seeds name",
    source="seed 000 (MTP checkpoints)",
)
def mtp_weights(launch: Launch) -> list[Finding]:
    if launch.value("--speculative-algorithm") != "NEXTN":
        return []
    has = launch.has_mtp_weights
    if has is None:
        key = launch.model_path.lower().rstrip("/")
        has = next((v for k, v in KNOWN_MTP.items() if key.endswith(k) or key.endswith(k.split("/")[1])), None)
    if has is False:
        return [
            _f(
                "mtp-without-mtp-weights",
                launch,
                f"{launch.model_path} has no MTP weights; NEXTN cannot run on it",
                "use a checkpoint with MTP layers (e.g. festr2/GLM-5-NVFP4-MTP) or drop the speculative flags",
            )
        ]
    return []


@rule(
    "expandable-segments-oneshot",
    Severity.error,
    "expandable_segments crashes PCIe one-shot allreduce",
    scope="PCIe one-shot allreduce (patched SM120 images)",
    source="seed 000 (pcie_allreduce.cu:321 crash)",
)
def expandable_oneshot(launch: Launch) -> list[Finding]:
    conf = launch.env.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + launch.env.get("PYTORCH_ALLOC_CONF", "")
    if "expandable_segments:true" in conf.lower().replace(" ", "") and launch.has("--enable-pcie-oneshot-allreduce"):
        return [
            _f(
                "expandable-segments-oneshot",
                launch,
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with "
                "--enable-pcie-oneshot-allreduce crashes at pcie_allreduce.cu:321",
                "remove expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF",
            )
        ]
    return []


@rule(
    "deep-gemm-sm120",
    Severity.warning,
    "DeepGemm is not supported on SM120",
    scope="SM120 (RTX PRO 6000)",
    source="seed 000 (DeepGemm on SM120)",
)
def deep_gemm_sm120(launch: Launch) -> list[Finding]:
    if launch.arch != "sm120":
        return []
    out = []
    if launch.value("--moe-runner-backend") == "deep_gemm":
        out.append(
            _f(
                "deep-gemm-sm120",
                launch,
                "--moe-runner-backend deep_gemm does not use DeepGemm on SM120; it falls"
                " back to cutlass (misleading in logs)",
                "use --moe-runner-backend cutlass",
            )
        )
    if "SGL_ENABLE_JIT_DEEPGEMM" in launch.env and "SGLANG_ENABLE_JIT_DEEPGEMM" not in launch.env:
        out.append(
            _f(
                "deep-gemm-sm120",
                launch,
                "SGL_ENABLE_JIT_DEEPGEMM is the old spelling; current engines read SGLANG_ENABLE_JIT_DEEPGEMM",
                "set SGLANG_ENABLE_JIT_DEEPGEMM=0 (keep the old one for old images)",
            )
        )
    return out


@rule(
    "fp4-gemm-cutlass-race",
    Severity.warning,
    "flashinfer_cutlass FP4 GEMM race (flashinfer#2708)",
    scope="NVFP4 checkpoints on SM120, flashinfer of 2026-03",
    source="seed 000 (flashinfer#2708)",
)
def fp4_race(launch: Launch) -> list[Finding]:
    if not launch.nvfp4 or launch.arch not in ("sm120",):
        return []
    backend = launch.value("--fp4-gemm-backend") or "flashinfer_cutlass"
    if backend != "flashinfer_cutlass":
        return []
    how = "explicitly" if launch.has("--fp4-gemm-backend") else "by default"
    return [
        _f(
            "fp4-gemm-cutlass-race",
            launch,
            f"FP4 GEMMs use flashinfer_cutlass {how}: its race condition (flashinfer#2708) silently corrupts memory",
            "use --fp4-gemm-backend flashinfer_cudnn (needs nvidia-cudnn-cu13==9.19.1.2)",
        )
    ]


@rule(
    "cudnn-for-fp4",
    Severity.warning,
    "flashinfer_cudnn needs nvidia-cudnn-cu13==9.19.1.2",
    scope="flashinfer_cudnn FP4 GEMMs in a uv venv, CUDA 13",
    source="seed 000 (cuDNN 9.19 pin)",
)
def cudnn_for_fp4(launch: Launch) -> list[Finding]:
    if launch.value("--fp4-gemm-backend") != "flashinfer_cudnn" or not isinstance(launch.runtime, UvRuntime):
        return []
    if any(p.startswith("nvidia-cudnn-cu13==9.19") for p in launch.runtime.packages):
        return []
    return [
        _f(
            "cudnn-for-fp4",
            launch,
            "--fp4-gemm-backend flashinfer_cudnn without nvidia-cudnn-cu13 9.19 in the venv",
            "add nvidia-cudnn-cu13==9.19.1.2 to runtime.packages",
        )
    ]


@rule(
    "minimax-nvfp4-ep",
    Severity.error,
    "Expert parallelism makes MiniMax M2 NVFP4 fail to load",
    scope="MiniMax M2/M2.5 NVFP4",
    source="seed 003 (MiniMax M2.5 NVFP4 on 2x RTX PRO 6000)",
)
def minimax_ep(launch: Launch) -> list[Finding]:
    if launch.family == "minimax-m2.5" and launch.nvfp4 and launch.int_value("--ep-size") > 1:
        return [
            _f(
                "minimax-nvfp4-ep",
                launch,
                "--ep-size with MiniMax M2 NVFP4 can make the model fail to load",
                "remove --ep-size; use --tp-size only",
            )
        ]
    return []


@rule(
    "kimi-fp8-kv-slow",
    Severity.warning,
    "FP8 KV cache on the original Kimi K2.5 checkpoint drops to 16 tok/s",
    scope="original Kimi K2.5 INT4 checkpoint on SM120",
    source="seed 000 (Kimi K2.5 figures)",
)
def kimi_fp8(launch: Launch) -> list[Finding]:
    kv = launch.value("--kv-cache-dtype") or ""
    if launch.family == "kimi-k2.5" and launch.arch == "sm120" and not launch.nvfp4 and kv.startswith("fp8"):
        return [
            _f(
                "kimi-fp8-kv-slow",
                launch,
                f"--kv-cache-dtype {kv} with the original Kimi K2.5 checkpoint drops decode"
                " to about 16 tok/s (unusable)",
                "use the BF16 KV cache (drop --kv-cache-dtype)",
            )
        ]
    return []


@rule(
    "ep-on-pcie",
    Severity.warning,
    "Expert parallel over PCIe needs custom allreduce patches",
    scope="SM120 PCIe-only GPUs (RTX PRO 6000, no NVLink)",
    source="seed 000 (--ep-size needs custom allreduce patches on PCIe)",
)
def ep_pcie(launch: Launch) -> list[Finding]:
    if launch.sm120_pcie and launch.int_value("--ep-size") > 1 and launch.family != "minimax-m2.5":
        return [
            _f(
                "ep-on-pcie",
                launch,
                "--ep-size on PCIe-only GPUs requires custom allreduce patches",
                "use an image with the PCIe custom-allreduce patches, or drop --ep-size",
            )
        ]
    return []


@rule(
    "legacy-disable-custom-all-reduce",
    Severity.warning,
    "--disable-custom-all-reduce is the legacy PCIe setting",
    scope="SM120 PCIe-only GPUs with the one-shot allreduce image",
    source="seed 000 (flag table)",
)
def legacy_car(launch: Launch) -> list[Finding]:
    if launch.has("--disable-custom-all-reduce") and launch.sm120_pcie:
        return [
            _f(
                "legacy-disable-custom-all-reduce",
                launch,
                "--disable-custom-all-reduce is no longer needed on PCIe",
                "use --enable-pcie-oneshot-allreduce instead",
            )
        ]
    return []


@rule(
    "glm5-dcp-unavailable",
    Severity.warning,
    "Decode context parallel is not available for GLM-5",
    scope="GLM-5, 2026-03 engines",
    source="seed 000 (DCP note)",
)
def glm5_dcp(launch: Launch) -> list[Finding]:
    if launch.family == "glm5" and "SGLANG_DCP" in launch.env:
        return [
            _f(
                "glm5-dcp-unavailable",
                launch,
                "SGLANG_DCP has no effect for GLM-5 (DCP for GLM-5 is not available)",
                "remove SGLANG_DCP",
            )
        ]
    return []


# --------------------------------------------------------------------------- parallelism and topology


@rule(
    "tp-exceeds-devices",
    Severity.error,
    "TP x PP (x DP replicas) needs more devices per node than the hardware has",
    scope="any GPU/NPU hardware profile",
    source="hardware profiles",
)
def tp_devices(launch: Launch) -> list[Finding]:
    have = launch.hardware.accelerator.count
    if launch.hardware.accelerator.vendor == "none":
        return []
    nnodes = launch.int_value("--nnodes")
    sizes = Parallelism(
        launch.int_value("--tp-size"),
        launch.int_value("--pp-size"),
        launch.int_value("--dp-size"),
        launch.has("--enable-dp-attention"),
        launch.launcher,
    )
    need = sizes.devices_per_node(nnodes)
    if need <= have:
        return []
    fix = "lower --tp-size or spread over more nodes (--nnodes)"
    dp = ""
    if sizes.replicas > 1 and launch.launcher == "router_launch_server":
        dp = f" x --dp-size {sizes.replicas} (router replicas)"
        fix = "lower --tp-size or --dp-size, or spread over more nodes (--nnodes)"
    elif sizes.replicas > 1:
        dp = f" x --dp-size {sizes.replicas} (DP replicas: no --enable-dp-attention)"
        fix = "lower --tp-size or --dp-size, add --enable-dp-attention (DP ranks share the TP group) or more nodes"
    return [
        _f(
            "tp-exceeds-devices",
            launch,
            f"--tp-size {sizes.tp_size} x --pp-size {sizes.pp_size}{dp} over {nnodes} node(s) needs {need} devices "
            f"per node; {launch.hardware.id} has {have}",
            fix,
        )
    ]


@rule(
    "tp-not-power-of-2",
    Severity.warning,
    "Non-power-of-2 TP fails for most models",
    scope="most models",
    source="seed 000 (flag table: TP power of 2)",
)
def tp_pow2(launch: Launch) -> list[Finding]:
    tp = launch.int_value("--tp-size")
    if tp & (tp - 1):
        return [
            _f(
                "tp-not-power-of-2",
                launch,
                f"--tp-size {tp} is not a power of 2; most models need one",
                "use a power-of-2 TP with --pp-size for the rest (e.g. --tp-size 2 --pp-size 3 for 6 GPUs)",
            )
        ]
    return []


@rule(
    "multinode-without-dist-init",
    Severity.error,
    "Multi-node launch without --dist-init-addr/--node-rank hangs",
    scope="multi-node launches, any engine",
    source="seed 002 (multi-node TP)",
)
def multinode_init(launch: Launch) -> list[Finding]:
    if launch.int_value("--nnodes") <= 1:
        return []
    missing = [f for f in ("--dist-init-addr", "--node-rank") if not launch.has(f)]
    if missing:
        return [
            _f(
                "multinode-without-dist-init",
                launch,
                f"--nnodes {launch.value('--nnodes')} without {' and '.join(missing)}: the ranks never meet",
                "add --dist-init-addr RANK0_IP:PORT and --node-rank N on each node "
                "(ironserve render adds them per host)",
            )
        ]
    return []


@rule(
    "multinode-socket-ifname",
    Severity.warning,
    "Multi-node without the socket interface set",
    scope="multi-node launches (GLOO; HCCL on Ascend)",
    source="seed 004 (HCCL/GLOO_SOCKET_IFNAME)",
)
def socket_ifname(launch: Launch) -> list[Finding]:
    if launch.int_value("--nnodes") <= 1 or launch.from_recipe:  # render sets them from the inventory's nic
        return []
    wanted = (
        ["GLOO_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"]
        if launch.hardware.accelerator.vendor == "huawei"
        else ["GLOO_SOCKET_IFNAME"]
    )
    missing = [w for w in wanted if not launch.env.get(w) or launch.env[w].startswith("<")]
    if missing:
        return [
            _f(
                "multinode-socket-ifname",
                launch,
                f"multi-node launch without {', '.join(missing)}: ranks may pick the wrong NIC and hang",
                "set them to the interface that carries the cluster network (host data 'nic')",
            )
        ]
    return []


@rule(
    "pd-ascend-transfer-backend",
    Severity.error,
    "PD disaggregation on Ascend needs the ascend transfer backend",
    scope="PD disaggregation on Ascend NPUs",
    source="seed 004 (Atlas 800I A3 PD scripts)",
)
def pd_ascend(launch: Launch) -> list[Finding]:
    if launch.hardware.accelerator.vendor == "huawei" and launch.has("--disaggregation-mode"):
        if launch.value("--disaggregation-transfer-backend") != "ascend":
            return [
                _f(
                    "pd-ascend-transfer-backend",
                    launch,
                    "PD disaggregation on NPUs without --disaggregation-transfer-backend ascend",
                    "add --disaggregation-transfer-backend ascend",
                )
            ]
    return []


@rule(
    "nixl-silent-tcp",
    Severity.warning,
    "NIXL KV transfer silently falls back to TCP without its backend env",
    scope="NIXL KV transfer, kernel 6.8+",
    source="seed 001 (GB200 NIXL/UCX, LIBFABRIC)",
)
def nixl_tcp(launch: Launch) -> list[Finding]:
    if launch.value("--disaggregation-transfer-backend") != "nixl":
        return []
    if "UCX_TLS" in launch.env or "SGLANG_DISAGGREGATION_NIXL_BACKEND" in launch.env:
        return []
    return [
        _f(
            "nixl-silent-tcp",
            launch,
            "NIXL transfer without UCX_TLS or SGLANG_DISAGGREGATION_NIXL_BACKEND: KV traffic "
            "can silently fall back to TCP on kernel 6.8+",
            "set UCX_TLS=cuda_copy,cuda_ipc,tcp (UCX) or SGLANG_DISAGGREGATION_NIXL_BACKEND=LIBFABRIC (EFA)",
        )
    ]


@rule(
    "proxy-env",
    Severity.warning,
    "Proxy variables reach the engine's cluster traffic",
    scope="multi-node and PD launches",
    source="seed 004 (unset http(s)_proxy)",
)
def proxy_env(launch: Launch) -> list[Finding]:
    present = [k for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY") if k in launch.env]
    if present:
        return [
            _f(
                "proxy-env",
                launch,
                f"{', '.join(present)} set for the engine: bootstrap/HCCL/NCCL traffic may go through the proxy",
                "unset them for the service (recipe env_unset)",
            )
        ]
    return []


@rule(
    "speculative-draft-tokens",
    Severity.warning,
    "num_draft_tokens should be num_steps + 1 with topk 1",
    scope="EAGLE/NEXTN with topk 1",
    source="seeds 000 and 004 (steps 3, draft tokens 4)",
)
def draft_tokens(launch: Launch) -> list[Finding]:
    steps, topk, draft = (launch.value(f"--speculative-{x}") for x in ("num-steps", "eagle-topk", "num-draft-tokens"))
    if steps and draft and (topk in (None, "1")) and int(draft) != int(steps) + 1:
        return [
            _f(
                "speculative-draft-tokens",
                launch,
                f"--speculative-num-draft-tokens {draft} with --speculative-num-steps"
                f" {steps} and topk 1 wastes or starves drafts",
                f"use --speculative-num-draft-tokens {int(steps) + 1}",
            )
        ]
    return []


# --------------------------------------------------------------------------- spelling, engine and security


@rule(
    "abbreviated-flag",
    Severity.warning,
    "Abbreviated flag: breaks when SGLang adds a flag with the same prefix",
    scope="SGLang 0.5.9 .. 0.5.23 parsers",
    source="docs/engine-flags.md",
)
def abbreviated(launch: Launch) -> list[Finding]:
    out = [
        _f("abbreviated-flag", launch, f"{flag} is a prefix that argparse expands today", f"write {canonical(flag)}")
        for flag in launch.written_flags
        if flag in ABBREVIATIONS
    ]
    out += [
        _f(
            "abbreviated-flag",
            launch,
            f"{flag} is a prefix of several flags: argparse refuses it and the server does not start",
            f"write {canonical(flag)}",
            Severity.error,
        )
        for flag in launch.written_flags
        if flag in AMBIGUOUS
    ]
    return out


@rule(
    "engine-dropped-flag",
    Severity.error,
    "Flag or choice the target SGLang version no longer accepts",
    scope="the target SGLang release",
    source="docs/engine-flags.md (real parsers)",
)
def dropped(launch: Launch) -> list[Finding]:
    out = []
    for flag, fix in DROPPED_IN.get(launch.engine, {}).items():
        if launch.has(flag):
            out.append(_f("engine-dropped-flag", launch, f"{flag} is not accepted by sglang {launch.engine}", fix))
    for (flag, choice), fix in DROPPED_CHOICES.get(launch.engine, {}).items():
        if launch.value(flag) == choice:
            out.append(
                _f("engine-dropped-flag", launch, f"{flag} {choice} is not accepted by sglang {launch.engine}", fix)
            )
    return out


LOOPBACK = ("127.", "localhost", "::1")


@rule(
    "bind-without-api-key",
    Severity.warning,
    "Server on a non-loopback address without an API key",
    scope="any launch",
    source="the brief's security rules",
)
def bind_key(launch: Launch) -> list[Finding]:
    host = launch.value("--host") or "127.0.0.1"
    if host.startswith(LOOPBACK) or launch.has("--api-key") or launch.has_api_key:
        return []
    every = binds_every_address(host)
    shown = f"{host} (every address)" if every else "the node's own address" if launch.from_recipe else host
    return [
        _f(
            "bind-without-api-key",
            launch,
            f"--host {shown} serves the API to the network without an API key",
            "set an API key (recipe server.api_key_file, kept in the unit's 0600 env file) or bind 127.0.0.1",
        )
    ]


@rule(
    "api-key-in-argv",
    Severity.warning,
    "API key on the command line is visible in ps",
    scope="any launch",
    source="the brief's security rules",
)
def key_argv(launch: Launch) -> list[Finding]:
    if launch.has("--api-key"):
        return [
            _f(
                "api-key-in-argv",
                launch,
                "--api-key on the command line is readable by every user through ps",
                "use server.api_key_file (the unit passes it through a 0600 env file)",
            )
        ]
    return []


@rule(
    "unpinned-image",
    Severity.warning,
    "Container image by tag only: the tag moves under you",
    scope="docker runtimes",
    source="ironserve (reproducible deploys)",
)
def unpinned_image(launch: Launch) -> list[Finding]:
    if isinstance(launch.runtime, DockerRuntime) and not launch.runtime.digest:
        return [
            _f(
                "unpinned-image",
                launch,
                f"image {launch.runtime.image} is not pinned by digest",
                "add runtime.digest (ironserve deploy records the digest it pulled)",
            )
        ]
    return []


@rule(
    "prerelease-install",
    Severity.warning,
    "Pre-release installs (-U --pre) are not reproducible",
    scope="uv runtimes",
    source="seed 003 (sglang --pre)",
)
def prerelease(launch: Launch) -> list[Finding]:
    if isinstance(launch.runtime, UvRuntime) and launch.runtime.prerelease:
        return [
            _f(
                "prerelease-install",
                launch,
                "runtime allows pre-releases: the next install can differ",
                "pin every package with == and drop prerelease",
            )
        ]
    return []


@rule(
    "not-an-sglang-launch",
    Severity.error,
    "A command no SGLang launcher of any release accepts",
    scope="every SGLang release (launch_server, sglang serve, sglang_router)",
    source="SGLang's entry points",
)
def not_a_launch(launch: Launch) -> list[Finding]:
    out = []
    if launch.launch_error:
        out.append(_f("not-an-sglang-launch", launch, launch.launch_error, launch.launch_fix))
    for flag in launch.written_flags:
        if flag.startswith("--") and "_" in flag.split("=")[0]:
            out.append(
                _f(
                    "not-an-sglang-launch",
                    launch,
                    f"{flag}: no SGLang release registers flags with underscores",
                    f"write {flag.replace('_', '-')} (check the name with --help)",
                )
            )
    return out


@rule(
    "literal-secret",
    Severity.error,
    "A secret written into a recipe (argv or env)",
    scope="recipes",
    source="the brief's security rules (secrets only in 0600 files)",
)
def literal_secret(launch: Launch) -> list[Finding]:
    if not launch.from_recipe:
        return []
    out = []
    for flag in SECRET_FLAGS:
        if launch.value(flag):
            out.append(
                _f(
                    "literal-secret",
                    launch,
                    f"{flag} with a literal key in the recipe: it reaches argv, the unit file and ps",
                    "remove it from extra_args; set server.api_key_file (a 0600 file on the host)",
                )
            )
    for key, value in launch.env.items():
        if (SECRET_NAME.search(key) and value and not value.startswith("<")) or SECRET_VALUE.match(value):
            out.append(
                _f(
                    "literal-secret",
                    launch,
                    f"env {key} holds a literal secret in the recipe",
                    f"remove {key} from the recipe; keep it in a 0600 file (HF_TOKEN: host data hf_token_file)",
                )
            )
    return out


@rule(
    "unset-value",
    Severity.error,
    "A value import could not know (a shell variable) is still unset",
    scope="imported recipes",
    source="ironserve import",
)
def unset_value(launch: Launch) -> list[Finding]:
    if not launch.from_recipe:
        return []
    places = [f"{flag} {' '.join(v)}" for flag, v in launch.flags.items() if any(UNSET_VALUE.search(x) for x in v)]
    places += [f"env {k}={v}" for k, v in launch.env.items() if UNSET_VALUE.search(v) and v != "<nic>"]
    return [
        _f(
            "unset-value",
            launch,
            f"{p} was a shell variable when imported and still has no value",
            "set it in the recipe (or use a placeholder: {node_address}, {nic}, {model_path}, ...)",
        )
        for p in places
    ]


# --------------------------------------------------------------------------- recipe-level rules


def recipe_findings(recipe: Recipe, hardware: HardwareProfile, where: str) -> list[Finding]:
    out: list[Finding] = []
    tuning = recipe.tuning
    if tuning and tuning.gpu_memory_clock_offset_mhz and not hardware.accelerator.max_q:
        out.append(
            Finding(
                "clock-offset-not-maxq",
                Severity.error,
                f"gpu_memory_clock_offset_mhz on {hardware.id}: memory-clock offsets are for Max-Q cards "
                "only (nvmlDeviceSetMemClkVfOffset fails elsewhere)",
                "drop tuning.gpu_memory_clock_offset_mhz or target rtx6000-pro-maxq",
                where,
            )
        )
    if tuning and tuning.nccl_graph:
        graph_env = {
            p for g in recipe.topology.groups for k, p in recipe.group_env(g).items() if k == "NCCL_GRAPH_FILE"
        }
        if graph_env and graph_env != {tuning.nccl_graph.path}:
            out.append(
                Finding(
                    "nccl-graph-path",
                    Severity.error,
                    f"NCCL_GRAPH_FILE {sorted(graph_env)} is not where the graph is placed ({tuning.nccl_graph.path})",
                    "make them the same path",
                    where,
                )
            )
        if not tuning.nccl_graph.sha256:
            out.append(
                Finding(
                    "nccl-graph-unpinned",
                    Severity.warning,
                    "NCCL graph XML has no sha256",
                    "add tuning.nccl_graph.sha256 so a changed file is detected",
                    where,
                )
            )
    return out


RECIPE_RULES = {
    "clock-offset-not-maxq": (Severity.error, "Memory-clock offsets on cards that are not Max-Q"),
    "nccl-graph-path": (Severity.error, "NCCL_GRAPH_FILE differs from where the graph file is placed"),
    "nccl-graph-unpinned": (Severity.warning, "NCCL graph XML without a checksum"),
}


def lint_launch(launch: Launch) -> list[Finding]:
    out: list[Finding] = []
    for info in RULES.values():
        out.extend(info.fn(launch))
    return out


def _router_unset(recipe: Recipe, proc) -> list[Finding]:
    """The router's values import could not know (its port, address, env): the rule the engines get."""
    from .render import Rendered, unset_values

    return [
        Finding(
            "unset-value",
            Severity.error,
            f"{word} was a shell variable when imported and still has no value",
            "set it in the recipe (topology.router)",
            f"{recipe.id} router",
        )
        for _, word in unset_values(Rendered(recipe, [proc]))
    ]


def lint_recipe(recipe: Recipe, hardware: dict[str, HardwareProfile], engine: str | None = None) -> list[Finding]:
    from .render import render

    rendered = render(recipe)
    merged: dict[tuple, tuple[Finding, list[str]]] = {}
    for hw_id in recipe.hardware:
        profile = hardware[hw_id]
        found = recipe_findings(recipe, profile, recipe.id)
        for proc in rendered.processes:
            if proc.role == "router":
                found += _router_unset(recipe, proc)
                continue
            _, flags = launcher_split(proc.argv)
            pairs = split_flags(flags)
            server = recipe.group_server(recipe.topology.groups[proc.group])
            launch = Launch(
                hardware=profile,
                flags={canonical(k): v for k, v in pairs},
                env=proc.env,
                engine=engine or recipe.engine.sglang,
                written_flags=[k for k, _ in pairs],
                model_path=(recipe.model.hub_id or "") + " " + (recipe.model.path or ""),
                has_mtp_weights=recipe.model.has_mtp_weights,
                runtime=recipe.runtime,
                tuning=recipe.tuning,
                where=f"{recipe.id} {proc.role}",
                from_recipe=True,
                has_api_key=bool(server.api_key_file),
                launcher=recipe.engine.launcher,
            )
            found += lint_launch(launch)
        # one finding per rule and place, whatever the number of ranks; hardware ids listed where they differ
        for f in found:
            key = (f.rule, f.where, f.message)
            if key in merged:
                merged[key][1].append(hw_id) if hw_id not in merged[key][1] else None
            else:
                merged[key] = (f, [hw_id])
    findings = []
    for f, hws in merged.values():
        where = f.where if len(recipe.hardware) == 1 else f"{f.where} on {','.join(hws)}"
        findings.append(Finding(f.rule, f.severity, f.message, f.fix, where))
    return findings


def lint_pasted(words: list[str], hardware: HardwareProfile, engine: str | None = None) -> list[Finding]:
    """Lint a pasted command as the shell split it: env, wrappers and docker run in front are understood
    (commandline.parse_command, the parser import and the real-parser check use too)."""
    if not words:
        raise ValueError("no command to lint")
    try:
        command = parse_command(words)
    except CommandError as exc:
        if str(exc).startswith("'export'"):
            raise
        launch = Launch(
            hardware=hardware,
            flags={},
            env={},
            engine=engine or seed_era(hardware.accelerator.arch),
            where="command",
            launch_error=str(exc),
            launch_fix=exc.fix,
        )
        return lint_launch(launch)
    if command.kind == "router":
        return []  # router flags are the real sglang-router parser's to check (--engine)
    pairs = split_flags(command.flags)
    canon = {canonical(k): v for k, v in pairs}
    env = {**(command.docker.env if command.docker else {}), **command.env}
    runtime = None
    if command.docker:
        try:
            runtime = DockerRuntime.model_validate(
                {"kind": "docker", "image": command.docker.image, "digest": command.docker.digest}
            )
        except ValueError:
            runtime = None
    launch = Launch(
        runtime=runtime,
        hardware=hardware,
        flags=canon,
        env=env,
        engine=engine or seed_era(hardware.accelerator.arch),
        written_flags=[k for k, _ in pairs],
        model_path=(canon.get("--model-path") or [""])[0],
        where="command",
        launcher=command.launcher,
    )
    return lint_launch(launch)


def rule_table() -> list[dict]:
    rows = [
        {"rule": k, "severity": v.severity.value, "summary": v.summary, "scope": v.scope, "source": v.source}
        for k, v in RULES.items()
    ]
    rows += [
        {"rule": k, "severity": v[0].value, "summary": v[1], "scope": "recipes", "source": "seed 000"}
        for k, v in RECIPE_RULES.items()
    ]
    rows += [
        {
            "rule": k,
            "severity": sev.value,
            "summary": summary,
            "scope": "uv runtimes of recipes (online)",
            "source": source,
        }
        for k, (sev, summary, source) in PIN_RULES.items()
    ]
    return rows
