"""The same queue-metric series from a Prometheus server's HTTP API (instant and range queries).

When an inventory names a Prometheus server, the series it scraped give the history before
anyone started a :class:`~forensics.collectors.metrics.MetricsScraper`. Results come as a
:class:`~forensics.collectors.metrics.MetricsSeries` with the same samples schema, so the
two sources compare row by row:

* ``metric`` is the series' ``__name__``; ``metric_canonical`` from the same renames table;
  asking for a renamed metric queries both of its names (``{__name__=~"old|new"}``);
* ``role`` and ``host`` come from the target labels named ``role`` and ``host`` (configurable;
  ``host`` falls back to ``instance``), ``url`` is ``http://<instance>/metrics``; ``instance``,
  ``job`` and those two labels are taken out of ``labels``, which is canonical as the scraper's;
* ``value_text`` is the value exactly as the API sent it (a string there too), ``ts`` is the
  sample's own time (Prometheus keeps milliseconds), ``type`` from ``/api/v1/metadata``;
* ``rate`` as the scraper's, between consecutive points of the answer.

A failed query (refused, HTTP error, ``"status": "error"``, an answer over its total deadline
or byte cap) raises :class:`PrometheusQueryError`, an environment problem (exit 4) naming the
server and the reason.
"""

from __future__ import annotations

import http.client
import re
import urllib.parse
from datetime import datetime

import numpy as np
import pandas as pd

from forensics.frames import empty_frame

from ..exitcodes import EnvironmentProblem
from . import bounded_http
from .bounded_http import PROMETHEUS_LIMITS, LimitExceeded, ReadLimits
from .exposition import family_of
from .metrics import (
    SCRAPES_SCHEMA,
    ExpositionPage,
    MetricsSeries,
    add_rates,
    canonical_name,
    describe_fetch_error,
    redact_url,
    renames,
)

__all__ = ["PrometheusAPI", "PrometheusQueryError", "metric_selector"]


class PrometheusQueryError(EnvironmentProblem):
    """The Prometheus server did not answer a query (the reason says why)."""


def metric_selector(metric: str) -> str:
    """A PromQL selector for ``metric`` under every name it has had (the renames table)."""
    wanted = canonical_name(metric)
    names = sorted({wanted, metric} | {old for old, new in renames().items() if new == wanted})
    if len(names) == 1:
        return names[0] if re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", names[0]) else f'{{__name__="{names[0]}"}}'
    return '{__name__=~"' + "|".join(re.escape(n) for n in names) + '"}'


def _as_seconds(t: datetime | float | str) -> str:
    if isinstance(t, datetime):
        if t.tzinfo is None:
            raise ValueError("timestamps must be tz-aware (UTC inside)")
        return f"{t.timestamp():.3f}"
    if isinstance(t, pd.Timestamp):
        return f"{t.timestamp():.3f}"
    return str(t)


