"""Run by an engine environment's python (it has torch): the sgl-kernel stand-in against its contract.

The contract is sgl-kernel's own CPU kernels (``sgl-kernel/csrc/cpu``): for
``assign_req_to_token_pool_cpu``, ``req_to_token[rpi[i], start[i]:end[i]] = out_cache_loc[p[i]:p[i+1]]``
(``p`` the exclusive prefix sum of the lengths; extra ``out_cache_loc`` entries ignored; int32 or
int64 indices; CHECKs on dtypes, ``pool_len`` and a too-short ``out_cache_loc``); for
``copy_all_layer_kv_cache_cpu``, ``buf_b[tgt[i]] = buf_b[src[i]]`` for every buffer ``b`` given by
base address and row stride in bytes, all sources staged before any target is written. The
references below are written independently of the stand-in (plain Python loops over lists).
Prints one JSON object: check name -> "ok" or what went wrong.
"""

from __future__ import annotations

import json
import random
import sys
import traceback

import torch

results: dict[str, str] = {}


def check(name):
    def run(function):
        try:
            function()
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - every failure is reported by name
            results[name] = traceback.format_exc(limit=3)
        return function
    return run


def assign_reference(rpi, table, starts, ends, locs):
    rows = [list(row) for row in table.tolist()]
    offset = 0
    for row, start, end in zip(rpi, starts, ends):
        for j in range(start, end):
            rows[row][j] = locs[offset + j - start]
        offset += max(end - start, 0)
    return rows


@check("assign matches the kernel's scatter on random batches, int32 and int64 indices")
def _():
    from sgl_kernel import assign_req_to_token_pool_cpu

    rng = random.Random(20)
    for trial in range(60):
        num_reqs, pool_len = rng.randint(1, 12), rng.randint(1, 300)
        bs = rng.randint(1, num_reqs)
        rpi = rng.sample(range(num_reqs), bs)
        starts = [rng.randint(0, pool_len) for _ in range(bs)]
        ends = [rng.randint(start, pool_len) for start in starts]
        total = sum(e - s for s, e in zip(starts, ends))
        spare = rng.randint(0, 5)  # callers may size out_cache_loc above the total
        locs = [rng.randrange(0, 2**31 - 1) for _ in range(total + spare)]
        table = torch.randint(-(2**31), 2**31 - 1, (num_reqs, pool_len), dtype=torch.int32)
        expected = assign_reference(rpi, table, starts, ends, locs)
        index_dtype = (torch.int32, torch.int64)[trial % 2]
        offset_dtype = (torch.int64, torch.int32)[(trial // 2) % 2]
        assign_req_to_token_pool_cpu(torch.tensor(rpi, dtype=index_dtype), table,
                                     torch.tensor(starts, dtype=offset_dtype), torch.tensor(ends, dtype=offset_dtype),
                                     torch.tensor(locs, dtype=torch.int64), pool_len)
        assert table.dtype == torch.int32
        assert table.tolist() == expected, f"trial {trial}"


@check("assign as sglang's allocator calls it (0.5.16 allocation.py:640): lens tensors, in place")
def _():
    from sgl_kernel import assign_req_to_token_pool_cpu

    req_to_token = torch.zeros((4, 16), dtype=torch.int32)
    view = req_to_token  # sglang passes ReqToTokenPool.req_to_token itself and reads it back
    cur, nxt = torch.tensor([0, 5], dtype=torch.int64), torch.tensor([3, 7], dtype=torch.int64)
    assign_req_to_token_pool_cpu(torch.tensor([2, 0]), view, cur, nxt, torch.tensor([40, 41, 42, 50, 51]),
                                 req_to_token.shape[1])
    assert req_to_token[2, :3].tolist() == [40, 41, 42] and req_to_token[0, 5:7].tolist() == [50, 51]
    assert int(req_to_token.count_nonzero()) == 5


def raises(function, message):
    try:
        function()
    except RuntimeError as error:
        assert message in str(error), str(error)
        return
    raise AssertionError(f"no RuntimeError containing {message!r}")


@check("assign refuses what the kernel's CHECKs refuse")
def _():
    from sgl_kernel import assign_req_to_token_pool_cpu

    idx = torch.tensor([0])
    raises(lambda: assign_req_to_token_pool_cpu(idx, torch.zeros((1, 4), dtype=torch.int64), torch.tensor([0]),
                                                torch.tensor([1]), torch.tensor([7]), 4), "int32")
    raises(lambda: assign_req_to_token_pool_cpu(idx, torch.zeros((1, 4), dtype=torch.int32), torch.tensor([0]),
                                                torch.tensor([1]), torch.tensor([7], dtype=torch.int32), 4), "int64")
    raises(lambda: assign_req_to_token_pool_cpu(idx, torch.zeros((1, 4), dtype=torch.int32), torch.tensor([0]),
                                                torch.tensor([3]), torch.tensor([7, 8]), 4), "offsets require 3")
    raises(lambda: assign_req_to_token_pool_cpu(idx, torch.zeros((1, 4), dtype=torch.int32), torch.tensor([0]),
                                                torch.tensor([1]), torch.tensor([7]), 5), "pool_len")
    raises(lambda: assign_req_to_token_pool_cpu(idx, torch.zeros((1, 4), dtype=torch.int32),
                                                torch.tensor([0], dtype=torch.int32), torch.tensor([1]),
                                                torch.tensor([7]), 4), "one dtype")


def kv_buffers(layers, size, heads, dim, dtype):
    return [torch.randn(size, heads, dim).to(dtype) for _ in range(2 * layers)]


def pointers(buffers):
    return (torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64),
            torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64))


