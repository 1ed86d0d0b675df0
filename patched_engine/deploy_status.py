"""``patch status``: per prefill engine, what is on disk and whether the running engine loaded it.

On disk, named by its bytes (:func:`patched_engine.baselines.classify`): ``original`` (the
release's own file), ``cpu-adapted`` (that file with the CPU adaptation, in an engine
environment of this machine), ``patched`` (this deployer's fix; ``base`` says on which file:
``original`` or ``cpu-adapted``, None when its bytes are the fix on neither), ``unknown``
(anything else, the DRAM-adapted bytes outside an engine environment too) or ``unreadable``.
For a patched file the running engine is asked too (:mod:`patched_engine.running`): its
processes must have started after the file changed, else the engine still runs the file that
was there before (``patched-not-running``: a deploy stopped between its write and its
restart, or a restart line that restarts nothing); when that cannot be told,
``patched-unconfirmed``.

Exit status: 0 when every engine runs the fix; 1 when one does not (original, cpu-adapted,
unknown, patched-not-running); 3 when it cannot be told for some engine and none is known not to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forensics.exitcodes import BAD, GOOD, INCONCLUSIVE, EnvironmentProblem, ExitStatus
from patched_engine.baselines import BASE_TEXT, Release
from patched_engine.deploy_plan import load_inventory, plan_engine
from patched_engine.running import EARLIER_FILE, NO_PROCESS, THIS_FILE, check_running

# decided: this engine does not run the fix (an adapted file is the release's file on this CPU, unfixed)
NOT_RUNNING_FIX = ("original", "cpu-adapted", "unknown", "patched-not-running")
UNDECIDED_STATES = ("unreadable", "patched-unconfirmed")


@dataclass
class EngineStatus:
    engine: str
    label: str
    # original, cpu-adapted, patched, patched-not-running, patched-unconfirmed, unknown, unreadable
    state: str
    file: str | None = None
    base: str | None = None  # a patched file's: "original" or "cpu-adapted" (None: neither, or not patched)
    release: str | None = None
    patch_id: str | None = None
    sha256: str | None = None
    reason: str = ""
    backups: list[str] = field(default_factory=list)
    running: dict[str, Any] | None = None  # RunningCheck.to_dict(): processes, the file's change time, verdict

    @property
    def text(self) -> str:
        """The state as a person reads it: "patched (on the CPU-adapted file)"."""
        if self.state.startswith("patched") and self.base in BASE_TEXT:
            return f"{self.state} (on {BASE_TEXT[self.base]})"
        return self.state

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "text": self.text}


@dataclass
class StatusReport:
    deployment: str
    engines: list[EngineStatus]

    @property
    def exit_status(self) -> ExitStatus:
        if not self.engines or any(e.state in NOT_RUNNING_FIX for e in self.engines):
            return BAD
        if any(e.state in UNDECIDED_STATES for e in self.engines):
            return INCONCLUSIVE
        return GOOD

    @property
    def word(self) -> str:
        if int(self.exit_status) == 1 and all(e.state in ("patched", "patched-not-running") for e in self.engines):
            return "patched-not-running"
        return {0: "patched", 1: "not-patched", 3: "inconclusive"}[int(self.exit_status)]

    def to_dict(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "engines": [e.to_dict() for e in self.engines]}

    def __rich__(self):
        from rich.table import Table

        table = Table("engine", "state", "patch", "release", "file", "reason", title=f"{self.deployment}: {self.word}")
        for e in self.engines:
            table.add_row(e.label, e.text, e.patch_id or "", e.release or "", e.file or "", e.reason)
        return table


def _running_state(reason: str, verdict: str) -> tuple[str, str]:
    if verdict == THIS_FILE:
        return "patched", reason
    if verdict in (EARLIER_FILE, NO_PROCESS):
        return "patched-not-running", (f"patched on disk, not yet running: {reason}; `forensics patch deploy "
                                       "--inventory FILE --yes` resumes with the restart")
    return "patched-unconfirmed", f"patched on disk; whether the running engine loaded it cannot be told: {reason}"


def status(source: Any) -> StatusReport:
    """Per prefill engine: what its file is, and (for a patched one) whether the running engine loaded it."""
    inv, _ = load_inventory(source)
    engines = []
    cache: dict[str, Release | Exception] = {}
    try:
        for engine in inv.engines_with("prefill"):
            try:
                plan = plan_engine(inv, engine, release_cache=cache, codemod=False)
            except EnvironmentProblem as exc:
                engines.append(EngineStatus(engine.name, engine.label, "unreadable", reason=str(exc)))
                continue
            state = {"patched": "patched", "original": "original", "cpu-adapted": "cpu-adapted"}.get(plan.kind,
                                                                                                    "unknown")
            if plan.kind == "fork" and plan.release_sha256 is None:
                state = "unreadable"  # the release's file could not be had: undecided, not "unknown"
            reason = plan.reason
            running = check_running(inv, engine, plan.located)
            if state == "patched":
                state, why = _running_state(running.reason, running.verdict)
                reason = f"{plan.reason}; {why}"
            engines.append(EngineStatus(
                engine.name, engine.label, state, file=plan.path, base=plan.base if state.startswith("patched") else None,
                release=plan.release, patch_id=plan.patch_id,
                sha256=plan.sha256_before, reason=reason,
                backups=[b["path"] for b in plan.located.file.get("backups", [])], running=running.to_dict()))
    finally:
        inv.close_hosts()
    return StatusReport(inv.name, engines)
