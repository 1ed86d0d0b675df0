"""Logs from hosts: an engine's log read where it lives, streamed into the log timeline.

``host_log_source(host, kind, value, role=...)`` makes a ``LogSource`` that
``forensics.logs.scan`` reads next to local files; ``scan_hosts`` builds several and
scans them. Nothing is copied whole: journalctl's output and SFTP reads arrive in chunks
and go straight into the scanner, so a 10 GB journal costs the memory of a few chunks.

Kinds (``LogSpec(kind, value)`` in an inventory):

* ``unit``: ``journalctl -u UNIT -o json [--since/--until] --no-pager`` on the host's
  own journal (``sudo=True`` runs it through ``sudo -n``);
* ``journal_file``: ``journalctl --file PATH -o json ...`` (``unit=`` adds ``-u UNIT``);
* ``journal_dir``: ``journalctl -D DIR -o json ...`` (``unit=`` adds ``-u UNIT``);
* ``file``: a text log (or .gz) read over SFTP (``Host.iter_file``), or through
  ``sudo -n cat`` when ``sudo=True``; its time window is applied by the scanner, so pass
  the same ``since``/``until`` to ``scan`` (``scan_hosts`` does);
* ``command``: an argument list run on the host (``["docker", "logs", "prefill"]``), its
  stdout streamed (text: the scanner sniffs its format).

Nothing fails silently. Every way a read can go wrong becomes a ``Problem`` naming the
host and the unit or path (``ssh://root@10.0.0.5:22 journal:sglang-prefill.service``):
journalctl missing on the host, permission denied (with the fix: ``sudo = true`` or the
``systemd-journal``/``adm`` group), the command timing out, the connection dropping
part-way (what was read before is kept and the problem says after how many bytes and
lines), journal output cut in the middle of a line. A journal that was read and holds no
entries for the unit in the window says "no lines in the window", which is not
``unreadable``: it is an answer, not a failure to get one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import pandas as pd

from forensics.hosts.base import Host
from forensics.hosts.result import CommandResult, State
from forensics.hosts.ssh import SSHHost
from forensics.logs import timewindow
from forensics.logs.sources import LogSource, SourceError, SourceReadError

HOST_KINDS = ("unit", "file", "command", "journal_file", "journal_dir")
JOURNAL_KINDS = ("unit", "journal_file", "journal_dir")
DEFAULT_TIMEOUT_S = 3600.0  # the whole read; a journal of many GB over a slow link takes a while
STREAM_CHUNK = 1 << 20  # bytes per piece from the host (SSH channel reads, SFTP reads)
SFTP_WINDOW = 4 << 20  # bytes asked for at once over SFTP (pipelined 32 KiB requests)
STDERR_KEEP = 64 << 10
STDERR_QUOTE_LINES, STDERR_QUOTE_CHARS = 3, 240
_NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError)
try:  # paramiko is a dependency of forensics.hosts; its errors are network errors here
    import paramiko

    _NETWORK_ERRORS = (OSError, EOFError, paramiko.SSHException)
except ImportError:  # pragma: no cover
    paramiko = None

JOURNAL_PERMISSION_FIX = ("fix: set sudo = true for this log (journalctl runs through sudo -n), or add the user "
                          "to the systemd-journal (or adm) group")
FILE_PERMISSION_FIX = ("fix: set sudo = true for this log (it is then read with sudo -n cat), or make the file "
                       "readable by the user")


def host_label(host: Host) -> str:
    """``ssh://user@host:port`` for an ``SSHHost``, the host's name for anything else."""
    target = getattr(host, "target", None)
    if target is not None and getattr(target, "hostname", None):
        return f"ssh://{target.user}@{target.hostname}:{target.port}"
    return str(getattr(host, "name", None) or type(host).__name__)


def source_label(host: Host, kind: str, value: str | Sequence[str], unit: str | None = None) -> str:
    """What the problems and the events' ``source`` column call one host log."""
    where = host_label(host)
    if kind == "unit":
        what = f"journal:{value}"
    elif kind == "journal_file":
        what = f"journal-file:{value}" + (f" unit:{unit}" if unit else "")
    elif kind == "journal_dir":
        what = f"journal-dir:{value}" + (f" unit:{unit}" if unit else "")
    elif kind == "file":
        what = f"file:{value}"
    else:
        what = "command:" + " ".join(value if not isinstance(value, str) else [value])
    return f"{where} {what}"


