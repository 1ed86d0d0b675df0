"""Queue metrics: sglang's ``/metrics`` pages scraped into a long Evidence frame.

Three pieces, each usable alone:

* :func:`parse_exposition` reads the Prometheus text exposition format (what sglang's
  ``/metrics`` serves through prometheus_client) into columns: sample name, canonical
  labels, value (float64), the value's text exactly as printed, family type.
* :class:`MetricsScraper` scrapes every target in its own background thread at an
  interval (idle = waiting on an ``Event``), one record per scrape, failed ones included.
* :class:`MetricsSeries` is the result: ``to_frame()`` (schema :data:`SAMPLES_SCHEMA`),
  ``scrapes_frame()`` (:data:`SCRAPES_SCHEMA`), rates of counters, canonical names for the
  gauges sglang renamed (table ``renames.toml``), and it renders itself in a notebook.

The schemas are documented in docs/metrics.md.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

# URLs are recorded through the one table of what is secret (forensics.redact)
from forensics.frames import conform, empty_frame
from forensics.redact import redact_url

from . import bounded_http
from .bounded_http import METRICS_LIMITS, LimitExceeded, ReadLimits
from .exposition import (
    ExpositionPage,
    ExpositionParseError,
    ParseCache,
    labels_dict,
    parse_exposition,
)
from .histograms import QUANTILES, histogram_quantiles
from .renames import canonical_name, renames

__all__ = [
    "SAMPLES_SCHEMA",
    "SCRAPES_SCHEMA",
    "SCRAPE_OK_METRIC",
    "ExpositionPage",
    "ExpositionParseError",
    "MetricsScraper",
    "MetricsSeries",
    "add_rates",
    "canonical_name",
    "labels_dict",
    "parse_exposition",
    "renames",
]

# --------------------------------------------------------------------------------------------
# Schemas (documented in docs/metrics.md; validated where frames are built)

SAMPLES_SCHEMA: dict[str, str] = {
    "ts": "datetime64[ns, UTC]",  # when the scrape started
    "role": "string",
    "host": "string",
    "url": "string",  # the /metrics URL scraped
    "metric": "string",  # the sample name as scraped (``_total``, ``_bucket`` ... included)
    "metric_canonical": "string",  # the same series under its current name (renames.toml)
    "type": "string",  # the family's ``# TYPE`` (counter, gauge, histogram, summary, untyped)
    "labels": "string",  # canonical: sorted by name, ``k="v",k2="v2"``, values escaped as printed
    "value": "float64",
    "value_int": "Int64",  # exact integer when the text is an integer that fits int64, else <NA>
    "value_text": "string",  # the value exactly as printed (exact beyond 2**53 and 2**63)
    "rate": "float64",  # per second since the previous scrape of the series (cumulative samples only)
    "scrape_ok": "bool",
    "error": "string",  # why the scrape failed; <NA> on rows of a good scrape
}

SCRAPES_SCHEMA: dict[str, str] = {
    "ts": "datetime64[ns, UTC]",
    "role": "string",
    "host": "string",
    "url": "string",
    "ok": "bool",
    "error": "string",
    "http_status": "Int64",
    "duration_s": "float64",
    "samples": "Int64",
    "problems": "string",  # lines of a good scrape's page that could not be read; <NA> when none
}

# Every scrape adds one row of this synthetic gauge to the samples frame: 1.0 ok, 0.0 failed
# (with ``error``), so a failed scrape is a row, never a silent gap.
SCRAPE_OK_METRIC = "forensics:scrape_ok"


# --------------------------------------------------------------------------------------------
# Rates


def _ns(ts: pd.Series) -> np.ndarray:
    """Nanoseconds since the epoch of a tz-aware (or naive UTC) datetime column."""
    return pd.DatetimeIndex(ts).as_unit("ns").asi8


def add_rates(frame: pd.DataFrame, cumulative: pd.Series | np.ndarray | None = None) -> pd.Series:
    """Per-second rates of cumulative samples between consecutive scrapes of the same series.

    A series is (role, host, url, metric, labels). ``cumulative`` marks the rows that are
    counters (``_total``) or histogram/summary ``_bucket``/``_count``/``_sum``; by default
    the counter rows. The first scrape of a series has no rate (NaN); a value lower than the
    previous one is a counter reset, counted as Prometheus does (the increase is the new
    value, never negative). Returns a float64 Series aligned with ``frame``.
    """
    index = frame.index
    frame = frame.reset_index(drop=True)
    rate = np.full(len(frame), np.nan)
    if cumulative is None:
        cumulative = (frame["type"] == "counter") & frame["metric"].str.endswith("_total")
    sel = np.flatnonzero(np.asarray(cumulative, dtype=bool) & frame["scrape_ok"].to_numpy(dtype=bool))
    if len(sel) == 0:
        return pd.Series(rate, index=index, dtype="float64")
    sub = frame.iloc[sel]
    keys = ["role", "host", "url", "metric", "labels"]
    order = sub.sort_values([*keys, "ts"], kind="stable").index
    sub = sub.loc[order]
    same = sub.groupby(keys, sort=False, observed=True).cumcount().to_numpy() > 0  # sorted: prev row = prev scrape
    value = sub["value"].to_numpy(dtype=np.float64)
    prev = np.roll(value, 1)
    ts_ns = _ns(sub["ts"])
    dt = (ts_ns - np.roll(ts_ns, 1)) / 1e9
    with np.errstate(invalid="ignore", divide="ignore"):
        increase = np.where(value >= prev, value - prev, value)  # a reset: the counter restarted at 0
        r = np.where(same & (dt > 0), increase / np.where(dt > 0, dt, 1.0), np.nan)
    rate[order.to_numpy()] = r
    return pd.Series(rate, index=index, dtype="float64")


# --------------------------------------------------------------------------------------------
# The scraper


@dataclass
class _Scrape:
    ts_ns: int
    role: str
    host: str
    url: str
    ok: bool
    error: str | None
    http_status: int | None
    duration_s: float
    page: ExpositionPage | None


def metrics_url(url: str) -> str:
    """An engine's base URL (``http://10.0.3.17:30000``) or its /metrics URL, as the /metrics URL."""
    parts = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path = f"{path}/metrics"
    return urllib.parse.urlunsplit((parts.scheme or "http", parts.netloc, path, parts.query, ""))


