"""Every entry point's docstring ends with a one-line example that would run against the real API.

The examples are not run (most need a deployment, a twin or a bundle); what is checked is what
goes stale silently: the example calls the entry point it documents, every ``fx.`` name in it
resolves, and every call of an ``fx.`` function or class passes arguments its signature accepts.
"""

from __future__ import annotations

import ast
import inspect
import re

import pytest

import forensics as fx

ENTRY_POINTS = [
    "logs.scan",
    "handlers.diff", "handlers.matrix", "handlers.check", "handlers.map_release",
    "twin.up", "twin.attach",
    "collect", "diagnose", "validate", "watch",
    "storm.run_storm",
    "bundle.write", "bundle.open",
    "patch.diff", "patch.apply", "patch.verify", "patch.codemod", "patch.deploy", "patch.status", "patch.rollback",
    "report.write_report", "report.Investigation", "report.timeline_plot",
    "sandbox.EngineSandbox",
    "upgrade.plan_upgrade", "upgrade.find_via",
]
EXAMPLE = re.compile(r"^Example: ``(?P<code>.+?)``", re.M)


def resolve(dotted: str):
    value = fx
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def fx_chain(node: ast.AST) -> str | None:
    """``fx.a.b`` for an attribute chain rooted at the name ``fx``, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "fx" and parts:
        return ".".join(reversed(parts))
    return None


def examples_of(dotted: str) -> list[str]:
    return [m["code"] for m in EXAMPLE.finditer(inspect.getdoc(resolve(dotted)) or "")]


@pytest.mark.parametrize("dotted", ENTRY_POINTS)
def test_the_docstring_has_an_example_calling_its_own_entry_point(dotted):
    examples = examples_of(dotted)
    assert examples, f"fx.{dotted}: no 'Example: ``...``' line in its docstring"
    called = set()
    for example in examples:
        tree = ast.parse(example)  # a syntax error fails here, naming the example
        called |= {fx_chain(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert dotted in called, f"fx.{dotted}: no example calls it ({examples})"


@pytest.mark.parametrize("dotted", ENTRY_POINTS)
def test_every_fx_name_in_the_example_resolves_and_every_call_fits_its_signature(dotted):
    for example in examples_of(dotted):
        tree = ast.parse(example)
        chains = {fx_chain(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)} - {None}
        for chain in chains:
            resolve(chain)  # AttributeError names what no longer exists
        for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
            chain = fx_chain(call.func)
            if chain is None or any(isinstance(a, ast.Starred) for a in call.args) or \
                    any(k.arg is None for k in call.keywords):
                continue
            signature = inspect.signature(resolve(chain))
            try:
                signature.bind(*call.args, **{k.arg: k.value for k in call.keywords})
            except TypeError as exc:
                pytest.fail(f"fx.{dotted}: the example's call of fx.{chain} does not fit {signature}: {exc}")


def test_the_checks_catch_a_stale_example(monkeypatch):
    # A renamed keyword and a vanished function are what the two tests above exist to catch.
    def watch(target, *, for_s=None):
        """Watch.

        Example: ``fx.watch("inventory.toml", duration=600)``
        """

    monkeypatch.setattr(fx, "watch", watch)
    with pytest.raises(pytest.fail.Exception, match="does not fit"):
        test_every_fx_name_in_the_example_resolves_and_every_call_fits_its_signature("watch")
    watch.__doc__ = "Watch.\n\nExample: ``fx.watching.watch_forever('inventory.toml')``"
    with pytest.raises(AssertionError, match="no example calls it"):
        test_the_docstring_has_an_example_calling_its_own_entry_point("watch")
    with pytest.raises(AttributeError, match="watch_forever"):
        test_every_fx_name_in_the_example_resolves_and_every_call_fits_its_signature("watch")
