"""The twin's informational endpoints, shaped by the release's own source.

Which of ``/v1/models``, ``/model_info``, ``/get_model_info``, ``/server_info``,
``/get_server_info``, ``/v1/loads`` and ``/get_load`` an engine serves, and the keys of
each answer, are read at twin start from the twin's copy of the release (``ast``, never
imported: sglang's modules pull in torch). Nothing here is a per-release table:

* routes: the ``@app.get(...)`` decorators of ``entrypoints/http_server.py`` and, when
  that file includes it, the ``@router.get(...)`` of ``entrypoints/v1_loads.py``; the
  deprecation ``logger.warning`` a handler starts with is logged when it is called;
* ``/model_info``: the keys of the dict literal its handler returns;
* ``/v1/models`` and ``/v1/models/<name>``: the fields (and defaults) of ``ModelCard`` and
  ``ModelList`` in ``entrypoints/openai/protocol.py``, the keywords ``available_models``
  passes, the error ``retrieve_model`` answers for another name;
* ``/server_info``: the ``ServerArgs`` fields with their defaults (``server_args.py``; from
  0.5.21 the namespace structs of ``arg_groups/fields/``), the scheduler's
  ``{"status": "ready", ...}`` dict, the literal keys of the handler's dict and of the
  helper it spreads (0.5.21+ ``build_server_info``), and per DP rank the keys
  ``Scheduler.get_internal_state`` always sets;
* ``/v1/loads``: the envelope keys of ``get_loads``, the fields of ``GetLoadsReqOutput``
  (0.5.19+ ``LoadSnapshot``: core keys and sections), ``DisaggregationMetrics``' fields,
  ``VALID_SECTIONS``, the sums and means of ``_compute_aggregate`` (0.5.8-0.5.12);
  ``/get_load``: the keys its handler builds (0.5.12+) or ``GetLoadReqOutput``'s fields.

The values come from the twin (its queues, pools, settings) by key name; a key the twin
has no value for is answered ``None`` and listed in :attr:`ReleaseEndpoints.unknown`,
which the engines report in their twin state (``endpoint_keys_unknown``) and the tests
keep empty. A route the release does not register is not registered here either:
aiohttp answers 404, with FastAPI's body.
"""

from __future__ import annotations

import ast
import functools
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger("sglang.srt.entrypoints.http_server")

MODEL = "twin-synthetic"  # the twin's model: what wire.py writes in every OpenAI answer's "model"
RETRIEVE_MODEL = "/v1/models/{model:path}"  # FastAPI's path parameter, as the release writes it
INFO_ROUTES = ("/v1/models", RETRIEVE_MODEL, "/model_info", "/get_model_info", "/server_info", "/get_server_info",
               "/v1/loads", "/get_load")
REQUIRED = object()  # a field without a default
FACTORY = object()  # a field with a default_factory (ModelCard.created: the time of the answer)

SRT = Path("sglang/srt")
HTTP_SERVER = SRT / "entrypoints/http_server.py"
V1_LOADS = SRT / "entrypoints/v1_loads.py"
PROTOCOL = SRT / "entrypoints/openai/protocol.py"
SERVER_ARGS = SRT / "server_args.py"
ARG_FIELDS = SRT / "arg_groups/fields"
SCHEDULER = SRT / "managers/scheduler.py"
# TokenizerManager's methods: in its own file, from 0.5.2 partly in a mixin
TOKENIZER_MANAGER = (SRT / "managers/tokenizer_manager.py", SRT / "managers/tokenizer_communicator_mixin.py")
LOAD_CLASSES = (SRT / "managers/io_struct.py", SRT / "managers/load_snapshot.py")


# --------------------------------------------------------------------------- reading the source


@functools.cache
def _module(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError):
        return None


def _functions(module: ast.Module | None) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    if module is None:
        return {}
    return {n.name: n for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _get_routes(module: ast.Module | None, owner: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """``@owner.get("/p")`` (and ``@owner.api_route("/p", methods=[..."GET"...])``) -> handler."""
    routes = {}
    for fn in _functions(module).values():
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                    and isinstance(dec.func.value, ast.Name) and dec.func.value.id == owner and dec.args
                    and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
                continue
            if dec.func.attr == "get":
                routes[dec.args[0].value] = fn
            elif dec.func.attr == "api_route":
                methods = next((k.value for k in dec.keywords if k.arg == "methods"), None)
                if methods is not None and "GET" in ast.literal_eval(methods):
                    routes[dec.args[0].value] = fn
    return routes


def _includes_v1_loads(module: ast.Module | None) -> bool:
    """http_server.py does ``app.include_router(v1_loads_router)`` (0.5.8+)."""
    if module is None:
        return False
    for node in ast.walk(module):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "include_router"
                and node.args and isinstance(node.args[0], ast.Name) and "loads" in node.args[0].id):
            return True
    return False


def _str_keys(node: ast.Dict) -> tuple[str, ...]:
    return tuple(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))