def describe_fetch_error(exc: BaseException) -> str:
    if isinstance(exc, LimitExceeded | _HTTPStatus):
        return str(exc)
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, BaseException):
            return f"{type(reason).__name__}: {reason}"
        return f"URLError: {reason}"
    return f"{type(exc).__name__}: {exc}"


def scrape_once(role: str, host: str, url: str, *, timeout_s: float = 5.0,
                cache: ParseCache | None = None, max_bytes: int = METRICS_LIMITS.max_bytes) -> _Scrape:
    """One scrape of one target: a record that says ok or why not (never raises for the target).

    ``timeout_s`` bounds the whole answer (wall clock), ``max_bytes`` its body: a page that
    trickles or is larger fails the scrape with a reason naming the URL and the limit.
    """
    target = metrics_url(url)
    ts_ns = time.time_ns()
    started = time.perf_counter()
    status: int | None = None
    try:
        answer = bounded_http.get(target, limits=ReadLimits(timeout_s, max_bytes),
                                  headers={"Accept": "text/plain;version=0.0.4"})
        status = answer.status
        if status != 200:
            raise _HTTPStatus(f"HTTP {status} {answer.reason}".rstrip())
        page = parse_exposition(answer.body, cache=cache)
        if page.problems and not len(page):
            # Nothing on the page could be read: the scrape failed, for the first line's reason.
            raise page.problems[0]
    except Exception as exc:  # every failure is evidence: recorded, not raised
        return _Scrape(ts_ns, role, host, redact_url(target), False, describe_fetch_error(exc), status,
                       time.perf_counter() - started, None)
    return _Scrape(ts_ns, role, host, redact_url(target), True, None, status, time.perf_counter() - started, page)