def journal_bound(stamp: pd.Timestamp) -> str:
    """A UTC time as journalctl reads it whatever the host's zone: ``@EPOCH.MICROS``."""
    micros = stamp.value // 1000
    return f"@{micros // 1_000_000}.{micros % 1_000_000:06d}"


def journalctl_argv(kind: str, value: str, *, unit: str | None = None, since: pd.Timestamp | None = None,
                    until: pd.Timestamp | None = None, journalctl: str = "journalctl") -> list[str]:
    """The journalctl command for a journal kind (json, every field whole, no pager)."""
    if kind == "unit":
        where = ["-u", value]
    elif kind == "journal_file":
        where = ["--file", value] + (["-u", unit] if unit else [])
    elif kind == "journal_dir":
        where = ["--directory", value] + (["-u", unit] if unit else [])
    else:
        raise ValueError(f"not a journal kind: {kind!r}")
    argv = [journalctl, *where, "-o", "json", "--all", "--no-pager"]
    if since is not None:
        argv += ["--since", journal_bound(since)]
    if until is not None:
        argv += ["--until", journal_bound(until)]
    return argv


def host_log_source(host: Host, kind: str, value: str | Sequence[str], *, role: str | None,
                    label: str | None = None, since=None, until=None, sudo: bool = False,
                    journalctl: str = "journalctl", unit: str | None = None, tz: str = "UTC",
                    timeout: float = DEFAULT_TIMEOUT_S) -> LogSource:
    """A ``LogSource`` reading one log on ``host``, for ``forensics.logs.scan``.

    ``kind``/``value``: ``unit``/UNIT, ``journal_file``/PATH, ``journal_dir``/DIR,
    ``file``/PATH or ``command``/ARGV (a list; a string is one program without arguments).
    ``unit`` filters a journal file or directory with ``-u``. ``since``/``until`` (any
    bound ``scan`` takes: ISO time, epoch, ``30m``) go to journalctl; a file's or
    command's lines are windowed by ``scan(..., since=, until=)``. ``timeout`` bounds the
    whole read on the host. Nothing runs until the scan reaches the source.
    """
    if kind not in HOST_KINDS:
        raise ValueError(f"unknown host log kind {kind!r} (expected one of {', '.join(HOST_KINDS)})")
    if kind == "command":
        argv = [value] if isinstance(value, str) else list(value)
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise ValueError(f"a command log needs a non-empty argument list, not {value!r}")
    elif not isinstance(value, str) or not value:
        raise ValueError(f"a {kind} log needs a non-empty string, not {value!r}")
    bounds = timewindow.window(since, until, None, tz)  # bad bounds fail here, before any reading
    name = label or source_label(host, kind, value, unit)
    if kind in JOURNAL_KINDS:
        argv = journalctl_argv(kind, value, unit=unit, since=bounds.since, until=bounds.until, journalctl=journalctl)
        window = bounds.describe() if not bounds.empty else "the whole journal"
        about = f"unit {value}" if kind == "unit" else (f"unit {unit}" if unit else "any unit")

        def opener() -> CommandReader:
            return CommandReader(host, argv, label=name, sudo=sudo, timeout=timeout, journal=True,
                                 empty_means=f"no lines in the window: journalctl read the journal and found no "
                                             f"entries for {about} in {window}")
    elif kind == "command":
        def opener() -> CommandReader:
            return CommandReader(host, argv, label=name, sudo=sudo, timeout=timeout, journal=False,
                                 empty_means="no lines: the command ran and printed nothing on stdout")
    elif sudo:
        def opener() -> CommandReader:
            return CommandReader(host, ["cat", "--", value], label=name, sudo=True, timeout=timeout, journal=False,
                                 empty_means="empty: the file holds no lines", file=value)
    else:
        def opener() -> FileReader:
            return FileReader(host, value, label=name)
    return LogSource(name, kind="stream", host=getattr(host, "name", None), role=role,
                     unit=value if kind == "unit" else unit, name=name, opener=opener)


