"""Real-parser validation: seed commands parsed by the SGLang / sglang-router versions' own parsers.

Marked ``parser``: the first run builds one CPU venv per engine version under
``${IRONSERVE_CACHE:-~/.cache/ironserve}/sglang-parsers`` (about 30 s each with a warm uv cache, a few
minutes cold); later runs reuse them. Each version's parser is imported once per session: all the
commands a test module needs for a version are parsed in one batch (``check_many``).
"""

from __future__ import annotations

import pytest

from ironserve import engine_parser as ep
from ironserve import parser_probes
from ironserve.findings import Severity, has_errors

from .ci import need_parser_prerequisites

pytestmark = pytest.mark.parser

# Versions (see docs/engine-flags.md). 0.5.9 was PyPI's newest stable release from 2026-02-23 to
# 2026-04-05, i.e. all of March 2026; 0.5.10rc0 was published between 2026-03-22 and 2026-03-31.
SEED_ERA = "0.5.9"
MINIMAX_ERA = "0.5.10rc0"  # seed 003 installs `sglang --pre` on 2026-03-30
LATEST = "0.5.23"
ROUTER = "0.3.2"

# ---- seed commands, as the seeds write them (placeholders filled with type-correct values) ----------

# seed 000 (RTX PRO 6000): Qwen3.5 NVFP4 "stable baseline without MTP"
S000_QWEN_BASELINE = """python -m sglang.launch_server --model-path nvidia/Qwen3.5-397B-A17B-NVFP4 --tp-size 4
 --host 0.0.0.0 --port 8000 --trust-remote-code --mem-fraction-static 0.85 --quantization modelopt_fp4
 --attention-backend triton --moe-runner-backend flashinfer_cutlass --fp4-gemm-backend flashinfer_cudnn
 --context-length 262144 --reasoning-parser qwen3 --tool-call-parser qwen3_coder --sleep-on-idle"""
# seed 000: Qwen3.5 NVFP4 "with MTP and full tuning" (uses --tool-call-parser qwen3 and PCIe oneshot)
S000_QWEN_MTP = """python3 -m sglang.launch_server --model-path nvidia/Qwen3.5-397B-A17B-NVFP4 --tp 4
 --trust-remote-code --attention-backend flashinfer --moe-runner-backend flashinfer_cutlass
 --kv-cache-dtype fp8_e4m3 --tool-call-parser qwen3 --reasoning-parser qwen3 --quantization modelopt_fp4
 --enable-pcie-oneshot-allreduce --mem-fraction-static 0.9 --cuda-graph-max-bs 8 --host 0.0.0.0
 --port 5000 --served-model-name qwen3.5 --max-running-requests 8 --fp8-gemm-backend triton
 --model-loader-extra-config '{"enable_multithread_load": true, "num_threads": 16}' --sleep-on-idle"""
# seed 000: "fastest reported config" (--model, --speculative-algo, --mamba-scheduler-strategy)
S000_QWEN_FASTEST = """python3 -m sglang.launch_server --model nvidia/Qwen3.5-397B-A17B-NVFP4
 --served-model-name Qwen3.5 --reasoning-parser qwen3 --tool-call-parser qwen3_coder
 --tensor-parallel-size 8 --quantization modelopt_fp4 --kv-cache-dtype fp8_e4m3 --trust-remote-code
 --attention-backend triton --moe-runner-backend flashinfer_cutlass --fp4-gemm-backend flashinfer_cudnn
 --cuda-graph-max-bs 4 --max-running-requests 4 --context-length 262144 --chunked-prefill-size 32768
 --speculative-algo NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1
 --speculative-num-draft-tokens 4 --mamba-scheduler-strategy extra_buffer --page-size 64
 --mem-fraction-static 0.85 --sleep-on-idle --host 0.0.0.0 --port 8000"""
# seed 000: Kimi K2.5 INT4 (original checkpoint)
S000_KIMI = """python -m sglang.launch_server --model moonshotai/Kimi-K2.5 --tp 8 --host 0.0.0.0 --port 5000
 --mem-fraction-static 0.94 --enable-metrics --sleep-on-idle --attention-backend flashinfer
 --tool-call-parser kimi_k2 --reasoning-parser kimi_k2 --served-model-name kimi-k2.5
 --chunked-prefill-size 8092 --cuda-graph-max-bs 16
 --model-loader-extra-config '{"enable_multithread_load": true, "num_threads": 16}'
 --trust-remote-code --enable-mixed-chunk"""
