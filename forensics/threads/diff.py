"""``diff_dumps``: what changed between two dumps of the same processes.

A thread is the same thread in both dumps when its pid, py-spy ``thread_id``, OS
``native_id`` and name all match (a new ``Thread-N`` always has a new N, so a restarted
bootstrap thread is a vanished one plus an appeared one). Pids that either dump could
not read are not compared: they are listed in ``frame.attrs["not_compared"]`` with the
reason, never reported as "all threads vanished".
"""

from __future__ import annotations

import pandas as pd

from forensics.threads.dump import ThreadDump

APPEARED = "appeared"
VANISHED = "vanished"
TOP_CHANGED = "top_changed"

DIFF_COLUMNS = {
    "pid": "int64",
    "thread_id": "uint64",
    "native_id": "Int64",
    "thread_name": "string",
    "change": "string",
    "top_before": "string",
    "top_after": "string",
}

_KEY = ["pid", "thread_id", "native_id", "thread_name"]


def diff_dumps(before: ThreadDump, after: ThreadDump) -> pd.DataFrame:
    """Threads that appeared, vanished, or whose innermost frame changed, per pid in both dumps."""
    not_compared: dict[int, str] = {}
    for pid in sorted(set(before.pids) | set(after.pids)):
        if pid not in before.pids or pid not in after.pids:
            not_compared[pid] = "dumped only " + ("after" if pid in after.pids else "before")
        elif before.gap(pid) is not None:
            not_compared[pid] = f"before: {before.gap(pid).reason}"
        elif after.gap(pid) is not None:
            not_compared[pid] = f"after: {after.gap(pid).reason}"
    compared = [p for p in before.pids if p in after.pids and p not in not_compared]
    old = before.frame[before.frame["pid"].isin(compared)]
    new = after.frame[after.frame["pid"].isin(compared)]
    merged = old[_KEY + ["top_frame"]].merge(
        new[_KEY + ["top_frame"]], on=_KEY, how="outer", suffixes=("_before", "_after"), indicator=True
    )
    rows: dict[str, list] = {name: [] for name in DIFF_COLUMNS}
    for where in merged.to_dict("records"):
        side = where["_merge"]
        if side == "left_only":
            change = VANISHED
        elif side == "right_only":
            change = APPEARED
        elif where["top_frame_before"] != where["top_frame_after"]:
            change = TOP_CHANGED
        else:
            continue
        for name in _KEY:
            value = where[name]
            rows[name].append(None if pd.isna(value) else value)
        rows["change"].append(change)
        rows["top_before"].append(None if pd.isna(where["top_frame_before"]) else where["top_frame_before"])
        rows["top_after"].append(None if pd.isna(where["top_frame_after"]) else where["top_frame_after"])
    # thread ids are exact uint64 in both inputs; rebuild from the originals, never through float
    frame = pd.DataFrame({name: pd.Series(values, dtype=DIFF_COLUMNS[name]) for name, values in rows.items()})
    frame = frame.sort_values(["pid", "change", "thread_name"], kind="stable").reset_index(drop=True)
    frame.attrs["not_compared"] = not_compared
    return frame
