"""Twin up-and-healthy time from a warm wheel cache, per KV backend (target < 5 s; a real PD restart took 75 s).

    python -m benchmarks twin_startup [--runs 5] [--sglang 0.5.15] [--backends nixl,mooncake] [--no-write]

Each run starts a twin (prefill, decode, router) with the backend's real transfer engine (NIXL
over UCX, or sglang's MooncakeTransferEngine over TCP), waits until all three answer /health,
and takes it down; runs of the backends alternate so load on the shared machine hits both alike.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import urllib.request

import forensics.twin as twin_api
from benchmarks._results import benchmark_parser, publish
from forensics.sglang_source import fetch

BENCHMARK = "twin up + healthy from a warm wheel cache, NIXL and Mooncake, target under 5 s (median)"
SECTION_START = "<!-- twin-startup-backends:start -->"
SECTION_END = "<!-- twin-startup-backends:end -->"
TARGET_S = 5.0


def one_run(release: str, backend: str) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as directory:
        started = time.monotonic()
        twin = twin_api.up(release, backend=backend, directory=directory)
        try:
            for base in (twin.prefill, twin.decode, twin.router):
                with urllib.request.urlopen(base + "/health", timeout=30) as response:
                    assert response.status == 200
            return time.monotonic() - started, dict(twin.timings or {})
        finally:
            twin.down()


def section(release: str, totals: dict[str, list[float]], timings: dict[str, list[dict]]) -> str:
    rows = []
    for backend, values in totals.items():
        prefill = statistics.median(t["prefill"] for t in timings[backend])
        runs = " / ".join(f"{v:.2f}" for v in values)
        verdict = "under" if statistics.median(values) < TARGET_S else "OVER"
        rows.append(f"| {backend} | {statistics.median(values):.2f} s ({verdict} the 5 s target) | {runs} | "
                    f"{prefill:.2f} s |")
    return "\n".join([
        SECTION_START,
        f"## Twin start-up per backend (`python -m benchmarks twin_startup --runs {len(values)}`)",
        "",
        f"sglang {release}, warm wheel cache, runs of the two backends interleaved, on the shared 2-core machine "
        "(other sessions' tests running). Up + healthy = `fx.twin.up` returns and all three roles answer /health.",
        "",
        "| backend | median up + healthy | runs | prefill ready (median) |",
        "|---|---|---|---|",
        *rows,
        SECTION_END,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("twin_startup", BENCHMARK)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sglang", default="0.5.15")
    parser.add_argument("--backends", default="nixl,mooncake")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    fetch(args.sglang)  # warm cache
    totals: dict[str, list[float]] = {b: [] for b in backends}
    timings: dict[str, list[dict]] = {b: [] for b in backends}
    for _ in range(args.runs):
        for backend in backends:
            total, roles = one_run(args.sglang, backend)
            totals[backend].append(total)
            timings[backend].append(roles)
            print(f"{backend}: up+healthy {total:.2f}s  per role {roles}", file=sys.stderr)
    text = section(args.sglang, totals, timings)
    publish(text, SECTION_START, SECTION_END, write=not args.no_write)
    return 0 if all(statistics.median(v) < TARGET_S for v in totals.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
