"""Seed fidelity where tests/test_seed_faithfulness.py cannot compare text with text:

- the seeds' host-dependent values (``${P_IP[$i]}``, ``${MODEL_PATH}``, ``<network-interface>``,
  ``tcp://<your prefill ip1>:24670``, the router's ``http://<your ...>`` workers) become, on a placed render,
  the value each stands for: the rank's own address, the recipe's model path, the host's NIC, the first prefill
  node, the workers' addresses;
- the router's env: what the seed's router command sets, no more;
- seed 001 (GB200, Dynamo on Kubernetes) lists no worker command, so its values are read from its prose: the
  topology, the EAGLE MTP and FP8 KV settings, the env it names, the image, the workload and the throughput.
"""

from __future__ import annotations

import re

import pytest

from ironserve import catalogue
from ironserve.inventory import InventoryHost
from ironserve.render import render

from .seedtext import extract, seed_path
from .test_seed_faithfulness import flag_map

NIC = "enp189s0f0"


def placed(recipe, hardware: str):
    n = sum(g.nodes * g.instances for g in recipe.topology.groups)
    hosts = [
        InventoryHost(f"n{i}", {"ssh_hostname": f"10.9.0.{i + 1}", "nic": NIC, "hardware": hardware}) for i in range(n)
    ]
    return render(recipe, hosts)


A3_PD = [
    rid
    for rid in sorted(catalogue.catalogue())
    if catalogue.get_recipe(rid).source.seed.startswith("004")
    and catalogue.get_recipe(rid).topology.kind == "pd-disaggregation"
]


def test_the_a3_pd_recipes_are_found():
    assert len(A3_PD) >= 5, A3_PD


@pytest.mark.parametrize("rid", A3_PD)
def test_host_dependent_seed_values_are_the_placed_values(rid):
    recipe = catalogue.get_recipe(rid)
    section = extract(recipe.source.seed, recipe.source.section)
    rendered = placed(recipe, recipe.hardware[0])
    prefills = [p for p in rendered.processes if p.role == "prefill"]
    first_prefill = min(prefills, key=lambda p: (p.instance, p.node_rank)).address
    checked = 0
    for kind in ("prefill", "decode"):
        seed = section.of(kind)[0]
        seed_flags = flag_map(seed.argv)
        for proc in (p for p in rendered.processes if p.role == kind):
            ours = flag_map(proc.argv)
            if seed_flags.get("--model-path", [""])[0].startswith("$"):
                assert ours["--model-path"] == [recipe.model.path]
            if re.fullmatch(r"\$\{[PD]_IP\[\$i\]\}", seed_flags.get("--host", [""])[0]):
                assert ours["--host"] == [proc.address], (kind, proc.host)
            for key, value in seed.env.items():
                if value == "<network-interface>":
                    assert proc.env[key] == NIC, (key, proc.host)
                elif "<your prefill ip1>" in value:
                    assert proc.env[key] == value.replace("<your prefill ip1>", first_prefill), key
                else:
                    continue
                checked += 1
    assert checked


@pytest.mark.parametrize("rid", A3_PD)
def test_the_routers_workers_and_env_are_the_seeds(rid):
    recipe = catalogue.get_recipe(rid)
    section = extract(recipe.source.seed, recipe.source.section)
    rendered = placed(recipe, recipe.hardware[0])
    (router,) = [p for p in rendered.processes if p.role == "router"]
    (seed,) = section.of("router")
    assert router.env == seed.env  # the seed's router command sets no env; nor does the render
    for role in ("prefill", "decode"):
        # one worker URL per group instance (the seed's "http://<your prefill ip...>" each), each the address and
        # port of that instance's rank 0
        heads = [p for p in rendered.processes if p.role == role and p.node_rank == 0]
        urls = [router.argv[i + 1] for i, a in enumerate(router.argv) if a == f"--{role}"]
        assert len(urls) == len(heads) == seed.argv.count(f"--{role}"), (role, urls)
        assert sorted(urls) == sorted(f"http://{h.address}:{h.port}" for h in heads)


# --------------------------------------------------------------------------- seed 001: GB200, values from prose


