"""What a storm's kills must show on either engine: each chosen by the decode's own counter, each abort
the decode's own line for that rid, while the session's KV was pending."""

from __future__ import annotations

import re

import pandas as pd

from forensics.storm import observer


def check_kills(doc: dict, history: pd.DataFrame, decode_log: str, sessions: int) -> None:
    """Every strike was chosen by the decode's counter; the aborts are the decode's own lines per rid."""
    [cycle] = doc["cycles"]
    storm = cycle.get("storm", cycle)
    assert storm["strikes"] and {s["observed_by"] for s in storm["strikes"]} == {observer.BY_DECODE}, storm["strikes"]
    assert all(s["arrived_at_decode"] >= s["held"] for s in storm["strikes"] if s["held"])
    assert len(history) == sessions
    hit = history[history["phase_attributed"].isin(["prealloc", "transfer"])]
    assert len(hit) >= 1 and hit["killed"].all(), history[["rid", "killed", "phase_attributed"]]
    assert set(hit["phase_at_kill"]) <= {"sent", "waiting"}  # out, no token yet: while the KV was pending
    for row in hit.itertuples():
        queue = "handshake" if row.phase_attributed == "prealloc" else "transfer"
        assert re.search(rf"Decode {queue} failed for request rank=0 decode_req\.req\.rid='{row.rid}' "
                         rf"decode_req\.req\.bootstrap_room={row.room} with exception .*Aborted by AbortReq\.",
                         decode_log), row.rid
