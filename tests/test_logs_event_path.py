"""The bulk event path gives exactly what the line-by-line path gives.

Rare lines that carry sglang's prefix are taken apart and classified together, once per
chunk (``SourceScanner._prepare_rare`` with ``classify_bulk``); every other rare line and
every chunk the bulk path refuses takes ``_slow_line``, one line at a time. These tests
switch the bulk path off and compare: classifications with ``catalogue.classify``, and
whole scans (events, sources, problems) on incident logs in every format, an abort-storm
corpus and adversarial inputs.
"""

from __future__ import annotations

import os
import random
import shutil

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import forensics as fx
from benchmarks import journal_corpus
from forensics.logs import catalogue, classify_bulk, prefilter, scanner
from forensics.logs import incident as gen

JOURNAL = "2025-07-01T12:00:{second:02d}+00:00 pd-node-{node} sglang-{role}[41{pid}]: "
ROOM = 7461092837465012345


def _scan(paths, bulk: bool, **options):
    """Scan with the bulk path on (returns the scan and how many lines it prepared) or off."""
    saved = scanner.SourceScanner._prepare_rare
    prepared = []

    def counting(self, *args):
        items = saved(self, *args)
        prepared.append(sum(item is not None for item in items or ()))
        return items

    scanner.SourceScanner._prepare_rare = counting if bulk else (lambda self, *args: None)
    try:
        return fx.logs.scan(paths, **options), sum(prepared)
    finally:
        scanner.SourceScanner._prepare_rare = saved


def assert_same(paths, bulk_lines: int = 1, **options):
    """Both paths give the same frames; the bulk path took at least ``bulk_lines`` lines."""
    bulk, prepared = _scan(paths, True, **options)
    single, _ = _scan(paths, False, **options)
    assert prepared >= bulk_lines
    pd.testing.assert_frame_equal(bulk.events, single.events, check_exact=True)
    pd.testing.assert_frame_equal(bulk.sources, single.sources)
    assert [str(p) for p in bulk.problems] == [str(p) for p in single.problems]
    assert bulk.notes == single.notes
    return bulk


def _normal(matched):
    return None if matched is None else (matched[0].id, matched[1])


def _messages() -> list[str]:
    """Every message an incident of several releases writes, plus awkward ones."""
    messages = []
    for release in ("0.5.12", "0.5.15", "0.5.21", "0.5.23"):
        messages += [record.text for record in gen.generate(release, steady_seconds=20, after_seconds=330).records]
    messages += [
        "", " ", "Decode transfer failed", "Sent abort notification for room 12 to x disconnected",
        f"Decode transfer failed for request rank=0 decode_req.req.rid='a' decode_req.req.bootstrap_room={ROOM} "
        f"with exception KVTransferError(bootstrap_room={ROOM}): Request {ROOM} timed out after 300.4s in "
        "KVPoll.WaitingForInput",
        f"Decode transfer failed for request rank=0 decode_req.req.rid='a' decode_req.req.bootstrap_room={ROOM} "
        "with exception ConnectionError: lost prefill",
        f"Prefill bootstrap failed for request rank=3 req.rid='b' req.bootstrap_room={2**64 - 1} with exception "
        f"KVTransferError(bootstrap_room={2**64 - 1}): Request {2**64 - 1} timed out after 30.0s in KVPoll.Bootstrapping",
        "Abort transfer queue request. decode_req.req.rid='ab c' Client disconnected: gone",
        "Exception in thread Thread-5 (bootstrap_thread):",
        "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?",
        "naïve ünïcödé Sent abort notification for room 5 to 10.0.0.1:1 \ufffd",
        "Received abort notification for room 99, marked as Failed",
    ]
    for signature in catalogue.event_signatures():
        messages += [signature.literal, signature.literal * 2, "x" + signature.literal + "y"]
    return messages


