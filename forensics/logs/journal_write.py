"""Turn a text log (sglang's format) into a real systemd journal file, as journald would hold it.

``write_journal("prefill.log", "logs/prefill.journal", unit="sglang-prefill.service")``
streams the file line by line, in journal export format, into
``systemd-journal-remote --output=... --split-mode=none``. Every line becomes one entry
with ``_SYSTEMD_UNIT`` (what ``journalctl -u UNIT`` matches), ``SYSLOG_IDENTIFIER``,
``_HOSTNAME``, ``_PID``, ``PRIORITY=6`` and ``__REALTIME_TIMESTAMP`` taken from the line's
own time: sglang's ``[2025-07-01 12:00:00(.123) TP0]`` prefix, or a library line's leading
``2025-07-01 12:00:00`` (NIXL), read in ``tz``. A line without a time (a traceback printed
by CPython's excepthook, a banner) takes the time of the line before it; lines before
the first timed line take that line's time (or the file's modification time when the
first ``UNTIMED_HEAD_MAX`` lines carry none). So ``journalctl --file/-D ... -u UNIT
--since T`` on the result selects what scanning the text file with ``since=T`` selects.

Writing to an existing journal file appends to it, so several units can share one file;
An output not named ``*.journal`` is taken as a directory to put ``UNIT.journal`` in.
Each call stamps its entries with a fresh ``_BOOT_ID``, so ``journalctl -D`` over several
files merges them by wall-clock time.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import tempfile
import uuid
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from forensics.exitcodes import EnvironmentProblem
from forensics.logs.lineformats import LIBRARY_LINE, SGLANG_PREFIX

JOURNAL_REMOTE_PATHS = ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")
UNTIMED_HEAD_MAX = 10_000  # untimed lines held back waiting for the first time (bounded memory)
WRITE_TIMEOUT_S = 600.0


def journal_remote_path() -> str | None:
    """Where systemd-journal-remote is installed, or None."""
    for candidate in JOURNAL_REMOTE_PATHS:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def line_time_us(line: bytes, tz: ZoneInfo, cache: dict[bytes, int]) -> int | None:
    """Epoch microseconds of a line's own time (sglang prefix or library line), or None."""
    found = SGLANG_PREFIX.match(line)
    if found is not None:
        text = found.group(1)
    elif LIBRARY_LINE.match(line):
        text = line[:19]
    else:
        return None
    cached = cache.get(text)
    if cached is not None:
        return cached
    try:
        value = text.decode("ascii").replace("T", " ")
        whole, _, fraction = value.partition(".")
        naive = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    micros = int((fraction + "000000")[:6]) if fraction else 0
    epoch = int(naive.replace(tzinfo=tz).timestamp()) * 1_000_000 + micros
    if len(cache) > 100_000:
        cache.clear()
    cache[text] = epoch
    return epoch


def _field(name: str, value: bytes) -> bytes:
    """One export-format field; the binary form when the value holds a newline."""
    if b"\n" in value:
        return name.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
    return name.encode() + b"=" + value + b"\n"


def export_entries(lines, *, unit: str, identifier: str, hostname: str, pid: int, tz: str = "UTC",
                   fallback_us: int = 0):
    """Journal export-format entries (bytes) for text lines, in order, in bounded memory."""
    zone = ZoneInfo(tz)
    cache: dict[bytes, int] = {}
    boot_id = uuid.uuid4().hex.encode()
    fixed = (_field("_BOOT_ID", boot_id) + _field("_HOSTNAME", hostname.encode())
             + _field("_SYSTEMD_UNIT", unit.encode()) + _field("SYSLOG_IDENTIFIER", identifier.encode())
             + _field("_PID", str(pid).encode()) + _field("PRIORITY", b"6"))
    held: list[bytes] = []
    current: int | None = None
    number = 0

    def entry(message: bytes, micros: int) -> bytes:
        nonlocal number
        number += 1
        return (_field("__REALTIME_TIMESTAMP", str(micros).encode())
                + _field("__MONOTONIC_TIMESTAMP", str(number).encode()) + fixed
                + _field("MESSAGE", message) + b"\n")

    for raw in lines:
        line = raw.rstrip(b"\n").rstrip(b"\r")
        stamp = line_time_us(line, zone, cache)
        if stamp is not None:
            current = stamp
        if current is None:
            held.append(line)
            if len(held) < UNTIMED_HEAD_MAX:
                continue
            current = fallback_us  # no time in the head of the file: the file's own time
        for early in held:
            yield entry(early, current)
        held.clear()
        yield entry(line, current)
    for early in held:
        yield entry(early, fallback_us)


def write_journal(log: str | os.PathLike, output: str | os.PathLike, *, unit: str, identifier: str | None = None,
                  hostname: str | None = None, pid: int | None = None, tz: str = "UTC",
                  journal_remote: str | None = None) -> Path:
    """Write the text log ``log`` into the journal file ``output`` (``*.journal``; appended to when it exists).

    ``output`` not named ``*.journal`` is a directory (made when missing): the file is then
    ``DIR/<unit without .service>.journal``, which ``journalctl -D DIR`` reads.
    ``unit`` becomes ``_SYSTEMD_UNIT`` (``.service`` is added when it has no suffix, as
    ``journalctl -u`` does); ``identifier`` (default: the unit without its suffix)
    ``SYSLOG_IDENTIFIER``; ``hostname`` (default: this machine's) ``_HOSTNAME``. Returns the
    journal file's path. Raises ``EnvironmentProblem`` when systemd-journal-remote is missing
    or fails.
    """
    source = Path(log)
    if "." not in unit:
        unit = f"{unit}.service"
    target = Path(output)
    if target.is_dir() or not target.name.endswith(".journal"):
        target = target / f"{unit.rsplit('.', 1)[0]}.journal"  # a directory (made when missing)
    program = journal_remote or journal_remote_path()
    if program is None or not os.access(program, os.X_OK):
        raise EnvironmentProblem(f"systemd-journal-remote is not installed (looked in "
                                 f"{', '.join(JOURNAL_REMOTE_PATHS)}); fix: apt-get install systemd-journal-remote")
    try:
        fallback_us = int(source.stat().st_mtime * 1_000_000)
    except OSError as exc:
        raise EnvironmentProblem(f"{source}: cannot read ({exc.strerror or exc})", path=str(source)) from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb") as lines, tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen([program, f"--output={target}", "--split-mode=none", "-"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors)
        assert proc.stdin is not None
        try:
            batch: list[bytes] = []
            size = 0
            for entry in export_entries(lines, unit=unit, identifier=identifier or unit.rsplit(".", 1)[0],
                                        hostname=hostname or socket.gethostname(),
                                        pid=pid if pid is not None else os.getpid(), tz=tz,
                                        fallback_us=fallback_us):
                batch.append(entry)
                size += len(entry)
                if size >= 1 << 20:
                    proc.stdin.write(b"".join(batch))
                    batch, size = [], 0
            proc.stdin.write(b"".join(batch))
            proc.stdin.close()
            code = proc.wait(WRITE_TIMEOUT_S)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            proc.kill()
            code = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if code != 0:
            errors.seek(0)
            said = errors.read()[-2000:].decode("utf-8", "replace").strip()
            raise EnvironmentProblem(f"systemd-journal-remote failed writing {target} (exit {code}): {said}",
                                     path=str(target))
    return target


__all__ = ["export_entries", "journal_remote_path", "line_time_us", "write_journal"]
