"""``forensics logs``: the incident timeline from log files, journals and stderr."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from forensics.cli.contract import conclude, fail_after_output
from forensics.exitcodes import EnvironmentProblem, environment_problem_from_os_error

EVENTS_SHOWN = 200  # events printed in the terminal; --json and --csv hold every one
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
@click.option("--since", help="Only events at or after this time: ISO (read in --tz when it has no zone), "
                              "epoch seconds (@1751371200), or a duration before now (30m, 2h).")
@click.option("--until", help="Only events at or before this time (same forms as --since).")
@click.option("--last", help="Only the last stretch of the logs themselves, ending at their last line (30m, 2h).")
@click.option("--tz", default="UTC", show_default=True, help="Zone of times that carry none (sglang prefix).")
@click.option("--role", type=click.Choice(["prefill", "decode", "router"]), help="Role of every given source.")
@click.option("--host", help="Host name for sources that do not name one.")
@click.option("--year", type=int, help="Year for journalctl short-precise lines (they carry none).")
@click.option("--format", "fmt", type=click.Choice(["plain", "short-iso", "short-iso-precise", "short-precise", "json",
                                                    "journal"]),
              help="Read every source in this format instead of detecting it ('journal': binary journal files).")
@click.option("--all", "show_all", is_flag=True, help="Show every event, DEBUG and INFO included.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="Write the events to CSV.")
@click.option("--each", "each_event", is_flag=True,
              help="In the text view, one line per event instead of repeated events grouped (--json never groups).")
@click.option("--sglang", "releases", multiple=True, metavar="VERSION",
              help="Also know the error lines this sglang release's own code writes (its source is fetched "
                   "once; the vulnerable and fixed releases in the cache are known already). Repeatable.")
def command(paths, since, until, last, tz, role, host, year, fmt, show_all, as_json, csv_path, each_event, releases):
    """Parse sglang PD logs (files, .gz, directories, journal files, journalctl output, stderr; - for stdin).

    Exit 0 clean (sglang lines read, nothing wrong; warnings allowed), 1 findings (critical or
    error), 3 inconclusive (the output says what was missing), 4 nothing readable or an
    output path that cannot be written.
    """
    from forensics.logs import catalogue, scan
    from forensics.sglang_source import SourceError

    for release in releases:
        try:
            catalogue.add_release(release)
        except SourceError as exc:
            raise click.BadParameter(f"sglang {release}: {exc}", param_hint="--sglang") from None
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(tz)
    except Exception:
        raise click.BadParameter(f"unknown time zone {tz!r}", param_hint="--tz") from None
    sources = _sources(paths, fmt)
    progress = None
    callback = None
    if not as_json and sys.stderr.isatty():
        progress, callback = _progress_callback(list(paths))
    options = dict(since=since, until=until, last=last, tz=tz, role=role, host=host, year=year)
    if progress is not None:
        with progress:
            result = scan(sources, progress=callback, **options)
    else:
        result = scan(sources, **options)
    if result.lines_total == 0 and any(p.unreadable for p in result.problems):
        raise EnvironmentProblem("nothing readable: " + "; ".join(str(p) for p in result.problems))
    assessment = result.assess()
    events = result.events if show_all else result.important("warning", JSON_EVENT_COLUMNS)
    known = catalogue.derived_releases()
    if not known:
        result.notes.append("sglang's own error calls are not known (no release source in the cache): a line only "
                            "they explain is counted unknown, not an event; add --sglang VERSION")

    def document() -> dict:
        from forensics.jsonable import frame_json

        return {
            "verdict": assessment.to_dict(),
            "summary": result.summary().to_dict(),
            "window": result.window.to_dict(),
            "sources": frame_json(result.sources),
            "events": frame_json(events, JSON_EVENT_COLUMNS),
            "event_counts": {str(k): int(v) for k, v in result.events["signature"].value_counts().items()},
            "batch_rows": int(len(result.batches)),
            "problems": [str(p) for p in result.problems],
            "notes": result.notes,
            "error_calls_from": list(known),  # the releases whose error-level calls the catalogue holds
        }

    def human() -> None:
        _print_human(result, assessment, events, grouped=not each_event)

    if csv_path:
        try:
            _write_csv(result.events, csv_path)
        except OSError as exc:
            # The scan is done: show it, then name the path that could not be written (exit 4).
            fail_after_output(as_json, environment_problem_from_os_error(exc, csv_path, "cannot write the CSV"),
                              document(), human)
    conclude(as_json, assessment.exit_status, document(), human, word=assessment.word)


def _sources(paths, fmt):
    """The paths as LogSources; ``--format`` overrides detection for all of them."""
    from forensics.logs import LogSource

    if fmt is None:
        return list(paths)
    if fmt == "journal":
        return [LogSource(path, kind="journal") for path in paths]
    return [LogSource(path, fmt=fmt) for path in paths]


def _write_csv(events, csv_path: str) -> None:
    """Events as CSV: rooms as plain digits (read them back with dtype={'room': 'UInt64'})."""
    events.to_csv(csv_path, index=False)


def _print_human(result, assessment, events, *, grouped: bool = True) -> None:
    """The verdict first (with its evidence), then the summary, the events (repeats grouped unless
    ``grouped`` is False), the sources."""
    import pandas as pd
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from forensics.cli.render import console
    from forensics.logs.timeline import event_line, event_widths

    out = console()
    paths = [str(source) for source in result.sources["source"]]
    names = _short_sources(paths)
    naming = dict(zip(paths, names, strict=True))
    out.print(assessment.naming_sources(naming))
    out.print(result.summary().naming_sources(naming).__rich__())
    style = {"critical": "bold red", "error": "red", "warning": "yellow"}
    rows = _event_groups(events) if grouped else [(row, 1, "", 0) for row in events.head(EVENTS_SHOWN).itertuples(index=False)]
    what = f"{len(rows)} lines for {len(events)} events" if grouped else f"{len(rows)} shown of {len(events)}"
    out.print(Text(f"Events ({what}; every one: --each, whole messages: --json)", style="bold"))
    # One line per event (or group) at any width: the room whole (an exact 64-bit id), the message
    # cut with an ellipsis to what is left of the line.
    rooms = [_cell(row, "room") for row, *_ in rows]
    signatures = pd.Series([_cell(row, "signature") for row, *_ in rows], dtype="string")
    widths = event_widths(signatures, rooms)
    for (row, count, last, distinct), room in zip(rows, rooms, strict=True):
        message = _cell(row, "message")
        if count > 1:
            rooms_said = f", {distinct} rooms" if distinct > 1 else ""
            message = f"x{count} to {last[11:19]}{rooms_said}: {message}"
        line = event_line(_cell(row, "ts")[11:19], _cell(row, "role"), _cell(row, "signature"), room,
                          message, out.width, widths)
        out.print(Text(line, style=style.get(row.severity, ""), no_wrap=True, overflow="ignore"))
    if not grouped and len(events) > EVENTS_SHOWN:
        out.print(f"... {len(events) - EVENTS_SHOWN} more events (use --json or --csv for all)")
    sources = Table(title="Sources", show_lines=False, box=box.SIMPLE_HEAD)
    # "sglang": lines recognised as sglang's, uvicorn's or CPython's; "unknown": in no known format
    for column in ("source", "format", "role", "lines", "sglang", "unknown", "events", "batches"):
        text_column = column in ("source", "format", "role")
        sources.add_column(column, overflow="fold", justify="left" if text_column else "right",
                           no_wrap=not text_column)
    for row, name in zip(result.sources.itertuples(index=False), names, strict=True):
        sources.add_row(name, str(row.format), str(row.role), f"{row.lines:,}",
                        f"{row.lines_recognised:,}", f"{row.lines_unknown:,}", f"{row.events:,}",
                        f"{row.batch_rows:,}")
    out.print(sources)
    for note in result.notes:
        out.print(Text(f"note: {note}", style="dim"))
    for problem in result.problems:
        out.print(Text(f"problem: {problem}", style="yellow"))


def _short_sources(paths: list[str]) -> list[str]:
    """Each source by its file name when the names tell them apart (the events say file:line in full
    in --json), else as given, so that the table fits 80 columns without folding paths."""
    names = [Path(path).name or path for path in paths]
    return names if len(set(names)) == len(names) else paths


def _event_groups(events) -> list[tuple]:
    """Repeated events as one row each: the events of one role and signature, in the order each
    first happened, with their count, the last one's time and how many distinct rooms they name."""
    groups: dict[tuple, list] = {}
    for row in events.itertuples(index=False):
        key = (_cell(row, "role"), _cell(row, "signature"))
        found = groups.get(key)
        if found is None:
            groups[key] = [row, 1, _cell(row, "ts"), {_cell(row, "room")} - {""}]
        else:
            found[1] += 1
            found[2] = max(found[2], _cell(row, "ts"))
            if len(found[3]) < 10_000:
                found[3].add(_cell(row, "room"))
    return [(row, count, last, len(rooms - {""})) for row, count, last, rooms in groups.values()]


def _cell(row, column: str) -> str:
    value = getattr(row, column)
    if value is None or (not isinstance(value, str) and _isna(value)):
        return ""
    return str(value)


def _isna(value) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False
