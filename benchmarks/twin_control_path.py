"""Per-request control-path overhead: bootstrap plus a NIXL transfer of 1 MiB, median over 500 requests.

Measured by the decode from a request's arrival to its KV pages verified: the decode's
transfer-info frame, the release's real bootstrap loop, the prefill scheduler's queues,
the NIXL WRITE of 1 MiB (4096 tokens x 256 B) and its notification. The prefill
forward is made negligible (rate 1e9 tokens/s) so only the control path remains.

    python -m benchmarks.twin_control_path [--requests 500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request

import httpx

import forensics.twin as twin_api

TOKENS_FOR_1_MIB = (1 << 20) // 256


def control_path(twin, requests: int) -> tuple[list[float], list[float]]:
    """(decode-side control path ms, client end-to-end s) of ``requests`` 1 MiB requests, one at a time."""
    e2e = []
    with httpx.Client(timeout=30) as client:
        for _ in range(requests):
            started = time.perf_counter()
            response = client.post(twin.router + "/generate", json={
                "input_ids": list(range(TOKENS_FOR_1_MIB)), "sampling_params": {"max_new_tokens": 1}})
            e2e.append(time.perf_counter() - started)
            meta = response.json()["meta_info"]
            assert meta["kv_intact"] and meta["kv_bytes"] == 1 << 20
    with urllib.request.urlopen(twin.decode + "/server_info") as reply:
        state = json.load(reply)["internal_states"][0]["twin"]
    return state["recent_control_path_ms"][-requests:], e2e


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        twin = twin_api.up("0.5.15", directory=directory, prefill_rate_tps=1e9, decode_rate_tps=1000.0)
        try:
            control, e2e = control_path(twin, args.requests)
        finally:
            twin.down()
    print(f"control path (decode arrival -> 1 MiB KV verified), median over {len(control)}: "
          f"{statistics.median(control):.2f} ms (p90 {statistics.quantiles(control, n=10)[-1]:.2f} ms)")
    print(f"client end-to-end through the router, median: {statistics.median(e2e) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
