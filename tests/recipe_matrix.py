"""The recipe matrix: every seed recipe of the catalogue, on lab hosts of its first hardware profile, exactly as many
as it places. Read by the lab test (tests/e2e/test_recipe_matrix_lab.py) and by the offline check of docs/lab.md's
recipe table (tests/test_recipe_matrix.py), so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from ironserve import catalogue
from ironserve.render import render

# model family -> the deploy that serves it
DEPLOYS = {
    "glm5": "deploys/glm5.py",
    "glm5.1": "deploys/glm51.py",
    "kimi-k2.5": "deploys/kimi_k25.py",
    "qwen3.5": "deploys/qwen35.py",
    "minimax-m2.5": "deploys/minimax_m2.py",
    "llama3": "deploys/llama3.py",
}

# Seed recipes the lab cannot deploy yet, and why (docs/lab.md's recipe table says so too). Each entry is a gap of
# the lab's supply, not of the recipe: removing it puts the recipe into the matrix. None now.
NOT_IN_LAB: dict[str, str] = {}

# Seed recipes another lab module deploys (with more checks than the matrix makes): counted by the matrix from there
ELSEWHERE = {
    "glm5-nvfp4-gb200-disagg": "tests/e2e/test_deploy_glm5_gb200_lab.py",
    "glm5-nvfp4-mtp-rtx6000-tp8": "tests/e2e/test_deploy_glm5_lab.py",
    # planned without a lock there, then deployed hash-checked from one and converging
    "glm5.1-w4a8-a3-pd-mixed-16": "tests/e2e/test_uv_lock_lab.py",
}


@dataclass(frozen=True)
class Entry:
    recipe: str
    hardware: str
    hosts: int
    deploy: str
    runtime: str
    supply: tuple = ()  # what the hardware profile installs: vendor, arch, CPU arch, driver branch, toolkit

    @property
    def shape(self) -> tuple[str, int]:
        return self.hardware, self.hosts

    @property
    def kind(self) -> tuple:
        """What a deploy exercises on the hosts: the hardware's supply (drivers, toolkit, Ascend packages; an RTX PRO
        6000 and its Max-Q take the same) and the runtime kind (image or venv). Recipes of one kind differ in flags,
        env, tuning values, host count and deploy entry point, which the offline render, lint and fixture tests
        check flag for flag; the lab deploys one of each kind and plans the others with `--dry` (deployed_here)."""
        return self.supply, self.runtime


def seed_recipes() -> list[str]:
    """Every catalogue recipe that reproduces a seed (the tiny CPU ones are the lab's own)."""
    return sorted(rid for rid, r in catalogue.catalogue().items() if "cpu-lab" not in r.hardware)


def entry(recipe_id: str) -> Entry:
    recipe = catalogue.get_recipe(recipe_id)
    hosts = len({p.host for p in render(recipe).processes})
    profile = catalogue.hardware_profiles()[recipe.hardware[0]]
    supply = (
        profile.accelerator.vendor,
        profile.accelerator.arch,
        profile.cpu_arch,
        profile.driver_branch,
        str(profile.toolkit),
    )
    return Entry(recipe_id, recipe.hardware[0], hosts, DEPLOYS[recipe.model.family], recipe.runtime.kind, supply)


def matrix() -> list[Entry]:
    """The recipes the lab deploys, grouped by shape (hardware, hosts) so each shape's hosts boot once."""
    entries = [entry(r) for r in seed_recipes() if r not in NOT_IN_LAB]
    return sorted(entries, key=lambda e: (e.shape, e.recipe))


def deployed_here(entries: list[Entry], full: bool) -> set[str]:
    """The recipes of ``entries`` (the matrix) the matrix test deploys itself, never one of ELSEWHERE: all with ``full``
    (IRONSERVE_MATRIX=full), else for each kind that no ELSEWHERE recipe covers the recipe with the fewest hosts (CI's
    time: a group across hosts is the rank-group module's, on real engines; the others are planned with `--dry`)."""
    own = [e for e in entries if e.recipe not in ELSEWHERE]
    if full:
        return {e.recipe for e in own}
    covered = {e.kind for e in entries if e.recipe in ELSEWHERE}
    chosen: dict[tuple, Entry] = {}
    for e in own:
        if e.kind not in covered and (e.kind not in chosen or e.hosts < chosen[e.kind].hosts):
            chosen[e.kind] = e
    return {e.recipe for e in chosen.values()}
