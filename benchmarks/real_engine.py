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

A sweep of every release at 10 runs takes hours, so results are kept: each command's row is saved to
``benchmarks/real_engine_runs.json`` the moment its runs end (a new campaign of the same release,
engine and command replaces the old row), and the section is written from everything saved, each
row with the date and load it was measured at. ``--runs 0`` or ``--twin-runs 0`` skips that engine.
A real run that misses keeps its evidence in ``benchmarks/out/misses/`` (each role's log from the
command's start, and the command's output), since the deployment is restarted and then taken down.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
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
STORE = Path(__file__).with_name("real_engine_runs.json")
MISSES = Path(__file__).with_name("out") / "misses"  # ignored by git: evidence for the next look
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
            "observed_by": observed, "summary": storm_kv_hits.summary(doc, done.stderr),
            "stdout": done.stdout, "stderr": done.stderr}


def real_acceptance(release: str, runs: int, progress=print, on_row=lambda row: None,
                    commands: tuple[str, ...] | None = None) -> tuple[list[dict], dict]:
    """The four commands ``runs`` times each on one real deployment of ``release``; ``on_row`` gets each
    command's row as soon as its runs end."""
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
                    if wants_patch != patched or (commands and name not in commands):
                        continue
                    for run in range(runs):
                        offsets = _log_offsets(dep)
                        result = _command(dep.inventory_path, argv)
                        results[name].append(result)
                        if result["exit"] != _expected:
                            result["kept"] = str(keep_miss(dep, offsets, release, name, run, result))
                            progress(f"  missed: logs kept in {result['kept']}")
                        progress(f"real {release} {name} run {run + 1}/{runs}: exit {result['exit']} "
                                 f"({result['prealloc']}+{result['transfer']} aborts, {result['wall_s']:.1f} s)")
                        if not patched:  # it wedged (or should have): a fresh pair for the next run
                            started = time.monotonic()
                            dep.restart(("prefill", "decode"))
                            costs["restart prefill+decode"].append(time.monotonic() - started)
                    on_row(_row(release, "sglang", name, argv, _expected, results[name]))
        finally:
            dep.take_down()
    return [_row(release, "sglang", name, argv, expected, results[name])
            for name, _patched, argv, expected in storm_kv_hits.COMMANDS if results[name]], costs


def _log_offsets(dep) -> dict[str, int]:
    return {role: dep.log_path(role).stat().st_size if dep.log_path(role).exists() else 0 for role in ROLES}


def keep_miss(dep, offsets: dict[str, int], release: str, name: str, run: int, result: dict,
              root: Path = MISSES) -> Path:
    """A missed run's evidence, kept before the next run restarts the deployment: each role's log from
    where it stood when the command started, and the command's own output. The deployment is taken
    down at the end of the campaign, so without this a miss leaves only its one-line summary."""
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}"
    folder = root / f"{release}-{name.replace(' ', '_').replace('-', '')}-run{run + 1}-{stamp}"
    folder.mkdir(parents=True, exist_ok=True)
    for role, offset in offsets.items():
        path = dep.log_path(role)
        if path.exists():
            with path.open("rb") as log:
                log.seek(offset)
                (folder / f"{role}.log").write_bytes(log.read())
    (folder / "command.json").write_text(json.dumps({"exit": result["exit"], "stdout": result.get("stdout", ""),
                                                     "stderr": result.get("stderr", "")}, indent=1))
    return folder


def _command_raw(inventory: Path, argv: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "forensics", *argv, "--inventory", str(inventory), "--json"],
                          capture_output=True, text=True, env=env, timeout=3600)


def twin_acceptance(release: str, runs: int, progress=print, on_row=lambda row: None,
                    commands: tuple[str, ...] | None = None) -> list[dict]:
    rows = []
    for name, patched, argv, expected in storm_kv_hits.COMMANDS:
        if commands and name not in commands:
            continue
        results = []
        for run in range(runs):
            results.append(storm_kv_hits.one_run(release, patched, argv))
            progress(f"twin {release} {name} run {run + 1}/{runs}: exit {results[-1]['exit']}")
        rows.append(_row(release, "twin", name, argv, expected, results))
        on_row(rows[-1])
    return rows


def _row(release: str, engine: str, name: str, argv, expected: int, results: list[dict]) -> dict:
    return {"release": release, "engine": engine, "command": name, "expected": expected, "runs": len(results),
            "as_expected": sum(r["exit"] == expected for r in results),
            "exits": dict(Counter(r["exit"] for r in results)),
            "prealloc": sum(r["prealloc"] for r in results), "transfer": sum(r["transfer"] for r in results),
            "aborts_min": min((r["prealloc"] + r["transfer"] for r in results), default=0),
            "observed_by": dict(Counter(o for r in results for o in r["observed_by"])),
            "wall_s_mean": sum(r["wall_s"] for r in results) / len(results) if results else 0.0,
            "misses": [r["summary"] for r in results if r["exit"] != expected][:2],
            "kept": [r["kept"] for r in results if r.get("kept")],
            "measured": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "load_1m": round(os.getloadavg()[0], 1)}


# -------------------------------------------------------------------------------------- store


def load_store(path: Path = STORE) -> dict:
    """What earlier runs saved: {"figures": ..., "rows": [...], "costs": {release: ...}}."""
    if not path.exists():
        return {"figures": None, "rows": [], "costs": {}}
    try:
        store = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise SystemExit(f"{path}: not JSON ({err}); move it aside to start a fresh store") from err
    return {"figures": store.get("figures"), "rows": list(store.get("rows") or []), "costs": dict(store.get("costs") or {})}


