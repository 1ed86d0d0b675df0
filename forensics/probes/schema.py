"""The ``probes`` Evidence frame: its columns, the probe kinds and the outcomes (docs/probes.md).

One row per probe sent (its outcome as known when the frame was taken) plus one
``pending`` row per tick at which a probe of the same (target, kind) was still open,
so nothing was sent. Identifiers stay exact: ``probe_id``, ``status`` and the 63-bit
``room`` are ``Int64`` built from Python ints, never through float.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forensics import frames

PROBES_SCHEMA: dict[str, str] = {
    "ts": "datetime64[ns, UTC]",  # when the probe was sent (pending rows: the tick that found it open)
    "probe_id": "Int64",  # the probe (pending rows: the open probe they waited on)
    "target": "string",
    "role": "string",  # prefill, decode, router, or pd (a prefill+decode pair without a router)
    "kind": "string",  # health, health_generate, liveness
    "url": "string",  # what was requested (a pair: both URLs, prefill first)
    "outcome": "string",  # see OUTCOMES
    "status": "Int64",  # the HTTP status (a pair: the decode's); <NA> without a response
    "ttfb_s": "float64",  # seconds to the response's status line (a pair: the decode's)
    "total_s": "float64",  # seconds to the whole answer (a pair: the later of the two); NaN if none yet
    "waited_s": "float64",  # seconds waited when the outcome was taken (answered: = total_s)
    "deadline_s": "float64",  # after this the probe is marked late; its connection stays open
    "room": "Int64",  # the bootstrap_room sent (liveness without a router); <NA> otherwise
    "detail": "string",
}

KINDS = ("health", "health_generate", "liveness")
KIND_PATHS = {"health": "/health", "health_generate": "/health_generate"}

OUTCOMES = {
    "ok": "answered 2xx within the deadline",
    "http_error": "answered within the deadline with a non-2xx status",
    "in_flight": "sent, not answered yet, deadline not reached",
    "late": "deadline passed, no answer yet; the connection is kept open",
    "answered_late": "answered (any status) after the deadline; total_s is the full wait",
    "pending": "not sent: the previous probe of this target and kind was still open at this tick",
    "refused": "connection refused: nothing listens there (nothing was sent)",
    "error": "a transport error (connect failure, reset, malformed answer)",
    "unanswered": "no answer within the hard cap; the connection was then closed",
    "abandoned": "the caller stopped with abandon=True and the open connection was closed",
}

# Rows that say the probed path does not work (a pending row only once its wait passed the deadline).
FAILING = frozenset({"http_error", "late", "answered_late", "refused", "error", "unanswered"})

DEFAULT_DEADLINES_S = {"health": 2.0, "health_generate": 2.0, "liveness": 5.0}
# Longer than sglang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT and ..._WAITING_TIMEOUT (300 s each):
# by the time a probe gives up, sglang has already failed the request itself.
DEFAULT_CAP_S = 330.0


def is_failing(outcome: pd.Series, waited_s: pd.Series, deadline_s: pd.Series) -> pd.Series:
    """Row by row: does this row say the path failed? (pending counts once it waited past the deadline)."""
    failing = outcome.isin(FAILING)
    pending_late = (outcome == "pending") & (waited_s > deadline_s)
    return (failing | pending_late).fillna(False).astype(bool)


def int64_column(values: list[int | None]) -> pd.arrays.IntegerArray:
    """An ``Int64`` array from Python ints and None, exact for the full int64 range (no float step)."""
    data = np.array([0 if v is None else int(v) for v in values], dtype=np.int64)
    mask = np.array([v is None for v in values], dtype=bool)
    return pd.arrays.IntegerArray(data, mask)


def empty_frame() -> pd.DataFrame:
    return frames.empty_frame(PROBES_SCHEMA)


def conform(frame: pd.DataFrame) -> pd.DataFrame:
    """Check a frame against :data:`PROBES_SCHEMA` (column set, order and dtypes) and its outcomes."""
    frame = frames.conform(frame, PROBES_SCHEMA, name="probes frame")
    bad = set(frame["outcome"].dropna()) - set(OUTCOMES)
    if bad:
        raise ValueError(f"probes frame has unknown outcomes {sorted(bad)}")
    return frame
