"""Which Python threads a backend's KV manager starts, per role, read from the release's source.

Nothing here is a hand-written table. For one release and backend the KV manager class
(``NixlKVManager``, ``MooncakeKVManager``, found as the handler map finds it) is followed
from its ``__init__`` through every ``self.method()`` and ``super().__init__()`` it calls
(resolved through the class's inheritance, so ``common/conn.py``'s heartbeat starter counts
for NIXL's decode). Each ``threading.Thread(target=...)`` met on the way is one expected
thread, with:

* the role: the nearest ``if ... DisaggregationMode.PREFILL/DECODE`` around the call or its
  callers (no such test: both roles);
* how many: the ``for`` loops around the call, their lengths resolved from the code
  (``for i, queue in enumerate(self.transfer_queues)`` -> ``[FastQueue() for _ in
  range(transfer_queue_size)]`` -> ``envs.SGLANG_DISAGGREGATION_QUEUE_SIZE.get()`` -> its
  default in ``environ.py``, 4), or the values given in ``env``;
* any other condition on the way (``if self.enable_staging:``), evaluated under the
  defaults: a conditional thread may be 0 or its count;
* when it starts: ``init`` (reached from ``__init__``) or ``lazy`` (a thread call in a
  manager method that ``__init__`` does not reach: 0 up to unbounded);
* its name: ``name=`` when given, else CPython's default ``Thread-N (<target>)``;
* daemon flag, the source file and line of the ``Thread(...)`` call and of its target.

A scheduler process runs one KV manager, so these are per scheduler process (one per
TP/DP rank), never per server.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from forensics.handlers.source_index import ParsedFile, SourceIndex
from forensics.handlers.source_scan import backend_classes, daemon_flag, local_defs, thread_calls
from forensics.sglang_source import DISAGGREGATION, SglangSource, resolve
from forensics.threads.envdefaults import UNKNOWN, call_site_default, read_environ

PREFILL = "prefill"
DECODE = "decode"
ROLES = (PREFILL, DECODE)
INIT = "init"
LAZY = "lazy"
MAX_DEPTH = 8

EXPECTED_COLUMNS = (
    "role", "backend", "release", "logical_name", "target", "thread_name", "name_pattern", "daemon",
    "started", "min_count", "max_count", "default_count", "count_expr", "condition", "source", "target_source",
    "starter", "process",
)


class NoKVManager(LookupError):
    """The backend's conn.py has no KV manager class to follow."""


@dataclass(frozen=True)
class ExpectedThread:
    """One kind of thread the release's KV manager starts in a scheduler process of ``role``."""

    role: str
    backend: str
    release: str
    logical_name: str  # "bootstrap", "transfer_worker", "heartbeat", "decode_listener", ...
    target: str  # the target's __name__: "bootstrap_thread", "bootstrap_thread_guarded"
    thread_name: str  # as py-spy shows it: "Thread-N (bootstrap_thread)" or the given name
    name_pattern: str  # regex matched against py-spy's thread_name
    daemon: bool | None
    started: str  # "init" or "lazy"
    min_count: int
    max_count: int | None  # None: no upper bound known
    default_count: int | None  # under the release's default settings (None: cannot tell)
    count_expr: str  # "1", "envs.SGLANG_DISAGGREGATION_QUEUE_SIZE.get() = 4", ...
    condition: str | None  # e.g. "self.enable_staging (SGLANG_DISAGG_STAGING_BUFFER, default False)"
    source: str  # "sglang/srt/disaggregation/nixl/conn.py:2383", the Thread(...) call
    target_source: str | None  # where the target is defined
    starter: str  # qualified name of the method holding the Thread(...) call
    process: str = "scheduler"

    def matches(self, thread_name: str) -> bool:
        return re.fullmatch(self.name_pattern, thread_name or "") is not None

    def expected_text(self) -> str:
        if self.max_count is None:
            return f"{self.min_count}+"
        if self.min_count == self.max_count:
            return str(self.min_count)
        return f"{self.min_count}..{self.max_count}"


