"""pyinfra-testing fact fixtures: tests/facts/<module>.<FactClass>/*.yaml (command output -> parsed fact)."""

from pathlib import Path

from pyinfra_testing.facts import make_fact_tests

BASE_IMPORT_PATH = "roles"
TESTS_BASE = Path(__file__).parent / "facts"

for fact_path in sorted(d.name for d in TESTS_BASE.iterdir() if d.is_dir()):
    locals()[fact_path] = make_fact_tests(BASE_IMPORT_PATH, fact_path, TESTS_BASE / fact_path)
