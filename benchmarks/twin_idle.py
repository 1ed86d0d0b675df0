"""An idle twin is quiet: CPU of its three processes at rest, and the control path, before and after.

    python -m benchmarks twin_idle [--idle-seconds 30] [--requests 500] [--no-write]

For each NIXL progress-thread setting, in one run: sglang's own (``pthrDelay`` 0 µs: the
progress thread polls without pause) and the twin's (``sandbox.quiet_nixl``), a
0.5.15 twin is started, left alone for ``--idle-seconds`` (the CPU seconds its prefill,
decode and router processes use in that time, over the wall time, is the idle share of
one core; twin default 5 ms), then asked ``--requests`` 1 MiB requests one at a time (the decode's control
path, as in ``benchmarks.twin_control_path``). Targets: idle under 5% of one core, the
control path no more than 20% worse than with sglang's setting. The figures replace the
"Idle twin" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from datetime import UTC, datetime

import psutil

import forensics.twin as twin_api
from benchmarks._results import benchmark_parser, publish
from benchmarks.twin_control_path import control_path
from forensics.sandbox import quiet_nixl

BENCHMARK = "idle CPU of a twin's three processes over 30 s, and the control path, busy vs quiet NIXL progress"
SECTION_START = "<!-- twin-idle:start -->"
SECTION_END = "<!-- twin-idle:end -->"
TARGET_IDLE_SHARE = 0.05
TARGET_CONTROL_SLOWDOWN = 1.20
SETTINGS = (("sglang's own (pthrDelay 0 µs)", "0"),
            (f"twin (pthrDelay {quiet_nixl.PROGRESS_DELAY_US / 1000:g} ms)", str(quiet_nixl.PROGRESS_DELAY_US)))


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


def measure(label: str, delay: str, idle_seconds: float, requests: int) -> dict:
    saved = os.environ.get(quiet_nixl.DELAY_ENV)
    os.environ[quiet_nixl.DELAY_ENV] = delay  # the twin's processes inherit it
    try:
        with tempfile.TemporaryDirectory() as directory:
            twin = twin_api.up("0.5.15", directory=directory, prefill_rate_tps=1e9, decode_rate_tps=1000.0)
            try:
                fronts = [psutil.Process(twin.pid(role)) for role in ("prefill", "decode", "router")]
                processes = [proc for front in fronts for proc in (front, *front.children(recursive=True))]
                time.sleep(2.0)  # let start-up work finish before the idle window opens
                cpu0, wall0 = _cpu_seconds(processes), time.monotonic()
                time.sleep(idle_seconds)  # the measurement itself: the twin is left alone
                idle_share = (_cpu_seconds(processes) - cpu0) / (time.monotonic() - wall0)
                control, e2e = control_path(twin, requests)
            finally:
                twin.down()
    finally:
        if saved is None:
            os.environ.pop(quiet_nixl.DELAY_ENV, None)
        else:
            os.environ[quiet_nixl.DELAY_ENV] = saved
    return {"label": label, "delay_us": int(delay), "idle_share": idle_share,
            "control_median_ms": statistics.median(control),
            "control_p90_ms": statistics.quantiles(control, n=10)[-1],
            "e2e_median_ms": statistics.median(e2e) * 1000}


def section(rows: list[dict], idle_seconds: float, requests: int) -> str:
    busy, quiet = rows
    slowdown = quiet["control_median_ms"] / busy["control_median_ms"]
    load = os.getloadavg()
    lines = [
        SECTION_START,
        "## Idle twin: CPU at rest and the control path",
        "",
        f"`python -m benchmarks twin_idle` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; 2 CPUs). A 0.5.15 twin left alone for {idle_seconds:.0f} s "
        f"(CPU of prefill + decode + router over wall time, in one core), then {requests} 1 MiB requests one at "
        "a time; both NIXL progress-thread settings in the same run.",
        "",
        "| NIXL progress thread | idle CPU, 3 processes | control path median (p90) | client end to end median |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['label']} | {100 * row['idle_share']:.1f}% of one core | "
                     f"{row['control_median_ms']:.1f} ms ({row['control_p90_ms']:.1f} ms) | "
                     f"{row['e2e_median_ms']:.1f} ms |")
    idle_ok = quiet["idle_share"] < TARGET_IDLE_SHARE
    control_ok = slowdown <= TARGET_CONTROL_SLOWDOWN
    lines += [
        "",
        f"Idle target < {100 * TARGET_IDLE_SHARE:.0f}% of one core: **{'PASS' if idle_ok else 'FAIL'}** "
        f"({100 * quiet['idle_share']:.1f}%). Control path with the quiet setting / sglang's: "
        f"**{slowdown:.2f}x** (target ≤ {TARGET_CONTROL_SLOWDOWN:.2f}x): **{'PASS' if control_ok else 'FAIL'}**.",
        "The deviation from sglang (its agents' progress thread never sleeps) is stated in the README's "
        "fidelity section.",
        SECTION_END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("twin_idle", BENCHMARK)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args(argv)
    rows = [measure(label, delay, args.idle_seconds, args.requests) for label, delay in SETTINGS]
    text = section(rows, args.idle_seconds, args.requests)
    publish(text, SECTION_START, SECTION_END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
