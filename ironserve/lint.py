"""Lint: the field guides' pitfalls as rules, run on recipes and on pasted commands.

Each rule reads one launch (hardware, engine, env, flags, model, runtime) and returns findings.
Errors are what crashes, corrupts output or cannot start; everything else is a warning. Every rule cites
the seed statement it encodes, so a finding can be traced to the field experience behind it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from .findings import Finding, Severity
from .flags import ABBREVIATIONS, AMBIGUOUS, canonical, launcher_split, split_flags
from .spec import DockerRuntime, HardwareProfile, HostTuning, Recipe, UvRuntime

# The engine era the seeds use per accelerator arch, for pasted commands linted without --engine.
SEED_ERA = {"sm120": "dev-cu13-2026-03", "sm100": "dynamo-1.1.1", "ascend-a3": "ascend-2026-04", "none": "0.5.23"}

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
    def family(self) -> str:
        m = self.model_path.lower()
        if re.search(r"glm-?5\.1", m):
            return "glm5.1"
        if re.search(r"glm-?5", m):
            return "glm5"
        if "kimi" in m:
            return "kimi-k2.5"
        if "minimax" in m:
            return "minimax-m2.5"
        if "qwen3.5" in m or "qwen3_5" in m:
            return "qwen3.5"
        return ""

    @property
    def nvfp4(self) -> bool:
        return self.value("--quantization") == "modelopt_fp4" or "nvfp4" in self.model_path.lower()


Rule = Callable[[Launch], list[Finding]]
RULES: dict[str, tuple[Severity, str, Rule]] = {}


def rule(rule_id: str, severity: Severity, summary: str):
    def register(fn: Rule) -> Rule:
        RULES[rule_id] = (severity, summary, fn)
        return fn

    return register


def _f(rule_id: str, launch: Launch, message: str, fix: str, severity: Severity | None = None) -> Finding:
    return Finding(rule_id, severity or RULES[rule_id][0], message, fix, launch.where)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------- model/hardware pitfalls


@rule("glm5-kv-cache-sm120", Severity.error, "GLM-5 on SM120 needs --kv-cache-dtype bf16; FP8 KV garbles output")
def glm5_kv_cache(l: Launch) -> list[Finding]:
    if l.family != "glm5" or l.arch != "sm120":
        return []
    kv = l.value("--kv-cache-dtype")
    if kv and kv.startswith("fp8"):
        return [_f("glm5-kv-cache-sm120", l, f"--kv-cache-dtype {kv} on GLM-5/SM120 produces garbled output or stops"
                   " after 1 token", "use --kv-cache-dtype bf16")]
    if kv != "bf16":
        return [_f("glm5-kv-cache-sm120", l, "GLM-5 on SM120 without --kv-cache-dtype bf16 (mandatory on SM120)",
                   "add --kv-cache-dtype bf16", Severity.warning)]
    return []


@rule("nextn-needs-spec-v2", Severity.error, "NEXTN/EAGLE without SGLANG_ENABLE_SPEC_V2 loads the model twice (OOM)")
def nextn_spec_v2(l: Launch) -> list[Finding]:
    algo = l.value("--speculative-algorithm")
    if algo not in ("NEXTN", "EAGLE"):
        return []
    if _truthy(l.env.get("SGLANG_ENABLE_SPEC_V2")):
        return []
    return [_f("nextn-needs-spec-v2", l, f"--speculative-algorithm {algo} without SGLANG_ENABLE_SPEC_V2: SGLang "
               "converts NEXTN to EAGLE and loads a second copy of the model as draft (instant OOM: 57 GB x 2 per GPU"
               " on 96 GB cards)", "set SGLANG_ENABLE_SPEC_V2=True")]


# Checkpoints whose MTP layers the seeds state; recipes carry model.has_mtp_weights instead.
KNOWN_MTP = {"lukealonso/glm-5-nvfp4": False, "festr2/glm-5-nvfp4-mtp": True, "nvidia/qwen3.5-397b-a17b-nvfp4": True}


@rule("mtp-without-mtp-weights", Severity.error, "MTP speculative decoding on a checkpoint without MTP weights")
def mtp_weights(l: Launch) -> list[Finding]:
    if l.value("--speculative-algorithm") != "NEXTN":
        return []
    has = l.has_mtp_weights
    if has is None:
        key = l.model_path.lower().rstrip("/")
        has = next((v for k, v in KNOWN_MTP.items() if key.endswith(k) or key.endswith(k.split("/")[1])), None)
    if has is False:
        return [_f("mtp-without-mtp-weights", l, f"{l.model_path} has no MTP weights; NEXTN cannot run on it",
                   "use a checkpoint with MTP layers (e.g. festr2/GLM-5-NVFP4-MTP) or drop the speculative flags")]
    return []


@rule("expandable-segments-oneshot", Severity.error, "expandable_segments crashes PCIe one-shot allreduce")
def expandable_oneshot(l: Launch) -> list[Finding]:
    conf = l.env.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + l.env.get("PYTORCH_ALLOC_CONF", "")
    if "expandable_segments:true" in conf.lower().replace(" ", "") and l.has("--enable-pcie-oneshot-allreduce"):
        return [_f("expandable-segments-oneshot", l, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with "
                   "--enable-pcie-oneshot-allreduce crashes at pcie_allreduce.cu:321",
                   "remove expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF")]
    return []


@rule("deep-gemm-sm120", Severity.warning, "DeepGemm is not supported on SM120")
def deep_gemm_sm120(l: Launch) -> list[Finding]:
    if l.arch != "sm120":
        return []
    out = []
    if l.value("--moe-runner-backend") == "deep_gemm":
        out.append(_f("deep-gemm-sm120", l, "--moe-runner-backend deep_gemm does not use DeepGemm on SM120; it falls"
                      " back to cutlass (misleading in logs)", "use --moe-runner-backend cutlass"))
    if "SGL_ENABLE_JIT_DEEPGEMM" in l.env and "SGLANG_ENABLE_JIT_DEEPGEMM" not in l.env:
        out.append(_f("deep-gemm-sm120", l, "SGL_ENABLE_JIT_DEEPGEMM is the old spelling; current engines read "
                      "SGLANG_ENABLE_JIT_DEEPGEMM", "set SGLANG_ENABLE_JIT_DEEPGEMM=0 (keep the old one for old images)"))
    return out


@rule("fp4-gemm-cutlass-race", Severity.warning, "flashinfer_cutlass FP4 GEMM race (flashinfer#2708)")
def fp4_race(l: Launch) -> list[Finding]:
    if not l.nvfp4 or l.arch not in ("sm120",):
        return []
    backend = l.value("--fp4-gemm-backend") or "flashinfer_cutlass"
    if backend != "flashinfer_cutlass":
        return []
    how = "explicitly" if l.has("--fp4-gemm-backend") else "by default"
    return [_f("fp4-gemm-cutlass-race", l, f"FP4 GEMMs use flashinfer_cutlass {how}: its race condition "
               "(flashinfer#2708) silently corrupts memory", "use --fp4-gemm-backend flashinfer_cudnn "
               "(needs nvidia-cudnn-cu13==9.19.1.2)")]


@rule("cudnn-for-fp4", Severity.warning, "flashinfer_cudnn needs nvidia-cudnn-cu13==9.19.1.2")
def cudnn_for_fp4(l: Launch) -> list[Finding]:
    if l.value("--fp4-gemm-backend") != "flashinfer_cudnn" or not isinstance(l.runtime, UvRuntime):
        return []
    if any(p.startswith("nvidia-cudnn-cu13==9.19") for p in l.runtime.packages):
        return []
    return [_f("cudnn-for-fp4", l, "--fp4-gemm-backend flashinfer_cudnn without nvidia-cudnn-cu13 9.19 in the venv",
               "add nvidia-cudnn-cu13==9.19.1.2 to runtime.packages")]


@rule("minimax-nvfp4-ep", Severity.error, "Expert parallelism makes MiniMax M2 NVFP4 fail to load")
def minimax_ep(l: Launch) -> list[Finding]:
    if l.family == "minimax-m2.5" and l.nvfp4 and l.int_value("--ep-size") > 1:
        return [_f("minimax-nvfp4-ep", l, "--ep-size with MiniMax M2 NVFP4 can make the model fail to load",
                   "remove --ep-size; use --tp-size only")]
    return []


@rule("kimi-fp8-kv-slow", Severity.warning, "FP8 KV cache on the original Kimi K2.5 checkpoint drops to 16 tok/s")
def kimi_fp8(l: Launch) -> list[Finding]:
    kv = l.value("--kv-cache-dtype") or ""
    if l.family == "kimi-k2.5" and not l.nvfp4 and kv.startswith("fp8"):
        return [_f("kimi-fp8-kv-slow", l, f"--kv-cache-dtype {kv} with the original Kimi K2.5 checkpoint drops decode"
                   " to about 16 tok/s (unusable)", "use the BF16 KV cache (drop --kv-cache-dtype)")]
    return []


@rule("ep-on-pcie", Severity.warning, "Expert parallel over PCIe needs custom allreduce patches")
def ep_pcie(l: Launch) -> list[Finding]:
    if l.hardware.accelerator.interconnect == "pcie" and l.int_value("--ep-size") > 1 and l.family != "minimax-m2.5":
        return [_f("ep-on-pcie", l, "--ep-size on PCIe-only GPUs requires custom allreduce patches",
                   "use an image with the PCIe custom-allreduce patches, or drop --ep-size")]
    return []


@rule("legacy-disable-custom-all-reduce", Severity.warning, "--disable-custom-all-reduce is the legacy PCIe setting")
def legacy_car(l: Launch) -> list[Finding]:
    if l.has("--disable-custom-all-reduce") and l.hardware.accelerator.interconnect == "pcie":
        return [_f("legacy-disable-custom-all-reduce", l, "--disable-custom-all-reduce is no longer needed on PCIe",
                   "use --enable-pcie-oneshot-allreduce instead")]
    return []


@rule("glm5-dcp-unavailable", Severity.warning, "Decode context parallel is not available for GLM-5")
def glm5_dcp(l: Launch) -> list[Finding]:
    if l.family == "glm5" and "SGLANG_DCP" in l.env:
        return [_f("glm5-dcp-unavailable", l, "SGLANG_DCP has no effect for GLM-5 (DCP for GLM-5 is not available)",
                   "remove SGLANG_DCP")]
    return []


# --------------------------------------------------------------------------- parallelism and topology


@rule("tp-exceeds-devices", Severity.error, "TP x PP needs more devices per node than the hardware has")
def tp_devices(l: Launch) -> list[Finding]:
    have = l.hardware.accelerator.count
    if l.hardware.accelerator.vendor == "none":
        return []
    nnodes = l.int_value("--nnodes")
    need = -(-(l.int_value("--tp-size") * l.int_value("--pp-size")) // nnodes)
    if need > have:
        return [_f("tp-exceeds-devices", l, f"--tp-size {l.int_value('--tp-size')} x --pp-size "
                   f"{l.int_value('--pp-size')} over {nnodes} node(s) needs {need} devices per node; "
                   f"{l.hardware.id} has {have}", f"lower --tp-size or spread over more nodes (--nnodes)")]
    return []


@rule("tp-not-power-of-2", Severity.warning, "Non-power-of-2 TP fails for most models")
def tp_pow2(l: Launch) -> list[Finding]:
    tp = l.int_value("--tp-size")
    if tp & (tp - 1):
        return [_f("tp-not-power-of-2", l, f"--tp-size {tp} is not a power of 2; most models need one",
                   "use a power-of-2 TP with --pp-size for the rest (e.g. --tp-size 2 --pp-size 3 for 6 GPUs)")]
    return []


@rule("multinode-without-dist-init", Severity.error, "Multi-node launch without --dist-init-addr/--node-rank hangs")
def multinode_init(l: Launch) -> list[Finding]:
    if l.int_value("--nnodes") <= 1:
        return []
    missing = [f for f in ("--dist-init-addr", "--node-rank") if not l.has(f)]
    if missing:
        return [_f("multinode-without-dist-init", l, f"--nnodes {l.value('--nnodes')} without {' and '.join(missing)}:"
                   " the ranks never meet", "add --dist-init-addr RANK0_IP:PORT and --node-rank N on each node "
                   "(ironserve render adds them per host)")]
    return []


@rule("multinode-socket-ifname", Severity.warning, "Multi-node without the socket interface set")
def socket_ifname(l: Launch) -> list[Finding]:
    if l.int_value("--nnodes") <= 1 or l.from_recipe:  # render sets them from the inventory's nic
        return []
    wanted = ["GLOO_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"] if l.hardware.accelerator.vendor == "huawei" else [
        "GLOO_SOCKET_IFNAME"]
    missing = [w for w in wanted if not l.env.get(w) or l.env[w].startswith("<")]
    if missing:
        return [_f("multinode-socket-ifname", l, f"multi-node launch without {', '.join(missing)}: ranks may pick the"
                   " wrong NIC and hang", "set them to the interface that carries the cluster network (host data 'nic')")]
    return []


@rule("pd-ascend-transfer-backend", Severity.error, "PD disaggregation on Ascend needs the ascend transfer backend")
def pd_ascend(l: Launch) -> list[Finding]:
    if l.hardware.accelerator.vendor == "huawei" and l.has("--disaggregation-mode"):
        if l.value("--disaggregation-transfer-backend") != "ascend":
            return [_f("pd-ascend-transfer-backend", l, "PD disaggregation on NPUs without "
                       "--disaggregation-transfer-backend ascend", "add --disaggregation-transfer-backend ascend")]
    return []


@rule("nixl-silent-tcp", Severity.warning, "NIXL KV transfer silently falls back to TCP without its backend env")
def nixl_tcp(l: Launch) -> list[Finding]:
    if l.value("--disaggregation-transfer-backend") != "nixl":
        return []
    if "UCX_TLS" in l.env or "SGLANG_DISAGGREGATION_NIXL_BACKEND" in l.env:
        return []
    return [_f("nixl-silent-tcp", l, "NIXL transfer without UCX_TLS or SGLANG_DISAGGREGATION_NIXL_BACKEND: KV traffic "
               "can silently fall back to TCP on kernel 6.8+", "set UCX_TLS=cuda_copy,cuda_ipc,tcp (UCX) or "
               "SGLANG_DISAGGREGATION_NIXL_BACKEND=LIBFABRIC (EFA)")]


@rule("proxy-env", Severity.warning, "Proxy variables reach the engine's cluster traffic")
def proxy_env(l: Launch) -> list[Finding]:
    present = [k for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY") if k in l.env]
    if present:
        return [_f("proxy-env", l, f"{', '.join(present)} set for the engine: bootstrap/HCCL/NCCL traffic may go "
                   "through the proxy", "unset them for the service (recipe env_unset)")]
    return []


@rule("speculative-draft-tokens", Severity.warning, "num_draft_tokens should be num_steps + 1 with topk 1")
def draft_tokens(l: Launch) -> list[Finding]:
    steps, topk, draft = (l.value(f"--speculative-{x}") for x in ("num-steps", "eagle-topk", "num-draft-tokens"))
    if steps and draft and (topk in (None, "1")) and int(draft) != int(steps) + 1:
        return [_f("speculative-draft-tokens", l, f"--speculative-num-draft-tokens {draft} with --speculative-num-steps"
                   f" {steps} and topk 1 wastes or starves drafts", f"use --speculative-num-draft-tokens {int(steps) + 1}")]
    return []


# --------------------------------------------------------------------------- spelling, engine and security


@rule("abbreviated-flag", Severity.warning, "Abbreviated flag: breaks when SGLang adds a flag with the same prefix")
def abbreviated(l: Launch) -> list[Finding]:
    out = [_f("abbreviated-flag", l, f"{flag} is a prefix that argparse expands today", f"write {canonical(flag)}")
           for flag in l.written_flags if flag in ABBREVIATIONS]
    out += [_f("abbreviated-flag", l, f"{flag} is a prefix of several flags: argparse refuses it and the server does"
               " not start", f"write {canonical(flag)}", Severity.error) for flag in l.written_flags if flag in AMBIGUOUS]
    return out


@rule("engine-dropped-flag", Severity.error, "Flag or choice the target SGLang version no longer accepts")
def dropped(l: Launch) -> list[Finding]:
    out = []
    for flag, fix in DROPPED_IN.get(l.engine, {}).items():
        if l.has(flag):
            out.append(_f("engine-dropped-flag", l, f"{flag} is not accepted by sglang {l.engine}", fix))
    for (flag, choice), fix in DROPPED_CHOICES.get(l.engine, {}).items():
        if l.value(flag) == choice:
            out.append(_f("engine-dropped-flag", l, f"{flag} {choice} is not accepted by sglang {l.engine}", fix))
    return out


LOOPBACK = ("127.", "localhost", "::1")


@rule("bind-without-api-key", Severity.warning, "Server on a non-loopback address without an API key")
def bind_key(l: Launch) -> list[Finding]:
    host = l.value("--host") or "127.0.0.1"
    if host.startswith(LOOPBACK) or l.has("--api-key") or l.has_api_key:
        return []
    shown = "the node's own address" if l.from_recipe and host not in ("0.0.0.0", "::") else host
    return [_f("bind-without-api-key", l, f"--host {shown} serves the API to the network without an API key",
               "set an API key (recipe server.api_key_file, kept in the unit's 0600 env file) or bind 127.0.0.1")]


@rule("api-key-in-argv", Severity.warning, "API key on the command line is visible in ps")
def key_argv(l: Launch) -> list[Finding]:
    if l.has("--api-key"):
        return [_f("api-key-in-argv", l, "--api-key on the command line is readable by every user through ps",
                   "use server.api_key_file (the unit passes it through a 0600 env file)")]
    return []


@rule("unpinned-image", Severity.warning, "Container image by tag only: the tag moves under you")
def unpinned_image(l: Launch) -> list[Finding]:
    if isinstance(l.runtime, DockerRuntime) and not l.runtime.digest:
        return [_f("unpinned-image", l, f"image {l.runtime.image} is not pinned by digest",
                   "add runtime.digest (ironserve deploy records the digest it pulled)")]
    return []


@rule("prerelease-install", Severity.warning, "Pre-release installs (-U --pre) are not reproducible")
def prerelease(l: Launch) -> list[Finding]:
    if isinstance(l.runtime, UvRuntime) and l.runtime.prerelease:
        return [_f("prerelease-install", l, "runtime allows pre-releases: the next install can differ",
                   "pin every package with == and drop prerelease")]
    return []


# --------------------------------------------------------------------------- recipe-level rules


def recipe_findings(recipe: Recipe, hardware: HardwareProfile, where: str) -> list[Finding]:
    out: list[Finding] = []
    tuning = recipe.tuning
    if tuning and tuning.gpu_memory_clock_offset_mhz and not hardware.accelerator.max_q:
        out.append(Finding("clock-offset-not-maxq", Severity.error,
                           f"gpu_memory_clock_offset_mhz on {hardware.id}: memory-clock offsets are for Max-Q cards "
                           "only (nvmlDeviceSetMemClkVfOffset fails elsewhere)",
                           "drop tuning.gpu_memory_clock_offset_mhz or target rtx6000-pro-maxq", where))
    if tuning and tuning.nccl_graph:
        graph_env = {p for g in recipe.topology.groups for k, p in recipe.group_env(g).items() if k == "NCCL_GRAPH_FILE"}
        if graph_env and graph_env != {tuning.nccl_graph.path}:
            out.append(Finding("nccl-graph-path", Severity.error, f"NCCL_GRAPH_FILE {sorted(graph_env)} is not where "
                               f"the graph is placed ({tuning.nccl_graph.path})", "make them the same path", where))
        if not tuning.nccl_graph.sha256:
            out.append(Finding("nccl-graph-unpinned", Severity.warning, "NCCL graph XML has no sha256",
                               "add tuning.nccl_graph.sha256 so a changed file is detected", where))
    return out


RECIPE_RULES = {
    "clock-offset-not-maxq": (Severity.error, "Memory-clock offsets on cards that are not Max-Q"),
    "nccl-graph-path": (Severity.error, "NCCL_GRAPH_FILE differs from where the graph file is placed"),
    "nccl-graph-unpinned": (Severity.warning, "NCCL graph XML without a checksum"),
}


def lint_launch(launch: Launch) -> list[Finding]:
    out: list[Finding] = []
    for _, _, fn in RULES.values():
        out.extend(fn(launch))
    return out


def lint_recipe(recipe: Recipe, hardware: dict[str, HardwareProfile], engine: str | None = None) -> list[Finding]:
    from .render import render

    rendered = render(recipe)
    merged: dict[tuple, tuple[Finding, list[str]]] = {}
    for hw_id in recipe.hardware:
        profile = hardware[hw_id]
        found = recipe_findings(recipe, profile, recipe.id)
        for proc in rendered.processes:
            if proc.role == "router":
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


def parse_pasted(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """'ENV=VAL ... python3 -m sglang.launch_server --flags' (as the shell split it) -> (env, argv)."""
    env: dict[str, str] = {}
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        key, _, value = words[i].partition("=")
        env[key] = value
        i += 1
    if i < len(words) and words[i] == "export":
        raise ValueError("pass variables as NAME=VALUE before the command, not with export")
    return env, words[i:]


def lint_pasted(words: list[str], hardware: HardwareProfile, engine: str | None = None) -> list[Finding]:
    env, argv = parse_pasted(words)
    if not argv:
        raise ValueError("no command after the environment variables")
    _, flags = launcher_split(argv)
    pairs = split_flags(flags)
    canon = {canonical(k): v for k, v in pairs}
    launch = Launch(
        hardware=hardware,
        flags=canon,
        env=env,
        engine=engine or SEED_ERA[hardware.accelerator.arch],
        written_flags=[k for k, _ in pairs],
        model_path=(canon.get("--model-path") or [""])[0],
        where="command",
    )
    return lint_launch(launch)


def rule_table() -> list[dict]:
    rows = [{"rule": k, "severity": v[0].value, "summary": v[1]} for k, v in RULES.items()]
    rows += [{"rule": k, "severity": v[0].value, "summary": v[1]} for k, v in RECIPE_RULES.items()]
    return rows
