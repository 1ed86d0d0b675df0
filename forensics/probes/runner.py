"""Probes on a schedule, under one rule: a probe never causes the wedge it looks for.

On sglang 0.5.13 to 0.5.15.post1 a client that disconnects early becomes an ``AbortReq``,
then an ABORT frame that kills the NIXL prefill's bootstrap thread. Hence:

* **Never close early.** A probe's deadline only *marks* it ``late``; its connection stays
  open until the answer (the row becomes ``answered_late`` with the full wait) or until the
  hard cap ``cap_s`` (default 330 s, longer than sglang's 300 s bootstrap and waiting
  timeouts; lower it only for a deployment whose timeouts are lower, like a twin).
* **At most one probe per (target, kind) in flight.** Each (target, kind) is a *lane* with one
  thread that sends with a blocking call, so a second request of that lane cannot exist
  while one is open. A tick that finds the lane busy records a ``pending`` row ("still
  waiting since T") instead of sending.

Leaving:

* :meth:`ProbeRunner.stop` stops the ticks and by default **waits** for every open probe to
  be answered, up to its cap (so on a wedged deployment, up to ``cap_s``). ``timeout=`` waits
  less and leaves the rest running like :meth:`detach`. ``abandon=True`` closes the open
  connections at once (rows ``abandoned``): on a vulnerable, *healthy but slow* deployment
  that can itself cause the wedge; on one already wedged it changes nothing.
* :meth:`ProbeRunner.detach` stops the ticks and returns at once; open probes keep their
  connections on daemon threads and finish on their own (``results()`` still shows the
  updates). A process that exits closes its sockets, which the server would see as a client
  disconnect, the very thing the rule avoids; so a runner left with open probes is handed
  over at exit (:mod:`forensics.probes.handover`): a keeper process takes the connections
  and holds each until its answer or its cap, and stderr says which probe is open and why.
  ``detach(wait_at_exit=True)`` waits for them (up to the caps) at exit instead.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from forensics.probes import calls, handover
from forensics.probes.exchange import DEFAULT_CONNECT_S, Answer, Exchange
from forensics.probes.results import ProbeResults, ProbeRow
from forensics.probes.schema import DEFAULT_CAP_S, DEFAULT_DEADLINES_S, KINDS
from forensics.probes.targets import Target, targets_from

__all__ = ["ProbeRunner", "probe_once"]


@dataclass
class _Probe:
    """One sent probe, updated in place by its lane thread (under the runner's lock)."""

    probe_id: int
    target: Target
    kind: str
    call: calls.Call
    deadline_s: float
    cap_s: float
    sent_ns: int = field(default_factory=time.time_ns)
    sent_mono: float = field(default_factory=time.monotonic)
    exchanges: list[Exchange] = field(default_factory=list)
    answer: Answer | None = None  # set once, when every leg is done

    def row(self, now_mono: float) -> ProbeRow:
        base = dict(ts_ns=self.sent_ns, probe_id=self.probe_id, target=self.target.name, role=self.target.role,
                    kind=self.kind, url=self.call.url, deadline_s=self.deadline_s, room=self.call.room)
        a = self.answer
        if a is None:
            waited = now_mono - self.sent_mono
            late = waited > self.deadline_s
            detail = (f"no answer after {waited:.1f}s (deadline {self.deadline_s:g}s); the connection stays open"
                      if late else "waiting for the answer")
            return ProbeRow(**base, outcome="late" if late else "in_flight", waited_s=waited, detail=detail)
        if a.failure is not None:
            return ProbeRow(**base, outcome=a.failure, status=a.status, ttfb_s=a.ttfb_s, total_s=a.total_s,
                            waited_s=a.total_s, detail=a.detail)
        if a.total_s > self.deadline_s:
            outcome = "answered_late"
            detail = f"HTTP {a.status} after {a.total_s:.2f}s (deadline {self.deadline_s:g}s)"
        else:
            outcome = "ok" if 200 <= a.status < 300 else "http_error"
            detail = a.detail or f"HTTP {a.status}"
        return ProbeRow(**base, outcome=outcome, status=a.status, ttfb_s=a.ttfb_s, total_s=a.total_s,
                        waited_s=a.total_s, detail=detail)


def _combine(answers: list[Answer], urls: list[str]) -> Answer:
    """A pair's answer: as a router sees it, the decode's response once both answered."""
    if len(answers) == 1:
        a = answers[0]
        if a.failure is None and not 200 <= a.status < 300:
            a.detail = f"HTTP {a.status}: {a.body[:200].decode(errors='replace')}"
        return a
    prefill, decode = answers
    total = max(a.total_s or 0.0 for a in answers)
    failed = [(u, a) for u, a in zip(urls, answers, strict=True) if a.failure is not None]
    if failed:
        order = ("abandoned", "unanswered", "error", "refused")
        worst = max(failed, key=lambda ua: order.index(ua[1].failure))
        detail = "; ".join(f"{u}: {a.failure}: {a.detail}" for u, a in failed)
        return Answer(status=decode.status, ttfb_s=decode.ttfb_s, total_s=total, failure=worst[1].failure,
                      detail=detail)
    bad = [(u, a) for u, a in zip(urls, answers, strict=True) if not 200 <= a.status < 300]
    detail = "; ".join(f"{u}: HTTP {a.status}: {a.body[:200].decode(errors='replace')}" for u, a in bad)
    status = bad[-1][1].status if bad else decode.status
    return Answer(status=status, ttfb_s=decode.ttfb_s, total_s=total, detail=detail)


class _Lane:
    """One (target, kind): one thread, one request at a time (the at-most-one rule, by construction)."""

    def __init__(self, runner: ProbeRunner, target: Target, kind: str) -> None:
        self.runner = runner
        self.target = target
        self.kind = kind
        self.current: _Probe | None = None  # under runner._lock
        self.go = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"probe {target.name} {kind}", daemon=True)

    def _run(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            with self.runner._lock:
                probe = self.current
            if probe is None:
                if self.runner._closing.is_set():
                    return
                continue
            answer = self._send(probe)
            with self.runner._lock:
                probe.answer = answer
                self.current = None
            self.runner._changed.set()

    def _send(self, probe: _Probe) -> Answer:
        legs = probe.call.legs
        exchanges = [Exchange(leg.method, leg.url, leg.body, cap_s=probe.cap_s, connect_s=self.runner.connect_s)
                     for leg in legs]
        with self.runner._lock:
            probe.exchanges = exchanges
        helpers = [threading.Thread(target=ex.run, name=f"{self.thread.name} leg {i}", daemon=True)
                   for i, ex in enumerate(exchanges[:-1])]
        for helper in helpers:  # the prefill leg(s), concurrently with the last (decode) leg
            helper.start()
        exchanges[-1].run()
        for helper in helpers:
            helper.join()  # each leg ends by itself: answer, cap or abandon
        return _combine([ex.answer for ex in exchanges], [leg.url for leg in legs])


class ProbeRunner:
    """Probe ``targets`` every ``interval_s`` seconds in the background; ``results()`` at any time.

    ``deadline_s``: seconds after which a probe is marked late (a number for every kind or a
    mapping kind -> seconds; defaults :data:`DEFAULT_DEADLINES_S`). ``cap_s``: the hard cap
    after which an unanswered probe's connection is closed (keep it above the deployment's
    bootstrap and waiting timeouts). ``kinds``: which kinds to send (each target also limits
    its own). Liveness sends ``liveness_text`` to ``liveness_endpoint``.

    Use as a context manager (``__exit__`` is :meth:`stop`: it waits for open probes) or
    :meth:`start` / :meth:`stop` / :meth:`detach`. See the module docstring for the rule.
    """

    def __init__(self, targets: Any, interval_s: float = 1.0, *, kinds: Iterable[str] = KINDS,
                 deadline_s: float | Mapping[str, float] | None = None, cap_s: float = DEFAULT_CAP_S,
                 connect_s: float = DEFAULT_CONNECT_S, liveness_endpoint: str = "/generate",
                 liveness_text: str = calls.DEFAULT_LIVENESS_TEXT) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        kinds = tuple(kinds)
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown probe kinds {sorted(unknown)} (known: {KINDS})")
        self.targets = targets_from(targets)
        self.interval_s = float(interval_s)
        self.deadlines = dict(DEFAULT_DEADLINES_S)
        if isinstance(deadline_s, Mapping):
            self.deadlines.update({k: float(v) for k, v in deadline_s.items()})
        elif deadline_s is not None:
            self.deadlines = {k: float(deadline_s) for k in KINDS}
        self.cap_s = float(cap_s)
        for kind, seconds in self.deadlines.items():
            if not 0 < seconds < self.cap_s:
                raise ValueError(f"deadline for {kind} ({seconds}s) must be positive and below cap_s ({self.cap_s}s)")
        self.connect_s = connect_s
        calls.liveness_body(liveness_endpoint, liveness_text, "check")  # fail here, not in a thread
        self.liveness_endpoint = liveness_endpoint
        self.liveness_text = liveness_text
        self.lanes = [_Lane(self, t, k) for t in self.targets for k in (t.kinds or ()) if k in kinds]
        if not self.lanes:
            raise ValueError(f"nothing to probe: no target offers the kinds {kinds}")
        self._lock = threading.Lock()
        self._probes: list[_Probe] = []
        self._pending: list[dict] = []  # pending rows, fixed when recorded
        self._next_id = 1
        self._stop = threading.Event()  # stop ticking
        self._closing = threading.Event()  # lanes exit once idle
        self._changed = threading.Event()
        self._ticker: threading.Thread | None = None
        self.ticks = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ProbeRunner:
        if self._ticker is not None:
            raise RuntimeError("ProbeRunner already started")
        handover.register(self)  # however the process ends (an exception, a SIGTERM), no probe is closed by it
        for lane in self.lanes:
            lane.thread.start()
        self._ticker = threading.Thread(target=self._tick_loop, name="probe ticker", daemon=True)
        self._ticker.start()
        return self

    def __enter__(self) -> ProbeRunner:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self, *, abandon: bool = False, timeout: float | None = None) -> ProbeResults:
        """Stop ticking; wait for open probes (up to their caps, or ``timeout``); the results.

        ``abandon=True`` closes open connections instead of waiting (outcome ``abandoned``):
        on a vulnerable deployment that is slow but not wedged, that disconnect can itself
        cause the wedge. With ``timeout``, probes still open after it are left as by
        :meth:`detach`.
        """
        self._halt()
        if abandon:
            with self._lock:
                open_ = [p for p in self._probes if p.answer is None]
            for probe in open_:
                for ex in probe.exchanges:
                    ex.abandon()
        limit = None if timeout is None else time.monotonic() + timeout
        for lane in self.lanes:
            if lane.thread.is_alive():
                wait = None if limit is None else max(limit - time.monotonic(), 0.0)
                lane.thread.join(wait)
        return self.results()

    def detach(self, *, wait_at_exit: bool = False) -> ProbeResults:
        """Stop ticking and return at once; open probes finish on their own daemon threads.

        Their connections stay open. At process exit, those still open are handed to a keeper
        process that holds them until their answers or caps (:mod:`forensics.probes.handover`),
        so the exit closes nothing the server sees. ``wait_at_exit=True`` waits for them at
        exit instead (up to their caps).
        """
        self._halt()
        if wait_at_exit:
            atexit.register(self._wait_lanes)
        return self.results()

    def _wait_lanes(self) -> None:
        for lane in self.lanes:
            lane.thread.join()

    def halt_ticks(self) -> None:
        """Send nothing more (the probes already open stay open): what an exit does first."""
        self._halt()

    def _halt(self) -> None:
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()
        self._closing.set()
        for lane in self.lanes:
            lane.go.set()  # an idle lane exits; a busy one after its answer

    @property
    def running(self) -> bool:
        return self._ticker is not None and self._ticker.is_alive()

    def open_probes(self) -> int:
        with self._lock:
            return sum(1 for lane in self.lanes if lane.current is not None)

    def open_exchanges(self) -> list[tuple[_Probe, int, Exchange]]:
        """(probe, leg, exchange) for every connection still open: what a hand-over takes."""
        with self._lock:
            probes = [lane.current for lane in self.lanes if lane.current is not None]
            found = [(p, leg, ex) for p in probes for leg, ex in enumerate(p.exchanges)]
        return [(p, leg, ex) for p, leg, ex in found if ex.socket_fd() is not None]

    # ------------------------------------------------------------------ ticks

    def _tick_loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.tick()
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:  # fell behind (a slow machine): no burst of catch-up ticks
                next_at = now
            self._stop.wait(next_at - now)

    def tick(self) -> None:
        """One round: send on every idle lane; a ``pending`` row for every busy one."""
        now_ns, now_mono = time.time_ns(), time.monotonic()
        start: list[_Lane] = []
        with self._lock:
            self.ticks += 1
            for lane in self.lanes:
                open_probe = lane.current
                if open_probe is not None:
                    waited = now_mono - open_probe.sent_mono
                    since = time.strftime("%H:%M:%S", time.gmtime(open_probe.sent_ns / 1e9))
                    self._pending.append(dict(
                        ts_ns=now_ns, probe_id=open_probe.probe_id, target=lane.target.name,
                        role=lane.target.role, kind=lane.kind, url=open_probe.call.url, outcome="pending",
                        waited_s=waited, deadline_s=open_probe.deadline_s, room=open_probe.call.room,
                        detail=f"still waiting since {since}Z (probe {open_probe.probe_id}, {waited:.1f}s); "
                               "nothing sent"))
                    continue
                call = calls.plan(lane.target, lane.kind, endpoint=self.liveness_endpoint, text=self.liveness_text)
                probe = _Probe(self._next_id, lane.target, lane.kind, call, self.deadlines[lane.kind], self.cap_s)
                self._next_id += 1
                self._probes.append(probe)
                lane.current = probe
                start.append(lane)
        for lane in start:
            lane.go.set()

    # ------------------------------------------------------------------ results

    def results(self) -> ProbeResults:
        """A snapshot: every probe sent (its outcome as of now) and every pending row."""
        now = time.monotonic()
        with self._lock:
            rows = [p.row(now) for p in self._probes] + [ProbeRow(**r) for r in self._pending]
        return ProbeResults.from_rows(rows, source=self)

    def wait_for(self, predicate, timeout: float) -> bool:
        """Wait (on change events, not polling) until ``predicate(results)`` holds; False on timeout."""
        limit = time.monotonic() + timeout
        while True:
            self._changed.clear()
            if predicate(self.results()):
                return True
            left = limit - time.monotonic()
            if left <= 0:
                return False
            self._changed.wait(min(left, self.interval_s, 0.1))  # a deadline passing signals nothing

    def wait_answered(self, timeout: float | None = None) -> bool:
        """Wait until no probe is open (or ``timeout``); True if none is."""
        limit = None if timeout is None else time.monotonic() + timeout
        while self.open_probes():
            self._changed.clear()
            if self.open_probes() == 0:
                break
            left = None if limit is None else limit - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._changed.wait(0.5 if left is None else min(left, 0.5))
        return True


def probe_once(source: Any, kinds: Iterable[str] = KINDS, *, deadline_s: float | Mapping[str, float] | None = None,
               cap_s: float = DEFAULT_CAP_S, wait: bool = False, **options: Any) -> ProbeResults:
    """Probe every target once (all kinds concurrently) and return when each is answered or late.

    A late probe is left open on its daemon thread (never closed early):
    ``results.refresh()`` shows how it ended. ``wait=True`` waits for every answer instead
    (up to ``cap_s``). See :class:`ProbeRunner` for the other options.
    """
    runner = ProbeRunner(source, interval_s=3600.0, kinds=kinds, deadline_s=deadline_s, cap_s=cap_s, **options)
    handover.register(runner)
    for lane in runner.lanes:
        lane.thread.start()
    runner.tick()
    if wait:
        runner.wait_answered()
    else:
        longest = max(runner.deadlines[lane.kind] for lane in runner.lanes)
        runner.wait_for(lambda r: not r.frame["outcome"].eq("in_flight").any(), longest + 1.0)
    return runner.detach()
