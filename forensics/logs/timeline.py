"""The public face of log forensics: scan sources into typed Evidence frames.

``scan()`` reads every source once and returns a ``LogScan`` holding the events
timeline, the batch history, per-minute access counts, line statistics and the
problems met on the way. ``timeline()`` and ``batch_stats()`` are its two most used
frames.

Displays: ``scan`` itself shows the verdict, the summary and the compact events;
``scan.events_view()`` is the compact view (time, role, signature, room whole, a short
message; ``.frame`` for it as a DataFrame), while ``scan.events`` stays the full frame.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from forensics.frames import conform, empty_frame
from forensics.logs import catalogue, timestamps, timewindow
from forensics.logs.lineformats import sniff
from forensics.logs.scanner import SourceResult, SourceScanner
from forensics.logs.schema import (
    ACCESS_COLUMNS,
    BATCH_BOOL_FIELDS,
    BATCH_COUNT_FIELDS,
    BATCH_FLOAT_FIELDS,
    BATCH_ID_COLUMNS,
    EVENT_COLUMNS,
)
from forensics.logs.sources import LogSource, Problem, SourceError, as_sources, open_stream, read_chunks

ROLE_WORDS = ("prefill", "decode", "router")
Progress = Callable[[str, int], None]  # (source label, bytes just read)


@dataclass
class LogScan:
    events: pd.DataFrame
    batches: pd.DataFrame
    access: pd.DataFrame
    sources: pd.DataFrame  # one row per source: format, role, lines, unknown lines, events, batch rows
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unknown_samples: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    window: timewindow.Window = field(default_factory=timewindow.Window)
    span: tuple = (None, None)  # first and last timed line of all sources (UTC), before the window
    # Thread dumps printed into the logs: (source, line, text), read by ``thread_dumps``.
    dump_excerpts: list[tuple[str, int, str]] = field(default_factory=list, repr=False)
    tz: str = "UTC"  # the zone the scan read times without one in

    def thread_dumps(self):
        """The thread dumps these logs hold (sglang's own "Pyspy dump for PID N" blocks, a
        faulthandler dump on a fatal signal), as ``forensics threads check`` reads them: a list of
        :class:`forensics.threads.textdump.ReadDump`, those logged outside the window left out
        (an untimed one is kept, as untimed events are)."""
        from forensics.threads.textdump import read_dump_text

        dumps = []
        for source, line, text in self.dump_excerpts:
            for dump in read_dump_text(text, source=source, first_line=line, tz=self.tz):
                if dump.logged_at is not None and not self.window.empty:
                    at = pd.Timestamp(dump.logged_at)
                    if (self.window.since is not None and at < self.window.since) or (
                            self.window.until is not None and at > self.window.until):
                        continue
                dumps.append(dump)
        return dumps

    @property
    def lines_total(self) -> int:
        return int(self.sources["lines"].sum()) if len(self.sources) else 0

    @property
    def lines_recognised(self) -> int:
        return int(self.sources["lines_recognised"].sum()) if len(self.sources) else 0

    def assess(self):
        """The verdict on this window: clean, warnings, findings or inconclusive, with evidence."""
        from forensics.logs.findings import assess

        return assess(self)

    @property
    def lines_unknown(self) -> int:
        return int(self.sources["lines_unknown"].sum()) if len(self.sources) else 0

    def summary(self):
        from forensics.logs.summary import summarise

        return summarise(self)

    def important(self, min_severity: str = "warning", columns: list[str] | None = None) -> pd.DataFrame:
        """Events at ``min_severity`` or worse (only ``columns`` when given: cheaper on big frames)."""
        order = ["critical", "error", "warning", "info", "debug"]
        keep = order[: order.index(min_severity) + 1]
        mask = self.events["severity"].isin(keep).to_numpy()
        if columns is None:
            return self.events[mask]
        return self.events.loc[mask, [c for c in columns if c in self.events.columns]]

    def events_view(self, min_severity: str | None = "warning", limit: int = 200) -> EventsView:
        """The events to read: time, role, signature, room (whole), a short message; ``scan.events``
        stays the full frame (every column, every row). ``min_severity=None`` keeps every event;
        ``limit`` caps the rows shown (``.frame`` of the view holds every selected row)."""
        events = self.events if min_severity is None else self.important(min_severity)
        return EventsView(events, total=len(self.events), limit=limit)

    def _repr_html_(self) -> str:
        # The verdict first, then the summary, then the compact events (the full frame: .events).
        return (self.assess()._repr_html_() + self.summary()._repr_html_()
                + self.events_view(limit=50)._repr_html_())

    def __rich__(self):
        from rich.console import Group

        return Group(self.assess(), self.summary().__rich__(), self.events_view(limit=50))


VIEW_COLUMNS = ["time", "role", "signature", "room", "message"]
SHORT_MESSAGE = 100  # characters of the message in the compact view; the whole one is in .events


def _short(text: str, limit: int) -> str:
    """``text`` on one line (line breaks and runs of spaces as one space), cut to ``limit`` with "…"."""
    text = " ".join(text.split()) if ("\n" in text or "\r" in text or "  " in text) else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class EventsView:
    """A compact view of events: time, role, signature, room, short message.

    Rooms are text of digits (never a float, never abbreviated) and are not wrapped in
    JupyterLab (``white-space:nowrap``). ``.frame`` is the compact frame of every selected row,
    ``.full`` the selected rows with every column (as in ``LogScan.events``).
    """

    full: pd.DataFrame
    total: int | None = None  # events in the scan the view was cut from
    limit: int = 200

    @property
    def frame(self) -> pd.DataFrame:
        events = self.full

        def text(column):
            if column not in events.columns:
                return pd.Series([""] * len(events), index=events.index, dtype="string")
            return events[column].astype("string").fillna("")

        times = events["ts"] if "ts" in events.columns else pd.Series(pd.NaT, index=events.index)
        time = pd.Series([t.strftime("%Y-%m-%d %H:%M:%S") if not pd.isna(t) else "" for t in times],
                         index=events.index, dtype="string")
        return pd.DataFrame({
            "time": time,
            "role": text("role"),
            "signature": text("signature"),
            "room": text("room"),  # UInt64 -> its digits exactly
            "message": text("message").map(lambda m: _short(m, SHORT_MESSAGE)),
            "severity": text("severity"),
        }).reset_index(drop=True)

    def __len__(self) -> int:
        return len(self.full)

    def _title(self, shown: int) -> str:
        of = f" of {self.total}" if self.total is not None else ""
        more = f" (first {shown} shown; all: .frame, every column: .full)" if shown < len(self.full) else ""
        return f"Events: {len(self.full)}{of}{more}"

    def _repr_html_(self) -> str:
        import html

        frame = self.frame.head(self.limit)
        colour = {"critical": "#fce8e6", "error": "#fdecea", "warning": "#fef7e0"}
        left = "text-align:left;vertical-align:top;padding:1px 6px"
        nowrap = f"{left};white-space:nowrap"
        head = "".join(f"<th style='{nowrap}'>{c}</th>" for c in VIEW_COLUMNS)
        rows = []
        for row in frame.itertuples(index=False):
            background = colour.get(row.severity, "")
            style = f" style='background:{background}'" if background else ""
            rows.append(
                f"<tr{style}><td style='{nowrap}'>{html.escape(row.time)}</td>"
                f"<td style='{nowrap}'>{html.escape(row.role)}</td>"
                f"<td style='{nowrap}'>{html.escape(row.signature)}</td>"
                f"<td class='pd-room' style='{nowrap};font-family:monospace'>{html.escape(row.room)}</td>"
                f"<td style='{left}' title='{html.escape(row.message, quote=True)}'>{html.escape(row.message)}</td>"
                "</tr>")
        return (f"<div class='pd-events' style='text-align:left'><b>{html.escape(self._title(len(frame)))}</b>"
                f"<table style='border-collapse:collapse;font-size:12px'><tr>{head}</tr>{''.join(rows)}</table></div>")

    def __rich_console__(self, console, options):
        from rich.text import Text

        frame = self.frame.head(self.limit)
        yield Text(self._title(len(frame)), style="bold")
        style = {"critical": "bold red", "error": "red", "warning": "yellow"}
        widths = event_widths(frame["signature"], frame["room"])
        for row in frame.itertuples(index=False):
            line = event_line(row.time[11:], row.role, row.signature, row.room, row.message, options.max_width,
                              widths)
            yield Text(line, style=style.get(row.severity, ""), no_wrap=True, overflow="ignore")


def event_widths(signatures, rooms) -> tuple[int, int]:
    """Column widths for ``event_line``: the widest signature (at most 28) and the widest room."""
    signature = min(max([0, *(len(str(s)) for s in signatures)]), 28)
    room = max([0, *(len(str(r)) for r in rooms)])
    return signature, room


def event_line(time: str, role: str, signature: str, room: str, message: str, width: int,
               widths: tuple[int, int] = (0, 0)) -> str:
    """One event on one line of ``width`` columns: time, role, signature, room, message.

    The room is never cut (a room is an exact 64-bit id); the message takes what is left and
    is cut with an ellipsis; the signature is cut only when nothing else fits.
    """
    signature_width, room_width = widths
    head = f"{time or '--:--:--':<8} {role:<7} "
    room_part = f" {room:<{room_width}}" if room_width or room else ""
    fixed = len(head) + len(room_part)
    signature_width = max(signature_width, 0)
    if fixed + max(signature_width, len(signature)) + 11 > width:
        # Not enough for the signature and 10 characters of message: the signature gives way first.
        signature = _short(signature, max(width - fixed - 11, 8))
        signature_width = min(signature_width, len(signature))
    line = head + f"{signature:<{signature_width}}" + room_part
    left = width - len(line) - 1
    if message and left >= 2:
        line += " " + _short(message, left)
    return line.rstrip()


def _role_of(unit, fallback: str) -> str:
    if isinstance(unit, str) and unit:
        lowered = unit.lower()
        for word in ROLE_WORDS:
            if word in lowered:
                return word
    return fallback


def _year_hint(source: LogSource, head: bytes) -> tuple[int | None, str | None]:
    found = re.search(rb"\[(20\d\d)-\d\d-\d\d ", head)
    if found:
        return int(found.group(1)), f"{source.label}: short-precise journal lines carry no year; took {found.group(1).decode()} from the sglang prefixes"
    try:
        year = pd.Timestamp(os.stat(source.path).st_mtime, unit="s").year
    except OSError:
        return None, None
    return year, f"{source.label}: short-precise journal lines carry no year; assumed {year} from the file's modification time"


def _scan_one(source: LogSource, tz: str, year: int | None, progress: Progress | None,
              problems: list[Problem], notes: list[str]) -> SourceResult | None:
    try:
        stream = open_stream(source)
    except SourceError as exc:
        problems.append(Problem(source.label, None, exc.reason, unreadable=True))
        return None
    scanner = None
    problems_before = len(problems)
    try:
        for chunk in read_chunks(stream, source, problems):
            if scanner is None:
                # The stream knows its format when the source states it or journalctl wrote it.
                fmt = stream.fmt or sniff(chunk.data[:65536])
                source_year = year
                if fmt == "short-precise" and year is None:
                    source_year, note = _year_hint(source, chunk.data[:1 << 20])
                    if note:
                        notes.append(note)
                scanner = SourceScanner(source, fmt, tz=tz, year=source_year)
            scanner.feed(chunk)
            if progress is not None:
                progress(source.label, len(chunk.data))
    finally:
        stream.close()  # a journalctl that failed was already reported by read_chunks
    if scanner is None:
        if len(problems) == problems_before:  # nothing went wrong: there was just nothing there
            problems.append(Problem(source.label, None, "empty: no lines to read"))
        return SourceResult(source=source, fmt="unknown")
    result = scanner.finish()
    problems.extend(result.problems)
    if result.lines_unknown:
        first = result.unknown_samples[0] if result.unknown_samples else (None, "")
        problems.append(Problem(source.label, first[0],
                                f"{result.lines_unknown} of {result.lines_total} lines are in no known format "
                                f"(first: {first[1][:80]!r})"))
    return result


def scan(sources: Iterable[str | os.PathLike | LogSource] | str | os.PathLike | LogSource, *,
         since=None, until=None, last=None, tz: str = "UTC", role: str | None = None,
         host: str | None = None, year: int | None = None, progress: Progress | None = None) -> LogScan:
    """Read every source once; return events, batch history, access counts and problems.

    ``tz`` says how to read times without a zone (sglang's prefix, journalctl
    short-precise); journal timestamps win where present. ``since``/``until`` bound the
    frames: ISO times (naive ones read in ``tz``), epoch seconds, or durations before now
    (``30m``); ``last`` (``30m``) keeps the last stretch of the logs themselves
    (see ``timewindow``). Events without any time are kept whatever the window, and
    counted in a note.

    Example: ``fx.logs.scan(["prefill.log", "decode.log.1.gz"], tz="UTC").assess()``
    """
    bounds = timewindow.window(since, until, last, tz)  # bad bounds fail before any reading
    if isinstance(sources, (str, os.PathLike, LogSource)):
        sources = [sources]
    expanded = as_sources(sources, role=role, host=host)
    problems: list[Problem] = []
    notes: list[str] = []
    results = []
    for source in expanded:
        result = _scan_one(source, tz, year, progress, problems, notes)
        if result is not None:
            results.append(result)
    return _assemble(results, problems, notes, bounds, tz)


def _source_role(result: SourceResult) -> str:
    guessed = result.source.guessed_role()
    if guessed:
        return guessed
    if result.units:
        unit_role = _role_of(result.units.most_common(1)[0][0], "")
        if unit_role:
            return unit_role
    if result.saw_prefill_batch and not result.saw_decode_batch:
        return "prefill"
    if result.saw_decode_batch and not result.saw_prefill_batch:
        return "decode"
    return "unknown"


def _span(results: list[SourceResult], tz: str) -> tuple[pd.Timestamp | None, pd.Timestamp | None]:
    """First and last timed line over every source (UTC), or None where no line had a time."""
    firsts, lasts = [], []
    for result in results:
        for bound, out in ((result.first_time, firsts), (result.last_time, lasts)):
            if bound is not None and bound[0] is not None:
                stamp = timestamps.convert(bound[0], [bound[1]], tz=tz, year=result.year)[0]
                if not pd.isna(stamp):
                    out.append(stamp)
    return (min(firsts) if firsts else None, max(lasts) if lasts else None)


def _assemble(results: list[SourceResult], problems, notes, bounds: timewindow.Window, tz) -> LogScan:
    event_frames, batch_frames, access_frames, source_rows = [], [], [], []
    samples = {}
    excerpts = [(result.source.label, line, text) for result in results for line, text in result.dump_excerpts]
    for result in results:
        role = _source_role(result)
        explicit_role = result.source.role
        default_host = result.source.host or (result.hosts.most_common(1)[0][0] if result.hosts else "local")
        events = _events_frame(result, role, explicit_role, default_host, tz)
        batches = _batch_frame(result, role, explicit_role, default_host)
        access = _access_frame(result, role, explicit_role, default_host, tz)
        event_frames.append(events)
        batch_frames.append(batches)
        access_frames.append(access)
        samples[result.source.label] = result.unknown_samples
        source_rows.append({
            "source": result.source.label, "format": result.fmt, "role": role, "host": default_host,
            "lines": result.lines_total, "lines_unknown": result.lines_unknown,
            "lines_recognised": result.lines_recognised,
            "events": len(events), "batch_rows": len(batches),
            "access_lines": int(sum(result.access.values())),
        })
    events = _concat(event_frames, EVENT_COLUMNS)
    batches = _batches(batch_frames)
    access = _concat(access_frames, ACCESS_COLUMNS)
    span = _span(results, tz)
    bounds = bounds.resolve(span[1])
    untimed = int(events["ts"].isna().sum())
    if untimed and not bounds.empty:
        notes.append(f"{untimed} events carry no time (ts_source none); they are kept whatever the window")
    events = _window(events, "ts", bounds)
    batches = _window(batches, "ts", bounds)
    access = _window(access, "minute", bounds)
    events = events.sort_values(["ts", "source", "line"], kind="stable", na_position="last").reset_index(drop=True)
    access = access.sort_values(["minute", "path"], kind="stable", na_position="last").reset_index(drop=True)
    sources = pd.DataFrame(source_rows, columns=["source", "format", "role", "host", "lines", "lines_unknown",
                                                 "lines_recognised", "events", "batch_rows", "access_lines"])
    events.attrs["problems"] = [str(p) for p in problems]
    return LogScan(events=events, batches=batches, access=access, sources=sources, problems=problems,
                   notes=notes, unknown_samples=samples, window=bounds, span=span, dump_excerpts=excerpts, tz=tz)


def _concat(frames: list[pd.DataFrame], columns: dict[str, str]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_frame(columns)
    return conform(pd.concat(frames, ignore_index=True), columns, coerce=True)


def _window(frame: pd.DataFrame, column: str, bounds: timewindow.Window) -> pd.DataFrame:
    """Rows inside the window; rows without a time stay (a window cannot place them)."""
    if bounds.since is None and bounds.until is None:
        return frame
    times = frame[column]
    mask = times.isna().to_numpy()
    inside = np.ones(len(frame), dtype=bool)
    if bounds.since is not None:
        inside &= (times >= bounds.since).fillna(False).to_numpy()
    if bounds.until is not None:
        inside &= (times <= bounds.until).fillna(False).to_numpy()
    keep = mask | inside
    if keep.all():
        return frame
    return frame[keep].reset_index(drop=True)


# Columns of an event dict that hold integers: built straight into nullable integer arrays
# from Python ints, never through a float column (rooms are 63-bit and more).
_EVENT_INT_COLUMNS = ("room", "line", "rank", "dp_rank", "pp_rank", "offset", "frame_line")
_EVENT_TEXT_COLUMNS = ("ts_source", "host", "unit", "source", "signature", "severity", "step", "rid", "thread",
                       "message", "raw", "frame_file", "frame_function")


def _event_times(kinds: list, values: list, tz: str, year) -> pd.Series:
    """Each event's time from its (kind, text) pair, converted in bulk per kind."""
    n = len(kinds)
    present = set(kinds)
    present.discard(None)
    if len(present) == 1 and None not in kinds:  # the common case: one kind of time for all
        converted = timestamps.convert(next(iter(present)), values, tz=tz, year=year)
        return pd.Series(converted.astype("datetime64[ns, UTC]"), index=range(n))
    stamps = pd.Series(pd.NaT, index=range(n), dtype="datetime64[ns, UTC]")
    for kind in present:
        rows = [index for index, value in enumerate(kinds) if value == kind]
        converted = timestamps.convert(kind, [values[i] for i in rows], tz=tz, year=year)
        stamps.iloc[rows] = converted.astype("datetime64[ns, UTC]")
    return stamps


