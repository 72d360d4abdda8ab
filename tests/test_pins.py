"""Lint resolves each uv runtime's pins with uv (ironserve/pins.py), offline here: against a local index of
stand-in wheels that carry the published metadata of the packages involved (lab/ironserve_lab/wheels.py).

Issue 19's first failure: the Atlas recipes pinned sglang==0.5.23 with torch==2.8.0, which never resolves
(sglang 0.5.23 requires torch==2.14.1); the deploy found out on the hosts. Now lint says so first, and the
recipes' NPU-path pins (overrides, excludes) resolve.
"""

from __future__ import annotations

import re

import pytest
from ironserve_lab import supply
from ironserve_lab.wheels import build_wheel

from ironserve import catalogue
from ironserve.findings import Severity
from ironserve.pins import resolve_findings, uv_binary

pytestmark = pytest.mark.skipif(not uv_binary(), reason="uv is not installed (scripts/env.sh installs it)")

# name, version, Requires-Dist as PyPI publishes them (trimmed to what decides these resolutions)
METADATA = [
    ("sglang", "0.5.23", ["torch==2.14.1", "sglang-kernel==0.5.0", "flashinfer-python==0.7.1", "torchvision"]),
    (
        "sglang",
        "0.5.10.post1",
        ["torch==2.9.1", "sglang-kernel==0.4.1", "flashinfer-python==0.6.7.post3", "torchvision", "torchaudio==2.9.1"],
    ),
    ("sglang-router", "0.3.2", []),
    ("torch", "2.8.0", []),
    ("torch", "2.9.1", []),
    ("torch", "2.14.1", []),
    ("torch-npu", "2.8.0", []),
    ("torch-npu", "2.8.0.post2", []),
    ("torchvision", "0.23.0", ["torch==2.8.0"]),
    ("torchvision", "0.24.1", ["torch==2.9.1"]),
    ("triton-ascend", "3.2.0", []),
    ("memfabric-hybrid", "1.1.4", []),
]
OLD_ATLAS_PINS = ["sglang==0.5.23", "sglang-router==0.3.2", "torch==2.8.0", "torch-npu==2.8.0"]
ATLAS = sorted(r for r in catalogue.catalogue() if r.startswith("glm5.1-"))


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("index")
    wheels = supply.ensure_dirs(root) / "wheels"
    for name, version, requires in METADATA:
        build_wheel(wheels, name, version, requires)
    supply.reindex_wheels(root)
    return f"file://{supply.supply_dir(root)}/simple"


def on(recipe_id: str, index_url: str, **runtime):
    recipe = catalogue.get_recipe(recipe_id)
    update = {"index_url": index_url, "extra_index_urls": [], **runtime}
    return recipe.model_copy(update={"runtime": recipe.runtime.model_copy(update=update)})


def test_old_atlas_pins_are_an_error_naming_the_conflict(index):
    recipe = on(ATLAS[0], index, packages=OLD_ATLAS_PINS, overrides=[], excludes=[])
    findings = resolve_findings(recipe, catalogue.hardware_profiles())
    assert [f.rule for f in findings] == ["uv-pins-unresolvable"]
    assert findings[0].severity is Severity.error
    assert "torch==2.14.1" in findings[0].message and "torch==2.8.0" in findings[0].message
    assert "aarch64" in findings[0].message  # the profile's platform, not this machine's


@pytest.mark.parametrize("recipe_id", ATLAS)
def test_atlas_npu_path_pins_resolve(index, recipe_id):
    assert resolve_findings(on(recipe_id, index), catalogue.hardware_profiles()) == []


def test_without_the_npu_overrides_the_cuda_metadata_wins(index):
    # the PyPI wheel's own metadata (torch==2.9.1) contradicts torch-npu's torch 2.8.0: overrides are what resolves
    findings = resolve_findings(on(ATLAS[0], index, overrides=[]), catalogue.hardware_profiles())
    assert [f.rule for f in findings] == ["uv-pins-unresolvable"] and "torch==2.9.1" in findings[0].message


def test_offline_and_unreachable_are_not_resolved_never_errors(index):
    profiles = catalogue.hardware_profiles()
    offline = resolve_findings(on(ATLAS[0], index), profiles, offline=True)
    unreachable = resolve_findings(on(ATLAS[0], "http://127.0.0.1:9/simple"), profiles, timeout=120)
    unmapped = resolve_findings(catalogue.get_recipe("minimax-m2.5-nvfp4-rtx6000-tp2"), profiles)
    for findings in (offline, unreachable, unmapped):
        assert [(f.rule, f.severity) for f in findings] == [("uv-pins-not-resolved", Severity.warning)], findings
    assert "index:sglang-cu129" in unmapped[0].message
    assert resolve_findings(catalogue.get_recipe("glm5-nvfp4-gb200-disagg"), profiles) == []  # docker: no pins


@pytest.mark.parametrize(
    "runtime, message",
    [
        ({"overrides": ["torch==2.9.1"]}, "override 'torch==2.9.1' contradicts the pin torch==2.8.0"),
        ({"excludes": ["torch-npu"]}, "exclude 'torch-npu' is also pinned"),
        ({"excludes": ["torch npu"]}, "is not a distribution name"),
    ],
)
def test_contradictions_inside_a_runtime_refused_when_the_recipe_loads(runtime, message):
    from pydantic import ValidationError

    from ironserve.spec import UvRuntime

    base = catalogue.get_recipe(ATLAS[0]).runtime.model_dump()
    with pytest.raises(ValidationError, match=re.escape(message)):
        UvRuntime.model_validate({**base, **runtime})
