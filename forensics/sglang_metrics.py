"""The Prometheus metrics one sglang release declares, read from that release's own source.

No hand-kept table: names, types, documentation, label names and buckets come from the
metric constructors (``Gauge(name="sglang:...", documentation=..., labelnames=...)``)
in the release's tree, parsed with ``ast`` (the code is never imported: it needs torch).

Three collectors are read, the ones a PD engine started with ``--enable-metrics``
registers whatever its model and flags:

* ``scheduler``: ``SchedulerMetricsCollector.__init__`` (``metrics/collector.py`` up to
  0.5.9, ``observability/metrics_collector.py`` from 0.5.10), with the methods it calls;
* ``tokenizer``: ``TokenizerMetricsCollector.__init__`` in the same file;
* ``http``: the function that declares ``sglang:http_requests_total`` (the HTTP middleware,
  ``utils/common.py`` from 0.5.7, ``observability/http_request_metrics.py`` in 0.5.23).

``labels.keys()`` in a declaration is the collector's label set, read from the dict literal
sglang builds at the collector's call site (``labels = {"model_name": ..., ...}``); keys it
adds only under a condition (``dp_rank``, ``priority``, custom labels) are left out, as for a
TP=1, no-DP engine without priority scheduling.

A declaration nested under an ``if`` (LoRA, HiCache, streaming sessions, token histograms,
expert balancedness, ...) is kept with ``conditional=True``: a default engine does not
register it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache

from forensics import sglang_source

COLLECTOR_FILES = ("sglang/srt/observability/metrics_collector.py", "sglang/srt/metrics/collector.py")
COLLECTOR_CLASSES = {"scheduler": "SchedulerMetricsCollector", "tokenizer": "TokenizerMetricsCollector"}
LABEL_DIRS = ("managers", "observability", "metrics")
HTTP_ANCHOR = "sglang:http_requests_total"
# prometheus_client's classes, by the names sglang calls them (``Counter = self._counter_cls or
# _PromCounter`` from 0.5.15 keeps the plain names too).
KINDS = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram", "Summary": "summary",
         "_PromGauge": "gauge", "_PromCounter": "counter", "_PromHistogram": "histogram", "_PromSummary": "summary"}
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


class MetricSourceError(sglang_source.SourceError):
    """A release's metric declarations could not be read; the message names the file and line."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric family as the release declares it."""

    name: str  # as declared: "sglang:num_transfer_failed_reqs_total" (0.5.1: without "_total")
    kind: str  # "gauge", "counter", "histogram" or "summary"
    documentation: str
    labelnames: tuple[str, ...]
    collector: str  # "scheduler", "tokenizer" or "http"
    attribute: str | None  # the collector attribute it is bound to (self.<attribute> = ...)
    buckets: tuple[float, ...] | None  # literal buckets of a histogram; None: not a literal
    conditional: bool  # declared under an ``if``: a default engine does not register it
    path: str  # relative to the release root
    line: int
    # prometheus_client's multiprocess_mode as declared (sglang runs it in multiprocess mode): a
    # gauge in mode "all" (the Gauge default) is exported with a ``pid`` label per process. Wrappers
    # (GaugeHistogram) default to "mostrecent"; "" for kinds other than gauge.
    multiprocess_mode: str = ""
    # A wrapper's ``bucket_bounds`` (GaugeHistogram: one child per (gt, le] bucket), when literal.
    bucket_bounds: tuple[float, ...] | None = None

    @property
    def family(self) -> str:
        """The name prometheus_client exposes the family under (a counter's ``_total`` dropped)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


@dataclass(frozen=True)
class ReleaseMetrics:
    version: str
    specs: tuple[MetricSpec, ...]
    labels: dict  # collector -> tuple of label names ({"scheduler": (...), "tokenizer": (...)})
    # The scheduler collector's attributes that ``log_stats`` and ``emit_constants`` write outside
    # any ``if`` (what every stats tick and the start-up write); None when the release has neither.
    tick_written: frozenset[str] | None = None

    def registered(self) -> tuple[MetricSpec, ...]:
        """What a default PD engine of this release registers (the unconditional declarations)."""
        return tuple(s for s in self.specs if not s.conditional)

    def find(self, *names: str, collector: str | None = None) -> MetricSpec | None:
        """The registered metric with one of ``names`` (``_total`` on counters optional), or None."""
        wanted = {n.removesuffix("_total") for n in names}
        for spec in self.registered():
            if spec.name.removesuffix("_total") in wanted and collector in (None, spec.collector):
                return spec
        return None

    def names(self) -> set[str]:
        return {s.name for s in self.registered()}


# ----------------------------------------------------------------------------- reading


class _Unresolved(Exception):
    pass


def _names(node: ast.AST, env: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Evaluate a ``labelnames`` expression: ``labels.keys()``, ``list(x) + [...]``, ``[*x, "k"]``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _Unresolved(node.id)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "keys" and not node.args:
            return _names(func.value, env)
        if isinstance(func, ast.Name) and func.id in ("list", "tuple") and len(node.args) == 1:
            return _names(node.args[0], env)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _names(node.left, env) + _names(node.right, env)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        out: tuple[str, ...] = ()
        for element in node.elts:
            out += _names(element.value if isinstance(element, ast.Starred) else element, env)
        return out
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        # ``extra_labels = extra_labels or {}``: a parameter that defaults to None, so the fallback
        return _names(node.values[-1], env)
    if isinstance(node, ast.Dict):
        out = ()
        for key, value in zip(node.keys, node.values, strict=True):
            out += _names(value, env) if key is None else _names(key, env)
        return out
    raise _Unresolved(ast.unparse(node))


def _text(node: ast.AST | None) -> str:
    if node is None:
        return ""
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return ast.unparse(node)
    return value if isinstance(value, str) else ast.unparse(node)


def _literal_assignments(func: ast.AST) -> dict[str, object]:
    """``name = <literal>`` anywhere in ``func`` (the first one wins): bucket lists held in locals."""
    found: dict[str, object] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found.setdefault(node.targets[0].id, ast.literal_eval(node.value))
            except (ValueError, SyntaxError, TypeError):
                continue
    return found


def _module_literals(tree: ast.Module) -> dict[str, object]:
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError):
                continue
    return found


def _buckets(node: ast.AST | None, literals: dict[str, object]) -> tuple[float, ...] | None:
    if node is None:
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        value = literals.get(node.id) if isinstance(node, ast.Name) else None
    if isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value):
        return tuple(float(v) for v in value)
    return None


def _callee(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _argument(node: ast.Call, keyword: str, position: int) -> ast.AST | None:
    for kw in node.keywords:
        if kw.arg == keyword:
            return kw.value
    return node.args[position] if len(node.args) > position else None


class _Reader:
    """Reads the metric declarations of one file's collector scopes."""

    def __init__(self, source: sglang_source.SglangSource, relative: str,
                 wrappers: dict[str, tuple[str, ast.AST | None]]):
        self.relative = relative
        self.tree = ast.parse(source.read(relative), filename=relative)
        self.literals = _module_literals(self.tree)
        self.wrappers = wrappers
        self.specs: list[MetricSpec] = []

    def scope(self, func: ast.AST, collector: str, env: dict[str, tuple[str, ...]],
              methods: dict[str, ast.FunctionDef] | None = None, conditional: bool = False,
              seen: set[str] | None = None) -> None:
        literals = {**self.literals, **_literal_assignments(func)}
        env = dict(env)
        for statement in func.body:  # local label lists (``extra_label_names = list(extra_labels.keys())``)
            if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)):
                try:
                    env[statement.targets[0].id] = _names(statement.value, env)
                except _Unresolved:
                    continue
        seen = seen if seen is not None else {getattr(func, "name", "")}
        for statement in func.body:
            self._statement(statement, collector, env, literals, methods or {}, conditional, seen)

    def _statement(self, node, collector, env, literals, methods, conditional, seen) -> None:
        if isinstance(node, _NESTED):
            return
        if isinstance(node, ast.If | ast.For | ast.AsyncFor | ast.While):
            for child in node.body + node.orelse:
                self._statement(child, collector, env, literals, methods, True, seen)
            self._calls(node.test if isinstance(node, ast.If | ast.While) else node.iter, collector, env, literals,
                        methods, conditional, seen, None)
            return
        if isinstance(node, ast.Try | ast.With | ast.AsyncWith):
            for child in node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []):
                self._statement(child, collector, env, literals, methods, conditional, seen)
            for handler in getattr(node, "handlers", []):
                for child in handler.body:
                    self._statement(child, collector, env, literals, methods, True, seen)
            return
        attribute = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                attribute = target.attr
            elif isinstance(target, ast.Name):
                attribute = target.id
        self._calls(node, collector, env, literals, methods, conditional, seen, attribute)

    def _calls(self, node, collector, env, literals, methods, conditional, seen, attribute) -> None:
        stack = [node]
        while stack:
            current = stack.pop()
            if isinstance(current, _NESTED):
                continue
            if isinstance(current, ast.Call):
                spec = self._declaration(current, collector, env, literals, conditional, attribute)
                if spec is not None:
                    self.specs.append(spec)
                    continue
                func = current.func
                # self._init_xxx(...) from __init__: its declarations are the collector's too
                if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
                        and func.attr in methods and func.attr not in seen):
                    seen.add(func.attr)
                    self.scope(methods[func.attr], collector, env, methods, conditional, seen)
            stack.extend(ast.iter_child_nodes(current))

    def _declaration(self, node: ast.Call, collector, env, literals, conditional, attribute) -> MetricSpec | None:
        name = _argument(node, "name", 0)
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("sglang:")):
            return None
        callee = _callee(node)
        labelnames_node = _argument(node, "labelnames", 2)
        if callee in KINDS:
            kind, extra = KINDS[callee], None
        elif callee in self.wrappers:
            kind, extra = self.wrappers[callee]
        else:
            raise MetricSourceError(f"{self.relative}:{node.lineno}: {name.value} is made by {callee!r}, "
                                    "not a prometheus_client class this reader knows")
        try:
            labelnames = _names(labelnames_node, env) if labelnames_node is not None else ()
            if extra is not None:
                labelnames = _names(extra, {**env, "labelnames": labelnames})
        except _Unresolved as missing:
            raise MetricSourceError(f"{self.relative}:{node.lineno}: labelnames of {name.value} use "
                                    f"{missing}, which this reader cannot evaluate") from None
        mode_node = _argument(node, "multiprocess_mode", 99)
        if isinstance(mode_node, ast.Constant) and isinstance(mode_node.value, str):
            mode = mode_node.value
        else:  # the wrapper's own default (GaugeHistogram: "mostrecent"), or Gauge's ("all")
            mode = ("mostrecent" if extra is not None else "all") if kind == "gauge" else ""
        bounds_node = _argument(node, "bucket_bounds", 99) if extra is not None else None
        return MetricSpec(
            name=name.value, kind=kind, documentation=_text(_argument(node, "documentation", 1)),
            labelnames=tuple(labelnames), collector=collector, attribute=attribute,
            buckets=_buckets(_argument(node, "buckets", 3), literals) if kind == "histogram" else None,
            conditional=conditional, path=self.relative, line=node.lineno, multiprocess_mode=mode,
            bucket_bounds=_buckets(bounds_node, literals) if bounds_node is not None else None)


