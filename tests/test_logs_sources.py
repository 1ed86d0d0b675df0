"""Sources are recognised by content, read as streams (pipes too), in bounded memory.

Regression tests for issue 8, "Input by content, not by name": a saved ``journalctl``
text named ``*.journal`` went to journalctl and read as empty; ``-``, ``/dev/stdin``,
``<(zcat x.gz)`` and FIFOs failed on a seek; a 2 MB gzip of repeated lines took 2.25 GB;
a chatty journalctl deadlocked on its stderr pipe.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import threading
import types
import zlib
from pathlib import Path

import psutil
import pytest

import forensics as fx
from forensics.exitcodes import EnvironmentProblem, ExitStatus, UsageProblem
from forensics.logs import incident as gen
from forensics.logs import sources
from forensics.logs.counting import count_signatures
from forensics.logs.sources import (
    JOURNAL_MAGIC,
    LogSource,
    PeekableStream,
    SourceError,
    SourceSpecError,
    as_sources,
    open_stream,
    read_chunks,
)

REPO = Path(__file__).resolve().parents[1]
JOURNAL_REMOTE = Path("/lib/systemd/systemd-journal-remote")
needs_journal_tools = pytest.mark.skipif(
    not JOURNAL_REMOTE.exists() or shutil.which("journalctl") is None,
    reason="needs Debian's systemd-journal-remote and journalctl (./run test installs them as root)",
)
needs_journalctl = pytest.mark.skipif(shutil.which("journalctl") is None, reason="needs journalctl")


# ------------------------------------------------------------------ shared inputs


@pytest.fixture(scope="module")
def story() -> gen.Incident:
    return gen.generate("0.5.15", steady_seconds=20, after_seconds=60)


@pytest.fixture(scope="module")
def short_iso_text(story, tmp_path_factory) -> bytes:
    """What ``journalctl -u sglang-prefill -u sglang-decode > x.journal`` saves."""
    path = gen.write_journal_text(story, tmp_path_factory.mktemp("text") / "dump.txt", style="short-iso")
    return path.read_bytes()


@pytest.fixture(scope="module")
def binary_journal(story, tmp_path_factory) -> Path:
    if not JOURNAL_REMOTE.exists() or shutil.which("journalctl") is None:
        pytest.skip("needs Debian's systemd-journal-remote and journalctl")
    directory = tmp_path_factory.mktemp("binary")
    export = gen.write_journal_export(story, directory / "pd.export")
    output = directory / "pd.journal"
    subprocess.run([str(JOURNAL_REMOTE), f"--output={output}", "--split-mode=none", str(export)],
                   check=True, capture_output=True, timeout=120)
    export.unlink()
    return output


def signature_counts(scan) -> dict[str, int]:
    return scan.events["signature"].value_counts().to_dict()


def fake_journalctl(directory: Path, monkeypatch, body: str) -> Path:
    """A ``journalctl`` first on PATH that runs ``body`` (sh), to script what it does."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "journalctl"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
    return script


def json_lines(story) -> bytes:
    buffer = io.StringIO()
    for record in story.records:
        buffer.write(json.dumps({
            "__REALTIME_TIMESTAMP": str(int(record.ts.timestamp() * 1_000_000)), "_HOSTNAME": "pd-node-1",
            "_SYSTEMD_UNIT": gen.UNITS[record.role], "MESSAGE": gen.sglang_line(record),
        }) + "\n")
    return buffer.getvalue().encode()


# ------------------------------------------------------------------ 1. content, not name


@pytest.mark.parametrize("name", ["sglang.journal", "sglang.journal~"])
def test_saved_journalctl_text_named_journal_is_read_as_text(tmp_path, monkeypatch, short_iso_text, name):
    # Were the name to send it to journalctl, this journalctl leaves a mark and fails.
    marker = tmp_path / "journalctl-was-run"
    fake_journalctl(tmp_path / "bin", monkeypatch, f"touch {marker}; exit 1")
    saved = tmp_path / name
    saved.write_bytes(short_iso_text)
    control = tmp_path / "control.log"
    control.write_bytes(short_iso_text)

    scan = fx.logs.scan(saved)

    assert not marker.exists()
    assert [s.kind for s in as_sources([saved])] == ["file"]
    assert scan.sources.iloc[0]["format"] == "short-iso"
    assert scan.problems == []
    assert (scan.events["signature"] == "thread_death").sum() == 1
    assert signature_counts(scan) == signature_counts(fx.logs.scan(control))
    assert sum(count_signatures(saved).values()) == len(scan.events)


