"""Signals: what each piece of evidence says about each engine, with the rows that say it.

One extractor per source (probes, processes, threads, logs, metrics). A signal has a
*kind*: ``wedge`` (counts toward WEDGED), ``down``, ``degraded``, ``healthy`` or
``context`` (shown, never decisive). Extractors read only the Evidence frames, so they
give the same signals for a live collection and for a bundle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from forensics.evidence import Evidence
from forensics.logs import eventtime

SOURCES = ("probes", "processes", "threads", "logs", "metrics")
KINDS = ("wedge", "down", "degraded", "healthy", "context")
HEALTH_KINDS = ("health", "health_generate")
SLOW_OUTCOMES = ("late", "pending", "answered_late")  # no answer within the deadline, but no error either
BOOTSTRAP_QUEUE = "sglang:num_prefill_bootstrap_queue_reqs"
# A bootstrap-queue gauge "only grows" over at least this many samples and this long.
# Long enough that one in-flight request (our own liveness probe included) passing through the
# queue on a healthy engine does not look like growth.
QUEUE_GROWTH_MIN_SAMPLES = 5
QUEUE_GROWTH_MIN_SPAN = pd.Timedelta(seconds=10)
EVIDENCE_ROWS = 10
# Log finding classes (forensics/logs/findings.toml) and what they mean for a verdict.
LOG_CLASS_KIND = {
    "engine_crash": ("scheduler_crash", "down"),
    "request_timeouts": ("requests_timing_out", "degraded"),
    "kv_transfer_failures": ("kv_transfers_failing", "degraded"),
    "bootstrap_server_unreachable": ("prefill_heartbeat_lost", "degraded"),
    "health_check_failures": ("health_checks_failing", "degraded"),
}


@dataclass(frozen=True)
class Signal:
    name: str
    source: str
    engine: str
    kind: str
    says: str
    at: pd.Timestamp | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        if self.source not in SOURCES or self.kind not in KINDS:
            raise ValueError(f"bad signal {self.name}: source {self.source!r}, kind {self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "engine": self.engine, "kind": self.kind,
                "says": self.says, "at": _iso(self.at), "evidence": self.evidence}


def _iso(ts) -> str | None:
    if ts is None or pd.isna(ts):
        return None
    return pd.Timestamp(ts).isoformat()


def _when(ts) -> str:
    """A time for a sentence: to the millisecond (the ``at`` field keeps the full precision)."""
    if ts is None or pd.isna(ts):
        return "an unknown time"
    return pd.Timestamp(ts).isoformat(timespec="milliseconds")


def rows(frame: pd.DataFrame, columns: list[str] | None = None, limit: int = EVIDENCE_ROWS) -> list[dict[str, Any]]:
    """Evidence rows, JSON-safe: timestamps as ISO text, rooms and other big ints as digit strings."""
    if columns:
        frame = frame[[c for c in columns if c in frame.columns]]
    out = []
    for position in range(min(len(frame), limit)):
        row = {}
        for name in frame.columns:
            value = frame[name].iloc[position]
            if value is None or (not isinstance(value, list | dict) and pd.isna(value)):
                row[name] = None
            elif isinstance(value, pd.Timestamp):
                row[name] = value.isoformat()
            elif name == "room" or (isinstance(value, int) and abs(value) >= 2**53):
                row[name] = str(int(value))
            elif hasattr(value, "item"):
                row[name] = value.item()
            else:
                row[name] = value
        out.append(row)
    return out


def start_times(evidence: Evidence) -> dict[str, pd.Timestamp]:
    """Per engine, when its newest running process started (log lines before that are history)."""
    procs = evidence.frame("processes")
    if procs is None or not len(procs):
        return {}
    running = procs[(procs["state"] == "running") & procs["start_time"].notna()]
    return {str(name): pd.Timestamp(group["start_time"].max()) for name, group in running.groupby("engine")}


# ------------------------------------------------------------------------------ probes

def _decided(probes: pd.DataFrame) -> pd.DataFrame:
    """The rows that say something: answered ok, or failing (a pending row once it waited past the
    deadline); in-flight probes and pending ticks within the deadline say nothing yet."""
    from forensics.probes.schema import is_failing

    failing = is_failing(probes["outcome"], probes["waited_s"], probes["deadline_s"])
    decided = probes[(failing | (probes["outcome"] == "ok")).to_numpy()].copy()
    decided["failing"] = failing[failing.index.isin(decided.index)].to_numpy()
    return decided


def probe_signals(evidence: Evidence) -> list[Signal]:
    probes = evidence.frame("probes")
    if probes is None or not len(probes):
        return []
    decided = _decided(probes.sort_values("ts", kind="stable"))
    out: list[Signal] = []
    latest = decided.groupby(["target", "kind"], sort=False).tail(1)
    health = latest[latest["kind"].isin(HEALTH_KINDS)]
    shown = ["ts", "target", "kind", "outcome", "status", "total_s", "waited_s", "deadline_s", "detail"]
    for _, row in health.iterrows():
        outcome = row["outcome"]
        if outcome == "refused":
            out.append(Signal("engine_unreachable", "probes", row["target"], "down",
                              f"{row['kind']} refused: nothing listens at {row['url']}", row["ts"],
                              rows(health[health["target"] == row["target"]], shown)))
        elif row["failing"]:
            status = "" if pd.isna(row["status"]) else f" {int(row['status'])}"
            out.append(Signal("health_failing", "probes", row["target"], "degraded",
                              f"{row['kind']} failed ({outcome}{status}: {row['detail']})", row["ts"],
                              rows(health[health["target"] == row["target"]], shown)))
    health_ok = len(health) > 0 and not bool(health["failing"].any())
    liveness = decided[decided["kind"] == "liveness"]
    if not len(liveness):
        return out
    last = liveness.iloc[-1]
    failing = liveness[liveness["failing"]]
    sent = probes[(probes["kind"] == "liveness") & (probes["outcome"] != "pending")]
    if last["failing"]:
        first_fail = _first_of_last_run(liveness)
        since = f" since {_when(first_fail)}" if first_fail is not None else ""
        says = (f"the one-token completion through {last['target']} is {last['outcome']}{since} "
                f"({len(failing)} failing of {len(liveness)} decided liveness rows, {len(sent)} probe(s) sent)")
        slow = health[health["failing"]]
        if health_ok:
            healthy = ", ".join(sorted(set(health["target"])))
            out.append(Signal("health_lies", "probes", str(last["target"]), "wedge",
                              says + f", while health answers 200 on {healthy}", last["ts"],
                              rows(pd.concat([liveness.tail(3), health]), shown)))
        elif slow["outcome"].isin(SLOW_OUTCOMES).all():
            # Health is slow (a long batch ahead of it, as in sglang), not erroring: the real path
            # still fails. It counts toward a wedge, which needs a second source all the same.
            names = ", ".join(f"{r.target} {r.kind}" for r in slow.itertuples())
            out.append(Signal("liveness_failing", "probes", str(last["target"]), "wedge",
                              says + f"; health is slow too ({names})", last["ts"],
                              rows(pd.concat([liveness.tail(3), health]), shown)))
        else:
            out.append(Signal("liveness_failing", "probes", str(last["target"]), "context",
                              says + "; health fails too (see the health signals)", last["ts"],
                              rows(liveness.tail(3), shown)))
    else:
        if len(failing):
            out.append(Signal("liveness_intermittent", "probes", str(last["target"]), "degraded",
                              f"{len(failing)} of {len(liveness)} decided liveness rows failed in the window; "
                              "the last probe answered", failing["ts"].iloc[-1], rows(failing.tail(5), shown)))
        total = last["total_s"]
        out.append(Signal("liveness_ok", "probes", str(last["target"]), "healthy",
                          f"the last one-token completion through {last['target']} answered"
                          + ("" if pd.isna(total) else f" in {float(total):.3f} s"), last["ts"],
                          rows(liveness.tail(1), shown)))
    return out


def _first_of_last_run(liveness: pd.DataFrame) -> pd.Timestamp | None:
    """When the current run of failing liveness rows began."""
    ok = ~liveness["failing"]
    if not ok.any():
        return liveness["ts"].iloc[0]
    position = int(np.flatnonzero(ok.to_numpy())[-1])
    after = liveness.iloc[position + 1:]
    return after["ts"].iloc[0] if len(after) else None


# --------------------------------------------------------------------------- processes

def process_signals(evidence: Evidence) -> list[Signal]:
    procs = evidence.frame("processes")
    if procs is None or not len(procs):
        return []
    out = []
    for engine, group in procs.groupby("engine", sort=False):
        if (group["state"] == "none_found").all():
            out.append(Signal("process_gone", "processes", str(engine), "down",
                              f"no engine process on {group['host'].iloc[0]} ({group['detail'].iloc[0]})", None,
                              rows(group)))
    return out


# ----------------------------------------------------------------------------- threads

def thread_signals(evidence: Evidence) -> list[Signal]:
    """Expected threads (read from the release's source) missing from an engine's dump."""
    check = evidence.frame("thread_check")
    if check is None or not len(check):
        return logged_thread_signals(evidence)
    out = []
    missing = check[check["status"] == "missing"]
    for _, row in missing.iterrows():
        bootstrap = row["logical_name"] == "bootstrap" and row["role"] == "prefill"
        says = (f"{row['thread_name']} missing on {row['role']} pid {int(row['pid'])} (expected {row['expected']}, "
                f"found {int(row['found'])}; started in {row['source']})")
        same = check[(check["engine"] == row["engine"]) & (check["pid"] == row["pid"])]
        out.append(Signal("bootstrap_thread_missing" if bootstrap else "thread_missing", "threads", str(row["engine"]),
                          "wedge" if bootstrap else "degraded", says, row.get("taken_at"),
                          rows(same, ["pid", "logical_name", "thread_name", "expected", "found", "status", "source"])))
    return out + logged_thread_signals(evidence)


def logged_thread_signals(evidence: Evidence) -> list[Signal]:
    """Threads missing from a dump sglang printed into its own log (its watchdog's py-spy, a fatal
    signal's faulthandler): a wedge signal when the dump is of the prefill scheduler running now,
    history when it is of an earlier process or cannot be placed."""
    logged = evidence.frame("logged_threads")
    if logged is None or not len(logged):
        return []
    out = []
    missing = logged[logged["status"] == "missing"]
    for (engine, source, line), group in missing.groupby(["engine", "source", "line"], sort=False):
        first = group.iloc[0]
        names = ", ".join(dict.fromkeys(str(n) for n in group["thread_name"]))
        at = first["logged_at"]
        when = "at an unknown time" if pd.isna(at) else f"after {pd.Timestamp(at).isoformat()}"
        pid = "pid unknown" if pd.isna(first["pid"]) else f"pid {int(first['pid'])}"
        says = (f"{names} missing from the {first['role']} scheduler's dump sglang logged {when} ({pid}; "
                f"{first['format']}) [{source}:{int(line)}]: {first['of_process_why']}")
        bootstrap = bool(((group["logical_name"] == "bootstrap") & (group["role"] == "prefill")).any())
        current = first["of_process"] == "running"
        name = ("bootstrap_thread_missing_logged" if bootstrap else "thread_missing_logged") if current \
            else "old_logged_dump"
        kind = ("wedge" if bootstrap else "degraded") if current else "context"
        columns = ["source", "line", "pid", "logged_at", "logical_name", "thread_name", "expected", "found",
                   "status", "of_process"]
        same = logged[(logged["engine"] == engine) & (logged["source"] == source) & (logged["line"] == line)]
        out.append(Signal(name, "threads", str(engine), kind, says, None if pd.isna(at) else at, rows(same, columns)))
    return out


# -------------------------------------------------------------------------------- logs

def log_signals(evidence: Evidence) -> list[Signal]:
    events = evidence.frame("events")
    out: list[Signal] = []
    if events is not None and len(events):
        from forensics.logs.findings import event_classes
        from forensics.logs.summary import DEATHS

        starts = start_times(evidence)
        restarted = max(starts.values()) if starts else None  # the deployment's last (re)start
        for engine, group in events.groupby("engine", sort=False):
            engine = str(engine)
            started = starts.get(engine)
            current = group
            if started is not None:
                current = group[group["ts"].notna() & (group["ts"] >= started)]
                old = group[group["signature"].isin(DEATHS) & group["ts"].notna() & (group["ts"] < started)]
                if len(old):
                    out.append(Signal("old_thread_death", "logs", engine, "context",
                                      f"{len(old)} thread death(s) logged before the process started at "
                                      f"{_when(started)} (an earlier run; not this one)", old["ts"].iloc[-1],
                                      rows(old, ["ts", "source", "line", "thread", "message"])))
            deaths = current[current["signature"].isin(DEATHS)]
            if len(deaths):
                first = deaths.iloc[0]
                bootstrap = "bootstrap" in str(first["thread"] or "") or first["signature"] == "bootstrap_thread_died"
                role = str(first["role"])
                wedge = bootstrap and role == "prefill"
                caveat = "" if started is not None else " (process start unknown: may be from an earlier run)"
                out.append(Signal("thread_death_logged" if wedge else "thread_died", "logs", engine,
                                  "wedge" if wedge else "degraded",
                                  f"{first['thread'] or 'a thread'} died {eventtime.when(first)} with "
                                  f"{first['message']!r} [{first['source']}:{first['line']}]{caveat}", first["ts"],
                                  rows(deaths, ["ts", "ts_source", "ts_upper", "source", "line", "thread",
                                                "message"])))
            # Failures of the PD pipeline (timeouts, transfers, heartbeats) involve both sides: a
            # restart of either side starts it afresh, so lines before the last restart are history.
            recent = current
            if restarted is not None:
                recent = group[group["ts"].notna() & (group["ts"] >= restarted)]
            classes = event_classes(recent)
            older = event_classes(group)
            for cls, (name, kind) in LOG_CLASS_KIND.items():
                hits = recent[(classes == cls).to_numpy()]
                if len(hits):
                    out.append(Signal(name, "logs", engine, kind,
                                      f"{len(hits)} '{cls}' line(s), first at {_when(hits['ts'].iloc[0])}",
                                      hits["ts"].iloc[0], rows(hits, ["ts", "source", "line", "signature", "room", "message"])))
                elif restarted is not None and (older == cls).any():
                    before = group[(older == cls).to_numpy()]
                    out.append(Signal(f"old_{name}", "logs", engine, "context",
                                      f"{len(before)} '{cls}' line(s) before the last engine restart at "
                                      f"{_when(restarted)} (history)", before["ts"].iloc[-1],
                                      rows(before.tail(3), ["ts", "source", "line", "signature", "room", "message"])))
    findings = evidence.frame("log_findings")
    if findings is not None and len(findings):
        growth = findings[findings["id"] == "bootstrap_queue_growth"]
        for _, row in growth.iterrows():
            out.append(Signal("bootstrap_queue_growing", "logs", str(row.get("engine") or "prefill"), "wedge",
                              f"batch history: {row['detail'] or 'only health-probe batches while #bootstrap-req grew'}",
                              row.get("first"), rows(growth)))
    return out


# ----------------------------------------------------------------------------- metrics

def metric_signals(evidence: Evidence) -> list[Signal]:
    samples = evidence.frame("metrics")
    if samples is None or not len(samples):
        return []
    gauge = samples[samples["metric_canonical"] == BOOTSTRAP_QUEUE]
    out = []
    for engine, group in gauge.groupby("host", sort=False):
        series = group.sort_values("ts").groupby("ts")["value"].sum()
        if len(series) < QUEUE_GROWTH_MIN_SAMPLES:
            continue
        steps = series.diff().dropna()
        span = series.index[-1] - series.index[0]
        if (steps >= 0).all() and series.iloc[-1] > series.iloc[0] and span >= QUEUE_GROWTH_MIN_SPAN:
            out.append(Signal("bootstrap_queue_growing", "metrics", str(engine), "wedge",
                              f"{BOOTSTRAP_QUEUE} only grew, {int(series.iloc[0])} -> {int(series.iloc[-1])} over "
                              f"{span.total_seconds():.0f} s ({len(series)} scrapes)", series.index[-1],
                              [{"ts": _iso(ts), "value": float(v)} for ts, v in series.tail(EVIDENCE_ROWS).items()]))
    return out


def extract_signals(evidence: Evidence) -> list[Signal]:
    """Every signal of every source, in source order."""
    return (probe_signals(evidence) + process_signals(evidence) + thread_signals(evidence)
            + log_signals(evidence) + metric_signals(evidence))
