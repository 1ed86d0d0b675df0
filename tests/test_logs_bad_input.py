"""Bad input never crashes the log reader; every problem names the file and line."""

from __future__ import annotations

import gzip

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import forensics as fx
from forensics.logs import incident as gen

PREFILL_LINE = ("[2025-07-01 12:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, "
                "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, #bootstrap-req: 57, "
                "#inflight-req: 0, cuda graph: False, input throughput (token/s): 0.05")
ROOM = 7461092837465012345  # a real 63-bit room; float64 would make it ...224
ABORT_LINE = ("[2025-07-01 12:00:01 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r1' "
              f"decode_req.req.bootstrap_room={ROOM} with exception KVTransferError(bootstrap_room={ROOM}): "
              "Aborted by AbortReq.")
DEATH = gen.thread_death_lines("0.5.15")


def test_invalid_utf8_nul_and_junk_are_counted_not_fatal(tmp_path):
    path = tmp_path / "mixed.log"
    path.write_bytes(
        PREFILL_LINE.encode() + b"\n"
        + b"\xff\xfe garbage \x00\x00 bytes\n"
        + ABORT_LINE.encode().replace(b"rid='r1'", b"rid='r\xe91'") + b"\n"
        + bytes(b for b in range(256) if b != 10) + b"\n"
    )
    scan = fx.logs.scan(path)
    row = scan.events[scan.events["signature"] == "decode_transfer_aborted"].iloc[0]
    assert row["room"] == ROOM and row["line"] == 3
    assert len(scan.batches) == 1
    assert scan.lines_unknown == 2
    assert [number for number, _ in scan.unknown_samples[str(path)]] == [2, 4]
    assert any(p.line == 2 and str(path) in str(p) for p in scan.problems)


def test_crlf_line_endings(tmp_path):
    path = tmp_path / "windows.log"
    path.write_bytes(("\r\n".join([PREFILL_LINE, ABORT_LINE, *DEATH]) + "\r\n").encode())
    scan = fx.logs.scan(path)
    assert scan.batches.iloc[0]["input_throughput"] == 0.05
    aborted = scan.events[scan.events["signature"] == "decode_transfer_aborted"]
    assert aborted["room"].tolist() == [ROOM]
    death = scan.events[scan.events["signature"] == "thread_death"].iloc[0]
    assert death["message"] == "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?"
    assert death["thread"] == "Thread-5 (bootstrap_thread)"


def test_truncated_last_line_is_still_read(tmp_path):
    path = tmp_path / "cut.log"
    path.write_text(PREFILL_LINE + "\n" + ABORT_LINE[:120])  # cut mid-line, no newline
    scan = fx.logs.scan(path)
    assert len(scan.batches) == 1
    assert scan.sources.iloc[0]["lines"] == 2


def test_twenty_megabyte_line_is_cut_and_reported(tmp_path):
    path = tmp_path / "huge.log"
    with open(path, "wb") as handle:
        handle.write(PREFILL_LINE.encode() + b"\n")
        handle.write(b"[2025-07-01 12:00:00] " + b"x" * (20 << 20) + b"\n")
        handle.write(ABORT_LINE.encode() + b"\n")
    scan = fx.logs.scan(path)
    row = scan.events[scan.events["signature"] == "decode_transfer_aborted"].iloc[0]
    assert row["line"] == 3
    assert row["offset"] == len(PREFILL_LINE) + 1 + 22 + (20 << 20) + 1
    assert any(p.line == 2 and "longer than" in p.message for p in scan.problems)


def test_interleaved_tracebacks_from_two_threads(tmp_path):
    first = gen.thread_death_lines("0.5.15", thread_number=5)
    second = [line.replace("Thread-5 (bootstrap_thread)", "Thread-9 (transfer_worker)")
              .replace("AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?",
                       "KeyError: 1234")
              .replace("in bootstrap_thread", "in transfer_worker") for line in first]
    mixed = [PREFILL_LINE]
    for a, b in zip(first, second):
        mixed += [a, b]
    mixed.append(ABORT_LINE)
    path = tmp_path / "stderr.log"
    path.write_text("\n".join(mixed) + "\n")
    scan = fx.logs.scan(path)
    deaths = scan.events[scan.events["signature"] == "thread_death"].sort_values("line")
    assert list(deaths["thread"]) == ["Thread-5 (bootstrap_thread)", "Thread-9 (transfer_worker)"]
    assert list(deaths["message"]) == [
        "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?", "KeyError: 1234"]
    assert list(deaths["frame_function"]) == ["bootstrap_thread", "transfer_worker"]
    assert scan.lines_unknown == 0