def _events_frame(result: SourceResult, role, explicit_role, default_host, tz) -> pd.DataFrame:
    from forensics.logs.eventcolumns import EVERY_EVENT_KEY as _EVERY_EVENT_KEY
    from forensics.logs.eventcolumns import column_lists, int_array, text_array

    events = result.events
    if not events:
        return empty_frame(EVENT_COLUMNS)
    # Every event has the keys of an ordinary event; frame_* and _upper_* only some.
    values = column_lists(events, ("_ts_kind", "_ts_value", "_upper_kind", "_upper_value")
                          + _EVENT_INT_COLUMNS + _EVENT_TEXT_COLUMNS, every=_EVERY_EVENT_KEY)
    columns: dict[str, object] = {
        "ts": _event_times(values["_ts_kind"], values["_ts_value"], tz, result.year),
        "ts_upper": _event_times(values["_upper_kind"], values["_upper_value"], tz, result.year),
    }
    for name in _EVENT_INT_COLUMNS:
        columns[name] = int_array(values[name], EVENT_COLUMNS.get(name, "Int64"))
    for name in _EVENT_TEXT_COLUMNS:
        columns[name] = text_array(values[name])
    frame = pd.DataFrame(columns)
    frame["host"] = frame["host"].fillna(default_host)
    if explicit_role:
        frame["role"] = explicit_role
    else:
        roles = {unit: _role_of(unit, role) for unit in set(values["unit"])}
        frame["role"] = [roles[unit] for unit in values["unit"]]
    return frame


