"""What a receiver loop does with a frame: a small abstract interpreter over its ``ast``.

A loop body is run statement by statement against a :class:`FrameShape` (the frames
a sender builds, or a foreign frame with a tag nobody sends). The interpreter tracks
the names bound to the message (``msg``, ``payload = msg[1:]``) and to its elements
(``room = msg[0].decode("ascii")``, ``tag = msg[0]``), decides the tag tests
(``== b"ABORT"``, ``in (...)``, ``!= GUARD``), follows helpers one or two calls deep
when their result steers the dispatch (``if self._handle_abort_notification(msg):``,
``payload = self._validate_message(msg)``), and notices what would raise: a failing
``assert``, ``int()`` of a non-number, an index past the last frame, a tuple unpack of
the wrong length. Conditions that do not depend on the frame (feature flags) are taken
as false and the outcome is marked conditional.

The result is an :class:`Outcome`: handled, dropped (with a warning, logged or
silently) or the thread dies, with the line that decides it.

What the interpreter does not model is never passed over in silence: a ``match``
statement, a handler chosen at run time (``self.handlers[msg[0]](msg)``), a tag compared
with a value it cannot resolve, the frames handed to a call it does not follow before any
test on them, a nested loop over the frames. Each is recorded (``State.opaque``, and
:func:`forensics.handlers.loops.structural_problems` for the loop body as written) with its file and line, and the
loop is then reported as not understood rather than as handling what it was given.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from forensics.handlers.model import (
    Element,
    FrameShape,
)
from forensics.handlers.source_index import NONE, ParsedFile, SourceIndex

HELPER_DEPTH = 2
LOG_WARN = {"warning", "warn", "error", "exception", "critical", "warning_once"}


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Msg:
    offset: int  # msg[offset:] of the received frames


@dataclass(frozen=True)
class Elem:
    index: int


@dataclass(frozen=True)
class Const:
    value: object


@dataclass(frozen=True)
class Lazy:
    call: ast.Call


class _Unknown:
    pass


UNKNOWN = _Unknown()
SOMETHING = Const(object())  # a value known not to be None (a tuple, a new object), contents unknown


class FrameError(Exception):
    """The frame makes this code raise; carries the exception type and the node."""

    def __init__(self, kind: str, node: ast.AST, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.node = node
        self.detail = detail


@dataclass
class _Terminal:
    kind: str  # "continue", "return", "break", "fallthrough"
    value: object = None
    node: ast.AST | None = None


@dataclass(frozen=True)
class Opaque:
    """A construct the interpreter met and does not model: the outcome around it is a guess."""

    file: str
    line: int
    reason: str


@dataclass
class State:
    shape: FrameShape
    names: dict[str, object] = field(default_factory=dict)
    warned: bool = False
    matched: ast.AST | None = None
    caught: FrameError | None = None
    conditional: bool = False
    # Shared by every copy and helper state of one run: whatever path found it, it was met.
    opaque: list[Opaque] = field(default_factory=list)

    def copy(self) -> State:
        return State(self.shape, dict(self.names), self.warned, self.matched, self.caught, self.conditional,
                     self.opaque)


def as_bytes(value: object) -> bytes | None:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return None


def _is_numeric(value: bytes) -> bool:
    return value.strip().lstrip(b"-").isdigit()


# ----------------------------------------------------------------------------- interpreter


class Interpreter:
    """Runs loop bodies and helpers of one class (``self``) against one frame shape."""

    def __init__(self, index: SourceIndex, self_class: str | None, parsed: ParsedFile) -> None:
        self.index = index
        self.self_class = self_class
        self.parsed = parsed
        # Helpers are followed only where their result steers the dispatch (a test, a name a
        # test reads, a return); a bare ``self._add_remote_peer(X.from_zmq(msg))`` is the
        # branch's work, not its choice, and is not second-guessed.
        self.steering = 0

    # -- what is not modelled

    def opaque(self, st: State, node: ast.AST, reason: str) -> None:
        entry = Opaque(self.parsed.relpath, getattr(node, "lineno", 0) or 0, reason)
        if entry not in st.opaque:
            st.opaque.append(entry)

    def _frame_values(self, values: list[object]) -> bool:
        return any(isinstance(v, Msg | Elem) for v in values)

    def check_callee(self, node: ast.Call, args: list[object], st: State) -> None:
        """A handler chosen at run time and handed the frames: the dispatch is not in the code as written."""
        if not self._frame_values(args):
            return
        func = node.func
        chosen = None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Subscript | ast.Call):
            chosen = ast.unparse(func)
        elif not isinstance(func, ast.Name | ast.Attribute):
            chosen = ast.unparse(func)
        elif isinstance(func, ast.Name) and func.id in st.names:
            chosen = func.id
        if chosen is not None:
            self.opaque(st, node, f"the frames go to a handler chosen at run time ({shorten(chosen)}); "
                                  "the analysis cannot tell which tags it takes")

    def _frame_names(self, st: State) -> set[str]:
        return {name for name, value in st.names.items() if isinstance(value, Msg | Elem)}

    # -- expressions

    def element(self, st: State, index: int, node: ast.AST) -> Element:
        low = len(st.shape.elements)
        if index >= low:
            raise FrameError(
                "IndexError", node, f"IndexError: frame [{index}] of a {low}-frame message ({ast.unparse(node)})"
            )
        return st.shape.elements[index]

    def value(self, node: ast.expr, st: State, depth: int = 0) -> object:
        if isinstance(node, ast.Constant):
            return Const(node.value)
        if isinstance(node, ast.Name):
            if node.id in st.names:
                found = st.names[node.id]
                if isinstance(found, Lazy):
                    self.steering += 1
                    try:
                        found = self.call(found.call, st, depth)
                    finally:
                        self.steering -= 1
                    st.names[node.id] = found
                return found
            constant = self.index.module_constant(self.parsed, node.id)
            return Const(constant) if constant is not None else UNKNOWN
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and self.self_class:
                constant = self.index.class_attribute(self.self_class, node.attr)
                if constant is NONE:
                    return Const(None)
                return Const(constant) if constant is not None else UNKNOWN
            constant = self.index.constant_value(node, self.parsed)
            if constant is not None:
                return Const(None if constant is NONE else constant)
            return UNKNOWN
        if isinstance(node, ast.Subscript):
            base = self.value(node.value, st, depth)
            if isinstance(base, Msg):
                if isinstance(node.slice, ast.Slice):
                    lower = node.slice.lower
                    start = lower.value if isinstance(lower, ast.Constant) and isinstance(lower.value, int) else 0
                    return Msg(base.offset + start)
                if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
                    position = base.offset + node.slice.value
                    self.element(st, position, node)
                    return Elem(position)
                return UNKNOWN
            if isinstance(base, Elem):
                return base  # msg[0][:20]
            if isinstance(node.slice, ast.expr):
                self.value(node.slice, st, depth)
            return UNKNOWN
        if isinstance(node, ast.Call):
            return self.call(node, st, depth)
        if isinstance(node, ast.Compare | ast.BoolOp | ast.UnaryOp):
            decided = self.test(node, st, depth)
            return UNKNOWN if decided is None else Const(decided)
        if isinstance(node, ast.Tuple | ast.List | ast.Dict | ast.Set):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.value(child, st, depth)
            return SOMETHING
        if isinstance(node, ast.IfExp):
            decided = self.test(node.test, st, depth)
            if decided is None:
                st.conditional = True
                decided = False
            return self.value(node.body if decided else node.orelse, st, depth)
        # Anything else: evaluate children for the risks they carry, value unknown.
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.value(child, st, depth)
        return UNKNOWN

    def call(self, node: ast.Call, st: State, depth: int) -> object:
        func = node.func
        args = [self.value(arg, st, depth) for arg in node.args]
        for keyword in node.keywords:
            args.append(self.value(keyword.value, st, depth))
        self.check_callee(node, args, st)
        args = args[: len(node.args)]
        if isinstance(func, ast.Attribute) and func.attr in ("encode", "decode") and not node.args[1:]:
            base = self.value(func.value, st, depth)
            if isinstance(base, Const) and isinstance(base.value, str | bytes):
                raw = as_bytes(base.value)
                return Const(raw.decode() if func.attr == "decode" and raw is not None else raw)
            return base
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "logger":
            if func.attr in LOG_WARN:
                st.warned = True
            return Const(None)
        if isinstance(func, ast.Name) and func.id == "int" and args:
            self.check_int(args[0], node, st)
            return UNKNOWN
        if isinstance(func, ast.Name) and func.id == "len" and args and isinstance(args[0], Msg):
            return Const(len(st.shape.elements) - args[0].offset)
        if isinstance(func, ast.Name) and (func.id == "cls" or func.id in self.index.classes_by_name):
            return SOMETHING  # constructing an object
        if self.steering and any(isinstance(a, Msg) for a in args) and depth < HELPER_DEPTH:
            helper = self.resolve_helper(func)
            if helper is not None:
                return self.run_helper(helper, node, args, st, depth + 1)
        return UNKNOWN

    def check_int(self, argument: object, node: ast.AST, st: State) -> None:
        if isinstance(argument, Elem):
            element = st.shape.elements[argument.index]
            bad = (element.kind == "const" and not _is_numeric(element.value or b"")) or element.kind in (
                "text",
                "bytes",
            )
            if bad:
                raise FrameError(
                    "ValueError",
                    node,
                    f"ValueError: {ast.unparse(node)} on frame [{argument.index}] = {element.label()!r}",
                )
        elif isinstance(argument, Const) and isinstance(argument.value, str | bytes):
            raw = as_bytes(argument.value) or b""
            if not _is_numeric(raw):
                raise FrameError("ValueError", node, f"ValueError: {ast.unparse(node)} of {raw!r}")

    def resolve_helper(self, func: ast.expr) -> tuple[Interpreter, ast.FunctionDef] | None:
        """``self.m``, ``self.kv_mgr.m``, ``Cls.m`` or a module function, as an interpreter and its def."""
        if isinstance(func, ast.Attribute):
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id == "self" and self.self_class:
                found = self.index.find_method(self.self_class, func.attr)
                if found:
                    info, method = found
                    return Interpreter(self.index, self.self_class, info.file), method
            if isinstance(owner, ast.Name) and owner.id in self.index.classes:
                found = self.index.find_method(owner.id, func.attr, self.parsed)
                if found:
                    info, method = found
                    # ``self`` inside a classmethod of that class; its attributes resolve in its own file.
                    return Interpreter(self.index, None, info.file), method
            return None
        if isinstance(func, ast.Name):
            for parsed in self.index.files.values():
                for statement in parsed.tree.body:
                    if isinstance(statement, ast.FunctionDef) and statement.name == func.id:
                        if parsed is self.parsed or func.id in self.parsed.imports:
                            return Interpreter(self.index, None, parsed), statement
        return None

    def run_helper(
        self, helper: tuple[Interpreter, ast.FunctionDef], node: ast.Call, args: list, st: State, depth: int
    ) -> object:
        interpreter, function = helper
        params = [a.arg for a in function.args.args]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        inner = State(st.shape, opaque=st.opaque)
        for name, value in zip(params, args, strict=False):
            inner.names[name] = value
        terminal = interpreter.block(function.body, inner, depth, in_loop=False)
        st.warned = st.warned or inner.warned
        st.conditional = st.conditional or inner.conditional
        if inner.matched is not None and st.matched is None:
            st.matched = node
        if terminal.kind == "return":
            result = terminal.value
            # A helper that returns True, a parsed value or the payload has accepted the frame.
            accepted = isinstance(result, Msg) or result is SOMETHING or (
                isinstance(result, Const) and result.value is True
            )
            if accepted and st.matched is None:
                st.matched = node
            return result
        return Const(None)

    # -- tests

    def test(self, node: ast.expr, st: State, depth: int = 0) -> bool | None:
        self.steering += 1
        try:
            return self._test(node, st, depth)
        finally:
            self.steering -= 1

    def _test(self, node: ast.expr, st: State, depth: int = 0) -> bool | None:
        if isinstance(node, ast.BoolOp):
            results = []
            for operand in node.values:
                result = self.test(operand, st, depth)
                if isinstance(node.op, ast.And) and result is False:
                    return False
                if isinstance(node.op, ast.Or) and result is True:
                    return True
                results.append(result)
            return None if None in results else (isinstance(node.op, ast.And))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.test(node.operand, st, depth)
            return None if inner is None else not inner
        if isinstance(node, ast.Compare) and len(node.ops) != 1:
            return None
        if isinstance(node, ast.Compare):
            left = self.value(node.left, st, depth)
            right = self.value(node.comparators[0], st, depth)
            result = self.compare(left, node.ops[0], right, node.comparators[0], st)
            if result is None:
                self._undecided_tag_test(node, left, right, st)
            if result is True and isinstance(node.ops[0], ast.Eq | ast.In) and Elem in (type(left), type(right)):
                st.matched = st.matched or node
            return result
        value = self.value(node, st, depth)
        return self.truth(value, st)

    def _undecided_tag_test(self, node: ast.Compare, left: object, right: object, st: State) -> None:
        """A tag (a constant frame) compared for equality with something the analysis cannot resolve."""
        op = node.ops[0]
        if not isinstance(op, ast.Eq | ast.NotEq):
            return
        for mine, other, other_node in ((left, right, node.comparators[0]), (right, left, node.left)):
            if isinstance(mine, Elem) and st.shape.elements[mine.index].kind == "const" and not isinstance(other, Const):
                self.opaque(st, node, f"a tag test the analysis cannot decide ({shorten(ast.unparse(node))}): "
                                      f"{shorten(ast.unparse(other_node))} is not a constant it can resolve")
                return

    def truth(self, value: object, st: State) -> bool | None:
        if isinstance(value, Msg):
            return len(st.shape.elements) > value.offset
        if isinstance(value, Elem):
            return True
        if isinstance(value, Const):
            return bool(value.value)
        return None

    def compare(self, left: object, op: ast.cmpop, right: object, right_node: ast.expr, st: State) -> bool | None:
        if isinstance(op, ast.Is | ast.IsNot):
            if isinstance(right, Const) and right.value is None:
                if isinstance(left, Msg | Elem):
                    same = False
                elif isinstance(left, Const):
                    same = left.value is None
                else:
                    return None
                return same if isinstance(op, ast.Is) else not same
            return None
        if isinstance(op, ast.In | ast.NotIn):
            if isinstance(right_node, ast.Tuple | ast.List | ast.Set):
                options = [self.value(e, st) for e in right_node.elts]
                results = [self.equal(left, option, st) for option in options]
                found = True if True in results else (None if None in results else False)
                if found is None:
                    return None
                return found if isinstance(op, ast.In) else not found
            return None
        if isinstance(op, ast.Eq | ast.NotEq):
            equal = self.equal(left, right, st)
            if equal is None:
                return None
            return equal if isinstance(op, ast.Eq) else not equal
        if isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE):
            if isinstance(left, Const) and isinstance(right, Const):
                try:
                    return {ast.Lt: left.value < right.value, ast.LtE: left.value <= right.value,  # type: ignore[operator]
                            ast.Gt: left.value > right.value, ast.GtE: left.value >= right.value}[type(op)]  # type: ignore[operator]
                except TypeError:
                    return None
        return None

    def equal(self, left: object, right: object, st: State) -> bool | None:
        if isinstance(right, Elem) and not isinstance(left, Elem):
            left, right = right, left
        if isinstance(left, Elem) and isinstance(right, Const):
            element = st.shape.elements[left.index]
            wanted = as_bytes(right.value)
            if wanted is None:
                return False if right.value is None else None
            if element.kind == "const":
                return element.value == wanted
            if element.kind == "num":
                return False if not _is_numeric(wanted) else None
            return False  # opaque text/bytes never equal a protocol tag
        if isinstance(left, Const) and isinstance(right, Const):
            a, b = as_bytes(left.value), as_bytes(right.value)
            if a is not None and b is not None:
                return a == b
            return left.value == right.value
        return None

    # -- statements

    def block(self, statements: list[ast.stmt], st: State, depth: int, in_loop: bool) -> _Terminal:
        for position, statement in enumerate(statements):
            if isinstance(statement, ast.If) and self._undecided(statement, st, depth):
                return self._fork(statement, statements[position + 1 :], st, depth, in_loop)
            terminal = self.statement(statement, st, depth, in_loop)
            if terminal is not None:
                return terminal
        return _Terminal("fallthrough")

    def _undecided(self, node: ast.If, st: State, depth: int) -> bool:
        trial = st.copy()
        try:
            return self.test(node.test, trial, depth) is None
        except FrameError:
            return False

    def _fork(self, node: ast.If, rest: list[ast.stmt], st: State, depth: int, in_loop: bool) -> _Terminal:
        """A condition that does not depend on the frame (a feature flag, a status value): follow both
        ways to the end of the block and keep the kindest (handled, then no raise, then no warning,
        body first); the outcome is then marked conditional when the two ways differ."""
        self.test(node.test, st, depth)  # for its side effects on the state (matched, warned)
        paths = []
        for body in (node.body, node.orelse):
            trial = st.copy()
            try:
                terminal = self._branch(body, trial, depth, in_loop)
                if terminal is None:
                    terminal = self.block(rest, trial, depth, in_loop)
                raised = None
            except FrameError as error:
                terminal, raised = _Terminal("raise"), error
            kind = terminal.kind
            returned_true = kind == "return" and isinstance(terminal.value, Const) and terminal.value.value is True
            rank = (
                raised is None and kind != "break",
                trial.matched is not None or returned_true,
                not trial.warned,
            )
            paths.append((rank, terminal, raised, trial))
        best = max(paths, key=lambda p: p[0])  # max keeps the first (the body) on ties
        rank, terminal, raised, trial = best
        differs = paths[0][0] != paths[1][0] or paths[0][1].kind != paths[1][1].kind
        st.names, st.warned, st.matched, st.caught = trial.names, trial.warned, trial.matched, trial.caught
        st.conditional = st.conditional or trial.conditional or differs
        if raised is not None:
            raise raised
        return terminal

    def statement(self, node: ast.stmt, st: State, depth: int, in_loop: bool) -> _Terminal | None:
        if isinstance(node, ast.Continue):
            return _Terminal("continue", node=node)
        if isinstance(node, ast.Break):
            return _Terminal("break", node=node)
        if isinstance(node, ast.Return):
            self.steering += 1
            try:
                value = self.value(node.value, st, depth) if node.value is not None else Const(None)
            finally:
                self.steering -= 1
            return _Terminal("return", value, node)
        if isinstance(node, ast.Raise):
            raise FrameError("raise", node, f"raise {ast.unparse(node.exc) if node.exc else ''}".strip())
        if isinstance(node, ast.Assert):
            result = self.test(node.test, st, depth)
            if result is False:
                message = ""
                if isinstance(node.msg, ast.JoinedStr | ast.Constant):
                    message = _render_message(node.msg, self, st)
                raise FrameError("AssertionError", node, f"AssertionError: {message}".rstrip(": "))
            if result is None:
                st.conditional = True
            return None
        if isinstance(node, ast.If):
            decided = self.test(node.test, st, depth)
            if decided is True:
                return self._branch(node.body, st, depth, in_loop)
            if decided is False:
                return self._branch(node.orelse, st, depth, in_loop)
            # Not about the frame (a feature flag, a status value): run both ways and keep the
            # benign one (no raise, no warning, no break), the body first; note the choice.
            paths = []
            for body in (node.body, node.orelse):
                trial = st.copy()
                try:
                    terminal = self._branch(body, trial, depth, in_loop)
                    kind = "fallthrough" if terminal is None else terminal.kind
                    benign = kind != "break" and not (trial.warned and not st.warned)
                except FrameError as error:
                    terminal, kind, benign, trial = error, "raise", False, trial
                paths.append((benign, kind, terminal, trial))
            chosen = next((p for p in paths if p[0]), paths[1])
            if paths[0][1] != paths[1][1] or paths[0][0] != paths[1][0]:
                chosen[3].conditional = True
            benign, kind, terminal, trial = chosen
            st.names, st.warned, st.matched = trial.names, trial.warned, trial.matched
            st.caught, st.conditional = trial.caught, st.conditional or trial.conditional
            if isinstance(terminal, FrameError):
                raise terminal
            return terminal
        if isinstance(node, ast.Try):
            return self._try(node, st, depth, in_loop)
        if isinstance(node, ast.With):
            for item in node.items:
                self.value(item.context_expr, st, depth)
            return self._branch(node.body, st, depth, in_loop)
        if isinstance(node, ast.Assign):
            self._assign(node.targets, node.value, st, depth)
            return None
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            self._assign([node.target], node.value, st, depth)
            return None
        if isinstance(node, ast.Expr):
            # A bare call is a side effect (a handler); do not follow it, but its arguments can raise.
            if isinstance(node.value, ast.Call):
                call = node.value
                func = call.func
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "logger":
                    self.call(call, st, depth)
                    return None
                args = [self.value(arg, st, depth) for arg in [*call.args, *(k.value for k in call.keywords)]]
                if isinstance(func, ast.Attribute):
                    self.value(func.value, st, depth)
                self.check_callee(call, args, st)
                if depth == 0 and st.matched is None and any(isinstance(a, Msg) for a in args):
                    # The whole message handed to a call made for its effect, before any test chose
                    # a case: that call is the dispatch, and the analysis does not follow it.
                    self.opaque(st, call, f"the frames are handed to {shorten(ast.unparse(func))}() before any "
                                          "test on them; the analysis does not follow that call")
                return None
            self.value(node.value, st, depth)
            return None
        if isinstance(node, ast.For | ast.AsyncFor):
            if mentions(node.iter, self._frame_names(st)):
                self.opaque(st, node, f"a nested loop over the frames (for ... in {shorten(ast.unparse(node.iter))}) "
                                      "is not interpreted")
            return None
        if isinstance(node, ast.While):
            if mentions(node.test, self._frame_names(st)):
                self.opaque(st, node, f"a nested loop on the frames (while {shorten(ast.unparse(node.test))}) "
                                      "is not interpreted")
            return None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return None  # definitions do not steer this frame
        if isinstance(node, UNMODELLED):
            self.opaque(st, node, f"a {construct_name(node)} is not interpreted by the analysis")
            return None
        return None

    def _branch(self, body: list[ast.stmt], st: State, depth: int, in_loop: bool) -> _Terminal | None:
        terminal = self.block(body, st, depth, in_loop)
        return None if terminal.kind == "fallthrough" else terminal

    def _try(self, node: ast.Try, st: State, depth: int, in_loop: bool) -> _Terminal | None:
        try:
            terminal = self._branch(node.body, st, depth, in_loop)
        except FrameError as error:
            for handler in node.handlers:
                if _catches(handler, error.kind):
                    if _reraises(handler.body):
                        raise
                    if depth == 0:
                        st.caught = error
                    else:
                        st.warned = True
                    return self._branch(handler.body, st, depth, in_loop)
            raise
        if terminal is None and node.orelse:
            terminal = self._branch(node.orelse, st, depth, in_loop)
        return terminal

    def _assign(self, targets: list[ast.expr], value_node: ast.expr, st: State, depth: int) -> None:
        target = targets[0]
        if isinstance(target, ast.Name):
            if isinstance(value_node, ast.Call) and self.resolve_helper(value_node.func) is not None:
                # A helper's result is evaluated when a test reads it (``if payload is None``).
                if any(isinstance(self.value(a, st, depth), Msg) for a in value_node.args):
                    st.names[target.id] = Lazy(value_node)
                    return
            st.names[target.id] = self.value(value_node, st, depth)
            return
        if isinstance(target, ast.Tuple):
            value = self.value(value_node, st, depth)
            if isinstance(value, Msg):
                have = len(st.shape.elements) - value.offset
                want = len(target.elts)
                if have != want:
                    raise FrameError(
                        "ValueError",
                        value_node,
                        f"ValueError: unpacking a {have}-frame message into {want} names ({ast.unparse(target)} = ...)",
                    )
                for position, element in enumerate(target.elts):
                    if isinstance(element, ast.Name):
                        st.names[element.id] = Elem(value.offset + position)
            else:
                for element in target.elts:
                    if isinstance(element, ast.Name):
                        st.names[element.id] = UNKNOWN
            return
        # Subscript or attribute targets: the value still runs (and can raise).
        self.value(value_node, st, depth)


def mentions(node: ast.AST, names: set[str]) -> bool:
    """Does ``node`` read any of ``names``?"""
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _catches(handler: ast.ExceptHandler, kind: str) -> bool:
    if handler.type is None:
        return True
    names = [ast.unparse(e) for e in (handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type])]
    return any(n in ("Exception", "BaseException", kind) for n in names) or (kind == "raise" and bool(names))


def _reraises(body: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Raise) for statement in body for n in ast.walk(statement))


def _render_message(node: ast.expr, interpreter: Interpreter, st: State) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    parts = []
    for value in node.values:  # type: ignore[attr-defined]
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            resolved = interpreter.value(value.value, st)
            parts.append(repr(resolved.value) if isinstance(resolved, Const) else "{" + ast.unparse(value.value) + "}")
    return "".join(parts)


UNMODELLED = (ast.Match, ast.AsyncWith, ast.TryStar) if hasattr(ast, "TryStar") else (ast.Match, ast.AsyncWith)


def construct_name(node: ast.AST) -> str:
    return {"Match": "match statement", "AsyncWith": "async with block", "TryStar": "try/except* block",
            "AsyncFor": "async for loop"}.get(type(node).__name__, type(node).__name__)


def shorten(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
