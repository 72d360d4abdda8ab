"""Per-recipe facts of the RTX PRO 6000 (seeds 000, 003), multi-node (seed 002) and lab recipes that the generic
faithfulness test cannot see: the seeds' mandatory settings and pitfalls, pins, placement-derived flags, defaults.

Fast and offline: the catalogue is parsed once; renders use placeholder or in-memory inventory hosts.
"""

from __future__ import annotations

import re

import pytest
import yaml

from ironserve import catalogue
from ironserve.inventory import InventoryHost
from ironserve.render import render
from ironserve.spec import DockerRuntime, UvRuntime

from .test_seed_faithfulness import flag_map

SEED_000 = [
    "qwen3.5-nvfp4-rtx6000-tp4",
    "qwen3.5-nvfp4-rtx6000-tp4-tuned",
    "qwen3.5-nvfp4-rtx6000-tp8-mtp",
    "qwen3.5-fp8-rtx6000-tp8-mtp",
    "qwen3.5-nvfp4-rtx6000-tp4-eagle",
    "kimi-k2.5-rtx6000-tp8",
    "kimi-k2.5-nvfp4-rtx6000-tp8",
    "glm5-nvfp4-rtx6000-tp8",
    "glm5-nvfp4-mtp-rtx6000-tp8",
]
MINE = SEED_000 + ["minimax-m2.5-nvfp4-rtx6000-tp2", "llama3-8b-multinode-tp4", "tiny-cpu"]
SM120 = {"rtx6000-pro", "rtx6000-pro-maxq"}
TRUE = {"1", "true", "True", "TRUE"}


def recipe(rid):
    return catalogue.get_recipe(rid)


def server_flags(rid, hosts=None):
    """Canonical flag map of every server process of the render."""
    return [flag_map(p.argv) for p in render(recipe(rid), hosts).processes if p.role == "server"]


def only_server(rid):
    (flags,) = server_flags(rid)
    return flags


@pytest.mark.parametrize("rid", MINE)
def test_recipe_is_in_the_catalogue(rid):
    assert rid in catalogue.catalogue()


# --------------------------------------------------------------------------- seed 000 (SM120)


@pytest.mark.parametrize("rid", [r for r in SEED_000 if r.startswith("glm5")])
def test_glm5_on_sm120_uses_bf16_kv_cache(rid):
    # Seed 000: "--kv-cache-dtype bf16 is mandatory on SM120. FP8 KV cache produces garbled output"
    r = recipe(rid)
    assert set(r.hardware) <= SM120
    assert r.server.kv_cache_dtype == "bf16"
    assert only_server(rid)["--kv-cache-dtype"] == ["bf16"]
    assert r.server.attention_backend == "flashinfer"


@pytest.mark.parametrize("rid", [r for r in SEED_000 if r.startswith("glm5")])
def test_glm5_image_is_digest_pinned_and_patched(rid):
    rt = recipe(rid).runtime
    assert isinstance(rt, DockerRuntime)
    assert rt.image == "lmsysorg/sglang:glm5-blackwell"
    assert rt.digest == "sha256:426d1fa4b10722688678b99d817c2caa92a89eed4a8ee2927ab44a848bbe77df"
    assert any("transformers==5.2.0" in p for p in rt.patches)
    assert any("DEEPGEMM_SCALE_UE8M0 = False" in p for p in rt.patches)


def test_glm5_without_mtp_uses_checkpoint_without_mtp_weights():
    r = recipe("glm5-nvfp4-rtx6000-tp8")
    assert r.model.hub_id == "lukealonso/GLM-5-NVFP4" and r.model.has_mtp_weights is False
    assert r.server.speculative is None
    assert not any(f.startswith("--speculative") for f in only_server(r.id))


SPECULATIVE = [r for r in SEED_000 if recipe(r).server.speculative is not None]


def test_speculative_recipes_are_the_expected_ones():
    assert set(SPECULATIVE) == {
        "qwen3.5-nvfp4-rtx6000-tp8-mtp",
        "qwen3.5-fp8-rtx6000-tp8-mtp",
        "qwen3.5-nvfp4-rtx6000-tp4-eagle",
        "glm5-nvfp4-mtp-rtx6000-tp8",
    }


@pytest.mark.parametrize("rid", SPECULATIVE)
def test_mtp_recipes_have_spec_v2_and_mtp_weights(rid):
    # "SGLANG_ENABLE_SPEC_V2=True is absolutely required" / "MTP models need checkpoints that include MTP weights"
    r = recipe(rid)
    assert r.server.speculative.algorithm in ("NEXTN", "EAGLE")
    assert r.server.speculative.num_steps == 3
    assert r.server.speculative.eagle_topk == 1
    assert r.server.speculative.num_draft_tokens == 4
    assert r.model.has_mtp_weights is True
    for proc in render(r).processes:
        assert proc.env.get("SGLANG_ENABLE_SPEC_V2") in TRUE, rid


