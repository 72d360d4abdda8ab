"""The recipe matrix (tests/recipe_matrix.py) covers every seed recipe, and docs/lab.md's recipe table says which were
deployed in the lab (tests/e2e/test_recipe_matrix_lab.py deploys them)."""

from __future__ import annotations

import re
from pathlib import Path

from ironserve import catalogue

from .recipe_matrix import ELSEWHERE, NOT_IN_LAB, deployed_here, entry, matrix, seed_recipes

README = Path(__file__).resolve().parents[1] / "docs" / "lab.md"  # the recipe table (moved from the README)


def test_every_seed_recipe_is_in_the_matrix_or_says_why_not():
    recipes = seed_recipes()
    assert len(recipes) == 21
    assert set(NOT_IN_LAB) <= set(recipes)
    assert {e.recipe for e in matrix()} | set(NOT_IN_LAB) == set(recipes)


def test_shapes_place_exactly_the_recipes_hosts():
    assert entry("glm5-nvfp4-gb200-disagg").shape == ("gb200", 5)
    assert entry("glm5.1-w4a8-a3-4p1d-48-64k-prefix90").shape == ("atlas-800i-a3", 6)
    assert entry("qwen3.5-nvfp4-rtx6000-tp8-mtp").shape == ("rtx6000-pro-maxq", 1)
    assert entry("llama3-8b-multinode-tp4").shape == ("rtx6000-pro", 2)


def test_readme_recipe_table_says_which_were_deployed_in_the_lab():
    rows = {}
    for line in README.read_text().splitlines():
        m = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if m and m.group(1) in catalogue.catalogue():
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    assert set(rows) == set(seed_recipes()), "docs/lab.md's recipe table lists every seed recipe"
    deployed = len(seed_recipes()) - len(NOT_IN_LAB)
    assert f"{deployed} of {len(seed_recipes())} deployed in the lab" in README.read_text()
    for recipe, cells in rows.items():
        e = entry(recipe)
        assert cells[0] == f"{e.hardware} x{e.hosts}", recipe
        assert cells[-1].startswith("no" if recipe in NOT_IN_LAB else "yes"), (recipe, cells[-1])


def test_a_max_q_takes_the_supply_of_its_card():
    assert entry("qwen3.5-nvfp4-rtx6000-tp8-mtp").kind == entry("qwen3.5-nvfp4-rtx6000-tp4").kind
    assert entry("glm5-nvfp4-gb200-disagg").kind != entry("glm5-nvfp4-rtx6000-tp8").kind


def test_ci_deploys_one_recipe_of_each_kind_no_other_module_deploys():
    entries = matrix()
    deployed = deployed_here(entries, full=False)
    assert deployed == {"minimax-m2.5-nvfp4-rtx6000-tp2"}  # the one kind (sm120 supply, uv) no other module deploys
    kinds = {e.kind for e in entries if e.recipe in deployed or e.recipe in ELSEWHERE}
    assert {e.kind for e in entries} == kinds  # every kind is deployed by some lab module
    assert deployed_here(entries, full=True) == {e.recipe for e in entries if e.recipe not in ELSEWHERE}
