"""The compiled scanner path (forensics/logs/_fastscan.c) gives the same frames as the Python path.

Every test scans the same input twice, once with ``_fastscan`` and once with it switched
off, and compares the batch, access, event and source frames. Lines the C path does not
read canonically are declined and read by the Python path, so any difference is a bug.
"""

from __future__ import annotations

import gzip
import os
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import forensics as fx
from forensics.logs import incident as gen
from forensics.logs import scanner
from tests.test_logs_batchlines import CASES

# The extension is optional for users without a compiler, but ./run builds it: a failed build must
# fail here, not skip the file. PD_FORENSICS_NO_FASTSCAN=1 states on purpose that it is absent.
if os.environ.get("PD_FORENSICS_NO_FASTSCAN") == "1":
    fastscan = pytest.importorskip("forensics.logs._fastscan", reason="PD_FORENSICS_NO_FASTSCAN=1")
else:
    from forensics.logs import _fastscan as fastscan

JOURNAL = "2025-07-01T12:00:{second:02d}+00:00 pd-node-1 sglang-{role}[41{pid}]: "


def _comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by every column: the paths may emit rows of equal time in another order."""
    frame = frame.copy()
    for name in frame.columns:
        if isinstance(frame[name].dtype, pd.CategoricalDtype):
            frame[name] = frame[name].astype(object)
        elif isinstance(frame[name].dtype, pd.SparseDtype):
            frame[name] = frame[name].sparse.to_dense()
    return frame.sort_values(list(frame.columns), kind="stable", na_position="last").reset_index(drop=True)


def _scan(path, fast: bool, **options):
    saved = scanner._fastscan
    if not fast:
        scanner._fastscan = None
    try:
        return fx.logs.scan(path, **options)
    finally:
        scanner._fastscan = saved


def assert_same(path, **options):
    fast = _scan(path, True, **options)
    slow = _scan(path, False, **options)
    pd.testing.assert_frame_equal(_comparable(fast.batches), _comparable(slow.batches))
    pd.testing.assert_frame_equal(fast.access, slow.access)
    pd.testing.assert_frame_equal(fast.events, slow.events)
    pd.testing.assert_frame_equal(fast.sources, slow.sources)
    assert [str(p) for p in fast.problems] == [str(p) for p in slow.problems]
    return fast


def _journal(lines: list[str], role: str = "prefill") -> str:
    return "".join(JOURNAL.format(second=i % 60, role=role, pid=i % 10) + line + "\n" for i, line in enumerate(lines))


# ---------------------------------------------------------------- the C surface itself
def test_batch_lines_returns_parsed_columns():
    data = (b"2025-07-01T12:00:01.5+02:00 node-a sglang-prefill[4101]: [2025-07-01 10:00:01 DP1 PP2 TP3] "
            b"Prefill batch [17], #new-seq: 2, token usage: 0.21, cuda graph: True, fwd occupancy: 45.50%\r\n"
            b"2025-07-01T12:00:02Z node-b sglang-decode: Decode batch. #running-req: 7, #token: 41335\n"
            b"2025-07-01T12:00:03Z node-b sglang-decode: Decode batch. #running-req: x7, #token: 1\n")
    layouts, origins = {}, {}
    (starts, layout, times, dp, tp, pp, iters, value_starts, values, kinds, origin,
     declined) = fastscan.batch_lines(data, 1, layouts, origins)
    assert np.frombuffer(starts, np.int64).tolist() == [0, data.index(b"2025-07-01T12:00:02Z")]
    assert np.frombuffer(declined, np.int64).tolist() == [data.index(b"2025-07-01T12:00:03Z")]
    assert list(layouts) == [b"P#new-seq\0token usage\0cuda graph\0fwd occupancy\0", b"D#running-req\0#token\0"]
    assert list(origins) == [b"node-a\0sglang-prefill", b"node-b\0sglang-decode"]
    assert np.frombuffer(layout, np.int32).tolist() == [0, 1]
    stamps = np.frombuffer(times, np.int64).view("datetime64[ns]")
    assert stamps.tolist() == [np.datetime64("2025-07-01T10:00:01.5", "ns").item(),
                               np.datetime64("2025-07-01T12:00:02", "ns").item()]
    assert np.frombuffer(dp, np.int32).tolist() == [1, -1]
    assert np.frombuffer(tp, np.int32).tolist() == [3, -1]
    assert np.frombuffer(pp, np.int32).tolist() == [2, -1]
    assert np.frombuffer(iters, np.int64).tolist() == [17, -1]
    assert np.frombuffer(value_starts, np.int64).tolist() == [0, 4]
    assert np.frombuffer(values, np.float64).tolist() == [2.0, 0.21, 1.0, 45.5, 7.0, 41335.0]
    assert np.frombuffer(kinds, np.uint8).tolist() == [0, 0, 1, 0, 0, 0]
    assert np.frombuffer(origin, np.int32).tolist() == [0, 1]


def test_access_counts_adds_to_the_counter_in_first_seen_order():
    data = (b'2025-07-01T12:00:01+00:00 n1 sglang-decode[1]: INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
            b'2025-07-01T12:00:59.9Z n1 sglang-decode[1]: INFO:     127.0.0.1:2 - "POST /generate HTTP/1.1" 503 x\n'
            b'2025-07-01T12:00:30+00:00 n1 sglang-decode[1]: INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
            b'2025-07-01T12:00:31+00:00 n1 sglang-decode[1]: INFO: 1 - "GET /a HTTP/1.1" 200 "GET /b HTTP/1.1" 200\n')
    counts = {(b"2025-07-01T12:00", b"+00:00", b"n1", b"sglang-decode", b"GET", b"/health", b"200"): 5}
    counted, declined = fastscan.access_counts(data, counts)
    assert counted == 3
    assert np.frombuffer(declined, np.int64).tolist() == [data.rindex(b"2025-07-01T12:00:31")]
    assert list(counts.items()) == [
        ((b"2025-07-01T12:00", b"+00:00", b"n1", b"sglang-decode", b"GET", b"/health", b"200"), 7),
        ((b"2025-07-01T12:00", b"Z", b"n1", b"sglang-decode", b"POST", b"/generate", b"503"), 1),
    ]


def test_count_lines_counts_prefixed_lines_and_numbers_offsets():
    data = b"a\n2b\nc\n2d"
    assert fastscan.count_lines(data, b"2", [0, 2, 3, 5, 9]) == (3, 2, [0, 1, 1, 2, 3])
    assert fastscan.count_lines(b"", b"2", []) == (0, 0, [])
    with pytest.raises(ValueError, match="ascending"):
        fastscan.count_lines(data, b"2", [3, 1])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="fmt"):
        fastscan.batch_lines(b"", 7, {}, {})
    with pytest.raises(TypeError):
        fastscan.batch_lines("text", 1, {}, {})
    with pytest.raises(TypeError):
        fastscan.access_counts(b"", [])


# ------------------------------------------------------------- both paths, same frames
@pytest.mark.parametrize("release", ["0.5.1", "0.5.4", "0.5.11", "0.5.15", "0.5.23"])
def test_generated_incident_same_frames(tmp_path, release):
    incident = gen.generate(release, steady_seconds=20, after_seconds=20)
    for role, path in gen.write_sglang_logs(incident, tmp_path / "plain", millis=True).items():
        scan = assert_same(path)
        assert len(scan.batches) > 10, role
    for style in ("short-iso", "short-iso-precise", "short-precise", "json"):
        scan = assert_same(gen.write_journal_text(incident, tmp_path / f"{style}.log", style=style))
        assert len(scan.batches) > 20 and set(scan.batches["kind"]) == {"prefill", "decode"}
        assert scan.access["count"].sum() > 0


def test_every_release_format_same_frames(tmp_path):
    lines = [line for line, _ in CASES]
    plain = tmp_path / "server.log"
    plain.write_text("\n".join(lines * 3) + "\n")
    scan = assert_same(plain)
    assert len(scan.batches) == 3 * len(CASES)
    assert scan.batches["iter"].dropna().tolist() == [17, 17, 17]
    journal = tmp_path / "journal.log"
    journal.write_text(_journal(lines * 3))
    scan = assert_same(journal)
    assert len(scan.batches) == 3 * len(CASES)
    assert sorted(scan.batches["tp_rank"].dropna().unique().tolist()) == [0, 1, 3]


def test_local_time_zone_same_frames(tmp_path):
    incident = gen.generate("0.5.15", steady_seconds=10, after_seconds=10)
    paths = gen.write_sglang_logs(incident, tmp_path, tz="Europe/Berlin")
    scan = assert_same(paths["prefill"], tz="Europe/Berlin")
    # Written as 14:00 Berlin wall-clock time: read back as 12:00 UTC, not 14:00.
    first = scan.batches["ts"].min()
    assert pd.Timestamp("2025-07-01 12:00", tz="UTC") <= first < pd.Timestamp("2025-07-01 12:01", tz="UTC")


def test_crlf_junk_truncated_and_huge_lines_same_frames(tmp_path):
    good = CASES[1][0]
    lines = [_journal([good]).rstrip("\n") + "\r"]
    lines.append("\x00\xff garbage with a batch, #a: 1 and HTTP/1.1 in it")
    lines.append(_journal(["INFO:     127.0.0.1:9 - \"GET /health HTTP/1.1\" 200 OK"]).rstrip("\n") + "\r")
    lines.append(_journal(["Prefill batch, " + "x" * (20 << 20)]).rstrip("\n"))  # 20 MB line
    lines.append(_journal([good])[:-40])  # truncated last line, no newline
    path = tmp_path / "bad.log"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape"))
    scan = assert_same(path)
    # The truncated line ends in "cuda graph: ": still a row, without the fields cut off.
    assert len(scan.batches) == 2
    assert scan.batches["queue_req"].tolist() == [2, 2]
    assert scan.batches["input_throughput"].isna().tolist() == [False, True]
    assert scan.access["count"].sum() == 1
    gz = tmp_path / "bad.log.gz"
    gz.write_bytes(gzip.compress(path.read_bytes())[:-30])  # a gzip that ends early
    assert_same(gz)


def test_lines_the_c_path_declines_are_still_read(tmp_path):
    base = CASES[3][0]  # "[2025-07-01 12:00:00] Decode batch. #running-req: 3, ..."
    odd = [
        base.replace("#running-req: 3", "#running-req: 3.5e1"),  # exponent: Python reads it its own way
        base.replace("#queue-req: 0", "#queue-req: -1"),
        base.replace("#running-req: 3", "#running-req: True"),  # a boolean under a count
        base.replace("12:00:00]", "12:00:00.1234567891]"),  # finer than ns
        base.replace("2025-07-01", "2025-02-30"),  # no such day: NaT
        base.replace("token usage: 0.02", "token usage: 0.02 "),
    ]
    path = tmp_path / "odd.log"
    path.write_text("\n".join([base] * 3 + odd) + "\n")
    scan = assert_same(path)
    # Every line is a row (the bad date gives a NaT time), read as written: the exponent and the
    # boolean are not counts (NA), the sign is kept.
    assert len(scan.batches) == 3 + len(odd), len(scan.batches)
    running = scan.batches["running_req"]
    assert int((running == 3).sum()) == 3 + 4 and int(running.isna().sum()) == 2
    assert int((scan.batches["queue_req"] == -1).sum()) == 1


def test_odd_journal_origins_same_frames(tmp_path):
    line = CASES[3][0]
    path = tmp_path / "origins.log"
    path.write_bytes(
        b"2025-07-01T12:00:00+00:00 node\x00a sglang-decode[1]: " + line.encode() + b"\n"  # NUL in the host
        + b"2025-07-01T12:00:00+00:00 node-b sgl\x00ang-decode[1]: " + line.encode() + b"\n"
        + b"2025-07-01T12:00:00+00:00 node-c sglang-decode[x]: " + line.encode() + b"\n"  # no such pid
        + b"2025-07-01T12:00:00+0530 node-d sglang-decode: " + line.encode() + b"\n")
    scan = assert_same(path)
    assert sorted(scan.batches["host"].astype(str)) == ["node\x00a", "node-b", "node-d"]
    assert scan.batches["ts"].min() == pd.Timestamp("2025-07-01 06:30", tz="UTC")


def test_plain_line_without_sglang_prefix_has_no_time(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("Prefill batch. #new-seq: 2, #new-token: 512\n"
                    "[2025-07-01 12:00:00] Decode batch. #running-req: 3, #token: 4096\n")
    batches = assert_same(path).batches
    assert batches["kind"].tolist() == ["decode", "prefill"]
    assert batches["ts"].isna().tolist() == [False, True]
    assert batches["new_seq"].tolist()[1] == 2


def test_consumed_rare_lines_are_not_batch_rows(tmp_path):
    # A batch line that also holds a signature literal is taken by the slow path first.
    death = "Exception in thread Thread-5 (bootstrap_thread):"
    path = tmp_path / "mixed.log"
    path.write_text(_journal([CASES[0][0], death + " Prefill batch, #new-seq: 1", CASES[0][0]]))
    scan = assert_same(path)
    assert scan.batches["new_seq"].tolist() == [2, 2]


def test_fallback_without_the_extension(tmp_path, monkeypatch):
    monkeypatch.setattr(scanner, "_fastscan", None)
    path = tmp_path / "journal.log"
    path.write_text(_journal([CASES[2][0]]))
    batches = fx.logs.batch_stats(path)
    assert batches.iloc[0]["bootstrap_req"] == 57 and batches.iloc[0]["dp_rank"] == 1


# ------------------------------------------------------------------- mutated lines
_MUTABLE = st.sampled_from(list(b"0123456789.,:- []%TZ+abcxyz\r\x00\xff"))


def _label_spans(line: bytes) -> list[tuple[int, int]]:
    """Byte spans of the field labels: a digit put into a label is a known divergence (see below)."""
    spans = []
    header = re.search(rb"batch(?: \[\d+\])?[.,] ", line)  # the fields start right after it
    position = header.end() if header else 0
    while True:
        colon = line.find(b": ", position)
        if colon < 0:
            return spans
        spans.append((position, colon))
        comma = line.find(b", ", colon)
        if comma < 0:
            return spans
        position = comma + 2


@st.composite
def mutated_line(draw):
    line = _journal([draw(st.sampled_from(CASES))[0]]).rstrip("\n").encode()
    if draw(st.booleans()):
        line = line[line.index(b"[2025"):]  # plain sglang line
    for _ in range(draw(st.integers(1, 3))):
        labels = _label_spans(line)
        position = draw(st.integers(0, len(line)))
        if any(start <= position <= end for start, end in labels):
            continue  # mutations inside labels: see the note in test_mutated_batch_lines_agree
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        byte = bytes([draw(_MUTABLE)])
        if action == "insert":
            line = line[:position] + byte + line[position:]
        elif action == "delete":
            line = line[:position] + line[position + 1:]
        else:
            line = line[:position] + byte + line[position + 1:]
    return line


_MUTATED_DECODE = (  # a decode batch line of the C path's layout, its #transfer-req value mutated
    b"[2025-07-01 12:00:00 TP0]Decode batch, #running-req: 3, #token: 4096, token usage: 0.02, accept len: 2.50, "
    b"accept rate: 0.75, pre-allocated usage: 0.01, #prealloc-req: 4, #transfer-req: %s, #retracted-req: 1, "
    b"cuda graph: True, gen throughput (token/s): 95.31, #queue-req: 0, est. decode TFLOPS/s (per GPU): 3.50, "
    b"est. read BW (GB/s per GPU): 800.00, est. write BW (GB/s per GPU): 10.00")


@pytest.mark.thorough  # 100 fuzzed lines through both paths (20 s): CI; the fast lane runs the found ones below
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(mutated_line(), min_size=1, max_size=4))
@example(lines=[_MUTATED_DECODE % b".12"])  # found by hypothesis: the C path read ".12" as 0.12, the Python path NA
@example(lines=[_MUTATED_DECODE % b"1.2"])  # ... and "1.2" as the count 1
@example(lines=[_MUTATED_DECODE % b"1."])  # ... and "1." as the count 1
def test_mutated_batch_lines_agree(tmp_path, lines):
    assume(not read_as_a_good_line(lines))
    check_mutated_lines(tmp_path, lines)


@pytest.mark.parametrize("count", [b".12", b"1.2", b"1."])
def test_the_mutations_hypothesis_found_agree(tmp_path, count):
    lines = [_MUTATED_DECODE % count]
    assert not read_as_a_good_line(lines)
    check_mutated_lines(tmp_path, lines)


def _good_lines() -> list[bytes]:
    return [_journal([case[0]]).rstrip("\n").encode() for case in CASES] + [case[0].encode() for case in CASES]


def read_as_a_good_line(lines: list[bytes]) -> bool:
    """Whether one of ``lines`` is declined by the C path but has a good line's digit-free text.

    The Python path groups lines by their text with digits, dots and dashes deleted and reads a
    group with the layout of its first line. Such a line is read there with the good line's
    layout, while in the C path's hand-back it stands alone: not comparable.
    """
    good_keys = {line.translate(None, b"0123456789.-") for line in _good_lines()}
    for line in lines:
        declined = np.frombuffer(fastscan.batch_lines(line + b"\n", 1, {}, {})[-1], np.int64).size and \
            np.frombuffer(fastscan.batch_lines(line + b"\n", 0, {}, {})[-1], np.int64).size
        if declined and line.translate(None, b"0123456789.-") in good_keys:
            return True
    return False


def check_mutated_lines(tmp_path, lines: list[bytes]) -> None:
    """Both paths give the same frames, the C path reading a mutated line or declining it.

    Mutations inside field labels are left out: there the Python path groups lines by
    the line with its digits deleted and reads a line whose label gained a digit with
    the layout of its group, while the C path reads each line's own labels (a new column).
    """
    path = tmp_path / "mutated.log"
    path.write_bytes(b"\n".join(_good_lines() + lines) + b"\n")
    assert_same(path)
