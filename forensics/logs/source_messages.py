"""The messages one module of sglang can print, read from its syntax tree: templates and their renderings.

A message is a *template*: literal text and holes (the expressions it prints, with their format
spec). Every way sglang builds one is read: f-strings, %-format (``%`` and logger calls with
arguments), ``str.format``, ``+`` and messages built up with ``+=`` across statements of one
scope. Two views of a module:

* :meth:`ModuleMessages.templates`: every string template the module can produce (an
  over-approximation, on purpose: the catalogue's range check asks "can this release write it?");
* :meth:`ModuleMessages.log_calls`: each ``logger.<level>(...)`` call with its line, its level and
  the templates of its message (``logger.error(msg)`` follows ``msg``'s assignments).

:func:`render` fills a template's holes with representative values (a full-range 63-bit room, a
uuid rid, an ip:port, ...); :func:`pattern` turns it into a regex whose holes match anything.
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass

# Representative values: exact identifiers at full range, realistic everything else.
ROOM = 7461092837465012345
RID = "9f1c3e5a7b2d4f6e8a0c1b3d5f7e9a2c"
RANK = 3
IP = "10.0.3.17"
PORT = 43127
ADDR = f"{IP}:8998"
ELAPSED = 300.4
COUNT = 15
GENERIC_FAILURE = f"KVTransferError(bootstrap_room={ROOM}): Failed to send KV chunk to {IP}:{PORT}"
EXCEPTION_NAMES = {"e", "ex", "exc", "err", "error", "exception"}
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal",
               "warning_once", "info_once", "debug_once", "error_once", "log"}
# A logger method -> the level its line is written at (``exception`` is an error with a traceback).
LEVELS = {"debug": "debug", "debug_once": "debug", "info": "info", "info_once": "info", "warning": "warning",
          "warn": "warning", "warning_once": "warning", "error": "error", "error_once": "error",
          "exception": "error", "critical": "critical", "fatal": "critical"}
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
MAX_VARIANTS = 64  # per variable built with +=, so a long chain cannot explode


@dataclass(frozen=True)
class Hole:
    """One placeholder of a format string: the expression it prints and how."""

    expr: str
    conversion: str = ""  # f-string / str.format conversion: "r", "s", "a" or ""
    spec: str = ""  # format spec; for %-format the whole directive, e.g. "%.1f"
    percent: bool = False


Template = tuple  # of str and Hole


@dataclass(frozen=True)
class LogCall:
    """One ``logger.<method>(...)`` call: where, at which level, and what its message can be."""

    line: int
    method: str  # as written: "error", "exception", "warning_once", ...
    templates: tuple[Template, ...]  # empty when the message is built where this reader cannot follow

    @property
    def level(self) -> str:
        return LEVELS.get(self.method, "info")


def join(*parts: Template) -> Template:
    out: list = []
    for part in parts:
        for piece in part:
            if isinstance(piece, str) and out and isinstance(out[-1], str):
                out[-1] += piece
            else:
                out.append(piece)
    return tuple(out)


_PERCENT = re.compile(r"%(?:\((?P<key>[^)]*)\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?(?P<type>[diouxXeEfFgGcrsa%])")


def _percent(fmt: str, args: list[ast.expr]) -> Template:
    parts: list = []
    position = 0
    index = 0
    for found in _PERCENT.finditer(fmt):
        parts.append(fmt[position:found.start()])
        position = found.end()
        if found.group("type") == "%":
            parts.append("%")
            continue
        expr = ast.unparse(args[index]) if index < len(args) else f"arg{index}"
        index += 1
        parts.append(Hole(expr, spec=found.group(0), percent=True))
    parts.append(fmt[position:])
    return join(tuple(p for p in parts if p != ""))


def _braces(fmt: str, args: list[ast.expr], keywords: list[ast.keyword]) -> Template | None:
    parts: list = []
    auto = 0
    named = {k.arg: k.value for k in keywords if k.arg}
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError:
        return None
    for literal, field, spec, conversion in parsed:
        parts.append(literal)
        if field is None:
            continue
        head = re.split(r"[.\[]", field, maxsplit=1)[0]
        if head == "":
            node = args[auto] if auto < len(args) else None
            auto += 1
        elif head.isdigit():
            node = args[int(head)] if int(head) < len(args) else None
        else:
            node = named.get(head)
        expr = ast.unparse(node) if node is not None else field
        parts.append(Hole(expr, conversion or "", spec or ""))
    return join(tuple(p for p in parts if p != ""))


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(str(v.value) for v in node.values)
    return None


def _scope_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of one scope, nested scopes left out, in source order."""
    out: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, SCOPES):
                continue
            out.append(child)
            visit(child)

    visit(scope)
    return out


