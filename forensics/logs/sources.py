"""Where log lines come from: files, .gz, directories, binary journals, pipes, raw stderr.

What a source holds is decided by its content, never by its name. A binary journal file
starts with systemd's magic ``LPKSHHRH`` and is read through journalctl; a gzip starts
with ``1f 8b`` and is decompressed on the fly; everything else is text, whose format
(plain, short-iso, short-precise, json) the scanner sniffs from its first lines unless
``LogSource.fmt`` states it. So ``journalctl -u x > x.journal`` is read as the text it is.
The first bytes are peeked and replayed, never seeked back to, so pipes (``-`` for
standard input, ``/dev/stdin``, ``<(zcat x.gz)``, a FIFO) are read like any file.

Every source is streamed in chunks that end on a line boundary; nothing reads a whole
file into memory, and a gzip is decompressed in bounded steps, so a gzip bomb costs no
more memory than its plain text would. Problems (a missing file, a gzip that ends early,
a line longer than ``MAX_LINE``, journalctl failing) become ``Problem`` records naming
the source (and line when known); what was read before the problem is kept.

A ``kind="stream"`` source reads whatever its ``opener`` returns (``forensics.logs.remote``
builds them for logs on a host: journalctl over SSH, SFTP, a command), peeked and
chunked the same way.
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from forensics.exitcodes import EnvironmentProblem, UsageProblem
from forensics.logs.lineformats import FORMATS

CHUNK_SIZE = 8 << 20
MAX_LINE = 1 << 20  # longer lines are cut here (a 20 MB line must not cost 20 MB per copy)
# Compressed bytes read per step. What one read decompresses to is capped by the caller's
# ``size``, not by this, so memory stays ~CHUNK_SIZE + COMPRESSED_READ whatever the ratio.
COMPRESSED_READ = 1 << 20
JOURNAL_MAGIC = b"LPKSHHRH"  # the first 8 bytes of systemd's journal file header
GZIP_MAGIC = b"\x1f\x8b"
# The names journalctl --directory picks up; a binary journal named otherwise is read
# with --file. The name never makes a file a journal: the magic does.
JOURNAL_SUFFIXES = (".journal", ".journal~")
STDIN = "-"
STDIN_LABEL = "<stdin>"
KINDS = ("auto", "file", "journal", "skipped", "stream")
FORMAT_ALIASES = {"auto": None, "short-iso-precise": "short-iso"}  # short-iso's regex reads both
STDERR_TAIL = 64 << 10  # how much of journalctl's stderr is kept (``_JournalStream.stderr``)
STDERR_LINES, STDERR_LINE_CHARS = 3, 240  # how much of it a problem message quotes
JOURNALCTL_EXIT_WAIT = 30.0  # seconds journalctl gets to exit once its output has ended
ROLES = ("prefill", "decode", "router")


class SourceSpecError(UsageProblem, ValueError):
    """A ``LogSource`` asked for something that cannot mean anything (a bad kind or format).

    A ``ValueError`` for Python callers and a ``UsageProblem`` (exit status 2) for the CLI.
    """


@dataclass(frozen=True)
class LogSource:
    """One place to read log lines from.

    ``path``: a file, a directory (read recursively), ``"-"`` for standard input (label
    ``<stdin>``; name a file called ``-`` as ``./-``), or any readable path that is not a
    regular file: ``/dev/stdin``, a shell's ``<(zcat x.gz)`` (``/dev/fd/N``), a FIFO. A
    ``str`` or any path-like is turned into a ``Path``.

    ``kind``:

    * ``auto`` (default): decided by content. A regular file that starts with the journal
      magic is a binary journal; anything else is text (gzip or not).
    * ``file``: text, even if it starts with the journal magic (gzip is still unpacked).
    * ``journal``: a binary journal file, or a directory of them, read with
      ``journalctl --file/--directory -o json``.
    * ``skipped``: what directory expansion makes of a FIFO, device or socket found inside
      a directory (reading one could block forever; ``grep -r`` skips them too), of a
      directory it cannot list and of an empty one. Opening it raises ``SourceError``
      saying why, so the scan's problems name it. Name a FIFO directly to read it.
    * ``stream``: bytes from ``opener()``, called when the scan reaches the source: an
      object with ``read(size)``, ``close()`` and optionally ``fmt`` (``"json"`` for
      journalctl's output). ``forensics.logs.remote`` builds these for logs that live on a
      ``Host`` (a journal read through ``journalctl`` over SSH, a file over SFTP, a command's
      output). ``opener`` may raise ``SourceError`` (nothing could be read: the scan records
      an unreadable problem); ``read`` may raise ``SourceReadError`` once what it had was
      read (the problem keeps what came before). gzip is unpacked as for files. ``name``
      is its label (a path cannot say "which host"); ``path`` is only a placeholder.

    ``fmt`` states the text format instead of sniffing it: ``plain``, ``short-iso``
    (``short-iso-precise`` is read the same way), ``short-precise`` or ``json``; ``auto``
    or None sniffs. It applies to text whatever the file is called; a binary journal found
    by its magic is read through journalctl, whose output is always json, so with
    ``kind="journal"`` only ``json`` is accepted. Bad values raise ``SourceSpecError``
    naming them.
    """

    path: Path
    kind: str = "auto"
    host: str | None = None
    role: str | None = None
    unit: str | None = None
    fmt: str | None = None
    name: str | None = None  # the label, when a path cannot name the source (a host's journal)
    opener: Callable[[], object] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Frozen: normalise through object.__setattr__, once, where every source is made.
        path = self.path
        if isinstance(path, (str, os.PathLike)) and not isinstance(path, Path):
            path = Path(path)
        if not isinstance(path, Path):
            raise SourceSpecError(f"log source path must be a str or a path, not {type(path).__name__}: {path!r}")
        if str(self.path) == "":
            raise SourceSpecError("log source path is empty (use '.' for the current directory)")
        object.__setattr__(self, "path", path)
        if self.kind not in KINDS:
            raise SourceSpecError(f"unknown log source kind {self.kind!r} for {self.label} "
                                  f"(expected one of {', '.join(KINDS)})")
        fmt = self.fmt
        if fmt is not None:
            if not isinstance(fmt, str) or FORMAT_ALIASES.get(fmt, fmt) not in (*FORMATS, None):
                raise SourceSpecError(f"unknown log format {fmt!r} for {self.label} "
                                      f"(expected one of {', '.join((*FORMATS, *FORMAT_ALIASES))})")
            object.__setattr__(self, "fmt", FORMAT_ALIASES.get(fmt, fmt))
        if (self.kind == "stream") != (self.opener is not None):
            raise SourceSpecError(f"{self.label}: kind='stream' and an opener go together "
                                  f"(kind={self.kind!r}, opener={'set' if self.opener else 'missing'})")
        if self.kind == "journal" and self.fmt not in (None, "json"):
            raise SourceSpecError(f"{self.label}: a binary journal is read through journalctl as json; "
                                  f"format {self.fmt!r} cannot apply (kind='file' reads a text file)")

    @property
    def is_stdin(self) -> bool:
        return str(self.path) == STDIN

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return STDIN_LABEL if self.is_stdin else str(self.path)

    def guessed_role(self) -> str | None:
        if self.role:
            return self.role
        for text in (self.unit or "", self.path.name, str(self.path.parent.name)):
            lowered = text.lower()
            for role in ROLES:
                if role in lowered:
                    return role
        return None


@dataclass(frozen=True)
class Problem:
    """Something wrong with the input; ``where`` names the file (and line when known).

    ``unreadable``: the source could not be opened at all (missing, permission denied,
    journalctl not installed): an environment problem rather than a fault in its content.
    """

    source: str
    line: int | None
    message: str
    unreadable: bool = False

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.message}"


class SourceError(EnvironmentProblem):
    """A source cannot be read at all (missing, unreadable, tool missing): exit status 4.

    ``path`` is the source's label; ``reason`` is the message without it, as a ``Problem``
    records it.
    """

    def __init__(self, message: str, *, path: str | None = None, reason: str | None = None) -> None:
        super().__init__(message, path=path)
        self.reason = reason or message


class SourceReadError(OSError):
    """Reading stopped part-way for a reason this module can state (journalctl failed)."""


def _unreadable(label: str, reason: str) -> SourceError:
    return SourceError(f"{label}: {reason}", path=label, reason=reason)


# ------------------------------------------------------------------ which sources


def as_sources(items: Iterable[str | os.PathLike | LogSource], *, role: str | None = None,
               host: str | None = None) -> list[LogSource]:
    """Expand paths and directories into concrete sources, deciding journals by content.

    A regular file that starts with the journal magic becomes ``kind="journal"``, any
    other regular file ``kind="file"``. A directory is expanded recursively (sorted): each
    text file is one source; its binary journals are read with ``journalctl --directory``
    per directory holding them (``--file`` for one whose name journalctl would not pick
    up); FIFOs, devices, sockets, unlistable directories and an empty directory become
    ``kind="skipped"`` sources so the scan names them. Standard input, pipes, FIFOs and
    devices named directly stay ``auto``: peeking at them here would consume what they
    hold, so ``open_stream`` decides.
    """
    expanded: list[LogSource] = []
    for item in items:
        source = item if isinstance(item, LogSource) else LogSource(item)
        if role and not source.role:
            source = replace(source, role=role)
        if host and not source.host:
            source = replace(source, host=host)
        expanded.extend(_expand(source))
    return expanded


def _expand(source: LogSource) -> list[LogSource]:
    if source.is_stdin or source.kind in ("journal", "skipped", "stream"):
        return [source]
    mode = _mode_of(source.path)
    if mode is None:
        return [source]  # missing or unreadable: open_stream says which, naming it
    if stat.S_ISDIR(mode):
        return _expand_directory(source)
    if stat.S_ISREG(mode) and source.kind == "auto":
        if _starts_with_journal_magic(source.path):
            return [replace(source, kind="journal", fmt=None)]
        return [replace(source, kind="file")]
    return [source]


def _expand_directory(source: LogSource) -> list[LogSource]:
    files, unlistable = _walk(source.path)
    texts: list[Path] = []
    journals: list[Path] = []
    skipped: list[Path] = list(unlistable)
    for path in files:
        mode = _mode_of(path)
        if mode is None or stat.S_ISREG(mode):
            # A dangling link or a file that vanished stays a text source: opening it names the problem.
            if mode is not None and source.kind == "auto" and _starts_with_journal_magic(path):
                journals.append(path)
            else:
                texts.append(path)
        else:
            skipped.append(path)
    text_kind = "file" if source.kind in ("auto", "file") else source.kind
    expanded = [replace(source, path=path, kind=text_kind) for path in texts]
    expanded += [replace(source, path=path, kind="journal", fmt=None) for path in _journal_reads(journals)]
    expanded += [replace(source, path=path, kind="skipped") for path in sorted(skipped)]
    if not expanded:
        expanded.append(replace(source, kind="skipped"))  # an empty directory is a problem worth naming
    return expanded


def _walk(top: Path) -> tuple[list[Path], list[Path]]:
    """Every non-directory below ``top`` (sorted) and the directories that could not be listed.

    Symbolic links to directories are followed, as ``Path.rglob`` does, but each directory
    is listed once, so a link loop ends.
    """
    files: list[Path] = []
    unlistable: list[Path] = []
    seen: set[tuple[int, int]] = set()
    pending = [top]
    while pending:
        directory = pending.pop()
        try:
            info = os.stat(directory)
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            with os.scandir(directory) as entries:
                listed = list(entries)
        except OSError:
            unlistable.append(directory)
            continue
        for entry in listed:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (pending if is_dir else files).append(Path(entry.path))
    return sorted(files), unlistable


def _journal_reads(journals: list[Path]) -> list[Path]:
    """What to give journalctl for these binary journal files: directories where it can.

    ``journalctl --directory D`` reads D's files named ``*.journal``/``*.journal~`` and
    those of its machine-id subdirectories, so such a subdirectory of a directory already
    listed is not listed again; a journal with any other name is read on its own.
    """
    named = [path for path in journals if path.name.endswith(JOURNAL_SUFFIXES)]
    directories = sorted({path.parent for path in named})
    listed = set(directories)
    directories = [d for d in directories if not (_is_machine_id(d.name) and d.parent in listed)]
    return directories + [path for path in journals if not path.name.endswith(JOURNAL_SUFFIXES)]


def _is_machine_id(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def _mode_of(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


def _starts_with_journal_magic(path: Path) -> bool:
    """Only for regular files: reading the head of a pipe here would lose it."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(JOURNAL_MAGIC)) == JOURNAL_MAGIC
    except OSError:
        return False  # open_stream meets the same error and names it


def _why_skipped(path: Path) -> str:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"
    if stat.S_ISDIR(mode):
        try:
            names = os.listdir(path)
        except OSError as exc:
            return f"cannot list this directory ({exc.strerror or exc})"
        return "no files in this directory" if not names else "no files in this directory or below it"
    what = "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device"
    return (f"not read: a {what} inside a directory may never end (grep -r skips them too); "
            "name it on its own to read it")


# ------------------------------------------------------------------ streams


class _Stream:
    """What ``open_stream`` returns: ``read(size)``, ``close()``, a context manager.

    ``fmt`` is the text format when known without sniffing (the source's ``fmt``, or json
    for journalctl's output), else None.
    """

    fmt: str | None = None

    def read(self, size: int = -1) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_stream(source: LogSource) -> _Stream:
    """A binary stream of the source's text: as stored, decompressed, or journalctl's json.

    Nothing is seeked: the first bytes are peeked and replayed, so standard input, pipes
    and FIFOs work like files. Raises ``SourceError`` (exit status 4) naming the source
    when it cannot be opened at all.
    """
    if source.kind == "skipped":
        raise _unreadable(source.label, _why_skipped(source.path))
    if source.kind == "journal":
        return _JournalStream(source)
    if source.kind == "stream":
        return _open_opener(source)
    stream = PeekableStream(*_open_raw(source), fmt=source.fmt)
    try:
        head = stream.peek(len(JOURNAL_MAGIC))
    except OSError as exc:
        stream.close()
        raise _unreadable(source.label, f"cannot read ({exc.strerror or exc})") from exc
    if head == JOURNAL_MAGIC and source.kind == "auto":
        stream.close()
        if not source.is_stdin and stat.S_ISREG(_mode_of(source.path) or 0):
            return _JournalStream(replace(source, kind="journal", fmt=None))
        raise _unreadable(source.label, "is a binary journal arriving through a pipe; journalctl reads "
                                        "journal files only: save it to a file and name that")
    if head.startswith(GZIP_MAGIC):
        return _GzipStream(stream, source.label, fmt=source.fmt)
    return stream


def _open_opener(source: LogSource) -> _Stream:
    """A ``kind="stream"`` source: its opener's bytes, peeked like a file's (gzip unpacked)."""
    raw = source.opener()
    fmt = source.fmt or getattr(raw, "fmt", None)
    stream = PeekableStream(raw, fmt=fmt)
    try:
        head = stream.peek(len(JOURNAL_MAGIC))
    except SourceError:
        stream.close()
        raise
    except OSError as exc:
        stream.close()
        raise _unreadable(source.label, f"cannot read ({exc.strerror or exc})") from exc
    if head == JOURNAL_MAGIC and fmt != "json":
        stream.close()
        raise _unreadable(source.label, "is a binary journal file, not text: read it through journalctl "
                                        "(kind 'journal_file' for a file, 'journal_dir' for a directory)")
    if head.startswith(GZIP_MAGIC):
        return _GzipStream(stream, source.label, fmt=source.fmt)
    return stream


def _open_raw(source: LogSource):
    """The raw byte stream and whether closing the source closes it (never standard input)."""
    if source.is_stdin:
        stdin = getattr(sys.stdin, "buffer", None)
        if stdin is None:
            raise _unreadable(STDIN_LABEL, "there is no standard input to read (or it is not a byte stream)")
        return stdin, False
    try:
        return open(source.path, "rb"), True
    except FileNotFoundError as exc:
        raise _unreadable(source.label, "no such file") from exc
    except IsADirectoryError as exc:
        raise _unreadable(source.label, "is a directory") from exc
    except OSError as exc:
        raise _unreadable(source.label, f"cannot open ({exc.strerror or exc})") from exc


class PeekableStream(_Stream):
    """A byte stream whose first bytes can be looked at before it is read, without seeking.

    ``peek(n)`` reads up to ``n`` bytes into a buffer (fewer only at the end of input) and
    ``read`` replays them before reading on: a pipe cannot seek back, and recognising a
    source by its magic bytes must not depend on that.
    """

    def __init__(self, raw, owns_raw: bool = True, *, fmt: str | None = None) -> None:
        self.raw = raw
        self.owns_raw = owns_raw
        self.fmt = fmt
        self.head = b""

    def peek(self, size: int) -> bytes:
        while len(self.head) < size:
            more = self.raw.read(size - len(self.head))
            if not more:
                break
            self.head += more
        return self.head[:size]

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.raw.read(size)
        if 0 <= size <= len(self.head):
            data, self.head = self.head[:size], self.head[size:]
            return data
        rest = self.raw.read(-1 if size < 0 else size - len(self.head))
        data, self.head = self.head + rest, b""
        return data

    def close(self) -> None:
        if self.owns_raw:
            self.raw.close()


class _GzipStream(_Stream):
    """Streaming gunzip in bounded steps that keeps every byte it could decompress.

    Each step asks zlib for no more than the bytes still wanted (``decompress(data,
    max_length)``) and keeps the compressed input it did not reach (``unconsumed_tail``)
    for the next, so at most one compressed read plus the caller's ``size`` is held,
    however well the data compresses (a 2 MB gzip of repeated lines is 2 GB of text).
    Concatenated members, as logrotate and ``cat`` make, are read one after the other;
    zero padding after a member is skipped, as gzip does. When the input ends early or
    turns corrupt, what was decompressed before is returned first and the error is raised
    on the next read (``gzip.GzipFile`` drops what that read had already decompressed).
    """

    def __init__(self, handle, label: str, *, fmt: str | None = None) -> None:
        self.handle = handle
        self.label = label
        self.fmt = fmt
        self.decompressor = zlib.decompressobj(wbits=31)
        self.compressed = b""  # read from the handle, not given to zlib yet
        self.input_ended = False
        self.output_waiting = False  # the last step stopped at max_length: zlib may hold more output
        self.deferred: Exception | None = None  # met after good data; raised once that data was read
        self.done = False

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK_SIZE), b""))
        if self.deferred is not None:
            error, self.deferred = self.deferred, None
            raise error
        pieces: list[bytes] = []
        wanted = size
        while wanted > 0 and not self.done:
            try:
                piece = self._step(wanted)
            except (EOFError, OSError, zlib.error) as exc:
                self.done = True
                if not pieces:
                    raise
                self.deferred = exc
                break
            if piece:
                pieces.append(piece)
                wanted -= len(piece)
        return b"".join(pieces)

    def _step(self, wanted: int) -> bytes:
        """One bounded move forward: read input, decompress some, or start the next member."""
        if self.decompressor.eof:
            self._next_member()
            return b""
        if not self.compressed and not self.output_waiting:
            if not self.input_ended:
                self.compressed = self.handle.read(COMPRESSED_READ)
                self.input_ended = not self.compressed
            if self.input_ended and not self.compressed:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
        piece = self.decompressor.decompress(self.compressed, wanted)
        self.output_waiting = len(piece) == wanted
        self.compressed = self.decompressor.unused_data if self.decompressor.eof else self.decompressor.unconsumed_tail
        return piece

    def _next_member(self) -> None:
        """After a member's end: another member, zero padding, the end of input, or junk."""
        while True:
            self.compressed = self.compressed.lstrip(b"\0")
            if len(self.compressed) >= len(GZIP_MAGIC) or self.input_ended:
                break
            more = self.handle.read(COMPRESSED_READ)
            self.input_ended = not more
            self.compressed += more
        if not self.compressed:
            self.done = True
        elif self.compressed.startswith(GZIP_MAGIC):
            self.decompressor = zlib.decompressobj(wbits=31)
            self.output_waiting = False
        else:
            raise gzip.BadGzipFile("data after the last complete gzip member is not gzip (trailing garbage)")

    def close(self) -> None:
        self.handle.close()