@check("copy moves every layer's K and V rows, gather before scatter, int32 and int64 locations")
def _():
    from sgl_kernel import copy_all_layer_kv_cache_cpu

    rng = random.Random(16)
    for trial in range(30):
        size = rng.randint(2, 64)
        buffers = kv_buffers(rng.randint(1, 3), size, rng.randint(1, 4), rng.choice((8, 64)),
                             (torch.bfloat16, torch.float32)[trial % 2])
        n = rng.randint(1, size)
        src = rng.sample(range(size), n)
        tgt = rng.sample(range(size), n)  # overlaps src arbitrarily
        expected = []
        for b in buffers:
            rows = [r.clone() for r in b]
            staged = [rows[s].clone() for s in src]
            for t, row in zip(tgt, staged):
                rows[t] = row
            expected.append(torch.stack(rows))
        data_ptrs, strides = pointers(buffers)
        dtype = (torch.int64, torch.int32)[(trial // 2) % 2]
        copy_all_layer_kv_cache_cpu(data_ptrs, strides, torch.tensor(tgt, dtype=dtype), torch.tensor(src, dtype=dtype))
        for b, e in zip(buffers, expected):
            assert torch.equal(b.view(torch.uint8) if b.dtype == torch.bfloat16 else b,
                               e.view(torch.uint8) if e.dtype == torch.bfloat16 else e), f"trial {trial}"


@check("copy of nothing is a no-op; bad dtypes are refused")
def _():
    from sgl_kernel import copy_all_layer_kv_cache_cpu

    buffers = kv_buffers(1, 4, 1, 8, torch.float32)
    before = [b.clone() for b in buffers]
    data_ptrs, strides = pointers(buffers)
    empty = torch.tensor([], dtype=torch.int64)
    copy_all_layer_kv_cache_cpu(data_ptrs, strides, empty, empty)
    assert all(torch.equal(a, b) for a, b in zip(buffers, before))
    raises(lambda: copy_all_layer_kv_cache_cpu(data_ptrs.to(torch.int64), strides, empty, empty), "uint64")
    raises(lambda: copy_all_layer_kv_cache_cpu(data_ptrs, strides, torch.tensor([1]),
                                               torch.tensor([0], dtype=torch.int32)), "index dtype")


@check("anything else is an ImportError naming the stand-in; no torch.ops.sgl_kernel op appears")
def _():
    import sgl_kernel

    try:
        from sgl_kernel import rmsnorm  # noqa: F401
    except ImportError as error:
        assert "stand-in" in str(error) and "rmsnorm" in str(error), str(error)
    else:
        raise AssertionError("rmsnorm imported")
    try:
        import sgl_kernel.kvcacheio  # noqa: F401
    except ImportError as error:
        assert "stand-in" in str(error) and "kvcacheio" in str(error), str(error)
    else:
        raise AssertionError("sgl_kernel.kvcacheio imported")
    assert not hasattr(sgl_kernel, "__wrapped__")  # Python's own probes still get AttributeError
    # What sglang's utils/common.py:306 reads to turn the AMX paths on: it must stay off.
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
    assert sgl_kernel.PROVIDED == ("assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu")
    for name in sgl_kernel.IMPORT_ONLY:  # speculative decoding: imports, refuses to run
        try:
            getattr(sgl_kernel, name)(torch.zeros(1))
        except NotImplementedError as error:
            assert name in str(error) and "speculative" in str(error), str(error)
        else:
            raise AssertionError(f"{name} ran")


@check("sglang's own callers (0.5.16 allocation.py:631, cache_move.py:96) run on the stand-in")
def _():
    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_func
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool_func

    req_to_token = torch.zeros((3, 8), dtype=torch.int32)
    assign_req_to_token_pool_func(torch.tensor([1, 2]), req_to_token, torch.tensor([0, 2]), torch.tensor([2, 5]),
                                  torch.tensor([11, 12, 21, 22, 23]), 2)
    assert req_to_token.tolist() == [[0] * 8, [11, 12, 0, 0, 0, 0, 0, 0], [0, 0, 21, 22, 23, 0, 0, 0]]
    buffers = kv_buffers(2, 8, 2, 8, torch.bfloat16)
    expected = [b.clone() for b in buffers]
    for e in expected:
        e[[5, 6]] = e[[1, 5]].clone()
    data_ptrs, strides = pointers(buffers)
    # tgt/src are padded beyond num_locs as the pool's caller pads them; only the first num_locs move.
    copy_all_layer_kv_cache_func(data_ptrs, strides, torch.tensor([5, 6, 0, 0]), torch.tensor([1, 5, 7, 7]), 2, 4, {})
    assert all(torch.equal(b.view(torch.uint8), e.view(torch.uint8)) for b, e in zip(buffers, expected))


json.dump(results, sys.stdout)
