"""What a release's ``/generate`` answer holds, read from its tokenizer manager.

sglang builds the answer of a finished request in ``TokenizerManager._handle_batch_output``
(``managers/tokenizer_manager.py``): a ``meta_info`` dict that grows key by key under
conditions (metrics on, logprobs asked, a multimodal prompt, speculative decoding, ...), then
``out_dict`` with ``text``, ``output_ids`` and ``meta_info``. Part of ``meta_info`` comes from
the time-stats objects' ``convert_to_output_meta_info`` methods
(``observability/req_time_stats.py``). The key set differs by release, so the twin reads it
rather than writing it down.

The reader walks the handler's statements and follows only the branches a plain request
takes: a non-streamed text ``/generate`` of a few tokens on the decode of a PD pair started
with ``--enable-metrics``, as the fidelity scenario sends. :data:`PLAIN_REQUEST` says how
each condition guarding a key reads for it, by the condition's source text; a condition it
does not know is not guessed: it is listed in :attr:`AnswerKeys.unread` with its file and
line, and the keys under it are left out. A helper handed ``meta_info`` on a branch the
request takes is listed the same way (its keys are not followed).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from forensics.sglang_source import SourceError

TOKENIZER_MANAGER = "managers/tokenizer_manager.py"
TIME_STATS = "observability/req_time_stats.py"
HANDLER = "_handle_batch_output"
TIME_STATS_METHOD = "convert_to_output_meta_info"
STATE_TIME_STATS = "state.time_stats"  # the request state's own stats (its class: the state's annotation)

# How each condition guarding a key reads for the plain request (ast.unparse text). Measured
# against real 0.5.15's answer (tests/data/real-engine-0.5.15/marks.json): its decode's
# scheduler stats leave forward_entry_time and prefill_finished_time at 0 (the decode runs no
# prefill forward), and its batch output carries cached_tokens_details and dp_ranks as lists
# of None, so those keys are present with null values.
PLAIN_REQUEST: dict[str, bool] = {
    "self.enable_metrics": True,
    "recv_obj.time_stats is not None": True,
    "getattr(state.obj, 'return_logprob', False)": False,
    "not isinstance(recv_obj, BatchEmbeddingOutput)": True,
    "isinstance(recv_obj, BatchEmbeddingOutput)": False,
    "hasattr(recv_obj, 'cached_tokens_details')": True,
    "recv_obj.cached_tokens_details": True,
    "customized_info is not None": False,
    # 0.5.13 and 0.5.13.post1: the scheduler's load piggy-backed on the batch output; real 0.5.13's
    # PD decode answered without it (its warmup answer, tests/data/real-engine-0.5.13/decode-startup.log)
    "load is not None": False,
    "recv_obj.customized_info is not None": False,
    "isinstance(state.obj, GenerateReqInput)": True,
    "state.obj.return_sampling_mask": False,
    "image_tokens_list": False,
    "audio_tokens_list": False,
    "video_tokens_list": False,
    "getattr(recv_obj, 'output_hidden_states', None)": False,
    "getattr(recv_obj, 'routed_experts', None)": False,
    "getattr(recv_obj, 'indexer_topk', None)": False,
    "getattr(recv_obj, 'dp_ranks', None)": True,
    "isinstance(recv_obj, BatchStrOutput)": True,
    "is_stream": False,
    "state.finished": True,
    "out_dict is not None": True,
    "state.prompt_token_ids is not None": False,
    "self.server_args.speculative_algorithm": False,
    # the time-stats methods
    "self.created_time > 0.0": True,
    "self.api_server_dispatch_finish_time > 0.0": True,
    "self.response_sent_to_client_time > 0.0": True,
    "self.finished_time > 0.0": True,
    "decode_latency > 0.0": True,
    "completion_tokens > 1": True,
    "self.forward_entry_time > 0.0": False,
    "self.prefill_finished_time > 0.0": False,
}


@dataclass(frozen=True)
class AnswerKeys:
    """The keys of a plain ``/generate`` answer: ``top`` (the body) and ``meta`` (its ``meta_info``), in the order the source adds them."""

    release: str
    top: tuple[str, ...]
    meta: tuple[str, ...]
    unread: tuple[str, ...] = field(default=())  # "file:line: why" for each condition or helper not followed


class _Walk:
    """One walk of a function body, collecting the keys written into ``meta_info`` and ``out_dict``."""

    def __init__(self, relpath: str, methods: dict[str, ast.FunctionDef], state_class: str | None) -> None:
        self.relpath = relpath
        self.methods = methods  # class name -> its convert_to_output_meta_info
        self.state_class = state_class
        self.meta: list[str] = []
        self.top: list[str] = []
        self.unread: list[str] = []

    def add(self, keys: list[str], into: list[str]) -> None:
        into.extend(k for k in keys if k not in into)

    def block(self, statements: list[ast.stmt], target: str = "meta_info") -> None:
        for statement in statements:
            self.statement(statement, target)

    def statement(self, node: ast.stmt, target: str) -> None:
        if isinstance(node, ast.If):
            if not _writes_keys(node):
                return
            taken = self.condition(node.test)
            if taken is True:
                self.block(node.body, target)
            elif taken is False:
                self.block(node.orelse, target)
            return
        if isinstance(node, ast.For | ast.While | ast.With | ast.AsyncWith | ast.AsyncFor):
            self.block(node.body, target)
            return
        if isinstance(node, ast.Try):
            self.block(node.body, target)
            return
        if isinstance(node, ast.Assign):
            for assigned in node.targets:
                self.assignment(assigned, node.value, target)
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            self.call(node.value, target)

    def assignment(self, assigned: ast.expr, value: ast.expr, target: str) -> None:
        if isinstance(assigned, ast.Name) and assigned.id in ("meta_info", target) and isinstance(value, ast.Dict):
            self.add(_dict_keys(value), self.meta)
        elif isinstance(assigned, ast.Name) and assigned.id == "out_dict" and isinstance(value, ast.Dict):
            self.add(_dict_keys(value), self.top)
        elif isinstance(assigned, ast.Subscript) and isinstance(assigned.value, ast.Name):
            key = assigned.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                if assigned.value.id in ("meta_info", target):
                    self.add([key.value], self.meta)
                elif assigned.value.id == "out_dict":
                    self.add([key.value], self.top)

    def call(self, call: ast.Call, target: str) -> None:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "update" and isinstance(func.value, ast.Name) \
                and func.value.id in ("meta_info", target) and call.args:
            given = call.args[0]
            if isinstance(given, ast.Dict):
                self.add(_dict_keys(given), self.meta)
            elif isinstance(given, ast.Call) and isinstance(given.func, ast.Attribute) \
                    and given.func.attr == TIME_STATS_METHOD:
                self.time_stats(given)
            else:
                self.unread.append(f"{self.relpath}:{call.lineno}: meta_info.update({ast.unparse(given)[:60]}) "
                                   "is not read")
            return
        if any(isinstance(a, ast.Name) and a.id in ("meta_info", target) for a in call.args):
            self.unread.append(f"{self.relpath}:{call.lineno}: {ast.unparse(func)}(...) is handed meta_info; "
                               "the keys it adds are not followed")

    def time_stats(self, call: ast.Call) -> None:
        receiver = ast.unparse(call.func.value)
        if receiver == STATE_TIME_STATS:
            owner = self.state_class
        else:  # the scheduler's stats: the class that is not the state's
            others = [name for name in self.methods if name != self.state_class]
            owner = others[0] if len(others) == 1 else None
        method = self.methods.get(owner) if owner else None
        if method is None:
            self.unread.append(f"{self.relpath}:{call.lineno}: {receiver}.{TIME_STATS_METHOD}() could not be "
                               f"resolved to one class (found: {', '.join(sorted(self.methods)) or 'none'})")
            return
        inner = _Walk(TIME_STATS, self.methods, self.state_class)
        result = _meta_dict_name(method)
        inner.block(method.body, result)
        self.add(inner.meta, self.meta)
        self.unread.extend(inner.unread)

    def condition(self, test: ast.expr) -> bool | None:
        """How ``test`` reads for the plain request; None (recorded) when a part of it is unknown."""
        if isinstance(test, ast.BoolOp):  # left to right, as Python does: ``a and a[i]`` stops at a false ``a``
            deciding = isinstance(test.op, ast.Or)  # the value that ends the chain
            unknown = False
            for value in test.values:
                taken = self.condition(value)
                if taken is deciding:
                    return deciding
                unknown |= taken is None
            return None if unknown else not deciding
        text = ast.unparse(test)
        if text in PLAIN_REQUEST:
            return PLAIN_REQUEST[text]
        self.unread.append(f"{self.relpath}:{test.lineno}: the condition {text[:80]!r} is not known for a plain "
                           "request; the keys under it are left out")
        return None


def _dict_keys(node: ast.Dict) -> list[str]:
    return [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]


def _writes_keys(node: ast.AST) -> bool:
    """Does this subtree add a key to meta_info or out_dict (or hand meta_info to a helper)?"""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in ("meta_info", "meta_data", "out_dict") \
                and not isinstance(sub.ctx, ast.Load | ast.Del):
            return True
        if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) \
                and sub.value.id in ("meta_info", "meta_data", "out_dict") and isinstance(sub.ctx, ast.Store):
            return True
        if isinstance(sub, ast.Call) and (
                any(isinstance(a, ast.Name) and a.id == "meta_info" for a in sub.args)
                or (isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Name)
                    and sub.func.value.id in ("meta_info", "meta_data"))):
            return True
    return False


def _meta_dict_name(method: ast.FunctionDef) -> str:
    """The name a time-stats method builds its dict under (``meta_info``, ``meta_data``)."""
    for statement in method.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Dict):
            for assigned in statement.targets:
                if isinstance(assigned, ast.Name):
                    return assigned.id
    return "meta_info"


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    return None


def _time_stats_methods(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == TIME_STATS_METHOD:
                    found[node.name] = item
    return found


def _state_time_stats_class(tree: ast.Module) -> str | None:
    """The class annotated on the request state's ``time_stats`` field (``time_stats: APIServerReqTimeStats``)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                        and item.target.id == "time_stats" and isinstance(item.annotation, ast.Name):
                    return item.annotation.id
    return None


def answer_keys(source) -> AnswerKeys:
    """The keys of a plain ``/generate`` answer of ``source`` (a :class:`forensics.sglang_source.SglangSource`)."""
    manager_rel = f"sglang/srt/{TOKENIZER_MANAGER}"
    try:
        manager = ast.parse(source.read(manager_rel), filename=manager_rel)
    except (SourceError, SyntaxError) as exc:
        return AnswerKeys(source.version, (), (), (f"{manager_rel}: {exc}: the answer is not read",))
    handler = _function(manager, HANDLER)
    if handler is None:
        return AnswerKeys(source.version, (), (), (f"{manager_rel}: no {HANDLER}: the answer is not read",))
    try:  # older releases have no time-stats module; a call into it then says so (time_stats())
        methods = _time_stats_methods(ast.parse(source.read(f"sglang/srt/{TIME_STATS}"), filename=TIME_STATS))
    except SourceError:
        methods = {}
    walk = _Walk(manager_rel, methods, _state_time_stats_class(manager))
    walk.block(handler.body)
    return AnswerKeys(source.version, tuple(walk.top), tuple(walk.meta), tuple(walk.unread))