def test_fp8_spec_v2_is_a_recorded_deviation():
    # The seed's FP8 command lacks it; the recipe adds it on purpose and says why.
    r = recipe("qwen3.5-fp8-rtx6000-tp8-mtp")
    assert [d.env for d in r.source.deviations] == ["SGLANG_ENABLE_SPEC_V2"]
    assert "mandatory" in r.source.deviations[0].reason


def test_fp8_renders_port_9501_and_local_weights():
    r = recipe("qwen3.5-fp8-rtx6000-tp8-mtp")
    (proc,) = render(r).processes
    flags = flag_map(proc.argv)
    assert flags["--port"] == ["9501"] and proc.port == 9501
    assert proc.health_url.endswith(":9501/health")
    assert flags["--model-path"] == ["/home/gpusvr/Qwen3.5-397B-A17B-FP8"]
    assert flags["--tp-size"] == ["8"]
    assert flags["--moe-runner-backend"] == flags["--attention-backend"] == flags["--fp8-gemm-backend"] == ["triton"]
    assert "/home/gpusvr/:/home/gpusvr/" in r.runtime.run.volumes


def test_tuned_qwen_keeps_the_seeds_missing_speculative_flags_and_says_so():
    # Seed quirk: titled "With MTP", sets SGLANG_ENABLE_SPEC_V2=1, shows no --speculative-* flags.
    r = recipe("qwen3.5-nvfp4-rtx6000-tp4-tuned")
    assert r.env["SGLANG_ENABLE_SPEC_V2"] == "1"
    assert r.server.speculative is None
    assert any("speculative" in n and "NOT enabled" in n for n in r.notes)


def test_fastest_qwen_is_lukes_maxq_config():
    r = recipe("qwen3.5-nvfp4-rtx6000-tp8-mtp")
    assert r.hardware == ["rtx6000-pro-maxq"]
    assert r.tuning.gpu_memory_clock_offset_mhz == 4000
    assert r.expected.output_tok_s == 350
    flags = only_server(r.id)
    assert flags["--tp-size"] == ["8"] and flags["--speculative-algorithm"] == ["NEXTN"]
    assert flags["--mamba-scheduler-strategy"] == ["extra_buffer"] and flags["--page-size"] == ["64"]
    # full names only: the seed's --model / --tensor-parallel-size / --speculative-algo are canonicalised
    argv = render(r).processes[0].argv
    assert not {"--model", "--tensor-parallel-size", "--speculative-algo", "--tp"} & set(argv)


@pytest.mark.parametrize("rid", MINE)
def test_clock_offset_only_on_maxq_only_recipes(rid):
    # Seed 000: GDDR7 memory overclock is for Max-Q cards only; the call fails on Server Edition.
    r = recipe(rid)
    profiles = catalogue.hardware_profiles()
    if r.tuning and r.tuning.gpu_memory_clock_offset_mhz:
        assert all(profiles[h].accelerator.max_q for h in r.hardware), rid


@pytest.mark.parametrize("rid", MINE)
def test_nccl_graph_tuning_matches_env(rid):
    r = recipe(rid)
    graph = r.tuning.nccl_graph if r.tuning else None
    env_file = r.env.get("NCCL_GRAPH_FILE")
    assert (graph is None) == (env_file is None), rid
    if graph:
        assert graph.path == env_file


CUDNN_FP4 = [rid for rid in MINE if recipe(rid).server.fp4_gemm_backend == "flashinfer_cudnn"]


def test_some_recipes_use_cudnn_fp4_gemm():
    assert CUDNN_FP4, "no recipe of seed 000 uses flashinfer_cudnn: the test below checks nothing"


@pytest.mark.parametrize("rid", CUDNN_FP4)
def test_cudnn_fp4_gemm_brings_its_cudnn(rid):
    # "Use flashinfer_cudnn for FP4 GEMM ... Requires: pip install nvidia-cudnn-cu13==9.19.1.2"
    rt = recipe(rid).runtime
    installed = rt.patches if isinstance(rt, DockerRuntime) else rt.packages
    assert any("nvidia-cudnn-cu13==9.19.1.2" in line for line in installed), rid


