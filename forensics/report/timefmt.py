"""Times as the report shows them: always UTC, one fixed format, whatever ``TZ`` says."""

from __future__ import annotations

from typing import Any

import pandas as pd


def stamp(value: Any) -> pd.Timestamp | None:
    """A tz-aware UTC Timestamp from a Timestamp or ISO text (naive means UTC); None when absent."""
    if value is None or value == "":
        return None
    try:
        ts = pd.Timestamp(value)
    except (ValueError, TypeError):
        return None
    if pd.isna(ts):
        return None
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def utc(value: Any) -> str:
    """``2026-11-30 03:00:05.000 UTC``; an em dash when there is no time."""
    ts = stamp(value)
    if ts is None:
        return "—"
    return ts.strftime("%Y-%m-%d %H:%M:%S.") + f"{ts.microsecond // 1000:03d} UTC"


def span(seconds: float | None) -> str:
    """A duration in words: ``1 h 02 min 05 s``, ``3.2 s``."""
    if seconds is None:
        return "unknown"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours} h {minutes:02d} min {secs:02d} s" if hours else f"{minutes} min {secs:02d} s") + f" ({whole} s)"
