"""Quantiles of a histogram family over time, as Prometheus's ``histogram_quantile(q, rate(..._bucket))``.

A histogram's ``_bucket`` samples are cumulative counts per upper bound (``le``); drawn as they are,
they are a staircase of ever-growing totals that says nothing about latency. What an operator reads
is a quantile of what happened *between* two scrapes: the per-second increase of each bucket (the
samples frame's ``rate`` column), then the bucket where the q-th observation falls and a linear
guess inside it, exactly as Prometheus does:

* buckets sorted by their bound, ``+Inf`` last; the rank is ``q`` times the ``+Inf`` bucket's rate;
* the first bucket whose rate reaches the rank holds the quantile; inside it the value is
  interpolated linearly between the bucket's lower bound (the previous bound, or 0 for the first
  bucket when its bound is positive) and its own;
* the ``+Inf`` bucket answers with the highest finite bound; no observation (a rate of 0) gives
  no value (NaN), nor does a series without a ``+Inf`` bucket.

``tests/test_collectors_histograms.py`` holds these to ``promtool test rules`` on the same series.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from forensics.collectors.exposition import labels_dict

QUANTILES = (0.5, 0.9, 0.99)
COLUMNS = ["ts", "role", "host", "url", "metric", "labels", "quantile", "value"]


def quantile_of(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """The ``q`` quantile of one histogram: ``bounds`` its upper bounds (``inf`` included), ``counts``
    the cumulative count (or rate) at each, in any order."""
    if math.isnan(q):
        return math.nan
    if not 0.0 <= q <= 1.0:
        return -math.inf if q < 0 else math.inf  # as Prometheus answers an out-of-range q
    pairs = sorted(zip(bounds, counts))
    if not pairs or not math.isinf(pairs[-1][0]):
        return math.nan
    # Cumulative counts can dip where scrapes raced a bucket's update: make them monotonic.
    cumulative = np.maximum.accumulate(np.array([c for _, c in pairs], dtype=float))
    total = cumulative[-1]
    if not total > 0:
        return math.nan
    rank = q * total
    index = int(np.searchsorted(cumulative, rank, side="left"))
    if index >= len(pairs) - 1:  # the +Inf bucket: the highest finite bound
        return float(pairs[-2][0]) if len(pairs) > 1 else math.nan
    upper = pairs[index][0]
    lower = pairs[index - 1][0] if index > 0 else 0.0
    below = cumulative[index - 1] if index > 0 else 0.0
    if index == 0 and upper <= 0:
        return float(upper)
    inside = cumulative[index] - below
    if inside <= 0:  # only at q = 0 over an empty first bucket: Prometheus's 0/0
        return math.nan
    return float(lower + (upper - lower) * ((rank - below) / inside))  # in Prometheus's order: the same float


def histogram_quantiles(samples: pd.DataFrame, family: str, quantiles: Sequence[float] = QUANTILES) -> pd.DataFrame:
    """Per scrape and series of histogram ``family`` (its canonical name, without ``_bucket``), each of
    ``quantiles`` of the observations since the previous scrape. ``samples`` is a samples frame (with
    ``rate``); the first scrape of a series has no rate, so no row."""
    bucket = f"{family}_bucket"
    rows = samples[(samples["metric_canonical"] == bucket) & samples["scrape_ok"] & samples["rate"].notna()]
    if not len(rows):
        return pd.DataFrame(columns=COLUMNS)
    parsed = [labels_dict(text) for text in rows["labels"].astype(str)]
    bounds = [_bound(p.get("le")) for p in parsed]
    series = [",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(p.items()) if k != "le") for p in parsed]
    frame = pd.DataFrame({"ts": rows["ts"].to_numpy(), "role": rows["role"].to_numpy(), "host": rows["host"].to_numpy(),
                          "url": rows["url"].to_numpy(), "labels": series, "bound": bounds,
                          "rate": rows["rate"].to_numpy(dtype=float)})
    out = []
    for (ts, role, host, url, labels), group in frame.groupby(["ts", "role", "host", "url", "labels"], sort=True):
        for q in quantiles:
            out.append({"ts": ts, "role": role, "host": host, "url": url, "metric": family, "labels": labels,
                        "quantile": q, "value": quantile_of(q, group["bound"].tolist(), group["rate"].tolist())})
    return pd.DataFrame(out, columns=COLUMNS)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _bound(text: str | None) -> float:
    if text is None:
        return math.nan
    try:
        return float(text)  # "+Inf" -> inf
    except ValueError:
        return math.nan
