"""The pieces of a collection: background sampling, and everything read per engine.

Each function returns a :class:`PieceResult` (frames, gaps, command records) and never
raises for the engine it reads: an exception from a collector is a bug in it, and becomes
a Gap naming it rather than losing what the other engines gave.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from forensics.evidence import Gap
from forensics.redact import redact_url

RELEASE_VERSION_KEYS = ("version",)


def safe_url(url: str) -> str:
    return redact_url(url)


@dataclass
class PieceResult:
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    settings: list[Any] = field(default_factory=list)  # per-engine Settings, for the cross-engine findings

    def add(self, name: str, frame: pd.DataFrame | None) -> None:
        if frame is None:
            return
        if name in self.frames:
            self.frames[name] = pd.concat([self.frames[name], frame], ignore_index=True)
        else:
            self.frames[name] = frame


def _bug(piece: str, target: str, exc: BaseException) -> Gap:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {where.filename.rsplit('/', 2)[-1]}:{where.lineno}" if where else ""
    return Gap(piece, target, f"the {piece} collector failed: {type(exc).__name__}: {exc}{at}",
               "a bug in pd-forensics: please report it with this message")


# ------------------------------------------------------------------------------ sampling

class Sampling:
    """Probes and the metrics scraper, running in the background during the collection."""

    def __init__(self, inventory, options) -> None:
        self.inventory = inventory
        self.runner = None
        self.scraper = None
        self.start_result = PieceResult()

    @classmethod
    def start(cls, inventory, options) -> Sampling:
        self = cls(inventory, options)
        if "probes" in options.pieces:
            from forensics.probes import ProbeRunner

            kwargs: dict[str, Any] = {"interval_s": options.probe_interval_s}
            if options.deadlines_s:
                kwargs["deadline_s"] = options.deadlines_s
            if options.cap_s:
                kwargs["cap_s"] = options.cap_s
            try:
                self.runner = ProbeRunner(inventory, **kwargs).start()
            except Exception as exc:  # noqa: BLE001 - becomes a gap, the rest goes on
                self.start_result.gaps.append(_bug("probes", inventory.name, exc))
        if "metrics" in options.pieces:
            from forensics.collectors.metrics import MetricsScraper

            # The metrics frame's ``host`` column holds the engine's name: two engines on
            # one host (the twin, a node with prefill and decode) stay apart.
            targets = [(e.role, e.name, e.url) for e in inventory.engines if e.role in ("prefill", "decode")]
            if targets:
                self.scraper = MetricsScraper(targets, options.metrics_interval_s,
                                              max_bytes=options.metrics_max_bytes).start()
        return self

    def wait(self, seconds: float) -> None:
        """Let the samplers run ``seconds`` more, and until every liveness lane has an answer or is late."""
        deadline = time.monotonic() + max(0.0, seconds)
        event = threading.Event()
        while time.monotonic() < deadline:
            event.wait(min(0.2, deadline - time.monotonic()))
        if self.runner is None:
            return
        late_by = max(self.runner.deadlines.values()) + 2 * self.runner.interval_s
        until = time.monotonic() + late_by
        while time.monotonic() < until and not self._liveness_decided():
            event.wait(0.2)

    def _liveness_decided(self) -> bool:
        """A liveness probe has answered, or has been marked late (past its deadline)."""
        frame = self.runner.results().frame
        outcomes = frame.loc[frame["kind"] == "liveness", "outcome"]
        return bool((~outcomes.isin(("pending", "in_flight"))).any())

    def stop(self, options) -> PieceResult:
        result = PieceResult()
        if self.scraper is not None:
            series = self.scraper.stop()
            result.add("metrics", series.to_frame())
            result.add("scrapes", series.scrapes_frame())
            failed = series.scrapes_frame()
            failed = failed[~failed["ok"]] if "ok" in failed.columns else failed.iloc[:0]
            for engine, group in failed.groupby("host"):
                everything = (series.scrapes_frame()["host"] == engine).sum()
                if len(group) == everything:
                    result.gaps.append(_metrics_gap(str(engine), group))
            for name in self.scraper.stuck:
                result.gaps.append(Gap("metrics", name,
                                       "a /metrics scrape was still running when the collection ended "
                                       "(its rows so far are kept)", partial=True))
        elif "metrics" in options.pieces:
            result.gaps.append(Gap("metrics", self.inventory.name, "no prefill or decode engine to scrape"))
        if self.runner is not None:
            probes = self.runner.stop(timeout=options.drain_s)
            result.add("probes", probes.frame)
        return result


def _metrics_gap(engine: str, failed: pd.DataFrame) -> Gap:
    """The gap for an engine whose every scrape failed: the URL, the last reason, and what to do."""
    url, error = str(failed["url"].iloc[-1]), str(failed["error"].iloc[-1])
    error = error.removeprefix(f"{url}: ")
    if "total deadline" in error or " cap" in error:
        fix = ("the engine's HTTP server answers /metrics too slowly or with too much: check its load; "
               "the limits are fx.collect's metrics_interval_s (deadline 5 x interval, 1 to 10 s) and "
               "metrics_max_bytes")
    else:
        fix = "start sglang with --enable-metrics, and check the URL in the inventory"
    return Gap("metrics", engine, f"every /metrics scrape of {url} failed ({error})", fix)


# ------------------------------------------------------------------------ prometheus

# The PD series worth their history: the queues a wedge fills and the counters that move during it.
PROMETHEUS_METRICS = (
    "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_bootstrap_failed_reqs_total", "sglang:num_transfer_failed_reqs_total",
    "sglang:num_aborted_requests_total",
)
PROMETHEUS_POINTS = 720  # per series over the window (step = window / this, at least 1 s)


def prometheus_history(inventory, bounds, options) -> PieceResult:
    """The PD series over the log window from the inventory's Prometheus server, when it names one."""
    result = PieceResult()
    if not inventory.prometheus:
        return result
    from forensics.collectors.prometheus_api import PrometheusAPI

    end = bounds.until if bounds.until is not None else pd.Timestamp.now(tz="UTC")
    start = bounds.since if bounds.since is not None else end - pd.Timedelta(minutes=30)
    step = max(1.0, (end - start).total_seconds() / PROMETHEUS_POINTS)
    api = PrometheusAPI(inventory.prometheus, max_bytes=options.prometheus_max_bytes)
    frames = []
    for metric in PROMETHEUS_METRICS:
        try:
            frames.append(api.metric(metric, start.to_pydatetime(), end.to_pydatetime(), step).to_frame())
        except Exception as exc:  # noqa: BLE001 - one failed query is a gap, the others still count
            result.gaps.append(Gap("metrics", f"prometheus {safe_url(inventory.prometheus)}",
                                   f"query for {metric} failed: {exc}", "check [deployment] prometheus", partial=True))
    frames = [f for f in frames if len(f)]
    if frames:
        result.add("prometheus", pd.concat(frames, ignore_index=True))
    return result


