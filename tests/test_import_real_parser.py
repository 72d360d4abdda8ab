"""Import chooses its engine with SGLang's real parsers (cached venvs), and says so; wrapped commands reach the
parsers as the launch they are. Reuses the suite's parser versions (0.5.9, 0.5.23)."""

from __future__ import annotations

import shlex

import pytest

from ironserve import engine_parser
from ironserve.cli import main
from ironserve.commandline import parse_command
from ironserve.findings import Severity
from ironserve.importer import import_commands

from .ci import need_parser_prerequisites

pytestmark = pytest.mark.parser

# seed-era spelling: 0.5.9 takes --cuda-graph-max-bs, 0.5.23 made it an ambiguous prefix
OLD_SPELLING = (
    "nohup numactl --cpunodebind=0 python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B "
    "--tp-size 2 --cuda-graph-max-bs 8 > log 2>&1 &"
)


@pytest.fixture
def two_cached(monkeypatch):
    need_parser_prerequisites()
    for version in ("0.5.9", "0.5.23"):
        engine_parser.parser_env(version)  # built once, shared with the rest of the suite
    monkeypatch.setattr(engine_parser, "cached_versions", lambda: ["0.5.23", "0.5.9"])


def test_engine_is_the_newest_cached_parser_that_accepts_the_command(two_cached):
    result = import_commands([parse_command(shlex.split(OLD_SPELLING))], "cpu-lab", "q", detect=True)
    assert result.data["engine"]["sglang"] == "0.5.9"
    assert result.data["runtime"]["packages"] == ["sglang==0.5.9"]
    (note,) = [f for f in result.findings if f.rule == "import-engine"]
    assert "0.5.9" in note.message and "newest cached SGLang parser that accepts" in note.message
    current = OLD_SPELLING.replace("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")
    result = import_commands([parse_command(shlex.split(current))], "cpu-lab", "q", detect=True)
    assert result.data["engine"]["sglang"] == "0.5.23"


def test_flags_older_than_every_cached_parser_choose_their_release(two_cached):
    """--enable-deepep-moe is gone from 0.5.3: no cached parser is tried, the release the flag belongs to is chosen
    and the reason names the flag and the cached parsers."""
    result = import_commands(
        [
            parse_command(
                shlex.split(
                    "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp-size 2 --enable-deepep-moe"
                )
            )
        ],
        "cpu-lab",
        "q",
        detect=True,
    )
    assert result.data["engine"]["sglang"] == "0.5.2"
    (note,) = [f for f in result.findings if f.rule == "import-engine"]
    assert "--enable-deepep-moe is in SGLang up to 0.5.2" in note.message
    assert "no cached parser of those releases (0.5.23, 0.5.9 cached)" in note.message


def test_wrapped_and_router_launches_reach_the_real_parsers():
    argvs = [
        shlex.split(OLD_SPELLING),
        shlex.split(
            "python -m sglang_router.launch_server --model-path m --dp 2 --tp-size 1 --router-policy round_robin"
        ),
        shlex.split(
            "nohup python -u -m sglang_router.launch_router --pd-disaggregation --prefill "
            "http://10.0.0.1:8000 8995 --decode http://10.0.0.2:8000 > log 2>&1 &"
        ),
    ]
    results = engine_parser.check_many("0.5.9", argvs)
    for found in results:
        assert not [f for f in found if f.rule == "engine-unknown-launcher"], [f.line() for f in found]
    assert not [f for f in results[0] + results[2] if f.severity is Severity.error]
    # sglang_router.launch_server: engine flags by the sglang parser, --router-X by sglang-router's as --X
    assert not [f for f in results[1] if f.severity is Severity.error], [f.line() for f in results[1]]


def test_router_prefixed_flags_are_checked_by_the_router_parser():
    argv = shlex.split(
        "python -m sglang_router.launch_server --model-path m --dp-size 2 --router-policy "
        "round_robin --router-polcy cache_aware"
    )
    (found,) = engine_parser.check_many("0.5.9", [argv])
    errors = [f for f in found if f.severity is Severity.error]
    assert errors and all("--router-polcy" in f.message + f.where for f in errors), [f.line() for f in found]
    assert not [f for f in found if "--router-policy " in f.message]


def test_imported_recipe_is_checked_by_the_real_parser(tmp_path, capsys):
    """An imported recipe carries a parser version, so `ironserve lint` runs the real parser on it."""
    import json

    out = tmp_path / "q.yaml"
    typo = OLD_SPELLING.replace("--tp-size 2", "--tp-size 2 --mem-fraction-statik 0.8")
    assert (
        main(
            [
                "import",
                "--hardware",
                "cpu-lab",
                "--id",
                "q",
                "--engine",
                "sglang==0.5.9",
                "-o",
                str(out),
                "--",
                *shlex.split(typo),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["lint", str(out), "--format", "json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    (hit,) = [f for f in findings if f["rule"] == "engine-unknown-flag"]
    assert "--mem-fraction-statik" in hit["message"] and "--mem-fraction-static" in hit["fix"]


def test_pasted_command_without_engine_is_still_parsed(capsys):
    """No --engine: the hardware's seed-era release parses it (warnings), the check is never silently skipped."""
    import json

    rc = main(
        [
            "lint",
            "--hardware",
            "rtx6000-pro",
            "--format",
            "json",
            "--",
            *shlex.split(
                "nohup python3 -m sglang.launch_server --model-path /m --tp-size 2 --host 127.0.0.1 --mem-fraction-statik 0.8 "
                "> log 2>&1 &"
            ),
        ]
    )
    findings = json.loads(capsys.readouterr().out)["findings"]
    (hit,) = [f for f in findings if f["rule"] == "engine-unknown-flag"]
    assert rc == 0 and hit["severity"] == "warning" and "parser of sglang 0.5.9" in hit["message"]


def test_corpus_renders_to_argv_the_real_parser_judges_like_the_original(tmp_path):
    """Every engine and router argv rendered from the corpus' recipes gets no error from SGLang's (and
    sglang-router's) real parser that the pasted original did not get: import loses or breaks no flag."""
    import yaml

    from ironserve import catalogue
    from ironserve.commandline import parse_script
    from ironserve.importer import import_script
    from ironserve.render import render

    from .test_import_corpus import ROUND_TRIP, _hosts

    originals, rendered = [], []
    for entry in ROUND_TRIP:
        result = import_script(entry["text"], entry["hardware"], f"w-{entry['id']}")
        path = tmp_path / f"w-{entry['id']}.yaml"
        path.write_text(yaml.safe_dump(result.data, sort_keys=False))
        recipe = catalogue.load_recipe_file(path)
        originals.append([c.argv for c, _ in parse_script(entry["text"]).commands])
        rendered.append([p.argv for p in render(recipe, _hosts(result, recipe)).processes])
    flat = [a for group in originals + rendered for a in group]
    found = iter(engine_parser.check_many("0.5.9", flat))
    before = [[next(found) for _ in group] for group in originals]
    after = [[next(found) for _ in group] for group in rendered]

    def errors(results):
        return {(f.rule, f.where) for res in results for f in res if f.severity is Severity.error}

    for entry, old, new in zip(ROUND_TRIP, before, after):
        assert errors(new) <= errors(old), (entry["id"], errors(new) - errors(old))
