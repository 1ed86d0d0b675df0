"""What a storm will do, shown before it does it (a live deployment needs ``yes=True`` / ``--yes``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from forensics.exitcodes import Undecided


@dataclass(frozen=True)
class StormPlan:
    deployment: str
    router: str
    twin: bool
    sessions: int
    waves: int
    wave_interval_s: float
    prompt_tokens: int
    max_tokens: int
    phase: str
    kill_after_s: float
    mode: str
    cycles: int
    session_timeout_s: float
    settle_s: float
    sample_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        kind = "twin" if self.twin else "LIVE deployment"
        return [
            f"storm plan for {self.deployment} ({kind}), router {self.router}:",
            f"  {self.cycles} cycle(s) of {self.sessions} streaming chat completions ({self.waves} wave(s), "
            f"{self.wave_interval_s:g}s apart), {self.prompt_tokens} prompt tokens, up to {self.max_tokens} output tokens",
            f"  the nemesis kills the clients in phase '{self.phase}' {self.kill_after_s:g}s after each wave starts"
            + (", then each session the moment the decode is seen holding it with its KV pending"
               if self.phase == "kv" else "")
            + f" ({'socket reset (RST) in-process' if self.mode == 'rst' else 'SIGKILL of the client processes'})",
            f"  after each cycle: wait {self.settle_s:g}s, then collect ({self.sample_s:g}s sampling) and diagnose",
            "  on sglang 0.5.13 to 0.5.15.post1 with NIXL and no patch, this is expected to WEDGE the deployment",
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())


class ConfirmationNeeded(Undecided):
    """A storm against a live deployment without ``yes=True``: nothing was sent (exit 3)."""

    word = "planned"

    def __init__(self, plan: StormPlan) -> None:
        super().__init__(f"{plan.deployment} is not a twin: a storm can wedge it; "
                         "shown the plan only, run again with --yes (yes=True) to storm it")
        self.plan = plan
