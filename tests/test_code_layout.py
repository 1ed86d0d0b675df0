"""The house rules a reader relies on (issue 24): modules of one idea, shared names public.

Static checks over the source tree: no module of ``forensics/`` or ``patched_engine/`` over
800 lines, and no private name (``_x``) imported from another module: what two modules share
is public where it is defined. The compiled ``_fastscan`` extension is a module, not a name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("forensics", "patched_engine")
MAX_LINES = 800
PRIVATE_MODULES = {"_fastscan"}  # a module's own name, imported as a module


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_the_source_tree_is_there():
    assert len(_modules()) > 100  # the checks below must not pass on an empty glob


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_800_lines(path):
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines (split it along its ideas)"


def test_no_private_name_is_imported_from_another_module():
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(PACKAGES) and node.level == 0:
                continue  # the rule is about our modules (the standard library's private parts are its own affair)
            private = [alias.name for alias in node.names
                       if alias.name.startswith("_") and not alias.name.startswith("__")
                       and alias.name not in PRIVATE_MODULES]
            if private:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {', '.join(private)}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, every import counted (module level, in functions,
    under TYPE_CHECKING): a circle is a circle wherever its import sits."""
    modules = {}
    for path in _modules():
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                          for alias in node.names if alias.name not in PRIVATE_MODULES]
            else:
                continue
            for target in wanted:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def test_no_import_circles():
    graph = _import_graph()
    assert "forensics.evidence" in graph and graph["forensics.evidence"]  # the graph is really built
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert not circles, f"modules that import each other (directly or round a circle): {circles}"


def test_the_architecture_map_names_every_package():
    """Each package is named as `path/` in the map: in full (`forensics/report/`) or, inside its
    parent's row, from its parent down (`standin_src/sgl_kernel/`)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    packages = sorted({path.parent.relative_to(ROOT).as_posix() for path in _modules() if path.name == "__init__.py"})
    assert len(packages) > 10

    def named(package: str) -> bool:
        parts = package.split("/")
        return any(f"`{'/'.join(parts[i:])}/" in text for i in range(len(parts) - 1 if len(parts) > 2 else 1))

    unnamed = [package for package in packages if not named(package)]
    assert not unnamed, f"docs/ARCHITECTURE.md does not name these packages: {unnamed}"
