"""sglang's own log lines for one release, built from that release's source: one formatter for all.

The twin (its processes log through :func:`logging_format`) and the incident generator
(:mod:`forensics.logs.incident`) both write sglang's lines through this module, so they
cannot disagree, and neither keeps a per-release table:

* the line prefix: ``configure_logger``'s ``format``/``datefmt`` (``[%(asctime)s{ms}{prefix}]
  %(message)s``), with the ``SGLANG_LOG_MS`` milliseconds only in releases whose
  ``configure_logger`` reads that variable;
* the periodic ``Prefill batch`` / ``Decode batch`` lines: the function that logs them
  (``log_prefill_stats`` / ``report_prefill_stats`` ...) is read with ``ast`` and its message
  building (``msg = f"..."``, ``msg += ...``, helpers such as ``get_prefill_usage_msg_parts``)
  is followed for one PD engine: the role's ``disaggregation_mode`` branch, a plain (not
  hybrid) model, no speculative decoding, no optional flags (``SGLANG_LOG_FORWARD_ITERS`` only
  when asked). What comes out is the release's f-string with its holes; each hole is filled
  by the column its label names (``#bootstrap-req`` -> ``bootstrap_req``, the names of
  :mod:`forensics.logs.batchlines`), with the hole's own format spec.

Nothing of sglang is copied: the sources are read from the release cache at run time.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from forensics import sglang_source
from forensics.logs.batchlines import column_for

# Where the scheduler's stats logging lives across 0.5.x (managers/scheduler_metrics_mixin.py up
# to 0.5.9, observability/ in 0.5.10 - 0.5.12, managers/scheduler_components/ from 0.5.13).
SEARCH_DIRS = ("managers", "observability")
HEADERS = {"prefill": "Prefill batch", "decode": "Decode batch"}
ROLE_MODES = {"prefill": "PREFILL", "decode": "DECODE"}
LOG_CALLS = {"info", "debug", "warning", "error"}
# Conditions a plain PD engine meets; every other one (hybrid pools, speculative decoding, MFU,
# device timers, encoder-only, replay tokens, ...) is taken as false.
TRUE_WHEN = (re.compile(r"\bis_stats_logging_rank\b"), re.compile(r"spec_algorithm\.is_none\(\)"))
DEVICE = "cuda"  # the graph label sglang prints on a GPU: "cuda graph"
_NONE = object()  # a local assigned None (``full_token_usage = None``: `is None` holds until a branch sets it)
_OTHER = object()  # a local assigned something that is not a string


@dataclass(frozen=True)
class _Mapping:
    """``defaultdict(lambda: "cuda graph", {...})``: what ``[self.device]`` gives on a CUDA engine."""

    default: str


class FormatSourceError(sglang_source.SourceError):
    """The release's log format could not be read from its source; the message says where."""


@dataclass(frozen=True)
class Hole:
    """One placeholder of the release's message: the expression it prints and its format spec."""

    expr: str
    spec: str = ""
    conversion: str = ""


@dataclass(frozen=True)
class BatchTemplate:
    """A release's batch line for one role, as its source builds it: text and holes."""

    version: str
    role: str
    parts: tuple  # of str and Hole
    path: str  # relative to the release root
    function: str
    line: int

    def labels(self) -> list[str]:
        """The field labels in order (``#new-seq``, ``token usage``, ...)."""
        return [label for label, _ in self._fields() if label is not None]

    def _fields(self) -> list[tuple[str | None, Hole]]:
        out = []
        text = ""
        for part in self.parts:
            if isinstance(part, str):
                text += part
                continue
            before = _label_text(text)
            if before.endswith("["):
                out.append((None, part))  # the forward iteration in the header: "Prefill batch [N], "
            else:
                out.append((before.removesuffix(": ").strip() or None, part))
            text = ""
        return out

    def render(self, values: dict[str, object], iteration: int | None = None) -> str:
        kind = HEADERS[self.role].split()[0].encode()
        out = []
        text = ""
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                text += part
                continue
            before = _label_text(text)
            text = ""
            if before.endswith("["):
                value: object = iteration if iteration is not None else 1
            else:
                label = before.removesuffix(": ").strip()
                value = values.get(column_for(kind, label.encode()), 0)
            out.append(_format(part, value))
        return "".join(out)

    def regex(self) -> re.Pattern:
        """The line this template prints, any hole value allowed (for tests and checks)."""
        return re.compile("".join(re.escape(p) if isinstance(p, str) else r"(.+?)" for p in self.parts) + r"\Z")