def _dicts(fn: ast.AST) -> list[ast.Dict]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Dict) and _str_keys(n)]


def _returned_dict(fn, functions: dict) -> ast.Dict | None:
    """The dict literal a handler answers with, following ``return await other()`` within the module."""
    found = _dicts(fn)
    if found:
        return max(found, key=lambda d: len(d.keys))
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions \
                and node.func.id != fn.name:
            return _returned_dict(functions[node.func.id], functions)
    return None


def _imported_function(root: Path, module: ast.Module, name: str, package: str = "", depth: int = 0):
    """The definition of ``name`` that ``module`` imports (``from sglang.srt.utils import name``),
    through a package's ``__init__`` re-export (``from x import *``, ``from .y import name``) if need be."""
    for node in module.body if depth < 4 else ():
        if not (isinstance(node, ast.ImportFrom) and any(a.name in (name, "*") for a in node.names)):
            continue  # ("*": sglang/srt/utils/__init__.py re-exports utils/common.py so)
        dotted = node.module or ""
        if node.level:  # relative to the importing package
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            dotted = ".".join(base + ([dotted] if dotted else []))
        for path, pkg in ((root / (dotted.replace(".", "/") + ".py"), dotted.rpartition(".")[0]),
                          (root / dotted.replace(".", "/") / "__init__.py", dotted)):
            target = _module(path) if path.is_file() else None
            found = target and (_functions(target).get(name) or _imported_function(root, target, name, pkg, depth + 1))
            if found:
                return found
    return None


def _spread_keys(root: Path, module: ast.Module, found: ast.Dict) -> tuple[str, ...]:
    """Keys a ``**helper(...)`` spread adds beyond the server args and scheduler info (0.5.21+'s
    ``build_server_info``: ``result["k"] = ...``)."""
    keys: list[str] = []
    for key, value in zip(found.keys, found.values, strict=True):
        if key is None and isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            fn = _functions(module).get(value.func.id) or _imported_function(root, module, value.func.id)
            for node in ast.walk(fn) if fn is not None else ():
                if isinstance(node, ast.Assign):
                    keys += [t.slice.value for t in node.targets if isinstance(t, ast.Subscript)
                             and isinstance(t.value, ast.Name) and isinstance(t.slice, ast.Constant)]
    return tuple(keys)


def _deprecation(fn) -> str | None:
    """The message of a ``logger.warning("...")`` the handler starts with (a deprecated name)."""
    for stmt in fn.body[:3]:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "warning"
                and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
            return call.args[0].value
    return None


def _default(value: ast.expr | None) -> Any:
    if value is None:
        return REQUIRED
    if isinstance(value, ast.Call):  # Field(...), field(...), msgspec.field(...)
        for kw in value.keywords:
            if kw.arg == "default":
                return _default(kw.value)
            if kw.arg == "default_factory":
                return FACTORY
        if value.args:
            return _default(value.args[0])
        return REQUIRED
    try:
        literal = ast.literal_eval(value)
        # JSON has no tuples or sets: answer them as lists, as sglang's JSON encoder does.
        return sorted(literal, key=repr) if isinstance(literal, (set, frozenset)) else (
            list(literal) if isinstance(literal, tuple) else literal)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None  # an expression the twin cannot evaluate (a computed default): null


def _class_fields(root: Path, files: tuple[Path, ...], name: str) -> tuple[dict[str, Any], dict[str, str], str]:
    """(field -> default, field -> annotation text, "file:line") of class ``name`` in the first file holding it."""
    for rel in files:
        module = _module(root / rel)
        for node in (module.body if module else []):
            if isinstance(node, ast.ClassDef) and node.name == name:
                fields, notes = {}, {}
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        fields[stmt.target.id] = _default(stmt.value)
                        notes[stmt.target.id] = ast.unparse(stmt.annotation)
                return fields, notes, f"{rel}:{node.lineno}"
    return {}, {}, ""