def test_bulk_classifier_equals_catalogue_classify():
    messages = _messages()
    expected = [_normal(catalogue.classify(m)) for m in messages]
    assert [_normal(m) for m in classify_bulk.classify_many(messages)] == expected
    # Told which literals each line holds (a superset of those inside the message), the same.
    literals = [s.literal for s in catalogue.event_signatures()]
    held = [[lit for lit in literals if lit in m] + ["Foreign traffic?", "disconnected"] for m in messages]
    assert [_normal(m) for m in classify_bulk.classify_many(messages, held)] == expected
    assert sum(e is not None for e in expected) > 100


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.sampled_from(_messages()),
    st.builds(lambda a, b, c: a + b + c, st.text(max_size=8), st.sampled_from(_messages()), st.text(max_size=8)),
), max_size=30))
def test_bulk_classifier_equals_catalogue_classify_on_random_messages(messages):
    expected = [_normal(catalogue.classify(m)) for m in messages]
    assert [_normal(m) for m in classify_bulk.classify_many(messages)] == expected


def test_line_hits_name_the_literals_of_each_line():
    data = b"a Foreign traffic? b\nnothing\nSent abort notification disconnected\n\nForeign traffic?"
    literals = (b"Foreign traffic?", b"disconnected", b"Sent abort notification")
    engines = [prefilter.BYTES_FIND] + ([prefilter.HYPERSCAN] if prefilter.hyperscan is not None else [])
    for engine in engines:
        finder = prefilter.LiteralPrefilter(literals, engine=engine)
        hits = finder.line_hits(data)
        assert sorted(hits) == finder.line_starts(data)
        assert hits == {0: {0}, 29: {1, 2}, 67: {0}}


@pytest.mark.parametrize("release", ["0.5.15", "0.5.23"])
def test_incident_logs_in_every_format(tmp_path, release):
    incident = gen.generate(release, steady_seconds=30, after_seconds=400)
    files = gen.write_sglang_logs(incident, tmp_path / "plain")
    assert_same(list(files.values()))
    assert_same(list(files.values()), tz="Europe/Berlin")
    for style in ("short-iso", "short-precise"):
        path = gen.write_journal_text(incident, tmp_path / f"{style}.log", style=style)
        scan = assert_same(path, year=2025)
        rooms = scan.events.loc[scan.events["signature"] == "decode_transfer_timeout", "room"]
        assert len(rooms) > 20 and set(int(r) for r in rooms) <= set(incident.timeout_rooms)


def test_storm_corpus(tmp_path):
    path = tmp_path / "storm.log"
    manifest = journal_corpus.generate(path, 2 << 20, seed=5, incidents=2, event_share=0.03)
    scan = assert_same(path, bulk_lines=300)
    found = scan.events["signature"].value_counts().to_dict()
    assert found == dict(manifest.signatures)
    storm_lines = sum(manifest.kinds[kind] for kind, _ in journal_corpus.STORM_MIX)
    assert 0.028 < storm_lines / manifest.lines < 0.032
    rooms = scan.events["room"].dropna()
    assert rooms.dtype == "UInt64" and int(rooms.max()) > 2**62  # 63-bit rooms, exact
    text = path.read_text()
    for room in rooms.sample(50, random_state=1):
        assert f"bootstrap_room={int(room)}" in text or f"for room {int(room)} " in text


def _adversarial_lines(rng: random.Random) -> list[str]:
    timeout = ("Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' decode_req.req.bootstrap_room="
               "{room} with exception KVTransferError(bootstrap_room={room}): Request {room} timed out after 300.1s "
               "in KVPoll.WaitingForInput")
    lines = []
    for index in range(400):
        room = rng.getrandbits(63)
        prefix = JOURNAL.format(second=index % 60, node=rng.choice("ab"), role=rng.choice(["prefill", "decode"]),
                                pid=index % 10)
        sglang = f"[2025-07-01 12:00:{index % 60:02d}{rng.choice(['', ' DP1', ' TP3', ' DP0 PP1 TP2'])}] "
        kind = rng.randrange(12)
        if kind < 5:
            lines.append(prefix + sglang + timeout.format(rid=f"{rng.getrandbits(32):08x}", room=room))
        elif kind == 5:
            lines.append(prefix + sglang + f"Sent abort notification for room {room} to 10.0.0.1:1")
        elif kind == 6:  # an event sglang logged with its traceback (logger.exception)
            lines.append(prefix + sglang + f"Unexpected transfer worker error for room {room}")
            lines += [prefix + "Traceback (most recent call last):",
                      prefix + '  File "/x/conn.py", line 10, in worker', prefix + "    run()",
                      prefix + "RuntimeError: boom"]
        elif kind == 7:  # a thread death, its final line a signature
            lines += [prefix + line for line in gen.thread_death_lines("0.5.15", thread_number=index)]
        elif kind == 8:  # odd bytes inside a prefixed event line
            lines.append(prefix + sglang + f"Sent abort notification for room {room} to h\x00st-ü")
        elif kind == 9:  # an event line without sglang's prefix
            lines.append(prefix + f"Sent abort notification for room {room} to 10.0.0.1:2")
        elif kind == 10:  # out of the journal format, with sglang's prefix
            lines.append(sglang + f"Sent abort notification for room {room} to 10.0.0.1:3")
        else:
            lines.append(prefix + sglang + "Decode batch, #running-req: 1, #token: 10, token usage: 0.00")
    return lines


