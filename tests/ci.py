"""Skips that would hide a failure in CI: outside CI a missing prerequisite skips with its reason; in CI (CI=true,
which .ci/run sets, where the project's own files set everything up) every skip fails with its reason, so a run
that checked nothing never passes for green. Tests that are not part of a run by design (``cpu_serving`` unless
``-m`` names it) are deselected, never skipped. tests/conftest.py registers the hooks below."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _failed_in_ci(report) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"skipped in CI: {reason} (CI=true: a skip that could hide a failure fails instead)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test's skip (skipif, pytest.skip, a fixture's skip) fails in CI."""
    report = (yield).get_result()
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        _failed_in_ci(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module's skip at import (importorskip, pytest.skip(allow_module_level=True)) fails in CI."""
    report = (yield).get_result()
    if report.skipped and in_ci():
        _failed_in_ci(report)


def pytest_collection_modifyitems(config, items):
    """``cpu_serving`` tests (minutes, a download) run only when ``-m`` names them; otherwise they are deselected
    (counted as such), not skipped."""
    if "cpu_serving" in (config.getoption("markexpr") or "").replace("not cpu_serving", ""):
        return
    dropped = [item for item in items if item.get_closest_marker("cpu_serving")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


def need_parser_prerequisites():
    """What building a cached SGLang parser venv needs (uv, found as the product finds it; the CPU torch wheel):
    the parser tests skip alike without it outside CI (none errors while another skips), and fail in CI."""
    from pathlib import Path

    from ironserve import engine_parser as ep
    from ironserve.resources import uv_binary

    if not uv_binary():
        pytest.skip("uv is needed to build parser venvs")
    wheels = Path(os.environ.get("IRONSERVE_TORCH_WHEELS", "/opt/wheels"))
    if not list(wheels.glob(f"torch-{ep.TORCH_VERSION}+cpu-*.whl")):
        pytest.skip(f"no CPU torch {ep.TORCH_VERSION} wheel in {wheels}")
