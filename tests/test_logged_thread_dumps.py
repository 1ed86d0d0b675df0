"""Thread dumps inside a log are read by the log scan itself (``LogScan.thread_dumps``).

sglang's watchdog and crash handler print py-spy's text into the scheduler's log, and a fatal
signal makes faulthandler print every thread's stack there. A log scan keeps each dump as it
passes (one read of the log, whatever its size or where its chunks end), so that collect and
diagnose can use a dump a deployment wrote itself when py-spy cannot be run now. The material is
real (tests/data/real-engine-0.5.13/threads/README.md).
"""

from __future__ import annotations

import functools
import importlib
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from forensics.logs import scan
from forensics.logs import sources as log_sources
from forensics.threads import read_dump_file

timeline = importlib.import_module("forensics.logs.timeline")  # the package names a function so
DATA = Path(__file__).parent / "data" / "real-engine-0.5.13" / "threads"
WATCHDOG_LOG = DATA / "prefill-watchdog-pyspy.log"


def _shape(dumps) -> list[tuple]:
    return [(d.line, d.format, d.pid, d.logged_at, list(d.frame["thread_name"]), list(d.frame["frames"]),
             d.problems, d.truncated) for d in dumps]


@pytest.mark.parametrize("name", ["prefill-watchdog-pyspy.log", "prefill-sigabrt-faulthandler.log",
                                  "decode-sigabrt-faulthandler.log"])
def test_the_scan_reads_each_dump_as_the_dump_reader_reads_the_file(name):
    read = scan([DATA / name], role="prefill").thread_dumps()
    assert read and _shape(read) == _shape(read_dump_file(DATA / name))
    assert {d.source for d in read} == {str(DATA / name)}


@pytest.mark.parametrize("chunk_size", [4096, 9000, 65536])
def test_a_dump_that_crosses_a_chunk_boundary_is_read_whole(monkeypatch, chunk_size):
    # 8 MiB chunks in production: a log of hundreds of MiB has dumps cut by them somewhere.
    assert WATCHDOG_LOG.stat().st_size > chunk_size
    monkeypatch.setattr(timeline, "read_chunks",
                        functools.partial(log_sources.read_chunks, chunk_size=chunk_size))
    read = scan([WATCHDOG_LOG], role="prefill")
    assert read.lines_unknown == 42  # as in one chunk: the watchdog's own "Scheduler debug info" text
    assert _shape(read.thread_dumps()) == _shape(read_dump_file(WATCHDOG_LOG))


def test_the_window_keeps_the_dumps_logged_in_it():
    since = pd.Timestamp("2026-12-03 12:43:20", tz="UTC")
    dumps = scan([WATCHDOG_LOG], role="prefill", since=since).thread_dumps()
    assert [d.logged_at for d in dumps] == [datetime(2026, 12, 3, 12, 43, s, tzinfo=UTC) for s in (28, 41)]


def test_a_log_in_another_zone_gives_the_dump_its_utc_time():
    (first, *_) = scan([WATCHDOG_LOG], role="prefill", tz="Europe/Berlin").thread_dumps()
    assert first.logged_at == datetime(2026, 12, 3, 11, 43, 11, tzinfo=UTC)
    assert set(first.frame["taken_at"]) == {pd.Timestamp("2026-12-03 11:43:11", tz="UTC")}


def test_a_damaged_dump_in_a_log_keeps_its_threads_and_names_its_bad_lines(tmp_path):
    lines = WATCHDOG_LOG.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Thread ")) + 3
    garbage = ["@@@@ binary-ish \ufffd\ufffd 0x00", "    )))((( not a frame"]
    path = tmp_path / "prefill (copy).log"
    path.write_text("\n".join(lines[:start] + garbage + lines[start:]) + "\n")
    from_scan = scan([path], role="prefill").thread_dumps()
    assert _shape(from_scan) == _shape(read_dump_file(path))
    assert from_scan[0].damaged and len(from_scan[0].problems) == 2
    assert all(f"{path}:" in problem for problem in from_scan[0].problems)
    assert [d.thread_count() for d in from_scan] == [8, 8, 7]


def test_locals_in_a_logged_dump_are_redacted(tmp_path):
    path = tmp_path / "decode.log"
    path.write_text(
        "[2026-12-03 12:43:11] Pyspy dump for PID 77 (py-spy dump --pid 77):\n"
        "Process 77: sglang::scheduler_DP0_TP0\n"
        "Python v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 77 (idle): "MainThread"\n'
        "    event_loop_normal_disagg_decode (sglang/srt/disaggregation/decode.py:880)\n"
        "        Arguments:\n"
        "            api_key = 'sk-live-0123456789abcdef'\n"
        "[2026-12-03 12:43:12] next line\n")
    (dump,) = scan([path], role="decode").thread_dumps()
    assert dump.pid == 77 and list(dump.frame["thread_name"]) == ["MainThread"]
    excerpts = scan([path], role="decode").dump_excerpts
    assert "sk-live" not in repr(excerpts) and "<redacted>" in excerpts[0][2]