# ---------------------------------------------------------------------- release source

class ReleaseCache:
    """Expected threads per (release, backend), read once from the release's source."""

    def __init__(self, inventory) -> None:
        self.inventory = inventory
        self._lock = threading.Lock()
        self._expected: dict[tuple[str, str], Any] = {}
        self._versions: list[str] = []

    def note_version(self, version: str | None) -> None:
        if version:
            with self._lock:
                self._versions.append(version)

    def seen_version(self) -> str | None:
        with self._lock:
            return self._versions[0] if self._versions else None

    def expected(self, version: str, backend: str):
        key = (version, backend)
        with self._lock:
            if key not in self._expected:
                from forensics.threads import expected_threads

                try:
                    self._expected[key] = expected_threads(version, backend)
                except Exception as exc:  # noqa: BLE001 - the reason goes into the gap
                    self._expected[key] = exc
            value = self._expected[key]
        if isinstance(value, Exception):
            raise value
        return value


# ------------------------------------------------------------------------- per engine

def collect_engine(inventory, engine, options, bounds, releases: ReleaseCache) -> PieceResult:
    result = PieceResult()
    host = inventory.host_for(engine)
    label = engine.label
    procs: list = []
    if "processes" in options.pieces and engine.selector is not None:
        try:
            procs = _processes(host, engine, options, result)
        except Exception as exc:  # noqa: BLE001
            result.gaps.append(_bug("processes", label, exc))
    state = None
    if "server_info" in options.pieces or "settings" in options.pieces:
        try:
            state = _engine_state(engine, options, result)
        except Exception as exc:  # noqa: BLE001
            result.gaps.append(_bug("server_info", label, exc))
    version = (state.version if state is not None else None) or engine.sglang or inventory.sglang
    backend = (state.backend if state is not None else None) or inventory.backend
    releases.note_version(version)
    if "settings" in options.pieces and engine.role in ("prefill", "decode"):
        try:
            _settings(host, engine, state, procs, backend, options, result)
        except Exception as exc:  # noqa: BLE001
            result.gaps.append(_bug("settings", label, exc))
    if "threads" in options.pieces and engine.role in ("prefill", "decode") and procs:
        try:
            _threads(host, engine, procs, version, backend, options, releases, result)
        except Exception as exc:  # noqa: BLE001
            result.gaps.append(_bug("threads", label, exc))
    elif "threads" in options.pieces and engine.role in ("prefill", "decode"):
        why = ("no process selector in the inventory (process = {...})" if engine.selector is None
               else "no engine process was found to dump")
        result.gaps.append(Gap("threads", label, f"no thread dump: {why}"))
    if "logs" in options.pieces:
        try:
            _logs(host, engine, options, bounds, result, _LogContext(version, backend, procs, releases))
        except Exception as exc:  # noqa: BLE001
            result.gaps.append(_bug("logs", label, exc))
    return result