def test_a_file_starting_with_the_journal_magic_is_a_journal_whatever_its_name(tmp_path):
    for name in ("prefill.log", "export.bin", "x.journal"):
        (tmp_path / name).write_bytes(JOURNAL_MAGIC + b"\0" * 200)
    assert {s.path.name: s.kind for s in as_sources([tmp_path / n for n in ("prefill.log", "export.bin")])} == {
        "prefill.log": "journal", "export.bin": "journal"}
    # kind="file" is the way to insist on text.
    assert as_sources([LogSource(tmp_path / "x.journal", kind="file")])[0].kind == "file"


@needs_journal_tools
def test_binary_journal_under_any_name_goes_through_journalctl(tmp_path, binary_journal, story):
    renamed = tmp_path / "prefill-node-1.log"
    shutil.copy(binary_journal, renamed)
    scan = fx.logs.scan(renamed)
    assert scan.sources.iloc[0]["format"] == "json"
    death = scan.events[scan.events["signature"] == "thread_death"]
    assert len(death) == 1 and (death["ts_source"] == "journal").all()
    assert scan.problems == []


@needs_journal_tools
def test_directory_mixes_binary_journals_and_text_by_content(tmp_path, binary_journal, short_iso_text):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(binary_journal, logs / "system.journal")  # read with --directory
    shutil.copy(binary_journal, logs / "copied-off-host.bin")  # magic, but a name --directory skips: --file
    (logs / "saved.journal").write_bytes(short_iso_text)  # text with a journal name: text
    (logs / "decode.log").write_bytes(short_iso_text)

    expanded = as_sources([logs])
    kinds = {(s.path.name, s.kind) for s in expanded}
    assert kinds == {("decode.log", "file"), ("saved.journal", "file"), ("logs", "journal"),
                     ("copied-off-host.bin", "journal")}

    scan = fx.logs.scan(logs)
    formats = dict(zip(scan.sources["source"].map(lambda s: Path(s).name), scan.sources["format"]))
    assert formats == {"decode.log": "short-iso", "saved.journal": "short-iso", "logs": "json",
                       "copied-off-host.bin": "json"}
    assert (scan.events["signature"] == "thread_death").sum() == 4
    assert scan.problems == []


@needs_journalctl
def test_a_damaged_binary_journal_is_a_named_problem_with_journalctls_words(tmp_path):
    broken = tmp_path / "broken.journal"
    broken.write_bytes(JOURNAL_MAGIC + b"\x01" * 4096)
    scan = fx.logs.scan(broken)
    assert len(scan.events) == 0
    messages = [p.message for p in scan.problems if p.source == str(broken)]
    assert len(messages) == 1
    assert "journalctl exited with status" in messages[0]


# ------------------------------------------------------------------ 2. LogSource values


def test_logsource_accepts_str_and_pathlike_paths():
    assert LogSource("x.log").path == Path("x.log")
    assert isinstance(LogSource("x.log").path, Path)
    assert LogSource(Path("x.log")) == LogSource("x.log")
    assert LogSource("x.log").guessed_role() is None
    assert LogSource("logs/prefill-0.log").guessed_role() == "prefill"
    assert fx.logs.LogSource("-").label == "<stdin>"


@pytest.mark.parametrize(("options", "named"), [
    ({"fmt": "short-isoo"}, "'short-isoo'"),
    ({"fmt": "syslog"}, "'syslog'"),
    ({"kind": "jounral"}, "'jounral'"),
    ({"kind": "journal", "fmt": "plain"}, "'plain'"),
])
def test_bad_kind_or_format_is_a_usage_error_naming_the_value(options, named):
    with pytest.raises(SourceSpecError) as caught:
        LogSource("x.log", **options)
    assert named in str(caught.value)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, UsageProblem)
    assert caught.value.exit_status == ExitStatus.USAGE


