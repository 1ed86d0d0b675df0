"""Where log lines come from: files, .gz, directories, journal files, raw stderr.

Every source is streamed in chunks that end on a line boundary; nothing reads a
whole file into memory. Problems (a missing file, a gzip that ends early, a line
longer than ``MAX_LINE``) become ``Problem`` records naming the file and line; what
was read before the problem is kept.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

CHUNK_SIZE = 8 << 20
MAX_LINE = 1 << 20  # longer lines are cut here (a 20 MB line must not cost 20 MB per copy)
JOURNAL_SUFFIXES = (".journal", ".journal~")
ROLES = ("prefill", "decode", "router")


@dataclass(frozen=True)
class LogSource:
    """One place to read log lines from.

    ``kind``: ``auto`` (decide from the path), ``file`` (plain or .gz text, any format),
    ``journal`` (a binary journal file or a directory of them, read with journalctl).
    ``fmt`` forces a text format (plain, short-iso, short-precise, json) instead of sniffing.
    """

    path: Path
    kind: str = "auto"
    host: str | None = None
    role: str | None = None
    unit: str | None = None
    fmt: str | None = None

    @property
    def label(self) -> str:
        return str(self.path)

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
    """Something wrong with the input; ``where`` names the file (and line when known)."""

    source: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.message}"


class SourceError(Exception):
    """A source cannot be read at all (missing, unreadable, tool missing)."""


def as_sources(items: Iterable[str | os.PathLike | LogSource], *, role: str | None = None,
               host: str | None = None) -> list[LogSource]:
    """Expand paths and directories into concrete sources (directories recursively, sorted)."""
    expanded: list[LogSource] = []
    for item in items:
        source = item if isinstance(item, LogSource) else LogSource(Path(item))
        if role and not source.role:
            source = replace(source, role=role)
        if host and not source.host:
            source = replace(source, host=host)
        path = source.path
        if source.kind == "journal" or path.name.endswith(JOURNAL_SUFFIXES):
            expanded.append(replace(source, kind="journal"))
        elif path.is_dir() and source.kind == "auto":
            children = sorted(p for p in path.rglob("*") if p.is_file())
            journals = [p for p in children if p.name.endswith(JOURNAL_SUFFIXES)]
            for child in children:
                if child.name.endswith(JOURNAL_SUFFIXES):
                    continue
                expanded.append(replace(source, path=child, kind="file"))
            if journals:
                expanded.append(replace(source, path=path, kind="journal"))
        else:
            expanded.append(replace(source, kind="file" if source.kind == "auto" else source.kind))
    return expanded


def open_stream(source: LogSource):
    """A binary stream of the source's text (decompressed, or journalctl's JSON output)."""
    path = source.path
    if source.kind == "journal":
        return _JournalStream(path)
    if not path.exists():
        raise SourceError(f"{path}: no such file")
    if path.is_dir():
        raise SourceError(f"{path}: is a directory")
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise SourceError(f"{path}: cannot open ({exc.strerror})") from exc
    magic = handle.read(2)
    handle.seek(0)
    if magic == b"\x1f\x8b":
        return _GzipStream(handle, path)
    return handle


class _GzipStream:
    """Streaming gunzip that keeps every byte it could decompress when the file ends early.

    (``gzip.GzipFile.read`` raises at a truncated end and drops what that call had
    already decompressed.) Concatenated members, as logrotate and ``cat`` make, are read
    one after the other.
    """

    def __init__(self, handle, path: Path) -> None:
        self.handle = handle
        self.path = path
        self.decompressor = zlib.decompressobj(wbits=31)
        self.pending = b""
        self.finished = False

    def read(self, size: int) -> bytes:
        while len(self.pending) < size and not self.finished:
            compressed = self.handle.read(1 << 20)
            if not compressed:
                self.finished = True
                if not self.decompressor.eof:
                    data, self.pending = self.pending, b""
                    if data:
                        self._truncated = True
                        return data
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                break
            while compressed:
                try:
                    self.pending += self.decompressor.decompress(compressed)
                except zlib.error as exc:
                    self.finished = True
                    data, self.pending = self.pending, b""
                    if data:
                        self.error = exc
                        return data
                    raise
                if self.decompressor.eof:
                    compressed = self.decompressor.unused_data
                    if compressed and compressed[:2] == b"\x1f\x8b":
                        self.decompressor = zlib.decompressobj(wbits=31)
                    else:
                        compressed = b""
                else:
                    compressed = b""
        if getattr(self, "error", None) is not None and not self.pending:
            error, self.error = self.error, None
            raise error
        if getattr(self, "_truncated", False) and not self.pending:
            self._truncated = False
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        data, self.pending = self.pending[:size], self.pending[size:]
        return data

    def close(self) -> None:
        self.handle.close()


class _JournalStream:
    """journalctl --file/--directory -o json, streamed from its stdout."""

    def __init__(self, path: Path) -> None:
        journalctl = shutil.which("journalctl")
        if journalctl is None:
            raise SourceError(f"{path}: reading a journal file needs journalctl, which is not installed")
        if not path.exists():
            raise SourceError(f"{path}: no such journal file or directory")
        where = ["--directory", str(path)] if path.is_dir() else ["--file", str(path)]
        self.path = path
        self.proc = subprocess.Popen(
            [journalctl, *where, "-o", "json", "--all", "--no-pager", "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )

    def read(self, size: int) -> bytes:
        assert self.proc.stdout is not None
        return self.proc.stdout.read(size)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        stderr = self.proc.stderr.read().decode("utf-8", "replace") if self.proc.stderr else ""
        self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        if self.proc.stderr:
            self.proc.stderr.close()
        self.stderr = stderr.strip()
        self.returncode = self.proc.returncode


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
