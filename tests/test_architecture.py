"""The architecture, checked on the source: data flows one way.

- No import loops among ironserve/ and roles/, counting imports inside functions (which hide loops from Python
  until the function runs).
- The core (ironserve/ minus the commands that drive hosts: cli, status, audit, fleet) imports neither roles nor
  pyinfra.
- The lab (lab/, the package ironserve_lab) depends on the product, never the other way: nothing of ironserve/ or
  roles/ imports it.
- One role registry: the deploy's prepare stage calls exactly the registry's roles, in its order.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ironserve", "roles")
# the commands on top of the core: they may drive hosts (pyinfra, the roles); fleet reads inventories with pyinfra
NOT_CORE = ("ironserve.cli", "ironserve.status", "ironserve.audit", "ironserve.fleet")
LAB = "ironserve_lab"


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ``known`` that ``name`` imports, at module level or inside functions."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from package import module` imports the module; `from module import name` the module
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module for alias in node.names
            ]
        else:
            continue
        for target in targets:
            # `import a.b.c` runs a, a.b and a.b.c; the edge that matters is to the deepest module we know
            while target and target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                found.add(target)
            elif target.split(".")[0] in ("pyinfra", "pyinfra_cli"):
                found.add("pyinfra")
    return found


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_function_level_imports():
    graph = _graph()
    # roles.context imports pyinfra only inside current(); ironserve.cli imports render inside a command
    assert "pyinfra" in graph["roles.context"] and "ironserve.render" in graph["ironserve.cli"]
    # relative imports resolve
    assert "ironserve.spec" in graph["ironserve.render"] and "ironserve.audit.runner" in graph["ironserve.audit"]


def test_no_import_loops():
    assert _cycles(_graph()) == []


def test_a_loop_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_imports_neither_roles_nor_pyinfra():
    graph = _graph()
    core = [m for m in graph if m.startswith("ironserve") and not m.startswith(NOT_CORE)]
    assert "ironserve.render" in core and "ironserve.units" in core
    bad = {m: sorted(t for t in graph[m] if t == "pyinfra" or t.startswith("roles")) for m in core}
    assert {m: t for m, t in bad.items() if t} == {}


def test_prepare_calls_the_registry_in_order():
    from roles import deployment

    tree = ast.parse(Path(deployment.__file__).read_text())
    prepare = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "prepare")
    called = [
        c.args[0].value for c in ast.walk(prepare) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "run"
    ]
    assert called == [role.name for role in deployment.PREPARE_ROLES]


def test_the_registry_names_each_roles_own_functions():
    """A role is its module's apply and everything the module says it puts on a host: a desired_files /
    desired_packages / desired_runtime the registry left out would pass the audit unchecked."""
    from importlib import import_module

    from roles import deployment

    for role in deployment.PREPARE_ROLES:
        module = import_module(f"roles.{role.name}")
        assert role.apply is module.apply, role.name
        for what in ("desired_files", "desired_packages", "desired_runtime"):
            declared = getattr(module, what, None)
            assert getattr(role, what) is (declared or deployment._nothing), f"{role.name}.{what}"


def test_production_code_reads_no_lab_flag():
    """The roles and the core say what a setting means (allow_emulated_arch), never that they run in the lab."""
    import re

    pattern = re.compile(r"""(get\(|\[)\s*["']lab["']""")
    found = [name for name, path in _modules().items() if pattern.search(path.read_text())]
    assert found == []


def _lab_imports(source: str) -> list[str]:
    """The imports of the lab's package in ``source``, at module level or inside functions."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == LAB]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == LAB:
            found.append(node.module)
    return found


def test_the_product_never_imports_the_lab():
    """ironserve/ and roles/ import nothing of the lab; only the command line names it, to offer `ironserve lab`
    where its package is installed (a checkout's environment) and to say where it runs where it is not."""
    imports = {name: _lab_imports(path.read_text()) for name, path in _modules().items()}
    assert {name: found for name, found in imports.items() if found} == {}
    assert [name for name, path in _modules().items() if LAB in path.read_text()] == ["ironserve.cli"]


def test_a_lab_import_is_found_inside_a_function():
    source = "import os\ndef f():\n    from ironserve_lab.cli import main\n    import ironserve_lab.state as s\n"
    assert _lab_imports(source) == ["ironserve_lab.cli", "ironserve_lab.state"]
    assert _lab_imports("from ironserve import lab_tools\nimport ironserve_labs\n") == []
