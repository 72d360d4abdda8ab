"""In CI (CI=true) a skip fails with its reason, wherever it comes from; outside CI it stays a skip. cpu_serving
tests are deselected unless -m names them. Each case runs a small test file through pytest in-process, with the
hooks of tests/ci.py as its conftest."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SKIPS = {
    "pytest.skip": "import pytest\ndef test_x():\n    pytest.skip('no prerequisite here')\n",
    "skipif": "import pytest\n@pytest.mark.skipif(True, reason='no prerequisite here')\ndef test_x():\n    pass\n",
    "a fixture": (
        "import pytest\n@pytest.fixture\ndef lab():\n    pytest.skip('no prerequisite here')\n"
        "def test_x(lab):\n    pass\n"
    ),
    "importorskip": "import pytest\npytest.importorskip('no_such_module_here')\ndef test_x():\n    pass\n",
}


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makeconftest(
        "from tests.ci import pytest_collection_modifyitems, pytest_make_collect_report, pytest_runtest_makereport\n"
    )
    pytester.makeini("[pytest]\nmarkers =\n    cpu_serving: real serving\n")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # only pytest's own: seconds less per run
    return pytester


@pytest.mark.parametrize("kind", sorted(SKIPS))
def test_a_skip_fails_in_ci_and_says_why(suite, monkeypatch, kind):
    suite.makepyfile(test_one=SKIPS[kind])
    suite.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(skipped=1)
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest_inprocess("-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 1 and "skipped" not in outcomes, outcomes
    result.stdout.fnmatch_lines(["*skipped in CI:*"])
    if kind != "importorskip":
        result.stdout.fnmatch_lines(["*no prerequisite here*"])


def test_cpu_serving_is_deselected_unless_asked(suite, monkeypatch):
    monkeypatch.setenv("CI", "true")
    suite.makepyfile(
        test_one="import pytest\n@pytest.mark.cpu_serving\ndef test_x():\n    pass\ndef test_y():\n    pass\n"
    )
    suite.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1, deselected=1)
    suite.runpytest_inprocess("-p", "no:cacheprovider", "-m", "not lab").assert_outcomes(passed=1, deselected=1)
    suite.runpytest_inprocess("-p", "no:cacheprovider", "-m", "cpu_serving").assert_outcomes(passed=1, deselected=1)
