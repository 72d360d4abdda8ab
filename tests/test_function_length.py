"""No function of the product is longer than 60 lines: a longer one does several things, and each deserves a name.

The product is ironserve/, roles/ and the Python helpers that run on the hosts (the rank guard, the weights peer) (the local test cluster is a package
of its own, lab/). A function's length is what ast gives it: from its `def` line to its last line, decorators left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 60


def product_files() -> list[Path]:
    files = sorted((ROOT / "ironserve").rglob("*.py"))
    files += sorted((ROOT / "roles").rglob("*.py"))
    return files + [ROOT / "files" / "bin" / n for n in ("ironserve_rank_guard.py", "ironserve_weights_peer.py")]


def long_functions(path: Path, root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """'file:line name (N lines)' for each function of the file longer than ``limit`` lines, the file named
    relative to ``root``."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_product_is_what_is_measured():
    names = {p.relative_to(ROOT).as_posix() for p in product_files()}
    assert {"ironserve/render.py", "ironserve/audit/runner.py", "roles/launch.py"} <= names
    assert "files/bin/ironserve_rank_guard.py" in names
    assert not any(n.startswith(("lab/", "ironserve/lab/")) for n in names)


def test_a_long_function_is_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    method = "".join("    " + line for line in body.splitlines(keepends=True))
    path = tmp_path / "mod.py"
    path.write_text(
        f"def short():\n    return 1\n\n\n@decorated\ndef long():\n{body}\n\nclass C:\n    def m(self):\n{method}"
    )
    assert long_functions(path, tmp_path) == ["mod.py:6 long (61 lines)", "mod.py:70 m (61 lines)"]
    assert long_functions(path, tmp_path, limit=61) == []


def test_no_product_function_is_longer_than_60_lines():
    offenders = [line for path in product_files() for line in long_functions(path)]
    assert offenders == [], "split these along their steps:\n" + "\n".join(offenders)
