"""What probes found: the ``probes`` frame (:data:`PROBES_SCHEMA`), the latest state, findings.

A :class:`ProbeResults` is a snapshot. Probes still open when it was taken show as
``in_flight`` or ``late``; :meth:`ProbeResults.refresh` takes a new snapshot from the runner
that made it (a late probe that got its answer since then reads ``answered_late``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from forensics.probes.schema import PROBES_SCHEMA, conform, empty_frame, int64_column, is_failing

SUMMARY_OUTCOMES = ("ok", "late", "answered_late", "pending", "http_error", "refused", "error", "unanswered")


@dataclass
class ProbeRow:
    ts_ns: int
    probe_id: int
    target: str
    role: str
    kind: str
    url: str
    outcome: str
    deadline_s: float
    status: int | None = None
    ttfb_s: float | None = None
    total_s: float | None = None
    waited_s: float | None = None
    room: int | None = None
    detail: str = ""


def _floats(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def rows_frame(rows: list[ProbeRow]) -> pd.DataFrame:
    """The schema frame of ``rows``, sorted by time then probe id (integer columns built exactly)."""
    if not rows:
        return empty_frame()
    rows = sorted(rows, key=lambda r: (r.ts_ns, r.probe_id, r.outcome == "pending"))
    ts = pd.to_datetime(np.array([r.ts_ns for r in rows], dtype=np.int64), unit="ns", utc=True)
    strings = {c: pd.array([getattr(r, c) for r in rows], dtype="string")
               for c in ("target", "role", "kind", "url", "outcome", "detail")}
    frame = pd.DataFrame({
        "ts": ts,
        "probe_id": int64_column([r.probe_id for r in rows]),
        **{c: strings[c] for c in ("target", "role", "kind", "url", "outcome")},
        "status": int64_column([r.status for r in rows]),
        "ttfb_s": _floats([r.ttfb_s for r in rows]),
        "total_s": _floats([r.total_s for r in rows]),
        "waited_s": _floats([r.waited_s for r in rows]),
        "deadline_s": _floats([r.deadline_s for r in rows]),
        "room": int64_column([r.room for r in rows]),
        "detail": strings["detail"],
    })
    return conform(frame)


class ProbeResults:
    """The probes frame and what it says; renders itself in a notebook and a terminal."""

    def __init__(self, frame: pd.DataFrame, *, source: Any = None) -> None:
        self.frame = conform(frame)
        self._source = source

    @classmethod
    def from_rows(cls, rows: list[ProbeRow], *, source: Any = None) -> ProbeResults:
        return cls(rows_frame(rows), source=source)

    def to_frame(self) -> pd.DataFrame:
        return self.frame

    def refresh(self) -> ProbeResults:
        """A new snapshot from the runner that made this one (late probes may have been answered)."""
        if self._source is None:
            return self
        return self._source.results()

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def sent(self) -> pd.DataFrame:
        """One row per probe sent (pending rows left out)."""
        return self.frame[self.frame["outcome"] != "pending"]

    @property
    def failing(self) -> pd.Series:
        """Row by row: does it say the probed path failed? (pending: once its wait passed the deadline)."""
        f = self.frame
        return is_failing(f["outcome"], f["waited_s"], f["deadline_s"])

    def latest(self) -> pd.DataFrame:
        """Per (target, kind) the most recently sent probe, as of this snapshot."""
        sent = self.sent
        if sent.empty:
            return sent
        last = sent.sort_values(["ts", "probe_id"]).groupby(["target", "kind"], sort=True, observed=True).tail(1)
        return last.sort_values(["target", "kind"]).reset_index(drop=True)

    def findings(self, *, window_s: float = 30.0) -> list:
        """What the probes say is wrong (``health_lies`` first); see :mod:`forensics.probes.findings`."""
        from forensics.probes.findings import find

        return find(self.frame, window_s=window_s)

    def summary(self) -> pd.DataFrame:
        """Per (target, kind): counts by outcome, p50 and max of total_s, the latest outcome."""
        f = self.frame
        if f.empty:
            return pd.DataFrame(columns=["target", "kind", "sent", *SUMMARY_OUTCOMES, "p50_s", "max_s", "latest"])
        counts = f.groupby(["target", "kind"], observed=True)["outcome"].value_counts().unstack(fill_value=0)
        for outcome in SUMMARY_OUTCOMES:
            if outcome not in counts.columns:
                counts[outcome] = 0
        sent = self.sent.groupby(["target", "kind"], observed=True)
        out = pd.DataFrame({"sent": sent.size()}).join(counts[list(SUMMARY_OUTCOMES)], how="outer").fillna(0)
        out = out.astype("int64")
        out["p50_s"] = sent["total_s"].median().round(3)
        out["max_s"] = sent["total_s"].max().round(3)
        latest = self.latest().set_index(["target", "kind"])["outcome"]
        out["latest"] = latest
        return out.reset_index()

    def _title(self) -> str:
        sent = len(self.sent)
        pending = int((self.frame["outcome"] == "pending").sum())
        if self.frame.empty:
            return "probes: none"
        span = (self.frame["ts"].max() - self.frame["ts"].min()).total_seconds()
        return f"probes: {sent} sent, {pending} pending ticks, over {span:.1f}s"

    def _shown_summary(self) -> pd.DataFrame:
        """The summary without outcome columns that are zero everywhere."""
        summary = self.summary()
        empty = [c for c in SUMMARY_OUTCOMES if c != "ok" and not summary.empty and (summary[c] == 0).all()]
        return summary.drop(columns=empty)

    def _repr_html_(self) -> str:
        table = self._shown_summary().to_html(index=False, na_rep="", escape=True)
        findings = "".join(f"<li>{html.escape(str(f))}</li>" for f in self.findings())
        extra = f"<ul>{findings}</ul>" if findings else ""
        return f"<div><strong>{html.escape(self._title())}</strong>{table}{extra}</div>"

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self._title())
        summary = self._shown_summary()
        for column in summary.columns:
            table.add_column(str(column))
        for row in summary.itertuples(index=False):
            bad = row.latest not in ("ok", None) and not pd.isna(row.latest)
            table.add_row(*[("" if pd.isna(v) else str(v)) for v in row], style="red" if bad else None)
        parts: list = [table]
        for finding in self.findings():
            parts.append(Text(str(finding), style="bold red" if finding.severity == "critical" else "yellow"))
        return Group(*parts)

    def __repr__(self) -> str:
        return f"<ProbeResults {self._title()}>"


__all__ = ["PROBES_SCHEMA", "ProbeResults", "ProbeRow", "rows_frame"]
