"""Twin up-and-healthy time from a warm wheel cache (target < 5 s; a real PD restart took 75 s).

    python -m benchmarks.twin_startup [--runs 3] [--sglang 0.5.15]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.request

import forensics.twin as twin_api
from forensics.sglang_source import fetch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sglang", default="0.5.15")
    args = parser.parse_args()
    fetch(args.sglang)  # warm cache
    totals = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as directory:
            started = time.monotonic()
            twin = twin_api.up(args.sglang, directory=directory)
            try:
                for base in (twin.prefill, twin.decode, twin.router):
                    with urllib.request.urlopen(base + "/health", timeout=30) as response:
                        assert response.status == 200
                totals.append(time.monotonic() - started)
                print(f"up+healthy {totals[-1]:.2f}s  per role {twin.timings}")
            finally:
                twin.down()
    print(f"median up+healthy over {args.runs} runs: {statistics.median(totals):.2f}s")


if __name__ == "__main__":
    main()
