"""Which rows of a metrics frame are the PD queue gauges the report draws and describes.

A gauge is what its page's ``# TYPE`` line says is a gauge (the frame's ``type`` column), never
what its name suggests: histogram ``_bucket``/``_sum``/``_count`` samples and ``_created``
timestamps (about 1.8e9) also carry "queue" or "bootstrap" in their names, and reading them as
queue depths made the report call a timestamp a frozen queue.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

QUEUE_WORDS = "queue|bootstrap"


def queue_gauge_rows(metrics: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows of ``metrics`` (a samples frame) that are queue gauges; None when the frame cannot
    say (no ``metric_canonical`` or no ``type`` column)."""
    if metrics is None or "metric_canonical" not in metrics or "type" not in metrics:
        return None
    named = metrics["metric_canonical"].astype(str).str.contains(QUEUE_WORDS)
    typed = metrics["type"].astype(str) == "gauge"
    return metrics[named & typed]


@dataclass(frozen=True)
class GaugeStory:
    """What one queue gauge of one engine did over the window, in the numbers its sentence quotes."""

    metric: str
    engine: str
    samples: int
    first: pd.Timestamp
    last: pd.Timestamp
    low: str  # values as the page wrote them (exact for integers: never through a float's %g)
    high: str
    final: str
    after_death: int | None = None  # samples taken after the bootstrap thread died (None: no death known)
    death_at: pd.Timestamp | None = None

    @property
    def constant(self) -> bool:
        return self.low == self.high

    def sentence(self) -> str:
        span = f"{self.samples} sample(s) from {_clock(self.first)} to {_clock(self.last)}"
        head = f"Gauge {self.metric} on {self.engine or '?'}: "
        if not self.constant:
            return head + f"from {self.low} to {self.high} over {span}, {self.final} at the last."
        text = head + f"stayed at {self.low} over {span}"
        if self.after_death:
            # Only then is "it never moved after the death" a fact of these samples.
            text += (f", {self.after_death} of them after the bootstrap thread died at {_clock(self.death_at)}: "
                     "a gauge that never moves crosses no threshold")
        return text + "."


def gauge_stories(metrics: pd.DataFrame | None, death_at: pd.Timestamp | None = None) -> list[GaugeStory] | None:
    """One story per (gauge, engine) of the queue gauges in ``metrics``; None when the frame cannot
    say which series are gauges. Series with one label set each are summed per scrape (a DP rank
    per series), as the gauge plot draws them."""
    rows = queue_gauge_rows(metrics)
    if rows is None:
        return None
    stories = []
    host = rows["host"].astype(str) if "host" in rows else pd.Series([""] * len(rows), index=rows.index)
    for (metric, engine), group in rows.groupby([rows["metric_canonical"].astype(str), host], sort=True):
        per_scrape = _exact_sums(group)
        if not len(per_scrape):
            continue
        times = per_scrape.index
        after = None
        if death_at is not None and not pd.isna(death_at):
            after = int((times > death_at).sum())
        stories.append(GaugeStory(str(metric), str(engine), len(per_scrape), times[0], times[-1],
                                  _text(per_scrape.min()), _text(per_scrape.max()), _text(per_scrape.iloc[-1]),
                                  after, death_at))
    return stories


def _exact_sums(group: pd.DataFrame) -> pd.Series:
    """The gauge per scrape time: integers summed as integers where every sample is one."""
    ints = group["value_int"] if "value_int" in group else None
    if ints is not None and ints.notna().all():
        values = pd.Series([int(v) for v in ints], index=group.index, dtype=object)
    else:
        values = pd.to_numeric(group["value"], errors="coerce")
    frame = pd.DataFrame({"ts": pd.to_datetime(group["ts"], utc=True), "value": values}).dropna()
    return frame.groupby("ts")["value"].sum().sort_index()


def _text(value) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    return f"{value:g}"


def _clock(ts: pd.Timestamp) -> str:
    return pd.Timestamp(ts).strftime("%H:%M:%S")
