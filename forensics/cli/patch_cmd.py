"""``forensics patch``: the NIXL bootstrap-loop fix as a reviewable diff, a local apply, and a sandbox proof.

Exit statuses (the contract in forensics/exitcodes.py): 0 good (diff produced, file
patched or already patched, verify PASS); 1 bad (the codemod refuses the file, verify
FAIL); 3 could not decide (the sandbox could not run the check); 4 environment (the
release cannot be fetched, an unreadable or unwritable file).
"""

from __future__ import annotations

import sys

import click

from forensics.cli.contract import conclude
from forensics.cli.live_options import positive_seconds
from forensics.exitcodes import BAD, GOOD


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr)


@click.group(name="patch")
def command() -> None:
    """Fix the NIXL prefill bootstrap loop (ABORT branch, no GUARD assert, one try per message, daemon)."""


@command.command("diff")
@click.option("--sglang", "spec", required=True, help="Release number, 'installed', or a directory holding sglang/srt.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (steps and diff) on stdout.")
def diff_command(spec: str, as_json: bool) -> None:
    """Print the unified diff the codemod makes to a release's nixl/conn.py.

    The diff goes to stdout (pipe it into `patch -p1` under site-packages); the step table
    goes to stderr.
    """
    from forensics.sglang_source import resolve
    from patched_engine.codemod import PatchError, patch_source

    source = resolve(spec)  # SourceError (exit 4) names the release when it cannot be had
    path = source.backend_file("nixl")
    try:
        result = patch_source(path.read_text(encoding="utf-8"), source.version)
    except PatchError as exc:
        _refused(as_json, str(exc), release=source.version, file=str(path))

    def human() -> None:
        _console(stderr=True).print(result)
        sys.stdout.write(result.diff)

    conclude(as_json, GOOD, result.to_dict(), human, word="pass")


