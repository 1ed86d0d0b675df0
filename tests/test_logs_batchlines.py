"""Every "Prefill batch" / "Decode batch" variant from 0.5.1 to 0.5.23 becomes numbers."""

from __future__ import annotations

import math

import pytest

import forensics as fx
from forensics.logs import incident as gen

CASES = [
    # (line, expected subset of columns)
    ("[2025-07-01 12:00:00] Prefill batch. #new-seq: 2, #new-token: 512, #cached-token: 0, token usage: 0.01, "
     "#running-req: 0, #queue-req: 0, #prealloc-req: 3, #inflight-req: 1, input throughput (token/s): 1000.50",
     {"kind": "prefill", "new_seq": 2, "new_token": 512, "bootstrap_req": 3, "inflight_req": 1,
      "input_throughput": 1000.5}),
    ("[2025-07-01 12:00:00 TP1] Prefill batch [17], #new-seq: 1, #new-token: 8, #cached-token: 4, "
     "token usage: 0.00, #running-req: 0, #queue-req: 2, #pending-token: 0, #prealloc-req: 0, #inflight-req: 0, "
     "cuda graph: False, input throughput (token/s): 0.05",
     {"iter": 17, "tp_rank": 1, "queue_req": 2, "cached_token": 4, "cuda_graph": False, "bootstrap_req": 0}),
    ("[2025-07-01 12:00:00.123 DP1 PP2 TP3] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, "
     "full token usage: 0.10, swa token usage: 0.20, #running-req: 0, #queue-req: 0, #pending-token: 0, "
     "#bootstrap-req: 57, #inflight-req: 0, #optimistic-req: 2, waiting-image-req: 1, cuda graph: False, "
     "input throughput (token/s): 0.05, est. prefill TFLOPS/s (per GPU): 1.25, fwd occupancy: 45.50%",
     {"dp_rank": 1, "pp_rank": 2, "tp_rank": 3, "bootstrap_req": 57, "optimistic_req": 2, "full_token_usage": 0.10,
      "swa_token_usage": 0.20, "waiting_image_req": 1, "est_prefill_tflops": 1.25, "fwd_occupancy": 45.5}),
    ("[2025-07-01 12:00:00] Decode batch. #running-req: 3, #token: 4096, token usage: 0.02, "
     "gen throughput (token/s): 95.31, #queue-req: 0",
     {"kind": "decode", "running_req": 3, "token": 4096, "gen_throughput": 95.31}),
    ("[2025-07-01 12:00:00 TP0] Decode batch, #running-req: 3, #token: 4096, token usage: 0.02, "
     "accept len: 2.50, accept rate: 0.75, pre-allocated usage: 0.01, #prealloc-req: 4, #transfer-req: 12, "
     "#retracted-req: 1, cuda graph: True, gen throughput (token/s): 95.31, #queue-req: 0, "
     "est. decode TFLOPS/s (per GPU): 3.50, est. read BW (GB/s per GPU): 800.00, "
     "est. write BW (GB/s per GPU): 10.00",
     {"prealloc_req": 4, "transfer_req": 12, "retracted_req": 1, "accept_len": 2.5, "accept_rate": 0.75,
      "pre_allocated_usage": 0.01, "cuda_graph": True, "est_decode_tflops": 3.5, "est_read_bw": 800.0,
      "est_write_bw": 10.0}),
    ("[2025-07-01 12:00:00 TP0] Decode batch, #running-req: 1, #token: 10, mamba usage: 0.30, "
     "#prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, #host-receive-req: 2, cap len: 7.00, "
     "block accept len: 3.00, npu graph: True, gen throughput (token/s): 5.00, #queue-req: 0",
     {"mamba_usage": 0.3, "host_receive_req": 2, "cap_len": 7.0, "block_accept_len": 3.0, "cuda_graph": True}),
]


@pytest.mark.parametrize("line, expected", CASES)
def test_variant_parses_into_columns(tmp_path, line, expected):
    path = tmp_path / "server.log"
    path.write_text(line + "\n")
    scan = fx.logs.scan(path)
    assert len(scan.batches) == 1, scan.problems
    row = scan.batches.iloc[0]
    for column, value in expected.items():
        got = row[column]
        if isinstance(value, float):
            assert math.isclose(float(got), value, rel_tol=1e-6), (column, got)  # float32 columns
        else:
            assert got == value, (column, got)
    assert scan.lines_unknown == 0


@pytest.mark.parametrize("release", ["0.5.1", "0.5.3.post3", "0.5.4", "0.5.4.post1", "0.5.11", "0.5.12",
                                     "0.5.15", "0.5.23"])
def test_generated_release_formats_parse(tmp_path, release):
    incident = gen.generate(release, steady_seconds=10, after_seconds=10)
    paths = gen.write_sglang_logs(incident, tmp_path)
    batches = fx.logs.batch_stats(paths["prefill"])
    prefill = batches[batches["kind"] == "prefill"]
    assert len(prefill) > 10
    # Whatever the release calls it (#prealloc-req up to 0.5.11), it is the bootstrap queue.
    assert prefill["bootstrap_req"].notna().all()
    if release == "0.5.4":
        assert prefill["iter"].notna().all()
    else:
        assert prefill["iter"].isna().all()


def test_a_field_no_release_printed_yet_is_kept(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("[2025-07-01 12:00:00] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, "
                    "#brand-new-thing: 9, cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0\n")
    batches = fx.logs.batch_stats(path)
    assert batches.iloc[0]["brand_new_thing"] == 9
