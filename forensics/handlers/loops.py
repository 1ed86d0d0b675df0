"""A receiver loop and one frame: where the loop receives, what the frame does to it, what is not modelled.

:func:`run_frame` starts the interpreter (:mod:`forensics.handlers.dispatch`) on the
statements after the loop's receive with the message bound to a frame shape, and turns how the
run ended (a terminal statement, an exception it would raise, the end of the body) into an
:class:`~forensics.handlers.model.Outcome` with its deciding line. :func:`structural_problems`
lists what the loop body does that the interpreter does not model, as written, so such a loop
is reported as not understood rather than as handling what it was given.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from forensics.handlers.dispatch import (
    UNMODELLED,
    Const,
    FrameError,
    Interpreter,
    Msg,
    Opaque,
    State,
    construct_name,
)
from forensics.handlers.model import (
    DIES,
    DROPPED_LOGGED,
    DROPPED_SILENTLY,
    DROPPED_WARNING,
    HANDLED,
    Element,
    FrameShape,
    Outcome,
)
from forensics.handlers.source_index import ParsedFile, SourceIndex


@dataclass
class LoopCode:
    """The parts of a receiver loop the interpreter needs."""

    function: ast.FunctionDef
    loop: ast.While
    message_name: str  # the name bound to the received frames
    parsed: ParsedFile
    self_class: str | None
    recv_helper: ast.FunctionDef | None = None  # consumes frames before the loop sees them
    recv_helper_class: str | None = None


def run_frame(index: SourceIndex, code: LoopCode, shape: FrameShape, opaque: list[Opaque] | None = None) -> Outcome:
    """Deliver one frame to one loop and say what happens.

    ``opaque``, when given, collects what the interpreter met and could not interpret on the way.
    """
    interpreter = Interpreter(index, code.self_class, code.parsed)
    st = State(shape, opaque=opaque if opaque is not None else [])
    if code.recv_helper is not None:
        consumed = _consumed_by_recv_helper(index, code, shape, st.opaque)
        if consumed is not None:
            return consumed
    st.names[code.message_name] = Msg(0)
    body = code.loop.body
    try:
        terminal = interpreter.block(after_receive(body, code.message_name), st, 0, in_loop=True)
    except FrameError as error:
        return _outcome(index, code, DIES, error.detail, error.node, st)
    if st.caught is not None:
        return _outcome(index, code, DROPPED_LOGGED, f"caught by the per-message except: {st.caught.detail}", st.caught.node, st)
    if terminal.kind == "break":
        return _outcome(index, code, DIES, "the loop breaks out: the thread ends", terminal.node, st)
    if st.matched is not None:
        return _outcome(index, code, HANDLED, "", st.matched, st)
    if terminal.kind == "fallthrough" and st.warned:
        return _outcome(index, code, DROPPED_WARNING, "logged as unexpected and skipped", body[-1], st)
    if terminal.kind == "fallthrough":
        return _outcome(index, code, HANDLED, "taken by the default path", body[-1], st)
    if st.warned:
        return _outcome(index, code, DROPPED_WARNING, "logged as unexpected and skipped", terminal.node, st)
    return _outcome(index, code, DROPPED_SILENTLY, "skipped without a log line", terminal.node, st)


def _consumed_by_recv_helper(index: SourceIndex, code: LoopCode, shape: FrameShape,
                             opaque: list[Opaque]) -> Outcome | None:
    """A recv wrapper (``_make_worker_recv``) may consume some frames (BOOTSTRAP) before the loop."""
    helper = code.recv_helper
    assert helper is not None
    interpreter = Interpreter(index, code.recv_helper_class, index.file_of(helper))
    for node in ast.walk(helper):
        if isinstance(node, ast.IfExp | ast.If) and isinstance(node.test, ast.Call):
            call = node.test
            resolved = interpreter.resolve_helper(call.func)
            if resolved is None or not call.args:
                continue
            st = State(shape, opaque=opaque)
            try:
                result = interpreter.run_helper(resolved, call, [Msg(0)], st, 1)
            except FrameError as error:
                return _outcome(index, code, DIES, f"in {helper.name}: {error.detail}", error.node, st)
            if isinstance(result, Const) and result.value is True:
                st.conditional = True  # the wrapper consumes frames only when its feature is on
                return _outcome(index, code, HANDLED, f"consumed by {helper.name} ({ast.unparse(call.func)})", call, st)
    return None


def after_receive(body: list[ast.stmt], message_name: str) -> list[ast.stmt]:
    """The loop body with the receiving statement taken out (it binds the message name)."""
    kept: list[ast.stmt] = []
    for statement in body:
        if isinstance(statement, ast.Try):
            original = statement
            statement = ast.Try(
                body=after_receive(original.body, message_name),
                handlers=original.handlers,
                orelse=original.orelse,
                finalbody=original.finalbody,
            )
            ast.copy_location(statement, original)
            statement.end_lineno = original.end_lineno
        elif _binds(statement, message_name) and _receives(statement):
            continue
        kept.append(statement)
    return kept


def _binds(statement: ast.stmt, name: str) -> bool:
    return (
        isinstance(statement, ast.Assign)
        and isinstance(statement.targets[0], ast.Name)
        and statement.targets[0].id == name
    )


def _receives(statement: ast.stmt) -> bool:
    return any(
        isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Attribute) and n.func.attr == "recv_multipart")
            or isinstance(n.func, ast.Name)
        )
        for n in ast.walk(statement)
    )


def _outcome(index: SourceIndex, code: LoopCode, fate: str, detail: str, node: ast.AST | None,
             st: State) -> Outcome:
    parsed = code.parsed
    if node is not None and node not in parsed.parents:
        try:
            parsed = index.file_of(node)
        except KeyError:
            pass
    line = getattr(node, "lineno", code.loop.lineno)
    end = getattr(node, "end_lineno", line) or line
    branch_node = _enclosing_if(node, parsed, code.loop)
    # Show the whole deciding statement: the if with its body, or the assert.
    shown = branch_node if branch_node is not None else _enclosing_statement(node, parsed)
    if shown is not None:
        line_from = shown.lineno
        end = max(end, shown.end_lineno or end)
    else:
        line_from = line
    return Outcome(
        fate=fate,
        detail=detail,
        file=parsed.relpath,
        line=line,
        branch=ast.unparse(branch_node.test) if branch_node is not None else "",
        conditional=st.conditional,
        source=parsed.segment(line_from, end),
    )


def _enclosing_statement(node: ast.AST | None, parsed: ParsedFile) -> ast.stmt | None:
    current = node
    while current is not None and not isinstance(current, ast.stmt):
        current = parsed.parents.get(current)
    return current


def _enclosing_if(node: ast.AST | None, parsed: ParsedFile, loop: ast.While) -> ast.If | None:
    current = node
    while current is not None and current is not loop:
        if isinstance(current, ast.If):
            return current
        if isinstance(current, ast.FunctionDef):
            return None
        current = parsed.parents.get(current)
    return None


def structural_problems(code: LoopCode) -> list[Opaque]:
    """Constructs in the loop body, as written, that the interpreter does not model.

    Checked whether or not a probe frame reaches them: a ``match`` the interpreter skipped
    could be where the frame it called "handled" really goes.
    """
    found: list[Opaque] = []
    pending: list[ast.AST] = list(code.loop.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, (*UNMODELLED, ast.AsyncFor)):
            entry = Opaque(code.parsed.relpath, node.lineno, f"a {construct_name(node)} is not interpreted by the analysis")
            if entry not in found:
                found.append(entry)
        pending.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda o: o.line)


def foreign_shape(arity: int) -> FrameShape:
    """A frame with a tag no sender uses, followed by opaque frames."""
    return FrameShape((Element("const", b"<unknown tag>"),) + (Element("bytes"),) * (arity - 1))
