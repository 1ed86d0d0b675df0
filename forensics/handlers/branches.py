"""A receiver loop's dispatch as the side-by-side view lists it: its ordered branches and what each does.

Where :mod:`forensics.handlers.dispatch` runs one frame through the loop, this reads the loop
as written: each test on the message in source order (a tag compared, a helper handed the
message, a guard ``assert``), the tags each branch takes and a one-line summary of its body,
then the fall-through path. The interpreter decides which tags a test names.
"""

from __future__ import annotations

import ast

from forensics.handlers.dispatch import Const, Interpreter, State, as_bytes, mentions
from forensics.handlers.loops import LoopCode, after_receive
from forensics.handlers.model import Branch, FrameShape
from forensics.handlers.source_index import SourceIndex


def extract_branches(index: SourceIndex, code: LoopCode) -> list[Branch]:
    """The loop's ordered dispatch: each test on the message, in source order, with its tags."""
    interpreter = Interpreter(index, code.self_class, code.parsed)
    derived = {code.message_name}
    messages = {code.message_name}  # the message itself and slices of it (payload = msg[1:])
    branches: list[Branch] = []
    statements = _flatten(after_receive(code.loop.body, code.message_name))
    for statement in statements:
        if isinstance(statement, ast.Assign) and mentions(statement.value, derived):
            value = statement.value
            whole = (isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Slice)) or (
                isinstance(value, ast.Call) and any(isinstance(a, ast.Name) and a.id in messages for a in value.args)
            )
            for target in statement.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        derived.add(name.id)
                        if whole:
                            messages.add(name.id)
        if isinstance(statement, ast.If) and mentions(statement.test, derived) and _dispatches(
            interpreter, statement.test, messages
        ):
            _add_if_branches(interpreter, code, statement, derived, branches)
        elif isinstance(statement, ast.Assert) and mentions(statement.test, derived):
            tags = _tags_in(interpreter, statement.test)
            branches.append(
                _branch(code, len(branches), tags, "guard-assert",
                        "frames that pass the check go on; anything else: AssertionError ends the thread",
                        statement)
            )
    tail = [s for s in statements if getattr(s, "lineno", 0) > (branches[-1].end_line if branches else 0)]
    if tail:
        first, last = tail[0], tail[-1]
        summary = _summary(code, tail, "default path")
        branches.append(
            Branch(len(branches), ["<room>"], "fallback", summary, code.parsed.relpath, first.lineno,
                   last.end_lineno or last.lineno, code.parsed.segment(first.lineno, last.end_lineno or last.lineno))
        )
    return branches


def _dispatches(interpreter: Interpreter, test: ast.expr, messages: set[str]) -> bool:
    """A test that chooses by the message: a tag compared, a helper handed the message, a helper result checked."""
    if _tags_in(interpreter, test):
        return True
    if any(
        isinstance(n, ast.Call) and any(isinstance(a, ast.Name) and a.id in messages for a in n.args)
        for n in ast.walk(test)
    ):
        return True
    return isinstance(test, ast.Compare) and "is None" in ast.unparse(test) and mentions(test, messages)


def _flatten(statements: list[ast.stmt]) -> list[ast.stmt]:
    flat: list[ast.stmt] = []
    for statement in statements:
        if isinstance(statement, ast.Try):
            flat.extend(_flatten(statement.body))
        else:
            flat.append(statement)
    return flat


