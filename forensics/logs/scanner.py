"""Scan one source's chunks into events, batch rows, access counts and line counts.

Speed comes from not visiting most lines in Python at all:

* rare signature lines are found by ``bytes.find`` of each catalogue literal, and only
  those lines (plus the traceback lines that follow a thread death) take the slow,
  exact path through the catalogue;
* batch lines are found by their literal and parsed by field layout (batchlines.py);
* access lines are found by their literal and only counted per minute and path;
* every other line is only counted, in bulk, by its prefix; if that count says some
  lines fit no known format, that chunk is walked line by line to name them.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from forensics.logs import batchlines, catalogue, classify_bulk, timestamps
from forensics.logs.accessscan import AccessLineScan
from forensics.logs.batchscan import FAST_FORMATS, TS_KIND, BatchLineScan
from forensics.logs.batchstore import BatchStore
from forensics.logs.lineformats import (
    AIOHTTP_UNCLOSED,
    ANSI_LINE,
    GLOG_FAILURE,
    GLOG_LINE,
    JOURNAL_ISO,
    JOURNAL_META,
    JOURNAL_PRECISE,
    LIBRARY_LINE,
    MINI_LB_LINE,
    MONTH_PREFIXES,
    PYTHON_WARNING,
    SGLANG_PREFIX,
    THREAD_DUMP_LINE,
    THREAD_DUMP_OPENER,
    TQDM_LINE,
    UVICORN_ACCESS,
    UVICORN_PLAIN,
    WARNING_MAX_LINES,
    WARNING_SOURCE,
    parse_ranks,
    split_line,
)
from forensics.logs.prefilter import LiteralPrefilter
from forensics.logs.schema import RAW_LIMIT
from forensics.logs.sources import Chunk, LogSource, Problem
from forensics.logs.tracebacks import HEADER, Block, BlockTracker, line_kind
from forensics.redact import redact_text

try:  # the compiled fast path (forensics/logs/_fastscan.c); optional, built when a compiler exists
    from forensics.logs import _fastscan
except ImportError:  # pragma: no cover - depends on the install
    _fastscan = None

TRACEBACK_HEADER = "Traceback (most recent call last):"
TRACEBACK_LITERAL = TRACEBACK_HEADER.encode()
UNKNOWN_SAMPLES = 20
ROOM_LIMIT = 1 << 64  # rooms are unsigned 64-bit at most (the room column is UInt64)
_JOURNAL_PREFIX = {"short-iso": JOURNAL_ISO.pattern, "short-precise": JOURNAL_PRECISE.pattern}
JSON_MESSAGE_KEY = b'"MESSAGE"'  # a catalogue literal that starts so is matched on the raw JSON record
_BULK_PREFIX = {"plain": b"[20", "short-iso": b"2"}  # what _bulk_known counts, for _fastscan.count_lines
# How a message that starts with sglang's "[2025-..." prefix shows in each journal format.
# (journalctl writes compact JSON; json.dumps-style output has a space after the colon.)
_SGLANG_IN_MESSAGE = {"short-iso": (b": [20",), "short-precise": (b": [20",),
                      "json": (b'"MESSAGE":"[20', b'"MESSAGE": "[20')}


# Access line -> its counting key (minute, zone, host, unit, method, path, status) in one match.
# sglang gives uvicorn's access logger its own "[%(asctime)s] " prefix (set_uvicorn_logging_configs),
# so the level may follow a bracketed time; the journal's time is the one used.
_ACCESS_KEY = {
    "short-iso": re.compile(
        rb"(\d{4}-\d\d-\d\dT\d\d:\d\d):\d\d(?:[.,]\d+)?(Z|[+-]\d\d:?\d\d)? (\S+) ([^\s\[:]+)(?:\[\d+\])?: ?"
        rb'(?:\[[^\]\n]*\] )?(?:INFO|WARNING|ERROR|DEBUG):\s+\S+ - "([A-Z]+) (\S+) HTTP/[\d.]+" (\d{3})'),
    "short-precise": re.compile(
        rb"([A-Z][a-z]{2} [ \d]\d \d\d:\d\d):\d\d(?:\.\d+)?() (\S+) ([^\s\[:]+)(?:\[\d+\])?: ?"
        rb'(?:\[[^\]\n]*\] )?(?:INFO|WARNING|ERROR|DEBUG):\s+\S+ - "([A-Z]+) (\S+) HTTP/[\d.]+" (\d{3})'),
}


# A rare line, whole: (journal prefix)? (sglang prefix)? message, for findall over many joined
# lines (one match per line). Each optional part matches exactly as split_line and
# SGLANG_PREFIX.match would on that line alone.
_RARE_LINE_RE = {
    "plain": re.compile(rb"(?m)^(?:" + SGLANG_PREFIX.pattern + rb")?(.*)$"),
    **{fmt: re.compile(rb"(?m)^(?:" + prefix + rb")?(?:" + SGLANG_PREFIX.pattern + rb")?(.*)$")
       for fmt, prefix in _JOURNAL_PREFIX.items()},
}


def _combined(fmt: str, tail: bytes) -> re.Pattern[bytes]:
    """Journal prefix (when the format has one) + optional sglang prefix + ``tail``."""
    prefix = _JOURNAL_PREFIX.get(fmt, b"")
    return re.compile(prefix + b"(?:" + SGLANG_PREFIX.pattern + b")?" + tail)


@dataclass
class SourceResult:
    source: LogSource
    fmt: str
    events: list[dict] = field(default_factory=list)
    batches: BatchStore = field(default_factory=BatchStore)
    access: Counter = field(default_factory=Counter)
    access_minute_kind: str = timestamps.SGLANG
    lines_total: int = 0
    lines_unknown: int = 0
    unknown_samples: list[tuple[int, str]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    hosts: Counter = field(default_factory=Counter)
    units: Counter = field(default_factory=Counter)
    saw_prefill_batch: bool = False
    saw_decode_batch: bool = False
    year: int | None = None  # the year short-precise times were read in
    lines_recognised: int = 0  # sglang-prefixed, uvicorn and CPython traceback lines
    first_time: tuple | None = None  # (kind, value) of the first timed line
    last_time: tuple | None = None  # (kind, value) of the last timed line
    # Thread dumps printed into the log (py-spy's text after sglang's "Pyspy dump for PID N",
    # faulthandler's): (line of the line before the dump, that line and the dump's, redacted).
    dump_excerpts: list[tuple[int, str]] = field(default_factory=list)
    dump_bytes: int = 0


DUMP_BYTES_KEPT = 16 * 1024 * 1024  # of thread dumps per source (a 200-thread dump is about 100 KiB)
DUMP_FOREIGN_LINES = 20  # lines in no dump format, in a row, that a dump is read on through (damage)


def _after_progress_bar(line: bytes) -> bool:
    """A Python warning's first line glued to a tqdm redraw: tqdm ends its bar with a carriage return
    only, so a warning printed while the bar is up follows it on the same line (real sglang 0.5.15 at
    a restart: "Multi-thread loading shards:   0% Completed | 0/1 [00:00<?, ?it/s]/.../awq.py:52:
    UserWarning: ...")."""
    return bool(TQDM_LINE.match(line) and PYTHON_WARNING.search(line))


class SourceScanner(BatchLineScan, AccessLineScan):
    def __init__(self, source: LogSource, fmt: str, tz: str = "UTC", year: int | None = None) -> None:
        self.source = source
        self.fmt = fmt
        self.tz = tz
        self.year = year
        self.result = SourceResult(source=source, fmt=fmt, year=year)
        self.line_base = 0  # lines before the current chunk
        self.blocks = BlockTracker()
        self.shapes: dict[bytes, batchlines.Shape] = {}
        self.batch_re = _combined(fmt if fmt != "json" else "plain", batchlines.HEADER.pattern)
        # The same with the field list captured, for findall over many joined lines; anchored
        # at line starts, as match() is, so a line is read the same whichever group it is in.
        self.batch_row_re = re.compile(rb"(?m)^" + _combined(
            fmt if fmt != "json" else "plain", batchlines.HEADER.pattern + rb"([^\n]*)").pattern)
        self.access_key_re = _ACCESS_KEY.get(fmt)
        literals = catalogue.literals() + (TRACEBACK_LITERAL,)
        if fmt == "json":
            # The message is a JSON string there: look for each literal as JSON writes it, except
            # the ones that spell the record's own "MESSAGE" key (a message's first characters).
            literals = tuple(lit if lit.startswith(JSON_MESSAGE_KEY) else json.dumps(lit.decode())[1:-1].encode()
                             for lit in literals)
        # One pass over a chunk for all literals (Hyperscan where installed), not one per literal.
        self.prefilter = LiteralPrefilter(literals)
        self._literal_text = [literal.decode("utf-8", "replace") for literal in self.prefilter.literals]
        self.last_time: tuple[str, object] | None = None  # (kind, value) of the last timed line
        self.last_minute: bytes | None = None
        self.pending_times: list[dict] = []  # events still waiting for a time from a later line
        self.last_event: dict | None = None
        self.pending_block: Block | None = None  # finished, but a chained exception may follow
        self.pending_grace = 0
        self.last_event_line = -10
        self._label = source.label  # the event path's caches: source label, host/unit names, ranks
        self._origin_names: dict[bytes, str] = {}
        self._ranks_cache: dict[bytes, tuple] = {}
        if fmt in ("short-iso", "short-precise", "json"):
            self.result.access_minute_kind = TS_KIND[fmt]
        # The compiled path interns layouts and origins (host, unit) to small ids across chunks.
        self.fast = _fastscan if fmt in FAST_FORMATS else None
        self.fast_layouts: dict[bytes, int] = {}
        self.fast_shapes: list[batchlines.Shape] = []
        self.fast_origins: dict[bytes, int] = {}
        self.fast_origin_names: list[tuple[str, str]] = []
        self.dump: list[bytes] | None = None  # the thread dump being read, its line before it first
        self.dump_line = 0  # the line number of self.dump's first line
        self.dump_foreign = 0  # lines in a row inside it in no dump format (a damaged dump's)
        self.before_dump: tuple[int, bytes] = (0, b"")  # the last non-blank line outside a dump

    # ------------------------------------------------------------------ chunk
    def feed(self, chunk: Chunk) -> None:
        data = chunk.data
        if chunk.truncated_line:
            self.result.problems.append(Problem(
                self.source.label, self.line_base + 1,
                f"line longer than {len(data) - 1} bytes; kept its first {len(data) - 1} bytes"))
        consumed: set[int] = set()
        slow_known = 0  # untimed lines the slow path recognised (traceback parts)
        # 1. Rare lines: every catalogue literal, then the traceback lines that follow.
        # Which literals each line holds, where the rare lines are classified in bulk.
        hits = self.prefilter.line_hits(data) if self.fmt in _RARE_LINE_RE else None
        starts = set(hits) if hits is not None else set(self.prefilter.line_starts(data))
        if self.fmt == "plain" and GLOG_FAILURE.match(data):
            # The prefilter finds a glog error line by the newline before it; the chunk's first has none.
            starts.add(0)
            if hits is not None:
                hits.setdefault(0, set())
        if self.blocks.active or self.pending_block is not None:
            starts.add(0)
        starts = sorted(starts)
        # Lines, lines that start in the format (see _bulk_known) and the line number of
        # every rare line, in one compiled pass.
        counted = self.fast.count_lines(data, _BULK_PREFIX[self.fmt], starts) if self.fast is not None else None
        n_lines = counted[0] if counted else data.count(b"\n")
        # The rare lines that carry sglang's prefix (nearly all of them) are taken apart and
        # classified together, once per chunk; the walk below then only emits them in order.
        prepared = self._prepare_rare(data, starts, hits) if hits is not None else None
        line_no = self.line_base  # lines before last_position
        last_position = 0
        size = len(data)
        blocks = self.blocks
        for index, start in enumerate(starts):
            if start < last_position:
                continue  # already walked as part of a traceback
            if counted:
                line_no = self.line_base + counted[2][index]
            else:
                line_no += data.count(b"\n", last_position, start)
            position = start
            ready = prepared[index] if prepared is not None else None
            while position < size:
                end = data.find(b"\n", position)
                consumed.add(position)
                line = data[position:end]
                if ready is not None:
                    self._ready_line(ready, line_no + 1, chunk.offset + position)
                    ready = None
                elif self._slow_line(line, line_no + 1, chunk.offset + position, data, position):
                    slow_known += 1
                line_no += 1
                position = end + 1
                if blocks.open:
                    for block in blocks.expire(line_no):
                        self._emit_block(block)
                if not blocks.open and self.pending_block is None:
                    break
            last_position = position
        # 2. Batch lines.
        self._batch_lines(data, consumed)
        # 3. Access lines.
        access_count = self._access_lines(data, consumed)
        # 4. Bulk counting of lines in a known format; walk the chunk only if some are not.
        known = counted[1] if counted else self._bulk_known(data)
        # Lines that are sglang's own (its prefix), uvicorn's or CPython's: what "clean" rests on.
        sglang_lines = known if self.fmt == "plain" else sum(map(data.count, _SGLANG_IN_MESSAGE[self.fmt]))
        self.result.lines_recognised += min(n_lines, sglang_lines + slow_known + access_count)
        if self.fmt == "plain":
            known += slow_known + access_count
        if known < n_lines:
            self._walk_unknown(data, consumed)
        elif self.fmt == "plain":
            self._end_dump()  # every line of this chunk is a log line: no dump goes on through it
            self._remember_line_before_dump(data, self.line_base + n_lines)
        for block in self.blocks.expire(self.line_base + n_lines):
            self._emit_block(block)
        if self.result.first_time is None:
            self.result.first_time = self._time_after(b"\n" + data, 0, max_lines=400)
        self._remember_last_time(data)
        self.line_base += n_lines
        self.result.lines_total += n_lines

    # ------------------------------------------------------------- slow path
    def _split(self, line: bytes):
        line = line.rstrip(b"\r")
        split = split_line(line, self.fmt)
        if split is None:
            return None, line
        return split, split.message

    def _line_time(self, split, message: bytes) -> tuple[str, str | None, object]:
        """(ts_source, kind, value) of a line from its own text."""
        if split is not None and split.journal_ts is not None:
            return "journal", TS_KIND[self.fmt], split.journal_ts
        prefix = SGLANG_PREFIX.match(message)
        if prefix:
            return "sglang", timestamps.SGLANG, prefix.group(1)
        return "none", None, None

    def _slow_line(self, line: bytes, line_no: int, offset: int, data: bytes, position: int) -> bool:
        """Handle one rare line exactly. True when it is an untimed traceback line we recognised."""
        split, message = self._split(line)
        if split is not None and split.host:
            self.result.hosts[split.host] += 1
        if split is not None and split.unit:
            self.result.units[split.unit] += 1
        time = self._line_time(split, message)
        prefix = SGLANG_PREFIX.match(message)
        body = message[prefix.end():] if prefix else message
        text = body.decode("utf-8", "replace").replace("\x00", "\ufffd")
        kind = line_kind(text) if prefix is None else "prefixed"
        if self.pending_block is not None:
            # A finished traceback may still chain ("During handling of the above exception ...").
            if kind == "chain":
                self.pending_block = None
            elif kind == "blank" and self.pending_grace > 0:
                self.pending_grace -= 1
                return True
            else:
                self._emit_block(self.pending_block)
                self.pending_block = None
        if prefix is None:
            if kind == "header":
                header = HEADER.match(text)
                block = Block(thread=header.group("thread"), target=header.group("target"), first_line=line_no,
                              first_offset=offset, first_ts=time,
                              host=split.host if split is not None else None,
                              unit=split.unit if split is not None else None)
                if time[1] is None:
                    self._infer_time_later(block, data, position)
                self.blocks.start(block)
                return True
            if kind == "traceback" and not self.blocks.expects("traceback"):
                # A logger.exception traceback: it belongs to the event logged just before it.
                owner = self.last_event if line_no - self.last_event_line <= 3 else None
                block = Block(thread=None, target=None, first_line=line_no, first_offset=offset,
                              first_ts=time, owner=owner)
                self.blocks.start(block)
                return True
            if kind in ("traceback", "file", "code", "exception", "chain", "blank") and (
                    self.blocks.active or kind == "chain"):
                taken, finished = self.blocks.offer(text, kind, line_no)
                if taken:
                    if kind == "exception":
                        self._final_exception_event(text, line, line_no, offset, split, finished)
                    if finished is not None:
                        self.pending_block = finished
                        self.pending_grace = 3
                    return True
        matched = catalogue.classify(text)
        embedded = kind != "traceback" and text.rstrip().endswith(TRACEBACK_HEADER)
        if matched is None or matched[0].id == "thread_death":
            if embedded:  # "... error: Traceback (most recent call last):": the frames follow
                self._start_embedded_block(None, line_no, offset, time, split)
            return False
        signature, fields = matched
        ranks = parse_ranks(prefix.group(2)) if prefix else (None, None, None)
        event = self._event(signature, fields, text, line, line_no, offset, split, time, ranks)
        if time[1] is None:
            self._infer_time_later(event, data, position)
        if embedded:
            self._start_embedded_block(event, line_no, offset, time, split)
        return False

    def _start_embedded_block(self, owner, line_no: int, offset: int, time, split) -> None:
        """A traceback sglang logs inside a message (``logger.error(f"... error: {format_exc()}")``):
        real 0.5.13 writes "Can not initialize OpenAIServingResponses, error: Traceback (most recent
        call last):" and the frames on the lines after. The block belongs to that line's event, or
        is its own python_traceback event when the message is not catalogued: never unknown lines."""
        self.blocks.start(Block(thread=None, target=None, first_line=line_no, first_offset=offset, first_ts=time,
                                owner=owner, host=split.host if split is not None else None,
                                unit=split.unit if split is not None else None))

    def _prepare_rare(self, data: bytes, starts: list[int], hits: dict[int, set[int]]) -> list | None:
        """The rare lines at ``starts`` that carry sglang's prefix, taken apart and classified in bulk.

        One item per start: None where the line needs the full path (no sglang prefix:
        traceback lines, uvicorn lines; a message that opens a traceback; or a line out
        of format), else
        ``(host, unit, time, ranks, text, raw, matched)``, the very values ``_slow_line``
        would compute for it one by one. ``hits`` (from the prefilter) names the literals
        each line holds, so only those signatures are tried. Returns None when the whole
        chunk should take the line-by-line path (few rare lines, carriage returns).
        """
        if len(starts) < 8:
            return None
        find = data.find
        lines = [data[start:find(b"\n", start)] for start in starts]
        joined = b"\n".join(lines)
        if b"\r" in joined:
            return None  # _split strips it first; keep those chunks on the exact path
        rows = _RARE_LINE_RE[self.fmt].findall(joined)
        if len(rows) != len(lines):
            return None
        journal = self.fmt != "plain"
        # (journal ts, host, unit, sglang ts, ranks, body) per line; '' where a part is absent.
        parts = [(row[0], row[1], row[2], row[4], row[5], row[6]) if journal else (b"", b"", b"", row[0], row[1], row[2])
                 for row in rows]
        picked = [i for i, part in enumerate(parts) if part[3]]  # sglang's prefix matched
        if not picked:
            return None
        bodies = b"\n".join([parts[i][5] for i in picked])
        if bodies.isascii():
            texts = bodies.decode("ascii").replace("\x00", "\ufffd").split("\n")
        else:
            texts = [parts[i][5].decode("utf-8", "replace").replace("\x00", "\ufffd") for i in picked]
        picked_lines = b"\n".join([lines[i] for i in picked])
        if picked_lines.isascii():
            raws = picked_lines.decode("ascii").replace("\x00", "\ufffd").split("\n")
        else:
            raws = [lines[i].decode("utf-8", "replace").replace("\x00", "\ufffd") for i in picked]
        literal_text = self._literal_text
        nothing: tuple = ()
        held = [[literal_text[i] for i in hits.get(starts[row], nothing)] for row in picked]
        matches = classify_bulk.classify_many(texts, held)
        names = self._origin_names
        ts_kind = TS_KIND.get(self.fmt)
        prepared: list = [None] * len(lines)
        for i, text, raw, matched in zip(picked, texts, raws, matches):
            if text.rstrip().endswith(TRACEBACK_HEADER):
                continue  # a traceback opens inside the message: _slow_line starts its block
            journal_ts, host, unit, sglang_ts, ranks, _ = parts[i]
            if journal_ts:
                host_name = names.get(host)
                if host_name is None:
                    host_name = names[host] = host.decode("utf-8", "replace")
                unit_name = names.get(unit)
                if unit_name is None:
                    unit_name = names[unit] = unit.decode("utf-8", "replace")
                time = ("journal", ts_kind, journal_ts)
            else:
                host_name = unit_name = None
                time = ("sglang", timestamps.SGLANG, sglang_ts)
            prepared[i] = (host_name, unit_name, time, ranks, text, raw, matched)
        return prepared

    def _ready_line(self, ready, line_no: int, offset: int) -> None:
        """``_slow_line`` for a line ``_prepare_rare`` already took apart (it has sglang's prefix)."""
        host, unit, time, ranks, text, raw, matched = ready
        if host:
            self.result.hosts[host] += 1
        if unit:
            self.result.units[unit] += 1
        if self.pending_block is not None:
            # A prefixed line ends a finished traceback's chance of chaining.
            self._emit_block(self.pending_block)
            self.pending_block = None
        if matched is None or matched[0].id == "thread_death":
            return
        signature, fields = matched
        parsed = self._ranks_cache.get(ranks)
        if parsed is None:
            parsed = self._ranks_cache[ranks] = parse_ranks(ranks)
        self._new_event(signature, fields, text, raw, line_no, offset, host, unit, time, parsed)

    def _final_exception_event(self, text, line, line_no, offset, split, block) -> None:
        """The last line of a traceback can itself be a signature (the NIXL GUARD assertion)."""
        matched = catalogue.classify(text)
        if matched is None or matched[0].id == "thread_death":
            return
        signature, fields = matched
        time = self._line_time(split, text.encode())
        if time[1] is None and block is not None:
            time = block.first_ts
        event = self._event(signature, fields, text, line, line_no, offset, split, time, (None, None, None))
        if block is not None and block.thread is not None:
            event["thread"] = block.label

    def _event(self, signature, fields, text, line, line_no, offset, split, time, ranks) -> dict:
        return self._new_event(
            signature, fields, text, line.decode("utf-8", "replace").replace("\x00", "\ufffd"), line_no, offset,
            split.host if split is not None and split.host else None,
            split.unit if split is not None and split.unit else None, time, ranks)

    def _new_event(self, signature, fields, text, raw, line_no, offset, host, unit, time, ranks) -> dict:
        ts_source, ts_kind, ts_value = time
        rank_text = fields.get("rank")
        room_text = fields.get("room")
        thread = fields.get("thread")
        if thread and fields.get("target"):
            thread = f"{thread} ({fields['target']})"
        event = {
            "_ts_kind": ts_kind,
            "_ts_value": ts_value,
            "ts_source": ts_source if ts_kind else "none",
            "host": host or None,
            "unit": unit or None,
            "source": self._label,
            "line": line_no,
            "signature": signature.id,
            "severity": signature.severity,
            "step": signature.step,
            "room": self._room(room_text, line_no) if room_text else None,
            "rid": fields.get("rid"),
            "rank": int(rank_text) if rank_text else ranks[1],
            "dp_rank": ranks[0],
            "pp_rank": ranks[2],
            "thread": thread,
            "message": redact_text(text[:RAW_LIMIT]),
            "raw": redact_text(raw[:RAW_LIMIT]),
            "offset": offset,
        }
        if ts_kind is None and self.last_time is not None:
            event["_ts_kind"], event["_ts_value"] = self.last_time
            event["ts_source"] = "inferred"
        self.result.events.append(event)
        self.last_event = event
        self.last_event_line = line_no
        return event

    def _room(self, text: str | None, line_no: int) -> int | None:
        """The room a line names, exact; a number outside [0, 2**64) is kept only in the message."""
        if not text:
            return None
        room = int(text)
        if not 0 <= room < ROOM_LIMIT:
            self.result.problems.append(Problem(self.source.label, line_no,
                                                f"room {text} is outside [0, 2**64); left out of the room column"))
            return None
        return room

    def _infer_time_later(self, item, data: bytes, position: int) -> None:
        """Give an untimed line the time of the nearest earlier timed line, else of the next one."""
        found = self._time_before(data, position)
        if found is None and self.last_time is not None:
            found = self.last_time
        if found is None:
            found = self._time_after(data, position)
        if isinstance(item, Block):
            item.upper = self._time_after(data, position)
            if found is not None:
                item.first_ts = ("inferred", found[0], found[1])
            else:
                item.first_ts = ("none", None, None)
            return
        if found is not None:
            item["_ts_kind"], item["_ts_value"] = found
            item["ts_source"] = "inferred"
        after = self._time_after(data, position)
        if after is not None:
            item["_upper_kind"], item["_upper_value"] = after

    def _time_before(self, data: bytes, position: int, max_lines: int = 200):
        end = position - 1
        for _ in range(max_lines):
            if end <= 0:
                return None
            start = data.rfind(b"\n", 0, end) + 1
            found = self._time_in(data[start:end])
            if found is not None:
                return found
            end = start - 1
        return None

    def _time_after(self, data: bytes, position: int, max_lines: int = 200):
        start = data.find(b"\n", position) + 1
        for _ in range(max_lines):
            if start <= 0 or start >= len(data):
                return None
            end = data.find(b"\n", start)
            found = self._time_in(data[start:end])
            if found is not None:
                return found
            start = end + 1
        return None

    def _time_in(self, line: bytes):
        split, message = self._split(line)
        source, kind, value = self._line_time(split, message)
        return (kind, value) if kind else None

    def _emit_block(self, block: Block) -> None:
        raw = "\n".join(block.lines)
        if block.thread is None and block.owner is not None:
            # An exception logged by sglang itself: its traceback extends that event's raw text.
            block.owner["raw"] = redact_text((block.owner["raw"] + "\n" + raw)[:RAW_LIMIT])
            return
        # A thread's death, or a traceback no catalogued line owns (a crash, a print_exc): never silent.
        signature = catalogue.by_id()["thread_death" if block.thread is not None else "python_traceback"]
        ts_source, ts_kind, ts_value = block.first_ts if isinstance(block.first_ts, tuple) else ("none", None, None)
        event = {
            "_ts_kind": ts_kind,
            "_ts_value": ts_value,
            "ts_source": ts_source if ts_kind else "none",
            "source": self.source.label,
            "line": block.first_line,
            "host": block.host,
            "unit": block.unit,
            "signature": signature.id,
            "severity": signature.severity,
            "step": signature.step,
            "room": None,
            "rid": None,
            "rank": None,
            "dp_rank": None,
            "pp_rank": None,
            "thread": block.label if block.thread is not None else None,
            "message": redact_text((block.final or "")[:RAW_LIMIT]),
            "raw": redact_text(raw[:RAW_LIMIT]),
            "offset": block.first_offset,
        }
        if block.upper is not None:
            event["_upper_kind"], event["_upper_value"] = block.upper
        frames = block.frames()
        if frames:
            event["frame_file"], event["frame_line"], event["frame_function"] = frames[-1]
        self.result.events.append(event)

    # --------------------------------------------------------------- counting
    def _bulk_known(self, data: bytes) -> int:
        """Lines that start in this source's format, counted in one C pass.

        Blank lines, journal meta lines ("-- Boot ...") and traceback lines are not
        counted here; when they exist the chunk is walked line by line (``_walk_unknown``),
        which knows them, so the bulk count only has to be right for the common case.
        """
        if self.fmt == "plain":
            return data.count(b"\n[20") + (1 if data.startswith(b"[20") else 0)
        if self.fmt == "short-iso":
            return data.count(b"\n2") + (1 if data.startswith(b"2") else 0)  # years 2000-2999
        if self.fmt == "short-precise":
            head = b"\n" + data[:8]
            return sum(data.count(p) for p in MONTH_PREFIXES) + (1 if any(head.startswith(p) for p in MONTH_PREFIXES) else 0)
        return data.count(b"\n{") + (1 if data.startswith(b"{") else 0)

    def _walk_unknown(self, data: bytes, consumed: set[int]) -> None:
        """Name the lines of this chunk that fit no known format (slow, only when some exist)."""
        position = 0
        line_no = self.line_base
        samples = self.result.unknown_samples
        warning_lines = 0  # > 0: inside a Python warning, before its source line
        while position < len(data):
            end = data.find(b"\n", position)
            line_no += 1
            line = data[position:end].rstrip(b"\r")
            if self.fmt == "plain" and (PYTHON_WARNING.match(line) or _after_progress_bar(line)):
                warning_lines = WARNING_MAX_LINES
                self._end_dump()
            elif warning_lines and WARNING_SOURCE.match(line):
                warning_lines -= 1  # the warning's indented message lines and its source line
            elif self.fmt == "plain" and (THREAD_DUMP_OPENER.match(line) or (
                    self.dump is not None and (not line.strip() or THREAD_DUMP_LINE.match(line)))):
                # A dump's lines are known; the dump itself is kept for the threads it shows.
                warning_lines = 0
                self._dump_line(line_no, line)
            else:
                warning_lines = 0
                known = position in consumed or self._known_line(line)
                if not known:
                    self.result.lines_unknown += 1
                    if len(samples) < UNKNOWN_SAMPLES:
                        samples.append((line_no, line[:200].decode("utf-8", "replace").replace("\x00", "\ufffd")))
                if self.dump is not None and not known and self.dump_foreign < DUMP_FOREIGN_LINES:
                    self.dump.append(line)  # a damaged dump: the reader names this line
                    self.dump_foreign += 1
                else:
                    self._end_dump()
                    if line.strip():
                        self.before_dump = (line_no, line)
            position = end + 1

    def _dump_line(self, line_no: int, line: bytes) -> None:
        if self.dump is None:
            before_no, before = self.before_dump
            # The line just before the dump (sglang's "Pyspy dump for PID N (...)" with its time).
            adjacent = before_no and line_no - before_no <= 2
            self.dump, self.dump_line = ([before], before_no) if adjacent else ([], line_no)
        self.dump.append(line)
        self.dump_foreign = 0

    def _end_dump(self) -> None:
        dump, self.dump = self.dump, None
        if dump is None:
            return
        if self.dump_foreign:  # the lines in no dump format after its last line are not the dump's
            del dump[-self.dump_foreign:]
        while dump and not dump[-1].strip():
            dump.pop()
        self.dump_foreign = 0
        text = b"\n".join(dump).decode("utf-8", "replace")
        result = self.result
        if result.dump_bytes + len(text) > DUMP_BYTES_KEPT:
            result.problems.append(Problem(self.source.label, self.dump_line, (
                f"thread dump of {len(dump)} lines not kept: this source's dumps passed {DUMP_BYTES_KEPT:,} bytes")))
            return
        result.dump_bytes += len(text)
        result.dump_excerpts.append((self.dump_line, redact_text(text)))

    def _remember_line_before_dump(self, data: bytes, last_line_no: int) -> None:
        """The chunk's last line, for a dump that starts the next chunk (when this one was not walked)."""
        end = len(data.rstrip(b"\r\n"))
        if end:
            self.before_dump = (last_line_no, data[data.rfind(b"\n", 0, end) + 1:end].rstrip(b"\r"))

    def _known_line(self, line: bytes) -> bool:
        if not line.strip():
            return True
        if self.fmt == "plain":
            return bool(SGLANG_PREFIX.match(line) or UVICORN_ACCESS.match(line) or LIBRARY_LINE.match(line)
                        or GLOG_LINE.match(line) or ANSI_LINE.match(line) or TQDM_LINE.match(line)
                        or UVICORN_PLAIN.match(line) or MINI_LB_LINE.match(line) or AIOHTTP_UNCLOSED.match(line))
        if JOURNAL_META.match(line):
            return True
        return split_line(line, self.fmt) is not None

    def _remember_last_time(self, data: bytes) -> None:
        found = self._time_before(data, len(data), max_lines=400)
        if found is not None:
            self.last_time = found
            self.result.last_time = found

    def finish(self) -> SourceResult:
        self._end_dump()
        if self.pending_block is not None:
            self._emit_block(self.pending_block)
            self.pending_block = None
        for block in self.blocks.close_all():
            self._emit_block(block)
        return self.result
