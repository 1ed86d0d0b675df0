"""The README's main command end to end: ``forensics demo`` on the twin, target under 3 minutes.

    python -m benchmarks demo_story [--trials 3] [--no-write]

Each trial runs ``forensics demo --json --out DIR`` as a user would (a fresh interpreter, the
sglang wheel already cached): reproduce, diagnose, diff, patch, validate, report. Reports the
command's wall time per trial (the median against the 180 s target), each stage's share taken
from the demo's own step timings, and whether the story held.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._results import benchmark_parser, publish

BENCHMARK = "forensics demo (reproduce, diagnose, diff, patch, validate, report) end to end, target under 180 s"
SECTION_START = "<!-- demo-story:start -->"
SECTION_END = "<!-- demo-story:end -->"
TARGET_S = 180.0


def one_trial() -> dict:
    from forensics.demo import STAGES

    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "demo"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "forensics", "demo", "--json", "--out", str(out)],
                              capture_output=True, text=True, timeout=900)
        wall_s = time.perf_counter() - started
        document = json.loads(done.stdout)
        report_files = sorted(p.name for p in (out / "report").glob("report.*"))
    stages = {stage: sum(step["seconds"] for step in document["steps"] if step["stage"] == stage) for stage in STAGES}
    failed = [f"{step['stage']}/{step['name']}: {step['detail']}" for step in document["steps"] if not step["ok"]]
    return {"wall_s": wall_s, "exit": done.returncode, "ok": document["ok"], "stages": stages, "failed": failed,
            "report_files": report_files}


def section(trials: list[dict]) -> str:
    load = os.getloadavg()
    walls = [t["wall_s"] for t in trials]
    median = statistics.median(walls)
    verdict = "under" if median < TARGET_S else "OVER"
    held = sum(t["ok"] for t in trials)
    lines = [
        SECTION_START,
        "## The demo, end to end",
        "",
        f"`python -m benchmarks demo_story` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; 2 CPUs, sglang wheel cached).",
        "",
        f"- `forensics demo --json --out DIR` (sglang 0.5.15; validation: 12 sessions x 1 cycle), {len(trials)} "
        f"trials: median **{median:.1f} s** ({verdict} the {TARGET_S:.0f} s target), min {min(walls):.1f} s, "
        f"max {max(walls):.1f} s; the story held in {held} of {len(trials)}; the report written as "
        + ", ".join(trials[0]["report_files"]) + ".",
        "- Median seconds per stage (the demo's own step timings): "
        + ", ".join(f"{stage} {statistics.median(t['stages'][stage] for t in trials):.1f}"
                    for stage in trials[0]["stages"]) + ".",
    ]
    for number, trial in enumerate(trials, 1):
        if trial["failed"]:
            lines.append(f"- trial {number} (exit {trial['exit']}): " + "; ".join(trial["failed"]))
    lines.append(SECTION_END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("demo_story", BENCHMARK)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    trials = []
    for number in range(1, args.trials + 1):
        trials.append(one_trial())
        print(f"trial {number}: {trials[-1]['wall_s']:.1f} s, held: {trials[-1]['ok']}", file=sys.stderr)
    text = section(trials)
    publish(text, SECTION_START, SECTION_END, write=not args.no_write)
    return 0 if all(t["ok"] for t in trials) else 1


if __name__ == "__main__":
    raise SystemExit(main())