@dataclass
class ExpectedThreads:
    """The expected-thread table of one release and backend (both roles unless filtered)."""

    release: str
    backend: str
    rows: list[ExpectedThread]
    manager: str
    gaps: list[str] = field(default_factory=list)  # what the source reading could not resolve

    def for_role(self, role: str) -> list[ExpectedThread]:
        return [r for r in self.rows if r.role == role]

    def by_name(self, role: str) -> dict[str, ExpectedThread]:
        return {r.logical_name: r for r in self.for_role(role)}

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame([asdict(r) for r in self.rows], columns=list(EXPECTED_COLUMNS))
        for column in ("min_count", "max_count", "default_count"):
            frame[column] = pd.array([getattr(r, column) for r in self.rows], dtype="Int64")
        frame["daemon"] = pd.array([r.daemon for r in self.rows], dtype="boolean")
        return frame

    def _repr_html_(self) -> str:
        head = f"<p>sglang {self.release}, {self.backend} ({self.manager}): expected threads per scheduler process</p>"
        return head + self.to_frame().drop(columns=["name_pattern", "process"])._repr_html_()

    def __rich__(self):
        from rich.table import Table

        table = Table(title=f"sglang {self.release} {self.backend}: expected threads per scheduler process")
        for column in ("role", "logical_name", "thread_name", "daemon", "started", "count", "condition", "source"):
            table.add_column(column)
        for r in self.rows:
            table.add_row(r.role, r.logical_name, r.thread_name, str(r.daemon), r.started, r.expected_text(),
                          r.condition or "", r.source)
        return table


# ----------------------------------------------------------------------------- entry point