def _wrappers(source: sglang_source.SglangSource, tree: ast.Module) -> dict[str, tuple[str, ast.AST | None]]:
    """Classes the collector imports from sglang that wrap one prometheus metric (``GaugeHistogram``):
    name -> (the wrapped kind, the inner ``labelnames`` expression over the outer ``labelnames``)."""
    found: dict[str, tuple[str, ast.AST | None]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang.")):
            continue
        relative = node.module.replace(".", "/") + ".py"
        if not (source.root / relative).is_file():
            continue
        wanted = {alias.name for alias in node.names}
        module = ast.parse(source.read(relative))
        for cls in module.body:
            if not (isinstance(cls, ast.ClassDef) and cls.name in wanted):
                continue
            for call in ast.walk(cls):
                if (isinstance(call, ast.Call) and _callee(call) in KINDS
                        and isinstance(_argument(call, "name", 0), ast.Name)):
                    found[cls.name] = (KINDS[_callee(call)], _argument(call, "labelnames", 2))
                    break
    return found


def _label_dicts(source: sglang_source.SglangSource) -> dict[str, tuple[str, ...]]:
    """The collectors' label names, from ``labels = {"model_name": ..., ...}`` at their call sites."""
    found: dict[str, set[tuple[str, ...]]] = {"scheduler": set(), "tokenizer": set()}
    # Only where the engine's collectors are built: the encoder server (disaggregation/) builds
    # its own, with other labels.
    paths = [p for d in LABEL_DIRS for p in sorted((source.srt / d).rglob("*.py"))]
    for path in paths:
        text = source.verified_read_bytes(path).decode("utf-8", errors="replace")
        if "MetricsCollector" not in text or '"model_name"' not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            value = None
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "labels" for t in node.targets):
                value = node.value
            elif isinstance(node, ast.keyword) and node.arg == "labels":
                value = node.value
            if not isinstance(value, ast.Dict) or not value.keys:
                continue
            if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys):
                continue
            keys = tuple(k.value for k in value.keys)
            if "model_name" in keys:
                found["scheduler" if "tp_rank" in keys else "tokenizer"].add(keys)
    out = {}
    for collector, candidates in found.items():
        if len(candidates) != 1:
            raise MetricSourceError(f"sglang {source.version}: {len(candidates)} label sets for the {collector} "
                                    f"collector ({sorted(candidates)}); expected one")
        out[collector] = next(iter(candidates))
    return out