def _class_constant(root: Path, files: tuple[Path, ...], cls: str, name: str) -> Any:
    for rel in files:
        module = _module(root / rel)
        for node in (module.body if module else []):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for stmt in node.body:
                    if (isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                              for t in stmt.targets)):
                        for sub in ast.walk(stmt.value):
                            if isinstance(sub, ast.Set):
                                return frozenset(ast.literal_eval(sub))
    return None


def server_arg_fields(root: Path) -> dict[str, Any]:
    """``ServerArgs``' fields and defaults; from 0.5.21 its fields live in the namespace structs of
    ``arg_groups/fields/*.py``, which ``ServerArgs.resolved_dict`` flattens by field name."""
    fields = _class_fields(root, (SERVER_ARGS,), "ServerArgs")[0]
    if fields:
        return fields
    for path in sorted((root / ARG_FIELDS).glob("*.py")):
        module = _module(path)
        for node in (module.body if module else []):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                fields.update({k: v for k, v in _class_fields(root, (path.relative_to(root),), node.name)[0].items()
                               if not k.startswith("_")})  # private bookkeeping, not a server arg
    return fields


def _ready_keys(root: Path) -> tuple[str, ...]:
    """The keys of the scheduler's ``{"status": "ready", ...}`` (what ``/server_info`` spreads in)."""
    module = _module(root / SCHEDULER)
    for node in ast.walk(module) if module else []:
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "status" and isinstance(v, ast.Constant) \
                        and v.value == "ready":
                    return _str_keys(node)
    return ()


def _internal_state_keys(root: Path) -> tuple[str, ...]:
    """The keys ``Scheduler.get_internal_state`` always sets (top-level ``ret["k"] = ...``) on top of the args."""
    module = _module(root / SCHEDULER)
    for node in ast.walk(module) if module else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "get_internal_state":
            keys = []
            for stmt in node.body:
                if isinstance(stmt, ast.Assign):
                    for target in stmt.targets:
                        if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                                and isinstance(target.slice, ast.Constant)):
                            keys.append(target.slice.value)
            return tuple(keys)
    return ()


def _added_keys(fn) -> tuple[str, ...]:
    """``d["k"] = ...`` inside ``get_loads``' loop over the ranks (0.5.8 adds ``num_total_reqs``)."""
    keys = []
    for node in ast.walk(fn):
        if isinstance(node, ast.For):
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign):
                    for target in stmt.targets:
                        if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                            keys.append(target.slice.value)
    return tuple(keys)


def _aggregate_rules(fn) -> dict[str, tuple[tuple[str, ...], bool, int | None]]:
    """``_compute_aggregate``'s (0.5.8-0.5.12) keys, each as (the per-rank fields it adds up, whether
    it divides by the rank count, the digits it rounds to), read from the dict it returns for ranks."""
    found = [d for d in _dicts(fn) if any(isinstance(v, ast.Call) and not isinstance(v, ast.Constant)
                                          for v in d.values)]
    rules = {}
    for key, value in (zip(found[-1].keys, found[-1].values, strict=True) if found else ()):
        fields = tuple(n.slice.value for n in ast.walk(value)
                       if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant))
        mean = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(value))
        digits = None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "round" \
                and len(value.args) == 2 and isinstance(value.args[1], ast.Constant):
            digits = value.args[1].value
        rules[key.value] = (fields, mean, digits)
    return rules


@dataclass
class ReleaseEndpoints:
    """What one release's HTTP server answers on the informational routes, read from its source."""

    version: str
    served: dict[str, str] = field(default_factory=dict)  # route -> "file:line" of its handler
    deprecations: dict[str, str] = field(default_factory=dict)  # route -> the warning it logs
    model_info_keys: tuple[str, ...] = ()
    model_card: dict[str, Any] = field(default_factory=dict)
    model_card_args: tuple[str, ...] = ()
    model_list: dict[str, Any] = field(default_factory=dict)
    model_not_found: ast.Dict | None = None  # retrieve_model's {"error": {...}} for another name
    server_info_keys: tuple[str, ...] = ()  # the literal keys after the spread server args
    server_args: dict[str, Any] = field(default_factory=dict)
    ready_keys: tuple[str, ...] = ()
    internal_state_keys: tuple[str, ...] = ()
    loads_envelope: tuple[str, ...] = ()
    loads_core: dict[str, Any] = field(default_factory=dict)  # field -> its default in the release
    loads_added: tuple[str, ...] = ()
    disagg_section: str | None = None
    disagg_fields: dict[str, Any] = field(default_factory=dict)
    valid_sections: frozenset[str] = frozenset()
    aggregate: dict[str, tuple[tuple[str, ...], bool, int | None]] = field(default_factory=dict)
    get_load_keys: tuple[str, ...] = ()
    get_load_list: bool = True  # one object per DP rank; 0.5.1-0.5.2 answer one object
    unknown: set[str] = field(default_factory=set)  # keys answered None: the twin has no value

    def serves(self, route: str) -> bool:
        return route in self.served


