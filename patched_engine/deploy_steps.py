"""The deploy's and the rollback's steps on one engine's Host: write, restart, liveness, and the check that it restarted.

Each step is recorded (:class:`~patched_engine.remote_file.Step`). ``checkpoint`` (from
:class:`~patched_engine.interrupts.DeferredInterrupts`) is called only between steps, at
the points where stopping leaves every engine in a state the record can name: before the
patched file's rename (what was uploaded is removed; the backup beside the file stays,
harmless), before a restart, between liveness attempts.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from forensics.exitcodes import EnvironmentProblem
from patched_engine import remote_file
from patched_engine.deploy_plan import DeployPlan, EnginePlan, plan_deploy, stamp
from patched_engine.deploy_record import DeployRecord
from patched_engine.interrupts import Interrupted
from patched_engine.remote_file import Recorder, Step, StepFailed, result_record

Checkpoint = Callable[[str], None]


def _no_checkpoint(where: str) -> None:
    """Outside a deferred-interrupt block nothing stops between steps."""


# ----------------------------------------------------------------------------- liveness


def wait_liveness(inv, deadline_s: float, checkpoint: Checkpoint = _no_checkpoint) -> dict[str, Any]:
    """Real one-token requests through the deployment until every liveness target answers 2xx, or the deadline.

    ``checkpoint`` runs between attempts, never during one: an interrupt never closes a
    probe early (an early close is an abort, the very frame that wedged the loop)."""
    from forensics.probes import probe_once

    started = time.monotonic()
    attempts = 0
    last: list[dict[str, Any]] = []
    while True:
        attempts += 1
        left = deadline_s - (time.monotonic() - started)
        cap = max(left, 2.0)
        results = probe_once(inv, kinds=("liveness",), deadline_s={"liveness": min(30.0, cap / 2)}, cap_s=cap,
                             wait=True)
        frame = results.frame
        rows = frame[frame["kind"] == "liveness"]
        last = [{"target": str(r.target), "outcome": str(r.outcome),
                 "status": None if r.status is None or str(r.status) == "<NA>" else int(r.status),
                 "total_s": None if r.total_s != r.total_s else round(float(r.total_s), 3),
                 "detail": str(r.detail)} for r in rows.itertuples()]
        ok = bool(last) and all(row["outcome"] == "ok" for row in last)
        waited = round(time.monotonic() - started, 3)
        if ok:
            return {"outcome": "ok", "waited_s": waited, "attempts": attempts, "probes": last}
        if time.monotonic() - started >= deadline_s:
            return {"outcome": "failed", "waited_s": waited, "attempts": attempts, "probes": last,
                    "deadline_s": deadline_s}
        checkpoint(f"waiting for liveness after {waited}s ({attempts} attempt(s), the last failed)")
        time.sleep(min(1.0, max(deadline_s - (time.monotonic() - started), 0.0)))


# ----------------------------------------------------------------------------- one engine's steps


def locate_step(plan: EnginePlan) -> Step:
    """The plan's read of the engine (its interpreter's answer and the known-release check) as a step."""
    result = plan.located.result
    detail = (f"sglang {plan.release} ({plan.located.version_source or 'inventory'}) at {plan.located.package_dir}; "
              f"{plan.path}: {plan.kind} ({plan.reason})")
    return Step(plan.engine, "locate sglang with the engine's interpreter", "ok",
                duration_s=result.duration_s if result is not None else 0.0, detail=detail,
                commands=[short_record(result)] if result is not None else [])


def short_record(result) -> dict[str, Any]:
    """A locate command's record with its long script replaced by its length."""
    record = result_record(result)
    record["argv"] = [record["argv"][0], "-c", f"<locate script, {len(record['argv'][2])} characters>",
                      *record["argv"][3:]]
    record["command_line"] = None
    return record


