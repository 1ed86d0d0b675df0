"""Turn the time texts of the supported formats into tz-aware UTC timestamps, in bulk.

sglang's prefix has no zone and journalctl's short-precise has neither zone nor year:
those are read in the zone the user states (default UTC), never guessed silently;
short-precise takes its year from the caller (see ``timeline(year=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

# Kinds of time text a line can carry.
SGLANG = "sglang"  # b"2025-07-01 12:00:00[.123]", naive
ISO = "iso"  # b"2025-07-01T12:00:00[.123456]+00:00", zoned
PRECISE = "precise"  # b"Jul 01 12:00:00.123456", naive, no year
EPOCH_US = "epoch_us"  # journald __REALTIME_TIMESTAMP


def convert(kind: str, values: Sequence, tz: str = "UTC", year: int | None = None) -> pd.DatetimeIndex:
    """Convert same-kind time values to a UTC DatetimeIndex (unparseable values become NaT).

    Log lines share their second by the hundreds, so only the distinct texts are parsed.
    """
    if len(values) > 64 and kind != EPOCH_US:
        codes, uniques = pd.factorize(np.asarray(values, dtype=object))
        parsed = _convert(kind, list(uniques), tz, year)
        result = parsed.take(codes)
        if (codes < 0).any():
            result = result.where(codes >= 0)
        return pd.DatetimeIndex(result)
    return _convert(kind, values, tz, year)


def _convert(kind: str, values: Sequence, tz: str, year: int | None) -> pd.DatetimeIndex:
    if len(values) == 0:
        return pd.DatetimeIndex([], tz="UTC")
    if kind == EPOCH_US:
        return pd.to_datetime(np.asarray(values, dtype="int64"), unit="us", utc=True)
    texts = [v.decode("ascii", "replace") if isinstance(v, bytes) else str(v) for v in values]
    if kind == SGLANG:
        naive = pd.to_datetime(texts, format="ISO8601", errors="coerce")
        return _localise(naive, tz)
    if kind == ISO:
        texts = [t.replace(",", ".") for t in texts]
        return pd.DatetimeIndex(pd.to_datetime(texts, format="ISO8601", errors="coerce", utc=True))
    if kind == PRECISE:
        stated_year = year or pd.Timestamp.now(tz="UTC").year
        with_year = [f"{stated_year} {t}" for t in texts]
        fmt = "%Y %b %d %H:%M:%S.%f" if "." in texts[0] else "%Y %b %d %H:%M:%S"
        naive = pd.to_datetime(with_year, format=fmt, errors="coerce")
        return _localise(naive, tz)
    raise ValueError(f"unknown time kind {kind!r}")


def localise(naive, tz: str) -> pd.DatetimeIndex:
    """Naive wall-clock times (read in ``tz``) as UTC; ambiguous or skipped times become NaT."""
    return _localise(pd.DatetimeIndex(naive), tz)


def _localise(naive: pd.DatetimeIndex, tz: str) -> pd.DatetimeIndex:
    index = pd.DatetimeIndex(naive)
    if index.tz is not None:
        return index.tz_convert("UTC")
    return index.tz_localize(tz, ambiguous="NaT", nonexistent="NaT").tz_convert("UTC")
