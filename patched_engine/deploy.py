"""Deploy the patched ``nixl/conn.py`` to a deployment's prefill engines, check it, roll it back.

    from patched_engine import deploy
    plan = deploy.plan_deploy("inventory.toml")        # reads only: locate, diff, known-release check
    plan.commands()                                    # every command the deploy would run, in order
    record = deploy.deploy("inventory.toml", yes=True) # backup, atomic write, compile, restart, LIVENESS
    deploy.status("inventory.toml").exit_status        # 0 every engine runs the fix, 1 one does not, 3 unknown
    deploy.rollback("inventory.toml", yes=True)        # the backup back, byte for byte; restart; liveness

The bootstrap loop the patch fixes (``NixlKVManager``'s ``bootstrap_thread``) runs on the
*prefill*: only prefill engines are patched and restarted. A decode sharing the same
install picks the file up at its next restart (the patch leaves its code paths alone).

For each prefill engine, on its Host (``LocalHost`` or ``SSHHost``, from the inventory):

1. locate sglang with the engine's own interpreter (``PYTHON -c LOCATE_SCRIPT [LOCATION]``,
   :mod:`patched_engine.locate`): package directory, release (``importlib.metadata``), and
   ``nixl/conn.py``'s real path, owner, group, mode and sha256;
2. the known-release check: the file must equal the same file in the wheel of the release
   the target reports (:func:`forensics.sglang_source.fetch`); anything else is a fork,
   refused unless ``force=True`` (the diff is shown first either way);
3. the codemod in memory (line endings and encoding kept, :mod:`patched_engine.apply`);
   the plan and the diff. Without ``yes=True`` that is all that happens on a live
   deployment; a twin (an inventory with a ``[twin]`` table) needs no ``yes``;
4. compile check of the patched bytes with the target interpreter
   (``PYTHON -m py_compile`` on the uploaded copy in a private temporary directory);
5. backup: a record (sha256, size, owner, mode) and the original's bytes beside the file
   (``conn.py.pd-forensics-record-STAMP.json``, ``conn.py.pd-forensics-backup-STAMP``),
   each written atomically; no backup, no write;
6. the patched file, atomically with the original's owner, group and mode
   (:mod:`patched_engine.remote_file`: upload, ``install``, read back, ``sync``, ``mv``);
7. its bytecode removed (``rm -f .../__pycache__/conn.*.pyc``);
8. the engine restarted with the inventory's ``restart`` line (an argument list through
   ``shlex.split``; a leading ``sudo`` gets ``-n``: never a password prompt), then
   LIVENESS: a real one-token request through the deployment (the router, else each
   prefill+decode pair) until it answers or the deadline passes. ``/health`` is not
   enough: it answered 200 all through the incident;
9. the file located again and each engine process's start time ordered against its change
   time (:mod:`patched_engine.running`): "deployed" only when every process started after
   the write. A restart line that restarts nothing (``/bin/true``) is ``not-restarted``.

An engine patched on disk whose running process started before the write (a deploy stopped
between its write and its restart) is resumed: the next deploy restarts it.

Every step is recorded (:class:`DeployRecord`: each step's state, duration and the
``CommandResult`` of each of its commands). Killing the deployer at any moment leaves the
file either original or patched, never partial: the only write to ``conn.py`` is a rename.
SIGINT or SIGTERM is deferred to the next step boundary (:mod:`patched_engine.interrupts`):
a restart runs to its end, and the record (status ``interrupted``, exit 130) lists the steps
done and what each engine is left in.

The pieces: :mod:`patched_engine.deploy_plan` (locate, known-release check, codemod in
memory), :mod:`patched_engine.deploy_steps` (each engine's steps), :mod:`patched_engine.deploy_record`,
:mod:`patched_engine.deploy_status` (:func:`status`) and :mod:`patched_engine.rollback`
(:func:`rollback`); their public names are importable from here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forensics.exitcodes import EnvironmentProblem
from patched_engine import remote_file
from patched_engine.baselines import Release, accepted_baselines, release_conn
from patched_engine.deploy_plan import (
    PLACEHOLDER_STAMP,
    PLACEHOLDER_TMPDIR,
    DeployPlan,
    EnginePlan,
    load_inventory,
    patch_id_of,
    plan_deploy,
    restart_argv,
)
from patched_engine.deploy_record import DeployRecord
from patched_engine.deploy_status import EngineStatus, StatusReport, status
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
from patched_engine.rollback import rollback
from patched_engine.running import EARLIER_FILE, NO_PROCESS, THIS_FILE

__all__ = [
    "PLACEHOLDER_STAMP", "PLACEHOLDER_TMPDIR", "DeployPlan", "DeployRecord", "EnginePlan", "EngineStatus", "Release",
    "StatusReport", "accepted_baselines", "deploy", "load_inventory", "patch_id_of", "plan_deploy", "release_conn",
    "restart_argv", "rollback", "status", "wait_liveness",
]

DEFAULT_LIVENESS_DEADLINE_S = 600.0
DEFAULT_RESTART_TIMEOUT_S = 600.0

UNTOUCHED = "original: conn.py not written"
ON_DISK_ONLY = "patched on disk, not yet running (not restarted)"
RESTARTED = "patched and restarted (liveness not checked yet)"


def _outcome(record: DeployRecord, checks: dict[str, Any], wrote: list[EnginePlan], todo: list[EnginePlan]) -> None:
    """The deploy's status from liveness and from which file each written or restarted engine runs."""
    plan = record.plan
    stale = {name: c for name, c in checks.items() if c.verdict in (EARLIER_FILE, NO_PROCESS)}
    undecided = {name: c for name, c in checks.items() if c.verdict not in (THIS_FILE, EARLIER_FILE, NO_PROCESS)}
    for name, check in checks.items():
        record.running[name] = check.to_dict()
        record.engine_states[name] = ("runs the patched file" if check.verdict == THIS_FILE else
                                      ON_DISK_ONLY if name in stale else "patched on disk; which file runs is unknown")
    live = record.liveness["outcome"] == "ok"
    liveness = f"liveness {'ok' if live else 'failed'} after {record.liveness['waited_s']}s"
    if stale:
        parts = []
        for e in plan.engines:
            if e.engine in stale:
                how = (f"the restart line `{' '.join(e.restart)}` ran but did not restart it" if e.restart else
                       "the inventory has no restart line")
                parts.append(f"{e.label}: {how}: {stale[e.engine].reason}; it still runs the unpatched file")
        record.status = "not-restarted"
        record.message = ("; ".join(parts) + f" ({liveness}). Fix the restart line (it must replace the engine "
                          "process), or restart it yourself; `forensics patch status` says when it runs the patch")
    elif not live:
        record.status = "not-live"
        record.message = not_live(record, f"liveness failed {record.liveness['waited_s']}s after the restart: roll "
                                  "back with `forensics patch rollback --inventory FILE --yes`")
    elif undecided:
        record.status = "unconfirmed"
        record.message = (f"{liveness}, but which file the engine runs cannot be told: "
                          + "; ".join(c.reason for c in undecided.values()))
    elif wrote or any(e.resumes_restart for e in todo):
        record.status = "deployed"
        resumed = [e.label for e in todo if e.resumes_restart]
        record.message = (f"patched {len(wrote)} prefill engine(s)"
                          + (f"; resumed with the restart: {', '.join(resumed)}" if resumed else "")
                          + "; each runs the patched file; liveness ok")
    else:
        record.status = "already-patched"
        record.message = "every prefill engine already carries the patch and runs it; liveness ok"