def expected_threads(
    release: str | Path | SglangSource,
    backend: str = "nixl",
    *,
    role: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ExpectedThreads:
    """The threads ``backend``'s KV manager starts in ``release`` (a version, a tree, or a source).

    ``env`` overrides the release's defaults (``{"SGLANG_DISAGGREGATION_QUEUE_SIZE": "8"}``),
    as the deployment's environment would. ``role`` keeps one role's rows.
    """
    source = release if isinstance(release, SglangSource) else resolve(release)
    backends = source.backends()
    if backend not in backends:
        raise NoKVManager(f"sglang {source.version} has no {DISAGGREGATION}/{backend}/conn.py "
                          f"(backends: {', '.join(backends) or 'none'})")
    index = SourceIndex.load(source.disaggregation, backends)
    classes = backend_classes(index, backend)
    if classes.manager is None:
        raise NoKVManager(f"sglang {source.version}: no *KVManager class in {DISAGGREGATION}/{backend}/conn.py")
    deriver = _Deriver(index, classes.manager, source, backend, env or {})
    rows = deriver.derive()
    if role is not None:
        rows = [r for r in rows if r.role == role]
    gaps = [str(g) for g in index.gaps] + deriver.gaps
    return ExpectedThreads(source.version, backend, rows, classes.manager, gaps)


# ----------------------------------------------------------------------------- derivation


@dataclass
class _Context:
    role: str | None
    conditions: tuple[tuple[str, object], ...]  # (text, value under defaults)
    loops: tuple[tuple[str, object, tuple[str, ...]], ...]  # (text, length under defaults, env names read)


@dataclass
class _Start:
    call: ast.Call
    parsed: ParsedFile
    function: ast.FunctionDef
    context: _Context
    started: str


def _is_self_attribute(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"


def _logical_name(target: str) -> str:
    """A role-free word for a thread kind, from its target: bootstrap_thread_guarded -> bootstrap."""
    base = target.strip("_")
    if "bootstrap" in base.lower() and "server" not in base.lower():
        return "bootstrap"
    if "heartbeat" in base.lower():
        return "heartbeat"
    for suffix in ("_guarded", "_thread", "_checker", "_loop"):
        base = base.removesuffix(suffix)
    return base


def _name_pattern(call: ast.Call, target: str) -> tuple[str, str]:
    """(what py-spy shows, a regex for it)."""
    for keyword in call.keywords:
        if keyword.arg != "name":
            continue
        value = keyword.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value, re.escape(value.value)
        if isinstance(value, ast.JoinedStr):
            parts, shown = [], []
            for piece in value.values:
                if isinstance(piece, ast.Constant):
                    parts.append(re.escape(str(piece.value)))
                    shown.append(str(piece.value))
                else:
                    parts.append(".+")
                    shown.append("{" + ast.unparse(piece.value) + "}")
            return "".join(shown), "".join(parts)
        return f"<{ast.unparse(value)}>", ".+"
    # CPython 3.10+: Thread-N (<target.__name__>) for a thread given no name.
    return f"Thread-N ({target})", rf"Thread-\d+ \({re.escape(target)}\)"


class _Deriver:
    def __init__(self, index: SourceIndex, manager: str, source: SglangSource, backend: str,
                 env: Mapping[str, str]) -> None:
        self.index = index
        self.manager = manager
        self.source = source
        self.backend = backend
        self.env = dict(env)
        self.defaults = read_environ(source.srt)
        self.mro = index.mro(manager)
        self.thread_calls = {id(c) for p in index.files.values() for c in thread_calls(p)}
        # self.X = ... per attribute. Only the assignments made on the way of __init__ count when
        # there are any: a teardown's ``self.transfer_queues = []`` must not size the pool.
        init_methods = self._init_methods()
        at_init: dict[str, list[tuple[ast.expr, ast.FunctionDef, ParsedFile]]] = {}
        elsewhere: dict[str, list[tuple[ast.expr, ast.FunctionDef, ParsedFile]]] = {}
        for info in self.mro:
            for method in info.methods.values():
                resolved = self.index.find_method(self.manager, method.name)
                if resolved is not None and resolved[1] is not method and method.name != "__init__":
                    continue  # overridden further down: never runs for this manager
                chosen = at_init if id(method) in init_methods else elsewhere
                for node in ast.walk(method):
                    if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for target in targets:
                            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                    and target.value.id == "self":
                                chosen.setdefault(target.attr, []).append((node.value, method, info.file))
        self.self_assignments = {name: at_init.get(name) or elsewhere.get(name, [])
                                 for name in set(at_init) | set(elsewhere)}
        self.gaps: list[str] = []
        self.used_env: set[str] = set()

    # ------------------------------------------------------------------ walking

    def _init_methods(self) -> set[int]:
        """ids of the methods ``__init__`` runs (itself, and what it calls on self or super)."""
        init = self.index.find_method(self.manager, "__init__")
        if init is None:
            return set()
        seen: set[int] = set()
        pending = [(init[1], init[0].file)]
        while pending:
            method, parsed = pending.pop()
            if id(method) in seen:
                continue
            seen.add(id(method))
            for node in _own_nodes(method):
                if isinstance(node, ast.Call):
                    callee = self._callee(node, method, parsed)
                    if callee is not None:
                        pending.append((callee[1], callee[0].file))
        return seen

    def derive(self) -> list[ExpectedThread]:
        starts: list[_Start] = []
        init = self.index.find_method(self.manager, "__init__")
        reached: set[int] = set()
        if init is not None:
            info, method = init
            self._walk(method, info.file, _Context(None, (), ()), starts, set(), 0)
            reached = {id(s.call) for s in starts}
        else:
            self.gaps.append(f"{self.manager} has no __init__: no thread is known to start with it")
        # Thread calls in manager methods that __init__ does not reach: started lazily, if at all.
        for info in self.mro:
            for name, method in info.methods.items():
                resolved = self.index.find_method(self.manager, name)
                if resolved is None or resolved[1] is not method:
                    continue  # overridden further down
                if not self._called_for_backend(name):
                    continue  # never called for this manager (common code another backend uses)
                for node in _own_nodes(method):
                    if isinstance(node, ast.Call) and id(node) in self.thread_calls and id(node) not in reached:
                        context = self._context(node, method, info.file, _Context(None, (), ()))
                        starts.append(_Start(node, info.file, method, context, LAZY))
        rows: list[ExpectedThread] = []
        for start in starts:
            rows.extend(self._rows(start))
        rows = _merge_same_call(rows)
        rows.sort(key=lambda r: (ROLES.index(r.role), r.source.rsplit(":", 1)[0], int(r.source.rsplit(":", 1)[1])))
        return rows

    def _called_for_backend(self, name: str) -> bool:
        """Whether anything of this manager's classes, or of the backend's own file, calls ``name``."""
        mro_names = {info.name for info in self.mro}
        for call, parsed in self.index.calls_by_name.get(name, []):
            owner = self.index.enclosing_class(call, parsed)
            if (owner is not None and owner.name in mro_names) or parsed.relpath.split("/")[0] == self.backend:
                return True
        return False

    def _walk(self, function: ast.FunctionDef, parsed: ParsedFile, context: _Context, out: list[_Start],
              seen: set, depth: int) -> None:
        key = (id(function), context.role, context.conditions, context.loops)
        if key in seen or depth > MAX_DEPTH:
            return
        seen.add(key)
        for node in _own_nodes(function):
            if not isinstance(node, ast.Call):
                continue
            if id(node) in self.thread_calls:
                out.append(_Start(node, parsed, function, self._context(node, function, parsed, context), INIT))
                continue
            callee = self._callee(node, function, parsed)
            if callee is not None:
                info, method = callee
                self._walk(method, info.file, self._context(node, function, parsed, context), out, seen, depth + 1)

    def _callee(self, call: ast.Call, function: ast.FunctionDef, parsed: ParsedFile):
        func = call.func
        if not isinstance(func, ast.Attribute):
            return None
        if isinstance(func.value, ast.Name) and func.value.id == "self":
            return self.index.find_method(self.manager, func.attr)
        if isinstance(func.value, ast.Call) and ast.unparse(func.value.func) == "super":
            owner = self.index.enclosing_class(function, parsed)
            names = [info.name for info in self.mro]
            if owner is None or owner.name not in names:
                return None
            for info in self.mro[names.index(owner.name) + 1:]:
                if func.attr in info.methods:
                    return info, info.methods[func.attr]
        return None

    def _context(self, node: ast.AST, function: ast.FunctionDef, parsed: ParsedFile, outer: _Context) -> _Context:
        """The role, conditions and loops between ``node`` and ``function``, added to ``outer``'s."""
        role = None
        conditions: list[tuple[str, object]] = []
        loops: list[tuple[str, object, tuple[str, ...]]] = []
        child: ast.AST = node
        current = parsed.parents.get(node)
        while current is not None and current is not function:
            if isinstance(current, ast.If) and (child in current.body or child in current.orelse):
                in_body = child in current.body
                test = ast.unparse(current.test)
                modes = [m for m in ("PREFILL", "DECODE") if f"DisaggregationMode.{m}" in test]
                if len(modes) == 1:
                    if role is None:
                        mode = modes[0]
                        negated = "!=" in test or " not " in f" {test} "
                        if in_body == negated:
                            mode = "DECODE" if mode == "PREFILL" else "PREFILL"
                        role = PREFILL if mode == "PREFILL" else DECODE
                else:
                    value = self._truth(current.test, function, parsed)
                    if not in_body:
                        test = f"not ({test})"
                        value = UNKNOWN if value is UNKNOWN else not value
                    conditions.append((test, value))
            elif isinstance(current, ast.For) and child in current.body:
                self.used_env = set()
                length = self._length(current.iter, function, parsed, 0)
                loops.append((ast.unparse(current.iter), length, tuple(sorted(self.used_env))))
            elif isinstance(current, ast.While) and child in current.body:
                loops.append((f"while {ast.unparse(current.test)}", UNKNOWN, ()))
            child = current
            current = parsed.parents.get(current)
        return _Context(
            outer.role or role,
            outer.conditions + tuple(reversed(conditions)),
            outer.loops + tuple(reversed(loops)),
        )

    # ------------------------------------------------------------------ values under defaults

    def _env(self, name: str, default: object) -> object:
        self.used_env.add(name)
        if name in self.env:
            raw = self.env[name]
            if isinstance(default, bool):
                return raw.strip().lower() in ("1", "true", "yes", "y", "on")
            if isinstance(default, int) or default is None:
                try:
                    return int(raw)
                except ValueError:
                    return UNKNOWN
            return raw
        return default

    def _value(self, expr: ast.expr, function: ast.FunctionDef, parsed: ParsedFile, depth: int) -> object:
        if depth > MAX_DEPTH:
            return UNKNOWN
        if isinstance(expr, ast.Constant):
            return expr.value
        if isinstance(expr, ast.Call):
            func = expr.func
            # envs.NAME.get()
            if isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Attribute) \
                    and func.value.attr.startswith("SGLANG"):
                name = func.value.attr
                return self._env(name, self.defaults.get(name, UNKNOWN))
            site = call_site_default(expr)
            if site is not None:
                return self._env(*site)
            name = ast.unparse(func)
            if name in ("max", "min") and expr.args and not expr.keywords:
                values = [self._value(a, function, parsed, depth + 1) for a in expr.args]
                if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                    return max(values) if name == "max" else min(values)
                return UNKNOWN
            if name in ("int", "bool") and expr.args:
                inner = self._value(expr.args[0], function, parsed, depth + 1)
                if inner is UNKNOWN or inner is None:
                    return UNKNOWN
                try:
                    return int(inner) if name == "int" else bool(inner)
                except (TypeError, ValueError):
                    return UNKNOWN
            return UNKNOWN
        if isinstance(expr, ast.BoolOp):
            values = [self._truth(v, function, parsed, depth + 1) for v in expr.values]
            if isinstance(expr.op, ast.Or):
                return True if True in values else (UNKNOWN if UNKNOWN in values else False)
            return False if False in values else (UNKNOWN if UNKNOWN in values else True)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            value = self._truth(expr.operand, function, parsed, depth + 1)
            return UNKNOWN if value is UNKNOWN else not value
        if _is_self_attribute(expr) or isinstance(expr, ast.Name):
            return self._through_assignments(expr, function, parsed, depth, self._value)
        return UNKNOWN

    def _through_assignments(self, expr: ast.expr, function: ast.FunctionDef, parsed: ParsedFile, depth: int,
                             evaluate) -> object:
        """``evaluate`` on what ``self.x`` (any method's assignment) or a local name was assigned."""
        if _is_self_attribute(expr):
            assigned = self.self_assignments.get(expr.attr, [])
        else:
            assigned = [(node.value, function, parsed) for node in ast.walk(function)
                        if isinstance(node, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets)]
        for value, method, file in assigned:
            found = evaluate(value, method, file, depth + 1)
            if found is not UNKNOWN:
                return found
        return UNKNOWN

    def _truth(self, expr: ast.expr, function: ast.FunctionDef, parsed: ParsedFile, depth: int = 0) -> object:
        value = self._value(expr, function, parsed, depth)
        return UNKNOWN if value is UNKNOWN else bool(value)

    def _length(self, expr: ast.expr, function: ast.FunctionDef, parsed: ParsedFile, depth: int) -> object:
        if depth > MAX_DEPTH:
            return UNKNOWN
        if isinstance(expr, ast.List | ast.Tuple) and not any(isinstance(e, ast.Starred) for e in expr.elts):
            return len(expr.elts)
        if isinstance(expr, ast.Call):
            name = ast.unparse(expr.func)
            if name == "range" and len(expr.args) == 1:
                value = self._value(expr.args[0], function, parsed, depth + 1)
                return value if isinstance(value, int) and not isinstance(value, bool) else UNKNOWN
            if name in ("enumerate", "list", "tuple", "reversed") and expr.args:
                return self._length(expr.args[0], function, parsed, depth + 1)
            if name == "zip" and expr.args:
                lengths = [self._length(a, function, parsed, depth + 1) for a in expr.args]
                return UNKNOWN if UNKNOWN in lengths else min(lengths)  # type: ignore[type-var]
            return UNKNOWN
        if isinstance(expr, ast.ListComp) and len(expr.generators) == 1 and not expr.generators[0].ifs:
            return self._length(expr.generators[0].iter, function, parsed, depth + 1)
        if _is_self_attribute(expr) or isinstance(expr, ast.Name):
            return self._through_assignments(expr, function, parsed, depth, self._length)
        return UNKNOWN

    # ------------------------------------------------------------------ rows

    def _rows(self, start: _Start) -> list[ExpectedThread]:
        call, parsed, context = start.call, start.parsed, start.context
        target_node = next(k.value for k in call.keywords if k.arg == "target")
        target = ast.unparse(target_node).split(".")[-1]
        shown, pattern = _name_pattern(call, target)
        owner = self.index.enclosing_class(start.function, parsed)
        starter = f"{owner.name}.{start.function.name}" if owner else start.function.name
        target_source = None
        if isinstance(target_node, ast.Name):
            local = local_defs(start.function).get(target_node.id)
            if local is not None:
                target_source = f"{DISAGGREGATION}/{parsed.relpath}:{local.lineno}"
        elif isinstance(target_node, ast.Attribute):
            found = self.index.find_method(self.manager, target_node.attr)
            if found is not None:
                target_source = f"{DISAGGREGATION}/{found[0].file.relpath}:{found[1].lineno}"
        count: int | None = 1
        count_parts = []
        for text, length, _names in context.loops:
            if length is UNKNOWN or not isinstance(length, int):
                count = None
                count_parts.append(f"len({text}) = ?")
            else:
                if count is not None:
                    count *= length
                count_parts.append(f"len({text}) = {length}")
        count_expr = " x ".join(count_parts) or "1"
        env_note = self._env_note(context)
        if env_note:
            count_expr += f" ({env_note})"
        condition = None
        default_on: object = True
        if context.conditions:
            condition = " and ".join(text for text, _ in context.conditions)
            values = [value for _, value in context.conditions]
            default_on = False if False in values else (UNKNOWN if UNKNOWN in values else True)
            condition += f" (default: {'unknown' if default_on is UNKNOWN else default_on})"
        if start.started == LAZY:
            min_count, max_count, default_count = 0, None, None
        elif context.conditions:
            min_count, max_count = 0, count
            default_count = None if default_on is UNKNOWN or count is None else (count if default_on else 0)
        else:
            min_count = count if count is not None else 0
            max_count = count
            default_count = count
        roles = [context.role] if context.role else list(ROLES)
        if start.started == LAZY and context.role is None:
            roles = list(ROLES)
        return [
            ExpectedThread(
                role=role,
                backend=self.backend,
                release=self.source.version,
                logical_name=_logical_name(target),
                target=target,
                thread_name=shown,
                name_pattern=pattern,
                daemon=daemon_flag(call, start.function),
                started=start.started,
                min_count=min_count,
                max_count=max_count,
                default_count=default_count,
                count_expr=count_expr,
                condition=condition,
                source=f"{DISAGGREGATION}/{parsed.relpath}:{call.lineno}",
                target_source=target_source,
                starter=starter,
            )
            for role in roles
        ]

    def _env_note(self, context: _Context) -> str:
        """Which environment variables the loop lengths came from, with the values used."""
        names: list[str] = []
        for _text, _length, read in context.loops:
            names.extend(n for n in read if n not in names)
        notes = []
        for name in names:
            value = self.env.get(name, self.defaults.get(name, UNKNOWN))
            origin = "set" if name in self.env else "default"
            notes.append(f"{name} {origin} {'?' if value is UNKNOWN else value}")
        return ", ".join(notes)


def _merge_same_call(rows: list[ExpectedThread]) -> list[ExpectedThread]:
    """One row per role and Thread(...) call: a starter reached twice starts its threads twice."""
    merged: dict[tuple[str, str], ExpectedThread] = {}
    for row in rows:
        key = (row.role, row.source)
        if key not in merged:
            merged[key] = row
            continue
        first = merged[key]

        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else a + b

        merged[key] = replace(
            first,
            min_count=first.min_count + row.min_count,
            max_count=add(first.max_count, row.max_count),
            default_count=add(first.default_count, row.default_count),
            count_expr=f"{first.count_expr} + {row.count_expr}",
            condition=first.condition if first.condition == row.condition else
            " | ".join(c or "always" for c in (first.condition, row.condition)),
            started=INIT if INIT in (first.started, row.started) else LAZY,
        )
    return list(merged.values())


def _own_nodes(function: ast.FunctionDef):
    """The nodes of ``function`` outside any nested function, lambda or class (what runs when it is called)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))
