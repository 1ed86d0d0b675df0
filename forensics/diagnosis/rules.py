"""From signals to one verdict. The rules, in order (docs/diagnosis.md):

1. DOWN: an engine process is gone, an engine refuses connections, or its scheduler crashed.
2. WEDGED: wedge signals from at least two independent sources (probes: liveness failing
   while health passes; threads: the prefill's bootstrap thread missing from a dump; logs:
   its thread-death traceback since the process started, or a bootstrap queue that only
   grows in the batch history; metrics: the bootstrap-queue gauge only growing). A timeout
   alone, or one source alone, is never a wedge.
3. DEGRADED: the deployment answers, but something is failing (timeouts, transfer failures,
   a lost heartbeat, intermittent liveness, a health endpoint failing, a thread missing on
   one engine while liveness passes).
4. HEALTHY: the last liveness probe answered, health passed, and nothing above holds.
5. INCONCLUSIVE otherwise, naming what was missing: never HEALTHY by default.
"""

from __future__ import annotations

from forensics.evidence import Evidence, Gap

from .killchain import kill_chain
from .nextsteps import next_steps
from .signals import Signal, extract_signals
from .verdict import Verdict

WEDGE_SOURCES = ("probes", "threads", "logs", "metrics")
# The pieces that could have shown a wedge signal: when one is missing, a single signal
# is INCONCLUSIVE rather than "not wedged".
_WEDGE_PIECES = {"probes": "probes", "threads": "threads", "logs": "logs", "metrics": "metrics"}


# The frames each signal source reads (signals.py): a source with none of them was not collected.
_SOURCE_FRAMES = {"processes": ("processes",), "probes": ("probes",), "threads": ("thread_check", "logged_threads"),
                  "logs": ("events", "log_findings"), "metrics": ("metrics",)}


def decide(evidence: Evidence, signals: list[Signal] | None = None) -> Verdict:
    signals = extract_signals(evidence) if signals is None else signals
    name = evidence.deployment.get("name")
    at = evidence.collected_at
    gaps = list(evidence.gaps)
    by_kind: dict[str, list[Signal]] = {}
    for signal in signals:
        by_kind.setdefault(signal.kind, []).append(signal)
    down, wedge = by_kind.get("down", []), by_kind.get("wedge", [])
    degraded, healthy = by_kind.get("degraded", []), by_kind.get("healthy", [])

    read = [source for source, frames in _SOURCE_FRAMES.items()
            if any(evidence.frames.get(frame) is not None for frame in frames)]

    def verdict(word: str, reasons: list[str], chain: list[str] | None = None) -> Verdict:
        return Verdict(word, reasons, chain or [], signals, gaps, name, at, next_steps(word, signals, evidence), read)

    if down:
        reasons = [f"{s.engine}: {s.says}" for s in down]
        return verdict("DOWN", reasons, kill_chain(evidence, signals, "DOWN"))

    wedge_sources = sorted({s.source for s in wedge})
    liveness_ok = any(s.name == "liveness_ok" for s in healthy)
    if len(wedge_sources) >= 2 and not liveness_ok:
        reasons = [f"wedge signals from {len(wedge_sources)} independent sources ({', '.join(wedge_sources)}):"]
        reasons += [f"[{s.source}] {s.engine}: {s.says}" for s in wedge]
        return verdict("WEDGED", reasons, kill_chain(evidence, signals, "WEDGED"))

    if liveness_ok:
        trouble = degraded + wedge
        if trouble:
            reasons = ["the deployment answers (the last liveness probe completed), but:"]
            reasons += [f"[{s.source}] {s.engine}: {s.says}" for s in trouble]
            return verdict("DEGRADED", reasons)
        if not any(s.source == "probes" and s.name == "health_failing" for s in signals):
            reasons = [s.says for s in healthy]
            if gaps:
                reasons.append(f"{len(gaps)} piece(s) not collected (listed below); none of them can contradict a "
                               "completed real request")
            return verdict("HEALTHY", reasons)

    if degraded and set(wedge_sources) <= {"probes"}:
        reasons = [f"[{s.source}] {s.engine}: {s.says}" for s in degraded]
        if liveness_failing(signals):
            reasons.insert(0, "liveness is failing and the evidence points to these failures rather than a wedge:")
        return verdict("DEGRADED", reasons)

    return verdict("INCONCLUSIVE", _inconclusive_reasons(evidence, signals, wedge_sources, gaps))


def liveness_failing(signals: list[Signal]) -> bool:
    return any(s.name in ("health_lies", "liveness_failing") for s in signals)


def _inconclusive_reasons(evidence: Evidence, signals: list[Signal], wedge_sources: list[str],
                          gaps: list[Gap]) -> list[str]:
    reasons = []
    if wedge_sources:
        reasons.append(f"only one source shows a wedge ({wedge_sources[0]}); WEDGED needs two independent ones")
        reasons += [f"[{s.source}] {s.engine}: {s.says}" for s in signals if s.kind == "wedge"]
    elif liveness_failing(signals):
        reasons.append("liveness is failing, but no second signal says why (a timeout alone is not a wedge)")
    probes = evidence.frame("probes")
    if probes is None or not (probes["kind"] == "liveness").any():
        reasons.append("no liveness probe result: nothing shows that a real request completes")
    for piece in _WEDGE_PIECES.values():
        frame = evidence.frame(_SOURCE_FRAMES[piece][0])  # the piece's main frame (a live dump's check, the events)
        piece_gaps = [g for g in gaps if g.piece == piece]
        if piece_gaps:
            reasons += [f"missing {piece}: {g.reason}" + (f" (fix: {g.fix})" if g.fix else "") for g in piece_gaps]
        elif frame is None:
            reasons.append(f"missing {piece}: not collected")
    return reasons or ["the evidence decides nothing (no signal from any source)"]
