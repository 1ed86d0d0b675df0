"""When an event happened, with the bounds its log allows, and which of two came first.

A line with its own time (sglang's prefix, a journal's) happened then. A line without one (a
thread's traceback, faulthandler's "Fatal Python error") is given the time of the timed line
before it (``ts_source`` ``inferred``) and the time of the timed line after it (``ts_upper``):
it happened somewhere in that interval. On real sglang 0.5.15 the death of ``bootstrap_thread``
was 40 s after the last timed line before it, so a sentence that says "at" the lower bound is
wrong by up to that much, and a decode's abort printed inside the interval cannot be called
"before" the death from the times alone.

Every sentence about an event's time says it through :func:`when`, and every "before" through
:func:`order`.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

BEFORE = "before"  # the times say so
EARLIER_LINE = "earlier line"  # the same log, an earlier line: written before it
UNORDERED = "unordered"  # the times overlap and nothing else tells
AFTER = "after"


def _stamp(value) -> pd.Timestamp | None:
    if value is None:
        return None
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return pd.Timestamp(value)


def bounds(event: Mapping) -> tuple[pd.Timestamp | None, pd.Timestamp | None]:
    """(earliest, latest) the event can have happened: both its own time for a timed line; for an
    inferred one the timed lines around it (latest None when no timed line follows)."""
    at = _stamp(event.get("ts"))
    if event.get("ts_source") != "inferred":
        return at, at
    return at, _stamp(event.get("ts_upper"))


def _clock(ts: pd.Timestamp) -> str:
    return ts.isoformat(timespec="milliseconds") if ts.microsecond else ts.isoformat()


def when(event: Mapping) -> str:
    """"at T", "between T and U" (no time of its own), "after T" (nothing timed after it), or unknown."""
    earliest, last = bounds(event)
    if earliest is None:
        return "at an unknown time" if last is None else f"before {_clock(last)}"
    if event.get("ts_source") != "inferred":
        return f"at {_clock(earliest)}"
    if last is None:
        return f"after {_clock(earliest)} (no time of its own, and no timed line after it)"
    if last == earliest:
        return f"at {_clock(earliest)} (no time of its own; the lines around it agree)"
    return f"between {_clock(earliest)} and {_clock(last)} (no time of its own: the timed lines around it)"


def order(first: Mapping, second: Mapping) -> str:
    """How ``first`` stands to ``second``: BEFORE, EARLIER_LINE, UNORDERED or AFTER.

    BEFORE only when ``first`` ended before ``second`` could have begun; in one log an earlier
    line was written earlier (EARLIER_LINE); otherwise overlapping bounds leave it UNORDERED.
    """
    a_start, a_end = bounds(first)
    b_start, b_end = bounds(second)
    same_log = first.get("source") is not None and first.get("source") == second.get("source")
    if same_log and first.get("line") is not None and second.get("line") is not None:
        return EARLIER_LINE if int(first["line"]) < int(second["line"]) else AFTER
    if a_end is not None and b_start is not None and a_end < b_start:  # a_end None: no bound after it
        return BEFORE
    if b_end is not None and a_start is not None and b_end < a_start:
        return AFTER
    return UNORDERED


def relation_words(first: Mapping, second: Mapping, what: str = "the death") -> str:
    """``first`` against ``second`` in words, saying only what the bounds (or the log's order) allow."""
    relation = order(first, second)
    if relation == BEFORE:
        return f"before {what}"
    if relation == EARLIER_LINE:
        return f"before {what} (an earlier line of the same log)"
    if relation == AFTER:
        return f"after {what}"
    return f"within the time bounds of {what}: which came first cannot be told from the times"
