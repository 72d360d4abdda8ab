"""The code's layout and lint are ruff's (`[tool.ruff]` in pyproject.toml): CI fails on either.

Fix both with `.venv/bin/ruff format && .venv/bin/ruff check --fix`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUFF), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint_is_clean():
    proc = ruff("check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_format_keeps_the_layout():
    proc = ruff("format", "--no-cache", "--check", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
