"""Benchmark a deployment: sglang.bench_serving with the recipe's seed shape, compared with its expected figures.

    pyinfra inventories/<cluster>.py deploys/bench.py --data model=glm5 [--data recipe=ID]
        [--data bench_num_prompts=N] [--data bench_min_ratio=0.8] [--data bench_report=bench.json]

Provisions nothing: it runs on the deployment's first engine host (roles/bench.py) against the endpoint the
deploy started (the router, or rank 0), prints measured vs expected with a ratio per figure, and fails when a
ratio is below bench_min_ratio (a slow node). The model is the deploy's (glm5, qwen3.5, kimi-k2.5, minimax-m2.5,
glm5.1, llama3, tiny); with --data recipe=ID it may be left out.
"""

from pyinfra import host

from ironserve import catalogue
from ironserve.catalogue import Problem, SpecError
from roles import bench
from roles.context import bad_input_stops_the_deploy, current, host_data

with bad_input_stops_the_deploy():
    _data = host_data(host)
_model = _data.model
if not _model and _data.recipe:
    _model = catalogue.get_recipe(_data.recipe).model.family
if not _model:
    raise SpecError(
        [
            Problem(
                "deploys/bench.py",
                "model",
                "no model to benchmark",
                "pass --data model=NAME (the deploy's model) or --data recipe=ID",
            )
        ]
    )
bench.apply(current(_model))
