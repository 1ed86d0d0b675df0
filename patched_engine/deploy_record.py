"""What a deploy or rollback did: the plan, each step, the liveness check, what each engine is left in, the outcome."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from forensics.exitcodes import BAD, GOOD, INCONCLUSIVE, INTERRUPTED, ExitStatus
from patched_engine.deploy_plan import DeployPlan
from patched_engine.remote_file import Step


@dataclass
class DeployRecord:
    """What a deploy or rollback did: the plan, each step, the liveness check, the outcome."""

    action: str  # deploy or rollback
    # planned, refused, deployed, already-patched, rolled-back, already-original, failed, not-live,
    # not-restarted (the restart line ran but the engine process is the old one), unconfirmed (which
    # file the engine runs cannot be told), interrupted (SIGINT/SIGTERM, acted on between two steps)
    status: str
    plan: DeployPlan
    steps: list[Step] = field(default_factory=list)
    liveness: dict[str, Any] | None = None
    message: str = ""
    problem: str | None = None
    # Per engine, what it is left in: "original (nothing written)", "patched on disk, not yet running", ...
    engine_states: dict[str, str] = field(default_factory=dict)
    running: dict[str, Any] = field(default_factory=dict)  # per engine: RunningCheck.to_dict() after the restart
    interrupted: dict[str, Any] | None = None  # signal, where it stopped, seconds from the signal to the stop

    @property
    def exit_status(self) -> int:
        """The exit contract's status; :data:`~forensics.exitcodes.INTERRUPTED` (130) after a signal."""
        if self.status in ("planned", "deployed", "already-patched", "rolled-back", "already-original"):
            return GOOD
        if self.status == "failed":
            return ExitStatus.ENVIRONMENT
        if self.status == "unconfirmed":
            return INCONCLUSIVE
        if self.status == "interrupted":
            return INTERRUPTED
        return BAD  # refused, not-live, not-restarted

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "outcome": self.status, "message": self.message, "problem": self.problem,
                **self.plan.to_dict(), "steps": [s.to_dict() for s in self.steps], "liveness": self.liveness,
                "engine_states": self.engine_states, "running": self.running, "interrupted": self.interrupted,
                "commands": self.plan.commands() if self.status == "planned" else None}

    def headline(self) -> str:
        return f"{self.action} {self.plan.deployment}: {self.status}" + (f" — {self.message}" if self.message else "")

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        style = {0: "green", 1: "red"}.get(int(self.exit_status), "yellow")
        parts: list[Any] = [Text(self.headline(), style=f"bold {style}")]
        for e in self.plan.engines:
            parts.append(Text(f"{e.label}: {e.path} ({e.kind}: {e.reason})"))
            if self.status in ("planned", "refused"):
                parts += [Text(f"  {i}. {a}") for i, a in enumerate(e.actions(), 1)]
        parts += [Text(f"warning: {w}", style="yellow") for w in self.plan.warnings()]
        if self.steps:
            table = Table("engine", "step", "state", "seconds", "detail")
            for s in self.steps:
                table.add_row(s.engine, s.name, s.state, f"{s.duration_s:.2f}", s.detail[:100])
            parts.append(table)
        if self.liveness is not None:
            parts.append(Text(f"liveness: {self.liveness.get('outcome')} after {self.liveness.get('waited_s')}s"))
        if self.status not in ("planned", "refused"):
            parts += [Text(f"{engine}: {state}") for engine, state in self.engine_states.items()]
        if self.problem:
            parts.append(Text(self.problem, style="red"))
        return Group(*parts)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(s.engine)}</td><td>{html.escape(s.name)}</td><td>{s.state}</td>"
                       f"<td>{s.duration_s:.2f}</td><td>{html.escape(s.detail[:200])}</td></tr>" for s in self.steps)
        warnings = "".join(f"<p style='color:#8a6d00'>warning: {html.escape(w)}</p>" for w in self.plan.warnings())
        warnings += "".join(f"<p>{html.escape(engine)}: {html.escape(state)}</p>"
                            for engine, state in self.engine_states.items())
        return (f"<p><b>{html.escape(self.headline())}</b></p>{warnings}<table><tr><th>engine</th><th>step</th>"
                f"<th>state</th><th>s</th><th>detail</th></tr>{rows}</table>")