class _HTTPStatus(Exception):
    """Internal: a /metrics answer other than 200 (its message is the scrape's error)."""


class MetricsScraper:
    """Scrape ``/metrics`` of every target every ``interval_s`` seconds in background threads.

    ``targets`` is a list of ``(role, host, url)``; ``url`` is the engine's base URL or its
    /metrics URL. Each target has its own thread (a slow or dead engine never delays another),
    which waits on one ``Event`` between scrapes. Use as a context manager, or ``start()`` and
    ``stop()`` (which joins). ``result()`` gives a :class:`MetricsSeries` at any time.
    ``timeout_s`` is each scrape's total deadline (the whole answer, wall clock) and
    ``max_bytes`` its byte cap; a scrape that breaks either is a failed scrape saying so.
    """

    def __init__(self, targets: Iterable[Sequence[str]], interval_s: float = 1.0, *,
                 timeout_s: float | None = None, max_scrapes: int | None = None,
                 max_bytes: int = METRICS_LIMITS.max_bytes) -> None:
        self.targets = [(str(t[0]), str(t[1]), str(t[2])) for t in targets]
        if not self.targets:
            raise ValueError("no targets to scrape")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, not {interval_s!r}")
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s) if timeout_s is not None else max(1.0, min(10.0, 5 * self.interval_s))
        self.max_scrapes = max_scrapes
        ReadLimits(self.timeout_s, max_bytes)  # refuses a bad cap here, not in every scrape
        self.max_bytes = max_bytes
        self.stuck: list[str] = []  # the hosts of targets still scraping after stop() waited for them
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._scrapes: list[_Scrape] = []
        self._counts = [0] * len(self.targets)
        self._ok_counts = [0] * len(self.targets)
        self._failed_counts = [0] * len(self.targets)
        self._threads: list[threading.Thread] = []

    # lifecycle
    def start(self) -> MetricsScraper:
        if self._threads:
            raise RuntimeError("scraper already started")
        self._stop.clear()
        for index, (role, host, url) in enumerate(self.targets):
            thread = threading.Thread(target=self._run, args=(index, role, host, url),
                                      name=f"metrics-scraper-{role}-{host}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self) -> MetricsSeries:
        """Stop scraping and join the threads; the scrapes so far, whatever a target does.

        A scrape ends by its own deadline, so the join is bounded; a thread still alive after
        it (name resolution hanging, which no deadline covers) has its host in ``stuck`` and is left
        to end on its own (a daemon thread) rather than losing what the others scraped.
        """
        self._stop.set()
        ends = time.monotonic() + self.timeout_s + 10.0
        for thread in self._threads:
            thread.join(max(0.0, ends - time.monotonic()))
        self.stuck = [self.targets[i][1] for i, t in enumerate(self._threads) if t.is_alive()]
        self._threads = []
        return self.result()

    def __enter__(self) -> MetricsScraper:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _run(self, index: int, role: str, host: str, url: str) -> None:
        cache = ParseCache()
        next_at = time.monotonic()
        done = 0
        while not self._stop.is_set():
            record = scrape_once(role, host, url, timeout_s=self.timeout_s, cache=cache, max_bytes=self.max_bytes)
            done += 1
            with self._changed:
                self._scrapes.append(record)
                self._counts[index] += 1
                (self._ok_counts if record.ok else self._failed_counts)[index] += 1
                self._changed.notify_all()
            if self.max_scrapes is not None and done >= self.max_scrapes:
                return
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:  # a scrape overran: skip the missed slots rather than burst
                next_at = now
            if self._stop.wait(next_at - now):
                return

    def wait_for(self, scrapes: int, timeout: float, *, ok: bool | None = None) -> bool:
        """Block until every target has ``scrapes`` scrapes (only good / failed ones with ``ok``)."""
        counts = self._counts if ok is None else (self._ok_counts if ok else self._failed_counts)
        with self._changed:
            return self._changed.wait_for(lambda: min(counts) >= scrapes, timeout)

    def result(self) -> MetricsSeries:
        with self._changed:
            scrapes = list(self._scrapes)
        return MetricsSeries.from_scrapes(scrapes)


# --------------------------------------------------------------------------------------------
# The result


def _samples_frame(scrapes: list[_Scrape]) -> pd.DataFrame:
    """All scrapes into one long frame, column by column (no per-scrape frames)."""
    if not scrapes:
        return empty_frame(SAMPLES_SCHEMA)
    combined = ExpositionPage()
    metric, labels, texts, kinds = combined.metric, combined.labels, combined.value_text, combined.type
    values: list[np.ndarray] = []
    cumulative: list[np.ndarray] = []
    lengths = np.empty(len(scrapes), dtype=np.int64)
    for i, s in enumerate(scrapes):
        page = s.page if s.ok and s.page is not None else ExpositionPage()
        # one scrape_ok row first, then the page's samples
        metric.append(SCRAPE_OK_METRIC)
        labels.append("")
        texts.append("1" if s.ok else "0")
        kinds.append("gauge")
        metric.extend(page.metric)
        labels.extend(page.labels)
        texts.extend(page.value_text)
        kinds.extend(page.type)
        values.append(np.array([1.0 if s.ok else 0.0]))
        values.append(page.value)
        cumulative.append(np.zeros(1, dtype=bool))
        cumulative.append(page.cumulative)
        lengths[i] = len(page) + 1
    combined.value = np.concatenate(values)
    combined.cumulative = np.concatenate(cumulative)

    def per_scrape(items: list, dtype: str) -> pd.Series:
        return pd.Series(np.repeat(np.array(items, dtype=object), lengths), dtype=dtype)

    metric_col = pd.Series(metric, dtype="string")
    names = pd.unique(metric_col)
    ts = np.repeat(np.array([s.ts_ns for s in scrapes], dtype=np.int64), lengths)
    frame = pd.DataFrame({
        "ts": pd.Series(pd.DatetimeIndex(ts.view("datetime64[ns]")).tz_localize("UTC")),
        "role": per_scrape([s.role for s in scrapes], "string"),
        "host": per_scrape([s.host for s in scrapes], "string"),
        "url": per_scrape([s.url for s in scrapes], "string"),
        "metric": metric_col,
        "metric_canonical": metric_col.map({n: canonical_name(n) for n in names}).astype("string"),
        "type": pd.Series(kinds, dtype="string"),
        "labels": pd.Series(labels, dtype="string"),
        "value": combined.value,
        "value_int": combined.value_int(),
        "value_text": pd.Series(texts, dtype="string"),
        "scrape_ok": np.repeat(np.array([s.ok for s in scrapes], dtype=bool), lengths),
        "error": per_scrape([s.error for s in scrapes], "string"),
    })
    frame["rate"] = add_rates(frame, combined.cumulative)
    return conform(frame, SAMPLES_SCHEMA, name="samples frame")


def _scrapes_frame(scrapes: list[_Scrape]) -> pd.DataFrame:
    if not scrapes:
        return empty_frame(SCRAPES_SCHEMA)
    n = len(scrapes)
    status = np.array([s.http_status or 0 for s in scrapes], dtype=np.int64)
    frame = pd.DataFrame({
        "ts": pd.Series(np.array([s.ts_ns for s in scrapes], dtype="datetime64[ns]")).dt.tz_localize("UTC"),
        "role": pd.Series([s.role for s in scrapes], dtype="string"),
        "host": pd.Series([s.host for s in scrapes], dtype="string"),
        "url": pd.Series([s.url for s in scrapes], dtype="string"),
        "ok": np.array([s.ok for s in scrapes], dtype=bool),
        "error": pd.Series([s.error for s in scrapes], dtype="string"),
        "http_status": pd.Series(pd.arrays.IntegerArray(
            status, np.array([s.http_status is None for s in scrapes], dtype=bool))),
        "duration_s": np.array([s.duration_s for s in scrapes], dtype=np.float64),
        "problems": pd.Series([s.page.problems_text() if s.page is not None else None for s in scrapes],
                              dtype="string"),
        "samples": pd.Series(pd.arrays.IntegerArray(
            np.array([len(s.page) if s.page is not None else 0 for s in scrapes], dtype=np.int64),
            np.zeros(n, dtype=bool))),
    })
    return conform(frame.sort_values("ts", kind="stable").reset_index(drop=True), SCRAPES_SCHEMA,
                   name="scrapes frame")


# Units read off sglang's metric-name suffixes (data): (suffix, unit).
UNIT_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_seconds", "s"),
    ("_ms", "ms"),
    ("_gb_s", "GB/s"),
    ("_mb", "MB"),
    ("_bytes", "bytes"),
    ("_reqs", "requests"),
    ("_requests", "requests"),
    ("_tokens", "tokens"),
    ("_throughput", "tokens/s"),
    ("_usage", "fraction"),
    ("_rate", "fraction"),
)


