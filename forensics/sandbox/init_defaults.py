"""What a release's ``__init__`` would have set, read from its source (the sandbox skips ``__init__``).

Managers are built with ``cls.__new__``; the sandbox sets the values that need thought
(sockets, agents, ranks, KV geometry) itself. The rest is bookkeeping that every release
adds more of (``self._deferred_ack_targets = {}``, ``self.session_lock = threading.Lock()``).
:func:`initial_values` reads each ``__init__`` in the class's MRO and evaluates only
assignments whose right-hand side is a plain literal or an empty container/lock
constructor, so a new release's new bookkeeping attributes get the release's own initial
values without a sandbox change. Anything else is left unset and listed by
:func:`assigned_in_init`, so a thread death on a missing attribute can be recognised as a
sandbox gap (:func:`missing_attribute_gap`) instead of being reported as engine behaviour.
"""

from __future__ import annotations

import ast
import collections
import inspect
import re
import textwrap
import threading

_CONSTRUCTORS = {
    "set": set,
    "dict": dict,
    "list": list,
    "tuple": tuple,
    "deque": collections.deque,
    "collections.deque": collections.deque,
    "defaultdict": collections.defaultdict,
    "collections.defaultdict": collections.defaultdict,
    "threading.Lock": threading.Lock,
    "threading.RLock": threading.RLock,
    "threading.Event": threading.Event,
    "threading.Condition": threading.Condition,
    "threading.local": threading.local,
}
_FACTORIES = {"set": set, "int": int, "list": list, "dict": dict, "float": float}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


class _Unsafe(Exception):
    pass


def _evaluate(node: ast.AST, module_globals: dict):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict) and not node.keys:
        return {}
    if isinstance(node, ast.List) and not node.elts:
        return []
    if isinstance(node, ast.Tuple) and not node.elts:
        return ()
    if isinstance(node, ast.Call) and not node.keywords:
        name = _dotted(node.func)
        if name in _CONSTRUCTORS:
            return _CONSTRUCTORS[name](*[_factory(arg, module_globals) for arg in node.args])
    raise _Unsafe


def _factory(node: ast.AST, module_globals: dict):
    """An argument of ``defaultdict(...)``: a builtin type, or a class of the release's module."""
    name = _dotted(node)
    if name in _FACTORIES:
        return _FACTORIES[name]
    if isinstance(node, ast.Name) and inspect.isclass(module_globals.get(node.id)):
        return module_globals[node.id]
    if isinstance(node, ast.Lambda) and not node.args.args:
        body = node.body
        return lambda: _evaluate(body, module_globals)
    return _evaluate(node, module_globals)


def _init_assignments(cls: type) -> list[tuple[str, ast.AST]]:
    init = cls.__dict__.get("__init__")
    if init is None:
        return []
    try:
        source = textwrap.dedent(inspect.getsource(init))
    except (OSError, TypeError):
        return []
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.append((target.attr, value))
    return found


def assigned_in_init(cls: type) -> set[str]:
    """Every ``self.X`` an ``__init__`` in ``cls``'s MRO assigns."""
    return {name for klass in cls.__mro__ for name, _ in _init_assignments(klass)}


def initial_values(cls: type) -> dict[str, object]:
    """``{attribute: fresh value}`` for the literal/empty-container assignments of the MRO's ``__init__``s.

    Subclasses win over base classes; an attribute assigned twice with different safe values
    keeps the first one seen (the most derived class, top of its ``__init__``).
    """
    values: dict[str, object] = {}
    for klass in cls.__mro__:
        module_globals = vars(inspect.getmodule(klass)) if inspect.getmodule(klass) else {}
        for name, node in _init_assignments(klass):
            if name in values:
                continue
            try:
                values[name] = _evaluate(node, module_globals)
            except (_Unsafe, TypeError, ValueError):
                continue
    return values


_MISSING = re.compile(r"'(?P<cls>\w+)' object has no attribute '(?P<attr>\w+)'")


def missing_attribute_gap(exc_type: str, message: str, classes: list[type]) -> str | None:
    """``"Class.attr"`` when an AttributeError names an attribute one of ``classes``' ``__init__``
    would have set: the sandbox did not set it, so the death says nothing about the release."""
    if exc_type != "AttributeError":
        return None
    match = _MISSING.search(message)
    if not match:
        return None
    for cls in classes:
        if cls.__name__ == match["cls"] and match["attr"] in assigned_in_init(cls):
            return f"{cls.__name__}.{match['attr']}"
    return None
