"""The command line stays light: importing it, building its parser and `--help` import none of pydantic, pyinfra,
jinja2 or yaml; `render --list` answers from the validated catalogue's index while the catalogue's files are
unchanged, and validates again (refusing a broken recipe, exit 2) as soon as one changes. (The CPU figures are
benchmarks/cli_time.py's, never timed here.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ironserve import catalogue, catalogue_index
from ironserve.cli import _subcommand, main

HEAVY = ("pydantic", "pyinfra", "jinja2", "yaml")
# runs the command line in a fresh interpreter, then says which of the modules named in IRONSERVE_PROBE (default
# HEAVY) it imported (on stderr, last line); IRONSERVE_PROBE_ABSENT names a package to hide (as if not installed)
PROBE = f"""
import json, os, sys
for name in filter(None, os.environ.get("IRONSERVE_PROBE_ABSENT", "").split(",")):
    sys.modules[name] = None
from ironserve import cli
cli.build_parser()
try:
    code = cli.main(sys.argv[1:])
except SystemExit as done:
    code = done.code
names = os.environ.get("IRONSERVE_PROBE", ",".join({HEAVY!r})).split(",")
print(json.dumps([m for m in names if m in sys.modules]), file=sys.stderr)
sys.exit(code)
"""


def _probe(*argv: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    return proc, json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """A copy of the catalogue (IRONSERVE_CATALOGUE) and an empty cache (IRONSERVE_CACHE), for this test only."""
    shutil.copytree(catalogue.recipes_dir(), tmp_path / "recipes")
    env = {"IRONSERVE_CATALOGUE": str(tmp_path / "recipes"), "IRONSERVE_CACHE": str(tmp_path / "cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("IRONSERVE_RECIPES", raising=False)
    monkeypatch.chdir(tmp_path)
    yield env
    catalogue.use_recipe_dirs([])


@pytest.mark.parametrize("argv", [["--help"], ["render", "--help"], ["--version"], ["--recipes", ".", "lint", "-h"]])
def test_the_parser_and_help_import_nothing_heavy(argv):
    proc, heavy = _probe(*argv)
    assert proc.returncode == 0 and proc.stdout.startswith(("usage: ironserve", "ironserve ")), proc.stderr
    assert heavy == [], f"{argv} imported {heavy}"


@pytest.mark.parametrize("argv", [["--help"], ["render", "--help"]])
def test_help_imports_nothing_of_the_lab_nor_package_metadata(argv):
    proc, imported = _probe(*argv, env={"IRONSERVE_PROBE": "ironserve_lab,importlib.metadata"})
    assert proc.returncode == 0 and imported == [], f"{argv} imported {imported}"


def test_the_lab_is_offered_where_installed_and_explained_where_not():
    """A checkout's environment has the lab's package (ironserve_lab); an installed ironserve has not: there
    `ironserve lab ...` says where the lab runs, exit 2, whatever follows it."""
    listed, _ = _probe("--help")
    assert "local multi-host lab" in listed.stdout
    for argv in (["lab", "up", "--nodes", "2", "--hardware", "cpu-lab"], ["lab", "--help"], ["lab"]):
        proc, _ = _probe(*argv, env={"IRONSERVE_PROBE_ABSENT": "ironserve_lab"})
        assert proc.returncode == 2 and "the lab runs from a checkout" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "lab/ in the repository" in proc.stderr
    hidden, _ = _probe("--help", env={"IRONSERVE_PROBE_ABSENT": "ironserve_lab"})
    assert hidden.returncode == 0 and "local multi-host lab" not in hidden.stdout


def test_help_lists_the_optional_commands_and_each_still_parses(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out
    assert "drift: compare hosts" in listing and "unit state per host" in listing
    for command in ("audit", "status"):  # their real parser, imported because it is the command that runs
        with pytest.raises(SystemExit) as done:
            main(["--recipes", ".", command, "--help"])
        assert done.value.code == 0 and "inventory" in capsys.readouterr().out


def test_the_subcommand_word_skips_options_and_the_recipes_value():
    assert _subcommand(["--recipes", "audit", "status", "x"]) == "status"
    assert _subcommand(["--recipes=site", "audit", "inv"]) == "audit"
    assert _subcommand(["--help"]) is None


def test_list_is_remembered_and_then_read_without_the_models(copy):
    first, heavy = _probe("render", "--list", env=copy)
    assert first.returncode == 0 and "tiny-cpu " in first.stdout and "pydantic" in heavy  # validated
    again, heavy = _probe("render", "--list", env=copy)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert heavy == [], heavy


def test_a_recipe_broken_after_listing_is_still_refused(copy, tmp_path):
    assert _probe("render", "--list", env=copy)[0].returncode == 0
    recipe = tmp_path / "recipes" / "tiny-cpu.yaml"
    recipe.write_text(recipe.read_text() + "\nno_such_key: 1\n")
    broken, _ = _probe("render", "--list", env=copy)
    assert broken.returncode == 2 and "tiny-cpu.yaml: no_such_key: unknown key" in broken.stderr, broken.stderr
    assert "Traceback" not in broken.stderr
    # a lock file beside a recipe is read by validation too: a change to it is a change of the catalogue
    before = catalogue_index.fingerprint(catalogue.recipe_dirs())
    (tmp_path / "recipes" / "tiny-cpu.lock.json").write_text("{}")
    assert catalogue_index.fingerprint(catalogue.recipe_dirs()) != before


def test_a_site_directory_changes_the_listing(copy, tmp_path, capsys):
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(tmp_path / "recipes" / "tiny-cpu.yaml", site / "tiny-cpu-mine.yaml")
    text = (site / "tiny-cpu-mine.yaml").read_text().replace("id: tiny-cpu\n", "id: tiny-cpu-mine\n")
    (site / "tiny-cpu-mine.yaml").write_text(text)
    catalogue._catalogue_cached.cache_clear()
    assert main(["render", "--list"]) == 0
    assert "tiny-cpu-mine" not in capsys.readouterr().out
    assert main(["--recipes", str(site), "render", "--list"]) == 0
    assert "tiny-cpu-mine" in capsys.readouterr().out


def test_only_a_catalogue_validated_just_now_is_remembered(copy, tmp_path):
    """One built earlier in this process (catalogue's lru cache) may predate edits: listed, never remembered."""
    cache = tmp_path / "cache" / "catalogue-index"
    catalogue._catalogue_cached.cache_clear()
    catalogue.catalogue()
    rows = catalogue_index.listing()
    assert not cache.exists() or not list(cache.glob("*.json"))
    catalogue._catalogue_cached.cache_clear()
    assert catalogue_index.listing() == rows and len(list(cache.glob("*.json"))) == 1


def test_an_unwritable_cache_is_skipped(copy, tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the cache directory would be")
    catalogue._catalogue_cached.cache_clear()
    assert [row[0] for row in catalogue_index.listing()] == sorted(catalogue.catalogue())