# seed 000: GLM-5 NVFP4 MTP "best known working command"
S000_GLM5_MTP = """python3 -m sglang.launch_server --model-path /mnt/GLM-5-NVFP4-MTP --tp 8 --trust-remote-code
 --attention-backend flashinfer --moe-runner-backend cutlass --kv-cache-dtype bf16 --tool-call-parser glm47
 --reasoning-parser glm45 --quantization modelopt_fp4 --enable-pcie-oneshot-allreduce
 --mem-fraction-static 0.85 --cuda-graph-max-bs 32 --host 0.0.0.0 --port 5000 --served-model-name glm-5
 --max-running-requests 64 --model-loader-extra-config '{"enable_multithread_load": true, "num_threads": 8}'
 --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-num-draft-tokens 4
 --speculative-eagle-topk 1 --enable-metrics --sleep-on-idle"""
# seed 000: Qwen3.5 EAGLE
S000_QWEN_EAGLE = """python3 -m sglang.launch_server --model-path nvidia/Qwen3.5-397B-A17B-NVFP4 --tp 4
 --trust-remote-code --attention-backend triton --moe-runner-backend cutlass --kv-cache-dtype fp8_e4m3
 --tool-call-parser qwen3_coder --reasoning-parser qwen3 --quantization modelopt_fp4
 --mamba-scheduler-strategy extra_buffer --fp8-gemm-backend triton --speculative-algorithm EAGLE
 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
 --model-loader-extra-config '{"enable_multithread_load": true, "num_threads": 16}' --sleep-on-idle"""

# seed 003 (MiniMax M2.5 NVFP4, `sglang serve`)
S003_MINIMAX = """uv run sglang serve --model-path /home/johannes/models/lukealonso/MiniMax-M2.5-NVFP4/
 --fp4-gemm-backend flashinfer_cutlass --attention-backend triton --served-model-name vllm
 --trust-remote-code --tensor-parallel-size 2 --tool-call-parser minimax-m2
 --reasoning-parser minimax-append-think --host 0.0.0.0 --port 8000"""

# seed 004 (GLM-5.1 W4A8 on Ascend A3): PD-mixed, 1P1D prefill + decode, router
S004_MIXED = """python3 -m sglang.launch_server --model-path /path/to/model-weights --host 127.0.0.1
 --port 6688 --attention-backend ascend --device npu --tp-size 32 --nnodes 2 --dp-size 16
 --enable-dp-attention --chunked-prefill-size 65536 --max-prefill-tokens 280000 --trust-remote-code
 --mem-fraction-static 0.65 --served-model-name glm-5 --cuda-graph-max-bs 8 --max-running-requests 128
 --quantization modelslim --speculative-draft-model-quantization unquant --moe-a2a-backend deepep
 --deepep-mode auto --load-balance-method round_robin --speculative-algorithm NEXTN
 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"""
S004_PREFILL = """python3 -m sglang.launch_server --model-path /path/to/model-weights
 --disaggregation-mode prefill --host 10.0.0.1 --port 8000 --dist-init-addr 10.0.0.1:5000
 --disaggregation-bootstrap-port 8998 --node-rank 0 --tp-size 4 --nnodes 2 --mem-fraction-static 0.72
 --attention-backend ascend --device npu --quantization modelslim --disaggregation-transfer-backend ascend
 --max-running-requests 16 --served-model-name glm-5 --chunked-prefill-size 16384
 --max-prefill-tokens 180000 --moe-a2a-backend deepep --deepep-mode normal
 --disable-shared-experts-fusion --disable-cuda-graph --dtype bfloat16
 --speculative-draft-model-quantization unquant --enable-nsa-prefill-context-parallel
 --nsa-prefill-cp-mode in-seq-split --attn-cp-size 4 --enable-dp-lm-head --moe-dense-tp 1 --pp-size 8"""
