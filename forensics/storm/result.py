"""``StormResult``: the history, the verdict after each cycle, the aborts the storm produced."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from forensics.exitcodes import ExitStatus

from .plan import StormPlan

BAD_VERDICTS = ("WEDGED", "DEGRADED", "DOWN")


@dataclass
class CycleResult:
    cycle: int
    started: str  # ISO UTC
    verdict: Any  # forensics.diagnosis.Verdict
    killed: int
    aborts: dict[str, int]  # prealloc / transfer / none / unknown -> sessions
    prefill_abort_frames: int
    aborts_sent: int
    strikes: list[dict] = field(default_factory=list)  # per wave: killed, spread_s, after_signal_s
    evidence: Any = field(default=None, repr=False)
    drained: Any = None  # forensics.storm.drain.Drain: the wait for /health 200 before the check

    @property
    def abort_count(self) -> int:
        return self.aborts.get("prealloc", 0) + self.aborts.get("transfer", 0)

    def to_dict(self) -> dict[str, Any]:
        return {"cycle": self.cycle, "started": self.started, "verdict": self.verdict.verdict,
                "reasons": list(self.verdict.reasons), "kill_chain": list(self.verdict.kill_chain),
                "killed": self.killed, "aborts": dict(self.aborts), "abort_count": self.abort_count,
                "prefill_abort_frames": self.prefill_abort_frames, "aborts_sent": self.aborts_sent,
                "strikes": list(self.strikes),
                "drained": None if self.drained is None else {"seconds": self.drained.seconds,
                                                               "healthy": self.drained.healthy,
                                                               "waiting_for": list(self.drained.waiting_for),
                                                               "health_s": self.drained.health_s}}


@dataclass
class StormResult:
    plan: StormPlan
    history: pd.DataFrame
    cycles: list[CycleResult]

    @property
    def verdicts(self) -> list[Any]:
        return [c.verdict for c in self.cycles]

    @property
    def aborts(self) -> int:
        """Sessions whose kill the decode logged as an abort in its prealloc or transfer queue."""
        return sum(c.abort_count for c in self.cycles)

    @property
    def exit_status(self) -> ExitStatus:
        """1 when the target did not stay HEALTHY, 3 when the storm produced no abort (or a
        verdict was INCONCLUSIVE), 0 when it stayed HEALTHY through storms that aborted."""
        words = [v.verdict for v in self.verdicts]
        if any(w in BAD_VERDICTS for w in words):
            return ExitStatus.BAD
        if self.aborts == 0 or not words or any(w != "HEALTHY" for w in words):
            return ExitStatus.INCONCLUSIVE
        return ExitStatus.GOOD

    @property
    def status(self) -> str:
        status = self.exit_status
        if status == ExitStatus.BAD:
            return next(v.verdict for v in self.verdicts if v.verdict in BAD_VERDICTS).lower()
        if status == ExitStatus.INCONCLUSIVE:
            return "no-abort" if self.aborts == 0 else "inconclusive"
        return "healthy"

    def summary(self) -> str:
        status = self.exit_status
        if status == ExitStatus.BAD:
            return f"the target did not stay HEALTHY: {self.status.upper()} after cycle {self.cycles[-1].cycle}"
        if self.aborts == 0:
            return "the storm produced no abort (no kill reached a decode prealloc or transfer queue): it proves nothing"
        if status == ExitStatus.INCONCLUSIVE:
            return "a verdict was INCONCLUSIVE"
        return f"the target stayed HEALTHY through {len(self.cycles)} cycle(s) and {self.aborts} aborts"

    def to_frame(self) -> pd.DataFrame:
        return self.history

    def to_dict(self) -> dict[str, Any]:
        counts = self.history["outcome"].value_counts().to_dict() if len(self.history) else {}
        return {"summary": self.summary(), "plan": self.plan.to_dict(), "aborts": self.aborts,
                "outcomes": {k: int(v) for k, v in counts.items()},
                "cycles": [c.to_dict() for c in self.cycles]}

    def _rows(self) -> list[tuple[str, ...]]:
        return [(str(c.cycle), c.verdict.verdict, str(c.killed), str(c.aborts.get("prealloc", 0)),
                 str(c.aborts.get("transfer", 0)), str(c.prefill_abort_frames)) for c in self.cycles]

    HEADINGS = ("cycle", "verdict", "killed", "aborts in prealloc", "aborts in transfer", "ABORTs at prefill")

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"storm on {self.plan.deployment}")
        for heading in self.HEADINGS:
            table.add_column(heading)
        for row in self._rows():
            table.add_row(*row)
        colour = {ExitStatus.GOOD: "green", ExitStatus.BAD: "red"}.get(self.exit_status, "magenta")
        parts = [table, Text(self.summary(), style=f"bold {colour}")]
        if self.cycles and self.cycles[-1].verdict.verdict != "HEALTHY":
            parts.append(self.cycles[-1].verdict)
        return Group(*parts)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.HEADINGS)
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in self._rows())
        last = self.cycles[-1].verdict._repr_html_() if self.cycles else ""
        return (f"<b>storm on {html.escape(self.plan.deployment)}</b>: {html.escape(self.summary())}"
                f"<table><tr>{head}</tr>{rows}</table>{last}")