def write_engine(rec: Recorder, plan: EnginePlan, data: bytes, *, backup: bool,
                 checkpoint: Checkpoint = _no_checkpoint) -> None:
    """Upload ``data`` (and a backup of the original), compile it there, install it atomically.

    ``checkpoint`` runs once, before the rename over ``conn.py``: an interrupt before it
    leaves the original in place (and the backup beside it)."""
    tmpdir = remote_file.make_tmpdir(rec)
    try:
        backup_path, record_path = plan.backup_paths(stamp())
        owner = plan.owner
        uploads = {}
        if backup:
            record = {"backup": backup_path.rsplit("/", 1)[1], "of": plan.path,
                      "link": plan.located.conn if plan.located.file.get("symlink") else None,
                      "sha256": plan.sha256_before, "size": len(plan.original), "uid": owner.uid, "gid": owner.gid,
                      "mode": f"{owner.mode:04o}", "pid": 0, "created": datetime.now(UTC).isoformat(),
                      "release": plan.release, "release_sha256": plan.release_sha256, "kind": plan.kind,
                      "by": "patched_engine.deploy"}
            uploads["record.json"] = (json.dumps(record, indent=1) + "\n").encode()
            uploads["backup"] = plan.original
        for name, content in uploads.items():
            remote_file.upload(rec, tmpdir, name, content)
        conn_tmp = remote_file.upload(rec, tmpdir, "conn.py", data)
        remote_file.kill_point("after-upload")
        with rec.step("compile check with the target interpreter") as step:
            rec.run(step, [plan.python, "-m", "py_compile", conn_tmp])
            step.detail = f"{plan.python} -m py_compile: ok"
        if backup:
            record_owner, backup_owner = plan.backup_owners()
            remote_file.install_atomically(rec, f"{tmpdir}/record.json", record_path, record_owner,
                                           uploads["record.json"])
            remote_file.install_atomically(rec, f"{tmpdir}/backup", backup_path, backup_owner, plan.original)
        checkpoint(f"before writing {plan.path} (it is unchanged)")
        with rec.step("check the file is still the one planned") as step:
            now = rec.host.read_file(plan.path)
            if now != plan.original:
                raise StepFailed(f"{plan.label}: {plan.path} changed since the plan (sha256 "
                                 f"{remote_file.sha256(now)[:12]}…); nothing written, plan again")
        remote_file.install_atomically(rec, conn_tmp, plan.path, owner, data, kill_points=True)
    finally:
        remote_file.remove_tmpdir(rec, tmpdir)


def finish_engine(rec: Recorder, plan: EnginePlan, *, restart_timeout_s: float,
                  checkpoint: Checkpoint = _no_checkpoint) -> bool:
    """Remove conn.py's bytecode, then restart (``checkpoint`` first). True when a restart line ran."""
    with rec.step("remove the bytecode of conn.py") as step:
        found = list(plan.located.file.get("pycache") or [])
        for pyc in found:  # one file per command: a sudoers rule can name each exactly
            rec.run(step, ["rm", "-f", "--", pyc], sudo=rec.sudo)
        step.detail = f"{len(found)} file(s)" if found else "none found"
    if not plan.restart:
        rec.steps.append(Step(plan.engine, "restart", "skipped", detail="no restart line in the inventory"))
        return False
    checkpoint(f"before restarting {plan.label}")
    with rec.step("restart") as step:
        rec.run(step, plan.restart, timeout=restart_timeout_s)
        step.detail = shlex.join(plan.restart)
    return True


def confirm_running(inv, rec: Recorder, plan: EnginePlan):
    """After the restart: locate the file again and order the engine's processes against its change time.

    The step fails when the engine does not run the file (the restart line restarted
    nothing: ``/bin/true``, a wrong unit); the RunningCheck says why either way."""
    from patched_engine.locate import locate
    from patched_engine.running import THIS_FILE, check_running

    engine = inv.engine_named(plan.engine)
    with rec.step("check the engine runs the file on disk") as step:
        located = locate(rec.host, engine.python, engine.sglang_location, label=engine.label)
        step.commands.append(short_record(located.result))
        check = check_running(inv, engine, located)
        step.commands += check.commands
        step.detail = check.reason
        if check.verdict != THIS_FILE:
            step.state = "failed"
    return check