def _processes(host, engine, options, result: PieceResult) -> list:
    from forensics.collectors.processes import find_processes

    selector = engine.selector
    # Never through sudo: /proc's stat and cmdline are world-readable, and a sudoers rule cannot
    # name "python3 -c SCRIPT" without granting a root shell (docs/LIVE.md). A root-only pid
    # file is then a gap naming it, never "no process".
    scan = find_processes(host, selector, python=_host_python(engine), timeout=options.command_timeout_s,
                          sudo=False, target=engine.label)
    result.commands.extend(scan.commands)
    frame = scan.to_frame()
    frame.insert(0, "engine", pd.array([engine.name] * len(frame), dtype="string"))
    frame.insert(1, "role", pd.array([engine.role] * len(frame), dtype="string"))
    frame["state"] = pd.array(["running"] * len(frame), dtype="string")
    frame["detail"] = pd.array([""] * len(frame), dtype="string")
    no_match = [g for g in scan.gaps if g.reason.startswith("no process matching")]
    if not scan.found and no_match:
        # Looked and found nothing: that is evidence (the DOWN signal), not a gap.
        frame = pd.DataFrame({
            "engine": pd.array([engine.name], dtype="string"), "role": pd.array([engine.role], dtype="string"),
            "host": pd.array([host.name], dtype="string"), "pid": pd.array([None], dtype="Int64"),
            "ppid": pd.array([None], dtype="Int64"), "start_time": pd.Series([pd.NaT], dtype="datetime64[ns, UTC]"),
            "start_ticks": pd.array([None], dtype="Int64"), "title": pd.array([None], dtype="string"),
            "cmdline": pd.array([None], dtype="string"), "state": pd.array(["none_found"], dtype="string"),
            "detail": pd.array([no_match[0].reason], dtype="string")})
        result.gaps.extend(g for g in scan.gaps if g not in no_match)
    else:
        result.gaps.extend(scan.gaps)
    result.add("processes", frame)
    return list(scan.processes)


def _py_spy(engine) -> str:
    """The inventory's py-spy; on this machine, the one installed beside our interpreter when PATH has none."""
    import shutil
    import sys
    from pathlib import Path

    if str(engine.host) == "local" and engine.py_spy == "py-spy" and shutil.which("py-spy") is None:
        beside = Path(sys.executable).with_name("py-spy")
        if beside.is_file():
            return str(beside)
    return engine.py_spy


def _host_python(engine) -> str:
    """The interpreter for the process lookup: python3 on the host (the engine's own may be a venv path)."""
    return "python3" if str(engine.host) != "local" else __import__("sys").executable


def _engine_state(engine, options, result: PieceResult):
    from forensics.collectors.engine_state import read_engine_state

    state = read_engine_state(engine.url, engine=engine.name, timeout=min(10.0, options.command_timeout_s),
                              loads=engine.role != "router", max_bytes=options.json_max_bytes)
    # An endpoint the release does not serve is a fact about the release, not a gap in the evidence.
    result.gaps.extend(g for g in state.gaps if state.status.get(g.piece) != "not_served")
    info = state.server_info
    result.add("server_info", pd.DataFrame({
        "engine": pd.array([engine.name], dtype="string"), "role": pd.array([engine.role], dtype="string"),
        "url": pd.array([state.url], dtype="string"),
        "state": pd.array([state.status.get("server_info")], dtype="string"),
        "version": pd.array([state.version], dtype="string"), "backend": pd.array([state.backend], dtype="string"),
        "loads_state": pd.array([state.status.get("loads")], dtype="string"),
        "document": pd.Series([info], dtype=object)}))
    if state.loads is not None and len(state.loads):
        result.add("loads", state.loads)
    return state