def _add_if_branches(interpreter: Interpreter, code: LoopCode, node: ast.If, derived: set[str],
                     branches: list[Branch]) -> None:
    tags = _tags_in(interpreter, node.test)
    negated = isinstance(node.test, ast.UnaryOp) or any(
        isinstance(c, ast.Compare) and any(isinstance(op, ast.NotEq | ast.NotIn | ast.Is) for op in c.ops)
        for c in ast.walk(node.test)
    )
    helper_call = next((c for c in ast.walk(node.test) if isinstance(c, ast.Call)), None)
    if not tags and helper_call is not None:
        tags = _helper_tags(interpreter, helper_call)
    name_test = ast.unparse(node.test)
    if "is None" in name_test and not tags:
        tags = _assigned_helper_tags(interpreter, code, node)
        kind = "guard-check" if tags else "check"
        summary = _summary(code, node.body, f"{name_test}: skip")
    elif negated and tags and not helper_call:
        kind = "guard-check"
        summary = _summary(code, node.body, f"not {'/'.join(tags)}: skip")
    else:
        kind = "helper" if helper_call is not None and not _direct_compare(node.test) else "tag"
        if tags == ["None"]:
            kind = "registration"
        summary = _summary(code, node.body, "")
    branches.append(_branch(code, len(branches), tags, kind, summary, node, body_only=True))
    if node.orelse and not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)):
        first, last = node.orelse[0], node.orelse[-1]
        branches.append(
            Branch(len(branches), ["<room>"], "fallback", _summary(code, node.orelse, "else"), code.parsed.relpath,
                   first.lineno, last.end_lineno or last.lineno,
                   code.parsed.segment(first.lineno, last.end_lineno or last.lineno))
        )
    elif node.orelse:
        _add_if_branches(interpreter, code, node.orelse[0], derived, branches)  # type: ignore[arg-type]


def _direct_compare(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Compare) for n in ast.walk(test))


def _tags_in(interpreter: Interpreter, test: ast.expr) -> list[str]:
    tags: list[str] = []
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                candidates = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
                for candidate in candidates:
                    value = interpreter.value(candidate, State(FrameShape(())))
                    if isinstance(value, Const) and isinstance(value.value, bytes | str) and value.value != "":
                        label = (as_bytes(value.value) or b"").decode("ascii", "replace")
                        if label not in tags:
                            tags.append(label)
    return tags


def _helper_tags(interpreter: Interpreter, call: ast.Call) -> list[str]:
    resolved = interpreter.resolve_helper(call.func)
    if resolved is None:
        return []
    helper_interpreter, function = resolved
    tags: list[str] = []
    for node in ast.walk(function):
        if isinstance(node, ast.If):
            for tag in _tags_in(helper_interpreter, node.test):
                if tag not in tags:
                    tags.append(tag)
    return tags


def _assigned_helper_tags(interpreter: Interpreter, code: LoopCode, node: ast.If) -> list[str]:
    names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
    for statement in ast.walk(code.loop):
        if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
            if statement.targets[0].id in names and isinstance(statement.value, ast.Call):
                return _helper_tags(interpreter, statement.value)
    return []


def _branch(code: LoopCode, order: int, tags: list[str], kind: str, summary: str, node: ast.stmt,
            body_only: bool = False) -> Branch:
    first = node.lineno
    last = node.end_lineno or first
    if body_only and isinstance(node, ast.If) and node.body:
        last = node.body[-1].end_lineno or last
    return Branch(order, tags, kind, summary, code.parsed.relpath, first, last, code.parsed.segment(first, last))


def _summary(code: LoopCode, body: list[ast.stmt], fallback: str) -> str:
    """The comment above the branch if sglang wrote one, else the calls it makes."""
    if body:
        first_line = getattr(body[0], "lineno", 0)
        owner = code.parsed.parents.get(body[0])
        header = getattr(owner, "lineno", first_line) if isinstance(owner, ast.If) else first_line
        for candidate in (header - 1, first_line - 1):
            if 0 < candidate <= len(code.parsed.lines):
                text = code.parsed.lines[candidate - 1].strip()
                if text.startswith("#"):
                    return text.lstrip("# ").strip()
    calls: list[str] = []
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name.startswith("logger.") or name in ("int", "str", "len", "next") or name.endswith(
                    ("encode", "decode")
                ):
                    continue
                short = name.replace("self.", "")
                if short not in calls:
                    calls.append(short)
    ends = [type(s).__name__.lower() for s in body if isinstance(s, ast.Continue | ast.Return)]
    text = ", ".join(calls[:4])
    if fallback and not text:
        return fallback
    if text:
        text = f"calls {text}"
    if ends:
        text = f"{text}; {ends[-1]}" if text else ends[-1]
    return f"{fallback}: {text}" if fallback and text else text or fallback