@cache
def release_metrics(version: str) -> ReleaseMetrics:
    """Every metric the scheduler, tokenizer and HTTP collectors of ``version`` declare (cached)."""
    source = sglang_source.fetch(version)
    return read_tree(source)


def read_tree(source: sglang_source.SglangSource) -> ReleaseMetrics:
    root = source.root
    relative = next((f for f in COLLECTOR_FILES if (root / f).is_file()), None)
    if relative is None:
        raise MetricSourceError(f"sglang {source.version} at {root} has none of {', '.join(COLLECTOR_FILES)}")
    labels = _label_dicts(source)
    written: frozenset[str] | None = None
    collector_tree = ast.parse(source.read(relative))
    reader = _Reader(source, relative, _wrappers(source, collector_tree))
    classes = {n.name: n for n in reader.tree.body if isinstance(n, ast.ClassDef)}
    for collector, class_name in COLLECTOR_CLASSES.items():
        cls = classes.get(class_name)
        if cls is None:
            raise MetricSourceError(f"sglang {source.version}: {relative} has no class {class_name}")
        methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
        reader.scope(methods["__init__"], collector, {"labels": labels[collector]}, methods)
        if collector == "scheduler":
            written = _unconditional_writes([methods[m] for m in TICK_METHODS if m in methods])
    specs = list(reader.specs)
    specs += _http_specs(source)
    return ReleaseMetrics(version=source.version, specs=tuple(specs), labels=labels, tick_written=written)


