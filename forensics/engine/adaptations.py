"""The CPU adaptations of an engine environment: libcst codemods, each named, applied only there.

A real sglang release runs on this CPU with two small changes (measured in
``shared/reference/real-sglang-on-cpu.md``); nothing else of sglang is replaced. Each is a
codemod in the style of the fix's (``patched_engine/codemod.py``): its edit sites are derived
from the code in front of it, never from a version number, and it refuses (``AdaptationError``,
naming the file) when it finds none. Every edit replaces an expression inside one line, so each
adapted file keeps the wheel's line count and a traceback names the same lines as the wheel's.
The adapted bytes are a pure function of the original's, so each adapted file has its own stable
sha256 (:func:`adapted_baseline`), which deploy and rollback accept as an engine environment's
baseline the way they accept the wheel's bytes on a real host.

``cpu-nixl-dram`` (``sglang/srt/disaggregation/nixl/conn.py``)
    NIXL registers the KV pool as ``"VRAM"``; UCX then fails in ``register_buffer_to_engine``
    ("VRAM memory is detected as host by UCX", ``NIXL_ERR_BACKEND``) and the prefill dies at
    start-up. On a CPU the pool is host memory, so it is registered as ``"DRAM"``:

    * 0.5.15 and 0.5.15.post1 route every kind through ``_normalize_kv_mem_kinds`` (lines
      60-72): its two returns (lines 62 and 72) give ``["DRAM"]`` per buffer; the length and
      kind checks before them still run. The decode passes ``["VRAM"] * n`` explicitly
      (``disaggregation/decode.py:408-412``), so the default alone would not do.
    * 0.5.13, 0.5.13.post1 and 0.5.14 have no such function: ``"VRAM"`` is written out as an
      argument of ``register_memory``, ``prep_xfer_dlist`` and ``get_xfer_descs`` at 14 lines
      (386, 543, 630, 663, 901, 927, 1082-1083, 1260-1261, 1424-1425, 1527-1528); each becomes
      ``"DRAM"``.

``cpu-torchvision-fake-ops`` (``torchvision/_meta_registrations.py``, torchvision 0.28.0)
    PyPI's torchvision links ``libtorch_cuda.so``; with CPU torch its ``_C`` does not load and
    the module-level ``@torch.library.register_fake("torchvision::nms")`` (line 163; ``qnms`` at
    177) raises "operator torchvision::nms does not exist", so ``import torchvision`` fails.
    sglang only needs ``from torchvision.io import decode_jpeg`` (``utils/common.py:94``). Each
    such decorator becomes ``@(<it> if torchvision.extension._has_ops() else (lambda fn: fn))``,
    the check torchvision's own ``register_meta`` makes a few lines above.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from forensics.exitcodes import EnvironmentProblem

NIXL_CONN = "sglang/srt/disaggregation/nixl/conn.py"
TORCHVISION_META = "torchvision/_meta_registrations.py"

Status = Literal["applied", "already"]


class AdaptationError(EnvironmentProblem):
    """A file has none of the sites an adaptation needs (or would lose its line count); exit 4."""


@dataclass(frozen=True)
class AdaptResult:
    """One adaptation run over one file: the new text and the 1-based lines it changed."""

    name: str
    file: str
    original: str
    new_text: str
    status: Status
    lines: tuple[int, ...]

    @property
    def changed(self) -> bool:
        return self.new_text != self.original

    @property
    def sha256(self) -> str:
        return sha256_text(self.new_text)


@dataclass(frozen=True)
class Adaptation:
    name: str
    file: str  # relative to site-packages
    why: str
    transform: Callable[[cst.Module, str], tuple[str, Status, tuple[int, ...]]]

    def apply(self, text: str, label: str | None = None) -> AdaptResult:
        """Adapt ``text`` (the file's content); ``label`` names it in errors (default: :attr:`file`)."""
        label = label or self.file
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError as exc:
            raise AdaptationError(f"{label}: not valid Python, cannot apply {self.name}: {exc}", path=label) from exc
        new_text, status, lines = self.transform(module, label)
        if new_text.count("\n") != text.count("\n"):  # a codemod bug, never the user's
            raise AdaptationError(f"{label}: {self.name} would change the line count; nothing written", path=label)
        if new_text != text:
            try:
                compile(new_text, label, "exec")
            except SyntaxError as exc:
                raise AdaptationError(f"{label}: {self.name} produced code that does not compile ({exc})",
                                      path=label) from exc
        return AdaptResult(self.name, self.file, text, new_text, status, lines)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _string(value: str) -> m.BaseMatcherNode:
    return m.SimpleString(m.MatchIfTrue(lambda raw: raw[1:-1] == value and raw[0] in "\"'"))


def _replace_at(module: cst.Module, targets: list[tuple[cst.CSTNode, cst.CSTNode]]) -> tuple[str, tuple[int, ...]]:
    """``module``'s code with each (old node → new node) swapped, and the lines of the old nodes."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    lines = tuple(sorted(positions[old].start.line for old, _new in targets))
    replacements = {id(old): new for old, new in targets}

    class Swap(cst.CSTTransformer):
        def on_leave(self, original_node, updated_node):
            return replacements.get(id(original_node), updated_node)

    return module.visit(Swap()).code, lines


# ----------------------------------------------------------------------------- cpu-nixl-dram

_MEM_KIND_CALLS = m.Call(func=m.Attribute(attr=m.Name("register_memory") | m.Name("prep_xfer_dlist")
                                          | m.Name("get_xfer_descs")))


def _dram_list(length: cst.BaseExpression) -> cst.BinaryOperation:
    return cst.BinaryOperation(
        left=cst.List([cst.Element(cst.SimpleString('"DRAM"'))]),
        operator=cst.Multiply(whitespace_before=cst.SimpleWhitespace(" "), whitespace_after=cst.SimpleWhitespace(" ")),
        right=length,
    )


def _nixl_dram(module: cst.Module, label: str) -> tuple[str, Status, tuple[int, ...]]:
    normalizers = [n for n in module.body if m.matches(n, m.FunctionDef(name=m.Name("_normalize_kv_mem_kinds")))]
    if len(normalizers) > 1:
        raise AdaptationError(f"{label}: cpu-nixl-dram: `def _normalize_kv_mem_kinds` found {len(normalizers)} "
                              "times, expected at most once", path=label)
    if normalizers:
        return _normalizer_returns_dram(module, normalizers[0], label)
    return _vram_arguments_to_dram(module, label)


def _normalizer_returns_dram(module: cst.Module, function: cst.FunctionDef,
                             label: str) -> tuple[str, Status, tuple[int, ...]]:
    """0.5.15+: both returns of ``_normalize_kv_mem_kinds`` give ``["DRAM"] * <length>``."""
    length_param = function.params.params[1].name if len(function.params.params) > 1 else None
    kinds_param = function.params.params[0].name if function.params.params else None
    if length_param is None:
        raise AdaptationError(f"{label}: cpu-nixl-dram: _normalize_kv_mem_kinds takes no length argument", path=label)
    dram = m.Return(value=m.BinaryOperation(left=m.List([m.Element(_string("DRAM"))]), operator=m.Multiply()))
    returns = m.findall(function, m.Return())
    targets = []
    for node in returns:
        if m.matches(node, dram):
            continue
        if m.matches(node, m.Return(value=m.BinaryOperation(left=m.List([m.Element(_string("VRAM"))])))):
            targets.append((node.value, _dram_list(node.value.right)))
        elif kinds_param is not None and m.matches(node, m.Return(value=m.Name(kinds_param.value))):
            targets.append((node.value, _dram_list(cst.Call(cst.Name("len"), [cst.Arg(cst.Name(kinds_param.value))]))))
        else:
            raise AdaptationError(f"{label}: cpu-nixl-dram: a return of _normalize_kv_mem_kinds is neither the "
                                  "VRAM default nor the checked kinds; refusing to adapt it", path=label)
    if not targets:
        return module.code, "already", ()
    code, lines = _replace_at(module, targets)
    return code, "applied", lines


def _vram_arguments_to_dram(module: cst.Module, label: str) -> tuple[str, Status, tuple[int, ...]]:
    """0.5.13-0.5.14: every ``"VRAM"`` argument of a NIXL memory call becomes ``"DRAM"``."""
    targets = []
    already = 0
    for call in m.findall(module, _MEM_KIND_CALLS):
        for arg in call.args:
            if m.matches(arg.value, _string("VRAM")):
                quote = arg.value.value[0]
                targets.append((arg.value, arg.value.with_changes(value=f"{quote}DRAM{quote}")))
            elif m.matches(arg.value, _string("DRAM")):
                already += 1
    if not targets and already:
        return module.code, "already", ()
    if not targets:
        raise AdaptationError(
            f"{label}: cpu-nixl-dram: found neither `_normalize_kv_mem_kinds` nor a \"VRAM\" argument of "
            "register_memory/prep_xfer_dlist/get_xfer_descs; this file registers memory some other way",
            path=label)
    code, lines = _replace_at(module, targets)
    return code, "applied", lines


# ------------------------------------------------------------------- cpu-torchvision-fake-ops

_FAKE_OP = m.Decorator(decorator=m.Call(
    func=m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("library")), attr=m.Name("register_fake")),
    args=[m.Arg(m.SimpleString(m.MatchIfTrue(lambda raw: raw[1:].startswith("torchvision::")))), m.ZeroOrMore()],
))
_GUARDED_FAKE_OP = m.Decorator(decorator=m.IfExp(body=_FAKE_OP.decorator))
_HAS_OPS = "torchvision.extension._has_ops()"


def _torchvision_fake_ops(module: cst.Module, label: str) -> tuple[str, Status, tuple[int, ...]]:
    targets = []
    guarded = 0
    for function in module.body:
        if not isinstance(function, cst.FunctionDef):
            continue
        for decorator in function.decorators:
            if m.matches(decorator, _FAKE_OP):
                guard = cst.parse_expression(f"(_ if {_HAS_OPS} else (lambda fn: fn))")
                guard = guard.with_changes(body=decorator.decorator)
                targets.append((decorator.decorator, guard))
            elif m.matches(decorator, _GUARDED_FAKE_OP):
                guarded += 1
    if not targets and guarded:
        return module.code, "already", ()
    if not targets:
        raise AdaptationError(f"{label}: cpu-torchvision-fake-ops: no module-level "
                              "@torch.library.register_fake(\"torchvision::...\") decorator found", path=label)
    code, lines = _replace_at(module, targets)
    return code, "applied", lines


NIXL_DRAM = Adaptation(
    "cpu-nixl-dram", NIXL_CONN,
    "NIXL registers the KV pool as VRAM, which UCX rejects for host memory; on a CPU it is DRAM",
    _nixl_dram,
)
TORCHVISION_FAKE_OPS = Adaptation(
    "cpu-torchvision-fake-ops", TORCHVISION_META,
    "PyPI's torchvision 0.28.0 has no loadable ops with CPU torch; its fake registrations are skipped then",
    _torchvision_fake_ops,
)
ADAPTATIONS = (NIXL_DRAM, TORCHVISION_FAKE_OPS)
# The adaptations of sglang's own files: their adapted bytes are an engine environment's baseline.
SGLANG_ADAPTATIONS = (NIXL_DRAM,)


def adaptation_ids() -> list[str]:
    return [a.name for a in ADAPTATIONS]


_baselines: dict[tuple[str, str], dict[str, str]] = {}


def adapted_sglang_files(version: str) -> dict[str, AdaptResult]:
    """Each of sglang ``version``'s adapted files, derived from its wheel (via ``forensics.sglang_source``)."""
    from forensics.sglang_source import fetch

    source = fetch(version)
    return {a.file: a.apply(source.verified_read_text(a.file), f"sglang {version}: {a.file}")
            for a in SGLANG_ADAPTATIONS}


def adapted_baseline(version: str) -> dict[str, str]:
    """``{path relative to site-packages: sha256}`` of each sglang file as an engine environment
    holds it after the CPU adaptations: the bytes deploy and rollback accept there as the baseline."""
    from forensics.sglang_source import fetch

    key = (version, fetch(version).sha256 or "")
    if key not in _baselines:
        _baselines[key] = {path: result.sha256 for path, result in adapted_sglang_files(version).items()}
    return dict(_baselines[key])
