"""Thread dumps as people have them: files and logs holding py-spy or faulthandler output.

``py-spy dump --json`` is what :func:`forensics.threads.dump_threads` takes itself. What an
operator pastes, and what sglang writes into its own logs, are other formats, and each one is
read here into the same ``threads`` frame (:mod:`forensics.threads.schema`), one
:class:`ReadDump` per process:

* **py-spy's text** (``py-spy dump --pid N``, with or without ``--native``): ``Process N: TITLE``,
  ``Python vX (path)``, then ``Thread ID (idle|active[+gil]): "NAME"`` and its frames, innermost
  first, ``function (file:line)`` (native frames ``symbol (library)`` or ``0xADDRESS (library)``;
  ``--locals`` blocks are skipped). ``--subprocesses`` prints several processes: one dump each.
* **py-spy's JSON**, as above.
* **faulthandler's**: ``Thread 0x... (most recent call first):`` or ``Current thread 0x...``, each
  frame ``File "path", line N in function``, innermost first. sglang's scheduler calls
  ``faulthandler.enable()``, so a fatal signal (SIGABRT, SIGSEGV, ...) writes one into the role's
  stderr. It names no thread and no pid, and it leaves out what is past its limits (100 frames
  per thread: ``  ...``; 100 threads: ``...``): those are recorded in ``truncated``.
* **inside a log**: sglang's own ``Pyspy dump for PID N (py-spy dump [--native] --pid N):`` error
  line (``utils/cudacore_pyspy_dump_utils.py``, written by its watchdog and crash handler) is
  followed by py-spy's text, unprefixed, up to the next log line; a faulthandler block likewise.
  The line before a block is kept (``context``) and its time, when it has sglang's
  ``[YYYY-MM-DD HH:MM:SS]`` prefix, bounds when the dump was taken (``logged_at``).

A line inside a block that fits none of these is kept in ``problems`` with its line number and
marks the dump ``damaged``: what was read stays, and a thread not found in a damaged or
truncated dump is undecidable, never missing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from forensics.logs import lineformats as lf
from forensics.regular_file import read_regular_file
from forensics.threads import schema
from forensics.threads.dump import parse_dump

PYSPY_JSON = "py-spy-json"
PYSPY_TEXT = "py-spy-text"
PYSPY_NATIVE = "py-spy-native"
FAULTHANDLER = "faulthandler"
FORMATS = (PYSPY_JSON, PYSPY_TEXT, PYSPY_NATIVE, FAULTHANDLER)
MAX_FILE_BYTES = 64 * 1024 * 1024  # a log with dumps in it (cut a bigger one); a dump alone is tens of KiB
MAX_PROBLEMS = 20  # per dump: the first ones say enough, the count says the rest


def _whole(pattern: str) -> re.Pattern:
    return re.compile(f"^(?:{pattern})$")


_PROCESS = _whole(lf.DUMP_PYSPY_PROCESS)
_PYTHON = _whole(lf.DUMP_PYSPY_PYTHON)
_PARENT = _whole(lf.DUMP_PYSPY_PARENT)
_SEPARATOR = _whole(lf.DUMP_PYSPY_SEPARATOR)
_PYSPY_THREAD = _whole(lf.DUMP_PYSPY_THREAD)
_PYSPY_FRAME = _whole(lf.DUMP_PYSPY_FRAME)
_PYSPY_DETAIL = _whole(lf.DUMP_PYSPY_DETAIL)
_FAULT_HEAD = _whole(lf.DUMP_FAULT_HEAD)
_FAULT_THREAD = _whole(lf.DUMP_FAULT_THREAD)
_FAULT_STACK = _whole(lf.DUMP_FAULT_STACK)
_FAULT_FRAME = _whole(lf.DUMP_FAULT_FRAME)
_FAULT_NO_FRAME = _whole(lf.DUMP_FAULT_NO_FRAME)
_FAULT_FRAMES_CUT = _whole(lf.DUMP_FAULT_FRAMES_CUT)
_FAULT_THREADS_CUT = _whole(lf.DUMP_FAULT_THREADS_CUT)
_FAULT_TAIL = _whole(lf.DUMP_FAULT_TAIL)
_SGLANG_PYSPY = re.compile(r"Pyspy dump for PID (\d+) \((py-spy dump(?: --native)? --pid \d+)\):\s*$")
# A line of a log around a dump, which ends the dump: sglang's "[2026-12-03 12:36:44...]", an ISO
# or syslog/journal time, a glog "E1203 12:36:44". Anything else inside a dump is a problem of it.
_LOG_LINE = re.compile(r"^(\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\d{4}-\d\d-\d\d[ T]\d\d:\d\d|"
                       r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d |[IWEF]\d{4} \d\d:\d\d:\d\d)")


class DumpFileError(ValueError):
    """A dump file that cannot be read (``unreadable``: missing, a directory, no permission) or
    understood (a FIFO or device, too big, binary, JSON that is not py-spy's)."""

    def __init__(self, message: str, *, unreadable: bool = False) -> None:
        super().__init__(message)
        self.unreadable = unreadable


@dataclass
class ReadDump:
    """One process's threads as a file or a log showed them."""

    source: str  # the file
    line: int  # 1-based line where the dump starts (1 for a JSON file)
    format: str  # one of FORMATS
    pid: int | None  # py-spy's "Process N", sglang's "Pyspy dump for PID N", the JSON's; None for faulthandler
    title: str | None  # py-spy's process title ("sglang::scheduler"); None where the format has none
    frame: pd.DataFrame  # schema.THREAD_COLUMNS (pid 0 where unknown; see ``pid``)
    named: bool  # the format names threads (py-spy); faulthandler's are known by their stacks only
    truncated: list[str] = field(default_factory=list)  # what the format left out
    problems: list[str] = field(default_factory=list)  # lines of the block that could not be read
    context: str = ""  # the line before the block, in a log
    logged_at: datetime | None = None  # that line's time (the dump was taken at or after it)
    unidentified: int = 0  # threads whose stack was cut before their target (faulthandler)

    @property
    def damaged(self) -> bool:
        return bool(self.problems)

    @property
    def complete(self) -> bool:
        """Nothing of the process's threads can be missing from what was read."""
        return not self.problems and not self.truncated and not self.unidentified

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"

    def thread_count(self) -> int:
        return int(len(self.frame))

    def __repr__(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "pid unknown"
        return f"<ReadDump {self.format} at {self.where}: {who}, {self.thread_count()} threads>"


@dataclass
class _Thread:
    thread_id: int
    native_id: int | None
    name: str
    active: bool
    owns_gil: bool
    frames: list[str] = field(default_factory=list)
    frames_cut: bool = False


@dataclass
class _Block:
    format: str
    line: int
    pid: int | None = None
    title: str | None = None
    threads: list[_Thread] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    context: str = ""
    logged_at: datetime | None = None

    def problem(self, source: str, number: int, text: str, why: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{source}:{number}: {why}: {text[:120]!r}")


def read_dump_file(path: str | Path) -> list[ReadDump]:
    """Every thread dump in ``path`` (a py-spy JSON or text file, a faulthandler dump, a log).

    Raises :class:`DumpFileError` naming the file when it cannot be read; a readable file with
    no dump in it gives ``[]`` (the caller says so: nothing is "clean" for want of a dump).
    """
    path = Path(path)
    data = read_regular_file(path, MAX_FILE_BYTES, noun="dump file",
                             error=lambda message, unreadable: DumpFileError(message, unreadable=unreadable))
    if b"\x00" in data[:4096]:
        raise DumpFileError(f"{path}: binary data, not a text dump (a core file? read it with gdb)")
    text = data.decode("utf-8", errors="replace")
    return read_dump_text(text, source=str(path))


def read_dump_text(text: str, *, source: str = "<text>", first_line: int = 1, tz: str = "UTC") -> list[ReadDump]:
    """The dumps in ``text`` (see the module docstring); ``source`` names it in every line reference,
    ``first_line`` is the number of the text's first line there (an excerpt of a log), and ``tz``
    the zone sglang's prefix times are in (the log scan's)."""
    stripped = text.lstrip()
    if re.match(r"\[\s*(\{|\])", stripped):  # a JSON list (a log line starts "[2026-...")
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise DumpFileError(f"{source}: not py-spy's JSON thread list ({exc}); a dump cut short? "
                                "take it again, or pass py-spy's text output") from None
        if not (isinstance(data, list) and data and all(isinstance(t, dict) and "thread_id" in t for t in data)):
            raise DumpFileError(f"{source}: a JSON list, but not of py-spy's threads (each needs a thread_id)")
        return [_json_dump(data, source)]
    return [_to_dump(block, source) for block in _blocks(text.splitlines(), source, first_line, tz)]


def _json_dump(data: list, source: str) -> ReadDump:
    pids = {int(t["pid"]) for t in data if t.get("pid") is not None}
    pid = pids.pop() if len(pids) == 1 else None
    columns = parse_dump(data, host="", pid=pid or 0, taken_at=_NO_TIME)
    title = None
    info = data[0].get("process_info") if isinstance(data[0], dict) else None
    if isinstance(info, dict) and isinstance(info.get("command_line"), str):
        title = info["command_line"]
    return ReadDump(source, 1, PYSPY_JSON, pid, title, schema.build(columns), named=True)


_NO_TIME = datetime(1970, 1, 1, tzinfo=UTC)  # a file's dump has no "taken at" of its own


def _blocks(lines: list[str], source: str, first_line: int = 1, tz: str = "UTC") -> list[_Block]:
    blocks: list[_Block] = []
    block: _Block | None = None
    thread: _Thread | None = None
    previous = ""  # the last line outside any block: the context of the next block
    pending_pid: tuple[int, str] | None = None  # sglang's "Pyspy dump for PID N (cmd):" just seen
    fatal_line: int | None = None  # "Fatal Python error: ..." just seen

    def close() -> None:
        nonlocal block, thread
        if block is not None and block.threads:
            blocks.append(block)
        block, thread = None, None

    def begin(fmt: str, number: int) -> _Block:
        nonlocal pending_pid, fatal_line
        close()
        new = _Block(fmt, fatal_line or number, context=previous.strip()[:200], logged_at=_time_of(previous, tz))
        if pending_pid is not None:
            new.pid = pending_pid[0]
            if fmt == PYSPY_TEXT and "--native" in pending_pid[1]:
                new.format = PYSPY_NATIVE
        pending_pid, fatal_line = None, None
        return new

    def outside(line: str) -> None:
        """A line that is no part of a dump: the context of the next one."""
        nonlocal previous, pending_pid, fatal_line
        if not line.strip():
            return
        previous = line
        m = _SGLANG_PYSPY.search(line)
        pending_pid = (int(m.group(1)), m.group(2)) if m else None
        fatal_line = None

    for number, raw in enumerate(lines, start=first_line):
        line = raw.rstrip("\r\n")
        if m := _PROCESS.match(line):
            block = begin(PYSPY_TEXT, number)
            block.pid, block.title = int(m.group(1)), m.group(2).strip()
        elif m := _PYSPY_THREAD.match(line):
            if block is None or block.format == FAULTHANDLER:
                block = begin(PYSPY_TEXT, number)
            ident = m.group(1)
            hexadecimal = ident.lower().startswith("0x")
            # py-spy prints the OS thread id when it knows it, else the pthread_t in hex
            thread = _Thread(int(ident, 16) if hexadecimal else int(ident),
                             None if hexadecimal else int(ident), m.group(4) or "",
                             active=m.group(2) == "active", owns_gil=bool(m.group(3)))
            block.threads.append(thread)
        elif m := (_FAULT_THREAD.match(line) or _FAULT_STACK.match(line)):
            if block is None or block.format != FAULTHANDLER:
                block = begin(FAULTHANDLER, number)
            current = line.startswith("Current") or m.re is _FAULT_STACK
            thread = _Thread(int(m.group(2), 16) if m.re is _FAULT_THREAD else 0, None, "",
                             active=current, owns_gil=current)
            block.threads.append(thread)
        elif _FAULT_HEAD.match(line):
            close()
            outside(line)
            fatal_line = number
        elif block is None or _LOG_LINE.match(line):
            close()
            outside(line)
        elif block.format == FAULTHANDLER:
            if not line.strip():
                thread = None  # a blank line ends a thread's stack
            elif _FAULT_TAIL.match(line):
                close()
                outside(line)
            elif _FAULT_THREADS_CUT.match(line):
                block.truncated.append("threads after the 100th (faulthandler prints at most 100)")
            elif thread is not None and (fm := _FAULT_FRAME.match(line)):
                where = fm.group(1) + ("" if fm.group(2) == "???" else f":{fm.group(2)}")
                thread.frames.append(f"{fm.group(3)} ({where})")
            elif thread is not None and _FAULT_FRAMES_CUT.match(line):
                thread.frames_cut = True
            elif thread is not None and _FAULT_NO_FRAME.match(line):
                pass
            else:
                block.problem(source, number, line, "not a faulthandler line")
        elif _SEPARATOR.match(line):
            close()
        elif _PYTHON.match(line) or _PARENT.match(line) or not line.strip():
            pass
        elif thread is not None and (fm := _PYSPY_FRAME.match(line)):
            function, where, line_no = fm.group(1), fm.group(2), fm.group(3)
            thread.frames.append(f"{function} ({where}:{line_no})" if line_no else f"{function} ({where})")
        elif thread is not None and _PYSPY_DETAIL.match(line):
            pass  # --locals
        else:
            block.problem(source, number, line, "not a py-spy line")
    close()
    return blocks


def _time_of(line: str, tz: str = "UTC") -> datetime | None:
    """The time of sglang's prefix on ``line``, read in ``tz`` (the log scan's zone), as UTC."""
    m = lf.SGLANG_PREFIX.match(line.encode("utf-8", "replace"))
    if not m:
        return None
    try:
        naive = datetime.fromisoformat(m.group(1).decode())
    except ValueError:
        return None
    if tz == "UTC":
        return naive.replace(tzinfo=UTC)
    # An hour a clock change repeats: the earlier reading (the dump was taken at or after this time).
    local = pd.Timestamp(naive.replace(tzinfo=None)).tz_localize(tz, ambiguous=True, nonexistent="shift_forward")
    return local.tz_convert("UTC").to_pydatetime()


def _to_dump(block: _Block, source: str) -> ReadDump:
    columns: dict[str, list] = {name: [] for name in schema.THREAD_COLUMNS}
    unidentified = 0
    for thread in block.threads:
        frames = thread.frames
        if thread.frames_cut:
            unidentified += 1
        top = frames[0] if frames else ""
        columns["taken_at"].append(block.logged_at or _NO_TIME)
        columns["host"].append("")
        columns["pid"].append(block.pid or 0)
        columns["thread_id"].append(thread.thread_id)
        columns["native_id"].append(thread.native_id)
        columns["thread_name"].append(thread.name)
        columns["idle"].append(not thread.active)
        columns["active"].append(thread.active)
        columns["owns_gil"].append(thread.owns_gil)
        columns["depth"].append(len(frames))
        columns["top_function"].append(top.split(" (", 1)[0] if top else "")
        columns["top_frame"].append(top)
        columns["frames"].append("\n".join(frames))
    problems = list(block.problems)
    if block.problem_count > len(problems):
        problems.append(f"... and {block.problem_count - len(problems)} more unreadable line(s)")
    fmt = block.format
    if fmt == PYSPY_TEXT and any(_native(frame) for thread in block.threads for frame in thread.frames):
        fmt = PYSPY_NATIVE  # a file of `py-spy dump --native` has no header saying so; its frames do
    truncated = list(dict.fromkeys(block.truncated))
    if unidentified:
        truncated.append(f"the outermost frames of {unidentified} thread(s) (faulthandler prints 100 per thread)")
    return ReadDump(source, block.line, fmt, block.pid, block.title, schema.build(columns),
                    named=fmt != FAULTHANDLER, truncated=truncated, problems=problems,
                    context=block.context, logged_at=block.logged_at, unidentified=unidentified)


def _native(frame: str) -> bool:
    """A native frame: ``symbol (libc.so.6)``, ``0x7f45c65e224a (libc.so.6)`` (no ``file.py:line``)."""
    where = frame.rpartition(" (")[2].rstrip(")")
    return ".so" in where and not where.rsplit(":", 1)[-1].isdigit()


def thread_target(frames: str) -> tuple[str, str] | None:
    """The function a thread was started on and its file, from its stack (innermost first).

    The outermost frames of a Python thread are threading's own (``_bootstrap``,
    ``_bootstrap_inner``, ``run``) and native ones; the first frame inside them is the target
    (or a ``Thread`` subclass's ``run``). ``None`` for a stack with no such frame (a main thread
    runs ``<module>`` outermost).
    """
    for entry in reversed([f for f in frames.split("\n") if f]):
        function, _, where = entry.partition(" (")
        where = where.rstrip(")")
        file = where.rsplit(":", 1)[0] if where.rsplit(":", 1)[-1].isdigit() else where
        if file.endswith("threading.py") or not (file.endswith(".py") or file.startswith("<")):
            continue  # threading's frames, native frames (a library, an address)
        if function == "<module>":
            return None
        return function.rsplit(".", 1)[-1], file
    return None