def test_format_aliases():
    assert LogSource("x", fmt="short-iso-precise").fmt == "short-iso"
    assert LogSource("x", fmt="auto").fmt is None
    assert LogSource("x", kind="journal", fmt="json").fmt == "json"
    with pytest.raises(SourceSpecError, match="empty"):
        LogSource("")


def test_fmt_overrides_sniffing_for_a_journal_named_text_file(tmp_path, short_iso_text):
    saved = tmp_path / "x.journal"
    saved.write_bytes(short_iso_text)
    forced = fx.logs.scan(LogSource(str(saved), fmt="plain"))
    assert forced.sources.iloc[0]["format"] == "plain"
    assert fx.logs.scan(LogSource(saved)).sources.iloc[0]["format"] == "short-iso"
    # And a gzip keeps the stated format after decompression.
    packed = tmp_path / "x.journal.gz"
    packed.write_bytes(gzip.compress(short_iso_text))
    assert fx.logs.scan(LogSource(packed, fmt="plain")).sources.iloc[0]["format"] == "plain"


# ------------------------------------------------------------------ 3. pipes and streams


class NoSeek(io.RawIOBase):
    """A reader that fails like a pipe does when anyone seeks or tells."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def seek(self, *args):
        raise io.UnsupportedOperation("Illegal seek")

    def readinto(self, buffer) -> int:
        n = min(len(buffer), len(self.data) - self.position, 3)  # short reads, as pipes give
        buffer[:n] = self.data[self.position:self.position + n]
        self.position += n
        return n


@pytest.mark.parametrize("sizes", [[1], [2, 5], [8], [9, 1000], [100000]])
def test_peekable_stream_replays_what_it_peeked(sizes):
    data = bytes(range(256)) * 40
    stream = PeekableStream(io.BufferedReader(NoSeek(data)))
    assert stream.peek(8) == data[:8]
    assert stream.peek(2) == data[:2]
    out = []
    turn = 0
    while True:
        piece = stream.read(sizes[turn % len(sizes)])
        turn += 1
        if not piece:
            break
        out.append(piece)
    assert b"".join(out) == data


def _feed(path_or_fd, data: bytes) -> threading.Thread:
    """Write ``data`` into a FIFO path or a pipe's write end from a thread, then close it."""

    def write() -> None:
        if isinstance(path_or_fd, int):
            with os.fdopen(path_or_fd, "wb") as handle:
                handle.write(data)
        else:
            with open(path_or_fd, "wb") as handle:  # blocks until the reader opens the FIFO
                handle.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(60)
@pytest.mark.parametrize("packing", ["plain", "gzip"])
def test_dev_fd_path_of_a_pipe_like_process_substitution(packing, short_iso_text, tmp_path):
    control = tmp_path / "control.log"
    control.write_bytes(short_iso_text)
    data = gzip.compress(short_iso_text) if packing == "gzip" else short_iso_text
    read_end, write_end = os.pipe()
    try:
        writer = _feed(write_end, data)  # big enough to fill the pipe buffer: the writer blocks on us
        path = f"/dev/fd/{read_end}"  # what bash's <(zcat x.gz) hands over
        assert [s.path for s in as_sources([path])] == [Path(path)]  # not "missing", not expanded
        scan = fx.logs.scan(path)
        writer.join(10)
    finally:
        os.close(read_end)
    assert scan.problems == []
    assert scan.sources.iloc[0]["format"] == "short-iso"
    assert signature_counts(scan) == signature_counts(fx.logs.scan(control))


@pytest.mark.timeout(60)
def test_fifo_named_directly_is_read(tmp_path, short_iso_text):
    fifo = tmp_path / "decode.fifo"
    os.mkfifo(fifo)
    writer = _feed(fifo, gzip.compress(short_iso_text))
    scan = fx.logs.scan(fifo)
    writer.join(10)
    assert scan.problems == []
    assert scan.sources.iloc[0]["format"] == "short-iso"
    assert (scan.events["signature"] == "thread_death").sum() == 1


