"""Log forensics on one core: full scan() MB/s and peak RSS, signature counting vs GNU grep and ripgrep.

    python -m benchmarks logs_throughput [--size 1G] [--path FILE] [--rounds 2] [--no-write]
    python -m benchmarks logs_throughput --profile [--profile-size 100M]

Everything runs pinned to one CPU (``os.sched_setaffinity``; grep and rg inherit it),
on the page-cached journal from ``benchmarks.journal_corpus``:

* ``forensics.logs.scan(path)`` (timeline + batch stats) in a child process, which
  reports its own scan time and ``ru_maxrss``;
* ``count_signatures(path)`` with the Hyperscan prefilter and with the ``bytes.find``
  fallback, against ``grep -cE -f patterns`` (one process for the pattern set, as grep
  is used; ``LC_ALL=C``) and ``rg -c -f patterns``, best of ``--rounds`` rounds, each
  round running every tool once in turn.

Every count is checked against the corpus manifest (and grep's and rg's totals against
ours), then the figures replace the "Log forensics" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import journal_corpus

BENCHMARK = "log forensics: scan() MB/s and peak RSS, count_signatures vs grep -cE and rg on a 1 GB journal"
RESULTS = Path(__file__).parent / "RESULTS.md"
OUT = Path(__file__).parent / "out"
SECTION_START = "<!-- logs-throughput:start -->"
SECTION_END = "<!-- logs-throughput:end -->"
TARGET_SCAN_MBPS = 100.0
TARGET_RSS_MB = 500.0
TARGET_GREP_RATIO = 3.0


def _pin() -> int:
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def _fastscan_built() -> bool:
    """Whether the optional compiled scanner was built here (it changes scan() speed ~6x)."""
    import importlib.util

    return importlib.util.find_spec("forensics.logs._fastscan") is not None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _warm(path: Path) -> None:
    with open(path, "rb") as handle:
        while handle.read(16 << 20):
            pass


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class Clock:
    """Wall and CPU seconds of a stretch of work: on a shared machine the CPU time is the
    fair figure (it leaves out the time other processes held the core)."""

    def __init__(self, who: int = resource.RUSAGE_SELF) -> None:
        self.who = who

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), _cpu(self.who)
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = _cpu(self.who) - self.cpu


def _timed(command: list[str], env: dict | None = None) -> tuple[Clock, str]:
    with Clock(resource.RUSAGE_CHILDREN) as clock:
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return clock, done.stdout.strip()


def _count(path: Path, engine: str | None) -> tuple[Clock, dict[str, int], str]:
    from forensics.logs.counting import count_signatures
    from forensics.logs.prefilter import LiteralPrefilter

    used = LiteralPrefilter([b"x"], engine=engine).engine
    with Clock() as clock:
        counts = count_signatures(path, engine=engine)
    return clock, counts, used


def scan_child(path: Path) -> dict:
    """Run inside the child: scan() once, report time, peak RSS and what it found."""
    import forensics.logs

    with Clock() as clock:
        result = forensics.logs.scan(path)
    return {
        "seconds": clock.wall,
        "cpu_seconds": clock.cpu,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "events": dict(Counter(result.events["signature"])),
        "batch_rows": len(result.batches),
        "access_lines": int(result.access["count"].sum()) if len(result.access) else 0,
        "lines_unknown": result.lines_unknown,
        "problems": [str(p) for p in result.problems[:5]],
    }


def _scan_in_child(path: Path) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.logs_throughput", "--scan-child", str(path)],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"scan child failed: {done.stderr.strip()[-1000:]}")
    return wall, json.loads(done.stdout)


def run(path: Path, size: int, rounds: int) -> dict:
    from forensics.logs.counting import RUST, grep_patterns
    from forensics.logs.prefilter import BYTES_FIND, hyperscan

    manifest = journal_corpus.ensure(path, size)
    cpu = _pin()
    load = os.getloadavg()
    _warm(path)
    megabytes = manifest.bytes / 1e6
    expected = dict(manifest.signatures)
    work = Path(tempfile.mkdtemp(prefix="logbench-"))
    try:
        ere = work / "patterns.ere"
        ere.write_text("\n".join(grep_patterns("short-iso")) + "\n")
        rust = work / "patterns.rust"
        rust.write_text("\n".join(grep_patterns("short-iso", dialect=RUST)) + "\n")
        grep = shutil.which("grep")
        rg = shutil.which("rg")
        times: dict[str, list[float]] = {}
        totals: dict[str, int] = {}
        engines = [None] + ([BYTES_FIND] if hyperscan is not None else [])
        engine_names = {}
        for _ in range(rounds):
            if grep:
                clock, out = _timed([grep, "-c", "-E", "-f", str(ere), str(path)], env={**os.environ, "LC_ALL": "C"})
                times.setdefault("grep", []).append(clock)
                totals["grep"] = int(out)
            if rg:
                clock, out = _timed([rg, "-c", "-f", str(rust), str(path)])
                times.setdefault("rg", []).append(clock)
                totals["rg"] = int(out or 0)
            for engine in engines:
                clock, counts, used = _count(path, engine)
                name = f"ours ({used})"
                engine_names[engine] = name
                times.setdefault(name, []).append(clock)
                found = {k: v for k, v in counts.items() if v}
                if found != expected:
                    raise AssertionError(f"count_signatures ({used}) found {found}, the manifest says {expected}")
                totals[name] = sum(counts.values())
        # GNU grep in a UTF-8 locale, once, for context (how grep usually runs).
        if grep:
            clock, out = _timed([grep, "-c", "-E", "-f", str(ere), str(path)],
                                env={**os.environ, "LC_ALL": "C.UTF-8"})
            times["grep (C.UTF-8)"] = [clock]
            totals["grep (C.UTF-8)"] = int(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ours_total = sum(expected.values())
    for tool, total in totals.items():
        if total != ours_total:
            raise AssertionError(f"{tool} counted {total} signature lines, ours {ours_total}")
    scan_wall, scanned = _scan_in_child(path)
    events = {k: v for k, v in scanned["events"].items() if v}
    if events != expected:
        raise AssertionError(f"scan() found events {events}, the manifest says {expected}")
    best = {tool: min(c.cpu for c in clocks) for tool, clocks in times.items()}
    best_wall = {tool: min(c.wall for c in clocks) for tool, clocks in times.items()}
    main_engine = engine_names[None]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs ({_cpu_model()}), pinned to CPU {cpu}; load average at start "
                   f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}",
        "python": platform.python_version() + ("; scanner: compiled fast path (forensics.logs._fastscan)"
                                               if _fastscan_built() else "; scanner: pure Python (no _fastscan)"),
        "grep": _version(["grep", "--version"]), "rg": _version(["rg", "--version"]),
        "path": str(path), "bytes": manifest.bytes, "lines": manifest.lines,
        "mix": manifest.mix_percent(), "groups": manifest.group_percent(),
        "incidents": len(manifest.incident_lines), "signature_lines": ours_total, "expected": expected,
        "scan_seconds": scanned["seconds"], "scan_cpu_seconds": scanned["cpu_seconds"],
        "scan_wall_seconds": scan_wall, "scan_mbps": megabytes / scanned["cpu_seconds"],
        "scan_wall_mbps": megabytes / scanned["seconds"], "scan_maxrss_mb": scanned["maxrss_mb"],
        "scan_batch_rows": scanned["batch_rows"], "scan_access_lines": scanned["access_lines"],
        "best_seconds": best, "best_wall_seconds": best_wall,
        "mbps": {tool: megabytes / t for tool, t in best.items()},
        "main_engine": main_engine, "rounds": rounds,
        "ratio_grep": best[main_engine] / best["grep"] if "grep" in best else None,
        "ratio_rg": best[main_engine] / best["rg"] if "rg" in best else None,
        "ratio_grep_wall": best_wall[main_engine] / best_wall["grep"] if "grep" in best else None,
    }


def _version(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return "not installed"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def render(figures: dict) -> str:
    mb = figures["bytes"] / 1e6
    mix = ", ".join(f"{kind} {_percent(share)}" for kind, share in figures["mix"].items())
    groups = ", ".join(f"{group} {_percent(share)}" for group, share in figures["groups"].items())
    lines = [
        SECTION_START,
        "## Log forensics",
        "",
        "`python -m benchmarks logs_throughput` (generator: `python -m benchmarks.journal_corpus --size 1G`).",
        "",
        f"- date: {figures['date']}",
        f"- machine: {figures['machine']}; Python {figures['python']}; {figures['grep']}; {figures['rg']}",
        f"- file: journalctl `-o short-iso` text, two units on one host, {mb:.1f} MB, {figures['lines']:,} lines, "
        f"{figures['signature_lines']:,} signature lines",
        f"- line mix: {groups}",
        f"- in detail: {mix}; incidents at {figures['incidents']} places (trigger, ABORT send, thread-death "
        f"traceback, handshake abort, then {journal_corpus.TIMEOUTS_PER_INCIDENT} waiting timeouts each sending ABORT)",
        "",
        "MB/s are per CPU-second (user + system time of the process doing the work): on this shared machine",
        "the wall clock also counts the time other processes held the core, so it is shown beside them.",
        "",
        "| measure | CPU time | wall | target | |",
        "|---|---|---|---|---|",
        f"| `scan()` timeline + batch stats, one core | {figures['scan_cpu_seconds']:.1f} s = "
        f"**{figures['scan_mbps']:.1f} MB/s** | {figures['scan_seconds']:.1f} s = {figures['scan_wall_mbps']:.1f} MB/s "
        f"| ≥ {TARGET_SCAN_MBPS:.0f} MB/s | {_verdict(figures['scan_mbps'] >= TARGET_SCAN_MBPS)} |",
        f"| `scan()` peak RSS (child `ru_maxrss`) | **{figures['scan_maxrss_mb']:.0f} MB** | "
        f"| < {TARGET_RSS_MB:.0f} MB | {_verdict(figures['scan_maxrss_mb'] < TARGET_RSS_MB)} |",
    ]
    mb_wall = {tool: mb / t for tool, t in figures["best_wall_seconds"].items()}
    for tool, seconds in sorted(figures["best_seconds"].items(), key=lambda item: item[1]):
        wall = figures["best_wall_seconds"][tool]
        lines.append(f"| {_tool_label(tool)} | {seconds:.2f} s = {figures['mbps'][tool]:.0f} MB/s "
                     f"| {wall:.2f} s = {mb_wall[tool]:.0f} MB/s | | |")
    if figures["ratio_grep"] is not None:
        lines.append(f"| ratio {figures['main_engine']} / `grep -cE` | **{figures['ratio_grep']:.2f}x** "
                     f"| {figures['ratio_grep_wall']:.2f}x "
                     f"| ≤ {TARGET_GREP_RATIO:.0f}x | {_verdict(figures['ratio_grep'] <= TARGET_GREP_RATIO)} |")
    if figures["ratio_rg"] is not None:
        lines.append(f"| ratio {figures['main_engine']} / `rg -c` | {figures['ratio_rg']:.2f}x | | | |")
    fallback = [t for t in figures["best_seconds"] if "bytes.find" in t]
    if fallback and "grep" in figures["best_seconds"]:
        ratio = figures["best_seconds"][fallback[0]] / figures["best_seconds"]["grep"]
        lines.append(f"| ratio ours (bytes.find, no Hyperscan) / `grep -cE` | {ratio:.2f}x | | ≤ "
                     f"{TARGET_GREP_RATIO:.0f}x | {_verdict(ratio <= TARGET_GREP_RATIO)} |")
    lines += [
        "",
        f"Counting times are the best of {figures['rounds']} rounds (each round runs every tool once, in turn) on "
        "the page-cached file; grep and rg run with the pattern set from `grep_patterns('short-iso')` "
        "(`dialect='rust'` for rg) in one process each. Every tool's total and every per-signature count are "
        "checked against the generator's manifest before anything is written here; `scan()` found "
        f"{figures['scan_batch_rows']:,} batch rows and {figures['scan_access_lines']:,} access lines.",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def _percent(share: float) -> str:
    return f"{share:.2f}%" if share >= 0.1 else f"{share:.3f}%"


def _tool_label(tool: str) -> str:
    labels = {
        "grep": "`LC_ALL=C grep -cE -f patterns` (GNU grep, one process)",
        "grep (C.UTF-8)": "`LC_ALL=C.UTF-8 grep -cE -f patterns` (once, for context)",
        "rg": "`rg -c -f patterns` (ripgrep)",
    }
    return labels.get(tool, f"`count_signatures()` {tool.removeprefix('ours ')}")


def write_results(section: str, results: Path = RESULTS) -> None:
    """Replace this benchmark's section of RESULTS.md (others' sections stay as they are)."""
    text = results.read_text() if results.exists() else "# Benchmark results\n\nEach benchmark owns its section.\n"
    if SECTION_START in text and SECTION_END in text:
        head, rest = text.split(SECTION_START, 1)
        tail = rest.split(SECTION_END, 1)[1]
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    results.write_text(text)


def profile(size: int, top: int = 25) -> str:
    """cProfile of scan() over a ``size`` journal of the same mix; the top entries by own time."""
    import forensics.logs

    path = journal_corpus.DEFAULT_PATH.with_name(f"journal-profile-{size}.log")
    journal_corpus.ensure(path, size)
    _pin()
    _warm(path)
    # CPU time, not wall time: other processes holding the core must not show up as hot spots.
    profiler = cProfile.Profile(time.process_time)
    with Clock() as clock:
        profiler.enable()
        forensics.logs.scan(path)
        profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stream.write(f"scan() of {path.stat().st_size / 1e6:.1f} MB under cProfile: {clock.cpu:.1f} CPU s, "
                 f"{clock.wall:.1f} s wall\n")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    report = stream.getvalue()
    OUT.mkdir(exist_ok=True)
    (OUT / "scan-profile.txt").write_text(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks logs_throughput", description=BENCHMARK)
    parser.add_argument("--size", default="1G", help="journal size (default 1G)")
    parser.add_argument("--path", type=Path, default=None, help="journal path (default benchmarks/data/journal-<size>.log)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    parser.add_argument("--profile", action="store_true", help="cProfile scan() instead (see --profile-size)")
    parser.add_argument("--profile-size", default="100M")
    parser.add_argument("--scan-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scan_child:
        print(json.dumps(scan_child(args.scan_child)))
        return 0
    if args.profile:
        print(profile(journal_corpus.parse_size(args.profile_size)))
        return 0
    size = journal_corpus.parse_size(args.size)
    path = args.path or journal_corpus.DEFAULT_PATH.with_name(f"journal-{args.size.lower()}.log")
    figures = run(path, size, args.rounds)
    section = render(figures)
    print(section)
    (OUT).mkdir(exist_ok=True)
    (OUT / "logs_throughput.json").write_text(json.dumps(figures, indent=1, default=str) + "\n")
    if not args.no_write:
        write_results(section)
        print(f"wrote the 'Log forensics' section of {RESULTS}", file=sys.stderr)
    ok = (figures["scan_mbps"] >= TARGET_SCAN_MBPS and figures["scan_maxrss_mb"] < TARGET_RSS_MB
          and (figures["ratio_grep"] is None or figures["ratio_grep"] <= TARGET_GREP_RATIO))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