def read_release(root: str | Path, version: str) -> ReleaseEndpoints:
    """Read the informational routes of the release whose tree (holding ``sglang/``) is ``root``."""
    root = Path(root)
    spec = ReleaseEndpoints(version=version)
    http = _module(root / HTTP_SERVER)
    functions = _functions(http)
    routes = _get_routes(http, "app")
    loads_module = _module(root / V1_LOADS) if _includes_v1_loads(http) else None
    loads_routes = _get_routes(loads_module, "router")
    for route in INFO_ROUTES:
        fn, rel = (routes.get(route), HTTP_SERVER) if route in routes else (loads_routes.get(route), V1_LOADS)
        if fn is None:
            continue
        spec.served[route] = f"{rel}:{fn.lineno}"
        message = _deprecation(fn)
        if message:
            spec.deprecations[route] = message

    info = routes.get("/model_info") or routes.get("/get_model_info")
    if info is not None:
        found = _returned_dict(info, functions)
        spec.model_info_keys = _str_keys(found) if found is not None else ()

    spec.model_card, _, _ = _class_fields(root, (PROTOCOL,), "ModelCard")
    spec.model_list, _, _ = _class_fields(root, (PROTOCOL,), "ModelList")
    models = routes.get("/v1/models")
    if models is not None:
        for node in ast.walk(models):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ModelCard":
                spec.model_card_args = tuple(k.arg for k in node.keywords if k.arg)
                break

    retrieve = routes.get(RETRIEVE_MODEL)
    if retrieve is not None:
        for node in _dicts(retrieve):
            if _str_keys(node) == ("error",) and isinstance(node.values[0], ast.Dict):
                spec.model_not_found = node.values[0]

    server_info = routes.get("/server_info") or routes.get("/get_server_info")
    if server_info is not None:
        found = _returned_dict(server_info, functions)
        spec.server_info_keys = (_spread_keys(root, http, found) + _str_keys(found)) if found is not None else ()
    spec.server_args = {k: (None if v is REQUIRED or v is FACTORY else v)
                        for k, v in server_arg_fields(root).items()}
    spec.ready_keys = _ready_keys(root)
    spec.internal_state_keys = _internal_state_keys(root)

    get_loads = loads_routes.get("/v1/loads")
    if get_loads is not None:
        returns = [n.value for n in ast.walk(get_loads) if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict)]
        spec.loads_envelope = _str_keys(returns[-1]) if returns else ()
        spec.loads_added = _added_keys(get_loads)
        aggregate = _functions(loads_module).get("_compute_aggregate")
        if aggregate is not None:
            spec.aggregate = _aggregate_rules(aggregate)
    outputs, notes, _ = _class_fields(root, LOAD_CLASSES, "GetLoadsReqOutput")
    if not outputs:  # 0.5.19+: the per-rank answer is a LoadSnapshot struct
        outputs, notes, _ = _class_fields(root, LOAD_CLASSES, "LoadSnapshot")
    sections = {name for name, note in notes.items() if "Metrics" in note}
    spec.loads_core = {n: d for n, d in outputs.items() if n not in sections and n != "timestamp"}
    spec.disagg_section = next((n for n in sections if "Disaggregation" in notes[n]), None)
    spec.disagg_fields, _, _ = _class_fields(root, LOAD_CLASSES, "DisaggregationMetrics")
    spec.valid_sections = (_class_constant(root, LOAD_CLASSES, "GetLoadsReqInput", "VALID_SECTIONS")
                           or _class_constant(root, LOAD_CLASSES, "LoadSnapshot", "VALID_SECTIONS") or frozenset())

    get_load = routes.get("/get_load")
    if get_load is not None:
        found = _dicts(get_load)
        spec.get_load_keys = (_str_keys(found[0]) if found
                              else tuple(_class_fields(root, LOAD_CLASSES, "GetLoadReqOutput")[0]))
        if not spec.get_load_keys:  # 0.5.1-0.5.2: TokenizerManager.get_load returns {"load": <tokens>}
            for rel in TOKENIZER_MANAGER:
                manager = _module(root / rel)
                for node in ast.walk(manager) if manager else ():
                    if isinstance(node, ast.AsyncFunctionDef) and node.name == "get_load" and _dicts(node):
                        spec.get_load_keys, spec.get_load_list = _str_keys(_dicts(node)[-1]), False
    return spec