S004_DECODE = """python3 -m sglang.launch_server --model-path /path/to/model-weights
 --disaggregation-mode decode --host 10.0.0.3 --port 8001 --dist-init-addr 10.0.0.3:5000 --node-rank 0
 --tp-size 32 --nnodes 2 --dp-size 32 --ep-size 32 --enable-dp-attention --mem-fraction-static 0.85
 --max-running-requests 32 --attention-backend ascend --device npu --quantization modelslim
 --served-model-name glm-5 --moe-a2a-backend deepep --deepep-mode low_latency --cuda-graph-bs 1 2 3
 --disaggregation-transfer-backend ascend --watchdog-timeout 9000 --context-length 180000
 --tokenizer-worker-num 16 --prefill-round-robin-balance --disable-shared-experts-fusion
 --dtype bfloat16 --load-balance-method round_robin --speculative-draft-model-quantization unquant"""
S004_ROUTER = """python -m sglang_router.launch_router --pd-disaggregation
 --prefill http://10.0.0.1:8000 8998 --prefill http://10.0.0.2:8000 8999
 --decode http://10.0.0.3:8001 --host 127.0.0.1 --port 6688 --policy round_robin"""

# seed 002 (generic server-arguments reference)
S002_COMMANDS = [
    "python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct --tp 2",
    "python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct --mem-fraction-static 0.7",
    "python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct --chunked-prefill-size 4096",
    "python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct --tp 4"
    " --dist-init-addr sgl-dev-0:50000 --nnodes 2 --node-rank 0",
    "python -m sglang.launch_server --model-path m --enable-torch-compile --torchao-config int4wo-128"
    " --quantization fp8 --kv-cache-dtype fp8_e5m2 --enable-p2p-check --disable-cuda-graph",
]

SEED_SERVER = {
    "000-qwen-baseline": S000_QWEN_BASELINE,
    "000-qwen-mtp": S000_QWEN_MTP,
    "000-qwen-fastest": S000_QWEN_FASTEST,
    "000-kimi": S000_KIMI,
    "000-glm5-mtp": S000_GLM5_MTP,
    "000-qwen-eagle": S000_QWEN_EAGLE,
    "003-minimax": S003_MINIMAX,
    "004-mixed": S004_MIXED,
    "004-prefill": S004_PREFILL,
    "004-decode": S004_DECODE,
    **{f"002-{n}": c for n, c in enumerate(S002_COMMANDS)},
}


def _cmd(text: str) -> str:
    return " ".join(text.split())


def _rules(findings, rule):
    return [f for f in findings if f.rule == rule]


def _by_where(findings):
    return {(f.rule, f.where): f for f in findings}


@pytest.fixture(scope="session", autouse=True)
def _need_uv_and_torch():
    need_parser_prerequisites()


@pytest.fixture(scope="session")
def seed_results():
    """{version: {seed command id: findings}}: one probe subprocess per version."""
    out = {}
    ids = list(SEED_SERVER)
    for version in (SEED_ERA, MINIMAX_ERA, LATEST):
        res = ep.check_many(version, [_cmd(SEED_SERVER[i]) for i in ids])
        out[version] = dict(zip(ids, res))
    return out


# ---- the API on the seed-era parser -------------------------------------------------------------


def test_good_seed_command_parses_clean(seed_results):
    # seed 000's baseline, written with full flag names, is valid for 0.5.9 as is
    assert seed_results[SEED_ERA]["000-qwen-baseline"] == []
    # seed 004 PD-mixed: everything known (no unknowns, no bad choices)
    assert not has_errors(seed_results[SEED_ERA]["004-mixed"]), seed_results[SEED_ERA]["004-mixed"]


def test_minimax_seed_parses_clean_on_sglang_serve(seed_results):
    assert seed_results[MINIMAX_ERA]["003-minimax"] == []
    assert seed_results[SEED_ERA]["003-minimax"] == []


def test_unknown_flag_suggests_nearest():
    findings = ep.check_server_argv(
        SEED_ERA,
        [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--tp-size",
            "2",
            "--mem-fraction-statc",
            "0.8",
            "--sleep-on-idel",
        ],
    )
    unknown = {f.where: f for f in _rules(findings, "engine-unknown-flag")}
    assert set(unknown) == {"--mem-fraction-statc", "--sleep-on-idel"}
    assert all(f.severity is Severity.error for f in unknown.values())
    assert "--mem-fraction-static" in unknown["--mem-fraction-statc"].fix
    assert "--sleep-on-idle" in unknown["--sleep-on-idel"].fix


