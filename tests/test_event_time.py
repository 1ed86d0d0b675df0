"""Event times with their bounds: a line without a time of its own is placed between the lines
around it, and nothing is called "before" another unless the bounds (or one log's order) say so.

Real material: sglang 0.5.15's death of bootstrap_thread (tests/data/real-engine-0.5.15) has no
time; the timed lines around it are 2 min apart, and the decode's abort that caused it was
printed 8 s after the last timed prefill line before it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import forensics.logs as logs
from forensics.logs import eventtime

DATA = Path(__file__).parent / "data" / "real-engine-0.5.15"
T = pd.Timestamp


def _event(ts, source="sglang", upper=None, log="a.log", line=1):
    return {"ts": T(ts), "ts_source": source, "ts_upper": None if upper is None else T(upper),
            "source": log, "line": line}


def test_when_says_at_between_or_after():
    assert eventtime.when(_event("2026-12-01T23:30:12Z")) == "at 2026-12-01T23:30:12+00:00"
    between = eventtime.when(_event("2026-12-01T23:30:04Z", "inferred", "2026-12-01T23:32:09Z"))
    assert between.startswith("between 2026-12-01T23:30:04+00:00 and 2026-12-01T23:32:09+00:00")
    assert eventtime.when(_event("2026-12-01T23:30:04Z", "inferred")).startswith("after 2026-12-01T23:30:04")
    assert eventtime.when({"ts": pd.NaT, "ts_source": "none"}) == "at an unknown time"


@pytest.mark.parametrize("first, second, relation", [
    (_event("2026-12-01T10:00:00Z", log="d.log"), _event("2026-12-01T10:00:05Z", log="p.log"), eventtime.BEFORE),
    (_event("2026-12-01T10:00:10Z", log="d.log"),
     _event("2026-12-01T10:00:04Z", "inferred", "2026-12-01T10:02:09Z", log="p.log"), eventtime.UNORDERED),
    (_event("2026-12-01T10:00:01Z", log="d.log"),
     _event("2026-12-01T10:00:04Z", "inferred", "2026-12-01T10:02:09Z", log="p.log"), eventtime.BEFORE),
    (_event("2026-12-01T10:03:00Z", log="d.log"),
     _event("2026-12-01T10:00:04Z", "inferred", "2026-12-01T10:02:09Z", log="p.log"), eventtime.AFTER),
    (_event("2026-12-01T10:00:10Z", line=7),
     _event("2026-12-01T10:00:04Z", "inferred", "2026-12-01T10:02:09Z", line=9), eventtime.EARLIER_LINE),
    (_event("2026-12-01T10:00:04Z", "inferred", log="d.log"), _event("2026-12-01T10:00:05Z", log="p.log"),
     eventtime.UNORDERED),  # no timed line after the first: it may have happened any time later
])
def test_order_claims_before_only_when_the_bounds_allow_it(first, second, relation):
    assert eventtime.order(first, second) == relation


def test_the_real_summary_bounds_the_death_and_takes_the_abort_inside_its_bounds_as_the_trigger():
    summary = logs.scan([str(DATA / "prefill.log"), str(DATA / "decode.log")]).summary()
    death = summary.facts["first_thread_death"]
    assert (death["ts"], death["ts_upper"]) == ("2026-12-01T23:30:04+00:00", "2026-12-01T23:32:09+00:00")
    trigger = summary.facts["trigger"]
    # The abort (23:30:12) inside the death's bounds, not the waiting timeout (23:31:16) that is its
    # fallout, and never "just before the death": the times cannot tell which came first.
    assert (trigger["signature"], trigger["room"]) == ("decode_transfer_aborted", 3925563661319346376)
    assert trigger["relation"] == eventtime.UNORDERED
    text = " ".join(summary.sentences)
    assert "between 2026-12-01T23:30:04+00:00 and 2026-12-01T23:32:09+00:00" in text
    assert "just before" not in text and "cannot be told from the times" in text