class _JournalStream(_Stream):
    """journalctl --file/--directory -o json, streamed from its stdout.

    Its stderr is drained by a thread while stdout is read, keeping the last
    ``STDERR_TAIL`` bytes: a chatty journalctl must not fill the 64 KiB pipe and block
    while we wait on its stdout. A non-zero exit is raised as ``SourceReadError`` once
    every line of output was read. Closing before the end kills and reaps journalctl.
    """

    fmt = "json"

    def __init__(self, source: LogSource) -> None:
        self.label = source.label
        if source.is_stdin:
            raise _unreadable(self.label, "journalctl reads journal files only, not standard input: "
                                          "save it to a file and name that")
        journalctl = shutil.which("journalctl")
        if journalctl is None:
            raise _unreadable(self.label, "reading a binary journal needs journalctl, which is not installed")
        if not source.path.exists():
            raise _unreadable(self.label, "no such journal file or directory")
        where = ["--directory", str(source.path)] if source.path.is_dir() else ["--file", str(source.path)]
        try:
            self.proc = subprocess.Popen(
                [journalctl, *where, "-o", "json", "--all", "--no-pager", "--quiet"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise _unreadable(self.label, f"cannot run journalctl ({exc.strerror or exc})") from exc
        self.stderr_tail = bytearray()
        self.drain = threading.Thread(target=self._drain_stderr, name=f"journalctl stderr: {self.label}",
                                      daemon=True)
        self.drain.start()
        self.output_ended = False
        self.closed = False

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while True:
            data = self.proc.stderr.read1(65536)
            if not data:
                return
            self.stderr_tail += data
            if len(self.stderr_tail) > STDERR_TAIL:
                del self.stderr_tail[:-STDERR_TAIL]

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def stderr(self) -> str:
        """The end of what journalctl wrote on stderr, as text (complete once it exited)."""
        return bytes(self.stderr_tail).decode("utf-8", "replace").strip()

    def read(self, size: int = -1) -> bytes:
        if self.output_ended:
            return b""
        assert self.proc.stdout is not None
        data = self.proc.stdout.read(size)
        if data:
            return data
        self.output_ended = True
        self._reap()
        if self.proc.returncode:
            raise SourceReadError(f"journalctl exited with status {self.proc.returncode}: {self.last_words()}")
        return b""

    def last_words(self) -> str:
        """The last lines journalctl wrote on stderr, short enough for a one-line problem."""
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()][-STDERR_LINES:]
        if not lines:
            return "it said nothing on stderr"
        return " | ".join(line if len(line) <= STDERR_LINE_CHARS else line[:STDERR_LINE_CHARS] + "..."
                          for line in lines)

    def _reap(self) -> None:
        try:
            self.proc.wait(JOURNALCTL_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # its output ended but it does not exit: nothing more to wait for
            self.proc.wait()
        self.drain.join()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.output_ended and self.proc.poll() is None:
            self.proc.kill()  # closed early: nobody will read the rest
        self._reap()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


# ------------------------------------------------------------------ chunks of lines


@dataclass
class Chunk:
    data: bytes  # whole lines, each ending with b"\n"
    offset: int  # byte offset of data[0] in the (decompressed) stream
    truncated_line: bool = False  # data is the first MAX_LINE bytes of one over-long line


def read_chunks(stream, source: LogSource, problems: list[Problem],
                chunk_size: int = CHUNK_SIZE) -> Iterator[Chunk]:
    """Yield chunks of whole lines; record read errors as problems and stop cleanly."""
    carry = b""
    offset = 0  # stream offset of carry[0] (or of the skipped remainder)
    skipping = False  # inside an over-long line whose head was already yielded
    while True:
        try:
            data = stream.read(chunk_size)
        except SourceReadError as exc:
            read = offset + len(carry)
            problems.append(Problem(source.label, None, f"{exc} (after {read} bytes of output; kept them)"
                                    if read else str(exc)))
            break
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
            problems.append(Problem(source.label, None,
                                    f"input ends early or is corrupt after {offset + len(carry)} bytes "
                                    f"({exc}); kept everything before"))
            break
        if not data:
            break
        if skipping:
            newline = data.find(b"\n")
            if newline < 0:
                offset += len(data)
                continue
            offset += newline + 1
            skipping = False
            data = data[newline + 1:]
            if not data:
                continue
        buffer = carry + data if carry else data
        cut = buffer.rfind(b"\n")
        if cut < 0:
            if len(buffer) > MAX_LINE:
                # Keep the head of the monster line as one line and skip to its end.
                yield Chunk(buffer[:MAX_LINE] + b"\n", offset, truncated_line=True)
                offset += len(buffer)
                skipping = True
                carry = b""
            else:
                carry = buffer
            continue
        yield Chunk(buffer[: cut + 1], offset)
        offset += cut + 1
        carry = buffer[cut + 1:]
    if carry:
        # A last line without a newline is still a line (a truncated file ends this way).
        yield Chunk(carry + b"\n", offset)