def test_chained_traceback_keeps_the_last_exception(tmp_path):
    lines = [PREFILL_LINE, "Exception in thread Thread-2 (bootstrap_thread):", "Traceback (most recent call last):",
             '  File "x.py", line 1, in bootstrap_thread', "    raise KeyError(1)", "KeyError: 1", "",
             "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", '  File "x.py", line 3, in bootstrap_thread',
             "    assert False", "AssertionError", ABORT_LINE]
    path = tmp_path / "chain.log"
    path.write_text("\n".join(lines) + "\n")
    death = fx.logs.timeline(path).query("signature == 'thread_death'").iloc[0]
    assert death["message"] == "AssertionError"


def test_unknown_format_is_reported_not_guessed(tmp_path):
    path = tmp_path / "nginx.log"
    path.write_text('10.0.0.1 - - [01/Jul/2025:12:00:00 +0000] "GET / HTTP/1.1" 200 612 "-" "curl"\n' * 5)
    scan = fx.logs.scan(path)
    assert scan.lines_unknown == 5
    assert len(scan.events) == 0
    assert any("no known format" in p.message and p.line == 1 for p in scan.problems)


def test_empty_and_missing_files_are_problems(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    good = tmp_path / "good.log"
    good.write_text(ABORT_LINE + "\n")
    scan = fx.logs.scan([empty, tmp_path / "missing.log", good])
    messages = [str(p) for p in scan.problems]
    assert any(str(empty) in m and "empty" in m for m in messages)
    assert any("missing.log" in m and "no such file" in m for m in messages)
    # What was readable is kept.
    assert scan.events["room"].iloc[0] == ROOM


def test_gzip_that_ends_early_keeps_what_was_read(tmp_path):
    body = ("\n".join([ABORT_LINE] + [PREFILL_LINE] * 20000) + "\n").encode()
    packed = gzip.compress(body)
    path = tmp_path / "cut.log.gz"
    path.write_bytes(packed[: len(packed) // 2])
    scan = fx.logs.scan(path)
    assert scan.events["room"].iloc[0] == ROOM
    assert 0 < len(scan.batches) < 20000
    assert any(str(path) in str(p) and "ends early" in p.message for p in scan.problems)


def test_directory_of_plain_and_gzip_files(tmp_path):
    incident = gen.generate("0.5.15", steady_seconds=10, after_seconds=20)
    paths = gen.write_sglang_logs(incident, tmp_path / "logs")
    with open(paths["decode"], "rb") as src, gzip.open(tmp_path / "logs" / "decode.log.1.gz", "wb") as dst:
        dst.write(src.read())
    scan = fx.logs.scan(tmp_path / "logs")
    assert len(scan.sources) == 3
    assert (scan.events["signature"] == "decode_transfer_aborted").sum() == 2
    assert set(scan.sources["role"]) == {"prefill", "decode"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=4000))
@example(b"\x1f\x8b")  # gzip magic alone: once found by hypothesis in a full run
def test_random_bytes_never_crash(tmp_path, data):
    path = tmp_path / "random.bin"
    path.write_bytes(data)
    scan = fx.logs.scan(path)
    if data.startswith(b"LPKSHHRH"):
        # A binary journal's magic: the file goes to journalctl, whose complaint is a named problem.
        assert any(str(path) in str(p) for p in scan.problems)
        return
    if data.startswith(b"\x1f\x8b") and scan.problems:
        # gzip's magic: read as gzip; random bytes after it are a corrupt member, a problem naming the file.
        assert any(str(path) in str(p) and "corrupt" in str(p) for p in scan.problems)
        return
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    assert int(scan.sources["lines"].sum()) == lines
    assert scan.lines_unknown <= lines


REAL_LINES = [PREFILL_LINE, ABORT_LINE, *DEATH,
              'INFO:     127.0.0.1:5555 - "GET /health HTTP/1.1" 200 OK',
              f"[2025-07-01 12:00:02 TP0] Sent abort notification for room {ROOM} to 10.0.0.2:41000"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(REAL_LINES), st.integers(0, 300), st.binary(max_size=5)),
                min_size=1, max_size=30))
def test_mutated_real_lines_never_crash(tmp_path, mutations):
    lines = []
    for line, cut, junk in mutations:
        raw = line.encode()
        position = min(cut, len(raw))
        lines.append(raw[:position] + junk + raw[position:])
    path = tmp_path / "mutated.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    scan = fx.logs.scan(path)
    total = int(scan.sources["lines"].sum())
    assert total == len(lines) + sum(chunk.count(b"\n") for _, _, chunk in mutations)
    assert scan.events["line"].notna().all() and scan.events["line"].between(1, total).all()