def planned(action: str, inv, path, restart_decodes: bool | None) -> DeployRecord:
    """A record holding the plan (nothing done yet). ``restart_decodes`` None: as the plan decides
    (:func:`patched_engine.deploy_plan.real_engine_decodes`: on a real-engine deployment of ours)."""
    plan = plan_deploy(inv)
    plan.inventory = str(path) if path else None
    if restart_decodes is None:
        plan.restart_decodes = bool(plan.restart_decodes_why)
    else:
        plan.restart_decodes = restart_decodes
        plan.restart_decodes_why = None  # asked for (or against) explicitly
    return DeployRecord(action, "planned", plan)


def restart_blocking_decodes(inv, plan: DeployPlan, record: DeployRecord, *, restart_timeout_s: float,
                             on_step: Callable[[Step], None] | None, checkpoint: Checkpoint = _no_checkpoint) -> None:
    """After the prefills' restart: restart each decode whose release blocks on the restarted
    prefill (a fresh decode has no cached socket to the old one)."""
    for hazard in plan.decode_hazards:
        engine = inv.engine_named(hazard.engine)
        rec = Recorder(inv.host_for(engine), hazard.engine, sudo=engine.sudo, steps=record.steps, on_step=on_step)
        if not hazard.restart:
            record.steps.append(Step(hazard.engine, "restart the decode", "skipped",
                                     detail="no restart line in the inventory: restart it yourself"))
            continue
        checkpoint(f"before restarting the decode {hazard.label}")
        with rec.step("restart the decode") as step:
            rec.run(step, hazard.restart, timeout=restart_timeout_s)
            step.detail = f"{shlex.join(hazard.restart)} (its release blocks on a restarted prefill: {hazard.where})"
        record.engine_states[hazard.engine] = "restarted (a decode whose release blocks on a restarted prefill)"


def interrupted_record(inv, record: DeployRecord, exc: Interrupted, restarted: list[EnginePlan], *,
                on_step: Callable[[Step], None] | None, states: dict[str, str]) -> DeployRecord:
    """The record of a deploy or rollback stopped by a signal: the steps done, each engine's state.

    Each engine whose restart ran is checked once (which file its processes loaded), so the
    record says what runs, not only what was done."""
    record.status = "interrupted"
    for e in restarted:
        rec = Recorder(inv.host_for(inv.engine_named(e.engine)), e.engine, sudo=e.sudo, steps=record.steps,
                       on_step=on_step)
        try:
            check = confirm_running(inv, rec, e)
        except EnvironmentProblem as problem:
            record.engine_states[e.engine] += f"; which file it runs could not be told: {problem}"
            continue
        record.running[e.engine] = check.to_dict()
        state = states.get(check.verdict, "restarted; which file it runs cannot be told")
        record.engine_states[e.engine] = f"{state} ({check.reason})"
    record.interrupted = {"signal": exc.signal_name, "stopped": exc.where,
                          "seconds_from_signal_to_stop": round(time.monotonic() - exc.received_at, 3)}
    done = sum(1 for s in record.steps if s.state == "ok")
    record.message = (f"{exc.signal_name}: stopped {exc.where}, after {done} step(s) done (none cut halfway); "
                      + "; ".join(f"{engine}: {state}" for engine, state in record.engine_states.items()))
    return record


def not_live(record: DeployRecord, text: str) -> str:
    """The not-live message, naming the decode hazard when it may be why (and was not dealt with)."""
    if record.plan.decode_hazards and not record.plan.restart_decodes:
        names = ", ".join(h.label for h in record.plan.decode_hazards)
        text += (f"; {names} may be blocked sending to the old prefill (sglang {record.plan.decode_hazards[0].release}"
                 f", {record.plan.decode_hazards[0].where}): restart the decode (--restart-decodes) before anything "
                 "else")
    return text