def test_bad_choice_lists_valid_choices():
    findings = ep.check_server_argv(
        SEED_ERA,
        (
            "python3 -m sglang.launch_server --model-path m --attention-backend flashinfr "
            "--moe-runner-backend cutlass --tool-call-parser qwen3"
        ),
    )
    bad = {f.where: f for f in _rules(findings, "engine-bad-choice")}
    assert set(bad) == {"--attention-backend", "--tool-call-parser"}
    assert "did you mean flashinfer" in bad["--attention-backend"].fix
    assert "qwen3_coder" in bad["--tool-call-parser"].fix and "qwen25" in bad["--tool-call-parser"].fix
    assert all(f.severity is Severity.error for f in bad.values())


def test_bad_value_and_missing_value():
    findings = ep.check_server_argv(
        SEED_ERA,
        [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--tp-size",
            "four",
            "--mem-fraction-static",
        ],
    )
    where = {f.where for f in _rules(findings, "engine-bad-value")}
    assert where == {"--tp-size", "--mem-fraction-static"}


def test_abbreviations_named_with_full_flag():
    """--tp, --speculative-algo, --moe-dense-tp are prefixes; --model, --ep, --tp-size are aliases."""
    findings = ep.check_server_argv(
        SEED_ERA,
        (
            "python3 -m sglang.launch_server --model X --tp 4 --speculative-algo NEXTN --moe-dense-tp 1 "
            "--ep 2 --tp-size 4 --attn-cp-size 2"
        ),
    )
    abbrev = {f.where: f for f in _rules(findings, "engine-abbreviated-flag")}
    assert set(abbrev) == {"--tp", "--speculative-algo", "--moe-dense-tp"}
    assert "--tensor-parallel-size" in abbrev["--tp"].message or "--tp-size" in abbrev["--tp"].message
    assert "--tp-size" in abbrev["--tp"].fix
    assert "--speculative-algorithm" in abbrev["--speculative-algo"].fix
    assert "--moe-dense-tp-size" in abbrev["--moe-dense-tp"].fix
    assert all(f.severity is Severity.warning for f in abbrev.values())
    assert not has_errors(findings)
    # registered aliases in 0.5.9: --model (of --model-path), --ep (of --expert-parallel-size)
    flags = ep.flag_table(SEED_ERA)
    assert "--model-path" in flags["--model"]["aliases"]
    assert flags["--ep"]["dest"] == "expert_parallel_size"
    assert "--tp" not in flags and "--moe-dense-tp" not in flags


def test_ambiguous_abbreviation_is_an_error():
    # seed 000's flag table suggests "--tp 2 --pp 3"; --pp matches --pp-size, --pp-max-micro-batch-size, ...
    findings = ep.check_server_argv(SEED_ERA, "python3 -m sglang.launch_server --model-path m --tp-size 2 --pp 3")
    (f,) = _rules(findings, "engine-abbreviated-flag")
    assert f.where == "--pp" and f.severity is Severity.error and "--pp-size" in f.fix


def test_abbreviation_is_still_validated():
    # the value behind an abbreviation is checked against the full flag's choices
    findings = ep.check_server_argv(SEED_ERA, "python3 -m sglang.launch_server --model-path m --attention-back tritn")
    assert {f.rule for f in findings} == {"engine-abbreviated-flag", "engine-bad-choice"}


def test_seed_000_flags_not_in_any_pypi_release(seed_results):
    # the RTX6000 seed ran a patched nightly image: two of its spellings were never in a PyPI release
    for version in (SEED_ERA, MINIMAX_ERA, LATEST):
        mtp = _by_where(seed_results[version]["000-qwen-mtp"])
        assert ("engine-unknown-flag", "--enable-pcie-oneshot-allreduce") in mtp
        assert ("engine-bad-choice", "--tool-call-parser") in mtp


def test_seed_004_ascend_flags_on_seed_era(seed_results):
    prefill = _by_where(seed_results[SEED_ERA]["004-prefill"])
    decode = _by_where(seed_results[SEED_ERA]["004-decode"])
    assert not any(f.severity is Severity.error for f in prefill.values()), prefill
    assert ("engine-abbreviated-flag", "--moe-dense-tp") in prefill
    assert not any(f.severity is Severity.error for f in decode.values()), decode
    assert ("engine-deprecated-flag", "--prefill-round-robin-balance") in decode