# ---------------------------------------------------------------------------------- answering


class Facts:
    """What the twin knows about one engine, by the names sglang's answers use.

    ``server_args``: the twin's own arguments (over the release's defaults); ``loads``: the
    scheduler's load figures by name (``num_running_reqs``, ``prefill_bootstrap_queue_reqs``, ...).
    """

    def __init__(self, *, mode: str, host: str, port: int, backend: str, bootstrap_port: int | None,
                 context_len: int, max_total_num_tokens: int, max_running_requests: int, started: float) -> None:
        self.mode = mode
        self.context_len = context_len
        self.max_total_num_tokens = max_total_num_tokens
        self.max_running_requests = max_running_requests
        self.started = started
        # What the operator typed, as 0.5.21+ report it: the twin's own server process.
        self.launch_command = f"python -m forensics.twin.{mode} --inventory <twin>/inventory.toml"
        self.server_args = {
            "model_path": MODEL, "tokenizer_path": MODEL, "served_model_name": MODEL, "host": host, "port": port,
            "disaggregation_mode": mode, "disaggregation_transfer_backend": backend, "tp_size": 1, "dp_size": 1,
            "max_running_requests": max_running_requests, "context_length": context_len,
            "device": "cpu",
        }
        if bootstrap_port is not None:
            self.server_args["disaggregation_bootstrap_port"] = bootstrap_port


def _value(spec: ReleaseEndpoints, where: str, key: str, values: dict[str, Any]) -> Any:
    if key in values:
        return values[key]
    spec.unknown.add(f"{where}.{key}")
    return None


def server_args(spec: ReleaseEndpoints, facts: Facts) -> dict[str, Any]:
    """The release's ``ServerArgs`` fields at their defaults, the twin's own values where it has them.

    0.5.21+ assemble ``ServerArgs`` from namespaces elsewhere (``arg_groups/fields/``), not read
    here yet: those answer the twin's own arguments only, and say so in ``unknown``."""
    if not spec.server_args:
        spec.unknown.add("server_args.*")
        return dict(facts.server_args)
    args = dict(spec.server_args)
    args.update({k: v for k, v in facts.server_args.items() if k in args})
    return args


def model_info(spec: ReleaseEndpoints, facts: Facts) -> dict[str, Any]:
    args = server_args(spec, facts)
    values = dict(args)  # 0.5.21+ also report server args here (load_format, reasoning_parser, ...)
    values.update({"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True,
              "preferred_sampling_params": args.get("preferred_sampling_params"),
              "weight_version": args.get("weight_version"), "has_image_understanding": False,
              "has_audio_understanding": False,
              # The twin has no model config (no HF config.json): sglang reads these from it.
              "model_type": None, "architectures": None})
    return {k: _value(spec, "model_info", k, values) for k in spec.model_info_keys}


def _pydantic(spec: ReleaseEndpoints, fields: dict[str, Any], given: dict[str, Any], where: str) -> dict[str, Any]:
    out = {}
    for name, default in fields.items():
        if name in given:
            out[name] = given[name]
        elif default is FACTORY:
            out[name] = int(time.time()) if name == "created" else _value(spec, where, name, {})
        elif default is REQUIRED:
            out[name] = _value(spec, where, name, {})
        else:
            out[name] = default
    return out


def models(spec: ReleaseEndpoints, facts: Facts) -> dict[str, Any]:
    """``ModelList(data=[ModelCard(...)])`` for the served model (the twin has no LoRA adapters)."""
    values = {"id": MODEL, "root": MODEL, "max_model_len": facts.context_len}
    given = {k: _value(spec, "v1_models", k, values) for k in spec.model_card_args}
    card = _pydantic(spec, spec.model_card, given, "model_card")
    return _pydantic(spec, spec.model_list, {"data": [card]}, "model_list")


