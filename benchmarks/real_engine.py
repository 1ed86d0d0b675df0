"""Real sglang beside the twin: up time, memory per role, kill-to-WEDGED with ``watch``; the acceptance runs.

    python -m benchmarks real_engine [--release 0.5.15] [--runs 3] [--twin-runs 3] [--skip-figures]
                                     [--skip-acceptance] [--no-write]

Figures (0.5.15 unless ``--figures-release``), each engine in the same run, one deployment at a time:

* up time: ``twin up`` (``--engine sglang --model slow-prefill`` for the real engine) until every role
  answers (the deployment's own timings);
* memory: the RSS of every process of each role (the real prefill's HTTP server, scheduler and
  detokenizer; the twin's role process and its children), summed per role;
* kill to WEDGED: ``fx.watch`` on the inventory at its defaults; one streaming client is killed
  the moment the decode has its request with the KV pending (:func:`forensics.demo.kill_client_during_transfer_wait`,
  which on real sglang reads the decode's arrival counter); the latency is from the kill (the
  client's close) to the first WEDGED verdict.

Acceptance (each release of ``--release``, repeatable): the four commands of the issue with their
default options, ``--runs`` times on the real engine and ``--twin-runs`` times on the twin
(:mod:`benchmarks.storm_kv_hits`' runs: a fresh twin each). The real engine reuses one deployment
per release, as an operator would: each unpatched run wedges it, so its prefill and decode are
restarted together before the next (a wedged 0.5.15 prefill must be SIGKILLed, and the decode
blocks on a restarted prefill); then ``patch deploy`` and the patched runs on the same deployment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import psutil

from benchmarks import storm_kv_hits
from benchmarks._results import benchmark_parser, publish

BENCHMARK = "real sglang beside the twin: up time, RSS per role, kill to WEDGED; storm/validate acceptance runs"
SECTION_START = "<!-- real-engine:start -->"
SECTION_END = "<!-- real-engine:end -->"
ROOT = Path(__file__).resolve().parent.parent
ROLES = ("prefill", "decode", "router")
MODEL = "slow-prefill"
GIB = 1 << 30
KILL_ATTEMPTS = 3


# ------------------------------------------------------------------------------- deployments


def _up(engine: str, release: str, directory: Path, patched: bool = False):
    if engine == "sglang":
        from forensics.engine import deployment

        return deployment.up(release, directory=directory, model_size=MODEL, patched=patched)
    import forensics.twin as twin_api

    return twin_api.up(release, directory=directory, patched=patched)


def _role_processes(dep, role: str) -> list[psutil.Process]:
    if getattr(dep.settings, "engine", "twin") == "sglang":
        from forensics.engine import records

        return records.processes(dep.directory, role)
    pid = dep.pid(role)
    if pid is None:
        return []
    head = psutil.Process(pid)
    return [head, *head.children(recursive=True)]


def memory_per_role(dep) -> dict[str, dict]:
    """role -> {"processes": n, "rss_gib": summed RSS} of every live process of the role."""
    out = {}
    for role in ROLES:
        rss, count = 0, 0
        for proc in _role_processes(dep, role):
            try:
                rss += proc.memory_info().rss
                count += 1
            except psutil.Error:
                continue
        out[role] = {"processes": count, "rss_gib": rss / GIB}
    return out


def kill_to_wedged(dep, deadline_s: float = 600.0) -> dict:
    """Watch ``dep``, kill one client while its KV is pending, return seconds from the kill to WEDGED."""
    from forensics.demo import kill_client_during_transfer_wait
    from forensics.watching import watch

    changes: list[tuple[float, str]] = []
    stop = threading.Event()
    thread = threading.Thread(target=watch, args=(dep.inventory_path,), daemon=True, kwargs={
        "stop": stop, "on_change": lambda v, p: changes.append((time.time(), v.verdict))})
    thread.start()
    try:
        _wait(lambda: changes and changes[-1][1] != "WEDGED", deadline_s, "a first verdict")
        before = len(changes)
        # A kill can land outside the KV wait on a loaded machine (then nothing is aborted): kill again,
        # as the demo does, and time from the kill the decode aborted.
        attempts = 0
        for attempts in range(1, KILL_ATTEMPTS + 1):  # noqa: B007 - the count is reported
            closed: list[float] = []
            detail = kill_client_during_transfer_wait(dep, on_close=lambda seen=closed: seen.append(time.time()))
            if closed and "decode aborted" in detail:
                break
        else:
            raise RuntimeError(f"no kill made the decode abort in {KILL_ATTEMPTS} attempts: {detail}")
        killed = closed[0]
        _wait(lambda: any(v == "WEDGED" for _, v in changes[before:]), deadline_s, "WEDGED")
    finally:
        stop.set()
        thread.join(120)
    reported = next(t for t, v in changes[before:] if v == "WEDGED")
    return {"detail": detail, "attempts": attempts, "kill_to_wedged_s": reported - killed, "verdicts": " -> ".join(v for _, v in changes)}


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise RuntimeError(f"no {what} within {timeout:.0f} s")


def figures(release: str, progress=print) -> dict[str, dict]:
    results = {}
    for engine in ("twin", "sglang"):
        with tempfile.TemporaryDirectory() as directory:
            started = time.monotonic()
            dep = _up(engine, release, Path(directory) / "pd")
            try:
                up_s = time.monotonic() - started
                memory = memory_per_role(dep)
                kill = kill_to_wedged(dep)
            finally:
                dep.take_down() if hasattr(dep, "take_down") else dep.down()
        results[engine] = {"up_s": up_s, "timings": dep.timings, "memory": memory, "kill": kill}
        progress(f"{engine}: up {up_s:.1f} s, RSS {sum(m['rss_gib'] for m in memory.values()):.2f} GiB, "
                 f"WEDGED {kill['kill_to_wedged_s']:.1f} s after the kill ({kill['detail']})")
    return results


# -------------------------------------------------------------------------------- acceptance


def _command(inventory: Path, argv: tuple[str, ...]) -> dict:
    started = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    extra = ("--out", tempfile.mkdtemp(prefix="campaign-")) if argv[0] == "validate" else ()
    done = subprocess.run([sys.executable, "-m", "forensics", argv[0], "--inventory", str(inventory), *argv[1:],
                           *extra, "--json"], capture_output=True, text=True, env=env, timeout=3600)
    wall_s = time.perf_counter() - started
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {}
    prealloc, transfer, observed = storm_kv_hits._aborts(doc)
    return {"exit": done.returncode, "wall_s": wall_s, "prealloc": prealloc, "transfer": transfer,
            "observed_by": observed, "summary": str(doc.get("summary") or done.stderr[-300:])}


def real_acceptance(release: str, runs: int, progress=print) -> tuple[list[dict], dict]:
    """The four commands ``runs`` times each on one real deployment of ``release``."""
    results: dict[str, list[dict]] = {name: [] for name, *_ in storm_kv_hits.COMMANDS}
    costs: dict[str, list[float]] = {"restart prefill+decode": [], "patch deploy": []}
    with tempfile.TemporaryDirectory() as directory:
        started = time.monotonic()
        dep = _up("sglang", release, Path(directory) / "pd")
        costs["up"] = [time.monotonic() - started]
        try:
            for patched in (False, True):
                if patched:
                    started = time.monotonic()
                    deployed = _command_raw(dep.inventory_path, ("patch", "deploy"))
                    costs["patch deploy"].append(time.monotonic() - started)
                    if deployed.returncode != 0:
                        raise RuntimeError(f"patch deploy failed: {deployed.stdout[-500:]} {deployed.stderr[-500:]}")
                for name, wants_patch, argv, _expected in storm_kv_hits.COMMANDS:
                    if wants_patch != patched:
                        continue
                    for run in range(runs):
                        result = _command(dep.inventory_path, argv)
                        results[name].append(result)
                        progress(f"real {release} {name} run {run + 1}/{runs}: exit {result['exit']} "
                                 f"({result['prealloc']}+{result['transfer']} aborts, {result['wall_s']:.1f} s)")
                        if not patched:  # it wedged (or should have): a fresh pair for the next run
                            started = time.monotonic()
                            dep.restart(("prefill", "decode"))
                            costs["restart prefill+decode"].append(time.monotonic() - started)
        finally:
            dep.take_down()
    return [_row(release, "sglang", name, argv, expected, results[name])
            for name, _patched, argv, expected in storm_kv_hits.COMMANDS], costs


def _command_raw(inventory: Path, argv: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "forensics", *argv, "--inventory", str(inventory), "--json"],
                          capture_output=True, text=True, env=env, timeout=3600)


def twin_acceptance(release: str, runs: int, progress=print) -> list[dict]:
    rows = []
    for name, patched, argv, expected in storm_kv_hits.COMMANDS:
        results = []
        for run in range(runs):
            results.append(storm_kv_hits.one_run(release, patched, argv))
            progress(f"twin {release} {name} run {run + 1}/{runs}: exit {results[-1]['exit']}")
        rows.append(_row(release, "twin", name, argv, expected, results))
    return rows


def _row(release: str, engine: str, name: str, argv, expected: int, results: list[dict]) -> dict:
    return {"release": release, "engine": engine, "command": name, "expected": expected, "runs": len(results),
            "as_expected": sum(r["exit"] == expected for r in results),
            "exits": dict(Counter(r["exit"] for r in results)),
            "prealloc": sum(r["prealloc"] for r in results), "transfer": sum(r["transfer"] for r in results),
            "aborts_min": min((r["prealloc"] + r["transfer"] for r in results), default=0),
            "observed_by": dict(Counter(o for r in results for o in r["observed_by"])),
            "wall_s_mean": sum(r["wall_s"] for r in results) / len(results) if results else 0.0,
            "misses": [r["summary"] for r in results if r["exit"] != expected][:2]}


# ----------------------------------------------------------------------------------- section


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def section(figures_release: str, figs: dict | None, rows: list[dict], costs: dict[str, dict],
            load_before: tuple[float, float, float]) -> str:
    load = os.getloadavg()
    lines = [SECTION_START, "## Real sglang beside the twin (`python -m benchmarks real_engine`)", "",
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average {load_before[0]:.1f} at the start, "
             f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at the end; {os.cpu_count()} CPUs, "
             f"{psutil.virtual_memory().total / GIB:.0f} GiB. Real engine: `--model {MODEL}`, NIXL over UCX on "
             "loopback.", ""]
    if figs:
        lines += [f"### sglang {figures_release}: the same figures, each engine in the same run", "",
                  "| figure | twin | real sglang |", "|---|---|---|",
                  f"| up (every role answering) | {figs['twin']['up_s']:.1f} s | {figs['sglang']['up_s']:.1f} s |"]
        for role in ROLES:
            cells = [f"{figs[e]['memory'][role]['rss_gib']:.2f} GiB ({_processes(figs[e]['memory'][role]['processes'])})"
                     for e in ("twin", "sglang")]
            lines.append(f"| RSS {role} | {cells[0]} | {cells[1]} |")
        totals = [sum(m["rss_gib"] for m in figs[e]["memory"].values()) for e in ("twin", "sglang")]
        lines.append(f"| RSS in all | {totals[0]:.2f} GiB | {totals[1]:.2f} GiB |")
        lines.append(f"| kill to WEDGED (`watch`, from the client's close) | "
                     f"{figs['twin']['kill']['kill_to_wedged_s']:.1f} s | "
                     f"{figs['sglang']['kill']['kill_to_wedged_s']:.1f} s |")
        lines.append("")
    if rows:
        lines += ["### The acceptance commands, default options", "",
                  "| release | engine | command | as expected | exits | aborts prealloc + transfer (fewest in a run) "
                  "| kills chosen by | mean wall |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            exits = ", ".join(f"{code}: {n}" for code, n in sorted(r["exits"].items()))
            chosen = ", ".join(f"{k} {v}" for k, v in sorted(r["observed_by"].items())) or "-"
            lines.append(f"| {r['release']} | {r['engine']} | `{r['command']}` | **{r['as_expected']} of {r['runs']}** "
                         f"(exit {r['expected']}) | {exits} | {r['prealloc']} + {r['transfer']} ({r['aborts_min']}) | "
                         f"{chosen} | {r['wall_s_mean']:.1f} s |")
        for release, cost in costs.items():
            parts = [f"{k} {sum(v) / len(v):.0f} s (x{len(v)})" for k, v in cost.items() if v]
            lines.append(f"\nReal {release}, one deployment reused: " + ", ".join(parts) + ".")
        for r in rows:
            for miss in r["misses"]:
                lines.append(f"\n- miss, {r['release']} {r['engine']} `{r['command']}`: {miss}")
    lines.append(SECTION_END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("real_engine", BENCHMARK)
    parser.add_argument("--release", action="append", metavar="RELEASE[=RUNS]",
                        help="a release for the acceptance runs, optionally with its own real-engine runs "
                             "(repeatable; default 0.5.15)")
    parser.add_argument("--runs", type=int, default=3, help="real-engine runs of each command per release")
    parser.add_argument("--twin-runs", type=int, default=3, help="twin runs of each command per release")
    parser.add_argument("--figures-release", default="0.5.15")
    parser.add_argument("--skip-figures", action="store_true")
    parser.add_argument("--skip-acceptance", action="store_true")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    figs = None if args.skip_figures else figures(args.figures_release, say)
    rows: list[dict] = []
    costs: dict[str, dict] = {}
    if not args.skip_acceptance:
        for item in args.release or ["0.5.15"]:
            release, _, runs = item.partition("=")
            if release not in storm_kv_hits.RELEASES or (runs and not runs.isdigit()):
                parser.error(f"--release {item!r}: expected one of {', '.join(storm_kv_hits.RELEASES)}, optionally =RUNS")
            if args.twin_runs:
                rows += twin_acceptance(release, args.twin_runs, say)
            real_rows, costs[release] = real_acceptance(release, int(runs) if runs else args.runs, say)
            rows += real_rows
    publish(section(args.figures_release, figs, rows, costs, load_before), SECTION_START, SECTION_END,
            write=not args.no_write)
    return 0 if all(r["as_expected"] == r["runs"] for r in rows) else 1