def unit_of(metric: str, *, rate: bool = False) -> str:
    """The unit of a sample name (per second when ``rate``), read from its suffix."""
    name = metric
    for suffix in ("_total", "_count", "_sum", "_bucket"):
        if name.endswith(suffix):
            if suffix in ("_count", "_bucket"):
                return "observations/s" if rate else "observations"
            name = name[: -len(suffix)]
            break
    unit = next((u for s, u in UNIT_SUFFIXES if name.endswith(s)), "count")
    if metric == SCRAPE_OK_METRIC:
        unit = "1 = scrape ok"
    return f"{unit}/s" if rate else unit


class MetricsSeries:
    """Scraped samples (:data:`SAMPLES_SCHEMA`) and scrape records (:data:`SCRAPES_SCHEMA`)."""

    def __init__(self, samples: pd.DataFrame, scrapes: pd.DataFrame) -> None:
        self.samples = conform(samples, SAMPLES_SCHEMA, name="samples frame")
        self.scrapes = conform(scrapes, SCRAPES_SCHEMA, name="scrapes frame")

    @classmethod
    def from_scrapes(cls, scrapes: list[_Scrape]) -> MetricsSeries:
        scrapes = sorted(scrapes, key=lambda s: s.ts_ns)
        return cls(_samples_frame(scrapes), _scrapes_frame(scrapes))

    def to_frame(self) -> pd.DataFrame:
        """The long samples frame (one row per sample per scrape, plus one scrape_ok row each)."""
        return self.samples

    def scrapes_frame(self) -> pd.DataFrame:
        return self.scrapes

    def select(self, metric: str) -> pd.DataFrame:
        """Rows of one metric, matched by canonical or scraped name (so both old and new names)."""
        frame = self.samples
        wanted = canonical_name(metric)
        return frame[(frame["metric_canonical"] == wanted) | (frame["metric"] == metric)]

    def summary(self) -> pd.DataFrame:
        """Per target: scrapes, failures, last error, good scrapes with unreadable lines and the last
        such problem, first and last time, series seen."""
        rows = []
        for (role, host, url), group in self.scrapes.groupby(["role", "host", "url"], sort=True, observed=True):
            failed = group[~group["ok"]]
            series = self.samples[(self.samples["role"] == role) & (self.samples["host"] == host)
                                  & (self.samples["url"] == url) & self.samples["scrape_ok"]]
            rows.append({
                "role": role, "host": host, "url": url,
                "scrapes": len(group), "failed": len(failed),
                "last_error": failed["error"].iloc[-1] if len(failed) else "",
                "with_problems": int(group["problems"].notna().sum()),
                "last_problem": group["problems"].dropna().iloc[-1] if group["problems"].notna().any() else "",
                "first": group["ts"].min(), "last": group["ts"].max(),
                "series": int(series[["metric", "labels"]].drop_duplicates().shape[0]) - 1 if len(series) else 0,
            })
        return pd.DataFrame(rows, columns=["role", "host", "url", "scrapes", "failed", "last_error",
                                           "with_problems", "last_problem", "first", "last", "series"])

    def _title(self) -> str:
        failed = int((~self.scrapes["ok"]).sum())
        return (f"MetricsSeries: {len(self.scrapes)} scrapes ({failed} failed), "
                f"{len(self.samples)} sample rows")

    def __repr__(self) -> str:
        return f"<{self._title()}>"

    def _repr_html_(self) -> str:
        import html

        table = self.summary().to_html(index=False, na_rep="", escape=True)
        return f"<div><strong>{html.escape(self._title())}</strong>{table}</div>"

    def __rich__(self):
        from rich.table import Table

        table = Table(title=self._title())
        summary = self.summary()
        for column in summary.columns:
            table.add_column(column)
        for row in summary.itertuples(index=False):
            table.add_row(*[("" if pd.isna(v) else str(v)) for v in row],
                          style="red" if row.failed else None)
        return table

    def quantiles(self, family: str, quantiles=QUANTILES) -> pd.DataFrame:
        """Per scrape and series of histogram ``family``, its quantiles over the time since the previous
        scrape (:func:`forensics.collectors.histograms.histogram_quantiles`: Prometheus's
        ``histogram_quantile(q, rate(family_bucket))``)."""
        return histogram_quantiles(self.samples, canonical_name(family), quantiles)

    def is_histogram(self, metric: str) -> bool:
        """Whether ``metric`` names a histogram family of the pages (its ``_bucket`` rows say so)."""
        rows = self.select(f"{canonical_name(metric)}_bucket")
        return bool(len(rows)) and bool((rows["type"] == "histogram").any())

    def plot(self, metric: str, *, rate: bool | None = None, ax=None):
        """Plot one metric over time, one line per (role, host, labels): counters as rates, a histogram
        family as its 50th, 90th and 99th percentiles between scrapes (never its cumulative buckets).

        ``rate`` defaults to True for counters (cumulative samples with rates). Returns the axes.
        """
        if ax is None:
            import matplotlib.pyplot as plt

            _, ax = plt.subplots(figsize=(9, 3.5))
        if self.is_histogram(metric):
            return self._plot_quantiles(metric, ax)
        rows = self.select(metric)
        rows = rows[rows["scrape_ok"]]
        if rate is None:
            rate = bool(rows["rate"].notna().any())
        column = "rate" if rate else "value"
        for (role, host, labels), group in rows.groupby(["role", "host", "labels"], sort=True, observed=True):
            group = group.sort_values("ts")
            name = f"{role}@{host}" + (f" {{{labels}}}" if labels else "")
            ax.plot(group["ts"].dt.tz_convert("UTC").dt.tz_localize(None), group[column].to_numpy(),
                    marker=".", label=name)
        shown = canonical_name(metric)
        ax.set_title(shown + (" (rate)" if rate else ""))
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel(f"{shown} [{unit_of(shown, rate=rate)}]")
        if len(rows):
            ax.legend(fontsize="small", loc="best")
        return ax

    def _plot_quantiles(self, metric: str, ax):
        shown = canonical_name(metric)
        table = self.quantiles(shown).dropna(subset=["value"])
        for (role, host, labels, q), group in table.groupby(["role", "host", "labels", "quantile"], sort=True):
            group = group.sort_values("ts")
            name = f"p{q * 100:g} {role}@{host}" + (f" {{{labels}}}" if labels else "")
            ax.plot(pd.to_datetime(group["ts"], utc=True).dt.tz_localize(None), group["value"].to_numpy(),
                    marker=".", label=name)
        ax.set_title(f"{shown} (quantiles between scrapes)")
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel(f"{shown} [{unit_of(shown, rate=False)}]")
        if len(table):
            ax.legend(fontsize="small", loc="best")
        return ax
