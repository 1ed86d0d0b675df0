"""The storm's observer: which sessions the decode holds while their KV is pending, from what it exposes.

A kill aborts a pending transfer only if it reaches the decode while the request sits in its
prealloc or transfer queue. A timer cannot know when that is (a prefill of 20 long prompts on
a busy machine takes anything from a second to a minute), so the nemesis of phase ``kv``
strikes each session when this observer sees it held:

* **at the decode**: the decode's own HTTP middleware counts each request as it arrives,
  ``sglang:http_requests_total{endpoint="/v1/chat/completions"}`` on its ``/metrics``
  (sglang 0.5.7+ with ``--enable-metrics``; the twin exports it the same way). When that
  counter has risen by ``k`` since the cycle began, the ``k`` sessions sent first are there.
  This is a live counter, incremented before the handler runs, unlike the decode's queue
  gauges (``num_decode_prealloc_queue_reqs``, ``num_decode_transfer_queue_reqs``), which
  sglang 0.5.13 to 0.5.18 refreshes only every ``--decode-log-interval`` decode batches and
  so still read the last idle value when a storm begins;
* **KV still pending**: the client has had no first token. The decode streams a request's
  first token the moment its KV has arrived and it runs (real sglang sends even its response
  headers only with that first chunk), so "at the decode, no token" is prealloc or transfer.

sglang's decode writes no per-rid line when a request enters its queues (its per-rid lines
are the abort lines ``Decode handshake failed`` / ``Decode transfer failed``, which say
afterwards where each kill landed: :mod:`forensics.storm.checker`). When no decode answers
with the counter (metrics off, an unreachable page), the client's own evidence stands in:
response headers (a router that relays the decode's answer) or ``CLIENT_GRACE_S`` since the
request went out; each strike records which evidence chose it (``observed_by``). A real decode's
``/metrics`` can take seconds to answer mid-storm on a loaded machine: the count before the cycle
is tried ``BASELINE_TRIES`` times, and a later scrape that misses keeps the last count.

Other traffic to the same endpoint of the decode during the storm counts as arrivals too:
on a live deployment the observer may then call a session held slightly early.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from .client import SessionState

ARRIVALS_METRIC = "sglang:http_requests_total"
CLIENT_GRACE_S = 0.5  # no decode count: this long after the request went out, the router has forwarded it
SCRAPE_TIMEOUT_S = 10.0  # a real decode's /metrics takes 1.2 s idle on a loaded 2-core machine, more mid-storm
BASELINE_TRIES = 3  # the count before the cycle: without it the whole cycle falls back to the client
BY_DECODE = "decode-metrics"
BY_CLIENT = "client"


def arrivals_from_page(page: Any, endpoint: str) -> int | None:
    """The decode's count of ``POST endpoint`` requests on one parsed page (None: not exported)."""
    label = f'endpoint="{endpoint}"'
    # The family declared but no series for the endpoint yet: a decode that has served none (0).
    declared = any(family in page.types for family in (ARRIVALS_METRIC, ARRIVALS_METRIC.removesuffix("_total")))
    total = 0 if declared else None
    for i, name in enumerate(page.metric):
        if name == ARRIVALS_METRIC and label in page.labels[i] and 'method="POST"' in page.labels[i]:
            value = page.exact(i)
            if isinstance(value, int):
                total = (total or 0) + value
    return total


class DecodeArrivals:
    """Scrapes every decode's arrival counter; ``count()`` is the sum, or None if one cannot tell."""

    def __init__(self, decodes: Iterable[tuple[str, str]], endpoint: str) -> None:
        self.decodes = list(decodes)  # (name, url)
        self.endpoint = endpoint
        self.last_error: str | None = None

    def count(self) -> int | None:
        from forensics.collectors.metrics import scrape_once

        if not self.decodes:
            self.last_error = "the inventory has no decode"
            return None
        total = 0
        for name, url in self.decodes:
            scrape = scrape_once("decode", name, url, timeout_s=SCRAPE_TIMEOUT_S)
            if not scrape.ok:
                self.last_error = f"{name}: {scrape.error}"
                return None
            got = arrivals_from_page(scrape.page, self.endpoint)
            if got is None:
                self.last_error = f"{name}: no {ARRIVALS_METRIC} for {self.endpoint} on its /metrics"
                return None
            total += got
        self.last_error = None
        return total


class KvObserver:
    """Per cycle: the decode's arrival count since the cycle began, and the sessions it holds pending KV."""

    def __init__(self, arrivals: DecodeArrivals) -> None:
        self.arrivals = arrivals
        self.baseline: int | None = None
        self.arrived: int | None = None  # since the baseline; None: the decode's count is not available

    def start(self) -> None:
        """The count before the cycle's first request (called before any session is sent)."""
        for _ in range(BASELINE_TRIES):
            self.baseline = self.arrivals.count()
            if self.baseline is not None:
                self.arrived = 0
                return

    def refresh(self) -> None:
        if self.baseline is None:
            self.arrived = None
            return
        now = self.arrivals.count()
        if now is None:
            # One scrape missed (a busy decode answering late): keep the last count. The counter only
            # grows, so the last value under-counts and never makes a session look held too early.
            return
        # A count lower than the baseline is a restarted decode: count from 0, as Prometheus does.
        self.arrived = now - self.baseline if now >= self.baseline else now

    @property
    def source(self) -> str:
        return BY_DECODE if self.arrived is not None else BY_CLIENT

    def held(self, states: list[SessionState], everyone: list[SessionState]) -> list[SessionState]:
        """Those of ``states`` the decode holds with their KV pending, by the latest evidence.

        ``everyone``: every session of the cycle, whose send order decides which ``arrived``
        requests the decode has seen."""
        pending = [s for s in states if s.open and not s.killed and s.sent is not None and s.first_token is None]
        if not pending:
            return []
        if self.arrived is None:
            now = time.time()
            return [s for s in pending if s.headers is not None or now - s.sent >= CLIENT_GRACE_S]
        order = sorted((s for s in everyone if s.sent is not None), key=lambda s: s.sent)
        at_decode = {s.rid for s in order[:max(0, self.arrived)]}
        return [s for s in pending if s.rid in at_decode]
