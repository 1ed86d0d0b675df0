"""``fx.watch`` / ``forensics watch``: probe and sample continuously, report each verdict change.

Live signals only, refreshed every tick: probes (health and the real-path liveness
probe, in the background), the metrics scraper, and a py-spy dump of every prefill and
decode process checked against the release's expected threads. Logs are not re-read
while watching (``forensics diagnose`` reads them); a wedge still needs two independent
sources, here the probes and the thread dump (or the bootstrap-queue gauge).

The verdict is decided on a sliding window (``window_s``) of probes and metrics, so a
probe that failed a minute ago does not keep the verdict DEGRADED forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from forensics.collection import engine_pieces
from forensics.collection.run import CollectOptions, as_inventory, concat_frames, engines_frame
from forensics.diagnosis import Verdict, decide
from forensics.evidence import Evidence

DEFAULT_DEADLINES_S = {"health": 2.0, "health_generate": 2.0, "liveness": 2.0}
OnChange = Callable[[Verdict, Verdict | None], None]
OnTick = Callable[[Verdict], None]


@dataclass
class WatchSettings:
    interval_s: float = 1.0  # probes, scrapes and thread dumps each run this often
    window_s: float = 30.0  # probes and samples older than this are out of the verdict
    deadlines_s: dict[str, float] | None = None  # default: DEFAULT_DEADLINES_S (liveness late after 2 s)
    cap_s: float | None = None
    process_refresh_s: float = 5.0  # how often the engine processes are looked up again
    command_timeout_s: float = 20.0
    drain_s: float = 5.0


class Watcher:
    """The watch loop's state: samplers, the latest dumps, the last verdict."""

    def __init__(self, target: Any, settings: WatchSettings) -> None:
        from forensics.collectors.metrics import MetricsScraper
        from forensics.probes import ProbeRunner

        self.inventory = as_inventory(target)
        self.settings = settings
        self.options = CollectOptions(command_timeout_s=settings.command_timeout_s, pieces=("processes", "threads"))
        deadlines = dict(DEFAULT_DEADLINES_S, **(settings.deadlines_s or {}))
        kwargs: dict[str, Any] = {"interval_s": settings.interval_s, "deadline_s": deadlines}
        if settings.cap_s:
            kwargs["cap_s"] = settings.cap_s
        self.runner = ProbeRunner(self.inventory, **kwargs)
        targets = [(e.role, e.name, e.url) for e in self.inventory.engines if e.role in ("prefill", "decode")]
        self.scraper = MetricsScraper(targets, settings.interval_s) if targets else None
        self.releases = engine_pieces.ReleaseCache(self.inventory)
        self.engines = [e for e in self.inventory.engines if e.role in ("prefill", "decode")]
        self.processes: dict[str, tuple[float, engine_pieces.PieceResult, list]] = {}
        self.versions: dict[str, tuple[str | None, str | None]] = {}
        self.last: Verdict | None = None

    def start(self) -> Watcher:
        self.runner.start()
        if self.scraper is not None:
            self.scraper.start()
        for engine in self.engines:
            state = None
            try:
                state = engine_pieces._engine_state(engine, self.options, engine_pieces.PieceResult())
            except Exception:  # noqa: BLE001 - the version then comes from the inventory
                state = None
            version = (state.version if state is not None else None) or engine.sglang or self.inventory.sglang
            backend = (state.backend if state is not None else None) or self.inventory.backend
            self.versions[engine.name] = (version, backend)
        return self

    def stop(self) -> None:
        if self.scraper is not None:
            self.scraper.stop()
        self.runner.stop(timeout=self.settings.drain_s)
        self.inventory.close_hosts()

    def _engine_evidence(self, engine) -> engine_pieces.PieceResult:
        """Processes (refreshed every process_refresh_s, or at once when a dump fails) and a thread dump."""
        now = time.monotonic()
        cached = self.processes.get(engine.name)
        host = self.inventory.host_for(engine)
        if cached is None or now - cached[0] >= self.settings.process_refresh_s:
            found = engine_pieces.PieceResult()
            procs = engine_pieces._processes(host, engine, self.options, found) if engine.selector else []
            cached = (now, found, procs)
            self.processes[engine.name] = cached
        _, found, procs = cached
        result = engine_pieces.PieceResult(frames=dict(found.frames), gaps=list(found.gaps))
        if procs:
            version, backend = self.versions.get(engine.name, (None, None))
            engine_pieces._threads(host, engine, procs, version, backend, self.options, self.releases, result)
            if any(g.piece == "threads" and not g.partial for g in result.gaps):
                self.processes.pop(engine.name, None)  # the process may have gone: look again next tick
        return result

    def evidence(self) -> Evidence:
        frames: dict[str, list[pd.DataFrame]] = {}
        gaps = []
        for engine in self.engines:
            part = self._engine_evidence(engine)
            for name, frame in part.frames.items():
                frames.setdefault(name, []).append(frame)
            gaps.extend(part.gaps)
        cutoff = pd.Timestamp.now(tz="UTC") - pd.Timedelta(seconds=self.settings.window_s)
        probes = self.runner.results().frame
        merged = {name: concat_frames(parts) for name, parts in frames.items()}
        merged["probes"] = probes[probes["ts"] >= cutoff].reset_index(drop=True)
        if self.scraper is not None:
            samples = self.scraper.result().to_frame()
            merged["metrics"] = samples[samples["ts"] >= cutoff].reset_index(drop=True)
        merged["engines"] = engines_frame(self.inventory)
        return Evidence({"name": self.inventory.name, "sglang": self.inventory.sglang}, merged, gaps,
                        collected_at=datetime.now(UTC).isoformat(timespec="milliseconds"))

    def tick(self) -> tuple[Verdict, bool]:
        verdict = decide(self.evidence())
        changed = self.last is None or verdict.verdict != self.last.verdict
        self.last = verdict
        return verdict, changed


def watch(target: Any, *, for_s: float | None = None, on_change: OnChange | None = None,
          on_tick: OnTick | None = None, stop: threading.Event | None = None,
          settings: WatchSettings | None = None, **kwargs: Any) -> Verdict:
    """Watch ``target`` (inventory path, Inventory or twin) until ``for_s`` passes or ``stop`` is set.

    ``on_change(verdict, previous)`` is called at the first verdict and at every change of
    verdict word; ``on_tick(verdict)`` after every tick (a live display). Returns the last
    verdict. Keyword arguments are :class:`WatchSettings` fields.

    Example: ``fx.watch("inventory.toml", for_s=600, on_change=lambda verdict, previous: print(verdict.verdict))``
    """
    settings = settings or WatchSettings(**kwargs)
    stop = stop or threading.Event()
    watcher = Watcher(target, settings).start()
    ends = None if for_s is None else time.monotonic() + for_s
    try:
        while True:
            began = time.monotonic()
            previous = watcher.last
            verdict, changed = watcher.tick()
            if changed and on_change is not None:
                on_change(verdict, previous)
            if on_tick is not None:
                on_tick(verdict)
            if ends is not None and time.monotonic() >= ends:
                break
            wait = settings.interval_s - (time.monotonic() - began)
            if ends is not None:
                wait = min(wait, ends - time.monotonic())
            if stop.wait(max(0.0, wait)):
                break
    finally:
        watcher.stop()
    return watcher.last
