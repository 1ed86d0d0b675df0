"""Wall time of one ``forensics patch verify`` (unpatched + patched file; target under 5 s).

Each run is ``verify_release(X)`` in this process: fetch from the cache, the patched file
from its cache (the codemod itself runs once per release and codemod version; its cost is
reported separately), then two engine sandboxes side by side. Reports wall time per run
with the sandboxes' phases (start, scenario, close), the children's CPU time (which the
machine's load does not inflate) and the load average, since the dev machine is shared.

    python -m benchmarks.patch_verify [--runs 3] [--sglang 0.5.15 0.5.23]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from forensics.sglang_source import fetch
from patched_engine.codemod import patch_source
from patched_engine.verify import verify_release

BENCHMARK = "patch verify: one run = codemod (cached) + unpatched and patched sandbox side by side"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sglang", nargs="+", default=["0.5.15", "0.5.23"])
    args = parser.parse_args(argv)
    print(f"load average at start {os.getloadavg()}")
    worst = 0.0
    for version in args.sglang:
        text = fetch(version).backend_file("nixl").read_text()
        started = time.perf_counter()
        patch_source(text, version)
        codemod_s = time.perf_counter() - started
        walls = []
        for run in range(args.runs):
            cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            result = verify_release(version)
            cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            child_cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
            walls.append(result.elapsed_s)
            phases = {k: {p: round(v, 2) for p, v in run_.timings.items()}
                      for k, run_ in (("unpatched", result.unpatched), ("patched", result.patched))}
            print(
                f"sglang {version} run {run + 1}: {result.verdict} in {result.elapsed_s:.2f} s wall, "
                f"children CPU {child_cpu:.2f} s, phases {phases}, load {os.getloadavg()[0]:.1f}"
            )
        median = statistics.median(walls)
        worst = max(worst, median)
        print(f"sglang {version}: median {median:.2f} s (min {min(walls):.2f}); codemod alone {codemod_s:.2f} s (cached after)")
    return 0 if worst < 5.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
