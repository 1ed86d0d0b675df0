"""``forensics handlers``: diff two backends' receiver loops, map every release, gate a fork in CI."""

from __future__ import annotations

from pathlib import Path

import click

from forensics.cli.contract import conclude, fail_after_output
from forensics.cli.render import step_progress
from forensics.exitcodes import environment_problem_from_os_error


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr)


@click.group()
def command() -> None:
    """Map and diff the bootstrap-loop message handlers of sglang releases and forks."""


@command.command("diff")
@click.option("--sglang", "release", required=True, help="Release number, source directory or 'installed'.")
@click.option("--a", "a", default="nixl", show_default=True, help="First backend.")
@click.option("--b", "b", default="mooncake", show_default=True, help="Second backend.")
@click.option("--confirm/--no-confirm", default=True, show_default=True,
              help="Replay each critical NIXL finding in the engine sandbox.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Save diff.json and diff.html here.")
def diff_command(release, a, b, confirm, as_json, out_dir):
    """NIXL vs Mooncake (or any two backends): every tag, what each loop does, side by side."""
    from forensics.handlers import diff

    try:
        result = diff(release, a, b, confirm=confirm)
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="--a/--b") from None
    # findings (1), inconclusive when a backend could not be read or understood (3), clean (0)
    status, word = result.exit_status, result.verdict

    def human() -> None:
        console = _console()
        console.print(result)
        for finding in result.findings:
            console.print(f"[bold]{finding.severity}[/bold] {finding.summary}  (sandbox: {finding.confirmation})")

    if out_dir:
        try:
            _save_diff(result, Path(out_dir))
        except OSError as exc:
            # The diff was computed: show it, then say which path could not be written (exit 4).
            fail_after_output(as_json, environment_problem_from_os_error(exc, doing="cannot write"),
                              result.to_dict(), human)

    def human_saved() -> None:
        human()
        if out_dir:
            _console().print(f"saved {Path(out_dir) / 'diff.json'} and {Path(out_dir) / 'diff.html'}")

    conclude(as_json, status, result.to_dict(), human_saved, word=word)


def _save_diff(result, directory: Path) -> None:
    from forensics.cli.render import encode_json

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "diff.json").write_bytes(encode_json(result.to_dict()) + b"\n")
    (directory / "diff.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>handler diff</title>" + result._repr_html_(),
        encoding="utf-8")


@command.command("matrix")
@click.option("--from", "lower", default="0.5.1", show_default=True, help="Oldest release.")
@click.option("--to", "upper", default="0.5.23", show_default=True, help="Newest release.")
@click.option("--workers", type=int, default=None, help="Parallel processes (default: up to 2).")
@click.option("--no-cache", is_flag=True, help="Recompute every row (ignore cached analyses).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
@click.option("--png", "png", type=click.Path(dir_okay=False), help="Save the heatmap here.")
def matrix_command(lower, upper, workers, no_cache, as_json, png):
    """Per release x backend: handles ABORT, dies on unknown frames, daemon, wrapper, timeout, frames sent."""
    from forensics.handlers import matrix
    from forensics.sglang_source import available_releases

    releases = available_releases(lower, upper)
    if not releases:
        raise click.BadParameter(f"no sglang release between {lower} and {upper}", param_hint="--from/--to")
    with step_progress(len(releases), "handlers matrix") as step:
        result = matrix(releases, workers=workers, use_cache=not no_cache, progress=step)

    def human() -> None:
        # Verdict and the NIXL window first, then one line per release (names whole at any width);
        # every column of every row is in --json.
        console = _console()
        console.print(result)
        if png:
            console.print(f"heatmap saved to {png}")

    if png:
        import matplotlib

        matplotlib.use("Agg")
        ax = result.plot()
        try:
            ax.figure.savefig(png, dpi=130)
        except OSError as exc:
            fail_after_output(as_json, environment_problem_from_os_error(exc, png, "cannot write"),
                              result.to_dict(), human)
    # The matrix is a map, not a gate: good when every release was mapped, inconclusive
    # (naming the rows) when some backend's code could not be read or understood.
    conclude(as_json, result.exit_status, result.to_dict(), human, word=result.verdict)


@command.command("check")
@click.option("--source", "source", required=True, help="Source directory (a fork's checkout) or release number.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
def check_command(source, as_json):
    """CI gate: exit 1 when a sent tag is unhandled by a receiver loop or any loop can die on a frame."""
    from forensics.handlers import map_release

    handler_map = map_release(source)  # NoDisaggregationCode: exit 3; a missing tree: exit 4
    findings = handler_map.findings
    document = {
        "version": handler_map.version,
        "root": handler_map.root,
        "clean": handler_map.verdict == "clean",
        "reasons": handler_map.reasons(),
        "findings": [f.to_dict() for f in findings],
        "unreadable": [u.to_dict() for u in handler_map.unreadable],
        "gaps": [g.to_dict() for g in handler_map.gaps],
        "backends": sorted(handler_map.backends),
    }
    style = {"clean": "green", "findings": "red", "inconclusive": "yellow"}[handler_map.verdict]

    def human() -> None:
        console = _console()
        console.print(handler_map)
        console.print(f"[{style}]{handler_map.verdict}[/{style}]: " + "; ".join(handler_map.reasons()))

    undecided = handler_map.undecided()
    if undecided is not None and handler_map.verdict == "inconclusive":
        # Not clean and not a finding: say which file and line could not be read (exit 3).
        fail_after_output(as_json, undecided, document, human)
    conclude(as_json, handler_map.exit_status, document, human, word=handler_map.verdict)