def scan_hosts(items: Iterable[LogSource | Mapping | Sequence], *, since=None, until=None, tz: str = "UTC",
               **scan_options):
    """Scan host logs (and any other sources) into one ``LogScan``, windowed on both sides.

    Each item is a ``LogSource`` (taken as it is), a mapping of ``host_log_source``'s
    arguments (``{"host": h, "kind": "unit", "value": "sglang-prefill.service", "role":
    "prefill"}``) or a tuple ``(host, kind, value, role)``. ``since``/``until`` go to
    journalctl and to the scanner's window.
    """
    from forensics.logs.timeline import scan

    sources: list[LogSource | str | os.PathLike] = []
    for item in items:
        if isinstance(item, (LogSource, str, os.PathLike)):
            sources.append(item)
            continue
        if isinstance(item, Mapping):
            options = dict(item)
            host, kind, value = options.pop("host"), options.pop("kind"), options.pop("value")
            options.setdefault("role", None)
        else:
            host, kind, value, *rest = item
            options = {"role": rest[0] if rest else None}
        options.setdefault("since", since)
        options.setdefault("until", until)
        options.setdefault("tz", tz)
        sources.append(host_log_source(host, kind, value, **options))
    return scan(sources, since=since, until=until, tz=tz, **scan_options)


# ------------------------------------------------------------------ readers


class _Counting:
    """Bytes and lines delivered so far, to say where a read stopped."""

    def __init__(self) -> None:
        self.bytes = 0
        self.lines = 0
        self.last = b""

    def add(self, data: bytes) -> None:
        if data:
            self.bytes += len(data)
            self.lines += data.count(b"\n")
            self.last = data[-1:]

    def where(self) -> str:
        return f"after {self.lines} whole lines"  # read_chunks adds the bytes and that they were kept


class _Reader:
    """``read(size)`` over an iterator of byte pieces, with failures raised where they belong.

    A failure before any byte arrived raises ``SourceError`` (the source is unreadable); one
    after some bytes is kept until they were all read, then raised as ``SourceReadError``
    (the scan keeps what came before, the problem says where it stopped). A clean end
    with no byte raises ``SourceReadError(empty_means)`` on the next read, so an empty
    window is a named answer rather than a silent nothing.
    """

    fmt: str | None = None

    def __init__(self, label: str) -> None:
        self.label = label
        self.count = _Counting()
        self.pending = b""
        self.ended = False
        self.deferred: Exception | None = None  # a failure, raised once what came before was read
        self.nothing: Exception | None = None  # a clean end without a byte: raised by the 2nd empty read
        self.nothing_said = False

    # subclasses: the next piece, or None at the end (having judged it: _fail, nothing, or fine)
    def _next(self) -> bytes | None:
        raise NotImplementedError

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = STREAM_CHUNK
        parts: list[bytes] = []
        have = 0
        if self.pending:
            parts.append(self.pending[:size])
            have = len(parts[0])
            self.pending = self.pending[size:]
        while have < size and not self.ended:
            piece = self._next()
            if piece is None:
                self.ended = True
                break
            self.count.add(piece)  # counted on arrival: a failure on the next piece must know of it
            if have + len(piece) > size:
                self.pending = piece[size - have:]
                piece = piece[:size - have]
            parts.append(piece)
            have += len(piece)
        data = b"".join(parts)
        if not data and self.deferred is not None:
            error, self.deferred = self.deferred, None
            raise error
        if not data and self.nothing is not None and self.nothing_said:
            error, self.nothing = self.nothing, None
            raise error
        self.nothing_said = not data  # the first empty read only peeks: the next one says why
        return data

    def _fail(self, reason: str) -> None:
        """Stop with ``reason``: unreadable before any byte, a kept-so-far problem after some."""
        if self.count.bytes == 0:
            raise SourceError(f"{self.label}: {reason}", path=self.label, reason=reason)
        self.deferred = SourceReadError(f"{reason}; reading stopped {self.count.where()}")

    def _total(self) -> int:
        return self.count.bytes