@command.command("apply")
@click.option("--file", "path", required=True, type=click.Path(dir_okay=False), help="The nixl/conn.py to patch in place.")
@click.option("--yes", is_flag=True, help="Really write (backup first). Without it only the plan is shown.")
@click.option("--backup-dir", type=click.Path(file_okay=False), default=None, help="Keep the backup here instead of beside the file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def apply_command(path: str, yes: bool, backup_dir: str | None, as_json: bool) -> None:
    """Patch a local nixl/conn.py: shows the plan; with --yes keeps a backup and replaces the file atomically."""
    from patched_engine.apply import apply_file
    from patched_engine.codemod import PatchError

    try:
        result = apply_file(path, yes=yes, backup_dir=backup_dir)
    except PatchError as exc:
        _refused(as_json, str(exc), file=path)

    def human() -> None:
        _console().print(result)
        if result.status == "planned":
            sys.stdout.write(result.plan.patch.diff)  # verbatim: never wrapped or highlighted

    # The status word is the apply's outcome: planned, applied or already-patched.
    details = result.to_dict()
    word = details.pop("status")
    conclude(as_json, GOOD, details, human, word=word)


@command.command("verify")
@click.option("--sglang", "spec", required=True, help="Release number, 'installed', or a directory holding sglang/srt.")
@click.option("--nixl/--no-nixl", default=True, show_default=True,
              help="Real NIXL agents (UCX, host memory) or the recording stand-in; the result names which ran.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def verify_command(spec: str, nixl: bool, as_json: bool) -> None:
    """Run the ABORT/foreign-frame scenario on the unpatched and patched file in the engine sandbox.

    Exit 0 when the patched file keeps its thread alive with room 2 Failed and rooms 3-4
    WaitingForInput, 1 when it does not, 3 when the check could not run.
    """
    from forensics.sglang_source import resolve
    from patched_engine.verify import verify_release

    resolve(spec)  # a release that cannot be had is exit 4 here as in every command (SourceError)
    result = verify_release(spec, nixl=nixl)
    details = result.to_dict()
    word = details.pop("status")
    details.pop("exit")
    conclude(as_json, result.exit_status, details, lambda: _console().print(_verify_renderable(result)), word=word)


def _verify_renderable(result):
    """The verdict first, then the proof, sized for an 80-column terminal: per scenario step the
    thread and the room states of both runs (the patched run's room states are the proof, so they
    are never cut: every column but "raised" is fixed and narrow), then the checks and runs."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from patched_engine.verify import KVPOLL_NAMES, ROOMS, SCENARIO

    def letters(states: dict) -> str:
        return " ".join("-" if states.get(r) is None else KVPOLL_NAMES.get(states.get(r), "?")[0] for r in ROOMS)

    style = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow"}.get(result.verdict, "bold")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), title_justify="left",
                  title=f"sglang {result.release}: bootstrap loop, unpatched vs patched")
    table.add_column("step", no_wrap=True)
    for kind in ("unpatched", "patched"):
        table.add_column(f"{kind}\nthread rooms 1-4", no_wrap=True, min_width=16)
    table.add_column("raised", overflow="fold", ratio=1)
    steps = {run.kind: {s.name: s for s in run.steps} for run in (result.unpatched, result.patched)}
    for scenario_step in SCENARIO:
        cells, raised = [scenario_step.name], []
        for kind in ("unpatched", "patched"):
            step = steps[kind].get(scenario_step.name)
            if step is None:
                cells.append(Text("not run", style="dim"))
                continue
            cell = Text("alive " if step.thread_alive else "DEAD  ", style="green" if step.thread_alive else "red")
            cell.append(f" {letters(step.room_states)}")
            cells.append(cell)
            raised += [f"{kind[0]}: {e.get('exc_type') or e.get('type') or 'Exception'}" for e in step.exceptions]
        table.add_row(*cells, ", ".join(raised))
    parts = [Text(result.headline(), style=style)]
    parts += [Text(f"  {line}") for line in result.agent_lines()]
    if result.unpatched.started or result.patched.started:
        parts.append(table)
        parts.append(Text("rooms: B Bootstrapping, W WaitingForInput, F Failed, T Transferring, S Success, "
                          "- absent; raised: u unpatched, p patched", style="dim"))
    parts += [Text(f"  {'ok ' if c.ok else 'BAD'} {c.name}: {c.detail}") for c in result.checks]
    parts += [Text(f"  {line}") for line in result.run_lines()]
    parts += [Text(f"  reason: {r}") for r in result.reasons]
    return Group(*parts)


def _refused(as_json: bool, message: str, **context) -> None:
    """The codemod refuses the file (an anchor it needs is missing): a finding, exit 1."""
    if not as_json:
        click.echo(f"forensics patch: {message}", err=True)
    conclude(as_json, BAD, {"error": message, "kind": "PatchError", **context}, word="fail")


# ----------------------------------------------------------------------------- deploy, status, rollback

INVENTORY_HELP = "The deployment's inventory file (a twin's needs no --yes)."


def _deploy_progress(as_json: bool):
    if as_json:
        return None
    console = _console(stderr=True)

    def show(step) -> None:
        colour = "green" if step.state == "ok" else "red"
        # The detail names what a step made (the private upload directory among them): a deploy killed
        # halfway leaves that directory behind, and this line is where its operator finds it again.
        console.print(f"[{colour}]{step.state:>6}[/] {step.engine}: {step.name} ({step.duration_s:.2f}s)",
                      end=": " if step.detail else "\n", soft_wrap=True)
        if step.detail:  # never wrapped: a path split over two lines cannot be pasted
            console.print(step.detail, markup=False, highlight=False, soft_wrap=True)

    return show


def _conclude_record(record, as_json: bool) -> None:
    from forensics.exitcodes import ExitStatus

    def human() -> None:
        _console().print(record)
        if record.status in ("planned", "refused"):
            for engine in record.plan.engines:
                if engine.diff:
                    sys.stdout.write(engine.diff)  # verbatim: never wrapped or highlighted
    if record.exit_status == ExitStatus.ENVIRONMENT and not as_json:
        human()
        click.echo(f"forensics: {record.problem}", err=True)
        sys.exit(int(record.exit_status))
    details = record.to_dict()
    word = details.pop("outcome")
    conclude(as_json, record.exit_status, details, human, word=word)


@command.command("deploy")
@click.option("--inventory", required=True, type=click.Path(dir_okay=False, exists=True), help=INVENTORY_HELP)
@click.option("--yes", is_flag=True, help="Really deploy to a live deployment. Without it only the plan and diff.")
@click.option("--force", is_flag=True, help="Deploy over a file that is not the release's own (after its diff).")
@click.option("--restart", "restart_patched", is_flag=True,
              help="Restart already-patched engines too (a deploy stopped between write and restart).")
@click.option("--restart-decodes/--no-restart-decodes", default=None,
              help="After the prefills, restart each decode whose release blocks on a restarted prefill (0.5.15). "
                   "Default: only on a real-engine deployment of ours (the plan says why).")
@click.option("--liveness-deadline", type=float, default=600.0, show_default=True, callback=positive_seconds,
              help="Seconds after the restart within which a real one-token request must answer.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def deploy_command(inventory: str, yes: bool, force: bool, restart_patched: bool, restart_decodes: bool | None,
                   liveness_deadline: float, as_json: bool) -> None:
    """Patch every prefill engine's nixl/conn.py: plan and diff; with --yes backup, atomic write,
    compile check, bytecode cleared, restart, LIVENESS, and a check that the engine runs it.

    Exit 0 deployed (or already patched, or plan shown), 1 refused (a fork without --force,
    the codemod refuses), not live after the restart, or not restarted (the engine process
    is the one from before the write), 3 which file the engine runs cannot be told, 4 a step
    failed on the host or the install directory cannot be written, 130 interrupted (SIGINT or
    SIGTERM waits for the step in progress, a restart to its end; the record lists the steps).
    """
    from patched_engine.deploy import deploy

    record = deploy(inventory, yes=yes, force=force, restart=restart_patched, restart_decodes=restart_decodes,
                    liveness_deadline_s=liveness_deadline,
                    on_step=_deploy_progress(as_json))
    _conclude_record(record, as_json)


@command.command("status")
@click.option("--inventory", required=True, type=click.Path(dir_okay=False, exists=True), help=INVENTORY_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def status_command(inventory: str, as_json: bool) -> None:
    """Per prefill engine: original, cpu-adapted, patched (on the original or the CPU-adapted file, which
    patch id, and running), patched-not-running, or unknown.

    Decided by the file's bytes: the release's wheel file, that file with the CPU adaptation
    (only inside an engine environment of this machine), the fix on either. A patched file
    counts only if every engine process started after it changed. Exit 0 when every prefill
    engine runs the fix, 1 when one does not (original, cpu-adapted, unknown,
    patched-not-running), 3 when that cannot be told (a file, the wheel or the processes
    could not be read).
    """
    from patched_engine.deploy import status

    report = status(inventory)
    conclude(as_json, report.exit_status, report.to_dict(), lambda: _console().print(report), word=report.word)


@command.command("rollback")
@click.option("--inventory", required=True, type=click.Path(dir_okay=False, exists=True), help=INVENTORY_HELP)
@click.option("--yes", is_flag=True, help="Really roll back a live deployment. Without it only the plan.")
@click.option("--force", is_flag=True, help="Restore a backup that is not the release's own file (after reading why).")
@click.option("--restart-decodes/--no-restart-decodes", default=None,
              help="After the prefills, restart each decode whose release blocks on a restarted prefill (0.5.15). "
                   "Default: only on a real-engine deployment of ours (the plan says why).")
@click.option("--liveness-deadline", type=float, default=600.0, show_default=True, callback=positive_seconds,
              help="Seconds after the restart within which a real one-token request must answer.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def rollback_command(inventory: str, yes: bool, force: bool, restart_decodes: bool | None, liveness_deadline: float,
                     as_json: bool) -> None:
    """Put each prefill's newest backup back byte for byte, restart, LIVENESS.

    The backup's sha256 must match its record and the release's wheel (the record alone
    proves nothing). Exit 0 rolled back (or nothing to roll back, or plan shown), 1 refused
    (no backup, or one that is not the release's file without --force), not live or not
    restarted, 4 a step failed on the host or the wheel cannot be had, 130 interrupted.
    """
    from patched_engine.deploy import rollback

    record = rollback(inventory, yes=yes, force=force, restart_decodes=restart_decodes,
                      liveness_deadline_s=liveness_deadline, on_step=_deploy_progress(as_json))
    _conclude_record(record, as_json)