_HEADER = re.compile(r"^(?:Prefill|Decode) batch(?: \[[^\]]*\])?[.,] ")


def _label_text(text: str) -> str:
    """The label a hole's value belongs to: the text since the previous field, header removed."""
    return _HEADER.sub("", text.rsplit(", ", 1)[-1])


def _format(hole: Hole, value: object) -> str:
    shown = {"r": repr, "a": ascii, "s": str}.get(hole.conversion, lambda v: v)(value)
    try:
        return format(shown, hole.spec)
    except (TypeError, ValueError):
        return format(float(shown), hole.spec) if isinstance(shown, int) else str(shown)


# ----------------------------------------------------------------------------- following the source


class _Return(Exception):
    def __init__(self, value):
        self.value = value


class _Follower:
    """Follows one function's string building for one role, as a plain PD engine runs it."""

    def __init__(self, index: _SourceIndex, role: str, forward_iters: bool, module: ast.Module,
                 device: str = DEVICE):
        self.index = index
        self.role = role
        self.forward_iters = forward_iters
        self.module = module
        self.device = device
        self.logged: list[tuple] = []

    # -- statements

    def run(self, func: ast.FunctionDef, env: dict | None = None):
        env = {} if env is None else env
        try:
            self._block(func.body, env)
        except _Return as done:
            return done.value
        return None

    def _block(self, statements, env: dict) -> None:
        for statement in statements:
            self._statement(statement, env)

    def _statement(self, node, env: dict) -> None:
        if isinstance(node, ast.If):
            taken = self._cond(node.test, env)
            self._block(node.body if taken else node.orelse, env)
            for skipped in (node.orelse if taken else node.body):
                self._logs_in(skipped, env)  # `if self.is_stats_logging_rank: logger.info(msg)` and kin
            return
        if isinstance(node, ast.Try | ast.With):
            self._block(node.body, env)
            return
        if isinstance(node, ast.Return):
            raise _Return(self._value(node.value, env) if node.value is not None else None)
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            # ``num_used = token_usage = full_token_usage = None`` binds every target
            value_node = node.value
            value = self._value(value_node, env)
            if value is None and isinstance(value_node, ast.Constant) and value_node.value is None:
                value = _NONE
            elif (value is None and isinstance(value_node, ast.Call) and isinstance(value_node.func, ast.Name)
                  and value_node.func.id == "defaultdict" and value_node.args
                  and isinstance(value_node.args[0], ast.Lambda)
                  and isinstance(value_node.args[0].body, ast.Constant)):
                value = _Mapping(str(value_node.args[0].body.value))
            for target in node.targets:
                env[target.id] = _OTHER if value is None else value
            return
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.target, ast.Name):
            head = env.get(node.target.id)
            tail = self._value(node.value, env)
            if isinstance(head, tuple) and isinstance(tail, tuple):
                env[node.target.id] = _join(head, tail)
            elif isinstance(head, list) and isinstance(tail, list):
                env[node.target.id] = head + tail
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            func = call.func
            if (isinstance(func, ast.Attribute) and func.attr == "append" and isinstance(func.value, ast.Name)
                    and isinstance(env.get(func.value.id), list) and call.args):
                item = self._value(call.args[0], env)
                env[func.value.id] = env[func.value.id] + [item if isinstance(item, tuple) else (Hole("?"),)]
                return
            self._logs_in(node, env)

    def _logs_in(self, node, env: dict) -> None:
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in LOG_CALLS
                    and isinstance(call.func.value, ast.Name) and call.func.value.id == "logger" and call.args):
                message = self._value(call.args[0], env)
                if isinstance(message, tuple):
                    self.logged.append(message)

    # -- expressions

    def _value(self, node, env: dict):
        """A string as a tuple of parts, a list of such tuples, or None (not a string)."""
        if isinstance(node, ast.Constant):
            return (node.value,) if isinstance(node.value, str) else None
        if isinstance(node, ast.JoinedStr):
            parts: tuple = ()
            for value in node.values:
                if isinstance(value, ast.Constant):
                    parts = _join(parts, (str(value.value),))
                else:
                    parts = _join(parts, self._hole(value, env))
            return parts
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self._value(node.left, env), self._value(node.right, env)
            if isinstance(left, tuple) and isinstance(right, tuple):
                return _join(left, right)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            return None
        if isinstance(node, ast.IfExp):
            return self._value(node.body if self._cond(node.test, env) else node.orelse, env)
        if isinstance(node, ast.Name):
            value = env.get(node.id)
            return value if isinstance(value, tuple | list) else None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            mapping = env.get(node.value.id)
            if isinstance(mapping, _Mapping) and "device" in ast.unparse(node.slice):
                return (mapping.default,)
            return None
        if isinstance(node, ast.List | ast.Tuple):
            items = [self._value(e, env) for e in node.elts]
            return [i for i in items if isinstance(i, tuple)] if all(isinstance(i, tuple) for i in items) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if (func.attr == "join" and isinstance(func.value, ast.Constant) and isinstance(func.value.value, str)
                    and len(node.args) == 1):
                items = self._value(node.args[0], env)
                if isinstance(items, list):
                    out: tuple = ()
                    for i, item in enumerate(items):
                        out = _join(out, ((func.value.value,) if i else ()) + item)
                    return out
                return None
            helper = self.index.function(func.attr)
            if helper is not None:
                return _Follower(self.index, self.role, self.forward_iters, self.module).run(helper)
        return None

    def _hole(self, value: ast.FormattedValue, env: dict) -> tuple:
        spec = ""
        if isinstance(value.format_spec, ast.JoinedStr):
            spec = "".join(str(v.value) for v in value.format_spec.values if isinstance(v, ast.Constant))
        conversion = chr(value.conversion) if value.conversion and value.conversion > 0 else ""
        inner = value.value
        if not spec and not conversion:
            known = self._value(inner, env)
            if isinstance(known, tuple):
                return known  # a string built earlier ({token_msg}, {iter_msg})
            constant = self._attribute_default(inner)
            if constant is not None:
                return (constant,)  # {self._graph_backend_label}: "cuda graph" on a CUDA device
        return (Hole(ast.unparse(inner), spec, conversion),)

    def _attribute_default(self, node) -> str | None:
        """``self.x`` assigned a string in the module: the literal, or a ``{...}.get(device, default)``'s default."""
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"):
            return None
        for assign in ast.walk(self.module):
            if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1):
                continue
            target = assign.targets[0]
            if not (isinstance(target, ast.Attribute) and target.attr == node.attr):
                continue
            value = assign.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "get"
                    and len(value.args) == 2 and isinstance(value.args[1], ast.Constant)):
                # {"cpu": "cpu graph", ...}.get(device, "cuda graph"): this engine's device's entry
                table = value.func.value
                if isinstance(table, ast.Dict):
                    for key, entry in zip(table.keys, table.values, strict=True):
                        if (isinstance(key, ast.Constant) and key.value == self.device
                                and isinstance(entry, ast.Constant) and isinstance(entry.value, str)):
                            return entry.value
                return str(value.args[1].value)
        return None

    def _cond(self, node, env: dict) -> bool:
        if isinstance(node, ast.BoolOp):
            results = [self._cond(v, env) for v in node.values]
            return all(results) if isinstance(node.op, ast.And) else any(results)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self._cond(node.operand, env)
        if isinstance(node, ast.Name) and isinstance(env.get(node.id), list | tuple):
            return bool(env[node.id])  # `if not parts:` in the usage helpers
        text = ast.unparse(node)
        if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Name)
                and isinstance(node.ops[0], ast.Is | ast.IsNot) and isinstance(node.comparators[0], ast.Constant)
                and node.comparators[0].value is None):
            is_none = env.get(node.left.id) is _NONE
            return is_none if isinstance(node.ops[0], ast.Is) else not is_none
        if (isinstance(node, ast.Compare) and len(node.ops) == 1 and ast.unparse(node.left).endswith("device")
                and isinstance(node.comparators[0], ast.Constant) and isinstance(node.ops[0], ast.Eq | ast.NotEq)):
            same = node.comparators[0].value == self.device
            return same if isinstance(node.ops[0], ast.Eq) else not same
        if isinstance(node, ast.Compare) and "disaggregation_mode" in text:
            mode = ROLE_MODES[self.role]
            names = set(re.findall(r"DisaggregationMode\.(\w+)", text))
            equal = mode in names
            negated = isinstance(node.ops[0], ast.NotEq | ast.NotIn | ast.IsNot)
            return equal != negated
        if re.search(r"\bLOG_FORWARD_ITERS\b", text):
            return self.forward_iters
        return any(p.search(text) for p in TRUE_WHEN)


