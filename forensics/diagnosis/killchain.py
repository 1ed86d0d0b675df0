"""The kill chain in words, from the evidence behind a WEDGED or DOWN verdict.

For a wedge: the ABORT for room R at T1, the bootstrap thread's death at T2, nothing
bootstrapped since, N requests stuck, health still 200. Each step says where it was read;
a step the evidence cannot show is left out rather than guessed.
"""

from __future__ import annotations

import pandas as pd

from forensics.evidence import Evidence
from forensics.logs import eventtime
from forensics.logs.summary import likely_trigger

from .signals import BOOTSTRAP_QUEUE, Signal


def _iso(ts) -> str:
    return "at an unknown time" if ts is None or pd.isna(ts) else pd.Timestamp(ts).isoformat(timespec="milliseconds")


def kill_chain(evidence: Evidence, signals: list[Signal], verdict: str) -> list[str]:
    if verdict == "DOWN":
        return [f"{s.engine}: {s.says}" for s in signals if s.kind == "down"]
    steps: list[str] = []
    events = evidence.frame("events")
    death = next((s for s in signals if s.name == "thread_death_logged"), None)
    if events is not None and len(events) and death is not None and death.at is not None:
        # The death's own row: a traceback has no time of its own, only the bounds of the lines around it.
        first = death.evidence[0] if death.evidence else {"ts": death.at}
        earliest, latest = eventtime.bounds(first)
        row = likely_trigger(events, earliest if earliest is not None else death.at, latest)
        if row is not None:
            room = "" if pd.isna(row["room"]) else f" for room {int(row['room'])}"
            steps.append(f"{row['signature']}{room} on the {row['role']} {eventtime.when(row)}, "
                         f"{eventtime.relation_words(row, first, 'the thread death')} [{row['source']}:{row['line']}]")
    if death is not None:
        steps.append(f"bootstrap thread death on {death.engine}: {death.says}")
    missing = next((s for s in signals if s.name == "bootstrap_thread_missing"), None)
    if missing is not None:
        steps.append(f"thread dump: {missing.says}")
    logged = next((s for s in signals if s.name == "bootstrap_thread_missing_logged"), None)
    if logged is not None and missing is None:  # sglang's own dump says it where py-spy was not run now
        steps.append(f"logged thread dump: {logged.says}")
    lies = next((s for s in signals if s.name == "health_lies"), None)
    if lies is not None:
        steps.append(f"no request completes since: {lies.says}")
    stuck = _stuck_requests(evidence)
    if stuck:
        steps.append(stuck)
    health = _health_still_ok(evidence)
    if health:
        steps.append(health)
    return steps


def _stuck_requests(evidence: Evidence) -> str | None:
    samples = evidence.frame("metrics")
    if samples is None or not len(samples):
        return None
    gauge = samples[samples["metric_canonical"] == BOOTSTRAP_QUEUE]
    if not len(gauge):
        return None
    last_ts = gauge["ts"].max()
    value = gauge.loc[gauge["ts"] == last_ts, "value"].sum()
    if value <= 0:
        return None
    return f"{int(value)} request(s) in the prefill bootstrap queue ({BOOTSTRAP_QUEUE} at {_iso(last_ts)})"


def _health_still_ok(evidence: Evidence) -> str | None:
    probes = evidence.frame("probes")
    if probes is None or not len(probes):
        return None
    health = probes[probes["kind"].isin(("health", "health_generate")) & (probes["outcome"] == "ok")]
    if not len(health):
        return None
    last = health.sort_values("ts").iloc[-1]
    return f"health still 200: {len(health)} health probe(s) passed, the last {last['kind']} on {last['target']} at {_iso(last['ts'])}"