class CommandReader(_Reader):
    """A command's stdout on a host (``Host.stream``), read as a file; its end judged by its result."""

    def __init__(self, host: Host, argv: Sequence[str], *, label: str, sudo: bool, timeout: float,
                 journal: bool, empty_means: str, file: str | None = None) -> None:
        super().__init__(label)
        self.host = host
        self.argv = list(argv)
        self.sudo = sudo
        self.timeout = timeout
        self.journal = journal
        self.file = file
        self.empty_means = empty_means
        self.fmt = "json" if journal else None
        self.result: CommandResult | None = None
        self.last_piece = b""
        self.stream = host.stream(self.argv, timeout=timeout, sudo=sudo, chunk_size=STREAM_CHUNK,
                                  max_stderr=STDERR_KEEP)
        self.chunks: Iterator[bytes] = iter(self.stream)

    def _next(self) -> bytes | None:
        try:
            piece = next(self.chunks)
        except StopIteration:
            self.result = self.stream.result
            self._judge(self.result)
            return None
        except _NETWORK_ERRORS as exc:
            self._fail(f"the connection to {host_label(self.host)} failed while reading "
                       f"({type(exc).__name__}: {_one_line(exc)})")
            return None
        if piece:
            self.last_piece = piece
        return piece

    def _judge(self, result: CommandResult | None) -> None:
        if result is None:
            self._fail("the command ended without a result")
            return
        stderr = result.stderr_text
        program = self.argv[0]
        if result.state is State.OK:
            if self.journal and ("not seeing messages from other users" in stderr
                                 or "insufficient permissions" in stderr):
                self._fail(f"permission denied: {program} could only read the user's own messages "
                           f"({_quote(stderr)}); {JOURNAL_PERMISSION_FIX}")
            elif self.journal and self._total() and self.last_piece[-1:] != b"\n":
                self._fail("journal output cut: it ended in the middle of a line")
            elif self._total() == 0:
                self.nothing = SourceReadError(self.empty_means)
            return
        if self.sudo and result.exit_code == 127 and "sudo" in stderr:
            self._fail(f"sudo not found on the host ({_quote(stderr)}); fix: install sudo there, or set sudo = false "
                       f"and give the user read access")
        elif result.state is State.DISCONNECTED:
            self._fail(f"the connection to {host_label(self.host)} dropped ({result.error})")
        elif result.state is State.TIMED_OUT:
            self._fail(f"{program} timed out: {result.error} (a read may take up to timeout={self.timeout:g}s; "
                       f"raise it, or narrow the window with since/until)")
        elif result.state is State.ERROR or _not_found(result, program):
            self._fail(self._not_found_text(result))
        elif _permission_denied(stderr):
            fix = JOURNAL_PERMISSION_FIX if self.journal else FILE_PERMISSION_FIX
            if self.sudo and "sudo" in stderr:
                fix = (f"fix: allow the user to run {program} through sudo without a password "
                       f"(NOPASSWD in /etc/sudoers.d), or add it to the systemd-journal group and set sudo = false")
            self._fail(f"permission denied ({_quote(stderr)}); {fix}")
        elif self.sudo and "sudo:" in stderr:
            self._fail(f"sudo refused ({_quote(stderr)}); fix: allow the user to run {program} with sudo -n "
                       f"(NOPASSWD), or set sudo = false and give it read access")
        elif "No such file" in stderr and (self.file is not None or self.journal):
            what = "file" if self.file is not None else "journal file or directory"
            self._fail(f"no such {what} on the host ({_quote(stderr)})")
        else:
            self._fail(f"{program} exited with status {result.exit_code}: {_quote(stderr)}")

    def _not_found_text(self, result: CommandResult) -> str:
        program = self.argv[0]
        said = result.error or _quote(result.stderr_text)
        if self.journal:
            return (f"journalctl not found on the host ({program!r}: {said}); fix: install systemd's journalctl "
                    f"there, or give its path (journalctl = \"/usr/bin/journalctl\")")
        return f"{program!r} not found on the host ({said}); fix: install it or give its full path"

    def close(self) -> None:
        self.stream.close()