def test_latest_rejects_seed_era_flags(seed_results):
    """0.5.23 dropped flags the seeds use; each is an error there, said so per command.

    --cuda-graph-max-bs and --cuda-graph-bs are worse than unknown in 0.5.23: they are now ambiguous
    prefixes of the new -decode/-prefill flags, so argparse's abbreviation matching refuses them.
    """
    r = seed_results[LATEST]
    fastest = _by_where(r["000-qwen-fastest"])
    assert ("engine-unknown-flag", "--mamba-scheduler-strategy") in fastest
    assert "--mamba-radix-cache-strategy" in fastest[("engine-unknown-flag", "--mamba-scheduler-strategy")].fix
    max_bs = fastest[("engine-abbreviated-flag", "--cuda-graph-max-bs")]
    assert max_bs.severity is Severity.error and "--cuda-graph-max-bs-decode" in max_bs.fix
    assert "0.5.9" in max_bs.message and "dropped by 0.5.23" in max_bs.message
    prefill = _by_where(r["004-prefill"])
    for flag in ("--enable-nsa-prefill-context-parallel", "--nsa-prefill-cp-mode"):
        assert ("engine-unknown-flag", flag) in prefill
    assert "--enable-prefill-cp" in prefill[("engine-unknown-flag", "--enable-nsa-prefill-context-parallel")].fix
    decode = _by_where(r["004-decode"])
    assert decode[("engine-abbreviated-flag", "--cuda-graph-bs")].severity is Severity.error
    assert ("engine-unknown-flag", "--prefill-round-robin-balance") in decode
    mixed = _by_where(r["004-mixed"])
    assert mixed[("engine-abbreviated-flag", "--cuda-graph-max-bs")].severity is Severity.error
    assert ("engine-deprecated-flag", "--enable-dp-attention") in mixed
    # never in any PyPI release (seed 000 ran a patched nightly image)
    mtp = _by_where(r["000-qwen-mtp"])
    assert ("engine-unknown-flag", "--enable-pcie-oneshot-allreduce") in mtp
    assert ("engine-bad-choice", "--tool-call-parser") in mtp
    # what still parses on 0.5.23: the baseline and the MiniMax command
    assert r["000-qwen-baseline"] == [] and r["003-minimax"] == []


def test_flag_changes_seed_era_to_latest():
    ch = ep.flag_changes(SEED_ERA, LATEST)
    for flag in (
        "--cuda-graph-max-bs",
        "--cuda-graph-bs",
        "--mamba-scheduler-strategy",
        "--enable-nsa-prefill-context-parallel",
        "--nsa-prefill-cp-mode",
        "--prefill-round-robin-balance",
    ):
        assert flag in ch["removed"], flag
    assert "--tp-size" not in ch["removed"] and "--sleep-on-idle" not in ch["removed"]
    assert "--tool-call-parser" in ch["choices"] and "--enable-dp-attention" in ch["now_deprecated"]


def test_router_pd_argv_parses():
    assert ep.check_router_argv(ROUTER, _cmd(S004_ROUTER)) == []
    bad = ep.check_router_argv(ROUTER, _cmd(S004_ROUTER).replace("round_robin", "roundrobin") + " --polcy x")
    rules = {(f.rule, f.where) for f in bad}
    assert ("engine-bad-choice", "--policy") in rules and ("engine-unknown-flag", "--polcy") in rules


def test_check_many_mixes_server_and_router():
    res = ep.check_many(SEED_ERA, [_cmd(S000_QWEN_BASELINE), _cmd(S004_ROUTER), "bash run.sh"])
    assert res[0] == [] and res[1] == []
    assert res[2][0].rule == "engine-unknown-launcher"


def test_non_pypi_versions_raise():
    for v in ("nightly", "dev-cu13", "0.5.10+cu130", "main"):
        with pytest.raises(ep.EngineNotAvailable):
            ep.parser_env(v)
    with pytest.raises(ep.EngineNotAvailable):
        ep.check_server_argv("0.5.999", "python3 -m sglang.launch_server --model-path m")


def test_a_release_alone_is_its_package_without_dependencies(tmp_path):
    """What the lab's stand-in images carry of a release: its package and dist-info, no torch, no venv."""
    target = ep.release_only(SEED_ERA, tmp_path / "release")
    assert (target / "sglang" / "srt" / "server_args.py").is_file()
    assert (target / f"sglang-{SEED_ERA}.dist-info" / "METADATA").is_file()
    assert not list(target.glob("torch*")) and not (target / "lib").exists()
    with pytest.raises(ep.EngineNotAvailable, match="is not on PyPI"):
        ep.release_only("0.5.999", tmp_path / "none")