class PrometheusAPI:
    """Instant and range queries against a Prometheus server (``http://host:9090``)."""

    def __init__(self, base_url: str, *, timeout_s: float = PROMETHEUS_LIMITS.deadline_s, role_label: str = "role",
                 host_label: str = "host", max_bytes: int = PROMETHEUS_LIMITS.max_bytes) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s  # each answer's total deadline (wall clock), with max_bytes its byte cap
        self.limits = ReadLimits(float(timeout_s), max_bytes)
        self.role_label = role_label
        self.host_label = host_label
        self._types: dict[str, str] | None = None

    # transport
    def _get(self, path: str, params: dict[str, str]) -> dict:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        where = f"{redact_url(self.base_url)}{path}"
        try:
            answer = bounded_http.get(url, limits=self.limits)
        except LimitExceeded as exc:
            raise PrometheusQueryError(str(exc).replace(exc.url, where, 1)) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise PrometheusQueryError(f"{where}: {describe_fetch_error(exc)}") from None
        if answer.status != 200:
            try:
                detail = answer.json().get("error", "")
            except (ValueError, AttributeError):
                detail = ""
            raise PrometheusQueryError(f"{where}: HTTP {answer.status} {answer.reason} {detail}".strip())
        try:
            body = answer.json()
        except ValueError as exc:
            raise PrometheusQueryError(f"{where}: not JSON: {str(exc)[:200]}") from None
        if not isinstance(body, dict):
            raise PrometheusQueryError(f"{where}: expected a JSON object, got {type(body).__name__}")
        if body.get("status") != "success":
            raise PrometheusQueryError(f"{redact_url(self.base_url)}{path}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def ready(self) -> bool:
        try:
            return bounded_http.get(f"{self.base_url}/-/ready", limits=self.limits).status == 200
        except (OSError, ValueError, http.client.HTTPException, LimitExceeded):
            return False

    def types(self, refresh: bool = False) -> dict[str, str]:
        """Family name -> type, from ``/api/v1/metadata``."""
        if self._types is None or refresh:
            data = self._get("/api/v1/metadata", {})
            self._types = {name: entries[0].get("type", "untyped") for name, entries in data.items() if entries}
        return self._types

    # queries
    def instant(self, query: str, at: datetime | float | None = None) -> MetricsSeries:
        """``/api/v1/query``: one point per series (a vector result)."""
        params = {"query": query}
        if at is not None:
            params["time"] = _as_seconds(at)
        data = self._get("/api/v1/query", params)
        if data.get("resultType") != "vector":
            raise PrometheusQueryError(f"{query!r} gives a {data.get('resultType')}, not a vector of series")
        return self._series([(s["metric"], [s["value"]]) for s in data["result"]])

    def range(self, query: str, start: datetime | float, end: datetime | float, step_s: float) -> MetricsSeries:
        """``/api/v1/query_range``: the series' points from ``start`` to ``end`` every ``step_s``."""
        data = self._get("/api/v1/query_range", {"query": query, "start": _as_seconds(start),
                                                 "end": _as_seconds(end), "step": f"{step_s:g}"})
        return self._series([(s["metric"], s["values"]) for s in data["result"]])

    def metric(self, metric: str, start: datetime | float, end: datetime | float, step_s: float) -> MetricsSeries:
        """One metric under all its names (renames table), over a time range."""
        return self.range(metric_selector(metric), start, end, step_s)

    # frames
    def _series(self, results: list[tuple[dict[str, str], list]]) -> MetricsSeries:
        types = self.types() if results else {}
        page = ExpositionPage()
        ts: list[int] = []
        roles: list[str] = []
        hosts: list[str] = []
        urls: list[str] = []
        values: list[float] = []
        cumulative: list[bool] = []
        for labels, points in results:
            labels = dict(labels)
            name = labels.pop("__name__", "")
            instance = labels.pop("instance", "")
            labels.pop("job", None)
            role = labels.pop(self.role_label, "")
            host = labels.pop(self.host_label, instance)
            canon = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            kind, is_cumulative = family_of(name, types)
            for when, text in points:
                ts.append(int(round(float(when) * 1000)) * 1_000_000)
                page.metric.append(name)
                page.labels.append(canon)
                page.value_text.append(text)
                page.type.append(kind)
                values.append(float(text))
                cumulative.append(is_cumulative)
                roles.append(role)
                hosts.append(host)
                urls.append(f"http://{instance}/metrics" if instance else "")
        page.value = np.array(values, dtype=np.float64)
        metric = pd.Series(page.metric, dtype="string")
        frame = pd.DataFrame({
            "ts": pd.Series(pd.DatetimeIndex(np.array(ts, dtype=np.int64).view("datetime64[ns]")).tz_localize("UTC")),
            "role": pd.Series(roles, dtype="string"),
            "host": pd.Series(hosts, dtype="string"),
            "url": pd.Series(urls, dtype="string"),
            "metric": metric,
            "metric_canonical": metric.map({n: canonical_name(n) for n in pd.unique(metric)}).astype("string"),
            "type": pd.Series(page.type, dtype="string"),
            "labels": pd.Series(page.labels, dtype="string"),
            "value": page.value,
            "value_int": page.value_int(),
            "value_text": pd.Series(page.value_text, dtype="string"),
            "scrape_ok": np.ones(len(ts), dtype=bool),
            "error": pd.Series([None] * len(ts), dtype="string"),
        })
        order = frame.sort_values("ts", kind="stable").index.to_numpy()
        frame = frame.iloc[order].reset_index(drop=True)
        frame["rate"] = add_rates(frame, np.array(cumulative, dtype=bool)[order])
        return MetricsSeries(frame, empty_frame(SCRAPES_SCHEMA))


def _escape(value: str) -> str:
    """A label value written as the exposition format escapes it (the canonical label form)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