def retrieve_model(spec: ReleaseEndpoints, facts: Facts, model: str) -> tuple[int, dict[str, Any]]:
    """``/v1/models/<name>``: the card of the served model, else the handler's 404 error (its message an
    f-string over ``model``, filled in here)."""
    if model == MODEL:
        values = {"id": MODEL, "root": MODEL, "max_model_len": facts.context_len}
        return 200, _pydantic(spec, spec.model_card, {k: values.get(k) for k in spec.model_card_args}, "model_card")
    error = {}
    for key, value in zip((spec.model_not_found.keys if spec.model_not_found else ()),
                          (spec.model_not_found.values if spec.model_not_found else ()), strict=True):
        if isinstance(value, ast.JoinedStr):
            error[key.value] = "".join(str(v.value) if isinstance(v, ast.Constant) else model for v in value.values)
        elif isinstance(value, ast.Constant):
            error[key.value] = value.value
    return 404, {"error": error}


def server_info(spec: ReleaseEndpoints, facts: Facts, loads: dict[str, Any], twin: dict[str, Any]) -> dict[str, Any]:
    """``{**server_args, **scheduler_info, "internal_states": [...], "version": ..., ...}``; each DP
    rank's internal state is the server args plus what ``get_internal_state`` adds, and the twin's
    own account under ``"twin"`` (a key sglang does not have)."""
    args = server_args(spec, facts)
    ready = {"status": "ready", "max_total_num_tokens": facts.max_total_num_tokens,
             "max_req_input_len": facts.context_len - 1, "startup_time": facts.started}
    state_values = {"last_gen_throughput": loads.get("gen_throughput", 0.0),
                    "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": facts.max_total_num_tokens},
                    "effective_max_running_requests_per_dp": facts.max_running_requests,
                    "load": loads["num_total_tokens"],  # 0.5.1: the scheduler's get_load(), a token count
                    "world_size": 1, "startup_time": facts.started}
    state = dict(args)
    state.update({k: _value(spec, "internal_state", k, state_values) for k in spec.internal_state_keys})
    state["twin"] = twin
    values = {"internal_states": [state], "version": spec.version,
              "kv_events": None,  # None: KV-event publishing is off (no --kv-events-config)
              "startup_time": facts.started, "frontend": "python",
              "launch_command": facts.launch_command}
    out = dict(args)
    out.update({k: _value(spec, "scheduler_info", k, ready) for k in spec.ready_keys})
    out.update({k: _value(spec, "server_info", k, values) for k in spec.server_info_keys})
    return out


def _load_row(spec: ReleaseEndpoints, loads: dict[str, Any], sections: set[str] | None) -> dict[str, Any]:
    values = dict(loads, dp_rank=0)
    values["num_total_reqs"] = loads["num_running_reqs"] + loads["num_waiting_reqs"]
    # A field the twin has no figure for keeps the release's own default, as in a struct built
    # from what the scheduler set (0.5.19+ LoadSnapshot: every field has one); a required one is
    # answered None and listed in ``unknown``.
    row = {k: values[k] if k in values or d is REQUIRED or d is FACTORY else d for k, d in spec.loads_core.items()}
    row.update({k: _value(spec, "loads", k, values) for k, d in spec.loads_core.items() if d is REQUIRED})
    if spec.disagg_section and (sections is None or _include_key(spec, spec.disagg_section) in sections):
        row[spec.disagg_section] = {k: _value(spec, "disaggregation", k, values) for k in spec.disagg_fields}
    for key in spec.loads_added:
        row[key] = _value(spec, "loads", key, values)
    return row


def _include_key(spec: ReleaseEndpoints, section: str) -> str:
    """The ``include=`` name of a section: the valid name it starts with (disaggregation -> disagg)."""
    return next((s for s in sorted(spec.valid_sections, key=len, reverse=True) if section.startswith(s)), section)