def _join(*parts: tuple) -> tuple:
    out: list = []
    for part in parts:
        for piece in part:
            if piece == "":
                continue
            if isinstance(piece, str) and out and isinstance(out[-1], str):
                out[-1] += piece
            else:
                out.append(piece)
    return tuple(out)


class _SourceIndex:
    """The scheduler-side modules of one release, parsed once, with their functions by name."""

    def __init__(self, source: sglang_source.SglangSource):
        self.source = source
        self.modules: dict[str, ast.Module] = {}
        for directory in SEARCH_DIRS:
            for path in sorted((source.srt / directory).rglob("*.py")):
                data = path.read_bytes()  # a cheap test first; what is parsed is read through the verified path
                if b"Prefill batch" in data or b"Decode batch" in data or b"msg_parts" in data:
                    relative = str(path.relative_to(source.root))
                    self.modules[relative] = ast.parse(source.read(relative))
        self._functions: dict[str, ast.FunctionDef] = {}
        for tree in self.modules.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef):
                    self._functions.setdefault(node.name, node)

    def function(self, name: str) -> ast.FunctionDef | None:
        # Only message helpers are followed (…_msg_parts, …_msg): a call to anything else is a value.
        return self._functions.get(name) if "msg" in name else None


@cache
def _index(version: str) -> _SourceIndex:
    return _SourceIndex(sglang_source.fetch(version))


