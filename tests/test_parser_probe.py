"""The parser probe's checks on a standard-library parser shaped like SGLang's (the probe runs inside parser venvs;
tests marked `parser` run it there against each release's own parser)."""

from __future__ import annotations

import argparse

from ironserve import _parser_probe as probe


class _DeprecatedStoreTrue(argparse._StoreTrueAction):
    """As SGLang 0.5.2x registers a deprecated spelling: its class says so, its help names the new flag."""


def _parser() -> argparse.ArgumentParser:
    parser = probe._ProbeParser(prog="sglang.launch_server")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--pp-size", type=int, default=1)
    parser.add_argument("--attention-backend", choices=["flashinfer", "triton", "fa3"])
    parser.add_argument("--cuda-graph-bs", type=int, nargs="+")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument(
        "--enable-dp-attention", action=_DeprecatedStoreTrue, help="Deprecated. Use --attn-dp-size instead."
    )
    probe._disable_abbrev(parser)
    return parser


def _check(line: str):
    findings, namespace = probe.check_argv(_parser(), line.split(), "server")
    return [(f["rule"], f["severity"], f["where"]) for f in findings], findings, namespace


def test_a_clean_command_parses():
    rules, _, namespace = _check("--model-path m --tp-size 8 --attention-backend fa3")
    assert rules == [] and namespace.tp_size == 8


def test_a_unique_abbreviation_is_a_warning_and_the_rest_is_still_checked():
    rules, findings, namespace = _check("--model-path m --trust-remote --tp-size 4")
    assert rules == [("engine-abbreviated-flag", "warning", "--trust-remote")]
    assert findings[0]["fix"] == "write --trust-remote-code in full"
    assert namespace.trust_remote_code is True and namespace.tp_size == 4


def test_an_ambiguous_abbreviation_stops_the_server():
    rules, findings, _ = _check("--model-path m --pp-size 2 --t 2")
    assert rules == [("engine-abbreviated-flag", "error", "--t")]
    assert "--tp-size, --trust-remote-code" in findings[0]["message"] and "refuses to start" in findings[0]["message"]


def test_every_problem_of_a_command_is_named_in_one_run():
    rules, findings, namespace = _check(
        "--model-path m stray --attention-backend flashinfr --tp-size x --tp-sise 4 --cuda-graph-bs 1 2"
    )
    assert rules == [
        ("engine-bad-choice", "error", "--attention-backend"),
        ("engine-bad-value", "error", "--tp-size"),
        ("engine-bad-value", "error", "stray"),
        ("engine-unknown-flag", "error", "--tp-sise"),
    ]
    assert findings[0]["fix"].startswith("did you mean flashinfer? valid choices: flashinfer, triton, fa3")
    assert "expects" not in findings[1]["fix"] and findings[3]["fix"].startswith("did you mean --tp-size?")
    assert namespace.cuda_graph_bs == [1, 2]  # what is left parses


def test_a_missing_required_flag_names_it():
    rules, findings, namespace = _check("--tp-size 2")
    assert rules == [("engine-missing-required", "error", "--model-path")] and namespace is None
    assert findings[0]["fix"] == "add --model-path"


def test_a_deprecated_spelling_is_said_once_the_command_parses():
    rules, findings, _ = _check("--model-path m --enable-dp-attention")
    assert rules == [("engine-deprecated-flag", "warning", "--enable-dp-attention")]
    assert "--attn-dp-size" in findings[0]["message"]


def test_a_post_init_failure_for_want_of_hardware_is_no_verdict():
    class ServerArgs:
        pass

    status, finding = probe._post_init_failure(RuntimeError("no CUDA device"), ServerArgs, "server")
    assert status == "skipped" and finding["severity"] == "info"
    status, finding = probe._post_init_failure(ValueError("tp_size must divide 7"), ServerArgs, "server")
    assert (
        status == "failed" and finding["rule"] == "engine-bad-value" and "tp_size must divide 7" in finding["message"]
    )
    status, _ = probe._post_init_failure(RuntimeError("no CUDA device"), ServerArgs, "router")
    assert status == "failed"  # the router's post-init needs no device: any failure is the command's