@pytest.mark.parametrize("rid", MINE)
def test_expandable_segments_never_with_pcie_oneshot_allreduce(rid):
    # Seed 000: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True crashes --enable-pcie-oneshot-allreduce
    r = recipe(rid)
    if "expandable_segments" in r.env.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        assert not r.server.enable_pcie_oneshot_allreduce


def test_kimi_original_checkpoint_reproduced_with_bf16_kv():
    r = recipe("kimi-k2.5-rtx6000-tp8")
    # FP8 KV on the original checkpoint drops to 16 tok/s: no --kv-cache-dtype at all
    assert "--kv-cache-dtype" not in only_server(r.id)
    # the seed's env, reproduced as written (the lint flags the old SGL_ spelling)
    assert r.env == {
        "NCCL_P2P_LEVEL": "4",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "SGL_ENABLE_JIT_DEEPGEMM": "0",
    }
    assert only_server(r.id)["--chunked-prefill-size"] == ["8092"]
    assert r.expected.output_tok_s == (73, 90)


def test_kimi_nvfp4_is_slower_than_int4():
    assert recipe("kimi-k2.5-nvfp4-rtx6000-tp8").expected.output_tok_s == 53
    assert only_server("kimi-k2.5-nvfp4-rtx6000-tp8")["--moe-runner-backend"] == ["triton"]


@pytest.mark.parametrize("rid", SEED_000)
def test_seed_000_engine_is_an_image_era_with_a_parser_version(rid):
    r = recipe(rid)
    assert not r.engine.is_pypi and r.engine.sglang.startswith("dev-cu13-")
    assert r.engine.check_version and re.fullmatch(r"0\.5\.[0-9]+(\.post[0-9]+)?", r.engine.check_version)
    assert isinstance(r.runtime, DockerRuntime)
    if not r.id.startswith("glm5"):
        assert r.runtime.image == "lmsysorg/sglang:dev-cu13"


# --------------------------------------------------------------------------- uv runtimes: pins


UV = [r for r in MINE if isinstance(recipe(r).runtime, UvRuntime)]


def test_uv_recipes():
    assert set(UV) == {"minimax-m2.5-nvfp4-rtx6000-tp2", "llama3-8b-multinode-tp4", "tiny-cpu"}


@pytest.mark.parametrize("rid", UV)
def test_uv_packages_are_pinned_and_match_the_engine(rid):
    r = recipe(rid)
    pins = dict(p.split("==", 1) for p in r.runtime.packages)
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+]*", v) for v in pins.values()), pins
    assert pins["sglang"] == r.engine.sglang and r.engine.is_pypi
    if r.engine.router:
        assert pins["sglang-router"] == r.engine.router
    # the lab's CPU runtime runs on the hosts' Debian bookworm Python; the seeds' venvs use 3.12
    assert r.runtime.python == ("3.11" if r.hardware == ["cpu-lab"] else "3.12")
    assert not r.runtime.prerelease


# --------------------------------------------------------------------------- seed 003: MiniMax


def test_minimax_is_tp_only_and_served_with_sglang_serve():
    r = recipe("minimax-m2.5-nvfp4-rtx6000-tp2")
    (proc,) = render(r).processes
    assert proc.argv[:2] == ["sglang", "serve"]
    flags = flag_map(proc.argv)
    # "Expert parallelism (--ep) can cause MiniMax M2 NVFP4 to fail to load. Use only --tp"
    assert "--ep-size" not in flags and r.server.ep_size is None
    assert flags["--tp-size"] == ["2"]
    assert flags["--model-path"] == ["/home/johannes/models/lukealonso/MiniMax-M2.5-NVFP4/"]
    assert flags["--reasoning-parser"] == ["minimax-append-think"] and flags["--tool-call-parser"] == ["minimax-m2"]
    # the seed's metrics variant is ironserve's default (server.enable_metrics), said in the notes
    assert "--enable-metrics" in flags
    assert any("--enable-metrics" in n for n in r.notes)


def test_minimax_runtime_follows_the_seeds_indexes_with_one_kernel_package():
    rt = recipe("minimax-m2.5-nvfp4-rtx6000-tp2").runtime
    assert rt.index_url == "index:sglang-cu129"
    assert rt.extra_index_urls == ["index:pypi", "index:pytorch-cu130", "index:sglang-cu130"]
    assert rt.index_strategy == "unsafe-best-match"
    names = [p.split("==")[0] for p in rt.packages]
    # sgl-kernel and sglang-kernel both install the sgl_kernel module: never both
    assert not {"sgl-kernel", "sglang-kernel"} <= set(names)
    assert "nvidia-cudnn-cu13" not in names  # only for flashinfer_cudnn (seed 000)