def _module_constants(tree: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = "text"`` / ``b"text"`` / ``"text".encode(...)`` (e.g. NIXL's GUARD)."""
    constants: dict[str, object] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str | bytes):
            constants[node.targets[0].id] = value.value
        elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "encode"
              and isinstance(value.func.value, ast.Constant) and isinstance(value.func.value.value, str)):
            constants[node.targets[0].id] = value.func.value.value.encode()
    return constants


def _is_logger(node: ast.AST) -> bool:
    """``logger.x``, ``self.logger.x``, ``logging.x``, ``_logger.x``: a receiver named like a logger."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name == "logging" or name.lower().lstrip("_").endswith("logger")


class ModuleMessages:
    """Every string template one module can produce, and its logging calls."""

    def __init__(self, tree: ast.Module, max_variants: int = MAX_VARIANTS):
        self.max_variants = max_variants
        self.found: set[Template] = set()
        self.calls: list[LogCall] = []
        self.constants = _module_constants(tree)
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, SCOPES))]:
            self._scope(scope)
        self.calls.sort(key=lambda call: call.line)

    def templates(self) -> frozenset[Template]:
        return frozenset(self.found)

    def log_calls(self) -> tuple[LogCall, ...]:
        return tuple(self.calls)

    def _scope(self, scope: ast.AST) -> None:
        env: dict[str, list[Template]] = {}
        for node in _scope_nodes(scope):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                made = self._of(node.value, env)
                for target in targets:
                    if isinstance(target, ast.Name) and made:
                        env[target.id] = (env.get(target.id, []) + made)[:self.max_variants]
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.target, ast.Name):
                tails = self._of(node.value, env)
                heads = env.get(node.target.id, [])
                grown = [join(h, t) for h in heads for t in tails]
                self.found.update(grown)
                if grown:
                    env[node.target.id] = (heads + grown)[:self.max_variants]
            elif isinstance(node, ast.expr):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in LEVELS and _is_logger(node.func.value) and node.args):
                    self.calls.append(LogCall(node.lineno, node.func.attr, tuple(self._message(node, env))))
                self.found.update(self._of(node, env))

    def _message(self, call: ast.Call, env: dict[str, list[Template]]) -> list[Template]:
        first = call.args[0]
        if len(call.args) > 1 and (fmt := _literal(first)) is not None:
            return [_percent(fmt, call.args[1:])]
        made = self._of(first, env)
        return made or [(Hole(ast.unparse(first)),)]  # logger.error(e): the text is all the value's

    def _of(self, node: ast.AST, env: dict[str, list[Template]]) -> list[Template]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.value,)] if node.value else []
        if isinstance(node, ast.JoinedStr):
            return [self._joined(node)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self._of(node.left, env), self._of(node.right, env)
            return [join(a, b) for a in left for b in right][:self.max_variants]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            fmt = _literal(node.left)
            if fmt is None:
                return []
            args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
            return [_percent(fmt, args)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "format":
                fmt = _literal(node.func.value)
                made = _braces(fmt, node.args, node.keywords) if fmt is not None else None
                return [made] if made else []
            if node.func.attr in LOG_METHODS:
                args = node.args[1:] if node.func.attr == "log" else node.args
                if len(args) > 1 and (fmt := _literal(args[0])) is not None:
                    return [_percent(fmt, args[1:])]
            return []
        if isinstance(node, ast.Name):
            return env.get(node.id, [])
        if isinstance(node, ast.IfExp):
            return self._of(node.body, env) + self._of(node.orelse, env)
        return []

    def _joined(self, node: ast.JoinedStr) -> Template:
        parts: list = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                spec = ""
                if isinstance(value.format_spec, ast.JoinedStr):
                    spec = "".join(str(v.value) for v in value.format_spec.values if isinstance(v, ast.Constant))
                conversion = chr(value.conversion) if value.conversion and value.conversion > 0 else ""
                parts.append(Hole(ast.unparse(value.value), conversion, spec))
        return join(tuple(parts))


# --------------------------------------------------------------------------- rendering

_WORD = r"(?<![A-Za-z]){}(?![A-Za-z])"


def _value(expr: str, failure: str, constants: dict[str, object]) -> object:
    bare = re.sub(r"^(?:str|repr)\((.*)\)$", r"\1", expr)
    low = expr.lower()
    if bare in EXCEPTION_NAMES:
        return failure
    if expr in constants:
        return constants[expr]
    if low.startswith("len("):
        return COUNT
    if "room" in low:
        return ROOM
    if re.search(_WORD.format("rid"), low):
        return RID
    if "addr" in low or "url" in low:
        return ADDR
    if re.search(_WORD.format("port"), low):
        return PORT
    if re.search(_WORD.format("(?:ip|host)"), low):
        return IP
    if "rank" in low:
        return RANK
    if any(w in low for w in ("elapsed", "timeout", "seconds", "duration", "interval")):
        return ELAPSED
    if any(w in low for w in ("count", "attempt", "retries", "retry", "num")):
        return COUNT
    return "value"


def _format(hole: Hole, value: object) -> str:
    for candidate in (value, COUNT, ELAPSED):
        try:
            if hole.percent:
                return hole.spec % (candidate,)
            shown = {"r": repr, "a": ascii, "s": str}.get(hole.conversion, lambda v: v)(candidate)
            return format(shown, hole.spec)
        except (TypeError, ValueError):
            continue
    return str(value)


def render(template: Template, failure: str = GENERIC_FAILURE, constants: dict[str, object] | None = None) -> str:
    """The template with every hole filled by a representative value (``failure`` for an exception)."""
    constants = constants or {}
    return "".join(p if isinstance(p, str) else _format(p, _value(p.expr, failure, constants)) for p in template)


def has_exception(template: Template) -> bool:
    """Whether the template prints an exception (``{e}``), whose text the caller chooses."""
    return any(isinstance(p, Hole) and re.sub(r"^(?:str|repr)\((.*)\)$", r"\1", p.expr) in EXCEPTION_NAMES
               for p in template)


def literal_text(template: Template) -> str:
    """The template's literal characters, holes left out."""
    return "".join(p for p in template if isinstance(p, str))


def longest_literal(template: Template) -> str:
    return max((p for p in template if isinstance(p, str)), key=len, default="")


def shown(template: Template) -> str:
    """The template as people read it: holes as ``{expr}``."""
    return "".join(p if isinstance(p, str) else "{" + p.expr + "}" for p in template)


def pattern(template: Template) -> str:
    """A regex for the lines the template writes: literal text exactly, a hole any text on the line,
    and none of it anchored (a line's prefix and a rank's suffix may surround it)."""
    parts = []
    for piece in template:
        if isinstance(piece, str):
            parts.append(re.escape(piece.split("\n", 1)[0]) if "\n" in piece else re.escape(piece))
            if "\n" in piece:
                break  # a multi-line message is one line of the log per line; match its first
        elif not parts or parts[-1] != ".*?":
            parts.append(".*?")
    while parts and parts[-1] == ".*?":
        parts.pop()
    return "".join(parts)
