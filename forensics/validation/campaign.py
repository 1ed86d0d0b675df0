"""``validate``: optional deploy, then N storm cycles, each followed by the four checks.

    campaign = fx.validate("inventory.toml", deploy=True, yes=True, cycles=3)
    campaign.status        # PASS | FAIL | INCONCLUSIVE
    campaign               # renders itself in a notebook

Each cycle is one :func:`forensics.storm.run_storm` cycle (its collection and diagnosis are
the evidence of the checks), preceded by a scrape of the decode's counters (the metrics
check's baseline). The campaign stops after the first cycle with a failing check (a wedged
target has nothing more to tell) and after a cycle that could not complete (the reason is
every check's reason). Like the storm, a deployment that is not a twin needs ``yes=True``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pandas as pd

from forensics.exitcodes import ForensicsError, UsageProblem

from . import checks as checks_mod
from .checks import FAIL, INCONCLUSIVE, PASS, Check
from .result import Campaign, CycleReport

Progress = Callable[[dict], None]  # the storm's progress fields, plus {"stage": "deploy" | "checks"}
DEFAULT_LIVENESS_DEADLINE_S = 180.0
_STORM_OPTIONS = ("phase", "waves", "wave_interval", "prompt_tokens", "max_tokens", "mode", "session_timeout",
                  "settle", "sample_s")


def validate(target: Any, *, deploy: bool = False, yes: bool = False, restart_decodes: bool | None = None,
             cycles: int = 1, sessions: int = 60,
             kill_after: Any = 0.0, probe_deadline_s: float | None = None, collect_options: dict | None = None,
             liveness_deadline_s: float = DEFAULT_LIVENESS_DEADLINE_S, progress: Progress | None = None,
             **storm_options: Any) -> Campaign:
    """Run a validation campaign against ``target`` (inventory path, Inventory or twin).

    ``deploy``: first deploy the patched engine (``patched_engine.deploy``; restart and
    liveness included; ``restart_decodes`` as there). ``probe_deadline_s``: the liveness probe's deadline after each cycle
    (the collection's default otherwise). Other options are the storm's (``phase``,
    ``prompt_tokens``, ``max_tokens``, ``mode``, ``sample_s``, ...).

    Example: ``fx.validate(twin, deploy=True, cycles=2, sessions=6).status``
    """
    from forensics.collection.run import as_inventory
    from forensics.storm import ConfirmationNeeded, run_storm
    from forensics.storm.runner import make_plan

    unknown = sorted(set(storm_options) - set(_STORM_OPTIONS))
    if unknown:
        raise UsageProblem(f"validate: unknown option(s) {', '.join(unknown)}")
    if not isinstance(cycles, int) or isinstance(cycles, bool) or cycles < 1:
        raise UsageProblem(f"cycles: expected a positive integer, got {cycles!r}")
    plan = make_plan(target, sessions=sessions, kill_after=kill_after, cycles=cycles, **storm_options)
    if not plan.twin and not yes:
        raise ConfirmationNeeded(plan)
    inventory = as_inventory(target)
    options = {"sessions": sessions, "kill_after_s": plan.kill_after_s, **{k: v for k, v in storm_options.items()},
               "probe_deadline_s": probe_deadline_s, "deploy": deploy}
    collect = dict(collect_options or {})
    if probe_deadline_s is not None:
        collect["deadlines_s"] = {**collect.get("deadlines_s", {}), "liveness": float(probe_deadline_s)}
    source = inventory.path if inventory.path is not None else target
    campaign = Campaign(deployment=inventory.name, target=str(inventory.path) if inventory.path else None,
                        options=options, cycles_planned=cycles,
                        started=pd.Timestamp.now(tz="UTC").isoformat())
    began = time.monotonic()
    try:
        if deploy:
            _tell(progress, stage="deploy")
            campaign.deploy, campaign.deploy_record = _deploy(source, yes=yes, deadline_s=liveness_deadline_s,
                                                                 restart_decodes=restart_decodes)
            if campaign.deploy.status != PASS:
                campaign.stopped = "the deploy did not succeed: no storm was run"
                return campaign
        for cycle in range(1, cycles + 1):
            started = pd.Timestamp.now(tz="UTC")
            before = checks_mod.baseline(inventory)
            wrapped = None if progress is None else (lambda info, n=cycle: progress({**info, "cycle": n}))
            try:
                result = run_storm(source, yes=yes, progress=wrapped, collect_options=collect, sessions=sessions,
                                   kill_after=plan.kill_after_s, cycles=1, **storm_options)
            except UsageProblem:
                raise
            except ForensicsError as exc:
                reason = f"the cycle could not complete: {type(exc).__name__}: {exc}"
                campaign.cycles.append(CycleReport(cycle, started.isoformat(), _all_undecided(reason, cycle),
                                                   problem=reason))
                campaign.stopped = reason
                break
            storm = result.cycles[0]
            storm.cycle = cycle  # each cycle is its own one-cycle storm: number it in the campaign
            history = result.history.copy()
            history["cycle"] = pd.array([cycle] * len(history), dtype="Int64")
            _tell(progress, cycle=cycle, stage="checks")
            report = CycleReport(cycle, storm.started, run_checks(storm, before), storm=storm, history=history)
            campaign.cycles.append(report)
            if report.status == FAIL:
                if cycle < cycles:
                    campaign.stopped = f"cycle {cycle} failed: the remaining cycles were not run"
                break
    finally:
        campaign.finished = pd.Timestamp.now(tz="UTC").isoformat()
        campaign.duration_s = round(time.monotonic() - began, 3)
    return campaign


def run_checks(storm_cycle: Any, before: dict[str, Any] | None) -> list[Check]:
    """The four checks of one storm cycle (a :class:`forensics.storm.CycleResult`)."""
    storm_cycle_no = storm_cycle.cycle
    out = []
    for name, check in (("liveness", checks_mod.liveness), ("logs", checks_mod.logs),
                        ("threads", checks_mod.threads), ("metrics", lambda c: checks_mod.metrics(c, before))):
        try:
            out.append(check(storm_cycle))
        except Exception as exc:  # noqa: BLE001 - a check that cannot read its evidence decides nothing
            out.append(Check(name, INCONCLUSIVE, f"the evidence could not be read: {type(exc).__name__}: {exc}",
                             cycle=storm_cycle_no))
    return out


def _all_undecided(reason: str, cycle: int) -> list[Check]:
    return [Check(name, INCONCLUSIVE, reason, cycle=cycle) for name in checks_mod.CHECKS]


def _deploy(source: Any, *, yes: bool, deadline_s: float, restart_decodes: bool | None = None) -> tuple[Check, Any]:
    from patched_engine import deploy as deploy_mod

    try:
        record = deploy_mod.deploy(source, yes=yes, restart_decodes=restart_decodes, liveness_deadline_s=deadline_s)
    except ForensicsError as exc:
        return Check("deploy", INCONCLUSIVE, f"the deploy could not run: {type(exc).__name__}: {exc}"), None
    steps = pd.DataFrame([{"step": s.name, "engine": getattr(s, "engine", None), "state": s.state}
                          for s in record.steps]) if record.steps else pd.DataFrame()
    if record.status in ("deployed", "already-patched"):
        return Check("deploy", PASS, f"{record.status}: {record.message}", steps), record
    if record.status == "planned":
        return Check("deploy", INCONCLUSIVE, f"plan only: {record.message}", steps), record
    if record.status == "unconfirmed":  # written and live, but which file the engine runs cannot be told
        return Check("deploy", INCONCLUSIVE, f"{record.status}: {record.message}", steps), record
    why = record.problem or record.message or record.status
    return Check("deploy", FAIL, f"{record.status}: {why}", steps), record


def _tell(progress: Progress | None, **fields: Any) -> None:
    if progress is not None:
        progress(fields)
