"""Per-request control path, per KV backend: bootstrap plus a 1 MiB KV transfer, NIXL and Mooncake in one run.

    python -m benchmarks twin_control_path [--requests 500] [--sglang 0.5.15] [--backends nixl,mooncake] [--no-write]

Measured by the decode from a request's arrival to its KV pages verified: the decode's
transfer-info frame, the release's real bootstrap loop, the prefill scheduler's queues, the
transfer of 1 MiB (4096 tokens x 256 B) and its completion signal: for NIXL a UCX WRITE and
a notification; for Mooncake the release's transfer_worker's ``batch_transfer_sync`` over TCP
and the status frame its ``decode_thread`` reads. The prefill forward is made negligible (rate
1e9 tokens/s) so only the control path remains. Both twins run at the same time, one request
each in turn, so the machine's load hits both alike.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import urllib.request

import httpx

import forensics.twin as twin_api
from benchmarks._results import benchmark_parser, publish

BENCHMARK = "twin control path (bootstrap + 1 MiB KV transfer), NIXL beside Mooncake, median over N requests"
SECTION_START = "<!-- twin-control-path-backends:start -->"
SECTION_END = "<!-- twin-control-path-backends:end -->"
TOKENS_FOR_1_MIB = (1 << 20) // 256


def one_request(client: httpx.Client, twin) -> float:
    started = time.perf_counter()
    response = client.post(twin.router + "/generate", json={
        "input_ids": list(range(TOKENS_FOR_1_MIB)), "sampling_params": {"max_new_tokens": 1}})
    elapsed = time.perf_counter() - started
    meta = response.json()["meta_info"]
    assert meta["kv_intact"] and meta["kv_bytes"] == 1 << 20, meta
    return elapsed


def decode_control_path_ms(twin, requests: int) -> list[float]:
    with urllib.request.urlopen(twin.decode + "/server_info") as reply:
        state = json.load(reply)["internal_states"][0]["twin"]
    return state["recent_control_path_ms"][-requests:]


def control_path(twins: dict, requests: int) -> dict[str, dict]:
    """Per backend: decode-side control path ms and client end-to-end s, requests alternating."""
    e2e: dict[str, list[float]] = {b: [] for b in twins}
    with httpx.Client(timeout=30) as client:
        for _ in range(requests):
            for backend, twin in twins.items():
                e2e[backend].append(one_request(client, twin))
    return {b: {"control_ms": decode_control_path_ms(t, requests), "e2e_s": e2e[b]} for b, t in twins.items()}


def section(release: str, requests: int, results: dict[str, dict]) -> str:
    rows = []
    for backend, r in results.items():
        control = r["control_ms"]
        rows.append(f"| {backend} | {statistics.median(control):.1f} ms | "
                    f"{statistics.quantiles(control, n=10)[-1]:.1f} ms | "
                    f"{statistics.median(r['e2e_s']) * 1000:.1f} ms |")
    return "\n".join([
        SECTION_START,
        f"## Twin control path per backend (`python -m benchmarks twin_control_path --requests {requests}`)",
        "",
        f"sglang {release}, both twins up at once, requests alternating between them, {requests} each, on the "
        "shared 2-core machine. Control path = decode arrival to 1 MiB of KV verified intact (the release's "
        "bootstrap loop, scheduler queues, the transfer and its completion signal); NIXL writes over UCX, "
        "Mooncake with sglang's MooncakeTransferEngine over TCP (loopback). It includes the twin's own costs "
        "(4096 input ids parsed by three servers, the synthetic payload generated on both sides, 5 ms polls).",
        "",
        "| backend | control path median | p90 | client end to end median |",
        "|---|---|---|---|",
        *rows,
        SECTION_END,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("twin_control_path", BENCHMARK)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--sglang", default="0.5.15")
    parser.add_argument("--backends", default="nixl,mooncake")
    args = parser.parse_args(argv)
    twins = {}
    with tempfile.TemporaryDirectory() as directory:
        try:
            for backend in (b for b in args.backends.split(",") if b):
                twins[backend] = twin_api.up(args.sglang, backend=backend, directory=f"{directory}/{backend}",
                                             prefill_rate_tps=1e9, decode_rate_tps=1000.0)
            results = control_path(twins, args.requests)
        finally:
            for twin in twins.values():
                twin.down()
    for backend, r in results.items():
        print(f"{backend}: control path median {statistics.median(r['control_ms']):.2f} ms, client e2e median "
              f"{statistics.median(r['e2e_s']) * 1000:.2f} ms", file=sys.stderr)
    text = section(args.sglang, args.requests, results)
    publish(text, SECTION_START, SECTION_END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
