"""``Campaign``: the deploy (if any), each cycle's storm and checks, and the one answer.

The campaign is PASS only when every check of every cycle (and the deploy, when there
was one) passed; FAIL when any check failed; INCONCLUSIVE otherwise, naming what was
missing. It renders itself (``_repr_html_`` in a notebook, ``__rich__`` in a terminal),
gives its tables as frames (``checks``, ``history``) and saves itself for the report
(:meth:`Campaign.save`: ``campaign.json``, ``frames/*.parquet`` and each cycle's evidence
as a bundle).
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from forensics.exitcodes import EnvironmentProblem, ExitStatus

from .checks import CHECKS, COLOUR, FAIL, INCONCLUSIVE, PASS, STYLE, Check

SCHEMA = "pd-forensics-campaign/1"
CHECKS_COLUMNS = {"cycle": "Int64", "check": "string", "status": "string", "reason": "string",
                  "evidence_rows": "Int64"}
_EXIT = {PASS: ExitStatus.GOOD, FAIL: ExitStatus.BAD, INCONCLUSIVE: ExitStatus.INCONCLUSIVE}


@dataclass
class CycleReport:
    """One storm cycle and the checks after it."""

    cycle: int
    started: str  # ISO UTC
    checks: list[Check]
    storm: Any = field(default=None, repr=False)  # forensics.storm.CycleResult (None when the cycle could not run)
    history: pd.DataFrame | None = field(default=None, repr=False)
    problem: str | None = None  # why the cycle could not complete

    @property
    def status(self) -> str:
        return overall([c.status for c in self.checks])

    @property
    def evidence(self) -> Any:
        return getattr(self.storm, "evidence", None)

    @property
    def verdict(self) -> Any:
        return getattr(self.storm, "verdict", None)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        storm = self.storm.to_dict() if self.storm is not None else None
        return {"cycle": self.cycle, "started": self.started, "status": self.status, "problem": self.problem,
                "storm": storm, "checks": [c.to_dict() for c in self.checks]}


def overall(statuses: list[str]) -> str:
    """PASS only when there is something and all of it passed; FAIL over INCONCLUSIVE."""
    if FAIL in statuses:
        return FAIL
    if not statuses or any(s != PASS for s in statuses):
        return INCONCLUSIVE
    return PASS


@dataclass
class Campaign:
    deployment: str
    target: str | None  # the inventory path, when there was one
    options: dict[str, Any]
    cycles_planned: int
    cycles: list[CycleReport] = field(default_factory=list)
    deploy: Check | None = None  # the deploy step as a check (None without --deploy)
    deploy_record: Any = field(default=None, repr=False)  # patched_engine.deploy.DeployRecord
    started: str | None = None
    finished: str | None = None
    duration_s: float | None = None
    stopped: str | None = None  # why the campaign ended before its last cycle

    # ------------------------------------------------------------------ the answer

    @property
    def checks(self) -> list[Check]:
        return ([self.deploy] if self.deploy is not None else []) + [c for cy in self.cycles for c in cy.checks]

    @property
    def status(self) -> str:
        statuses = [c.status for c in self.checks]
        if not self.cycles:
            statuses.append(INCONCLUSIVE)
        return overall(statuses)

    @property
    def exit_status(self) -> ExitStatus:
        return _EXIT[self.status]

    @property
    def kill_chain(self) -> list[str]:
        """The diagnosis's kill chain of the first failing check that has one."""
        return next((c.kill_chain for c in self.checks if c.status == FAIL and c.kill_chain), [])

    @property
    def aborts(self) -> int:
        return sum(cy.storm.abort_count for cy in self.cycles if cy.storm is not None)

    def summary(self) -> str:
        status = self.status
        done = len(self.cycles)
        if status == PASS:
            return (f"PASS: every check passed over {done} cycle(s) and {self.aborts} abort(s)"
                    + (" after the deploy" if self.deploy is not None else ""))
        first = next(c for c in self.checks if c.status == status) if self.checks else None
        where = (f"cycle {first.cycle} {first.name}" if first is not None and first.cycle is not None
                 else first.name if first is not None else "no cycle")
        reason = first.reason if first is not None else (self.stopped or "nothing ran")
        return f"{status}: {where}: {reason}"

    # ------------------------------------------------------------------ frames and JSON

    def checks_frame(self) -> pd.DataFrame:
        checks = self.checks
        data = {
            "cycle": pd.array([c.cycle for c in checks], dtype="Int64"),
            "check": pd.array([c.name for c in checks], dtype="string"),
            "status": pd.array([c.status for c in checks], dtype="string"),
            "reason": pd.array([c.reason for c in checks], dtype="string"),
            "evidence_rows": pd.array([len(c.evidence) for c in checks], dtype="Int64"),
        }
        return pd.DataFrame(data)

    def history(self) -> pd.DataFrame:
        from forensics.storm import history

        parts = [cy.history for cy in self.cycles if cy.history is not None]
        return pd.concat(parts, ignore_index=True) if parts else history.empty()

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        return {"checks": self.checks_frame(), "history": self.history()}

    def to_frame(self) -> pd.DataFrame:
        return self.checks_frame()

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "summary": self.summary(), "deployment": self.deployment, "target": self.target,
                "campaign": self.status, "kill_chain": self.kill_chain, "aborts": self.aborts,
                "cycles_planned": self.cycles_planned, "cycles_run": len(self.cycles), "stopped": self.stopped,
                "started": self.started, "finished": self.finished, "duration_s": self.duration_s,
                "options": dict(self.options),
                "deploy": ({"check": self.deploy.to_dict(),
                            "record": self.deploy_record.to_dict() if self.deploy_record is not None else None}
                           if self.deploy is not None else None),
                "cycles": [cy.to_dict() for cy in self.cycles]}

    def save(self, out: str | os.PathLike[str]) -> Path:
        """Write the campaign into the folder ``out`` (created; must be empty or absent).

        ``campaign.json`` (this document), ``frames/checks.parquet`` and ``frames/history.parquet``,
        and each cycle's evidence as a bundle under ``cycles/<n>/`` (``fx.bundle.open`` reads it).
        ``campaign.json`` is written last: a folder without it is a save that did not finish.
        """
        from forensics import bundle
        from forensics.jsonable import encode_json

        out = Path(out)
        try:
            if out.exists() and (not out.is_dir() or any(out.iterdir())):
                raise EnvironmentProblem(f"{out}: exists and is not an empty folder (a campaign is never written "
                                         "over another)", path=str(out))
            (out / "frames").mkdir(parents=True, exist_ok=True)
            files = {}
            for name, frame in self.frames.items():
                path = out / "frames" / f"{name}.parquet"
                frame.to_parquet(path, engine="pyarrow", index=False)
                files[name] = {"file": f"frames/{name}.parquet", "rows": len(frame)}
            bundles = {}
            for cy in self.cycles:
                if cy.evidence is not None:
                    folder = out / "cycles" / str(cy.cycle)
                    bundle.write(cy.evidence, folder)
                    bundles[str(cy.cycle)] = f"cycles/{cy.cycle}"
            doc = dict(self.to_dict(), frames=files, bundles=bundles)
            tmp = out / "campaign.json.tmp"
            tmp.write_bytes(encode_json(doc) + b"\n")
            os.replace(tmp, out / "campaign.json")
        except PermissionError as exc:
            raise EnvironmentProblem(f"{exc.filename or out}: cannot write the campaign: {exc.strerror}",
                                     path=str(out)) from None
        return out

    @staticmethod
    def load_document(folder: str | os.PathLike[str]) -> dict[str, Any]:
        """The saved ``campaign.json`` of a folder written by :meth:`save`."""
        return json.loads((Path(folder) / "campaign.json").read_text(encoding="utf-8"))

    # ------------------------------------------------------------------ rendering

    def _grid(self) -> list[tuple[str, list[Check | None]]]:
        rows = []
        for cy in self.cycles:
            by_name = {c.name: c for c in cy.checks}
            rows.append((str(cy.cycle), [by_name.get(name) for name in CHECKS]))
        return rows

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"validation campaign on {self.deployment}")
        table.add_column("cycle")
        for name in CHECKS:
            table.add_column(name)
        table.add_column("aborts")
        for (cycle, checks), cy in zip(self._grid(), self.cycles, strict=True):
            cells = [Text(c.status if c else "-", style=STYLE[c.status] if c else "") for c in checks]
            table.add_row(cycle, *cells, str(cy.storm.abort_count) if cy.storm is not None else "-")
        parts: list[Any] = []
        if self.deploy is not None:
            parts.append(self.deploy)
        parts += [table, Text(self.summary(), style=STYLE[self.status])]
        parts += [c for c in self.checks if c.status != PASS and c is not self.deploy]
        if self.kill_chain:
            parts.append(Text("Kill chain", style="bold"))
            parts += [Text(f"{i}. {step}") for i, step in enumerate(self.kill_chain, 1)]
        return Group(*parts)

    def _repr_html_(self) -> str:
        head = "<tr><th>cycle</th>" + "".join(f"<th>{n}</th>" for n in CHECKS) + "<th>aborts</th></tr>"
        body = ""
        for (cycle, checks), cy in zip(self._grid(), self.cycles, strict=True):
            cells = "".join(
                f"<td style='color:{COLOUR[c.status]}' title='{html.escape(c.reason, quote=True)}'>{c.status}</td>"
                if c else "<td>-</td>" for c in checks)
            aborts = str(cy.storm.abort_count) if cy.storm is not None else "-"
            body += f"<tr><td>{cycle}</td>{cells}<td>{aborts}</td></tr>"
        parts = [f"<h4 style='color:{COLOUR[self.status]}'>{self.status} "
                 f"<small>validation campaign on {html.escape(self.deployment)}</small></h4>",
                 f"<p>{html.escape(self.summary())}</p>"]
        if self.deploy is not None:
            parts.append(f"<p>{self.deploy._repr_html_()}</p>")
        parts.append(f"<table>{head}{body}</table>")
        others = [c for c in self.checks if c.status != PASS and c is not self.deploy]
        if others:
            parts.append("<ul>" + "".join(f"<li>cycle {c.cycle}: {c._repr_html_()}</li>" for c in others) + "</ul>")
        if self.kill_chain:
            parts.append("<b>Kill chain</b><ol>" + "".join(f"<li>{html.escape(s)}</li>" for s in self.kill_chain)
                         + "</ol>")
        return "".join(parts)