def _aggregate(spec: ReleaseEndpoints, rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for key, (fields, mean, digits) in spec.aggregate.items():
        if not fields or not rows or any(f not in rows[0] for f in fields):
            out[key] = _value(spec, "aggregate", key, {})
            continue
        total = sum(r[f] for r in rows for f in fields)
        value = total / len(rows) if mean else total
        out[key] = round(value, digits) if digits is not None else value
    return out


def loads_answer(spec: ReleaseEndpoints, loads: dict[str, Any], query) -> tuple[int, dict[str, Any]]:
    """(status, body) of ``/v1/loads?include=...&dp_rank=...`` (one DP rank: 0)."""
    include = query.get("include")
    sections = {s.strip() for s in include.split(",")} if include else None
    if sections is not None and spec.valid_sections and not sections <= spec.valid_sections:
        return 400, {"detail": f"Invalid include sections: {sections - spec.valid_sections}. "
                               f"Valid options: {sorted(spec.valid_sections)}"}
    if sections is not None and "all" in sections:
        sections = None
    dp_rank = query.get("dp_rank")
    rows = [] if dp_rank not in (None, "0") else [_load_row(spec, loads, sections)]
    values = {"timestamp": datetime.now(UTC).isoformat(), "version": spec.version, "dp_rank_count": len(rows),
              # sglang's get_device_name() has no name for a CPU (None); tp_size * pp_size devices per rank
              "accelerator": None, "num_accelerators": 1,
              "loads": rows, "aggregate": _aggregate(spec, rows) if rows else {}}
    return 200, {k: _value(spec, "v1_loads", k, values) for k in spec.loads_envelope}


def get_load(spec: ReleaseEndpoints, loads: dict[str, Any]) -> list[dict[str, Any]] | dict[str, Any]:
    values = dict(loads, dp_rank=0, num_reqs=loads["num_running_reqs"] + loads["num_waiting_reqs"],
                  num_tokens=loads["num_total_tokens"],
                  num_pending_tokens=loads["num_total_tokens"] - loads["num_used_tokens"],
                  ts_tic=time.perf_counter(),
                  load=loads["num_total_tokens"])  # 0.5.1's Scheduler.get_load: tokens held plus queued
    row = {k: _value(spec, "get_load", k, values) for k in spec.get_load_keys}
    return [row] if spec.get_load_list else row


# ------------------------------------------------------------------------------------- serving


@web.middleware
async def fastapi_not_found(request: web.Request, handler):
    """An unregistered route answers as FastAPI does: 404 ``{"detail": "Not Found"}``."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.json_response({"detail": "Not Found"}, status=404)


def timed_loads_answer(spec: ReleaseEndpoints, engine, query) -> tuple[int, dict]:
    """``/v1/loads``, timed into ``sglang:get_loads_duration_seconds`` as sglang's handler does
    (in a ``finally``: a refused query is timed too), where the release declares it."""
    started = time.perf_counter()
    try:
        return loads_answer(spec, engine.load_values(), query)
    finally:
        engine.metrics.get_loads_duration.observe(time.perf_counter() - started)


def register(app: web.Application, spec: ReleaseEndpoints, engine) -> None:
    """Add the informational routes ``spec`` says the release serves; ``engine`` supplies
    ``facts`` (:class:`Facts`), ``load_values()``, ``twin_state()`` and ``metrics`` (whose
    ``get_loads_duration`` times each ``/v1/loads``)."""
    app.middlewares.append(fastapi_not_found)

    def handler(route: str, answer):
        async def handle(request: web.Request) -> web.Response:
            if route in spec.deprecations:
                log.warning(spec.deprecations[route])
            status, body = answer(request)
            return web.json_response(body, status=status)

        return handle

    answers = {
        "/v1/models": lambda r: (200, models(spec, engine.facts)),
        RETRIEVE_MODEL: lambda r: retrieve_model(spec, engine.facts, r.match_info["model"]),
        "/model_info": lambda r: (200, model_info(spec, engine.facts)),
        "/get_model_info": lambda r: (200, model_info(spec, engine.facts)),
        "/server_info": lambda r: (200, server_info(spec, engine.facts, engine.load_values(), engine.twin_state())),
        "/get_server_info": lambda r: (200, server_info(spec, engine.facts, engine.load_values(),
                                                        engine.twin_state())),
        "/v1/loads": lambda r: timed_loads_answer(spec, engine, r.query),
        "/get_load": lambda r: (200, get_load(spec, engine.load_values())),
    }
    for route in INFO_ROUTES:
        if spec.serves(route):
            path = route.replace("{model:path}", "{model:.+}")  # aiohttp's spelling of a path parameter
            app.router.add_get(path, handler(route, answers[route]))
