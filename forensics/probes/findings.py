"""What a probes frame says is wrong, each finding with the rows that show it.

* ``health_lies`` (critical): ``/health`` or ``/health_generate`` answered OK while a real
  one-token request on the real path failed (late, pending past its deadline, refused, an
  error) within ``window_s`` of it. In PD mode sglang's health checks use a fake transfer
  backend (``bootstrap_host = 2.2.2.2``), so they pass on a prefill whose bootstrap thread is
  dead: exactly the wedge.
* ``liveness_failing`` (error): real requests failed, whatever health said.
* ``unreachable`` (error): connections refused (nothing listens at the URL).
* ``health_failing`` (warning): a health probe itself failed or was late.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forensics.probes.schema import is_failing

EVIDENCE_SHOWN = 20  # rows per finding in displays (the frame keeps all)
HEALTH_KINDS = ("health", "health_generate")


@dataclass
class ProbeFinding:
    id: str
    severity: str  # critical, error, warning
    meaning: str
    detail: str
    evidence: pd.DataFrame  # rows of the probes frame

    @property
    def first(self) -> pd.Timestamp | None:
        return None if self.evidence.empty else self.evidence["ts"].min()

    @property
    def last(self) -> pd.Timestamp | None:
        return None if self.evidence.empty else self.evidence["ts"].max()

    def __str__(self) -> str:
        return f"{self.severity.upper()} {self.id}: {self.detail}"

    def to_dict(self) -> dict:
        shown = self.evidence.head(EVIDENCE_SHOWN)
        rows = []
        for row in shown.itertuples(index=False):
            rows.append({c: (None if pd.isna(v) else (v.isoformat() if isinstance(v, pd.Timestamp) else
                                                       int(v) if isinstance(v, (int, np.integer)) else
                                                       float(v) if isinstance(v, (float, np.floating)) else str(v)))
                         for c, v in zip(shown.columns, row, strict=True)})
        return {"id": self.id, "severity": self.severity, "meaning": self.meaning, "detail": self.detail,
                "evidence_rows": len(self.evidence), "evidence": rows}

    def _repr_html_(self) -> str:
        table = self.evidence.head(EVIDENCE_SHOWN).to_html(index=False, na_rep="", escape=True)
        return (f"<div><strong>{html.escape(self.severity.upper())} {html.escape(self.id)}</strong>: "
                f"{html.escape(self.detail)}<br><em>{html.escape(self.meaning)}</em>{table}</div>")

    def __rich__(self):
        from rich.table import Table

        table = Table(title=str(self), caption=self.meaning)
        columns = ["ts", "target", "kind", "outcome", "status", "waited_s", "detail"]
        for column in columns:
            table.add_column(column)
        for row in self.evidence.head(EVIDENCE_SHOWN)[columns].itertuples(index=False):
            table.add_row(*[("" if pd.isna(v) else str(v)) for v in row])
        return table


def _counts(outcomes: pd.Series) -> str:
    return ", ".join(f"{name} x{n}" for name, n in outcomes.value_counts().items())


def find(frame: pd.DataFrame, *, window_s: float = 30.0) -> list[ProbeFinding]:
    if frame.empty:
        return []
    failing = is_failing(frame["outcome"], frame["waited_s"], frame["deadline_s"])
    liveness_bad = frame[(frame["kind"] == "liveness") & failing]
    health = frame[frame["kind"].isin(HEALTH_KINDS)]
    health_ok = health[health["outcome"] == "ok"]
    findings: list[ProbeFinding] = []

    if not liveness_bad.empty and not health_ok.empty:
        start = pd.DatetimeIndex(liveness_bad["ts"]).asi8  # ns since the epoch, exact
        end = start + (liveness_bad["waited_s"].fillna(0.0).to_numpy() * 1e9).astype(np.int64)
        window = int(window_s * 1e9)
        health_ok = health_ok.sort_values("ts", kind="stable")
        when = pd.DatetimeIndex(health_ok["ts"]).asi8  # sorted
        left = np.searchsorted(when, start - window, side="left")
        right = np.searchsorted(when, end + window, side="right")
        cover = np.zeros(len(when) + 1, dtype=np.int64)  # health rows inside any failing interval
        np.add.at(cover, left, 1)
        np.add.at(cover, right, -1)
        lying = health_ok[np.cumsum(cover)[:-1] > 0]
        if not lying.empty:
            near = right > left
            failed = liveness_bad[near]
            targets = ", ".join(f"{t} {k}" for t, k in sorted(set(zip(lying["target"], lying["kind"], strict=True))))
            findings.append(ProbeFinding(
                "health_lies", "critical",
                "health checks pass but real requests on the real path do not: in PD mode sglang's health "
                "probe uses a fake transfer backend and never touches the bootstrap thread or the KV transfer",
                f"health answered OK {len(lying)} times ({targets}) while liveness failed {len(failed)} times "
                f"({_counts(failed['outcome'])}) within {window_s:g}s",
                pd.concat([failed, lying]).sort_values(["ts", "probe_id"]).reset_index(drop=True)))

    if not liveness_bad.empty:
        findings.append(ProbeFinding(
            "liveness_failing", "error", "real one-token requests did not complete within their deadline",
            f"{len(liveness_bad)} liveness rows failing ({_counts(liveness_bad['outcome'])}) on "
            f"{', '.join(sorted(set(liveness_bad['target'])))}", liveness_bad.reset_index(drop=True)))

    refused = frame[frame["outcome"] == "refused"]
    if not refused.empty:
        findings.append(ProbeFinding(
            "unreachable", "error", "nothing accepts connections at the target's URL",
            f"connection refused {len(refused)} times: {', '.join(sorted(set(refused['url'])))}",
            refused.reset_index(drop=True)))

    health_bad = health[failing.loc[health.index] & (health["outcome"] != "refused")]
    if not health_bad.empty:
        findings.append(ProbeFinding(
            "health_failing", "warning", "health probes failed or answered late",
            f"{len(health_bad)} health rows failing ({_counts(health_bad['outcome'])})",
            health_bad.reset_index(drop=True)))
    return findings
