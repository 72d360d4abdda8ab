"""`lab up --for`: what a bring-up for some recipes builds and leaves out (needs.py, cluster's choices); no root."""

from __future__ import annotations

import pytest
from ironserve_lab import cluster, cpu_runtime, cuda_runtime, needs, npu_runtime
from ironserve_lab.state import Host, LabState
from ironserve_lab.system import LabError


def built(hardware: str, *names: str) -> tuple[list[str], list[str], bool]:
    """(recipe IDs, runtimes published, runtime image built) of a bring-up for ``names``."""
    wanted = needs.resolve(hardware, list(names))
    return wanted.ids(), [r.name for r in cluster._runtimes(wanted)], wanted.runtime_image()


def test_nothing_named_builds_everything_the_profile_uses():
    wanted = needs.resolve("rtx6000-pro-maxq", [])
    assert wanted.everything and wanted.runtime_image()
    assert cluster._runtimes(wanted) == [cuda_runtime.RUNTIME]
    assert cluster._runtimes(needs.resolve("cpu-lab", [])) == [cpu_runtime.RUNTIME]


def test_a_docker_recipe_needs_its_image_and_not_the_uv_runtimes():
    # the demo's deploy: GLM-5 is a docker recipe, on the parser image (the CPU runtime's pins); the CUDA wheelhouse
    # serves uv recipes
    assert built("rtx6000-pro-maxq", "deploys/glm5.py") == (["glm5-nvfp4-mtp-rtx6000-tp8"], [], True)
    assert built("rtx6000-pro-maxq", "glm5") == built("rtx6000-pro-maxq", "glm5-nvfp4-mtp-rtx6000-tp8")
    # cpu-lab's docker recipe runs the CPU runtime image, whose wheelhouse is published beside it
    assert built("cpu-lab", "tiny-cpu-docker") == (["tiny-cpu-docker"], ["CPU runtime"], True)


def test_a_uv_recipe_needs_its_runtime_and_no_image():
    assert built("cpu-lab", "tiny") == (["tiny-cpu"], ["CPU runtime"], False)
    assert built("rtx6000-pro-maxq", "deploys/minimax_m2.py") == (
        ["minimax-m2.5-nvfp4-rtx6000-tp2"],
        ["CUDA runtimes"],
        False,
    )
    assert built("atlas-800i-a3", "deploys/glm51.py")[1] == [npu_runtime.RUNTIME.name]


def test_only_the_named_recipes_images_are_stand_ins():
    wanted = needs.resolve("rtx6000-pro-maxq", ["glm5"])
    assert wanted.uses(wanted.recipes[0])
    others = [r for r in cluster.images.docker_recipes() if "rtx6000-pro-maxq" in r.hardware and not wanted.uses(r)]
    assert others, "the profile has other docker recipes, which a bring-up for GLM-5 leaves out"


def test_what_it_leaves_out_is_said(capsys):
    cluster._say_needs(needs.resolve("rtx6000-pro-maxq", ["glm5"]))
    said = capsys.readouterr().err
    assert "building for glm5-nvfp4-mtp-rtx6000-tp8 only (--for)" in said
    assert "the CUDA runtimes wheelhouse" in said and "lmsysorg/sglang:dev-cu13" in said
    cluster._say_needs(needs.resolve("rtx6000-pro-maxq", []))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("hardware", "name", "said"),
    [
        ("cpu-lab", "glm5", "no default recipe for hardware 'cpu-lab'"),
        ("gb200", "no-such-model", "no model 'no-such-model'"),
        ("gb200", "deploys/no_such.py", "cannot read the deploy file"),
        ("cpu-lab", "glm5-nvfp4-gb200-disagg", "fix: --hardware gb200"),
        ("gb200", "deploys/undeploy.py", 'no deploy_model("FAMILY") call'),
    ],
)
def test_a_name_that_is_no_recipe_of_the_hardware_is_refused_before_anything_is_built(hardware, name, said):
    with pytest.raises(LabError, match="--for") as caught:
        needs.resolve(hardware, [name])
    assert said in str(caught.value)


def test_the_lab_remembers_what_it_was_brought_up_for():
    glm5 = needs.resolve("rtx6000-pro-maxq", ["glm5"])
    fresh = LabState(hardware="cpu-lab")
    assert cluster._built_for(fresh, glm5) == ["glm5-nvfp4-mtp-rtx6000-tp8"]
    running = LabState(hosts=[Host("lab1", "10.0.0.1", 1, "rtx6000-pro-maxq")], hardware="rtx6000-pro-maxq")
    running.built_for = ["qwen3.5-nvfp4-rtx6000-tp8-mtp"]
    # a later `up --for` of the same lab adds to it (the supply keeps what it holds)
    assert cluster._built_for(running, glm5) == ["qwen3.5-nvfp4-rtx6000-tp8-mtp", "glm5-nvfp4-mtp-rtx6000-tp8"]
    running.built_for = None  # brought up for everything: stays so
    assert cluster._built_for(running, glm5) is None
    assert cluster._built_for(fresh, needs.resolve("cpu-lab", [])) is None
    assert LabState(built_for=["tiny-cpu"]).status()["built_for"] == ["tiny-cpu"]


def test_the_lab_index_wheels_are_fetched_once_per_list_and_the_patches_only_for_their_images(tmp_path, monkeypatch):
    from ironserve_lab import supply

    calls = []
    monkeypatch.setattr(supply, "fetch_wheels", lambda requirements, staging: calls.append(requirements) or [])
    glm5 = needs.resolve("rtx6000-pro-maxq", ["deploys/glm5.py"])
    fetched = cluster._fetch_index_wheels(tmp_path, glm5)
    assert calls == [cluster.DEFAULT_WHEELS, ["transformers==5.2.0"]]  # the roles' own, the patch's pin
    for stamp, text, _ in fetched:  # as _up records them once published
        stamp.write_text(text)
    calls.clear()
    assert cluster._fetch_index_wheels(tmp_path, glm5) == [] and calls == []  # published: nothing fetched again
    assert cluster._fetch_index_wheels(tmp_path / "cpu", needs.resolve("cpu-lab", [])) and calls == [
        cluster.DEFAULT_WHEELS  # a cpu-lab has no stand-in images, so no patches to serve
    ]
