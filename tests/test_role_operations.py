"""pyinfra-testing operation fixtures: tests/operations/<module>.<operation>/*.yaml (args + facts -> commands).

Every operation has at least one case where the facts already match, asserting the no-op (idempotence).
"""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

BASE_IMPORT_PATH = "roles"
TESTS_BASE = Path(__file__).parent / "operations"

for op_path in sorted(d.name for d in TESTS_BASE.iterdir() if d.is_dir()):
    locals()[op_path] = make_operation_tests(BASE_IMPORT_PATH, op_path, TESTS_BASE / op_path)


def test_fixture_hosts_hand_operations_the_facts_value():
    """As pyinfra does: a fact asked without arguments is its value, not pyinfra-testing's wrapper (tests/conftest.py),
    so an operation's ``is None`` / ``or`` / ``set()`` read the same in a fixture as on a host."""
    from pyinfra.facts.deb import DebPackages
    from pyinfra.facts.server import Arch
    from pyinfra_testing.util import FakeState, create_host

    host = create_host(FakeState(), facts={"server.Arch": None, "deb.DebPackages": {"curl": ["8.5.0"]}})
    assert host.get_fact(Arch) is None
    packages = host.get_fact(DebPackages)
    assert type(packages) is dict and packages == {"curl": ["8.5.0"]}
