"""PD-disaggregation and multi-node recipes (seeds 004 and 001): what the generic faithfulness test cannot check.

The seed loops over node IPs (``${P_IP[$i]}``, ``$(( $i % 2 ))``...); the generic test only checks those flags are
present. Here the recipes are rendered on a fake inventory and the per-node values are checked against what the
seed's shell arithmetic gives on those IPs, plus the seed's host tuning, benchmark and expected figures.
"""

from __future__ import annotations

import re

import pytest

from ironserve import catalogue
from ironserve.catalogue import SpecError
from ironserve.flags import split_flags
from ironserve.inventory import InventoryHost
from ironserve.render import render
from ironserve.spec import devices_per_node as _devices

from .seedtext import extract, seed_path

SEED_004 = "004_0160d81ec05791b7.txt"
A3_IDS = sorted(r for r in catalogue.catalogue() if r.startswith("glm5.1-w4a8-a3-"))
A3_PD_IDS = [r for r in A3_IDS if catalogue.get_recipe(r).topology.kind == "pd-disaggregation"]


def hosts(n: int, nic=lambda i: "enp1s0", **data) -> list[InventoryHost]:
    return [InventoryHost(f"a3-{i}", {"ssh_hostname": f"10.0.0.{i + 1}", "nic": nic(i), **data}) for i in range(n)]


def flags(argv: list[str]) -> dict[str, list[str]]:
    """Flags of one command; a flag given twice is an error (router --prefill/--decode: use router_targets)."""
    start = next(i for i, a in enumerate(argv) if a.startswith("--"))
    out: dict[str, list[str]] = {}
    for name, values in split_flags(argv[start:]):
        assert name not in out or name in ("--prefill", "--decode"), f"{name} twice in {argv}"
        out[name] = values
    return out


