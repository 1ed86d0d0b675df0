"""Frames and their schemas: the one empty frame and the one conform every reader's frame goes through.

A schema is ``{column: dtype}`` in column order. :func:`conform` holds a frame to it in one of
two ways: ``coerce=False`` (a collector's own frame: the columns present, in order, each of
exactly its dtype; anything else is a bug, raised naming the column) or ``coerce=True`` (a
frame being built from parsed text: missing columns added empty, each cast to its dtype, a
value that cannot take it raised naming the column, extra columns kept after the schema's).
"""

from __future__ import annotations

import pandas as pd


def empty_frame(schema: dict[str, str]) -> pd.DataFrame:
    """No rows, the schema's columns in their dtypes."""
    return pd.DataFrame({column: pd.Series([], dtype=dtype) for column, dtype in schema.items()})


def conform(frame: pd.DataFrame, schema: dict[str, str], *, name: str = "frame", coerce: bool = False) -> pd.DataFrame:
    """``frame`` held to ``schema`` (see the module's docstring); ``name`` names it in an error."""
    if coerce:
        return _coerced(frame, schema)
    missing = [c for c in schema if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} lacks columns {missing}")
    frame = frame[list(schema)]
    for column, dtype in schema.items():
        if str(frame[column].dtype) != dtype:
            raise TypeError(f"{name} column {column!r} is {frame[column].dtype}, schema says {dtype}")
    return frame


def _coerced(frame: pd.DataFrame, schema: dict[str, str]) -> pd.DataFrame:
    out = {}
    for column, dtype in schema.items():
        if column not in frame.columns:
            out[column] = pd.Series(index=frame.index, dtype=dtype)
            continue
        series = frame[column]
        try:
            if dtype.startswith("datetime64"):
                series = pd.to_datetime(series, utc=True).astype(dtype)
            else:
                series = series.astype(dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"column {column!r} cannot be {dtype}: {exc}") from exc
        out[column] = series
    result = pd.DataFrame(out, index=frame.index)
    for column in (c for c in frame.columns if c not in schema):
        result[column] = frame[column]
    return result.reset_index(drop=True)
