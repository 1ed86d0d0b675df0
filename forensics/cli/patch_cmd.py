"""``forensics patch``: the NIXL bootstrap-loop fix as a reviewable diff, a local apply, and a sandbox proof.

Exit statuses: 0 good (diff produced, file patched or already patched, verify PASS);
1 bad (the codemod refuses the file, verify FAIL); 3 could not decide (the release
cannot be fetched, the sandbox cannot load it); 4 environment (unreadable/unwritable file).
"""

from __future__ import annotations

import json
import sys

import click

from forensics.exitcodes import BAD, GOOD, INCONCLUSIVE


def _emit_json(document: dict) -> None:
    click.echo(json.dumps(document, indent=2, default=str))


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
    from forensics.sglang_source import SourceError, resolve
    from patched_engine.codemod import PatchError, patch_source

    try:
        source = resolve(spec)
        path = source.backend_file("nixl")
    except SourceError as exc:
        _fail(as_json, INCONCLUSIVE, f"could not get sglang {spec}: {exc}", release=spec)
        return
    try:
        result = patch_source(path.read_text(encoding="utf-8"), source.version)
    except PatchError as exc:
        _fail(as_json, BAD, str(exc), release=source.version)
        return
    if as_json:
        _emit_json({"ok": True, **result.to_dict()})
    else:
        _console(stderr=True).print(result)
        sys.stdout.write(result.diff)
    sys.exit(GOOD)


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
        _fail(as_json, BAD, str(exc), file=path)
        return
    if as_json:
        _emit_json({"ok": True, **result.to_dict()})
    else:
        _console().print(result)
        if result.status == "planned":
            sys.stdout.write(result.plan.patch.diff)  # verbatim: never wrapped or highlighted
    sys.exit(GOOD)


@command.command("verify")
@click.option("--sglang", "spec", required=True, help="Release number, 'installed', or a directory holding sglang/srt.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def verify_command(spec: str, as_json: bool) -> None:
    """Run the ABORT/foreign-frame scenario on the unpatched and patched file in the engine sandbox.

    Exit 0 when the patched file keeps its thread alive with room 2 Failed and rooms 3-4
    WaitingForInput, 1 when it does not, 3 when the check could not run.
    """
    from patched_engine.verify import verify_release

    result = verify_release(spec)
    if as_json:
        _emit_json(result.to_dict())
    else:
        _console().print(result)
    sys.exit(result.exit_code)


def _fail(as_json: bool, code: int, message: str, **context) -> None:
    if as_json:
        _emit_json({"ok": False, "error": message, "exit_code": code, **context})
    else:
        click.echo(f"forensics patch: {message}", err=True)
    sys.exit(code)
