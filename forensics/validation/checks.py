"""The campaign's checks: after each storm cycle, four questions, each PASS, FAIL or INCONCLUSIVE.

Every check reads the cycle's own evidence (what the storm's checker collected and the
diagnosis it gave: no second collection, no second diagnosis) and returns a :class:`Check`
with its status, the reason in words and the evidence rows behind it. A check that could
not look (a gap, no probe, no metrics, no abort to count) is INCONCLUSIVE and says what
was missing: nothing passes by default.

* :func:`liveness`: a real one-token request completed (the cycle's liveness probes);
* :func:`logs`: no thread death and no GUARD assertion since the cycle began, and the
  decode's log shows the storm really aborted requests;
* :func:`threads`: the prefill's bootstrap thread is alive (the ``thread_check`` frame);
* :func:`metrics`: the decode's abort and failure counters rose by at least the aborts the
  storm's history attributes to them.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
STATUSES = (PASS, FAIL, INCONCLUSIVE)
CHECKS = ("liveness", "logs", "threads", "metrics")

# Probe outcomes (docs/probes.md): failing ones, and among them those that are only a timeout.
FAILING_OUTCOMES = ("http_error", "late", "answered_late", "refused", "error", "unanswered")
TIMEOUT_OUTCOMES = ("late", "answered_late", "unanswered", "pending")
DEATH_SIGNATURES = ("thread_death", "bootstrap_thread_died")
GUARD_SIGNATURES = ("nixl_guard_assertion",)
DECODE_ABORT_SIGNATURES = ("decode_handshake_aborted", "decode_transfer_aborted")
PREFILL_ABORT_SIGNATURES = ("abort_received", "nixl_guard_assertion")

# The decode's counters and which of the history's attributed aborts each must count.
ABORTED = "sglang:num_aborted_requests_total"
BOOTSTRAP_FAILED = "sglang:num_bootstrap_failed_reqs_total"
TRANSFER_FAILED = "sglang:num_transfer_failed_reqs_total"
COUNTER_PHASES: dict[str, tuple[str, ...]] = {
    ABORTED: ("prealloc", "transfer"),
    BOOTSTRAP_FAILED: ("prealloc",),
    TRANSFER_FAILED: ("transfer",),
}
# sglang counts num_aborted_requests_total in TokenizerManager.abort_request (0.5.15
# tokenizer_manager.py:1677-1694), and only for a rid it still holds: an abort whose rid is gone,
# or a decode-queue abort the tokenizer never sees (a waiting timeout), logs a line but counts
# nothing. So that counter must move when aborts happened, but cannot be held to one per line.
AT_LEAST_ONE = (ABORTED,)
EVIDENCE_ROWS_IN_JSON = 20


@dataclass
class Check:
    """One check of one cycle: its status, why, and the evidence rows behind it."""

    name: str
    status: str  # PASS | FAIL | INCONCLUSIVE
    reason: str
    evidence: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    cycle: int | None = None
    kill_chain: list[str] = field(default_factory=list)  # from the diagnosis, when the check failed on a wedge

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Check.status must be one of {STATUSES}, got {self.status!r}")
        if not self.reason:
            raise ValueError("a check always says why")

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def to_dict(self, rows: int = EVIDENCE_ROWS_IN_JSON) -> dict[str, Any]:
        from forensics.jsonable import frame_records

        frame = self.evidence if isinstance(self.evidence, pd.DataFrame) else pd.DataFrame()
        records = frame_records(frame.head(rows)) if len(frame.columns) else []
        return {"name": self.name, "cycle": self.cycle, "status": self.status, "reason": self.reason,
                "kill_chain": list(self.kill_chain), "evidence_rows": int(len(frame)), "evidence": records}

    def __rich__(self):
        from rich.text import Text

        return Text(f"{self.status:<12} {self.name}: {self.reason}", style=STYLE[self.status])

    def _repr_html_(self) -> str:
        return (f"<b style='color:{COLOUR[self.status]}'>{self.status}</b> {html.escape(self.name)}: "
                f"{html.escape(self.reason)}")


STYLE = {PASS: "green", FAIL: "bold red", INCONCLUSIVE: "magenta"}
COLOUR = {PASS: "#2e7d32", FAIL: "#c62828", INCONCLUSIVE: "#6a1b9a"}


def undecided(name: str, reason: str, cycle: int | None = None) -> Check:
    return Check(name, INCONCLUSIVE, reason, cycle=cycle)


def _gaps(evidence: Any, piece: str, role: str | None = None) -> list[str]:
    gaps = [g for g in getattr(evidence, "gaps", []) if g.piece == piece]
    if role is not None:
        gaps = [g for g in gaps if g.target.startswith(role)] or gaps
    return [str(g) for g in gaps]


def _missing(what: str, gaps: list[str]) -> str:
    return what + (f" ({'; '.join(gaps[:3])})" if gaps else "")


# ----------------------------------------------------------------------------- liveness


def liveness(cycle: Any) -> Check:
    """A real one-token request completed after the storm (the cycle's liveness probes)."""
    evidence, verdict = cycle.evidence, cycle.verdict
    probes = evidence.frames.get("probes") if evidence is not None else None
    rows = probes[probes["kind"] == "liveness"] if probes is not None and len(probes) else pd.DataFrame()
    if not len(rows):
        return Check("liveness", INCONCLUSIVE, _missing("no liveness probe was sent after the storm: nothing says "
                                                        "whether a real request still completes",
                                                        _gaps(evidence, "probes")), cycle=cycle.cycle)
    waited = rows["waited_s"].astype("float64") > rows["deadline_s"].astype("float64")
    failing = rows["outcome"].isin(FAILING_OUTCOMES) | ((rows["outcome"] == "pending") & waited)
    ok = rows["outcome"] == "ok"
    if failing.any():
        bad = rows[failing]
        outcomes = ", ".join(f"{k} x{v}" for k, v in bad["outcome"].value_counts().items())
        decided = rows[ok | failing].sort_values("ts", kind="mergesort")
        last_ok = len(decided) and decided["outcome"].iloc[-1] == "ok"
        if (last_ok and bad["outcome"].isin(TIMEOUT_OUTCOMES).all()
                and (verdict is None or verdict.verdict not in ("WEDGED", "DOWN"))):
            # A real request completed after the storm, the last one sent among them: the path
            # works. The slow one before it is slow, not dead (a wedged deployment answers none).
            done = rows[ok]
            return Check("liveness", PASS, f"{int(ok.sum())} one-token request(s) completed after the storm, the "
                         f"last one sent included (slowest {float(done['total_s'].max()):.2f} s); "
                         f"{int(failing.sum())} other(s) slower than the deadline ({outcomes}): slow, not dead",
                         rows[ok | failing], cycle=cycle.cycle)
        if verdict is not None and verdict.verdict in ("WEDGED", "DOWN"):
            return Check("liveness", FAIL, f"{int(failing.sum())} of {len(rows)} one-token requests failed "
                         f"({outcomes}); the diagnosis says {verdict.verdict}: {'; '.join(verdict.reasons[:2])}",
                         bad, cycle=cycle.cycle, kill_chain=list(verdict.kill_chain))
        if bad["outcome"].isin(TIMEOUT_OUTCOMES).all():
            deadline = float(bad["deadline_s"].max())
            said = verdict.verdict if verdict is not None else "no verdict"
            return Check("liveness", INCONCLUSIVE, f"the liveness probe timed out ({outcomes}; deadline "
                         f"{deadline:g} s) and nothing else confirms a wedge (the diagnosis: {said}): "
                         "a slow answer is not a completed request, nor proof of a dead one", bad, cycle=cycle.cycle)
        return Check("liveness", FAIL, f"{int(failing.sum())} of {len(rows)} one-token requests failed ({outcomes})",
                     bad, cycle=cycle.cycle, kill_chain=list(getattr(verdict, "kill_chain", []) or []))
    if ok.any():
        done = rows[ok]
        return Check("liveness", PASS, f"{int(ok.sum())} one-token request(s) completed after the storm "
                     f"(slowest {float(done['total_s'].max()):.2f} s)", done, cycle=cycle.cycle)
    outcomes = ", ".join(f"{k} x{v}" for k, v in rows["outcome"].value_counts().items())
    return Check("liveness", INCONCLUSIVE, f"no liveness probe was answered ({outcomes})", rows, cycle=cycle.cycle)


# ----------------------------------------------------------------------------- logs


def logs(cycle: Any) -> Check:
    """The logs since the cycle began: no thread death, no GUARD assertion, and the storm's aborts."""
    evidence, verdict = cycle.evidence, cycle.verdict
    events = evidence.frames.get("events") if evidence is not None else None
    gaps = _gaps(evidence, "logs")
    if events is None:
        return Check("logs", INCONCLUSIVE, _missing("no log was read", gaps), cycle=cycle.cycle)
    fatal = events[events["signature"].isin(DEATH_SIGNATURES + GUARD_SIGNATURES)]
    if len(fatal):
        deaths = int(fatal["signature"].isin(DEATH_SIGNATURES).sum())
        guards = int(fatal["signature"].isin(GUARD_SIGNATURES).sum())
        where = ", ".join(sorted(set(fatal["role"].dropna().astype(str))))
        return Check("logs", FAIL, f"{deaths} thread death(s) and {guards} GUARD assertion(s) in the {where} log "
                     "since the cycle began", fatal, cycle=cycle.cycle,
                     kill_chain=list(getattr(verdict, "kill_chain", []) or []))
    if gaps:
        return Check("logs", INCONCLUSIVE, _missing("the logs were not read whole, so 'no thread death' cannot be "
                                                    "claimed", gaps), cycle=cycle.cycle)
    aborts = events[(events["role"] == "decode") & events["signature"].isin(DECODE_ABORT_SIGNATURES)]
    received = events[(events["role"] == "prefill") & events["signature"].isin(PREFILL_ABORT_SIGNATURES)]
    rows = pd.concat([aborts, received]) if len(received) else aborts
    if cycle.abort_count == 0:
        return Check("logs", INCONCLUSIVE, "no thread death and no GUARD assertion, but the storm produced no abort: "
                     "the decode's log shows none of this cycle's sessions aborted in its prealloc or transfer "
                     "queue, so this cycle proves nothing (kill earlier: --phase kv, a shorter --kill-after)",
                     rows, cycle=cycle.cycle)
    return Check("logs", PASS, f"0 thread deaths and 0 GUARD assertions; the decode logged {cycle.abort_count} "
                 f"abort(s) of this storm ({cycle.aborts.get('prealloc', 0)} in prealloc, "
                 f"{cycle.aborts.get('transfer', 0)} in transfer) and the prefill received "
                 f"{cycle.prefill_abort_frames} ABORT frame(s)", rows, cycle=cycle.cycle)


# ----------------------------------------------------------------------------- threads


def threads(cycle: Any) -> Check:
    """The prefill's bootstrap thread is alive (the expected-thread check on the dumps)."""
    evidence = cycle.evidence
    frame = evidence.frames.get("thread_check") if evidence is not None else None
    gaps = _gaps(evidence, "threads", "prefill")
    if frame is None or not len(frame):
        return Check("threads", INCONCLUSIVE, _missing("no thread inventory of the prefill", gaps), cycle=cycle.cycle)
    rows = frame[(frame["role"] == "prefill") & (frame["logical_name"] == "bootstrap")]
    if not len(rows):
        return Check("threads", INCONCLUSIVE, _missing("the thread inventory has no bootstrap thread row for a "
                                                       "prefill", gaps), frame, cycle=cycle.cycle)
    found = rows["found"].astype("Int64").fillna(0)
    dead = rows[(rows["status"] == "missing") | ((rows["status"] != "inconclusive") & (found == 0))]
    if len(dead):
        pids = ", ".join(str(p) for p in dead["pid"].tolist())
        return Check("threads", FAIL, f"the bootstrap thread is gone on prefill pid {pids}", dead, cycle=cycle.cycle,
                     kill_chain=list(getattr(cycle.verdict, "kill_chain", []) or []))
    unsure = rows[rows["status"] != "ok"]
    if len(unsure):
        states = ", ".join(f"{r.status} (found {r.found})" for r in unsure.itertuples())
        return Check("threads", INCONCLUSIVE, _missing(f"the bootstrap thread could not be confirmed: {states}", gaps),
                     unsure, cycle=cycle.cycle)
    names = ", ".join(sorted(set(rows["thread_name"].dropna().astype(str))))
    return Check("threads", PASS, f"the bootstrap thread is alive on {len(rows)} prefill process(es) ({names})",
                 rows, cycle=cycle.cycle)


# ----------------------------------------------------------------------------- metrics


def counters_from_page(page: Any) -> dict[str, int | float]:
    """The decode counters of one parsed /metrics page, summed over label sets."""
    out: dict[str, int | float] = {}
    for i, name in enumerate(page.metric):
        if name in COUNTER_PHASES:
            out[name] = out.get(name, 0) + page.exact(i)
    return out


def baseline(inventory: Any, timeout_s: float = 5.0) -> dict[str, Any]:
    """The decode engines' counters before a cycle: ``{engine: {metric: value}}`` or ``{engine: "error"}``."""
    from forensics.collectors.metrics import scrape_once

    out: dict[str, Any] = {}
    for engine in inventory.engines_with("decode"):
        name = engine.name or engine.role
        scrape = scrape_once("decode", name, engine.url, timeout_s=timeout_s)
        out[name] = counters_from_page(scrape.page) if scrape.ok else f"scrape failed: {scrape.error}"
    return out


def _after(metrics: pd.DataFrame) -> dict[str, dict[str, int | float]]:
    """The last good scrape of each decode engine in the cycle's metrics frame, counters summed."""
    rows = metrics[(metrics["role"] == "decode") & metrics["scrape_ok"].astype(bool)
                   & metrics["metric_canonical"].isin(list(COUNTER_PHASES))]
    out: dict[str, dict[str, int | float]] = {}
    for host, per_host in rows.groupby("host", sort=True):
        last = per_host[per_host["ts"] == per_host["ts"].max()]
        values: dict[str, int | float] = {}
        for r in last.itertuples(index=False):
            value = int(r.value_int) if not pd.isna(r.value_int) else float(r.value)
            values[r.metric_canonical] = values.get(r.metric_canonical, 0) + value
        out[str(host)] = values
    return out


def metrics(cycle: Any, before: dict[str, Any] | None) -> Check:
    """The decode's failure counters rose by at least the aborts the history attributes to them, and its
    abort counter moved when there were any (see ``AT_LEAST_ONE``)."""
    evidence = cycle.evidence
    frame = evidence.frames.get("metrics") if evidence is not None else None
    gaps = _gaps(evidence, "metrics", "decode")
    if frame is None or not len(frame):
        return Check("metrics", INCONCLUSIVE, _missing("no metrics from the decode", gaps), cycle=cycle.cycle)
    after = _after(frame)
    if not after:
        errors = frame[(frame["role"] == "decode") & ~frame["scrape_ok"].astype(bool)]["error"].dropna().unique()
        return Check("metrics", INCONCLUSIVE, _missing("no good scrape of the decode's counters"
                                                       + (f" ({'; '.join(map(str, errors[:2]))})" if len(errors) else ""),
                                                       gaps), cycle=cycle.cycle)
    if not before:
        return Check("metrics", INCONCLUSIVE, "no counter values from before the cycle to compare with",
                     cycle=cycle.cycle)
    failed = {k: v for k, v in before.items() if isinstance(v, str)}
    if failed:
        return Check("metrics", INCONCLUSIVE, "the decode's counters could not be read before the cycle: "
                     + "; ".join(f"{k}: {v}" for k, v in failed.items()), cycle=cycle.cycle)
    if "unknown" in cycle.aborts and cycle.aborts.get("unknown", 0) and cycle.abort_count == 0:
        return Check("metrics", INCONCLUSIVE, "the history attributes no abort to a queue (the decode's log was not "
                     "read), so there is nothing to hold the counters to", cycle=cycle.cycle)
    if cycle.abort_count == 0:
        return Check("metrics", INCONCLUSIVE, "the storm produced no abort: a counter rising by at least 0 proves "
                     "nothing", cycle=cycle.cycle)
    exported = sorted({m for values in after.values() for m in values})
    if not exported:
        return Check("metrics", INCONCLUSIVE, f"the release exports none of {', '.join(COUNTER_PHASES)}",
                     cycle=cycle.cycle)
    records = []
    for metric in exported:
        had = sum(v.get(metric, 0) for v in before.values() if isinstance(v, dict))
        now = sum(v.get(metric, 0) for v in after.values())
        rose = now - had if now >= had else now  # a decrease is a counter reset (a restart): it counts from 0
        expected = sum(cycle.aborts.get(phase, 0) for phase in COUNTER_PHASES[metric])
        if metric in AT_LEAST_ONE:
            expected = min(expected, 1)
        records.append({"metric": metric, "engines": ",".join(sorted(after)), "before": had, "after": now,
                        "rose": rose, "expected_at_least": expected, "ok": bool(rose >= expected)})
    table = pd.DataFrame(records)
    short = [r for r in records if not r["ok"]]
    missing = [m for m in COUNTER_PHASES if m not in exported]
    note = f" (not exported: {', '.join(missing)})" if missing else ""
    if short:
        return Check("metrics", FAIL, "; ".join(f"{r['metric']} rose by {r['rose']}, fewer than the "
                                                f"{r['expected_at_least']} aborts the history attributes to it"
                                                for r in short) + note, table, cycle=cycle.cycle)
    return Check("metrics", PASS, "; ".join(f"{r['metric']} +{r['rose']} (>= {r['expected_at_least']})"
                                            for r in records) + note, table, cycle=cycle.cycle)