@cache
def batch_template(version: str, role: str, forward_iters: bool = False, device: str = DEVICE) -> BatchTemplate:
    """The ``Prefill batch`` (role "prefill") or ``Decode batch`` (role "decode") line of ``version``
    on ``device`` ("cuda": a GPU's "cuda graph: ..."; "cpu": "cpu graph: ...", as real sglang on a CPU)."""
    index = _index(version)
    header = HEADERS[role]
    for relative, tree in index.modules.items():
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            if not any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith(header)
                       for n in ast.walk(func)):
                continue
            follower = _Follower(index, role, forward_iters, tree, device)
            follower.run(func)
            for message in follower.logged:
                if message and isinstance(message[0], str) and message[0].startswith(header):
                    return BatchTemplate(version, role, message, relative, func.name, func.lineno)
    raise FormatSourceError(f"sglang {version}: no function under {', '.join(SEARCH_DIRS)} logs a {header!r} line")


def batch_line(version: str, role: str, values: dict[str, object], *, iteration: int | None = None,
               device: str = DEVICE) -> str:
    """One ``Prefill batch`` / ``Decode batch`` message of ``version``; ``values`` by column name
    (``new_seq``, ``token_usage``, ``bootstrap_req``, ``cuda_graph`` ...); a field without a value
    prints 0. ``iteration`` prints ``[N]`` where the release does (0.5.4 always; from 0.5.4.post1
    only with ``SGLANG_LOG_FORWARD_ITERS``, which asking for an iteration means here)."""
    template = batch_template(version, role, forward_iters=iteration is not None, device=device)
    return template.render(values, iteration)