@pytest.mark.timeout(60)
def test_fifo_inside_a_directory_is_named_not_read_and_does_not_hang(tmp_path, short_iso_text):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "prefill.log").write_bytes(short_iso_text)
    os.mkfifo(logs / "shipper.fifo")  # nobody writes: reading it would block forever
    scan = fx.logs.scan(logs)
    assert (scan.events["signature"] == "thread_death").sum() == 1
    fifo_problems = [p for p in scan.problems if p.source == str(logs / "shipper.fifo")]
    assert len(fifo_problems) == 1 and "FIFO" in fifo_problems[0].message


@pytest.mark.timeout(60)
def test_stdin_pipe_in_process(monkeypatch, short_iso_text):
    read_end, write_end = os.pipe()
    writer = _feed(write_end, gzip.compress(short_iso_text))
    with os.fdopen(read_end, "rb") as pipe:
        monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=pipe))
        scan = fx.logs.scan("-")
        assert not pipe.closed  # the caller's standard input is not ours to close
    writer.join(10)
    assert list(scan.sources["source"]) == ["<stdin>"]
    assert scan.sources.iloc[0]["format"] == "short-iso"
    assert (scan.events["signature"] == "thread_death").sum() == 1


CHILD_SCAN = r"""
import json, sys
import forensics as fx
scan = fx.logs.scan(sys.argv[1:])
print(json.dumps({"sources": scan.sources["source"].tolist(), "formats": scan.sources["format"].tolist(),
                  "deaths": int((scan.events["signature"] == "thread_death").sum()),
                  "events": len(scan.events),
                  "problems": [[p.source, p.message, p.unreadable] for p in scan.problems]}))
"""


def _scan_in_child(args: list[str], stdin=subprocess.DEVNULL, timeout: float = 60, prefix=()) -> dict:
    done = subprocess.run([*prefix, sys.executable, "-c", CHILD_SCAN, *args], stdin=stdin, capture_output=True,
                          cwd=REPO, timeout=timeout)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
@pytest.mark.parametrize("packing", ["plain", "gzip"])
def test_standard_input_of_a_real_process(name, packing, short_iso_text):
    data = gzip.compress(short_iso_text) if packing == "gzip" else short_iso_text
    read_end, write_end = os.pipe()
    writer = _feed(write_end, data)
    try:
        result = _scan_in_child([name], stdin=read_end)
    finally:
        writer.join(10)
        os.close(read_end)
    assert result["problems"] == []
    assert result["sources"] == ["<stdin>" if name == "-" else name]
    assert result["formats"] == ["short-iso"] and result["deaths"] == 1


