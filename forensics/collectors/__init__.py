"""Collectors: read a deployment's live state into Evidence frames (they never diagnose).

``metrics``: sglang's ``/metrics`` pages scraped at an interval into a long frame
(:class:`~forensics.collectors.metrics.MetricsScraper`, schema in docs/metrics.md);
``prometheus_api``: the same series from a Prometheus server's HTTP API.
"""

from __future__ import annotations

from .metrics import (
    SAMPLES_SCHEMA,
    SCRAPES_SCHEMA,
    MetricsScraper,
    MetricsSeries,
    parse_exposition,
)
from .prometheus_api import PrometheusAPI, PrometheusQueryError

__all__ = ["SAMPLES_SCHEMA", "SCRAPES_SCHEMA", "MetricsScraper", "MetricsSeries", "PrometheusAPI",
           "PrometheusQueryError", "parse_exposition"]