def test_known_flags_cached():
    flags = ep.known_flags(SEED_ERA)
    assert {"--model-path", "--tp-size", "--sleep-on-idle", "--cuda-graph-max-bs"} <= flags
    assert "--cuda-graph-max-bs" not in ep.known_flags(LATEST)
    assert (ep.env_dir(SEED_ERA) / "flags.json").is_file()
    info = ep.env_info(SEED_ERA)
    assert info["torch"].endswith("+cpu") and info["shims"] == ["torchvision"]


# ---- every recipe whose engine (or parser_version) is a PyPI version --------------------------------

# Seed-era spellings that some PyPI parser rejects, each with why. A recipe error outside this table
# (a renderer typo, a wrong choice) fails the test; the ones inside are reported, not hidden.
SEED_ERA_DRIFT = {
    "--enable-pcie-oneshot-allreduce": "never in a PyPI release (seed 000's patched nightly image)",
    "--tool-call-parser": "'qwen3' was never a tool-call parser on PyPI (qwen3_coder / qwen / qwen25 are)",
    "--cuda-graph-max-bs": "deprecated 0.5.15 (-> --cuda-graph-max-bs-decode), gone and ambiguous in 0.5.23",
    "--cuda-graph-bs": "deprecated 0.5.15 (-> --cuda-graph-bs-decode), gone and ambiguous in 0.5.23",
    "--mamba-scheduler-strategy": "deprecated 0.5.15 (-> --mamba-radix-cache-strategy), gone in 0.5.23",
    "--enable-nsa-prefill-context-parallel": "deprecated 0.5.15 (-> --enable-prefill-cp), gone in 0.5.23",
    "--nsa-prefill-cp-mode": "deprecated 0.5.15 (-> --cp-strategy zigzag), gone in 0.5.23",
    "--nsa-decode-backend": "deprecated 0.5.15 (-> --dsa-decode-backend), gone in 0.5.23",
    "--nsa-prefill-backend": "deprecated 0.5.15 (-> --dsa-prefill-backend), gone in 0.5.23",
    "--prefill-round-robin-balance": "deprecated since <=0.5.9, gone in 0.5.23 (no replacement)",
    "--torchao-config": "gone in 0.5.19",
}


def test_every_pypi_recipe_parses_with_its_version(capsys):
    from collections import defaultdict

    from ironserve import catalogue
    from ironserve.render import render

    groups = defaultdict(list)
    for rid, recipe in sorted(catalogue.catalogue().items()):
        version = recipe.engine.check_version
        if not version:
            continue
        for proc in render(recipe).processes:
            router = recipe.engine.router if proc.role == "router" else None
            if proc.role == "router" and not router:
                continue
            groups[(version, router)].append((rid, proc.role, proc.argv))
    assert groups, "no recipe with a PyPI engine version"
    unexpected, report = [], []
    for (version, router), items in groups.items():
        results = ep.check_many(version, [argv for _, _, argv in items], router_version=router)
        for (rid, role, _), findings in zip(items, results):
            errors = [f for f in findings if f.severity is Severity.error]
            if errors:
                report.append(f"{rid} [{role}] sglang {version}: " + "; ".join(f"{f.rule} {f.where}" for f in errors))
            unexpected += [(rid, role, version, f.line()) for f in errors if f.where not in SEED_ERA_DRIFT]
            if role == "router":
                assert findings == [], (rid, findings)
    with capsys.disabled():
        print("\nreal-parser findings per recipe (seed-era drift, see docs/engine-flags.md):")
        print("\n".join(f"  {line}" for line in sorted(set(report))) or "  none")
    assert not unexpected, unexpected


def test_checks_of_one_release_share_its_warm_probe():
    # the import of the release's parser is paid once per process (ironserve/parser_probes.py)
    ep.check_server_argv(SEED_ERA, "python3 -m sglang.launch_server --model-path m")
    path = ep.parser_env(SEED_ERA)
    probe = parser_probes._PROBES[path][1]
    findings = ep.check_server_argv(SEED_ERA, "python3 -m sglang.launch_server --model-path m --tp 2")
    assert parser_probes._PROBES[path][1] is probe and probe.alive()
    assert _rules(findings, "engine-abbreviated-flag")
