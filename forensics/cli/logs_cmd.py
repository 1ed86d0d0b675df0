"""``forensics logs``: the incident timeline from log files, journals and stderr."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from forensics.exitcodes import BAD, ENVIRONMENT, GOOD, INCONCLUSIVE

TABLE_COLUMNS = ["ts", "role", "host", "severity", "signature", "room", "thread", "message", "source", "line"]
JSON_EVENT_COLUMNS = ["ts", "ts_source", "ts_upper", "host", "role", "unit", "source", "line", "signature",
                      "severity", "step", "room", "rid", "rank", "thread", "message"]


def _progress_callback(paths: list[str]):
    """A rich progress bar over the bytes of the plain files being read (stderr only)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    total = 0
    for path in paths:
        p = Path(path)
        if p.is_file():
            total += p.stat().st_size
        elif p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    progress = Progress(TextColumn("[bold]reading logs"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        transient=True, console=__import__("rich.console").console.Console(stderr=True))
    task = progress.add_task("read", total=total or None)

    def advance(_label: str, nbytes: int) -> None:
        progress.advance(task, nbytes)

    return progress, advance


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--since", help="Only events at or after this time (read in --tz when it has no zone).")
@click.option("--until", help="Only events at or before this time.")
@click.option("--tz", default="UTC", show_default=True, help="Zone of times that carry none (sglang prefix).")
@click.option("--role", type=click.Choice(["prefill", "decode", "router"]), help="Role of every given source.")
@click.option("--host", help="Host name for sources that do not name one.")
@click.option("--year", type=int, help="Year for journalctl short-precise lines (they carry none).")
@click.option("--all", "show_all", is_flag=True, help="Show every event, DEBUG and INFO included.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), help="Write the events to CSV.")
def command(paths, since, until, tz, role, host, year, show_all, as_json, csv_path):
    """Parse sglang PD logs (files, .gz, directories, journal files, journalctl output, stderr)."""
    from forensics.logs import scan

    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(tz)
    except Exception:
        raise click.BadParameter(f"unknown time zone {tz!r}", param_hint="--tz") from None
    progress = None
    callback = None
    if not as_json and sys.stderr.isatty():
        progress, callback = _progress_callback(list(paths))
    try:
        if progress is not None:
            with progress:
                result = scan(list(paths), since=since, until=until, tz=tz, role=role, host=host, year=year,
                              progress=callback)
        else:
            result = scan(list(paths), since=since, until=until, tz=tz, role=role, host=host, year=year)
    except ValueError as exc:  # e.g. an unparseable --since
        raise click.BadParameter(str(exc)) from None
    readable = result.sources[result.sources["lines"] > 0] if len(result.sources) else result.sources
    if len(readable) == 0 and all(not os.path.exists(p) for p in paths):
        click.echo(f"forensics logs: nothing readable: {'; '.join(str(p) for p in result.problems)}", err=True)
        sys.exit(ENVIRONMENT)
    summary = result.summary()
    events = result.events if show_all else result.important("warning")
    if csv_path:
        result.events.to_csv(csv_path, index=False)
    critical = bool((result.events["severity"] == "critical").any())
    unreadable = [str(p) for p in result.problems if p.line is None]
    if critical:
        status = BAD
    elif len(readable) == 0 or unreadable:
        status = INCONCLUSIVE
    else:
        status = GOOD
    if as_json:
        from forensics.cli.render import emit_json, frame_records

        emit_json({
            "status": {GOOD: "clean", BAD: "findings", INCONCLUSIVE: "inconclusive"}[status],
            "summary": summary.to_dict(),
            "sources": frame_records(result.sources),
            "events": frame_records(events, JSON_EVENT_COLUMNS),
            "event_counts": result.events["signature"].value_counts().to_dict(),
            "batch_rows": int(len(result.batches)),
            "problems": [str(p) for p in result.problems],
            "notes": result.notes,
        })
        sys.exit(status)
    _print_human(result, summary, events)
    sys.exit(status)


def _print_human(result, summary, events) -> None:
    from rich.table import Table
    from rich.text import Text

    from forensics.cli.render import console

    out = console()
    out.print(summary.__rich__())
    table = Table(title=f"Events ({len(events)} shown of {len(result.events)})", show_lines=False)
    for column in TABLE_COLUMNS:
        table.add_column(column, overflow="fold", max_width=70 if column == "message" else None)
    style = {"critical": "bold red", "error": "red", "warning": "yellow"}
    for row in events.head(200).itertuples(index=False):
        values = []
        for column in TABLE_COLUMNS:
            value = getattr(row, column)
            values.append("" if value is None or (not isinstance(value, str) and _isna(value)) else str(value))
        table.add_row(*(Text(v) for v in values), style=style.get(row.severity))
    out.print(table)
    if len(events) > 200:
        out.print(f"... {len(events) - 200} more events (use --json or --csv for all)")
    out.print(Text(result.sources.to_string(index=False)))
    for note in result.notes:
        out.print(Text(f"note: {note}", style="dim"))
    for problem in result.problems:
        out.print(Text(f"problem: {problem}", style="yellow"))


def _isna(value) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False