@pytest.mark.parametrize("seed", [1, 2])
def test_adversarial_journal(tmp_path, seed):
    path = tmp_path / "odd.log"
    path.write_bytes(("\n".join(_adversarial_lines(random.Random(seed))) + "\n").encode())
    scan = assert_same(path, bulk_lines=150)
    assert {"decode_transfer_timeout", "thread_death", "transfer_worker_error"} <= set(scan.events["signature"])
    logged = scan.events[scan.events["signature"] == "transfer_worker_error"]
    assert logged["raw"].str.contains("RuntimeError: boom").any()
    # Invalid UTF-8 is replaced alike; a carriage return sends the chunk down the exact path.
    path.write_bytes(path.read_bytes().replace(b"h\x00st", b"h\xff\xfest\xe2\x82", 5))
    assert_same(path, bulk_lines=150)
    path.write_bytes(path.read_bytes().replace(b"to 10.0.0.1:1\n", b"to 10.0.0.1:1\r\n", 3))
    assert_same(path, bulk_lines=0)


def test_many_small_chunks(tmp_path, monkeypatch):
    """Tracebacks and events that straddle chunk boundaries read the same."""
    import functools
    import importlib

    from forensics.logs import sources

    timeline = importlib.import_module("forensics.logs.timeline")
    path = tmp_path / "odd.log"
    path.write_bytes(("\n".join(_adversarial_lines(random.Random(3))) + "\n").encode())
    monkeypatch.setattr(timeline, "read_chunks", functools.partial(sources.read_chunks, chunk_size=4096))
    scan = assert_same(path, bulk_lines=0)
    assert scan.sources["lines"].iloc[0] == path.read_bytes().count(b"\n")


@pytest.mark.thorough  # the benchmark script end to end on both small corpora: CI
@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("grep") is None, reason="GNU grep not installed")
def test_throughput_benchmark_measures_both_corpora(tmp_path):
    """CI-sized: grep, scan() and the whole `forensics logs --json` on a steady and a storm corpus."""
    from benchmarks import logs_throughput

    affinity = os.sched_getaffinity(0)
    try:
        figures = logs_throughput.run(tmp_path / "steady.log", 1 << 20, rounds=1,
                                      storm=(tmp_path / "storm.log", 1 << 20))
    finally:
        os.sched_setaffinity(0, affinity)  # run() pins this process to one CPU
    storm = figures["corpora"]["storm"]
    # run() raises when grep's, scan()'s or the command's counts disagree with the manifest.
    assert storm["signature_lines"] > 100 and storm["event_share"] == 0.03
    assert int(storm["room_max"]) > 2**62
    for corpus in figures["corpora"].values():
        assert corpus["grep_wall"] > 0 and corpus["scan_ratio"] > 0 and corpus["cli_ratio"] > 0
        assert corpus["cli_exit"] == 1 and corpus["cli_status"] == "findings"
    section = logs_throughput.render(figures)
    assert "| storm, " in section and "| steady, " in section and "forensics logs --json" in section


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_real_0513_validate_logs_give_the_same_scan_on_both_paths(role):
    """Real 0.5.13 through a validate cycle: a traceback opened inside a prefixed message line,
    then storms of abort lines. The bulk path hands the opening line to the line-by-line path."""
    path = os.path.join(os.path.dirname(__file__), "data", "real-engine-0.5.13", f"{role}-validate-patched.log")
    scan = assert_same([path], bulk_lines=8, role=role)
    assert int(scan.sources["lines_unknown"].sum()) == 0, scan.unknown_samples
    assert "python_traceback" in set(scan.events["signature"])