def _batch_columns(frames: list[pd.DataFrame]) -> dict[str, str]:
    columns = dict(BATCH_ID_COLUMNS)
    present = set()
    for frame in frames:
        present.update(frame.columns)
    for name in BATCH_COUNT_FIELDS:
        columns[name] = "Int64"
    for name in BATCH_FLOAT_FIELDS:
        columns[name] = "float32"
    for name in BATCH_BOOL_FIELDS:
        columns[name] = "boolean"
    columns["unit"] = "category"
    for name in sorted(present - set(columns)):
        columns[name] = "float32"  # a field a newer release prints that the schema does not list yet
    return columns


def _batch_frame(result: SourceResult, role, explicit_role, default_host) -> pd.DataFrame:
    if not len(result.batches):
        return pd.DataFrame()
    return result.batches.frame(result.source.label, default_host, _role_of, role, explicit_role)


def _batches(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One batch frame in the documented column order, without more copies than needed."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return conform(pd.DataFrame(), _batch_columns([]), coerce=True)
    if len(frames) == 1:
        frame = frames[0]
    else:
        frame = pd.concat(frames, ignore_index=True)
        for name in ("ts_source", "kind", "host", "unit", "source", "role"):
            frame[name] = frame[name].astype("category")
    n = len(frame)
    ordered = {}
    for name in _batch_columns([frame]):
        if name in frame.columns:
            ordered[name] = frame[name]
        else:
            # A documented field no line printed: all-missing, stored sparse (no memory per row).
            ordered[name] = pd.Series(pd.arrays.SparseArray(np.full(n, np.nan, dtype=np.float32)), index=frame.index)
    result = pd.DataFrame(ordered, copy=False)
    if not result["ts"].is_monotonic_increasing:
        result = result.sort_values("ts", kind="stable", na_position="last")
    return result.reset_index(drop=True)


def _access_frame(result: SourceResult, role, explicit_role, default_host, tz) -> pd.DataFrame:
    if not result.access:
        return empty_frame(ACCESS_COLUMNS)
    keys = list(result.access.keys())
    minutes, zones, hosts, units, methods, paths, statuses = zip(*keys)
    kind = result.access_minute_kind
    if kind == timestamps.EPOCH_US:
        stamps = pd.to_datetime([m if m is not None else np.nan for m in minutes], unit="us", utc=True)
    else:
        # Minutes were kept as text up to the minute (plus the zone where the format has one).
        values = [m + b":00" + (z or b"") if m is not None else b"" for m, z in zip(minutes, zones)]
        stamps = timestamps.convert(kind, values, tz=tz) if values else pd.DatetimeIndex([], tz="UTC")
    def text(values):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values]
    unit_text = text(units)
    frame = pd.DataFrame({
        "minute": stamps,
        "host": [h or default_host for h in text(hosts)],
        "role": explicit_role or [_role_of(u, role) for u in unit_text],
        "source": result.source.label,
        "method": text(methods),
        "path": text(paths),
        "status": [int(s) for s in statuses],
        "count": list(result.access.values()),
        "unit": unit_text,
    })
    labels = {key: catalogue.access_signature(*key) for key in set(zip(frame["method"], frame["path"], frame["status"]))}
    frame["signature"] = [labels[key] for key in zip(frame["method"], frame["path"], frame["status"])]
    return frame


def timeline(sources, since=None, until=None, **options) -> pd.DataFrame:
    """The events of every source, merged by time (see ``schema.EVENT_COLUMNS``)."""
    return scan(sources, since=since, until=until, **options).events


def batch_stats(sources, since=None, until=None, **options) -> pd.DataFrame:
    """One numeric row per "Prefill batch"/"Decode batch" line, merged by time."""
    return scan(sources, since=since, until=until, **options).batches


def summary(scan_or_sources, **options):
    """Key facts in words: first thread death, its trigger, rooms affected, last real prefill batch."""
    result = scan_or_sources if isinstance(scan_or_sources, LogScan) else scan(scan_or_sources, **options)
    return result.summary()
