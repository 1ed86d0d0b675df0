"""``forensics handlers``: diff two backends' receiver loops, map every release, gate a fork in CI."""

from __future__ import annotations

import json
from pathlib import Path

import click

from forensics.exitcodes import BAD, GOOD


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr)


def _emit(document: dict) -> None:
    click.echo(json.dumps(document, indent=2, default=str))


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
    if out_dir:
        directory = Path(out_dir)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "diff.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
        (directory / "diff.html").write_text(
            "<!doctype html><meta charset='utf-8'><title>handler diff</title>" + result._repr_html_()
        )
    if as_json:
        _emit(result.to_dict())
    else:
        console = _console()
        console.print(result)
        for finding in result.findings:
            console.print(f"[bold]{finding.severity}[/bold] {finding.summary}  (sandbox: {finding.confirmation})")
        if out_dir:
            console.print(f"saved {Path(out_dir) / 'diff.json'} and {Path(out_dir) / 'diff.html'}")
    raise SystemExit(BAD if result.findings else GOOD)


@command.command("matrix")
@click.option("--from", "lower", default="0.5.1", show_default=True, help="Oldest release.")
@click.option("--to", "upper", default="0.5.23", show_default=True, help="Newest release.")
@click.option("--workers", type=int, default=None, help="Parallel processes (default: up to 2).")
@click.option("--no-cache", is_flag=True, help="Recompute every row (ignore cached analyses).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
@click.option("--png", "png", type=click.Path(dir_okay=False), help="Save the heatmap here.")
def matrix_command(lower, upper, workers, no_cache, as_json, png):
    """Per release x backend: handles ABORT, dies on unknown frames, daemon, wrapper, timeout, frames sent."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from forensics.handlers import matrix
    from forensics.sglang_source import available_releases

    releases = available_releases(lower, upper)
    if not releases:
        raise click.BadParameter(f"no sglang release between {lower} and {upper}", param_hint="--from/--to")
    progress = Progress(TextColumn("[bold]fetching and mapping"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), TimeElapsedColumn(), console=_console(stderr=True),
                        transient=True)
    with progress:
        task = progress.add_task("", total=len(releases))

        def advance(version: str) -> None:
            progress.update(task, advance=1, description=version)

        result = matrix(releases, workers=workers, use_cache=not no_cache, progress=advance)
    if png:
        import matplotlib

        matplotlib.use("Agg")
        ax = result.plot()
        ax.figure.savefig(png, dpi=130)
    if as_json:
        _emit(result.to_dict())
    else:
        from rich.table import Table

        table = Table(title=f"sglang {lower} .. {upper}: receiver loops per release")
        columns = ["release", "backend", "decode_sends_abort", "abort_fate", "dies_on_unknown", "daemon",
                   "wrapper", "bootstrap_timeout", "killing_tags"]
        for column in columns:
            table.add_column(column)
        for record in result.frame.to_dict(orient="records"):
            style = "red" if record["killing_tags"] else None
            table.add_row(*(str(record[c]) for c in columns), style=style)
        console = _console()
        console.print(table)
        console.print(f"NIXL prefill killed by the decode's ABORT: {result.window_text('nixl')}")
        if png:
            console.print(f"heatmap saved to {png}")
    raise SystemExit(GOOD)


@command.command("check")
@click.option("--source", "source", required=True, help="Source directory (a fork's checkout) or release number.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
def check_command(source, as_json):
    """CI gate: exit 1 when a sent tag is unhandled by a receiver loop or any loop can die on a frame."""
    from forensics.handlers import map_release

    handler_map = map_release(source)
    findings = handler_map.findings
    if as_json:
        _emit({
            "version": handler_map.version,
            "root": handler_map.root,
            "clean": not findings,
            "findings": [f.to_dict() for f in findings],
            "gaps": [g.to_dict() for g in handler_map.gaps],
            "backends": sorted(handler_map.backends),
        })
    else:
        console = _console()
        console.print(handler_map)
        console.print("[green]clean[/green]" if not findings else f"[red]{len(findings)} finding(s)[/red]")
    raise SystemExit(BAD if findings else GOOD)