def router_targets(argv: list[str], flag: str) -> list[list[str]]:
    """Each --prefill URL BOOTSTRAP / --decode URL occurrence, in order."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            out.append(argv[i + 1 : j])
            i = j
        else:
            i += 1
    return out


def rendered(recipe_id: str, **kw):
    recipe = catalogue.get_recipe(recipe_id)
    inv = hosts(recipe.topology.node_count, **kw)
    return recipe, inv, render(recipe, inv)


def by_role(result, role):
    return [p for p in result.processes if p.role == role]


def section_text(anchor: str) -> str:
    text = seed_path(SEED_004).read_text()
    body = text[text.index(anchor) + len(anchor) :]
    end = body.find("GLM-5.1 W4A8 ")
    return body[:end] if end > 0 else body


# --------------------------------------------------------------------------- seed 004: placement


def test_2p1d_prefill_instances_ranks_dist_init_and_bootstrap():
    _, inv, out = rendered("glm5.1-w4a8-a3-2p1d-48-128k-prefix90")
    prefill = by_role(out, "prefill")
    assert [p.host for p in prefill] == ["a3-0", "a3-1", "a3-2", "a3-3"]
    f = [flags(p.argv) for p in prefill]
    # Seed: --node-rank $(( $i % 2 )), --dist-init-addr ${P_IP[$(( $i / 2 * 2 ))]}:5000, bootstrap $((8998 + $i / 2))
    assert [x["--node-rank"] for x in f] == [["0"], ["1"], ["0"], ["1"]]
    assert [x["--nnodes"] for x in f] == [["2"]] * 4
    assert [x["--dist-init-addr"] for x in f] == [["10.0.0.1:5000"]] * 2 + [["10.0.0.3:5000"]] * 2
    assert [x["--disaggregation-bootstrap-port"] for x in f] == [["8998"], ["8998"], ["8999"], ["8999"]]
    assert [x["--host"] for x in f] == [["10.0.0.1"], ["10.0.0.2"], ["10.0.0.3"], ["10.0.0.4"]]
    assert [p.serves_http for p in prefill] == [True, False, True, False]
    decode = by_role(out, "decode")
    assert [p.host for p in decode] == ["a3-4", "a3-5"]
    assert all(flags(p.argv)["--dist-init-addr"] == ["10.0.0.5:5000"] for p in decode)
    assert all("--disaggregation-bootstrap-port" not in p.argv for p in decode)

    (router,) = by_role(out, "router")
    assert router_targets(router.argv, "--prefill") == [
        ["http://10.0.0.1:8000", "8998"],
        ["http://10.0.0.3:8000", "8999"],
    ]
    assert router_targets(router.argv, "--decode") == [["http://10.0.0.5:8001"]]
    rf = flags(router.argv)
    assert "--pd-disaggregation" in rf
    assert (rf["--host"], rf["--port"], rf["--policy"]) == (["127.0.0.1"], ["6688"], ["round_robin"])
    assert router.host == "a3-0"


def test_4p1d_single_node_prefills_keep_explicit_rank_and_count_bootstrap_up():
    _, _, out = rendered("glm5.1-w4a8-a3-4p1d-48-64k-prefix90")
    prefill = by_role(out, "prefill")
    assert len(prefill) == 4
    for i, p in enumerate(prefill):
        f = flags(p.argv)
        assert f["--nnodes"] == ["1"] and f["--node-rank"] == ["0"], p.argv
        assert "--dist-init-addr" not in f  # the seed has none for single-node prefills
        assert f["--disaggregation-bootstrap-port"] == [str(8998 + i)]
        assert p.serves_http and p.instance == i
    (router,) = by_role(out, "router")
    assert router_targets(router.argv, "--prefill") == [
        [f"http://10.0.0.{i + 1}:8000", str(8998 + i)] for i in range(4)
    ]
    assert router_targets(router.argv, "--decode") == [["http://10.0.0.5:8001"]]


def test_pd_mixed_gets_dist_init_and_node_rank():
    recipe, _, out = rendered("glm5.1-w4a8-a3-pd-mixed-16")
    assert recipe.topology.kind == "multinode-tp" and recipe.topology.router is None
    servers = by_role(out, "server")
    assert len(out.processes) == 2 == len(servers)
    for rank, p in enumerate(servers):
        f = flags(p.argv)
        # The seed has --nnodes 2 alone, which cannot start: the renderer adds the rest.
        assert f["--nnodes"] == ["2"]
        assert f["--dist-init-addr"] == ["10.0.0.1:5000"]
        assert f["--node-rank"] == [str(rank)]
        assert "--disaggregation-mode" not in f
        assert (f["--host"], f["--port"]) == (["127.0.0.1"], ["6688"])
    assert [p.serves_http for p in servers] == [True, False]


def test_4_node_decode_group_points_at_decode_node_0():
    _, _, out = rendered("glm5.1-w4a8-a3-1p1d-48-65k-prefix100")
    decode = by_role(out, "decode")
    assert [p.host for p in decode] == ["a3-2", "a3-3", "a3-4", "a3-5"]
    for rank, p in enumerate(decode):
        f = flags(p.argv)
        assert f["--dist-init-addr"] == ["10.0.0.3:5000"]
        assert f["--nnodes"] == ["4"] and f["--node-rank"] == [str(rank)]
        assert f["--tp-size"] == f["--dp-size"] == f["--ep-size"] == ["64"]
        assert f["--host"] == [f"10.0.0.{rank + 3}"]
    (router,) = by_role(out, "router")
    assert router_targets(router.argv, "--decode") == [["http://10.0.0.3:8001"]]


@pytest.mark.parametrize("recipe_id", A3_IDS)
def test_socket_ifnames_come_from_each_hosts_nic(recipe_id):
    _, inv, out = rendered(recipe_id, nic=lambda i: f"enp{i}s0")
    nic = {h.name: h.data["nic"] for h in inv}
    workers = [p for p in out.processes if p.role != "router"]
    assert workers
    for p in workers:
        assert p.env["GLOO_SOCKET_IFNAME"] == nic[p.host]
        assert p.env["HCCL_SOCKET_IFNAME"] == nic[p.host]


@pytest.mark.parametrize("recipe_id", A3_PD_IDS)
def test_mf_store_url_points_at_first_prefill_node(recipe_id):
    _, inv, out = rendered(recipe_id)
    first_prefill = by_role(out, "prefill")[0]
    assert first_prefill.address == inv[0].address
    for p in out.processes:
        if p.role != "router":
            assert p.env["ASCEND_MF_STORE_URL"] == f"tcp://{inv[0].address}:24670", p.host


@pytest.mark.parametrize("recipe_id", A3_IDS)
def test_model_path_comes_from_host_data(recipe_id):
    _, _, out = rendered(recipe_id, model_path="/data/glm51")
    for p in out.processes:
        if p.role != "router":
            assert flags(p.argv)["--model-path"] == ["/data/glm51"]


def test_wrong_host_count_names_the_inventory():
    recipe = catalogue.get_recipe("glm5.1-w4a8-a3-2p1d-48-128k-prefix90")
    with pytest.raises(SpecError) as err:
        render(recipe, hosts(5), where="inventories/a3-cluster.py")
    message = str(err.value)
    assert "inventories/a3-cluster.py" in message
    assert "needs 6 worker hosts" in message and "has 5" in message


# --------------------------------------------------------------------------- seed 004: the rest of the section


@pytest.mark.parametrize("recipe_id", A3_IDS)
def test_nodes_cards_and_devices_match_the_seed_heading(recipe_id):
    recipe = catalogue.get_recipe(recipe_id)
    text = section_text(recipe.source.section)
    cards = int(re.search(r"Cards: (\d+)", text).group(1))
    # Atlas 800I A3: 8 cards (16 NPU dies) per node.
    assert recipe.topology.node_count * 8 == cards
    for gi in range(len(recipe.topology.groups)):
        assert devices_per_node(recipe, gi) == 16, f"group {gi} does not fill the 16 dies of a node"


@pytest.mark.parametrize("recipe_id", A3_IDS)
def test_expected_tpot_and_dataset_from_the_seed(recipe_id):
    recipe = catalogue.get_recipe(recipe_id)
    text = section_text(recipe.source.section)
    tpot = int(re.search(r"TPOT: (\d+)ms", text).group(1))
    dataset = re.search(r"Dataset: (.+?) TPOT:", text).group(1)
    assert recipe.expected.tpot_ms == tpot
    assert dataset in recipe.expected.note


@pytest.mark.parametrize("recipe_id", A3_IDS)
def test_host_tuning_from_profile_matches_the_seed(recipe_id):
    recipe = catalogue.get_recipe(recipe_id)
    text = section_text(recipe.source.section)
    tuning = catalogue.hardware_profiles()["atlas-800i-a3"].tuning
    assert recipe.hardware == ["atlas-800i-a3"] and recipe.tuning is None
    governor = re.search(r"echo (\w+) \| tee /sys/devices/system/cpu/cpu\*/cpufreq/scaling_governor", text).group(1)
    assert tuning.governor == governor
    sysctls = dict(re.findall(r"sysctl -w ([a-z0-9_.]+)=(\S+)", text))
    assert sysctls and {k: str(v) for k, v in tuning.sysctls.items()} == sysctls
    assert tuning.cpu_affinity and recipe.env["SGLANG_SET_CPU_AFFINITY"] == "1"


_BENCH_FIELDS = {
    "--dataset-name": "dataset_name",
    "--random-input-len": "random_input_len",
    "--random-output-len": "random_output_len",
    "--random-range-ratio": "random_range_ratio",
    "--gsp-num-groups": "gsp_num_groups",
    "--gsp-prompts-per-group": "gsp_prompts_per_group",
    "--gsp-system-prompt-len": "gsp_system_prompt_len",
    "--gsp-question-len": "gsp_question_len",
    "--gsp-output-len": "gsp_output_len",
    "--max-concurrency": "max_concurrency",
    "--num-prompts": "num_prompts",
    "--request-rate": "request_rate",
}


@pytest.mark.parametrize("recipe_id", A3_IDS)
def test_benchmark_is_the_seeds_bench_serving_command(recipe_id):
    recipe = catalogue.get_recipe(recipe_id)
    (bench,) = extract(recipe.source.seed, recipe.source.section).of("bench")
    seed = flags(bench.argv)
    assert seed.pop("--backend") == ["sglang"]
    # The seed benchmarks the router (PD) or the server (mixed) on 127.0.0.1:6688.
    endpoint = recipe.topology.router or recipe.server
    assert seed.pop("--host") == [endpoint.host] and seed.pop("--port") == [str(endpoint.port)]
    b = recipe.benchmark
    assert b is not None and b.tool == "bench_serving"
    ours = {flag for flag, field in _BENCH_FIELDS.items() if getattr(b, field) is not None}
    assert set(seed) == ours, f"seed {sorted(seed)} recipe {sorted(ours)}"
    for flag, values in seed.items():
        value = getattr(b, _BENCH_FIELDS[flag])
        assert str(value) == values[0] or (isinstance(value, float) and value == float(values[0])), flag


def test_seed_quirk_identical_64k_sections_differ_only_in_tpot():
    a = catalogue.get_recipe("glm5.1-w4a8-a3-1p1d-32-64k-20ms").model_dump()
    b = catalogue.get_recipe("glm5.1-w4a8-a3-1p1d-32-64k-50ms").model_dump()
    for d in (a, b):
        for key in ("id", "description", "source", "expected"):
            d.pop(key)
    assert a == b


# --------------------------------------------------------------------------- seed 001: GB200, no command in the seed


GB200 = "glm5-nvfp4-gb200-disagg"


def test_gb200_topology_from_the_seed():
    recipe = catalogue.get_recipe(GB200)
    assert recipe.source.seed.startswith("001_")
    assert extract(recipe.source.seed, recipe.source.section).commands == []  # nothing for the generic test
    prefill, decode = recipe.topology.groups
    assert (prefill.role, prefill.instances, prefill.nodes) == ("prefill", 1, 1)
    assert (decode.role, decode.instances, decode.nodes) == ("decode", 1, 4)
    assert recipe.topology.node_count == 5
    p, d = recipe.group_server(prefill), recipe.group_server(decode)
    assert p.tp_size == 4 and not p.enable_dp_attention
    assert (d.tp_size, d.dp_size, d.ep_size, d.enable_dp_attention) == (16, 16, 16, True)
    assert devices_per_node(recipe, 0) == devices_per_node(recipe, 1) == 4
    assert d.speculative and d.speculative.algorithm == "EAGLE"
    assert p.speculative is None
    for s in (p, d):
        assert s.kv_cache_dtype == "fp8_e4m3"
        assert s.disaggregation_transfer_backend == "nixl"
        assert s.quantization == "modelopt_fp4"
    assert recipe.topology.router and recipe.topology.router.policy == "round_robin"


def test_gb200_env_runtime_and_figures_from_the_seed():
    recipe = catalogue.get_recipe(GB200)
    seed = " ".join(seed_path(recipe.source.seed).read_text().split())
    env = recipe.env
    for key, value in {
        "SGLANG_ENABLE_SPEC_V2": "1",
        "SGLANG_NVFP4_CKPT_FP8_NEXTN_MOE": "1",
        "UCX_TLS": "cuda_copy,cuda_ipc,tcp",
        "FLASHINFER_WORKSPACE_BASE": "/model-store",
    }.items():
        assert env[key] == value
        assert f"{key}={value}" in seed.replace(" ", "")
    assert "SGLANG_DISAGGREGATION_NIXL_BACKEND" not in env  # the LIBFABRIC/EFA variant, documented in notes
    assert any("SGLANG_DISAGGREGATION_NIXL_BACKEND=LIBFABRIC" in n and "privileged" in n for n in recipe.notes)
    assert any("Recovery caveat" in n for n in recipe.notes)
    assert recipe.runtime.kind == "docker"
    assert (
        recipe.runtime.image == "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.1.1-cuda13" and recipe.runtime.image in seed
    )
    assert not recipe.runtime.run.privileged
    assert recipe.model.hub_id == "nvidia/GLM-5-NVFP4"
    assert recipe.health_timeout_s == 3600
    assert recipe.expected.total_output_tok_s == 16800 and "19K" in recipe.expected.note
    b = recipe.benchmark
    assert (b.tool, b.random_input_len, b.random_output_len, b.max_concurrency, b.num_prompts) == (
        "aiperf",
        1000,
        8192,
        512,
        1536,
    )
    assert "ISL=1000, OSL=8192, concurrency=512" in seed and "1,536 requests" in seed


def test_gb200_render_places_prefill_then_one_4_node_decode_group():
    recipe = catalogue.get_recipe(GB200)
    inv = hosts(5, nic=lambda i: f"enP{i}p1s0")
    out = render(recipe, inv)
    (prefill,) = by_role(out, "prefill")
    decode = by_role(out, "decode")
    assert prefill.host == "a3-0"
    pf = flags(prefill.argv)
    assert pf["--disaggregation-bootstrap-port"] == ["30001"] and "--nnodes" not in pf
    assert [p.host for p in decode] == ["a3-1", "a3-2", "a3-3", "a3-4"]
    for rank, p in enumerate(decode):
        f = flags(p.argv)
        assert f["--dist-init-addr"] == ["10.0.0.2:5000"]
        assert f["--nnodes"] == ["4"] and f["--node-rank"] == [str(rank)]
        assert f["--speculative-algorithm"] == ["EAGLE"]
        assert p.env["NCCL_SOCKET_IFNAME"] == p.env["GLOO_SOCKET_IFNAME"] == inv[rank + 1].data["nic"]
    (router,) = by_role(out, "router")
    assert router_targets(router.argv, "--prefill") == [["http://10.0.0.1:30000", "30001"]]
    assert router_targets(router.argv, "--decode") == [["http://10.0.0.2:30000"]]


def devices_per_node(recipe, group_index: int) -> int:
    group = recipe.topology.groups[group_index]
    return _devices(recipe.group_server(group), group.nodes)
