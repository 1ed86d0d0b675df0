"""After a cycle's kills, before the check: wait (bounded) until every server answers ``/health`` again.

sglang does not cancel a killed session's prefill at once: on real sglang with a model whose
prefill of 3,000 tokens takes seconds (minutes on a loaded 2-core machine), the prefill scheduler
is still computing the storm's chunks when the checker would sample, and sglang's own health
check then answers 503 ("Server couldn't get a response from detokenizer for last 20 seconds").
A check at that moment reads a busy engine as DEGRADED, which says nothing about the fix.

So the storm waits, by observation and not by a timer, until each prefill and decode answers
``GET /health`` with 200 (its own verdict that it can serve: sglang's ``/health`` runs a
generation), at most ``cap_s``. This cannot hide the wedge: a wedged 0.5.15 prefill's
``/health`` stays 200 (that is the incident), so the check comes at once and finds it. After the
cap, the check runs anyway and reports what it sees. On the twin ``/health`` answers at once.
How long the 200s took sets the check's probe deadlines (:meth:`Drain.probe_deadlines`).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

DEFAULT_CAP_S = 300.0  # sglang's default SGLANG_DISAGGREGATION_WAITING_TIMEOUT: every pending request resolved
HEALTH_TIMEOUT_S = 30.0  # one /health; sglang's own health check gives up after 20 s
POLL_S = 1.0


HEALTH_MARGIN = 3.0  # the check's probe deadlines: this many times the slowest 200 seen here
MAX_HEALTH_DEADLINE_S = 30.0


@dataclass(frozen=True)
class Drain:
    seconds: float
    healthy: bool  # every server answered 200 within the cap
    waiting_for: tuple[str, ...]  # the servers still not answering 200 at the cap
    health_s: float = 0.0  # the slowest of the servers' 200 answers: how fast this deployment answers now

    def probe_deadlines(self, given: dict | None) -> dict[str, float]:
        """The check's probe deadlines: the ones ``given``, else for each probe kind its default
        raised to ``HEALTH_MARGIN`` times the slowest healthy ``/health`` seen here.

        A real engine on a loaded 2-core machine answers a patched, idle ``/health`` in 2 s (8 s
        right after a storm on real 0.5.13) where the twin answers in milliseconds; the 2 s and
        5 s defaults then read a slow, serving engine as DEGRADED, and a validation of the fix as
        INCONCLUSIVE. Liveness moves with them: sglang's ``/health`` runs a generation on the
        server, as a liveness request does through the pair, so how fast the servers answer it
        now says how long a completed request may take. This cannot hide a wedge: a wedged
        prefill's ``/health`` stays fast (its scheduler is fine; only the bootstrap thread is
        dead), so liveness keeps a short deadline there, and a wedged request never answers at
        any deadline."""
        from forensics.probes import DEFAULT_DEADLINES_S

        deadlines = dict(given or {})
        for kind in ("health", "health_generate", "liveness"):
            if kind not in deadlines:
                deadlines[kind] = max(DEFAULT_DEADLINES_S[kind],
                                      min(MAX_HEALTH_DEADLINE_S, round(HEALTH_MARGIN * self.health_s, 1)))
        return deadlines


def cap_for(inventory) -> float:
    """The cap: the decode's waiting timeout when the inventory records it (a twin's or real-engine
    deployment's ``[twin] waiting_timeout_s``), else sglang's default."""
    value = (inventory.twin or {}).get("waiting_timeout_s")
    try:
        return max(float(value), 30.0) if value is not None else DEFAULT_CAP_S
    except (TypeError, ValueError):
        return DEFAULT_CAP_S


def _health(url: str, timeout: float) -> tuple[int | None, float]:
    """(status, seconds) of one ``GET /health``; status None when nothing answered."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as response:
            return response.status, time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, time.monotonic() - started
    except (OSError, ValueError):
        return None, time.monotonic() - started


def wait_until_serving(inventory, cap_s: float) -> Drain:
    """Poll every prefill's and decode's ``/health`` until all answer 200, at most ``cap_s`` seconds."""
    servers = [(e.name or e.role, e.url) for e in inventory.engines if e.role in ("prefill", "decode") and e.url]
    started = time.monotonic()
    waiting = [name for name, _ in servers]
    slowest = 0.0
    while True:
        remaining = cap_s - (time.monotonic() - started)
        still = []
        for name, url in servers:
            if name not in waiting:
                continue
            status, seconds = _health(url, max(1.0, min(HEALTH_TIMEOUT_S, remaining)))
            if status == 200:
                slowest = max(slowest, seconds)
            else:
                still.append(name)
        waiting = still
        if not waiting or time.monotonic() - started >= cap_s:
            return Drain(round(time.monotonic() - started, 3), not waiting, tuple(waiting), round(slowest, 3))
        time.sleep(POLL_S)
