"""The CPU adaptations of an engine environment, on the real wheel sources of every vulnerable release.

No environment is built here: the sources come from the wheel cache (``forensics.sglang_source``).
"""

from __future__ import annotations

import ast
import hashlib

import pytest

from forensics.engine import adaptations
from forensics.engine.adaptations import NIXL_CONN, NIXL_DRAM, TORCHVISION_FAKE_OPS, AdaptationError
from forensics.sglang_source import fetch

# Derived by hand from each wheel's nixl/conn.py (grep '"VRAM"'), to check the codemod's derivation.
HARD_CODED_VRAM_LINES = (386, 543, 630, 663, 901, 927, 1082, 1083, 1260, 1261, 1424, 1425, 1527, 1528)
EXPECTED_LINES = {
    "0.5.13": HARD_CODED_VRAM_LINES,
    "0.5.13.post1": HARD_CODED_VRAM_LINES,
    "0.5.14": HARD_CODED_VRAM_LINES,
    "0.5.15": (62, 72),  # the two returns of _normalize_kv_mem_kinds
    "0.5.15.post1": (62, 72),
}
VULNERABLE = tuple(EXPECTED_LINES)


def wheel_conn(version: str) -> str:
    source = fetch(version)
    return source.verified_read_text(NIXL_CONN)


@pytest.mark.parametrize("version", VULNERABLE)
def test_nixl_dram_sites_are_derived_and_only_those_lines_change(version):
    original = wheel_conn(version)
    result = NIXL_DRAM.apply(original, f"{version}: {NIXL_CONN}")
    assert result.status == "applied"
    assert result.lines == EXPECTED_LINES[version]
    before, after = original.splitlines(), result.new_text.splitlines()
    assert len(before) == len(after)  # tracebacks name the wheel's lines
    changed = tuple(i + 1 for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b)
    assert changed == EXPECTED_LINES[version]
    for line in changed:
        assert "VRAM" in before[line - 1] or line == 72
        assert "DRAM" in after[line - 1] and "VRAM" not in after[line - 1]
    compile(result.new_text, NIXL_CONN, "exec")


@pytest.mark.parametrize("version", VULNERABLE)
def test_nixl_dram_is_idempotent_and_its_sha256_stable(version):
    original = wheel_conn(version)
    first = NIXL_DRAM.apply(original)
    again = NIXL_DRAM.apply(first.new_text)
    assert again.status == "already" and again.new_text == first.new_text and again.lines == ()
    assert NIXL_DRAM.apply(original).sha256 == first.sha256 == hashlib.sha256(first.new_text.encode()).hexdigest()
    baseline = adaptations.adapted_baseline(version)
    assert baseline == {NIXL_CONN: first.sha256}
    assert baseline[NIXL_CONN] != hashlib.sha256(original.encode()).hexdigest()


def _normalizer(text: str):
    """``_normalize_kv_mem_kinds`` of a conn.py, executed alone (the module itself needs torch)."""
    tree = ast.parse(text)
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name == "_normalize_kv_mem_kinds")
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "KV_MEM_KINDS" for t in n.targets))]
    namespace: dict = {"Optional": __import__("typing").Optional, "List": list}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "conn", "exec"), namespace)  # noqa: S102 - the wheel's code
    return namespace["_normalize_kv_mem_kinds"]


@pytest.mark.parametrize("version", ["0.5.15", "0.5.15.post1"])
def test_adapted_normalizer_registers_dram_and_still_checks_its_input(version):
    original, adapted = wheel_conn(version), NIXL_DRAM.apply(wheel_conn(version)).new_text
    assert _normalizer(original)(None, 2) == ["VRAM", "VRAM"]
    normalize = _normalizer(adapted)
    assert normalize(None, 2) == ["DRAM", "DRAM"]
    assert normalize(["VRAM", "VRAM", "VRAM"], 3) == ["DRAM"] * 3  # what the decode passes
    with pytest.raises(ValueError, match="length mismatch"):
        normalize(["VRAM"], 2)
    with pytest.raises(ValueError, match="Unsupported"):
        normalize(["HBM"], 1)


@pytest.mark.parametrize("version", ["0.5.13", "0.5.15"])
def test_the_fix_applies_on_top_of_the_adaptation_and_both_stay_distinct(version):
    from patched_engine.codemod import patch_source

    adapted = NIXL_DRAM.apply(wheel_conn(version)).new_text
    patched = patch_source(adapted, version)
    assert patched.changed and all(s.status in ("applied", "skipped") for s in patched.steps)
    assert NIXL_DRAM.apply(patched.new_text).status == "already"  # the fix leaves the DRAM sites alone