def prefill_batch_line(version: str, *, iteration: int | None = None, device: str = DEVICE, **values) -> str:
    return batch_line(version, "prefill", values, iteration=iteration, device=device)


def decode_batch_line(version: str, *, iteration: int | None = None, device: str = DEVICE, **values) -> str:
    return batch_line(version, "decode", values, iteration=iteration, device=device)


# ----------------------------------------------------------------------------- the prefix


@dataclass(frozen=True)
class LogFormat:
    """``configure_logger``'s format for one release, in :mod:`logging`'s terms."""

    version: str
    fmt: str  # "[%(asctime)s%(prefix)s] %(message)s": sglang's {prefix} as a record field
    fmt_ms: str | None  # the SGLANG_LOG_MS=1 variant; None when the release has no such switch
    datefmt: str

    def logging_format(self, millis: bool) -> str:
        return self.fmt_ms if millis and self.fmt_ms else self.fmt

    def prefix(self, ts: datetime, ranks: str = "", millis: bool = False) -> str:
        """What the format prints before the message, for a time already in the wanted zone."""
        fmt = self.logging_format(millis)
        stamp = ts.strftime(self.datefmt)
        head = fmt.split("%(message)s", 1)[0]
        return (head.replace("%(asctime)s", stamp).replace(".%(msecs)03d", f".{ts.microsecond // 1000:03d}")
                .replace("%(prefix)s", ranks))


@cache
def log_format(version: str) -> LogFormat:
    """The line format ``configure_logger`` of ``version`` installs (read from its source)."""
    source = sglang_source.fetch(version)
    for relative in ("sglang/srt/utils/common.py", "sglang/srt/utils.py"):
        if not (source.root / relative).is_file():
            continue
        tree = ast.parse(source.read(relative))
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef) and func.name == "configure_logger":
                return _read_configure_logger(version, relative, func)
    raise FormatSourceError(f"sglang {version}: no configure_logger in sglang/srt/utils")


def _read_configure_logger(version: str, relative: str, func: ast.FunctionDef) -> LogFormat:
    strings: dict[str, tuple[str, str | None]] = {}  # name -> (plain, with SGLANG_LOG_MS)
    fmt = datefmt = None
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if isinstance(value, ast.IfExp) and "SGLANG_LOG_MS" in ast.unparse(value.test):
                strings[name] = (_literal(value.orelse), _literal(value.body))
            elif isinstance(value, ast.JoinedStr) and name == "format":
                fmt = value
        if isinstance(node, ast.keyword) and node.arg == "datefmt" and isinstance(node.value, ast.Constant):
            datefmt = node.value.value
    if fmt is None or datefmt is None:
        raise FormatSourceError(f"sglang {version}: {relative} configure_logger has no format/datefmt literal")

    def render(with_ms: bool) -> str:
        out = ""
        for value in fmt.values:
            if isinstance(value, ast.Constant):
                out += str(value.value)
            elif isinstance(value.value, ast.Name) and value.value.id in strings:
                plain, ms = strings[value.value.id]
                out += (ms if with_ms else plain) or ""
            elif isinstance(value.value, ast.Name) and value.value.id == "prefix":
                out += "%(prefix)s"
            else:
                raise FormatSourceError(f"sglang {version}: {relative} format hole {ast.unparse(value.value)!r}")
        return out

    has_ms = bool(strings)
    return LogFormat(version, render(False), render(True) if has_ms else None, datefmt)