# The scheduler collector's methods a default engine calls on every stats tick and once at start.
TICK_METHODS = ("log_stats", "emit_constants")


def _unconditional_writes(functions: list[ast.FunctionDef]) -> frozenset[str] | None:
    """``self.<attr>`` written in ``functions`` outside any ``if``/loop: the first argument of a
    ``self._log_*`` helper, or the receiver of ``.labels``/``.set``/``.set_by_current_observations``."""
    if not functions:
        return None
    found: set[str] = set()

    def self_attribute(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr
        return None

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.If, ast.For, ast.While, ast.Try, *_NESTED)):
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            helper = self_attribute(node.func)
            if helper and helper.startswith("_log_") and node.args:
                attr = self_attribute(node.args[0])
                if attr:
                    found.add(attr)
            elif node.func.attr in ("labels", "set", "set_by_current_observations", "set_raw"):
                attr = self_attribute(node.func.value)
                if attr:
                    found.add(attr)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for function in functions:
        for statement in function.body:
            visit(statement)
    return frozenset(found)


def _http_specs(source: sglang_source.SglangSource) -> list[MetricSpec]:
    """The HTTP middleware's metrics: every declaration in the function that declares the anchor."""
    for path in sorted(source.srt.rglob("*.py")):
        # a cheap byte test first; the one file that holds the anchor is read through the verified path
        if HTTP_ANCHOR.encode() not in path.read_bytes():
            continue
        relative = str(path.relative_to(source.root))
        reader = _Reader(source, relative, {})
        for func in ast.walk(reader.tree):
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) and HTTP_ANCHOR in ast.unparse(func):
                inner = [f for f in ast.walk(func) if f is not func and isinstance(f, ast.FunctionDef)
                         and HTTP_ANCHOR in ast.unparse(f)]
                if inner:
                    continue  # the innermost function that holds it (a class's __init__ in 0.5.23)
                reader.scope(func, "http", {})
                return reader.specs
    return []
