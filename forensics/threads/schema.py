"""The ``threads`` Evidence frame: one row per Python thread of one dumped process.

Columns and dtypes are fixed here (``THREAD_COLUMNS``) and documented in docs/threads.md;
frames are built column by column with these dtypes, so a thread id never passes through
float, and checked with :func:`validate`.
"""

from __future__ import annotations

import pandas as pd

THREAD_COLUMNS: dict[str, str] = {
    "taken_at": "datetime64[ns, UTC]",  # when the dump of this pid finished
    "host": "string",  # Host.name the dump ran on
    "pid": "int64",
    "thread_id": "uint64",  # py-spy's thread_id (pthread_t), exact
    "native_id": "Int64",  # OS thread id (os_thread_id), <NA> when py-spy could not tell
    "thread_name": "string",  # as py-spy reports it ("Thread-3 (bootstrap_thread)", "MainThread")
    "idle": "bool",  # not running Python code at the sample (py-spy's "idle" = not active)
    "active": "bool",
    "owns_gil": "bool",
    "depth": "int64",  # number of frames
    "top_function": "string",  # innermost frame's function ("" for a thread with no Python frame)
    "top_frame": "string",  # innermost "function (file:line)"
    "frames": "string",  # all frames, innermost first, "function (file:line)" joined by "\n"
}


def empty() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series([], dtype=dtype) for name, dtype in THREAD_COLUMNS.items()})


def build(columns: dict[str, list]) -> pd.DataFrame:
    """A frame from per-column lists, each given its declared dtype (no float round trip)."""
    frame = pd.DataFrame({name: pd.Series(columns[name], dtype=dtype) for name, dtype in THREAD_COLUMNS.items()})
    validate(frame)
    return frame


def validate(frame: pd.DataFrame) -> None:
    """Raises ValueError naming the first column that is missing or has another dtype."""
    for name, dtype in THREAD_COLUMNS.items():
        if name not in frame.columns:
            raise ValueError(f"threads frame has no column {name!r}")
        if str(frame[name].dtype) != dtype:
            raise ValueError(f"threads frame column {name!r} is {frame[name].dtype}, expected {dtype}")