def test_minimax_expected_figures():
    e = recipe("minimax-m2.5-nvfp4-rtx6000-tp2").expected
    assert e.output_tok_s == (80, 120) and e.input_tok_s == (8000, 12000) and e.ttft_ms == (100, 200)


# --------------------------------------------------------------------------- seed 002: two-node TP


def test_llama_two_node_render_ranks_and_dist_init():
    r = recipe("llama3-8b-multinode-tp4")
    procs = render(r).processes
    assert [p.node_rank for p in procs] == [0, 1]
    flags = [flag_map(p.argv) for p in procs]
    head = procs[0].address
    for f in flags:
        assert f["--dist-init-addr"] == [f"{head}:50000"]
        assert f["--nnodes"] == ["2"] and f["--tp-size"] == ["4"]
        assert f["--model-path"] == ["meta-llama/Meta-Llama-3-8B-Instruct"]
    assert [f["--node-rank"] for f in flags] == [["0"], ["1"]]
    assert [p.serves_http for p in procs] == [True, False]


def test_llama_two_node_render_with_inventory_points_at_node_0():
    hosts = [
        InventoryHost("sgl-dev-0", {"ssh_hostname": "10.0.0.10", "nic": "eth1"}),
        InventoryHost("sgl-dev-1", {"ssh_hostname": "10.0.0.11", "nic": "eth1"}),
    ]
    procs = render(recipe("llama3-8b-multinode-tp4"), hosts).processes
    assert [(p.host, p.node_rank) for p in procs] == [("sgl-dev-0", 0), ("sgl-dev-1", 1)]
    for p in procs:
        assert flag_map(p.argv)["--dist-init-addr"] == ["10.0.0.10:50000"]
        assert p.env.get("GLOO_SOCKET_IFNAME") == "eth1"


def test_llama_uses_two_gpus_per_node():
    engines = [p for p in render(recipe("llama3-8b-multinode-tp4")).processes if p.role != "router"]
    assert {p.devices for p in engines} == {2}


# --------------------------------------------------------------------------- lab


def test_tiny_cpu_replicas_behind_a_dedicated_router():
    r = recipe("tiny-cpu")
    assert r.source.seed == "local" and r.hardware == ["cpu-lab"] and r.model.generate == "tiny-llama"
    procs = render(r).processes
    servers = [p for p in procs if p.role == "server"]
    (router,) = [p for p in procs if p.role == "router"]
    assert len(servers) == 2 and router.host not in {p.host for p in servers}
    assert "round_robin" in router.argv and router.port == 30000
    assert router.argv[router.argv.index("--worker-urls") + 1 :][:2] == [f"http://{p.address}:30000" for p in servers]
    for p in servers:
        f = flag_map(p.argv)
        assert f["--device"] == ["cpu"] and f["--attention-backend"] == ["torch_native"]
        assert "--disable-cuda-graph" in f and "--skip-server-warmup" in f
        assert f["--served-model-name"] == ["tiny"] and f["--context-length"] == ["512"]
        assert f["--model-path"] == ["/var/lib/ironserve/models/tiny-llama"]


# --------------------------------------------------------------------------- defaults


def _defaults():
    return yaml.safe_load((catalogue.recipes_dir() / "defaults.yaml").read_text())["defaults"]


def test_defaults_point_at_recipes_for_that_family_and_hardware():
    recipes = catalogue.catalogue()
    for family, per_hw in _defaults().items():
        for hw, rid in per_hw.items():
            r = catalogue.default_recipe(family, hw)
            assert r.id == rid and rid in recipes
            assert r.model.family == family and hw in r.hardware, (family, hw, rid)


def test_defaults_cover_every_family_and_hardware_in_the_catalogue():
    defaults = _defaults()
    for rid, r in catalogue.catalogue().items():
        for hw in r.hardware:
            assert hw in defaults.get(r.model.family, {}), f"no default for ({r.model.family}, {hw}) ({rid} exists)"
    assert set(defaults) >= {"glm5", "glm5.1", "qwen3.5", "kimi-k2.5", "minimax-m2.5", "llama3", "tiny"}


def test_defaults_pick_the_fastest_known_good():
    d = _defaults()
    assert d["glm5"]["rtx6000-pro-maxq"] == "glm5-nvfp4-mtp-rtx6000-tp8"
    assert d["qwen3.5"]["rtx6000-pro-maxq"] == "qwen3.5-nvfp4-rtx6000-tp8-mtp"
    assert d["kimi-k2.5"]["rtx6000-pro"] == "kimi-k2.5-rtx6000-tp8"
