"""The report's plots as deterministic SVG (matplotlib, no pyplot state, no dates, a pinned hash salt).

The same frames give the same bytes: ``svg.hashsalt`` is pinned, the SVG ``Date`` metadata is
dropped, glyphs are drawn as paths (no system font names), and times are seconds since the first
row (no wall clock, no time zone). Every axis says its unit.
"""

from __future__ import annotations

import io
from typing import Any

import pandas as pd

from .gauges import queue_gauge_rows

HASH_SALT = "pd-forensics-report"
_RC = {"svg.hashsalt": HASH_SALT, "svg.fonttype": "path", "font.family": "DejaVu Sans", "font.size": 9,
       "axes.grid": True, "grid.alpha": 0.3}


def figure_svg(figure: Any) -> str:
    """A matplotlib Figure as SVG text that is byte-identical for the same figure."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": "pd-forensics"},
                       bbox_inches="tight")
    return buffer.getvalue()


def _figure(width: float = 7.0, height: float = 2.6):
    import matplotlib

    with matplotlib.rc_context(_RC):
        from matplotlib.figure import Figure

        figure = Figure(figsize=(width, height), dpi=100)
        axes = figure.add_subplot(1, 1, 1)
    return figure, axes


def _seconds(ts: pd.Series, t0: pd.Timestamp) -> list[float]:
    return [(t - t0).total_seconds() for t in ts]


def probes_plot(probes: pd.DataFrame | None, t0: pd.Timestamp | None) -> str | None:
    """Liveness versus health: how long each probe waited (s), by kind and outcome, over time (s)."""
    if probes is None or not len(probes) or t0 is None:
        return None
    import matplotlib

    frame = probes[probes["ts"].notna()].sort_values(["ts", "kind", "target"], kind="mergesort")
    if not len(frame):
        return None
    with matplotlib.rc_context(_RC):
        figure, axes = _figure()
        markers = {"ok": "o", "late": "s", "pending": "x"}
        for kind in sorted(frame["kind"].astype(str).unique()):
            rows = frame[frame["kind"].astype(str) == kind]
            for outcome in sorted(rows["outcome"].astype(str).unique()):
                sub = rows[rows["outcome"].astype(str) == outcome]
                waited = pd.to_numeric(sub["waited_s"], errors="coerce").fillna(0.0)
                axes.scatter(_seconds(sub["ts"], t0), list(waited), marker=markers.get(outcome, "^"),
                             label=f"{kind}: {outcome}", s=22)
        axes.set_xlabel(f"time since {_label(t0)} (s)")
        axes.set_ylabel("probe wait (s)")
        axes.set_title("Liveness versus health probes")
        axes.legend(loc="best", fontsize=7)
        return figure_svg(figure)


QUEUE_PREFIXES = ("sglang:num_prefill_bootstrap", "sglang:num_decode", "sglang:num_prefill", "sglang:num_queue")


def gauges_plot(metrics: pd.DataFrame | None, t0: pd.Timestamp | None) -> str | None:
    """The PD queue gauges over time: requests (count) per gauge and engine."""
    gauges = queue_gauge_rows(metrics)
    if gauges is None or not len(gauges) or t0 is None:
        return None
    import matplotlib

    frame = gauges[gauges["ts"].notna()]
    if not len(frame):
        return None
    with matplotlib.rc_context(_RC):
        figure, axes = _figure()
        host = frame["host"].astype(str) if "host" in frame else pd.Series([""] * len(frame), index=frame.index)
        keys = sorted(set(zip(frame["metric_canonical"].astype(str), host, strict=True)))
        for metric, engine in keys:
            sub = frame[(frame["metric_canonical"].astype(str) == metric) & (host == engine)].sort_values(
                "ts", kind="mergesort")
            axes.step(_seconds(sub["ts"], t0), list(pd.to_numeric(sub["value"], errors="coerce").fillna(0.0)),
                      where="post", label=f"{metric} ({engine})" if engine else metric)
        axes.set_xlabel(f"time since {_label(t0)} (s)")
        axes.set_ylabel("requests (count)")
        axes.set_title("PD queue gauges")
        axes.legend(loc="best", fontsize=7)
        return figure_svg(figure)


ROLE_ORDER = ("prefill", "decode", "router")  # the request's path, top to bottom; other roles follow by name
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def timeline_plot(events: pd.DataFrame | None, t0: pd.Timestamp | None) -> str | None:
    """Log events over time (s) by role, one colour and marker per signature: where the death sits.

    ``events`` is an events frame (``fx.logs.scan(...).events`` or ``evidence.frame("events")``:
    columns ts, role, signature); rows without a time are left out. None when there is nothing
    to draw (no frame, no timed row, no ``t0``).

    Example: ``fx.report.timeline_plot(scan.events, scan.events["ts"].min())`` (SVG text)
    """
    if events is None or not len(events) or t0 is None or not {"ts", "role", "signature"} <= set(events.columns):
        return None
    import matplotlib

    timed = events[events["ts"].notna()]
    if not len(timed):
        return None
    frame = pd.DataFrame({"ts": timed["ts"], "role": timed["role"].fillna("unknown").astype(str),
                          "signature": timed["signature"].fillna("unknown").astype(str)}).reset_index(drop=True)
    order = [r for r in ROLE_ORDER if (frame["role"] == r).any()] + sorted(set(frame["role"]) - set(ROLE_ORDER))
    rows = {role: position for position, role in enumerate(reversed(order))}  # the first role on top
    with matplotlib.rc_context(_RC):
        figure, axes = _figure(height=max(1.6, 0.55 * len(order) + 1.0))
        colours = matplotlib.colormaps["tab10"]
        for index, signature in enumerate(sorted(set(frame["signature"]))):
            sub = frame[frame["signature"] == signature].sort_values("ts", kind="mergesort")
            axes.scatter(_seconds(sub["ts"], t0), [rows[r] for r in sub["role"]], s=22, label=signature,
                         color=colours(index % 10), marker=_MARKERS[index % len(_MARKERS)])
        axes.set_yticks(list(rows.values()), list(rows))
        axes.set_ylim(-0.6, len(order) - 0.4)
        axes.set_xlabel(f"time since {_label(t0)} (s)")
        axes.set_ylabel("role (engine log)")
        axes.set_title("Log events by role")
        axes.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, title="signature",
                    title_fontsize=7)
        return figure_svg(figure)


def _label(t0: pd.Timestamp) -> str:
    from .timefmt import utc

    return utc(t0)
