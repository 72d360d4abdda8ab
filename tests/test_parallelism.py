"""One devices-per-node rule (spec.Parallelism) and one flag/field table (spec.SERVER_FLAGS, SPECULATIVE_FLAGS),
read by render, the catalogue's checks, lint and import alike.

SGLang's DP controller gives each of --dp-size replicas its own TP x PP devices; with --enable-dp-attention the DP
ranks split attention inside one TP group and share its devices (seed 004: --tp-size 32 --dp-size 16
--enable-dp-attention over 2 Atlas nodes of 16 dies). sglang_router.launch_server starts --dp-size separate servers
whatever the attention mode.
"""

from __future__ import annotations

import shlex

import pytest

from ironserve import catalogue
from ironserve.importer import import_command
from ironserve.lint import lint_pasted
from ironserve.render import render, server_flags
from ironserve.spec import SERVER_FLAGS, SPECULATIVE_FLAGS, Parallelism, Recipe, ServerOptions, Speculative

H100 = "h100-sxm"  # 8 GPUs per node


def _pasted(flags: str) -> list[str]:
    return shlex.split(f"python3 -m sglang.launch_server --model-path /models/m {flags}")


@pytest.mark.parametrize(
    "sizes, nodes, devices",
    [
        (Parallelism(tp_size=32, dp_size=16, dp_attention=True), 2, 16),  # seed 004: the 16 dies of each node
        (Parallelism(tp_size=8, dp_size=8, dp_attention=True), 1, 8),
        (Parallelism(tp_size=4, dp_size=2), 1, 8),  # no DP attention: two TP groups of 4
        (Parallelism(tp_size=2, pp_size=2, dp_size=2), 2, 4),
        (Parallelism(tp_size=4, dp_size=2, dp_attention=True, launcher="router_launch_server"), 1, 8),
        (Parallelism(tp_size=4, dp_size=2, launcher="router_launch_server"), 1, 8),
        (Parallelism(tp_size=16), 3, 6),  # rounded up: a node drives whole devices
    ],
)
def test_devices_per_node(sizes, nodes, devices):
    assert sizes.devices_per_node(nodes) == devices


def test_render_and_lint_apply_the_same_rule_without_dp_attention():
    """--tp-size 8 --dp-size 2 needs 16 GPUs: render says 16, lint refuses it on an 8-GPU node (it used to
    count DP only for the router's launcher)."""
    words = _pasted("--tp-size 8 --dp-size 2")
    found = [f for f in lint_pasted(words, catalogue.hardware_profiles()[H100]) if f.rule == "tp-exceeds-devices"]
    assert len(found) == 1 and "needs 16 devices per node" in found[0].message and "--dp-size 2" in found[0].message
    small = _pasted("--tp-size 4 --dp-size 2")
    assert not [f for f in lint_pasted(small, catalogue.hardware_profiles()[H100]) if f.rule == "tp-exceeds-devices"]
    recipe = Recipe.model_validate(import_command(small, H100, "dp-replicas", engine="0.5.23"))
    assert [p.devices for p in render(recipe).processes] == [8]


def test_render_and_lint_apply_the_same_rule_with_dp_attention():
    words = _pasted("--tp-size 8 --dp-size 8 --enable-dp-attention")
    assert not [f for f in lint_pasted(words, catalogue.hardware_profiles()[H100]) if f.rule == "tp-exceeds-devices"]
    recipe = Recipe.model_validate(import_command(words, H100, "dp-attention", engine="0.5.23"))
    assert [p.devices for p in render(recipe).processes] == [8]
    catalogue.check_recipe(recipe, catalogue.hardware_profiles(), "dp-attention.yaml")


def test_the_catalogue_refuses_what_lint_refuses():
    recipe = Recipe.model_validate(import_command(_pasted("--tp-size 4 --dp-size 2"), H100, "dp", engine="0.5.23"))
    too_many = recipe.model_copy(update={"server": recipe.server.model_copy(update={"dp_size": 4})})
    with pytest.raises(catalogue.SpecError) as err:
        catalogue.check_recipe(too_many, catalogue.hardware_profiles(), "dp.yaml")
    (problem,) = err.value.problems
    assert "x dp_size 4" in problem.message and "needs 16 devices per node" in problem.message
    assert "lower tp_size to at most 2" in problem.fix


def test_one_table_renders_and_imports_every_typed_flag():
    """Each typed field renders to its flag, and that flag imports back into the same field."""
    server = ServerOptions(
        tp_size=4,
        dp_size=2,
        enable_dp_attention=True,
        mem_fraction_static=0.8,
        cuda_graph_bs=[1, 2, 4],
        model_loader_extra_config={"num_threads": 8},
        speculative=Speculative(
            algorithm="EAGLE",
            num_steps=3,
            eagle_topk=1,
            num_draft_tokens=4,
            draft_model_path="/models/draft",
            draft_model_quantization="unquant",
        ),
    )
    argv = server_flags(server)
    assert set(SPECULATIVE_FLAGS.values()) <= set(argv)
    assert [a for a in argv if a.startswith("--")] == [
        *(SERVER_FLAGS[n] for n in ("tp_size", "dp_size", "enable_dp_attention", "mem_fraction_static")),
        *(SERVER_FLAGS[n] for n in ("cuda_graph_bs", "model_loader_extra_config", "enable_metrics")),
        *SPECULATIVE_FLAGS.values(),
    ]
    data = import_command(["python3", "-m", "sglang.launch_server", "--model-path", "/m", *argv], H100, "t")
    back = Recipe.model_validate(data).server
    assert back.model_dump(exclude={"model_path"}) == server.model_dump(exclude={"model_path"})
