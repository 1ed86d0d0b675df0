"""The handler map over every 0.5.x release: time to map all of them, cold and from the row cache.

``python -m benchmarks handler_matrix [--workers N] [--write]``. Wheels must already be in
the cache (the first run downloads them; that time is reported apart and is not the
figure). "cold" recomputes every release's map (parse + analysis); "cached" reads the
per-release rows the first pass stored. ``--write`` replaces this benchmark's section of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import time
from datetime import UTC, datetime
from pathlib import Path

BENCHMARK = "map 42 sglang releases: cold analysis and cached rows (target < 60 s warm)"
START, END = "<!-- handler-matrix:start -->", "<!-- handler-matrix:end -->"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks handler_matrix")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args(argv)

    import shutil

    from forensics.cache import cache_dir
    from forensics.handlers.handler_map import build
    from forensics.handlers.release_matrix import matrix
    from forensics.sglang_source import available_releases, fetch

    releases = available_releases("0.5.1", "0.5.23")
    started = time.perf_counter()
    for version in releases:
        fetch(version)
    fetch_s = time.perf_counter() - started

    shutil.rmtree(cache_dir() / "handlers", ignore_errors=True)
    load = os.getloadavg()
    cpu_before = os.times()
    started = time.perf_counter()
    cold = matrix(releases, workers=args.workers, use_cache=True)
    cold_s = time.perf_counter() - started
    cpu_after = os.times()
    started = time.perf_counter()
    cached = matrix(releases, workers=args.workers, use_cache=True)
    cached_s = time.perf_counter() - started
    assert cold.frame.equals(cached.frame), "cached rows differ from the computed ones"

    single = []
    for version in ("0.5.15", "0.5.23"):
        t0 = time.perf_counter()
        build(fetch(version))
        single.append((version, time.perf_counter() - t0))

    window = cold.window_text("nixl")
    cpu_children = (cpu_after.children_user + cpu_after.children_system) - (
        cpu_before.children_user + cpu_before.children_system)
    lines = [
        START,
        "## Handler map (release matrix)",
        "",
        "`python -m benchmarks handler_matrix --workers 2` "
        f"(date {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} CPUs, load average at start "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; Python {platform.python_version()}).",
        "",
        "| measure | figure | target | |",
        "|---|---|---|---|",
        f"| {len(releases)} releases, wheels cached, cold analysis ({args.workers} workers) | **{cold_s:.1f} s** wall, "
        f"{cpu_children:.1f} s CPU in workers | < 60 s | {'PASS' if cold_s < 60 else 'FAIL'} |",
        f"| {len(releases)} releases, rows cached (sha256-keyed) | **{cached_s:.2f} s** | < 60 s | "
        f"{'PASS' if cached_s < 60 else 'FAIL'} |",
        *(f"| one release, `build()` in this process ({v}) | {s:.2f} s | | |" for v, s in single),
        f"| making sure every wheel is cached (`fetch`) | {fetch_s:.1f} s | | |",
        "",
        f"Window read off the rows: NIXL prefill killed by the decode's own ABORT in {window}.",
        "The machine is shared (load above); the cold figure is wall time with other jobs running.",
        END,
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        results = Path(__file__).with_name("RESULTS.md")
        current = results.read_text() if results.exists() else ""
        if START in current:
            current = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _m: text, current, flags=re.S)
        else:
            current = current.rstrip("\n") + "\n\n" + text + "\n"
        results.write_text(current)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