def keep_row(store: dict, row: dict) -> None:
    """A new campaign of the same release, engine and command replaces the old one."""
    key = (row["release"], row["engine"], row["command"])
    store["rows"] = [r for r in store["rows"] if (r["release"], r["engine"], r["command"]) != key] + [row]


def save_store(store: dict, path: Path = STORE) -> None:
    order = {release: i for i, release in enumerate(storm_kv_hits.RELEASES)}
    commands = {name: i for i, (name, *_rest) in enumerate(storm_kv_hits.COMMANDS)}
    store["rows"].sort(key=lambda r: (order.get(r["release"], 99), r["engine"] != "twin", commands.get(r["command"], 99)))
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    temporary.replace(path)


@contextlib.contextmanager
def _store_lock(path: Path = STORE):
    """One writer of the store at a time: two campaigns run side by side (a real sweep and a twin
    sweep) each add their rows to what is on disk, never to the copy they read when they began."""
    with open(path.with_suffix(".json.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def merge_row(row: dict, path: Path = STORE) -> None:
    with _store_lock(path):
        store = load_store(path)
        keep_row(store, row)
        save_store(store, path)


def merge_costs(release: str, costs: dict, path: Path = STORE) -> None:
    with _store_lock(path):
        store = load_store(path)
        store["costs"][release] = {**store["costs"].get(release, {}), **costs}
        save_store(store, path)


# ----------------------------------------------------------------------------------- section


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def section(store: dict) -> str:
    lines = [SECTION_START, "## Real sglang beside the twin (`python -m benchmarks real_engine`)", "",
             f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / GIB:.0f} GiB. Real engine: `--model {MODEL}`, "
             "NIXL over UCX on loopback. Each table row is one campaign, with when it ran and the 1-minute load "
             "average at its end; rows are kept in `benchmarks/real_engine_runs.json` between runs.", ""]
    figs = store.get("figures")
    if figs:
        lines += [f"### sglang {figs['release']}: the same figures, each engine in the same run "
                  f"({figs['measured']}, load {figs['load_before']:.1f} at the start, {figs['load_after']:.1f} at the end)",
                  "", "| figure | twin | real sglang |", "|---|---|---|",
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
    rows = store.get("rows") or []
    if rows:
        lines += ["### The acceptance commands, default options", "",
                  "| release | engine | command | as expected | exits | aborts prealloc + transfer (fewest in a run) "
                  "| kills chosen by | mean wall | measured (load) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            exits = ", ".join(f"{code}: {n}" for code, n in sorted(r["exits"].items()))
            chosen = ", ".join(f"{k} {v}" for k, v in sorted(r["observed_by"].items())) or "-"
            when = f"{r['measured']} ({r['load_1m']:.1f})" if "measured" in r else "-"
            lines.append(f"| {r['release']} | {r['engine']} | `{r['command']}` | **{r['as_expected']} of {r['runs']}** "
                         f"(exit {r['expected']}) | {exits} | {r['prealloc']} + {r['transfer']} ({r['aborts_min']}) | "
                         f"{chosen} | {r['wall_s_mean']:.1f} s | {when} |")
        for release, cost in store.get("costs", {}).items():
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
    parser.add_argument("--command", action="append", choices=[name for name, *_ in storm_kv_hits.COMMANDS],
                        help="run only this acceptance command (repeatable; default: all four)")
    args = parser.parse_args(argv)
    # A SIGTERM (a timeout, a kill) unwinds like Ctrl-C, so every deployment's ``finally`` takes it down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    commands = tuple(args.command or ())
    chosen = []
    for item in [] if args.skip_acceptance else args.release or ["0.5.15"]:
        release, _, runs = item.partition("=")
        if release not in storm_kv_hits.RELEASES or (runs and not runs.isdigit()):
            parser.error(f"--release {item!r}: expected one of {', '.join(storm_kv_hits.RELEASES)}, optionally =RUNS")
        chosen.append((release, int(runs) if runs else args.runs))
    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    store = load_store()
    write = not args.no_write

    def keep(row: dict) -> None:
        keep_row(store, row)
        if write:
            merge_row(row)

    rows: list[dict] = []
    if not args.skip_figures:
        load_before = os.getloadavg()[0]
        figs = figures(args.figures_release, say)
        store["figures"] = {**figs, "release": args.figures_release, "load_before": load_before,
                            "load_after": os.getloadavg()[0], "measured": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"}
        if write:
            with _store_lock():
                on_disk = load_store()
                on_disk["figures"] = store["figures"]
                save_store(on_disk)
    for release, runs in chosen:
        if args.twin_runs:
            rows += twin_acceptance(release, args.twin_runs, say, on_row=keep, commands=commands)
        if runs:
            real_rows, costs = real_acceptance(release, runs, say, on_row=keep, commands=commands)
            fresh = {k: v for k, v in costs.items() if v}
            store["costs"][release] = {**store["costs"].get(release, {}), **fresh}  # a partial run keeps the rest
            if write:
                merge_costs(release, fresh)
            rows += real_rows
    with _store_lock():  # a campaign beside this one may be publishing too
        publish(section(load_store() if write else store), SECTION_START, SECTION_END, write=write)
    return 0 if all(r["as_expected"] == r["runs"] for r in rows) else 1
