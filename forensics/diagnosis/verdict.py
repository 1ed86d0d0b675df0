"""``Verdict``: the diagnosis's answer, with its reasons, kill chain and signals."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from forensics.evidence import Gap
from forensics.exitcodes import ExitStatus

from .signals import Signal

VERDICTS = ("HEALTHY", "WEDGED", "DEGRADED", "DOWN", "INCONCLUSIVE")
_EXIT = {"HEALTHY": ExitStatus.GOOD, "WEDGED": ExitStatus.BAD, "DEGRADED": ExitStatus.BAD,
         "DOWN": ExitStatus.BAD, "INCONCLUSIVE": ExitStatus.INCONCLUSIVE}
_COLOUR = {"HEALTHY": "green", "WEDGED": "red", "DEGRADED": "yellow", "DOWN": "red", "INCONCLUSIVE": "magenta"}


@dataclass
class Verdict:
    verdict: str
    reasons: list[str]
    kill_chain: list[str] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)  # what was missing (INCONCLUSIVE names the ones that mattered)
    deployment: str | None = None
    at: str | None = None  # ISO time of the evidence (collection time)
    next_steps: list[str] = field(default_factory=list)  # what to do now, most urgent first (nextsteps.py)
    sources_read: list[str] = field(default_factory=list)  # the signal sources whose evidence was there to read

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    @property
    def exit_status(self) -> ExitStatus:
        return _EXIT[self.verdict]

    @property
    def status(self) -> str:
        return self.verdict.lower()

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (after the common ``status`` and ``exit``)."""
        return {
            "verdict": self.verdict,
            "deployment": self.deployment,
            "at": self.at,
            "reasons": list(self.reasons),
            "kill_chain": list(self.kill_chain),
            "signals": [s.to_dict() for s in self.signals],
            "gaps": [g.to_dict() for g in self.gaps],
            "next_steps": list(self.next_steps),
            "sources_read": list(self.sources_read),
        }

    def lines(self) -> list[str]:
        out = [f"{self.verdict}" + (f": {self.deployment}" if self.deployment else "")]
        out += [f"  - {r}" for r in self.reasons]
        if self.kill_chain:
            out.append("Kill chain:")
            out += [f"  {i}. {step}" for i, step in enumerate(self.kill_chain, 1)]
        if self.signals:
            out.append("Signals:")
            out += [f"  [{s.source}] {s.engine}: {s.says}" for s in self.signals]
        if self.gaps:
            out.append("Not collected:")
            out += [f"  {g}" for g in self.gaps]
        if self.next_steps:
            out.append("Next:")
            out += [f"  {i}. {step}" for i, step in enumerate(self.next_steps, 1)]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def terse(self, width: int = 80):
        """The terminal's default view: at most 24 lines at 80 columns (``terse.py``); a rich renderable."""
        from rich.console import Group
        from rich.text import Text

        from .terse import terse_lines

        return Group(*(Text(line, style=style, no_wrap=True, overflow="ignore")
                       for line, style in terse_lines(self, width, f"bold {_COLOUR[self.verdict]}")))

    def __rich__(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.text import Text

        colour = _COLOUR[self.verdict]
        body = [Text(r) for r in self.reasons]
        if self.kill_chain:
            body.append(Text("\nKill chain", style="bold"))
            body += [Text(f"{i}. {step}") for i, step in enumerate(self.kill_chain, 1)]
        if self.signals:
            body.append(Text("\nSignals", style="bold"))
            body += [Text(f"[{s.source}] {s.engine}: {s.says}", style="dim" if s.kind == "context" else "")
                     for s in self.signals]
        if self.gaps:
            body.append(Text("\nNot collected", style="bold"))
            body += [Text(str(g), style="yellow") for g in self.gaps]
        if self.next_steps:
            body.append(Text("\nNext", style="bold"))
            body += [Text(f"{i}. {step}") for i, step in enumerate(self.next_steps, 1)]
        title = Text(self.verdict, style=f"bold {colour}")
        return Panel(Group(*body), title=title, subtitle=self.deployment or None, expand=False)

    def _repr_html_(self) -> str:
        colour = {"green": "#2e7d32", "red": "#c62828", "yellow": "#ef6c00", "magenta": "#6a1b9a"}[_COLOUR[self.verdict]]
        parts = [f"<h4 style='color:{colour}'>{self.verdict}"
                 + (f" <small>{html.escape(self.deployment)}</small>" if self.deployment else "") + "</h4>"]
        parts.append("<ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in self.reasons) + "</ul>")
        if self.kill_chain:
            parts.append("<b>Kill chain</b><ol>" + "".join(f"<li>{html.escape(s)}</li>" for s in self.kill_chain) + "</ol>")
        if self.signals:
            rows = "".join(f"<tr><td>{html.escape(s.source)}</td><td>{html.escape(s.engine)}</td>"
                           f"<td>{html.escape(s.name)}</td><td>{html.escape(s.says)}</td></tr>" for s in self.signals)
            parts.append("<table><tr><th>source</th><th>engine</th><th>signal</th><th>says</th></tr>" + rows + "</table>")
        if self.gaps:
            parts.append("<b>Not collected</b><ul>" + "".join(f"<li>{html.escape(str(g))}</li>" for g in self.gaps) + "</ul>")
        if self.next_steps:
            parts.append("<b>Next</b><ol>" + "".join(f"<li>{html.escape(s)}</li>" for s in self.next_steps) + "</ol>")
        return "".join(parts)