@needs_journal_tools
@pytest.mark.timeout(120)
def test_journalctl_piped_into_stdin(binary_journal):
    """``journalctl --file x -o json | forensics logs -``: the pipeline as an operator types it."""
    journalctl = subprocess.Popen([shutil.which("journalctl"), "--file", str(binary_journal), "-o", "json",
                                   "--no-pager"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        result = _scan_in_child(["-"], stdin=journalctl.stdout)
    finally:
        journalctl.stdout.close()
        journalctl.wait(10)
    assert journalctl.returncode == 0
    assert result["formats"] == ["json"] and result["deaths"] == 1 and result["problems"] == []


@pytest.mark.timeout(60)
def test_binary_journal_through_a_pipe_is_a_named_problem(tmp_path):
    read_end, write_end = os.pipe()
    writer = _feed(write_end, JOURNAL_MAGIC + b"\0" * 1000)
    try:
        scan = fx.logs.scan(f"/dev/fd/{read_end}")
    finally:
        writer.join(10)
        os.close(read_end)
    assert len(scan.problems) == 1
    assert "binary journal" in scan.problems[0].message and scan.problems[0].unreadable


# ------------------------------------------------------------------ 4. gzip in bounded memory


BOMB_LINE = (b"[2025-07-01 12:00:00 TP0] Decode batch, #running-req: 1, #token: 9, token usage: 0.00, "
             b"gen throughput (token/s): 1.00, #queue-req: 0\n")
BOMB_BLOCK = BOMB_LINE * ((8 << 20) // len(BOMB_LINE))
# 1 GiB of text in one gzip member of about 4 MB (~260:1). The old reader held all that one
# 1 MB compressed read gave (~260 MB) plus a copy of it: 576 MB. 2 GiB tests nothing more
# and doubles the time (~12 s on two busy cores).
BOMB_BLOCKS = 128

CHILD_READ = r"""
import json, resource, sys, zlib
from pathlib import Path
from forensics.logs.sources import LogSource, open_stream, read_chunks
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
source, problems = LogSource(Path(sys.argv[1])), []
size = lines = crc = 0
stream = open_stream(source)
try:
    for chunk in read_chunks(stream, source, problems):
        size += len(chunk.data)
        lines += chunk.data.count(b"\n")
        crc = zlib.crc32(chunk.data, crc)
finally:
    stream.close()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"baseline_kb": baseline, "peak_kb": peak, "size": size, "lines": lines, "crc": crc,
                  "problems": [str(p) for p in problems]}))
"""


def write_gzip_bomb(path: Path) -> tuple[int, int]:
    """One gzip member of BOMB_BLOCKS x BOMB_BLOCK, made by streaming compression.

    After a full flush deflate starts afresh, so every block after the first compresses to
    the same bytes: those are compressed once and written BOMB_BLOCKS - 1 times, and the
    trailer gets the CRC and size of the whole text. Returns (size, crc) of the text.
    """
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    first = compressor.compress(BOMB_BLOCK) + compressor.flush(zlib.Z_FULL_FLUSH)
    repeated = compressor.compress(BOMB_BLOCK) + compressor.flush(zlib.Z_FULL_FLUSH)
    assert compressor.compress(BOMB_BLOCK) + compressor.flush(zlib.Z_FULL_FLUSH) == repeated
    end = compressor.flush(zlib.Z_FINISH)[:-8]  # the final empty block, without this trailer
    crc = 0
    with open(path, "wb") as handle:
        handle.write(first)
        crc = zlib.crc32(BOMB_BLOCK, crc)
        for _ in range(BOMB_BLOCKS - 1):
            handle.write(repeated)
            crc = zlib.crc32(BOMB_BLOCK, crc)
        size = len(BOMB_BLOCK) * BOMB_BLOCKS
        handle.write(end + struct.pack("<II", crc, size & 0xFFFFFFFF))
    return size, crc


@pytest.mark.timeout(240)
def test_gzip_bomb_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "decode.log.gz"
    size, crc = write_gzip_bomb(path)
    assert path.stat().st_size < size // 200  # the ratio that made the old reader hold GBs
    done = subprocess.run([sys.executable, "-c", CHILD_READ, str(path)], capture_output=True, cwd=REPO,
                          timeout=220)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout)
    assert result["problems"] == []
    assert (result["size"], result["lines"], result["crc"]) == (size, size // len(BOMB_LINE), crc)
    grown_mb = (result["peak_kb"] - result["baseline_kb"]) / 1024
    assert grown_mb < 200, f"reading a {path.stat().st_size >> 20} MB gzip grew the reader by {grown_mb:.0f} MB"


def _log_like_text(seed: int, lines: int) -> bytes:
    rng = random.Random(seed)
    out = []
    for number in range(lines):
        room = rng.randrange(2**63)
        out.append(f"[2025-07-01 12:{number // 60 % 60:02d}:{number % 60:02d} TP{rng.randrange(8)}] "
                   f"Decode transfer failed for request rank=0 decode_req.req.rid='{rng.getrandbits(64):x}' "
                   f"decode_req.req.bootstrap_room={room} with exception KVTransferError"
                   f"(bootstrap_room={room}): {'x' * rng.randrange(300)}\n")
    return "".join(out).encode()


def _read_all(path: Path, sizes: list[int]) -> bytes:
    """Everything ``open_stream`` gives for ``path``, read in turns of ``sizes`` bytes."""
    stream = open_stream(LogSource(path))
    try:
        out, turn = [], 0
        while True:
            piece = stream.read(sizes[turn % len(sizes)])
            turn += 1
            if not piece:
                return b"".join(out)
            out.append(piece)
    finally:
        stream.close()


def _chunks(path: Path, problems: list, chunk_size: int = sources.CHUNK_SIZE) -> bytes:
    """Everything ``read_chunks`` yields for ``path``, problems appended to ``problems``."""
    stream = open_stream(LogSource(path))
    try:
        return b"".join(c.data for c in read_chunks(stream, LogSource(path), problems, chunk_size=chunk_size))
    finally:
        stream.close()


@pytest.mark.parametrize("compressed_read", [1, 7, 4096, 1 << 20])
def test_gzip_members_and_padding_decompress_to_exactly_the_original(tmp_path, monkeypatch, compressed_read):
    # Small compressed reads put member boundaries, headers and trailers across reads.
    monkeypatch.setattr(sources, "COMPRESSED_READ", compressed_read)
    parts = [_log_like_text(seed, 400) for seed in range(3)] + [b""]
    packed = b"".join(gzip.compress(part, compresslevel=level) for part, level in zip(parts, (1, 6, 9, 6)))
    path = tmp_path / "rotated.log.gz"
    path.write_bytes(packed + b"\0" * 1000)  # zero padding after the last member, as tape tools write
    original = b"".join(parts)
    for sizes in ([1 << 20], [1, 3, 1000], [len(original) + 5]):
        assert _read_all(path, sizes) == original
    problems = []
    assert _chunks(path, problems, chunk_size=4096) == original
    assert problems == []


@pytest.mark.parametrize("cut", [0.3, 0.9])
def test_gzip_cut_short_keeps_every_byte_before_the_cut(tmp_path, cut):
    original = _log_like_text(1, 3000)
    packed = gzip.compress(original)
    path = tmp_path / "cut.log.gz"
    path.write_bytes(packed[: int(len(packed) * cut)])
    problems = []
    kept = _chunks(path, problems)
    # Everything decompressed is kept (the last partial line gets its newline back).
    assert original.startswith(kept[:-1]) and len(kept) > len(original) * cut * 0.5
    assert len(problems) == 1 and "ends early" in problems[0].message and problems[0].source == str(path)


@pytest.mark.parametrize("damage", ["corrupt second member", "trailing garbage"])
def test_damage_after_good_data_keeps_the_good_data(tmp_path, damage):
    good = _log_like_text(2, 2000)
    second = bytearray(gzip.compress(_log_like_text(3, 2000)))
    if damage == "corrupt second member":
        second[len(second) // 2: len(second) // 2 + 64] = b"\xff" * 64
        tail = bytes(second)
    else:
        tail = b"this is not gzip at all\n" * 10
    path = tmp_path / "damaged.log.gz"
    path.write_bytes(gzip.compress(good) + tail)
    problems = []
    kept = _chunks(path, problems, chunk_size=1 << 16)
    assert kept.startswith(good)
    assert len(problems) == 1 and problems[0].source == str(path)


# ------------------------------------------------------------------ 5. journalctl as a child


@pytest.mark.timeout(60)
def test_chatty_journalctl_does_not_deadlock(tmp_path, monkeypatch, story):
    lines = tmp_path / "entries.json"
    lines.write_bytes(json_lines(story))
    # 1 MB of warnings first: sixteen times the stderr pipe buffer, before any output.
    fake_journalctl(tmp_path / "bin", monkeypatch,
                    f"head -c 1048576 /dev/zero | tr '\\0' 'w' >&2\necho 'last warning' >&2\nexec cat {lines}")
    journal = tmp_path / "pd.journal"
    journal.write_bytes(JOURNAL_MAGIC + b"\0" * 100)
    scan = fx.logs.scan(journal)
    assert scan.problems == []
    assert scan.sources.iloc[0]["format"] == "json"
    assert scan.sources.iloc[0]["lines"] == len(story.records)
    assert (scan.events["signature"] == "thread_death").sum() == 1


@pytest.mark.timeout(60)
def test_failing_journalctl_is_a_problem_with_the_end_of_its_stderr(tmp_path, monkeypatch, story):
    lines = tmp_path / "entries.json"
    lines.write_bytes(json_lines(story))
    fake_journalctl(tmp_path / "bin", monkeypatch,
                    f"cat {lines}\nhead -c 200000 /dev/zero | tr '\\0' 'w' >&2\n"
                    "echo >&2\necho 'Failed to open files: Bad message' >&2\nexit 1")
    journal = tmp_path / "pd.journal"
    journal.write_bytes(JOURNAL_MAGIC)
    scan = fx.logs.scan(journal)
    assert (scan.events["signature"] == "thread_death").sum() == 1  # what came before the failure is kept
    assert len(scan.problems) == 1
    problem = scan.problems[0]
    assert problem.source == str(journal) and problem.line is None
    assert "status 1" in problem.message and "Failed to open files: Bad message" in problem.message
    assert len(problem.message) < 2000


@pytest.mark.timeout(60)
def test_closing_early_kills_and_reaps_journalctl(tmp_path, monkeypatch):
    fake_journalctl(tmp_path / "bin", monkeypatch, """exec yes '{"MESSAGE": "endless"}'""")
    journal = tmp_path / "pd.journal"
    journal.write_bytes(JOURNAL_MAGIC)
    stream = open_stream(LogSource(journal))
    pid = stream.proc.pid
    assert stream.read(1 << 16).startswith(b'{"MESSAGE"')
    stream.close()
    stream.close()  # twice is harmless
    assert stream.proc.returncode is not None
    assert pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    assert not stream.drain.is_alive()


def test_missing_journalctl_is_an_environment_problem_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    journal = tmp_path / "pd.journal"
    journal.write_bytes(JOURNAL_MAGIC)
    with pytest.raises(SourceError) as caught:
        open_stream(as_sources([journal])[0])
    assert isinstance(caught.value, EnvironmentProblem) and caught.value.exit_status == ExitStatus.ENVIRONMENT
    assert caught.value.path == str(journal) and "journalctl" in str(caught.value)
    scan = fx.logs.scan(journal)
    assert [(p.source, p.unreadable) for p in scan.problems] == [(str(journal), True)]


# ------------------------------------------------------------------ 6. problems name the path


def test_every_unreadable_input_is_a_problem_naming_it(tmp_path):
    missing = tmp_path / "missing.log"
    empty_dir = tmp_path / "empty-dir"
    empty_dir.mkdir()
    hollow = tmp_path / "hollow"
    (hollow / "a" / "b").mkdir(parents=True)
    dangling = tmp_path / "logs" / "current.log"
    dangling.parent.mkdir()
    dangling.symlink_to(tmp_path / "rotated-away.log")
    empty_file = tmp_path / "empty.log"
    empty_file.write_bytes(b"")
    scan = fx.logs.scan([missing, empty_dir, hollow, tmp_path / "logs", empty_file, LogSource("-", kind="journal")])
    named = {p.source: (p.unreadable, p.message) for p in scan.problems}
    assert len(named) == len(scan.problems) == 6
    assert named[str(missing)] == (True, "no such file")
    assert named[str(empty_dir)] == (True, "no files in this directory")
    assert named[str(hollow)] == (True, "no files in this directory or below it")
    assert named["<stdin>"][0] and "not standard input" in named["<stdin>"][1]
    assert named[str(dangling)] == (True, "no such file")
    assert named[str(empty_file)] == (False, "empty: no lines to read")
    assert len(scan.events) == 0


# Root reads any file whatever its mode; without these two capabilities it is refused like anyone.
AS_ROOT_WITHOUT_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                       "--inh-caps=-dac_override,-dac_read_search", "--"]


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
def test_unreadable_file_and_directories_are_named(tmp_path):
    secret = tmp_path / "secret.log"
    secret.write_text("x\n")
    secret.chmod(0)
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(stat.S_IWUSR)
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    (logs / "a.log").write_bytes(b"")
    (logs / "sub").chmod(0)
    try:
        result = _scan_in_child([str(secret), str(closed), str(logs)],
                                prefix=AS_ROOT_WITHOUT_DAC if os.geteuid() == 0 else ())
    finally:
        closed.chmod(0o755)
        (logs / "sub").chmod(0o755)
    named = {source: message for source, message, unreadable in result["problems"] if unreadable}
    assert named == {str(secret): "cannot open (Permission denied)",
                     str(closed): "cannot list this directory (Permission denied)",
                     str(logs / "sub"): "cannot list this directory (Permission denied)"}
