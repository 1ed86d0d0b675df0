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
            if not isinstance(node, ast.ImportFrom) or node.module in (None, "__future__"):
                continue
            private = [alias.name for alias in node.names
                       if alias.name.startswith("_") and not alias.name.startswith("__")
                       and alias.name not in PRIVATE_MODULES]
            if private:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {', '.join(private)}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)
