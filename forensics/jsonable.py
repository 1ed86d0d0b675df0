"""JSON for documents and Evidence frames: exact identifiers, fast encoding.

JSON goes through msgspec, not the stdlib encoder, and frames are encoded column-wise
by pandas' C writer and embedded as raw JSON: tens of thousands of events cost
milliseconds, not seconds. Identifier columns (rooms: up to 2**64-1) are written as
strings of decimal digits, because jq 1.6 and JavaScript read larger JSON numbers as
doubles and round them.
"""

from __future__ import annotations

import datetime as _dt
import math

# Columns that hold identifiers wider than a double's 53-bit mantissa.
EXACT_ID_COLUMNS = ("room",)


def _enc_hook(value):
    import numpy as np
    import pandas as pd

    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        value = float(value)
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, pd.DataFrame):
        return frame_json(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__fspath__"):
        return str(value)
    return str(value)


def encode_json(document, *, indent: int = 2) -> bytes:
    """One JSON document, NaN written as null (never as the invalid ``NaN``); ``indent=0``: one line."""
    import msgspec

    raw = msgspec.json.encode(_without_nan(document), enc_hook=_enc_hook)
    return msgspec.json.format(raw, indent=indent) if indent else raw


def _without_nan(value):
    # msgspec writes float NaN as null already; Python floats nested in plain containers are
    # the only other case, and they are rare, so walk only dicts and lists.
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _without_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_nan(v) for v in value]
    return value


def frame_json(frame, columns=None):
    """A frame as a JSON array of records, encoded by pandas in C and embedded raw.

    Times are ISO 8601 in UTC with microseconds; missing values are null; identifier
    columns (``EXACT_ID_COLUMNS``) are strings of digits.
    """
    import msgspec

    if columns is not None:
        frame = frame[[c for c in columns if c in frame.columns]]
    frame = frame.copy(deep=False)
    for name in frame.columns:
        dtype = frame[name].dtype
        if name in EXACT_ID_COLUMNS:
            frame[name] = frame[name].astype("string")
        elif str(dtype) == "category":
            frame[name] = frame[name].astype(object)
        elif str(dtype) == "datetime64[ns, UTC]":
            frame[name] = _iso_utc(frame[name])
    text = frame.to_json(orient="records", date_format="iso", date_unit="us", force_ascii=False,
                         default_handler=str)
    return msgspec.Raw(text.encode("utf-8"))


def _iso_utc(series):
    """UTC times as the text ``to_json(date_format="iso", date_unit="us")`` writes, in bulk.

    pandas formats each time of a frame one by one (~3 us each); numpy formats the whole
    column at once. Missing times stay missing (null).
    """
    import numpy as np

    stamps = series.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
    missing = np.isnat(stamps)
    text = np.char.add(np.datetime_as_string(stamps.astype("datetime64[us]"), unit="us"), "Z").astype(object)
    text[missing] = None
    return text


def frame_records(frame, columns=None) -> list[dict]:
    """The records of a small frame as plain Python values (for tests and small tables)."""
    import msgspec

    return msgspec.json.decode(bytes(frame_json(frame, columns)))
