"""pyinfra-testing operation fixtures: tests/operations/<module>.<operation>/*.yaml (args + facts -> commands).

Every operation has at least one case where the facts already match, asserting the no-op (idempotence).
"""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

BASE_IMPORT_PATH = "roles"
TESTS_BASE = Path(__file__).parent / "operations"

for op_path in sorted(d.name for d in TESTS_BASE.iterdir() if d.is_dir()):
    locals()[op_path] = make_operation_tests(BASE_IMPORT_PATH, op_path, TESTS_BASE / op_path)