def test_a_real_log_with_no_dump_has_none():
    read = scan([DATA.parent / "prefill-validate-patched.log"], role="prefill")
    assert read.lines_total > 100 and read.thread_dumps() == [] and read.dump_excerpts == []


# --------------------------------------------------------------- collect and diagnose

def _collect_with_the_log(tmp_path: Path, log_text: str, pid_file: Path):
    from fake_engine_helpers import FakeEngine, local_inventory

    from forensics.collection.run import CollectOptions, collect

    log = tmp_path / "sglang-prefill.log"
    log.write_text(log_text)
    with FakeEngine({"version": "0.5.13", "disaggregation_mode": "prefill"}) as engine:
        inventory = local_inventory(tmp_path / "inventory.toml", engine, logs={"prefill": {"file": str(log)}},
                                    pid_files={"prefill": pid_file})
        options = CollectOptions(since="2000-01-01", pieces=("processes", "server_info", "logs"))
        return collect(inventory, options=options)


def test_a_dump_sglang_logged_for_the_running_prefill_is_thread_evidence_without_py_spy(tmp_path):
    # The real log, its scheduler's pid made a process running now and its days after that
    # process's start: the watchdog's third dump lacks bootstrap_thread, and no py-spy is run.
    from fake_engine_helpers import SleepingProcess

    import forensics as fx

    pid_file = tmp_path / "prefill.pid"
    engine_process = SleepingProcess([], dict(__import__("os").environ), pid_file)
    try:
        pid = engine_process.proc.pid
        day = (pd.Timestamp.now(tz="UTC") + pd.Timedelta(days=1)).strftime("%Y-%m-%d")
        text = WATCHDOG_LOG.read_text().replace("5528", str(pid)).replace("2026-12-03", day)
        evidence = _collect_with_the_log(tmp_path, text, pid_file)
    finally:
        engine_process.close()
    logged = evidence.frame("logged_threads")
    assert logged is not None and set(logged["of_process"]) == {"running"}, logged
    bootstrap = logged[logged["logical_name"] == "bootstrap"]
    assert list(bootstrap["status"]) == ["ok", "ok", "missing"]
    assert list(bootstrap["line"]) == [78, 279, 450] and set(bootstrap["pid"]) == {pid}
    assert evidence.frame("thread_check") is None  # no live dump was taken
    verdict = fx.diagnose(evidence)
    names = {s.name: s for s in verdict.signals}
    assert names["bootstrap_thread_missing_logged"].kind == "wedge"
    assert "sglang-prefill.log:450" in names["bootstrap_thread_missing_logged"].says
    # The watchdog logged these dumps because the forward hung, and then told the parent a child
    # failed: that is a crash first (DOWN); the dump is wedge evidence besides.
    assert verdict.verdict == "DOWN", verdict.reasons
    # Without the watchdog's own timeout and crash lines (a wedge, where no forward hangs), the
    # logged dump and the GUARD traceback are two independent sources: WEDGED, py-spy never run.
    from forensics.logs.findings import event_classes

    events = evidence.frame("events")
    evidence.frames["events"] = events[(event_classes(events) != "engine_crash").to_numpy()]
    verdict = fx.diagnose(evidence)
    assert verdict.verdict == "WEDGED", verdict.reasons
    assert any(step.startswith("logged thread dump:") and "sglang-prefill.log:450" in step
               for step in verdict.kill_chain), verdict.kill_chain


def test_a_dump_of_an_earlier_process_is_history_not_a_wedge(tmp_path):
    from fake_engine_helpers import SleepingProcess

    import forensics as fx

    pid_file = tmp_path / "prefill.pid"
    engine_process = SleepingProcess([], dict(__import__("os").environ), pid_file)
    try:
        evidence = _collect_with_the_log(tmp_path, WATCHDOG_LOG.read_text(), pid_file)  # pid 5528, days ago
    finally:
        engine_process.close()
    logged = evidence.frame("logged_threads")
    assert set(logged["of_process"]) == {"earlier"}
    signals = [s for s in fx.diagnose(evidence).signals if s.source == "threads"]
    assert [(s.name, s.kind) for s in signals] == [("old_logged_dump", "context")]
    assert "pid 5528 is not an engine process now" in signals[0].says