def deploy(source: Any, *, yes: bool = False, force: bool = False, restart: bool = False,
           restart_decodes: bool | None = None, liveness_deadline_s: float = DEFAULT_LIVENESS_DEADLINE_S,
           restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
           on_step: Callable[[Step], None] | None = None) -> DeployRecord:
    """Plan, then (with ``yes=True``, or on a twin) write, restart and wait for liveness.

    ``force``: deploy over a file that is not the release's own (a fork), after its diff was
    shown. ``restart``: restart engines that are already patched too (an engine patched on
    disk whose process started before the write is restarted without it). ``restart_decodes``:
    after the prefills, restart each decode whose release blocks on a send to a restarted
    prefill (sglang 0.5.15: :mod:`patched_engine.decode_hazard`; the plan warns of them either way);
    None (the default) restarts them on a real-engine deployment of ours and nowhere else
    (:func:`patched_engine.deploy_plan.real_engine_decodes`; the plan says why).
    """
    remote_file.check_kill_env()
    inv, path = load_inventory(source)
    try:
        record = planned("deploy", inv, path, restart_decodes)
        plan = record.plan
        problems = [e for e in plan.engines if e.problem]
        if problems:
            record.status = "refused"
            record.message = "; ".join(f"{e.label}: {e.problem}" for e in problems)
            return record
        blocked = [e for e in plan.engines if e.blocked and e.needed]
        if blocked:
            record.status = "failed"
            record.problem = "; ".join(f"{e.label}: cannot write: {e.blocked}" for e in blocked) + "; nothing written"
            return record
        if plan.forks and not force:
            record.status = "refused"
            record.message = ("not the release's own file: " + "; ".join(f"{e.label}: {e.reason}" for e in plan.forks)
                              + ". Review the diff, then pass --force (force=True) to deploy it anyway")
            return record
        if not (yes or plan.twin):
            record.message = "plan only: pass --yes (yes=True) to deploy to this live deployment"
            return record
        todo = [e for e in plan.engines if e.needed or e.resumes_restart or (restart and e.kind == "patched")]
        wrote = [e for e in plan.engines if e.needed]
        record.engine_states = {e.engine: UNTOUCHED if e.kind != "patched" else
                                (ON_DISK_ONLY if e.resumes_restart else "patched") for e in plan.engines}
        restarted: list[EnginePlan] = []
        with DeferredInterrupts("deploy") as interrupts:
            try:
                for e in plan.engines:
                    interrupts.checkpoint(f"before {e.label}")
                    rec = Recorder(inv.host_for(inv.engine_named(e.engine)), e.engine, sudo=e.sudo,
                                   steps=record.steps, on_step=on_step)
                    record.steps.append(locate_step(e))
                    if e.needed:
                        write_engine(rec, e, e.new_bytes, backup=True, checkpoint=interrupts.checkpoint)
                        record.engine_states[e.engine] = ON_DISK_ONLY
                    if e in todo and finish_engine(rec, e, restart_timeout_s=restart_timeout_s,
                                                   checkpoint=interrupts.checkpoint):
                        restarted.append(e)
                        record.engine_states[e.engine] = RESTARTED
                if plan.restart_decodes and restarted:
                    restart_blocking_decodes(inv, plan, record, restart_timeout_s=restart_timeout_s, on_step=on_step,
                                             checkpoint=interrupts.checkpoint)
                interrupts.checkpoint("before the liveness check")
                record.liveness = wait_liveness(inv, liveness_deadline_s, interrupts.checkpoint)
                checks = {e.engine: e.running for e in plan.engines
                          if e.running is not None and not (e in todo or e.needed)}  # the plan's look suffices
                for e in plan.engines:
                    if e in todo or e.needed:
                        rec = Recorder(inv.host_for(inv.engine_named(e.engine)), e.engine, sudo=e.sudo,
                                       steps=record.steps, on_step=on_step)
                        checks[e.engine] = confirm_running(inv, rec, e)
            except Interrupted as exc:
                return interrupted_record(inv, record, exc, restarted, on_step=on_step,
                                   states={THIS_FILE: "runs the patched file", EARLIER_FILE: ON_DISK_ONLY,
                                           NO_PROCESS: "patched on disk; no engine process running"})
            except (StepFailed, EnvironmentProblem) as exc:
                record.status = "failed"
                record.problem = str(exc)
                return record
        _outcome(record, checks, wrote, todo)
        return record
    finally:
        inv.close_hosts()