def _settings(host, engine, state, procs, backend, options, result: PieceResult) -> None:
    from forensics.collectors.settings import collect_settings

    proc = procs[0] if procs else None
    settings = collect_settings(engine.name, host=host, state=state, pid=None if proc is None else proc.pid,
                                ppid=None if proc is None else proc.ppid, python=engine.python, backend=backend,
                                sudo=engine.sudo, timeout=options.command_timeout_s)
    for info in settings.engines.values():
        info["role"] = engine.role  # what the cross-engine findings group by (names are free-form)
    result.settings.append(settings)
    result.commands.extend(settings.commands)
    result.gaps.extend(settings.gaps)
    result.add("settings", settings.to_frame())
    result.add("setting_findings", findings_frame(settings.findings))


def findings_frame(findings) -> pd.DataFrame | None:
    if not findings:
        return None
    return pd.DataFrame([{"engine": f.engine, "id": f.id, "severity": f.severity, "title": f.title,
                          "evidence": "; ".join(f.evidence), "why": f.why, "fix": f.fix} for f in findings])


def cross_engine_findings(parts: list) -> PieceResult:
    """Findings no single engine shows (NIXL between hosts without UCX_NET_DEVICES)."""
    from forensics.collectors.settings import combine

    result = PieceResult()
    if len(parts) < 2:
        return result
    single = {(f.engine, f.id) for part in parts for f in part.findings}
    combined = [f for f in combine(parts).findings if (f.engine, f.id) not in single]
    result.add("setting_findings", findings_frame(combined))
    return result


def _threads(host, engine, procs, version, backend, options, releases: ReleaseCache, result: PieceResult) -> None:
    from forensics.threads import check_threads, dump_threads

    pids = [p.pid for p in procs]
    dump = dump_threads(host, pids, py_spy=_py_spy(engine), sudo=engine.sudo, timeout=options.command_timeout_s,
                        label=engine.label)
    result.commands.extend(dump.commands)
    result.gaps.extend(dump.gaps.values())
    frame = dump.frame.copy()
    frame.insert(0, "engine", pd.array([engine.name] * len(frame), dtype="string"))
    result.add("threads", frame)
    if not version or not backend:
        result.gaps.append(Gap("threads", engine.label, "no release or backend known (not in /server_info or the "
                               "inventory): the expected threads cannot be read", "set sglang and backend in "
                               "[deployment]", partial=True))
        return
    try:
        expected = releases.expected(version, backend)
    except Exception as exc:  # noqa: BLE001 - the release may not be fetchable offline
        result.gaps.append(Gap("threads", engine.label, f"expected threads of sglang {version} {backend} unknown: "
                               f"{exc}", "run once with network access so the release's source is cached",
                               partial=True))
        return
    check = check_threads(dump, expected, role=engine.role)
    frame = check.frame.copy()
    frame.insert(0, "engine", pd.array([engine.name] * len(frame), dtype="string"))
    taken = [dump.taken_at.get(int(pid)) for pid in frame["pid"]]
    frame["taken_at"] = pd.Series([pd.Timestamp(t) if t is not None else pd.NaT for t in taken],
                                  dtype="datetime64[ns, UTC]")
    result.add("thread_check", frame)


@dataclass(frozen=True)
class _LogContext:
    """What the engine's other pieces found that its log's thread dumps are checked with."""

    version: str | None
    backend: str | None
    processes: list  # the engine's running processes (pid, start_time), [] when none was found
    releases: ReleaseCache


