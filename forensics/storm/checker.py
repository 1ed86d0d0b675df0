"""The storm's checker: after each cycle, the live diagnosis (``fx.collect`` + ``fx.diagnose``).

No second diagnosis here: a wedge is what :func:`forensics.diagnosing.diagnose` says it
is (liveness failing while health passes, confirmed by a second source). What the checker
adds is the storm's own reading of the same evidence: which decode queue each session's
abort hit (its rid in the decode's ``Decode handshake failed`` / ``Decode transfer failed
... Aborted by AbortReq.`` ERROR line) and how many ABORT frames the prefill showed it
received (the patched loop's ``Received abort notification`` line, or the unpatched loop's
``Foreign traffic?`` assertion).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

DECODE_ABORT_PHASE = {"decode_handshake_aborted": "prealloc", "decode_transfer_aborted": "transfer"}
PREFILL_ABORT_SIGNATURES = ("abort_received", "nixl_guard_assertion")
ABORT_SENT_SIGNATURES = ("abort_sent",)


@dataclass
class Check:
    """One cycle's check: the evidence, the verdict, and the storm's reading of the logs."""

    evidence: Any
    verdict: Any
    attributed: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # rid -> (phase, room)
    logs_read: bool = False
    prefill_abort_frames: int = 0  # ABORT frames the prefill's log shows it received (incl. the fatal one)
    aborts_sent: int = 0  # "Sent abort notification" lines on the decode (DEBUG in sglang)


def check(target: Any, *, since: pd.Timestamp, rids: set[str], sample_s: float, **collect_options: Any) -> Check:
    """Collect live evidence from ``target`` since ``since`` and diagnose it."""
    import forensics as fx

    evidence = fx.collect(target, since=since, sample_s=sample_s, **collect_options)
    verdict = fx.diagnose(evidence)
    return read(evidence, verdict, rids)


def read(evidence: Any, verdict: Any, rids: set[str]) -> Check:
    """The storm's reading of collected evidence (no collection, no diagnosis)."""
    events = evidence.frames.get("events")
    decode_logs_missing = any(g.piece == "logs" and g.target.startswith("decode")
                              for g in evidence.gaps)
    result = Check(evidence=evidence, verdict=verdict, logs_read=events is not None and not decode_logs_missing)
    if events is None or not len(events):
        return result
    decode = events[(events["role"] == "decode") & events["signature"].isin(list(DECODE_ABORT_PHASE))]
    for row in decode.itertuples(index=False):
        rid = None if pd.isna(row.rid) else str(row.rid)
        if rid in rids and rid not in result.attributed:
            room = None if pd.isna(row.room) else int(row.room)
            result.attributed[rid] = (DECODE_ABORT_PHASE[row.signature], room)
    prefill = events[(events["role"] == "prefill") & events["signature"].isin(list(PREFILL_ABORT_SIGNATURES))]
    result.prefill_abort_frames = int(len(prefill))
    result.aborts_sent = int(((events["role"] == "decode") & events["signature"].isin(list(ABORT_SENT_SIGNATURES)))
                             .sum())
    return result