def _literal(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


# ----------------------------------------------------------------------------- the GUARD assertion


NIXL_CONN = "sglang/srt/disaggregation/nixl/conn.py"
GUARD_MESSAGE = "Foreign traffic?"


@dataclass(frozen=True)
class GuardSite:
    """Where a release's NIXL bootstrap thread dies on a foreign frame, as CPython 3.11 reports it."""

    version: str
    path: str  # relative to the release root
    line: int  # the assert's comparison line: the one a 3.11 traceback names
    text: str  # that line as the traceback prints it (stripped)
    function: str  # the loop's function: "bootstrap_thread"
    target: str  # the thread's target: the loop, or the 0.5.21+ wrapper "bootstrap_thread_guarded"
    wrapper_line: int | None  # the wrapper's call of the loop
    wrapper_text: str | None
    died_message: str | None  # the wrapper's logger.exception message, for engine_rank 0


@cache
def guard_site(version: str) -> GuardSite:
    """The GUARD assertion of ``version``'s NIXL prefill bootstrap loop, read from ``nixl/conn.py``."""
    source = sglang_source.fetch(version)
    text = source.read(NIXL_CONN)
    lines = text.splitlines()
    tree = ast.parse(text)
    found = [(func, node) for func in ast.walk(tree) if isinstance(func, ast.FunctionDef)
             for node in ast.walk(func)
             if isinstance(node, ast.Assert) and node.msg is not None and GUARD_MESSAGE in ast.unparse(node.msg)]
    if found:  # the innermost function holding it: the loop itself, not _start_bootstrap_thread around it
        func, node = max(found, key=lambda pair: pair[0].lineno)
        return _guard_site(version, func, node, tree, lines)
    raise FormatSourceError(f"sglang {version}: no GUARD assertion ({GUARD_MESSAGE!r}) in {NIXL_CONN}")


def _guard_site(version: str, loop: ast.FunctionDef, node: ast.Assert, tree: ast.Module, lines: list[str]) -> GuardSite:
    target = loop.name
    wrapper_line = wrapper_text = died = None
    for call in ast.walk(tree):  # threading.Thread(target=...) for the loop or a wrapper of it
        if not (isinstance(call, ast.Call) and _callee_name(call) == "Thread"):
            continue
        for kw in call.keywords:
            if kw.arg != "target" or not isinstance(kw.value, ast.Name):
                continue
            wrapper = next((f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == kw.value.id),
                           None)
            calls_loop = wrapper is not None and any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == loop.name
                for c in ast.walk(wrapper))
            if kw.value.id == loop.name:
                target = loop.name
            elif calls_loop:
                target = wrapper.name
                inner = next(c for c in ast.walk(wrapper) if isinstance(c, ast.Call)
                             and isinstance(c.func, ast.Name) and c.func.id == loop.name)
                wrapper_line, wrapper_text = inner.lineno, lines[inner.lineno - 1].strip()
                died = _exception_message(wrapper)
    return GuardSite(version=version, path=NIXL_CONN, line=node.test.lineno, text=lines[node.test.lineno - 1].strip(),
                     function=loop.name, target=target, wrapper_line=wrapper_line, wrapper_text=wrapper_text,
                     died_message=died)


def _callee_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _exception_message(func: ast.FunctionDef) -> str | None:
    """The wrapper's ``logger.exception("... %s ...", rank)`` rendered for rank 0."""
    for call in ast.walk(func):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "exception"
                and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
            fmt = call.args[0].value
            return fmt % tuple(0 for _ in call.args[1:]) if len(call.args) > 1 else fmt
    return None
