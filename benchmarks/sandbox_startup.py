"""One engine-sandbox session end to end (target well under 2.5 s; verify runs two).

A session: start the child (import the release through the shim, real NIXL agents, bind the
PULL socket, start the release's bootstrap thread), create 4 rooms, build and send 6 frames
(registration, transfer info x3, ABORT, a foreign frame), settle, read room states and
exceptions, tear down. Wall time per phase, and the child's CPU time (user+sys), which is
what the machine's load does not inflate.

    python -m benchmarks.sandbox_startup [--runs 5] [--sglang 0.5.15 0.5.16]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from forensics.sandbox import EngineSandbox
from forensics.sglang_source import fetch

BENCHMARK = "engine sandbox: start, 6 frames, states, teardown (one verify run = two sessions)"


def one_session(source) -> dict[str, float]:
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    sb = EngineSandbox(source)
    ready = time.perf_counter()
    try:
        sb.create_rooms([1, 2, 3, 4])
        sb.send(sb.frames.registration())
        sb.send(sb.frames.transfer_info(room=1))
        sb.send(sb.frames.abort(room=2))
        sb.send(sb.frames.transfer_info(room=3))
        sb.send([b"FOREIGN", b"x"])
        sb.send(sb.frames.transfer_info(room=4))
        sb.settle()
        sb.room_states()
        sb.exceptions()
        driven = time.perf_counter()
    finally:
        sb.close()
    done = time.perf_counter()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {"start": ready - started, "drive": driven - ready, "teardown": done - driven,
            "total": done - started, "child_cpu": cpu}


def drive(sb) -> None:
    sb.create_rooms([1, 2, 3, 4])
    for frames in (sb.frames.registration(), sb.frames.transfer_info(room=1), sb.frames.abort(room=2),
                   sb.frames.transfer_info(room=3), [b"FOREIGN", b"x"], sb.frames.transfer_info(room=4)):
        sb.send(frames)
    sb.settle()
    sb.room_states()
    sb.exceptions()


def verify_pair(source, together: bool) -> float:
    """Two sessions as ``patch verify`` runs them (the same file twice here): one after the other,
    or both children started together (``wait_ready=False``)."""
    started = time.perf_counter()
    if together:
        pair = [EngineSandbox(source, wait_ready=False), EngineSandbox(source, wait_ready=False)]
        try:
            for sb in pair:
                drive(sb)
        finally:
            for sb in pair:
                sb.close()
    else:
        for _ in range(2):
            with EngineSandbox(source) as sb:
                drive(sb)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=BENCHMARK)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sglang", nargs="+", default=["0.5.15", "0.5.16"])
    args = parser.parse_args(argv)
    with open("/proc/loadavg") as handle:
        load = handle.read().split()[0]
    print(f"load average at start: {load}")
    for version in args.sglang:
        source = fetch(version)  # warm cache: the benchmark measures the sandbox, not pip
        runs = [one_session(source) for _ in range(args.runs)]
        for key in ("start", "drive", "teardown", "total", "child_cpu"):
            values = [r[key] for r in runs]
            print(f"sglang {version} {key:>9}: median {statistics.median(values):.3f}s "
                  f"min {min(values):.3f}s max {max(values):.3f}s")
        for together in (False, True):
            pairs = [verify_pair(source, together) for _ in range(args.runs)]
            label = "two sessions, started together" if together else "two sessions, one after the other"
            print(f"sglang {version} {label}: median {statistics.median(pairs):.3f}s "
                  f"min {min(pairs):.3f}s max {max(pairs):.3f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