GB200 = "glm5-nvfp4-gb200-disagg"


@pytest.fixture(scope="module")
def seed001() -> str:
    recipe = catalogue.get_recipe(GB200)
    return re.sub(r"\s+", " ", seed_path(recipe.source.seed).read_text())


def test_gb200_topology_is_the_seeds(seed001):
    m = re.search(r"(\d+) prefill node \(TP(\d+)\) plus (\d+) decode nodes \(TP(\d+)/DP(\d+)/EP(\d+)\)", seed001)
    assert m, "the seed's topology sentence"
    p_nodes, p_tp, d_nodes, d_tp, d_dp, d_ep = map(int, m.groups())
    gpus = int(re.search(r"across \d+ nodes of (\d+)x GB200", seed001).group(1))
    recipe = catalogue.get_recipe(GB200)
    rendered = placed(recipe, "gb200")
    prefill = [p for p in rendered.processes if p.role == "prefill"]
    decode = [p for p in rendered.processes if p.role == "decode"]
    assert (len(prefill), len(decode)) == (p_nodes, d_nodes)
    assert {p.devices for p in prefill + decode} == {gpus}
    assert flag_map(prefill[0].argv)["--tp-size"] == [str(p_tp)]
    for proc in decode:
        flags = flag_map(proc.argv)
        assert (flags["--tp-size"], flags["--dp-size"], flags["--ep-size"]) == ([str(d_tp)], [str(d_dp)], [str(d_ep)])
        assert flags["--nnodes"] == [str(d_nodes)]
        assert "--enable-dp-attention" in flags
        assert flags["--speculative-algorithm"] == ["EAGLE"]  # "EAGLE MTP speculative decoding"
    kv = re.search(r"--kv-cache-dtype (\S+?)\(", seed001).group(1)
    for proc in prefill + decode:
        assert flag_map(proc.argv)["--kv-cache-dtype"] == [kv]


def test_gb200_env_named_by_the_seed_is_rendered(seed001):
    # the prose glues words to the values ("tcpfor", "/model-storeto persist"): a value ends before them
    named = dict(re.findall(r"((?:SGLANG|FLASHINFER|UCX)_[A-Z0-9_]+)=([^\s(]+?)(?=\(|and|for|to |\s|$)", seed001))
    # the EFA variant's setting is that variant's (the recipe's notes), not the standard target's
    named.pop("SGLANG_DISAGGREGATION_NIXL_BACKEND", None)
    assert set(named) >= {
        "SGLANG_ENABLE_SPEC_V2",
        "SGLANG_NVFP4_CKPT_FP8_NEXTN_MOE",
        "FLASHINFER_WORKSPACE_BASE",
        "UCX_TLS",
    }, named
    rendered = placed(catalogue.get_recipe(GB200), "gb200")
    for proc in (p for p in rendered.processes if p.role in ("prefill", "decode")):
        for key, value in named.items():
            assert proc.env.get(key) == value, (proc.role, key)


def test_gb200_image_workload_and_throughput_are_the_seeds(seed001):
    recipe = catalogue.get_recipe(GB200)
    assert recipe.runtime.image == re.search(r"\(\s*(nvcr\.io/\S+?)\s*\)", seed001).group(1)
    m = re.search(r"ISL=(\d+), OSL=(\d+), concurrency=(\d+) \(\d+ per decode GPU\), ([\d,]+) requests", seed001)
    isl, osl, concurrency, requests = (
        int(m.group(1)),
        int(m.group(2)),
        int(m.group(3)),
        int(m.group(4).replace(",", "")),
    )
    bench = recipe.benchmark
    assert (bench.random_input_len, bench.random_output_len) == (isl, osl)
    assert (bench.max_concurrency, bench.num_prompts) == (concurrency, requests)
    tok_s = float(re.search(r"roughly ([\d.]+)K output tokens/sec", seed001).group(1)) * 1000
    assert recipe.expected.total_output_tok_s == tok_s
    assert recipe.model.hub_id == re.search(r"serves (\S+) with disaggregated", seed001).group(1)
