"""Does the storm hit the KV-pending window every time? The acceptance commands, N times per release.

    python -m benchmarks storm_kv_hits [--runs 10] [--release 0.5.15[=N] ...] [--no-write]

For each vulnerable release (0.5.13 to 0.5.15.post1) and each of the four commands, with the
default options (the nemesis strikes each session when the decode is seen holding it pending
KV), ``--runs`` times, each run on a fresh twin (an unpatched one wedges on its first storm):

* ``forensics validate --inventory INV --cycles 1 --sessions 20`` on an unpatched twin: expect 1 (FAIL);
* the same on a patched twin (``twin up --patched``): expect 0 (PASS);
* ``forensics storm --inventory INV --sessions 8 --cycles 1 --phase kv`` unpatched: expect 1;
* the same patched: expect 0.

Reports per release and command how many runs exited as expected, the exit statuses seen,
the aborts the decode's own lines attribute (prealloc / transfer) and which evidence chose
the kills (``observed_by``: the decode's arrival counter, or the client's fallback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._results import benchmark_parser, publish

BENCHMARK = "storm and validate hit the KV window: the 4 acceptance commands N times per vulnerable release"
SECTION_START = "<!-- storm-kv-hits:start -->"
SECTION_END = "<!-- storm-kv-hits:end -->"
RELEASES = ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1")
COMMANDS = (  # (name, patched twin, argv after the inventory, expected exit)
    ("validate unpatched", False, ("validate", "--cycles", "1", "--sessions", "20"), 1),
    ("validate patched", True, ("validate", "--cycles", "1", "--sessions", "20"), 0),
    ("storm --phase kv unpatched", False, ("storm", "--sessions", "8", "--cycles", "1", "--phase", "kv"), 1),
    ("storm --phase kv patched", True, ("storm", "--sessions", "8", "--cycles", "1", "--phase", "kv"), 0),
)
ROOT = Path(__file__).resolve().parent.parent


def _aborts(doc: dict) -> tuple[int, int, list[str]]:
    """(prealloc, transfer, observed_by) of a storm's or a campaign's JSON document."""
    cycles = doc.get("cycles") or []
    prealloc = transfer = 0
    observed: list[str] = []
    for cycle in cycles:
        storm = cycle.get("storm", cycle)
        aborts = storm.get("aborts") or {}
        prealloc += int(aborts.get("prealloc", 0))
        transfer += int(aborts.get("transfer", 0))
        observed += [s.get("observed_by") for s in storm.get("strikes", []) if s.get("observed_by")]
    return prealloc, transfer, observed


def summary(doc: dict, stderr: str) -> str:
    """A run's one line, with what its last cycle's diagnosis said and how the drain went: a miss
    must say why (a late probe, a busy engine), not only that the verdict was not the one expected."""
    line = str(doc.get("summary") or stderr[-300:])
    cycles = doc.get("cycles") or []
    storm = (cycles[-1].get("storm") or cycles[-1]) if cycles else {}
    reasons = "; ".join(str(r) for r in (storm.get("reasons") or [])[:3])
    drained = storm.get("drained") or {}
    if reasons:
        line += f" [diagnosis: {reasons}]"
    if drained:
        line += f" [drain {drained.get('seconds')} s, slowest /health {drained.get('health_s')} s]"
    return line


def one_run(release: str, patched: bool, argv: tuple[str, ...]) -> dict:
    import forensics.twin as twin_api

    with tempfile.TemporaryDirectory() as directory:
        twin = twin_api.up(release, patched=patched, directory=Path(directory) / "twin")
        try:
            started = time.perf_counter()
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            done = subprocess.run([sys.executable, "-m", "forensics", argv[0], "--inventory",
                                   str(twin.inventory_path), *argv[1:], "--json"],
                                  capture_output=True, text=True, env=env, timeout=600)
            wall_s = time.perf_counter() - started
        finally:
            twin.down()
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {}
    prealloc, transfer, observed = _aborts(doc)
    return {"exit": done.returncode, "wall_s": wall_s, "prealloc": prealloc, "transfer": transfer,
            "observed_by": observed, "summary": summary(doc, done.stderr)}


def measure(releases: list[tuple[str, int]], progress=print) -> list[dict]:
    rows = []
    for release, runs in releases:
        for name, patched, argv, expected in COMMANDS:
            results = []
            for run in range(runs):
                result = one_run(release, patched, argv)
                results.append(result)
                progress(f"{release} {name} run {run + 1}/{runs}: exit {result['exit']} "
                         f"({result['prealloc']}+{result['transfer']} aborts, {result['wall_s']:.1f} s)")
            rows.append({"release": release, "command": name, "argv": argv, "expected": expected, "runs": runs,
                         "as_expected": sum(r["exit"] == expected for r in results),
                         "exits": dict(Counter(r["exit"] for r in results)),
                         "aborts_min": min(r["prealloc"] + r["transfer"] for r in results),
                         "prealloc": sum(r["prealloc"] for r in results),
                         "transfer": sum(r["transfer"] for r in results),
                         "observed_by": dict(Counter(o for r in results for o in r["observed_by"])),
                         "wall_s_mean": sum(r["wall_s"] for r in results) / len(results),
                         "misses": [r["summary"] for r in results if r["exit"] != expected][:2]})
    return rows


def section(rows: list[dict]) -> str:
    load = os.getloadavg()
    lines = [
        SECTION_START,
        "## Storm and validate hit the KV window (`python -m benchmarks storm_kv_hits`)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; 2 CPUs "
        "shared with other sessions. Each run on a fresh twin (default twin settings), the command with its "
        "default options plus `--json`; the nemesis strikes each session when the decode is seen holding it "
        "pending KV. Aborts: as the decode's own lines attribute them, summed over the runs (fewest in one run).",
        "",
        "| release | command | as expected | exits | aborts prealloc + transfer (fewest in a run) | kills chosen by | mean wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        exits = ", ".join(f"{code}: {n}" for code, n in sorted(r["exits"].items()))
        chosen = ", ".join(f"{k} {v}" for k, v in sorted(r["observed_by"].items())) or "-"
        lines.append(f"| {r['release']} | `{r['command']}` | **{r['as_expected']} of {r['runs']}** (exit "
                     f"{r['expected']}) | {exits} | {r['prealloc']} + {r['transfer']} ({r['aborts_min']}) | {chosen} | "
                     f"{r['wall_s_mean']:.1f} s |")
    misses = [(r["release"], r["command"], m) for r in rows for m in r["misses"]]
    for release, command, summary in misses:
        lines.append(f"\n- miss, {release} `{command}`: {summary}")
    lines.append(SECTION_END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("storm_kv_hits", BENCHMARK)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--release", action="append", metavar="RELEASE[=RUNS]",
                        help="a release to run, optionally with its own number of runs (repeatable; default: all five)")
    args = parser.parse_args(argv)
    chosen = []
    for item in args.release or RELEASES:
        release, _, runs = item.partition("=")
        if release not in RELEASES or (runs and not runs.isdigit()):
            parser.error(f"--release {item!r}: expected one of {', '.join(RELEASES)}, optionally =RUNS")
        chosen.append((release, int(runs) if runs else args.runs))
    rows = measure(chosen, progress=lambda m: print(m, file=sys.stderr))
    publish(section(rows), SECTION_START, SECTION_END, write=not args.no_write)
    return 0 if all(r["as_expected"] == r["runs"] for r in rows) else 1
