import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this checkout's packages first: the product (the root) and the lab (lab/: ironserve_lab), whatever the venv has
for path in (ROOT / "lab", ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# in CI a skip fails; cpu_serving tests are deselected unless -m names them (tests/ci.py)
from tests.ci import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    pytest_make_collect_report,
    pytest_runtest_makereport,
)


def _facts_as_pyinfra_hands_them() -> None:
    """pyinfra-testing hands an operation a fact asked without arguments wrapped (``FakeFact``, the value in its
    ``.data``) where pyinfra hands the value itself, so ``is None``, ``or``, ``len()`` and ``set()`` would see the
    wrapper. The fixture host unwraps it: the roles read facts one way, in fixtures as on hosts."""
    from pyinfra_testing.util import FakeFact, FakeHost

    ask = FakeHost.get_fact

    def get_fact(self, fact_cls, *args, **kwargs):
        value = ask(self, fact_cls, *args, **kwargs)
        return value.data if isinstance(value, FakeFact) else value

    FakeHost.get_fact = get_fact


_facts_as_pyinfra_hands_them()