def _logs(host, engine, options, bounds, result: PieceResult, context: _LogContext) -> None:
    from forensics.logs import scan
    from forensics.logs.findings import assess
    from forensics.logs.remote import host_log_source

    spec = engine.log_source
    if spec is None:
        result.gaps.append(Gap("logs", engine.label, "no log source in the inventory",
                               "add logs = { unit = ... } or { file = ... } to this engine"))
        return
    unit = getattr(spec, "unit", None)
    kind, value = spec.kind, spec.value
    source = host_log_source(host, kind, list(value) if kind == "command" else value, role=engine.role,
                             label=None, since=bounds.since, until=bounds.until, sudo=engine.sudo,
                             journalctl=engine.journalctl, unit=unit, tz=options.tz,
                             timeout=max(options.command_timeout_s, 120.0))
    logscan = scan([source], since=bounds.since, until=bounds.until, tz=options.tz, role=engine.role)
    for problem in logscan.problems:
        result.gaps.append(Gap("logs", engine.label, str(problem), _log_fix(str(problem)), partial=True))
    events = logscan.events.copy()
    events.insert(0, "engine", pd.array([engine.name] * len(events), dtype="string"))
    result.add("events", events)
    if engine.role in ("prefill", "decode"):
        _logged_threads(engine, logscan, context, result)
    assessment = assess(logscan)
    if assessment.findings:
        result.add("log_findings", pd.DataFrame({
            "engine": pd.array([engine.name] * len(assessment.findings), dtype="string"),
            "id": pd.array([f.id for f in assessment.findings], dtype="string"),
            "severity": pd.array([f.severity for f in assessment.findings], dtype="string"),
            "count": pd.array([f.count for f in assessment.findings], dtype="Int64"),
            "first": pd.Series([f.first for f in assessment.findings], dtype="datetime64[ns, UTC]"),
            "last": pd.Series([f.last for f in assessment.findings], dtype="datetime64[ns, UTC]"),
            "detail": pd.array([f.detail or f.cls.meaning for f in assessment.findings], dtype="string")}))


def _logged_threads(engine, logscan, context: _LogContext, result: PieceResult) -> None:
    """The scheduler dumps sglang printed into the log (its watchdog's py-spy, a fatal signal's
    faulthandler) against the release's threads: evidence even where py-spy cannot run now. Each
    row says whether the dump is of a process running now (``of_process``)."""
    from forensics.threads.filecheck import FILE_CHECK_COLUMNS, NOT_CHECKED, check_dump, rows_frame

    dumps = logscan.thread_dumps()
    if not dumps:
        return
    if not context.version or not context.backend:
        result.gaps.append(Gap("threads", engine.label, f"{len(dumps)} thread dump(s) in the log, but no release or "
                               "backend known to check them against", "set sglang and backend in [deployment]",
                               partial=True))
        return
    try:
        expected = context.releases.expected(context.version, context.backend)
    except Exception as exc:  # noqa: BLE001 - the release may not be fetchable offline
        result.gaps.append(Gap("threads", engine.label, f"{len(dumps)} thread dump(s) in the log not checked: expected "
                               f"threads of sglang {context.version} {context.backend} unknown: {exc}",
                               "run once with network access so the release's source is cached", partial=True))
        return
    started = {int(p.pid): p.start_time for p in context.processes if getattr(p, "pid", None) is not None}
    rows = []
    for dump in dumps:
        checked = check_dump(dump, expected, engine.role)
        if checked.status == NOT_CHECKED:
            continue  # another process's dump (the HTTP server's, the detokenizer's): no KV threads there
        logged_at = pd.Timestamp(dump.logged_at) if dump.logged_at is not None else pd.NaT
        of_process, why = _dumped_process(dump.pid, logged_at, started)
        for row in checked.rows:
            rows.append({"engine": engine.name, **row, "dump_status": checked.status, "logged_at": logged_at,
                         "of_process": of_process, "of_process_why": why})
    if rows:
        frame = rows_frame(rows, ("engine", *FILE_CHECK_COLUMNS, "dump_status", "logged_at", "of_process",
                                  "of_process_why"))
        frame["logged_at"] = pd.to_datetime(frame["logged_at"], utc=True)
        result.add("logged_threads", frame)


def _dumped_process(pid, logged_at, started: dict) -> tuple[str, str]:
    """``running`` when the dump is of an engine process running now (its pid, logged after that
    process started), ``earlier`` when it cannot be, else ``unknown``, with the reason."""
    if pid is None:
        return "unknown", "the dump names no pid (faulthandler's never does)"
    if not started:
        return "unknown", "no engine process was found to compare its pid with"
    if int(pid) not in started:
        return "earlier", f"pid {pid} is not an engine process now (running: {', '.join(map(str, sorted(started)))})"
    start = started[int(pid)]
    if pd.isna(logged_at) or start is None or pd.isna(start):
        return "running", f"pid {pid} runs now (the log line before the dump has no time to set against its start)"
    if logged_at < pd.Timestamp(start).floor("s"):
        return "earlier", f"logged before pid {pid} started at {pd.Timestamp(start).isoformat()} (an earlier process)"
    return "running", f"pid {pid} runs now and started before the dump was logged"


def _log_fix(text: str) -> str | None:
    lowered = text.lower()
    if "permission denied" in lowered:
        return "sudo = true for this host, or add the user to the systemd-journal / adm group"
    if "not found" in lowered or "no such file" in lowered:
        return "check the log source in the inventory, and that journalctl exists on the host"
    return None