class FileReader(_Reader):
    """A file on a host through ``Host.iter_file`` (SFTP for ``SSHHost``), in chunks."""

    def __init__(self, host: Host, path: str, *, label: str) -> None:
        super().__init__(label)
        self.host = host
        self.path = path
        self.chunks = _sftp_pieces(host, path) if isinstance(host, SSHHost) else host.iter_file(path, STREAM_CHUNK)

    def _next(self) -> bytes | None:
        try:
            piece = next(self.chunks)
        except StopIteration:
            if self._total() == 0:
                self.nothing = SourceReadError("empty: the file holds no lines")
            return None
        except FileNotFoundError as exc:
            self._fail(f"no such file on the host ({_one_line(exc)})")
            return None
        except PermissionError as exc:
            self._fail(f"permission denied ({_one_line(exc)}); {FILE_PERMISSION_FIX}")
            return None
        except IsADirectoryError:
            self._fail("is a directory; name the log file inside it")
            return None
        except _NETWORK_ERRORS as exc:
            if isinstance(exc, OSError) and _permission_denied(str(exc)):
                self._fail(f"permission denied ({_one_line(exc)}); {FILE_PERMISSION_FIX}")
            else:
                self._fail(f"the connection to {host_label(self.host)} failed while reading the file "
                           f"({type(exc).__name__}: {_one_line(exc)})")
            return None
        except Exception as exc:  # noqa: BLE001 - e.g. EnvironmentProblem: host unreachable, auth refused
            self._fail(f"cannot read the file ({type(exc).__name__}: {_one_line(exc)})")
            return None
        return piece

    def close(self) -> None:
        close: Callable[[], None] | None = getattr(self.chunks, "close", None)
        if close is not None:
            try:
                close()
            except _NETWORK_ERRORS:
                pass  # the connection is gone already; the read said so


def _sftp_pieces(host: SSHHost, path: str) -> Iterator[bytes]:
    """A file over SFTP in ``SFTP_WINDOW`` pieces, each fetched by pipelined requests.

    ``SSHHost.iter_file`` waits for each 32 KiB request before sending the next (about
    5 MB/s on loopback). Here a window's requests are all sent before the first answer is
    awaited (about 50 MB/s), as paramiko's ``readv`` does, but from this thread: ``readv``
    sends them from a thread of its own, whose error on a dropped connection would be an
    unhandled-thread traceback instead of this read's problem. At most one window is held.
    Up to the size the file had when opened it is read in windows, then on with plain
    reads until the end (a live log grows). Where paramiko lacks the pieces this uses,
    plain reads do all of it.
    """
    sftp = host._sftp()
    try:
        with sftp.open(path, "rb") as handle:
            size = handle.stat().st_size or 0
            offset = 0
            pipelined = all(hasattr(handle, name) for name in ("_prefetch_thread", "_prefetching", "_prefetch_done"))
            while pipelined and offset < size:
                length = min(SFTP_WINDOW, size - offset)
                requests = []
                for start in range(offset, offset + length, handle.MAX_REQUEST_SIZE):
                    requests.append((start, min(handle.MAX_REQUEST_SIZE, offset + length - start)))
                handle._prefetching, handle._prefetch_done = True, False
                handle._prefetch_thread(requests, None)  # sends the requests; the answers are read below
                handle.seek(offset)
                piece = handle.read(length)
                if not piece:
                    break
                offset += len(piece)
                yield piece
            handle.seek(offset)
            while piece := handle.read(STREAM_CHUNK):
                yield piece
    finally:
        sftp.close()


def _not_found(result: CommandResult, program: str) -> bool:
    if result.exit_code == 127:
        return True
    stderr = result.stderr_text
    return result.exit_code in (126, 127) or ("command not found" in stderr) or (
        "failed to run command" in stderr and program in stderr)


def _permission_denied(text: str) -> bool:
    lowered = text.lower()
    return "permission denied" in lowered or "insufficient permissions" in lowered or "access denied" in lowered


def _quote(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()][-STDERR_QUOTE_LINES:]
    if not lines:
        return "it said nothing on stderr"
    return " | ".join(line if len(line) <= STDERR_QUOTE_CHARS else line[:STDERR_QUOTE_CHARS] + "..."
                      for line in lines)


def _one_line(exc: BaseException) -> str:
    return " ".join((str(exc) or type(exc).__name__).split())


__all__ = ["HOST_KINDS", "CommandReader", "FileReader", "host_label", "host_log_source", "journal_bound",
           "journalctl_argv", "scan_hosts", "source_label"]
