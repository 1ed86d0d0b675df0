"""``patch rollback``: each prefill's newest backup back, byte for byte, if it is the release's own file.

The backup beside the file and its record are the deploy's own writing, but they sit in a
directory others can write: the record's ``sha256`` is no trust anchor (edit the backup,
edit the record to match, and a rollback would install the edit). So the backup's bytes
must also be one of the release's accepted baselines
(:func:`patched_engine.baselines.accepted_baselines`: the wheel's ``nixl/conn.py``,
fetched and checked against the wheel's RECORD, and in an engine environment of this machine
that file with its CPU adaptation, whose own sha256 the rollback checks the same way). Anything else (a fork deployed with
``--force``, a tampered backup) is refused, naming the backup and both hashes, unless
``force=True``; a wheel that cannot be had is exit 4 unless ``force=True``.

Then the same atomic write as the deploy, the bytecode removed, the restart, liveness, and
the check that the engine runs the restored file. SIGINT/SIGTERM wait for the step in
progress, as in the deploy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forensics.exitcodes import EnvironmentProblem
from patched_engine import remote_file
from patched_engine.baselines import accepted_baselines
from patched_engine.deploy_plan import EnginePlan, load_inventory
from patched_engine.deploy_record import DeployRecord
from patched_engine.deploy_steps import (
    confirm_running,
    finish_engine,
    interrupted_record,
    locate_step,
    not_live,
    planned,
    restart_blocking_decodes,
    wait_liveness,
    write_engine,
)
from patched_engine.interrupts import DeferredInterrupts, Interrupted
from patched_engine.remote_file import Recorder, Step, StepFailed
from patched_engine.running import EARLIER_FILE, NO_PROCESS, THIS_FILE

DEFAULT_LIVENESS_DEADLINE_S = 600.0
DEFAULT_RESTART_TIMEOUT_S = 600.0
PATCHED_UNTOUCHED = "patched: nothing restored"
RESTORED_ON_DISK = "restored on disk, not yet running (not restarted)"
RESTORED_RESTARTED = "restored and restarted (liveness not checked yet)"


def chosen_backup(plan: EnginePlan) -> dict[str, Any] | None:
    """The newest backup of this file whose record names it and whose sha256 matches the record."""
    good = [b for b in plan.located.file.get("backups", [])
            if b.get("recorded") and b["recorded"].get("sha256") == b["sha256"]
            and b["recorded"].get("of") == plan.path]
    return good[-1] if good else None


def backup_trust(plan: EnginePlan, backup: dict[str, Any]) -> tuple[str, str]:
    """("accepted", what it is) when the backup's bytes are a baseline of the release; else
    ("foreign" or "unverifiable", why), naming the backup and both hashes."""
    digest = backup["sha256"]
    if plan.release is None or plan.release_sha256 is None:
        return "unverifiable", (f"{backup['path']} (sha256 {digest}) cannot be checked against the release's wheel: "
                                f"{plan.reason}")
    baselines = accepted_baselines(plan.release, plan.wheel, plan.located.path, local=plan.local)
    if digest in baselines:
        return "accepted", f"{backup['path']}: sha256 {digest[:12]}…, {baselines[digest]}"
    recorded = backup["recorded"].get("kind")
    claims = f"; its record says kind {recorded!r}, but a record is no proof" if recorded else ""
    wanted = " nor ".join(f"{known} ({what})" for known, what in baselines.items())
    return "foreign", f"{backup['path']} has sha256 {digest}, not {wanted}{claims}"


def _interrupted(inv, record: DeployRecord, exc: Interrupted, restarted: list[EnginePlan],
                 on_step: Callable[[Step], None] | None) -> DeployRecord:
    return interrupted_record(inv, record, exc, restarted, on_step=on_step,
                       states={THIS_FILE: "runs the restored file", EARLIER_FILE: RESTORED_ON_DISK,
                               NO_PROCESS: "restored on disk; no engine process running"})


def rollback(source: Any, *, yes: bool = False, force: bool = False, restart_decodes: bool | None = None,
             liveness_deadline_s: float = DEFAULT_LIVENESS_DEADLINE_S,
             restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
             on_step: Callable[[Step], None] | None = None) -> DeployRecord:
    """Put each prefill's newest verified backup back, byte for byte; restart; wait for liveness.

    ``force``: restore a backup that is not the release's own file (after reading why).
    ``restart_decodes`` as for :func:`patched_engine.deploy.deploy`."""
    remote_file.check_kill_env()
    inv, path = load_inventory(source)
    try:
        record = planned("rollback", inv, path, restart_decodes)
        plan = record.plan
        chosen: dict[str, dict[str, Any]] = {}
        missing, foreign, unverifiable = [], [], []
        for e in plan.engines:
            if e.kind != "patched":
                continue  # the release's own file, or a fork nobody patched: nothing of ours to undo
            backup = chosen_backup(e)
            if backup is None:
                missing.append(f"{e.label}: {e.path} is patched but no backup with a matching record is beside it")
                continue
            trust, why = backup_trust(e, backup)
            if trust == "foreign" and not force:
                foreign.append(f"{e.label}: {why}")
            elif trust == "unverifiable" and not force:
                unverifiable.append(f"{e.label}: {why}")
            chosen[e.engine] = {**backup, "trust": trust, "why": why}
        if missing or foreign:
            record.status = "refused"
            record.message = "; ".join(missing + foreign) + ("; nothing restored" + (
                ". Pass --force (force=True) to restore it anyway" if foreign else ""))
            return record
        if unverifiable:
            record.status = "failed"
            record.problem = "; ".join(unverifiable) + "; nothing restored. Pass --force (force=True) to restore it unchecked"
            return record
        if not chosen:
            record.status = "already-original"
            record.message = "no prefill engine differs from its backup: nothing to roll back"
            return record
        blocked = [e for e in plan.engines if e.engine in chosen and e.blocked]
        if blocked:
            record.status = "failed"
            record.problem = "; ".join(f"{e.label}: cannot write: {e.blocked}" for e in blocked) + "; nothing restored"
            return record
        if not (yes or plan.twin):
            record.message = ("plan only: would restore " + ", ".join(f"{b['why']} over {e.path}" for e in plan.engines
                                                                      if (b := chosen.get(e.engine)))
                              + "; pass --yes (yes=True)")
            return record
        record.engine_states = {e.engine: PATCHED_UNTOUCHED for e in plan.engines if e.engine in chosen}
        restarted: list[EnginePlan] = []
        with DeferredInterrupts("rollback") as interrupts:
            try:
                for e in plan.engines:
                    backup = chosen.get(e.engine)
                    if backup is None:
                        continue
                    interrupts.checkpoint(f"before {e.label}")
                    rec = Recorder(inv.host_for(inv.engine_named(e.engine)), e.engine, sudo=e.sudo,
                                   steps=record.steps, on_step=on_step)
                    record.steps.append(locate_step(e))
                    with rec.step("read and check the backup") as step:
                        data = rec.host.read_file(backup["path"])
                        digest = remote_file.sha256(data)
                        if digest != backup["sha256"]:
                            raise StepFailed(f"{e.label}: {backup['path']} sha256 {digest[:12]}… is not the "
                                             f"{backup['sha256'][:12]}… checked a moment ago; nothing restored")
                        step.detail = backup["why"] + ("" if backup["trust"] == "accepted" else " (--force)")
                    write_engine(rec, e, data, backup=False, checkpoint=interrupts.checkpoint)
                    record.engine_states[e.engine] = RESTORED_ON_DISK
                    if finish_engine(rec, e, restart_timeout_s=restart_timeout_s, checkpoint=interrupts.checkpoint):
                        restarted.append(e)
                        record.engine_states[e.engine] = RESTORED_RESTARTED
                if plan.restart_decodes and restarted:
                    restart_blocking_decodes(inv, plan, record, restart_timeout_s=restart_timeout_s, on_step=on_step,
                                             checkpoint=interrupts.checkpoint)
                interrupts.checkpoint("before the liveness check")
                record.liveness = wait_liveness(inv, liveness_deadline_s, interrupts.checkpoint)
            except Interrupted as exc:
                return _interrupted(inv, record, exc, restarted, on_step)
            except (StepFailed, EnvironmentProblem) as exc:
                record.status = "failed"
                record.problem = str(exc)
                return record
        if record.liveness["outcome"] != "ok":
            record.status = "not-live"
            record.message = not_live(record,
                                      f"restored, but liveness failed {record.liveness['waited_s']}s after the restart")
        else:
            record.status = "rolled-back"
            record.message = f"restored {len(chosen)} prefill engine(s) from their backups; liveness ok"
        stale = []
        for e in plan.engines:
            if e.engine not in chosen:
                continue
            rec = Recorder(inv.host_for(inv.engine_named(e.engine)), e.engine, sudo=e.sudo, steps=record.steps,
                           on_step=on_step)
            check = confirm_running(inv, rec, e)
            record.running[e.engine] = check.to_dict()
            record.engine_states[e.engine] = "runs the restored file" if check.verdict == THIS_FILE else (
                f"restored on disk; {check.reason}")
            if check.verdict in (EARLIER_FILE, NO_PROCESS):
                how = f"the restart line `{' '.join(e.restart)}` did not restart it" if e.restart else "no restart line"
                stale.append(f"{e.label}: restored, but {how}: {check.reason}; it still runs the patched file")
        if stale:
            record.status = "not-restarted"
            record.message = "; ".join(stale)
        return record
    finally:
        inv.close_hosts()
