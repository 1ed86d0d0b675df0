"""How one line of each supported log format splits into time, origin and message.

Formats: ``plain`` (sglang's own log files, raw stderr, uvicorn lines), journalctl
``short-iso`` (and ``short-iso-precise``), ``short-precise`` and ``json``. Everything
works on bytes: decoding happens only for the few lines that become events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

# [2025-07-01 12:00:00.123 DP1 PP0 TP3] message   (ms only with SGLANG_LOG_MS=1)
# Any number of fraction digits: a line with more than nanoseconds is still sglang's (its time is
# truncated to ns), never a line that silently belongs to no format.
SGLANG_PREFIX = re.compile(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)((?: [A-Z_]+\d+)*)\] ?")
# uvicorn default access line: INFO:     127.0.0.1:5678 - "GET /health HTTP/1.1" 200 OK
UVICORN_ACCESS = re.compile(rb'(?:INFO|WARNING|ERROR|DEBUG):\s+(\S+) - "([A-Z]+) (\S+) HTTP/[\d.]+" (\d{3})')
JOURNAL_ISO = re.compile(
    rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?) (\S+) ([^\s\[:]+)(?:\[(\d+)\])?: ?"
)
JOURNAL_PRECISE = re.compile(
    rb"((?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?) (\S+) ([^\s\[:]+)(?:\[(\d+)\])?: ?"
)
# Other libraries' own lines in a server's output, e.g. NIXL's
# "2026-11-30 11:17:50 NIXL INFO    _api.py:405 Backend UCX was instantiated".
LIBRARY_LINE = re.compile(rb"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)? \S+ +(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) ")
# Google-logging (glog) lines, e.g. the Mooncake transfer engine's in a Mooncake server's stderr:
# "I1201 02:01:00.759861  3561 transfer_engine_py.cpp:120] Using default malloc/free ...", and the
# line glog prints before it is initialized.
GLOG_LINE = re.compile(rb"(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\s\]]+:\d+\] "
                       rb"|WARNING: Logging before InitGoogleLogging\(\) is written to STDERR)")
# Its ERROR and FATAL lines (each an event: forensics/logs/signatures.toml, glog_error and glog_fatal).
GLOG_FAILURE = re.compile(rb"[EF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\s\]]+:\d+\] ")
# Python's warnings module on stderr: "FILE.py:LINE: CategoryWarning: message", then the source line
# indented by two spaces (a message's own further lines, "  Example: ...", are indented too) (real sglang 0.5.15 at start-up:
# "sglang/srt/layers/quantization/awq/awq.py:52: UserWarning: Only CUDA, HIP and XPU support AWQ ...").
PYTHON_WARNING = re.compile(rb"\S+\.py:\d+: [A-Za-z_]*Warning: ")
WARNING_SOURCE = re.compile(rb"  \S")
WARNING_MAX_LINES = 20  # indented lines a warning may span
# tqdm's progress bar, redrawn with carriage returns (sglang's "Multi-thread loading shards:  50% Completed | 1/2 [...]")
TQDM_LINE = re.compile(rb"\r?[^\r\n]{0,120}?\d+%[^\r\n]{0,40}\| *\d+/\d+ \[")
# Text printed with ANSI colours (sglang's deprecation notices: "\x1b[1;33m'--disable-cuda-graph' is
# deprecated ...\x1b[0m").
ANSI_LINE = re.compile(rb"\x1b\[[\d;]*m")
# uvicorn's own lines under its default log config (sglang-router's mini load balancer runs it so, with
# no time: "INFO:     Started server process [467]"); the level is padded to 8 characters plus a space.
# Its ERROR and CRITICAL lines are left out on purpose: they stay lines in no known format, reported.
UVICORN_PLAIN = re.compile(rb"(?:INFO|WARNING|DEBUG|TRACE): +\S")
# sglang-router's mini load balancer logs through an unconfigured logger, so its messages come bare;
# they carry their own prefix ("[MiniLB] Overriding policy to random", sglang_router/mini_lb.py).
MINI_LB_LINE = re.compile(rb"\[MiniLB\] ")
# asyncio's exception handler reporting an aiohttp object nobody closed (the mini load balancer's
# client side, when the client it proxied for is gone): "Unclosed connection", then the object's repr
# ("client_connection: Connection<ConnectionKey(host='127.0.0.1', ...)>").
AIOHTTP_UNCLOSED = re.compile(rb"(?:Unclosed (?:connection|client session|connector)$"
                              rb"|client_connection: Connection<|client_session: <aiohttp\.|connector: <aiohttp\.)")
# Thread dumps printed into a log: py-spy's text (sglang's own "Pyspy dump for PID N (...):" is followed by
# it, or an operator pastes it) and faulthandler's (sglang's scheduler enables faulthandler: a fatal signal
# writes every thread's stack to stderr). One place for their line shapes: forensics/threads/textdump.py
# parses dumps with these, and the scanner counts their lines as known (each one whole, no anchors here).
DUMP_PYSPY_PROCESS = r"Process (\d+): (.*)"
DUMP_PYSPY_PYTHON = r"Python v\d.*"
DUMP_PYSPY_PARENT = r"Parent Process \d+: .*"  # --subprocesses: a child's header names its parent
DUMP_PYSPY_SEPARATOR = r"-{20,}\s*"  # --subprocesses: between two processes
DUMP_PYSPY_THREAD = r'Thread (0x[0-9A-Fa-f]+|\d+) \((idle|active)(\+gil)?\)(?:: "(.*)")?\s*'
DUMP_PYSPY_FRAME = r" {4}(\S.*) \(([^()]*?)(?::(\d+))?\)\s*"  # a location has no parentheses
DUMP_PYSPY_DETAIL = r" {8}.*"  # --locals: "Arguments:", "Locals:" and their values
DUMP_FAULT_HEAD = r"Fatal Python error: .*"
DUMP_FAULT_THREAD = r"(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*"
DUMP_FAULT_STACK = r"(?:Current thread's )?[Ss]tack \(most recent call first\):\s*"
DUMP_FAULT_FRAME = r'  File "(.*)", line (\d+|\?\?\?) in (.*?)\s*'
DUMP_FAULT_NO_FRAME = r"  <no Python frame>\s*"
DUMP_FAULT_FRAMES_CUT = r"  \.\.\.\s*"  # more than 100 frames in a thread
DUMP_FAULT_THREADS_CUT = r"\.\.\.\s*"  # more than 100 threads
DUMP_FAULT_TAIL = r"(?:Extension modules: |Timeout \().*"
DUMP_OPENERS = (DUMP_PYSPY_PROCESS, DUMP_PYSPY_THREAD, DUMP_FAULT_HEAD, DUMP_FAULT_THREAD, DUMP_FAULT_STACK)
DUMP_LINES = (*DUMP_OPENERS, DUMP_PYSPY_PYTHON, DUMP_PYSPY_PARENT, DUMP_PYSPY_SEPARATOR, DUMP_PYSPY_FRAME,
              DUMP_PYSPY_DETAIL, DUMP_FAULT_FRAME, DUMP_FAULT_NO_FRAME, DUMP_FAULT_FRAMES_CUT,
              DUMP_FAULT_THREADS_CUT, DUMP_FAULT_TAIL)
THREAD_DUMP_OPENER = re.compile(("(?:" + "|".join(DUMP_OPENERS) + r")\r?$").encode())
THREAD_DUMP_LINE = re.compile(("(?:" + "|".join(DUMP_LINES) + r")\r?$").encode())
JOURNAL_META = re.compile(rb"-- (?:Boot [0-9a-f]+ --|No entries --|Logs begin at|Journal begins at|Reboot --)")
RANK_PART = re.compile(rb"([A-Z_]+?)(\d+)")

FORMATS = ("plain", "short-iso", "short-precise", "json")
MONTH_PREFIXES = tuple(
    f"\n{m} ".encode() for m in ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
)


@dataclass(slots=True)
class SplitLine:
    """One line taken apart. ``journal_ts`` is text (short formats) or epoch µs (json)."""

    journal_ts: bytes | int | None
    host: str | None
    unit: str | None
    message: bytes


_json_decoder = msgspec.json.Decoder()


def split_line(line: bytes, fmt: str) -> SplitLine | None:
    """Split ``line`` in format ``fmt``; None when the line does not fit that format."""
    if fmt == "plain":
        return SplitLine(None, None, None, line)
    if fmt == "json":
        try:
            entry = _json_decoder.decode(line)
        except msgspec.DecodeError:
            return None
        if not isinstance(entry, dict):
            return None
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald exports non-UTF-8 messages as byte arrays
            try:
                message = bytes(message)
            except (TypeError, ValueError):
                message = b""
        elif isinstance(message, str):
            message = message.encode("utf-8", "surrogateescape")
        else:
            message = b""
        ts = entry.get("__REALTIME_TIMESTAMP")
        try:
            ts = int(ts) if ts is not None else None
        except (TypeError, ValueError):
            ts = None
        unit = entry.get("_SYSTEMD_UNIT") or entry.get("SYSLOG_IDENTIFIER") or entry.get("_COMM")
        return SplitLine(ts, entry.get("_HOSTNAME"), unit, message)
    regex = JOURNAL_ISO if fmt == "short-iso" else JOURNAL_PRECISE
    found = regex.match(line)
    if found is None:
        return None
    return SplitLine(
        found.group(1), found.group(2).decode("utf-8", "replace"), found.group(3).decode("utf-8", "replace"),
        line[found.end():],
    )


def sniff(head: bytes) -> str:
    """Guess the format from the first lines of a source (majority of non-empty lines)."""
    votes = dict.fromkeys(FORMATS, 0)
    seen = 0
    for line in head.split(b"\n")[:200]:
        line = line.rstrip(b"\r")
        if not line.strip() or JOURNAL_META.match(line):
            continue
        seen += 1
        if line.startswith(b"{") and split_line(line, "json") is not None:
            votes["json"] += 1
        elif JOURNAL_ISO.match(line):
            votes["short-iso"] += 1
        elif JOURNAL_PRECISE.match(line):
            votes["short-precise"] += 1
        else:
            votes["plain"] += 1
    if seen == 0:
        return "plain"
    best = max(FORMATS, key=lambda f: votes[f])
    return best if votes[best] * 2 >= seen or best == "plain" else "plain"


def line_spans(data: bytes, literal: bytes, consumed: set[int] | frozenset = frozenset()):
    """(start, end) of each line of ``data`` holding ``literal`` (once per line), skipping ``consumed`` starts."""
    find = data.find
    rfind = data.rfind
    position = find(literal)
    while position >= 0:
        start = rfind(b"\n", 0, position) + 1
        end = find(b"\n", position)
        position = find(literal, end)
        if start not in consumed:
            yield start, end


def lines_with(data: bytes, literal: bytes, consumed: set[int] | frozenset = frozenset()):
    """Each line of ``data`` holding ``literal``, as bytes."""
    return (data[start:end] for start, end in line_spans(data, literal, consumed))


def as_text(value) -> str | None:
    """A field of a split line (bytes, or None when the line had none) as text."""
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse_ranks(ranks: bytes) -> tuple[int | None, int | None, int | None]:
    """(dp, tp, pp) from an sglang prefix tail like b" DP1 PP0 TP3"."""
    dp = tp = pp = None
    for name, number in RANK_PART.findall(ranks):
        value = int(number)
        if name == b"DP":
            dp = value
        elif name == b"TP":
            tp = value
        elif name == b"PP":
            pp = value
    return dp, tp, pp
