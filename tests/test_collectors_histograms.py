"""Histogram quantiles as Prometheus computes them, and histograms drawn as quantiles, never as buckets.

``quantile_of`` is held to Prometheus's own ``histogram_quantile`` (``promtool test rules``, Debian's
prometheus package) on seeded random histograms and on the edges (a quantile in the first bucket, in
the +Inf bucket, a non-monotonic scrape, bounds at and below zero). ``MetricsSeries.quantiles``
reads two pages written by prometheus_client with the buckets of a real 0.5.15 decode page
(``tests/data/real-engine-0.5.15/decode-metrics.txt``): the quantiles of what was observed between
the scrapes, which ``plot`` draws.
"""

from __future__ import annotations

import math
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.collectors.exposition import parse_exposition
from forensics.collectors.histograms import histogram_quantiles, quantile_of
from forensics.collectors.metrics import MetricsSeries, _Scrape

REAL_PAGE = Path(__file__).parent / "data" / "real-engine-0.5.15" / "decode-metrics.txt"
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


def _random_histograms(count: int, seed: int = 20261203) -> list[tuple[list[float], list[float]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        bounds = sorted(rng.sample([0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120], rng.randint(1, 9)))
        counts, total = [], 0
        for _bound in bounds:
            total += rng.choice([0, 0, 1, 3, 17, 250])
            counts.append(float(total))
        counts.append(float(total + rng.choice([0, 1, 40])))
        out.append(([*map(float, bounds), math.inf], counts))
    # the edges: all in the first bucket, all in +Inf, a dip (a bucket read before its update),
    # a bound at zero and below
    out.append(([0.1, 1.0, math.inf], [10.0, 10.0, 10.0]))
    out.append(([0.1, 1.0, math.inf], [0.0, 0.0, 12.0]))
    out.append(([0.1, 1.0, 5.0, math.inf], [4.0, 3.0, 9.0, 9.0]))
    out.append(([-1.0, 0.0, 2.0, math.inf], [2.0, 5.0, 9.0, 10.0]))
    return out


def _bound_text(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (./run installs prometheus)")
def test_quantiles_equal_prometheus_histogram_quantile(tmp_path):
    histograms = _random_histograms(40)
    series, checks = [], []
    for number, (bounds, counts) in enumerate(histograms):
        for bound, count in zip(bounds, counts):
            series.append(f"      - series: 'lat_bucket{{le=\"{_bound_text(bound)}\",h=\"{number}\"}}'\n"
                          f"        values: '{count:g}'\n")
        for q in QUANTILES:
            ours = quantile_of(q, bounds, counts)
            if math.isnan(ours):
                continue  # NaN is held below, not by promtool's float comparison
            checks.append(f"      - expr: histogram_quantile({q}, lat_bucket{{h=\"{number}\"}})\n"
                          f"        eval_time: 0m\n        exp_samples:\n"
                          f"          - labels: '{{h=\"{number}\"}}'\n            value: {ours!r}\n")
    spec = tmp_path / "quantiles.yml"
    spec.write_text("tests:\n  - interval: 1m\n    input_series:\n" + "".join(series)
                    + "    promql_expr_test:\n" + "".join(checks))
    done = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert len(checks) > 300


def test_no_observation_and_no_inf_bucket_give_no_value_and_q_out_of_range_is_infinite():
    assert math.isnan(quantile_of(0.5, [0.1, math.inf], [0.0, 0.0]))
    assert math.isnan(quantile_of(0.5, [0.1, 1.0], [3.0, 5.0]))  # no +Inf bucket
    assert math.isnan(quantile_of(0.5, [math.inf], [5.0]))  # one bucket: nothing to interpolate
    assert quantile_of(1.5, [0.1, math.inf], [1.0, 1.0]) == math.inf
    assert quantile_of(-0.5, [0.1, math.inf], [1.0, 1.0]) == -math.inf
    assert math.isnan(quantile_of(math.nan, [0.1, math.inf], [1.0, 1.0]))


def _real_buckets(family: str) -> list[float]:
    found = re.findall(rf'^{re.escape(family)}_bucket\{{[^}}]*le="([^"]+)"', REAL_PAGE.read_text(), re.M)
    return sorted({float(b) for b in found if b != "+Inf"})


def _two_pages(tmp_path):
    """Two /metrics pages from prometheus_client, 10 s apart, of a histogram with the real page's
    time-to-first-token buckets: 50 observations before the first, 100 more (slower ones) between."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    family = "sglang:time_to_first_token_seconds"
    bounds = _real_buckets(family)
    assert len(bounds) > 10, bounds
    registry = CollectorRegistry()
    histogram = Histogram("sglang:time_to_first_token_seconds", "ttft", ["model_name"], buckets=bounds,
                          registry=registry)
    child = histogram.labels(model_name="pd-slow-prefill")
    rng = random.Random(7)
    for _ in range(50):
        child.observe(rng.uniform(0.05, 0.4))
    first = generate_latest(registry)
    between = [rng.uniform(1.0, 8.0) for _ in range(100)]
    for value in between:
        child.observe(value)
    second = generate_latest(registry)
    scrapes = [_Scrape(ts, "decode", "pd-node-1", "http://10.0.3.17:30000/metrics", True, None, 200, 0.01,
                       parse_exposition(page))
               for ts, page in ((1_764_558_000_000_000_000, first), (1_764_558_010_000_000_000, second))]
    return family, bounds, between, MetricsSeries.from_scrapes(scrapes)


def test_a_series_gives_the_quantiles_of_what_happened_between_scrapes(tmp_path):
    family, bounds, between, series = _two_pages(tmp_path)
    table = series.quantiles(family)
    assert set(table["quantile"]) == {0.5, 0.9, 0.99} and len(table) == 3  # the first scrape has no rate
    assert set(table["labels"]) == {'model_name="pd-slow-prefill"'}
    median = float(table.loc[table["quantile"] == 0.5, "value"].iloc[0])
    # the 100 slow observations, not the 50 fast ones before: within the bucket the true median is in
    true_median = sorted(between)[49]
    upper = min(b for b in bounds if b >= true_median)
    lower = max([b for b in bounds if b < true_median], default=0.0)
    assert lower <= median <= upper, (median, true_median, lower, upper)
    same = histogram_quantiles(series.samples, family, (0.5,))
    assert float(same["value"].iloc[0]) == median


def test_plot_draws_a_histogram_as_its_percentiles_in_its_unit(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    family, _bounds, _between, series = _two_pages(tmp_path)
    assert series.is_histogram(family) and not series.is_histogram("sglang:num_running_reqs")
    ax = series.plot(family)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["p50 decode@pd-node-1 {model_name=\"pd-slow-prefill\"}",
                      "p90 decode@pd-node-1 {model_name=\"pd-slow-prefill\"}",
                      "p99 decode@pd-node-1 {model_name=\"pd-slow-prefill\"}"]
    assert ax.get_ylabel().endswith("[s]") and "quantiles" in ax.get_title()
    assert all(max(line.get_ydata()) < 1e3 for line in ax.get_lines())  # seconds, never cumulative counts