def test_nixl_dram_refuses_a_file_without_sites_naming_it():
    with pytest.raises(AdaptationError, match=r"conn\.py.*neither `_normalize_kv_mem_kinds`"):
        NIXL_DRAM.apply("x = 1\n", "/srv/sglang/srt/disaggregation/nixl/conn.py")


# torchvision 0.28.0's _meta_registrations.py: lines 1-22 and 162-189 verbatim (blank lines between),
# then a short stand-in for the register_meta function that follows.
TORCHVISION_HEAD = '''import functools

import torch
import torch._custom_ops
import torch.library

# Ensure that torch.ops.torchvision is visible
import torchvision.extension  # noqa: F401


@functools.lru_cache(None)
def get_meta_lib():
    return torch.library.Library("torchvision", "IMPL", "Meta")


def register_meta(op_name, overload_name="default"):
    def wrapper(fn):
        if torchvision.extension._has_ops():
            get_meta_lib().impl(getattr(getattr(torch.ops.torchvision, op_name), overload_name), fn)
        return fn

    return wrapper
'''
TORCHVISION_NMS = '''
@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    torch._check(dets.dim() == 2, lambda: f"boxes should be a 2d tensor, got {dets.dim()}D")
    torch._check(dets.size(1) == 4, lambda: f"boxes should have 4 elements in dimension 1, got {dets.size(1)}")
    torch._check(scores.dim() == 1, lambda: f"scores should be a 1d tensor, got {scores.dim()}")
    torch._check(
        dets.size(0) == scores.size(0),
        lambda: f"boxes and scores should have same number of elements in dimension 0, got {dets.size(0)} and {scores.size(0)}",
    )
    ctx = torch._custom_ops.get_ctx()
    num_to_keep = ctx.create_unbacked_symint()
    return dets.new_empty(num_to_keep, dtype=torch.long)


@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    torch._check(dets.dim() == 2, lambda: f"boxes should be a 2d tensor, got {dets.dim()}D")
    torch._check(dets.size(1) == 4, lambda: f"boxes should have 4 elements in dimension 1, got {dets.size(1)}")
    torch._check(scores.dim() == 1, lambda: f"scores should be a 1d tensor, got {scores.dim()}")
    torch._check(
        dets.size(0) == scores.size(0),
        lambda: f"boxes and scores should have same number of elements in dimension 0, got {dets.size(0)} and {scores.size(0)}",
    )
    ctx = torch._custom_ops.get_ctx()
    num_to_keep = ctx.create_unbacked_symint()
    return dets.new_empty(num_to_keep, dtype=torch.long)

@register_meta("qroi_align")
def meta_qroi_align(input, rois):
    return input
'''
TORCHVISION_EXCERPT = TORCHVISION_HEAD + "\n" * (162 - 23) + TORCHVISION_NMS


def test_torchvision_fake_ops_guarded_at_lines_163_and_177():
    result = TORCHVISION_FAKE_OPS.apply(TORCHVISION_EXCERPT)
    assert result.status == "applied" and result.lines == (163, 177)
    assert result.new_text.count("\n") == TORCHVISION_EXCERPT.count("\n")
    line = result.new_text.splitlines()[162]
    assert line == ('@(torch.library.register_fake("torchvision::nms") if torchvision.extension._has_ops() '
                    'else (lambda fn: fn))')
    again = TORCHVISION_FAKE_OPS.apply(result.new_text)
    assert again.status == "already" and again.new_text == result.new_text
    assert '@register_meta("qroi_align")' in result.new_text  # already checks _has_ops itself


def test_torchvision_guard_skips_the_registration_only_when_ops_are_missing():
    """Run the adapted decorators with a stand-in torch: registered with ops, skipped without."""
    import types

    adapted = TORCHVISION_FAKE_OPS.apply(TORCHVISION_EXCERPT).new_text
    body = adapted.split("import torchvision.extension  # noqa: F401\n", 1)[1]
    for has_ops in (True, False):
        registered = []

        def register_fake(name, registered=registered):
            def decorate(fn):
                registered.append(name)
                return fn
            return decorate

        library = types.SimpleNamespace(register_fake=register_fake,
                                        Library=lambda *args: types.SimpleNamespace(impl=lambda *a: None))
        ops = types.SimpleNamespace(torchvision=types.SimpleNamespace(qroi_align=types.SimpleNamespace(default=None)))
        torch = types.SimpleNamespace(library=library, ops=ops)
        torchvision = types.SimpleNamespace(extension=types.SimpleNamespace(_has_ops=lambda has_ops=has_ops: has_ops))
        namespace = {"torch": torch, "torchvision": torchvision, "functools": __import__("functools")}
        exec(compile(body, "meta", "exec"), namespace)  # noqa: S102
        assert registered == (["torchvision::nms", "torchvision::qnms"] if has_ops else [])
        assert callable(namespace["meta_nms"])
