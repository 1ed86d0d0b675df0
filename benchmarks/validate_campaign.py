"""A validation campaign on a patched twin: 60 sessions, 2 cycles, every check after each cycle.

    python -m benchmarks validate_campaign [--sessions 60] [--cycles 2] [--no-write]

``fx.validate`` against a patched 0.5.15 twin (started first, not timed; a small decode KV
pool so most killed sessions wait in prealloc and some in transfer): per cycle the storm
(sessions opened, killed at once in the KV phase), the settle, the collection (probes and
metrics sampling, thread dumps, logs) and the diagnosis, then the four checks. Reports the
campaign's wall time against the 90 s target, each cycle's share, and the aborts each cycle
produced (a campaign without aborts would prove nothing).
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._results import benchmark_parser, publish

BENCHMARK = "validation campaign on a patched twin: 60 sessions x 2 cycles, target under 90 s"
SECTION_START = "<!-- validate-campaign:start -->"
SECTION_END = "<!-- validate-campaign:end -->"
TARGET_S = 90.0
TWIN = {"pool_pages": 160, "waiting_timeout": 15}


def measure(sessions: int, cycles: int, prompt_tokens: int, sample_s: float) -> dict:
    import forensics as fx
    import forensics.twin as twin_api

    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        twin = twin_api.up("0.5.15", patched=True, directory=Path(directory) / "twin", **TWIN)
        up_s = time.perf_counter() - started
        stages: list[tuple[float, dict]] = []
        try:
            began = time.perf_counter()
            campaign = fx.validate(twin, cycles=cycles, sessions=sessions, prompt_tokens=prompt_tokens,
                                   max_tokens=16, phase="kv", kill_after=0, sample_s=sample_s,
                                   progress=lambda info: stages.append((time.perf_counter(), info)))
            wall_s = time.perf_counter() - began
        finally:
            twin.down()
    per_cycle = []
    for cy in campaign.cycles:
        marks = [t for t, info in stages if info.get("cycle") == cy.cycle]
        checks_at = next((t for t, info in stages if info.get("cycle") == cy.cycle
                          and info.get("stage") == "checking"), None)
        per_cycle.append({"cycle": cy.cycle, "status": cy.status, "aborts": cy.storm.abort_count,
                          "prealloc": cy.storm.aborts.get("prealloc", 0), "transfer": cy.storm.aborts.get("transfer", 0),
                          "prefill_abort_frames": cy.storm.prefill_abort_frames, "killed": cy.storm.killed,
                          "storm_s": (checks_at - marks[0]) if marks and checks_at else None,
                          "span_s": (marks[-1] - marks[0]) if marks else None,
                          "checks": {c.name: c.status for c in cy.checks}})
    return {"sessions": sessions, "cycles": cycles, "prompt_tokens": prompt_tokens, "sample_s": sample_s,
            "up_s": up_s, "wall_s": wall_s, "status": campaign.status, "summary": campaign.summary(),
            "per_cycle": per_cycle}


def section(result: dict) -> str:
    load = os.getloadavg()
    verdict = "under" if result["wall_s"] < TARGET_S else "OVER"
    lines = [
        SECTION_START,
        "## Validation campaign",
        "",
        f"`python -m benchmarks validate_campaign` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; 2 CPUs).",
        "",
        f"- `fx.validate` on a patched 0.5.15 twin, {result['sessions']} sessions x {result['cycles']} cycles "
        f"({result['prompt_tokens']} prompt tokens, killed at once in the KV phase, {result['sample_s']:g} s "
        f"sampling per check): **{result['wall_s']:.1f} s** ({verdict} the {TARGET_S:.0f} s target); "
        f"campaign **{result['status']}**. Twin start (not counted): {result['up_s']:.1f} s.",
    ]
    for cy in result["per_cycle"]:
        storm = f"storm to checks {cy['storm_s']:.1f} s, " if cy["storm_s"] is not None else ""
        lines.append(f"- cycle {cy['cycle']}: {storm}{cy['killed']} killed, {cy['aborts']} aborts "
                     f"({cy['prealloc']} prealloc, {cy['transfer']} transfer), {cy['prefill_abort_frames']} ABORT "
                     f"frames at the prefill; checks " + ", ".join(f"{k} {v}" for k, v in cy["checks"].items()))
    if result["status"] != "PASS":
        lines.append(f"- {result['summary']}")
    lines.append(SECTION_END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("validate_campaign", BENCHMARK)
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=1200)
    parser.add_argument("--sample", type=float, default=8.0, help="seconds each check's probes and metrics sample")
    args = parser.parse_args(argv)
    result = measure(args.sessions, args.cycles, args.prompt_tokens, args.sample)
    text = section(result)
    publish(text, SECTION_START, SECTION_END, write=not args.no_write)
    return 0
