"""Every recipe renders, for each of its processes, the same flags and env as its seed command.

Flags are compared by full name (the seeds' short spellings are canonicalised) and as multisets of values.
Seed values that depend on the host (``${P_IP[$i]}``, ``<network-interface>``, ``$MODEL_PATH``) must be
present in the render with the value the renderer derives; flags the seed leaves out but a node needs
(``--dist-init-addr``/``--node-rank`` in PD-mixed) may be added by the renderer, nothing else may.
"""

from __future__ import annotations

import pytest

from ironserve import catalogue
from ironserve.flags import canonical, launcher_split, split_flags
from ironserve.render import render
from ironserve.spec import UvRuntime

from .seedtext import extract

# Flags the renderer adds because a node cannot start without them, though a seed omits them.
# (--enable-metrics: ironserve's default, server.enable_metrics; the router's Prometheus endpoint is bound like
# the router itself)
RENDERER_ADDED = {
    "--dist-init-addr",
    "--node-rank",
    "--nnodes",
    "--model-path",
    "--enable-metrics",
    "--prometheus-host",
    "--prometheus-port",
}
# Flags ironserve takes out of argv on purpose (secrets go through the env file).
NEVER_IN_ARGV = {"--api-key"}
# Values the renderer derives from the placement: a seed names its own hosts and shows one rank's command
# (seed 002: "--dist-init-addr sgl-dev-0:50000 ... --node-rank 0"). Only the dist-init port is the recipe's.
PLACEMENT_DERIVED = {"--dist-init-addr", "--node-rank"}


def _host_dependent(value: str) -> bool:
    return any(ch in value for ch in "$<`")


def flag_map(argv: list[str]) -> dict[str, list[str]]:
    _, flags = launcher_split(argv)
    out: dict[str, list[str]] = {}
    for name, values in split_flags(flags):
        out[canonical(name)] = values
    return out


def _norm_json(values: list[str]) -> list[str]:
    import json

    out = []
    for v in values:
        try:
            parsed = json.loads(v)
            out.append(json.dumps(parsed, sort_keys=True) if isinstance(parsed, (dict, list)) else v)
        except ValueError:
            out.append(v)
    return out


def assert_same_command(
    seed_argv: list[str], rendered_argv: list[str], where: str, deviating: frozenset[str] = frozenset()
) -> None:
    seed, ours = flag_map(seed_argv), flag_map(rendered_argv)
    for flag in deviating:
        seed.pop(flag, None)
        ours.pop(flag, None)
    missing = [f for f in seed if f not in ours and f not in NEVER_IN_ARGV]
    added = [f for f in ours if f not in seed and f not in RENDERER_ADDED and not f.startswith("--disaggregation-")]
    assert not missing, f"{where}: seed flags missing from render: {missing}"
    assert not added, f"{where}: render adds flags the seed does not have: {added}"
    for flag, values in seed.items():
        if flag not in ours or any(_host_dependent(v) for v in values):
            continue
        if flag in PLACEMENT_DERIVED:
            if flag == "--dist-init-addr":
                port = lambda vs: [v.rsplit(":", 1)[-1] for v in vs]  # noqa: E731
                assert port(ours[flag]) == port(values), f"{where}: {flag} port seed={values} render={ours[flag]}"
            continue
        assert _norm_json(ours[flag]) == _norm_json(values), f"{where}: {flag} seed={values} render={ours[flag]}"


def assert_same_env(
    seed_env: dict[str, str], rendered_env: dict[str, str], where: str, deviating: frozenset[str] = frozenset()
) -> None:
    seed_env = {k: v for k, v in seed_env.items() if k not in deviating}
    rendered_env = {k: v for k, v in rendered_env.items() if k not in deviating}
    assert set(rendered_env) == set(seed_env), (
        f"{where}: env differs: only in seed {sorted(set(seed_env) - set(rendered_env))}, "
        f"only in render {sorted(set(rendered_env) - set(seed_env))}"
    )
    for key, value in seed_env.items():
        if not _host_dependent(value):
            assert rendered_env[key] == value, f"{where}: env {key} seed={value!r} render={rendered_env[key]!r}"


RECIPES = sorted(catalogue.catalogue())
SEEDED = [r for r in RECIPES if catalogue.get_recipe(r).source.seed != "local"]


@pytest.mark.parametrize("recipe_id", SEEDED)
def test_recipe_matches_seed(recipe_id):
    recipe = catalogue.get_recipe(recipe_id)
    section = extract(recipe.source.seed, recipe.source.section)
    rendered = render(recipe)
    dev_flags = frozenset(d.flag for d in recipe.source.deviations if d.flag)
    dev_env = frozenset(d.env for d in recipe.source.deviations if d.env)
    for kind in ("server", "prefill", "decode", "router"):
        seeds = section.of(kind)
        ours = [p for p in rendered.processes if p.role == kind]
        if not seeds:
            assert not ours or recipe.source.seed.startswith("001"), f"{recipe_id}: render has {kind}, seed has none"
            continue
        assert ours, f"{recipe_id}: seed has a {kind} command, render has none"
        # One seed command stands for every rank of its group (the seeds loop over node IPs).
        for proc in ours:
            where = f"{recipe_id} {kind} {proc.host}"
            assert_same_command(seeds[0].argv, proc.argv, where, dev_flags)
            if kind != "router":
                assert_same_env(seeds[0].env, proc.env, where, dev_env)
    if section.unset:
        assert set(recipe.env_unset) == set(section.unset)
    if section.sourced:
        sourced = section.sourced
        if isinstance(recipe.runtime, UvRuntime):
            # ironserve runs the engine from the recipe's own venv: that is the seed's 'source .venv/bin/activate'
            sourced = [s for s in sourced if not s.endswith("bin/activate")]
        assert list(recipe.runtime.source_env) == sourced
