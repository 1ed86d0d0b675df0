"""The storm's history: one row per op (a session), Jepsen's invoke time and outcome.

Outcome: ``ok`` (the stream ended with [DONE]); ``fail`` (known not to have completed:
an HTTP error, an error event, a close without [DONE]; ``detail`` says which);
``info`` (unknown: a session the nemesis killed, or a stream that never ended).
Columns and dtypes are :data:`HISTORY_COLUMNS` (docs/storm.md).
"""

from __future__ import annotations

import pandas as pd

HISTORY_COLUMNS: dict[str, str] = {
    "cycle": "Int64",
    "wave": "Int64",
    "session": "Int64",
    "rid": "string",
    "client_pid": "Int64",  # the client process (sigkill mode); <NA> in-process
    "invoke": "datetime64[ns, UTC]",  # the request started (connect)
    "sent": "datetime64[ns, UTC]",
    "headers": "datetime64[ns, UTC]",
    "first_token": "datetime64[ns, UTC]",
    "end": "datetime64[ns, UTC]",  # completion, failure, or the kill
    "tokens": "Int64",
    "http_status": "Int64",
    "killed": "boolean",
    "kill_mode": "string",  # rst | sigkill | <NA>
    "phase_at_kill": "string",  # what the client saw: connecting | sent | waiting | streaming
    "phase_attributed": "string",  # from the decode's log: prealloc | transfer | none | unknown
    "room": "UInt64",  # the bootstrap room the decode's abort line names (exact)
    "outcome": "string",  # ok | fail | info
    "detail": "string",
}
OUTCOMES = ("ok", "fail", "info")
ATTRIBUTED = ("prealloc", "transfer", "none", "unknown")


def _times(values) -> pd.Series:
    nanos = pd.array([pd.NA if v is None else round(v * 1e9) for v in values], dtype="Int64")
    return pd.to_datetime(pd.Series(nanos), unit="ns", utc=True).astype("datetime64[ns, UTC]")


def build(rows: list[dict]) -> pd.DataFrame:
    """The history frame from per-session dicts (keys of :data:`HISTORY_COLUMNS`; times as epoch seconds)."""
    data = {}
    for column, dtype in HISTORY_COLUMNS.items():
        values = [row.get(column) for row in rows]
        if dtype.startswith("datetime"):
            data[column] = _times(values).array if rows else pd.array([], dtype=dtype)
        else:
            data[column] = pd.array([pd.NA if v is None else v for v in values], dtype=dtype)
    frame = pd.DataFrame(data)
    validate(frame)
    return frame


def validate(frame: pd.DataFrame) -> None:
    missing = [c for c in HISTORY_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"history frame lacks {missing}")
    for column, dtype in HISTORY_COLUMNS.items():
        if str(frame[column].dtype) != dtype:
            raise ValueError(f"history column {column}: dtype {frame[column].dtype}, expected {dtype}")
    bad = set(frame["outcome"].dropna()) - set(OUTCOMES)
    if bad:
        raise ValueError(f"history outcome: unknown {sorted(bad)}")


def empty() -> pd.DataFrame:
    return build([])
