"""The collection itself: background sampling plus one worker per engine, then Evidence.

Order of work, and why:

1. Probes and the metrics scraper start first and sample for ``sample_s`` seconds in the
   background (a wedge shows as a liveness probe that does not answer while health does,
   and as a bootstrap-queue gauge that only grows: both need time, not one look).
2. Meanwhile each engine gets a worker that reads, in order, its processes (the pids the
   thread dump and the environment need, and the start time that tells this run's log
   lines from an earlier run's), /server_info and /v1/loads, the settings, the thread dump
   and the logs. One slow host never delays the others.
3. The scraper stops; the probe runner stops ticking and waits up to ``drain_s`` for open
   probes. A probe still open after that stays open (forensics.probes: closing it could
   send the very ABORT that wedges a vulnerable engine); its row says "late".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from forensics.collectors.bounded_http import JSON_LIMITS, METRICS_LIMITS, PROMETHEUS_LIMITS
from forensics.evidence import Evidence, Gap
from forensics.exitcodes import ExitStatus

from . import engine_pieces

DEFAULT_SAMPLE_S = 8.0
ALL_PIECES = ("probes", "metrics", "processes", "server_info", "settings", "threads", "logs")
Progress = Callable[[str, int, int], None]  # (what just finished, done, total)


@dataclass
class CollectOptions:
    since: Any = "30m"  # the log window's start: a time, epoch or a duration before now
    until: Any = None
    sample_s: float = DEFAULT_SAMPLE_S  # how long probes and metrics sample
    probe_interval_s: float = 1.0
    metrics_interval_s: float = 1.0
    deadlines_s: dict[str, float] | None = None  # per probe kind; forensics.probes defaults
    cap_s: float | None = None  # a probe's hard cap (forensics.probes default: above sglang's timeouts)
    drain_s: float = 5.0  # how long to wait at the end for probes still open (then they stay open, detached)
    pieces: tuple[str, ...] = ALL_PIECES
    workers: int = 16
    command_timeout_s: float = 30.0
    tz: str = "UTC"  # how to read log times without a zone
    # Byte caps of the HTTP answers read (each also has a total deadline: forensics.collectors.bounded_http).
    metrics_max_bytes: int = METRICS_LIMITS.max_bytes  # one /metrics page
    json_max_bytes: int = JSON_LIMITS.max_bytes  # /server_info, /v1/loads and their old names
    prometheus_max_bytes: int = PROMETHEUS_LIMITS.max_bytes  # one Prometheus API answer
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.pieces) - set(ALL_PIECES)
        if unknown:
            from forensics.exitcodes import UsageProblem

            raise UsageProblem(f"unknown piece(s) {sorted(unknown)} (known: {', '.join(ALL_PIECES)})")


def as_inventory(target: Any):
    """An inventory from a path, an Inventory, or a twin Deployment."""
    from forensics.inventory import Inventory, load

    if isinstance(target, Inventory):
        return target
    if isinstance(target, str | Path):
        return load(target)
    path = getattr(target, "inventory_path", None)  # a twin Deployment
    if path is not None:
        return load(path)
    raise TypeError(f"expected an inventory path, Inventory or twin, got {type(target).__name__}")


def engines_frame(inventory) -> pd.DataFrame:
    return pd.DataFrame({
        "name": pd.array([e.name for e in inventory.engines], dtype="string"),
        "role": pd.array([e.role for e in inventory.engines], dtype="string"),
        "host": pd.array([str(e.host) for e in inventory.engines], dtype="string"),
        "url": pd.array([engine_pieces.safe_url(e.url) for e in inventory.engines], dtype="string"),
    })


def collect(target: Any, *, options: CollectOptions | None = None, progress: Progress | None = None,
            **kwargs: Any) -> Evidence:
    """Collect every piece of evidence about ``target`` (inventory path, Inventory or twin).

    Keyword arguments are :class:`CollectOptions` fields (``since="30m"``, ``sample_s=8``).
    Never raises for a piece that fails: the piece becomes a Gap and the rest is kept.

    Example: ``evidence = fx.collect("docs/examples/pd-two-node.toml", since="30m", sample_s=8)``
    """
    from forensics.logs import timewindow

    options = options or CollectOptions(**kwargs)
    inventory = as_inventory(target)
    bounds = timewindow.window(options.since, options.until, None, options.tz)
    started_at = datetime.now(UTC)
    gaps: list[Gap] = []
    commands: list[dict[str, Any]] = []
    frames: dict[str, list[pd.DataFrame]] = {}
    settings: list = []
    lock = threading.Lock()
    total = len(inventory.engines) + 2  # the engines, plus starting and stopping the samplers
    done = [0]

    def keep(result: engine_pieces.PieceResult, what: str) -> None:
        with lock:
            for name, frame in result.frames.items():
                frames.setdefault(name, []).append(frame)
            gaps.extend(result.gaps)
            commands.extend(result.commands)
            settings.extend(result.settings)
            done[0] += 1
            if progress is not None:
                progress(what, done[0], total)

    sampling = engine_pieces.Sampling.start(inventory, options)
    keep(sampling.start_result, "probes and metrics started")
    began = time.monotonic()
    versions = engine_pieces.ReleaseCache(inventory)
    try:
        with ThreadPoolExecutor(max(1, min(options.workers, len(inventory.engines))),
                                thread_name_prefix="collect-engine") as pool:
            futures = [pool.submit(engine_pieces.collect_engine, inventory, engine, options, bounds, versions)
                       for engine in inventory.engines]
            for engine, future in zip(inventory.engines, futures, strict=True):
                keep(future.result(), engine.name)
        left = options.sample_s - (time.monotonic() - began)
        sampling.wait(left)
    finally:
        result = sampling.stop(options)
        keep(result, "probes and metrics stopped")
        inventory.close_hosts()
    if settings:
        cross = engine_pieces.cross_engine_findings(settings)
        for name, frame in cross.frames.items():
            frames.setdefault(name, []).append(frame)
    if "metrics" in options.pieces and inventory.prometheus:
        # After the sampling: the history then covers the whole collection, up to our last scrape.
        total += 1
        keep(engine_pieces.prometheus_history(inventory, bounds, options), "Prometheus history")
    merged = {name: concat_frames(parts) for name, parts in frames.items()}
    merged["engines"] = engines_frame(inventory)
    deployment = {
        "name": inventory.name, "sglang": inventory.sglang or versions.seen_version(), "backend": inventory.backend,
        "inventory": None if inventory.path is None else str(inventory.path), "twin": inventory.is_twin,
        "engines": [{"name": e.name, "role": e.role, "host": str(e.host), "url": engine_pieces.safe_url(e.url)}
                    for e in inventory.engines],
    }
    return Evidence(deployment=deployment, frames=merged, gaps=gaps, commands=commands,
                    window={"since": _iso(bounds.since), "until": _iso(bounds.until)},
                    collected_at=started_at.isoformat(timespec="milliseconds"))


def _iso(ts) -> str | None:
    return None if ts is None else pd.Timestamp(ts).isoformat()


def concat_frames(parts: list[pd.DataFrame]) -> pd.DataFrame:
    parts = [p for p in parts if p is not None]
    non_empty = [p for p in parts if len(p)]
    if not non_empty:
        return parts[0].iloc[:0] if parts else pd.DataFrame()
    return pd.concat(non_empty, ignore_index=True) if len(non_empty) > 1 else non_empty[0].reset_index(drop=True)


def collection_status(evidence: Evidence) -> tuple[str, ExitStatus]:
    """``complete`` (0) with no gap, ``partial`` (3) with some, ``empty`` (4) when nothing came back."""
    useful = [name for name, frame in evidence.frames.items() if name != "engines" and frame is not None and len(frame)]
    if not useful:
        return "empty", ExitStatus.ENVIRONMENT
    if evidence.gaps:
        return "partial", ExitStatus.INCONCLUSIVE
    return "complete", ExitStatus.GOOD
