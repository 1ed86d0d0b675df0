"""Checks of a written report against the evidence it was written from (shared by the report tests)."""

from __future__ import annotations

import re

import pandas as pd

_GAUGE_SENTENCE = (r"Gauge (?P<metric>\S+) on (?P<engine>\S+): (?:stayed at (?P<value>\S+)|from (?P<low>\S+) to "
                   r"(?P<high>\S+)) over (?P<n>\d+) sample\(s\) from (?P<t1>\d\d:\d\d:\d\d) to (?P<t2>\d\d:\d\d:\d\d)"
                   r"(?:, (?P<after>\d+) of them after the bootstrap thread died at (?P<death>\d\d:\d\d:\d\d))?")


def check_gauge_sentences(md: str, metrics: pd.DataFrame, death: pd.Timestamp | None) -> int:
    """Every sentence the report writes about a gauge, against the samples of the series it names
    (read here from the frame, not through the report's code); the number of sentences checked."""
    checked = 0
    for m in re.finditer(_GAUGE_SENTENCE, md):
        rows = metrics[(metrics["metric_canonical"] == m["metric"]) & (metrics["host"] == m["engine"])]
        assert len(rows) and set(rows["type"]) == {"gauge"}, (m[0], "names a series that is no gauge")
        exact = "value_int" in rows and rows["value_int"].notna().all()
        by_scrape = rows.groupby("ts")["value_int" if exact else "value"].sum()
        assert int(m["n"]) == len(by_scrape), m[0]
        assert (m["t1"], m["t2"]) == (by_scrape.index[0].strftime("%H:%M:%S"), by_scrape.index[-1].strftime("%H:%M:%S"))
        if m["value"] is not None:
            assert set(by_scrape) == {float(m["value"])}, (m[0], list(by_scrape))
        else:
            assert (float(m["low"]), float(m["high"])) == (by_scrape.min(), by_scrape.max()), m[0]
        if m["after"] is not None:
            assert death is not None and m["death"] == death.strftime("%H:%M:%S"), m[0]
            assert int(m["after"]) == int((by_scrape.index > death).sum()), m[0]
        checked += 1
    return checked
