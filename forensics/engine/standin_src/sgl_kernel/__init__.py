"""A stand-in for sgl-kernel on a CPU without it: only the ops sglang's CPU path imports, in torch.

Installed into an engine environment (as the distribution ``pd-forensics-sgl-kernel-standin``),
never into the project's and never on a GPU host. PyPI's sgl-kernel/sglang-kernel builds are
CUDA-only; from 0.5.16 sglang's CPU path imports two of its CPU ops at module level
(``srt/mem_cache/allocation.py:46``, ``kernels/ops/kvcache/cache_move.py:10``) and calls the
first on every batch (``allocation.py:640``). Each op here follows the contract of sgl-kernel's
own CPU kernel (``sgl-kernel/csrc/cpu``: the same arguments, checks and result); its tests are
``tests/test_engine_kernel_standin.py``.

The scheduler's import chain also imports five speculative-decoding (EAGLE) ops at module level
(``srt/speculative/eagle_utils.py:52-55``, ``srt/speculative/spec_utils.py:84``,
``kernels/ops/speculative/eagle.py:10``). They are called only with ``--speculative-algorithm``,
which these engines never run: they import, and a call raises NotImplementedError naming the op.

Anything else is not provided: ``from sgl_kernel import X`` and ``import sgl_kernel.X`` raise
ImportError naming this stand-in, so sglang's own ``try/except ImportError`` fallbacks (GPTQ's
``gptq_gemm``, say) behave as without sgl-kernel. No ``torch.ops.sgl_kernel`` op is registered,
so ``cpu_has_amx_support()`` stays False and sglang keeps its torch paths.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import sys

import torch

PROVIDED = ("assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu")
# Imported at module level on the CPU path, called only by speculative decoding (never run here).
IMPORT_ONLY = ("assign_extend_cache_locs_cpu", "build_tree_kernel_efficient_cpu", "fill_accept_out_cache_loc_cpu",
               "fill_bonus_tokens_cpu", "verify_tree_greedy_cpu")
__all__ = [*PROVIDED, *IMPORT_ONLY]

_INDEX_TYPES = (torch.int32, torch.int64)


def _not_provided(name: str) -> str:
    return (f"sgl_kernel.{name} is not provided: this sgl_kernel is pd-forensics' torch stand-in for a CPU "
            f"without sgl-kernel, holding only {', '.join(PROVIDED)} (sglang's CPU path) and the import-only "
            f"{', '.join(IMPORT_ONLY)}; the rest needs a real "
            "sgl-kernel build")


def __getattr__(name: str):
    if name.startswith("__"):  # Python's own probes (hasattr(module, "__path__") and the like)
        raise AttributeError(name)
    raise ImportError(_not_provided(name), name=f"sgl_kernel.{name}")


def _import_only(name: str):
    def not_implemented(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is a speculative-decoding op that pd-forensics' torch stand-in only lets sglang "
            "import (its CPU path imports it at module level); speculative decoding needs a real sgl-kernel build")

    not_implemented.__name__ = not_implemented.__qualname__ = name
    return not_implemented


for _name in IMPORT_ONLY:
    globals()[_name] = _import_only(_name)
del _name


class _NoSubmodules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            raise ModuleNotFoundError(_not_provided(fullname.split(".", 1)[1]), name=fullname)
        return None


if not any(isinstance(finder, _NoSubmodules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _NoSubmodules())


def _check(condition: bool, what: str) -> None:
    if not condition:  # sgl-kernel's CHECK_* raise RuntimeError (c10::Error) too
        raise RuntimeError(what)


def _check_input(name: str, tensor: torch.Tensor) -> None:
    _check(tensor.device.type == "cpu", f"{name} must be a CPU tensor")
    _check(tensor.is_contiguous(), f"{name} must be contiguous")


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """Scatter freshly allocated KV slots into the request-to-token map, in place:
    ``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]] = out_cache_loc[p[i]:p[i+1]]``
    where ``p`` is the exclusive prefix sum of ``end_offset - start_offset``.

    Shapes and dtypes as sgl-kernel's: ``req_to_token`` [max_num_reqs, pool_len] int32;
    ``req_pool_indices`` [bs] int32 or int64; ``start_offset``/``end_offset`` [bs], one index dtype;
    ``out_cache_loc`` int64 with at least ``sum(end - start)`` entries (extra ones are ignored)."""
    for name, tensor in (("req_pool_indices", req_pool_indices), ("req_to_token", req_to_token),
                         ("start_offset", start_offset), ("end_offset", end_offset),
                         ("out_cache_loc", out_cache_loc)):
        _check_input(name, tensor)
    _check(req_to_token.dim() == 2, "req_to_token must be 2-D")
    _check(req_to_token.dtype == torch.int32, "req_to_token must be int32")
    _check(out_cache_loc.dtype == torch.int64, "out_cache_loc must be int64")
    _check(end_offset.dtype == start_offset.dtype, "end_offset and start_offset must have one dtype")
    _check(req_pool_indices.dtype in _INDEX_TYPES and start_offset.dtype in _INDEX_TYPES,
           "indices must be int32 or int64")
    _check(req_to_token.size(1) == pool_len, "req_to_token.size(1) must equal pool_len")
    batch_size = req_pool_indices.size(0)
    _check(start_offset.numel() == batch_size and end_offset.numel() == batch_size,
           "start_offset and end_offset need one entry per request")
    starts, ends, rows = start_offset.tolist(), end_offset.tolist(), req_pool_indices.tolist()
    total = sum(end - start for start, end in zip(starts, ends))
    _check(total <= out_cache_loc.numel(), f"assign_req_to_token_pool: out_cache_loc has {out_cache_loc.numel()} "
                                           f"entries but offsets require {total}")
    offset = 0
    for row, start, end in zip(rows, starts, ends):
        if end > start:
            req_to_token[row, start:end] = out_cache_loc[offset:offset + end - start].to(torch.int32)
        offset += end - start


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """For every K/V buffer ``b`` (base address ``data_ptrs[b]``, ``strides[b]`` bytes per slot row):
    ``buf_b[tgt_loc[i], :] = buf_b[src_loc[i], :]``, all source rows read before any target row is
    written (so overlapping ``tgt_loc``/``src_loc`` are safe), as sgl-kernel's CPU kernel does.

    ``data_ptrs`` uint64 [n], ``strides`` int64 [n], ``tgt_loc``/``src_loc`` one index dtype, [num_locs]."""
    for name, tensor in (("data_ptrs", data_ptrs), ("strides", strides), ("tgt_loc", tgt_loc), ("src_loc", src_loc)):
        _check_input(name, tensor)
    _check(data_ptrs.dtype == torch.uint64, "data_ptrs must be uint64")
    _check(strides.dtype == torch.int64, "strides must be int64")
    _check(tgt_loc.dtype == src_loc.dtype and tgt_loc.dtype in _INDEX_TYPES,
           "tgt_loc and src_loc must share one index dtype (int32 or int64)")
    _check(strides.numel() == data_ptrs.numel(), "one stride per buffer")
    _check(src_loc.numel() == tgt_loc.numel(), "tgt_loc and src_loc must have the same length")
    if data_ptrs.numel() == 0 or tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.to(torch.int64), src_loc.to(torch.int64)
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist()):
        # A byte view of the buffer's first `rows` slot rows (the kernel addresses them the same way).
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(address)
        buffer = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        buffer[tgt] = buffer[src]  # index_put of a gathered copy: gather, then scatter
