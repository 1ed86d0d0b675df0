"""Error lines the catalogue does not name by their message are never silent, and a log holding one
is never clean.

The case that opened this: a decode log whose scheduler died (sglang's "It usually means the child
failed", a traceback, sglang's own py-spy dump) and whose Mooncake transfer engine had logged glog
``E`` lines read as clean, exit 0. The sglang lines here are the messages of sglang 0.5.15's own
calls (``entrypoints/engine.py``, ``managers/tokenizer_manager.py``,
``utils/cudacore_pyspy_dump_utils.py``, ``disaggregation/mooncake/conn.py``,
``disaggregation/common/conn.py``; ``tests/test_logs_catalogue_sources.py`` renders them for every
release); the glog lines are in glog's format as Mooncake's ``transfer_engine`` writes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from forensics.logs import catalogue
from forensics.logs.prefilter import BYTES_FIND, HYPERSCAN, LiteralPrefilter, hyperscan
from forensics.logs.timeline import scan

BATCH = ("[2026-12-01 18:22:50] Decode batch, #running-req: 1, #token: 120, token usage: 0.00, "
         "gen throughput (token/s): 11.20, #queue-req: 0,")
GLOG = [f"E1201 18:22:51.{i:06d} 3561 rdma_transport.cpp:{400 + i}] Failed to post send work request, errno 110"
        for i in range(8)]


def logs_json(path) -> dict:
    done = subprocess.run([sys.executable, "-m", "forensics", "logs", str(path), "--json"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    document = json.loads(done.stdout)
    assert done.returncode == document["exit"], done.stderr
    return document


def write(tmp_path, name: str, lines: list[str]):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_crash_log_that_read_clean_is_a_finding_with_each_error_line_its_own_event(tmp_path):
    path = write(tmp_path, "decode-0.log", [
        BATCH, *GLOG,
        "[2026-12-01 18:22:52] Received sigquit from a child process. It usually means the child failed.",
        "[2026-12-01 18:22:53] Pyspy dump for PID 4242 (sglang::scheduler):",
        'Thread 4242 (idle): "MainThread"',
        "    event_loop_normal_disagg_decode (sglang/srt/managers/scheduler.py:1033)",
    ])
    document = logs_json(path)
    assert document["status"] != "clean" and document["exit"] == 1, document["verdict"]
    glog = [e for e in document["events"] if e["signature"] == "glog_error"]
    assert [e["line"] for e in glog] == list(range(2, 10))  # eight consecutive E lines, eight events
    assert glog[0]["message"].startswith("E1201 18:22:51.000000") and glog[0]["severity"] == "error"
    by_signature = {e["signature"]: e for e in document["events"]}
    assert by_signature["child_failed"]["line"] == 10 and by_signature["child_failed"]["severity"] == "critical"
    assert by_signature["pyspy_dump_logged"]["line"] == 11
    classes = {f["class"] for f in document["verdict"]["findings"]}
    assert {"engine_crash", "errors_logged"} <= classes


def test_the_tokenizer_managers_sigquit_line_is_a_child_failure(tmp_path):
    path = write(tmp_path, "prefill.log", [
        BATCH.replace("Decode", "Prefill"),
        "[2026-12-01 18:22:52] SIGQUIT received. signum=3, frame=<frame at 0x7f3c, file '/x.py', line 1, "
        "code run>. It usually means one child failed.",
    ])
    document = logs_json(path)
    assert [e["signature"] for e in document["events"]] == ["child_failed"] and document["exit"] == 1


def test_a_traceback_no_catalogued_line_owns_is_an_event(tmp_path):
    path = write(tmp_path, "decode.log", [
        BATCH,
        "[2026-12-01 18:22:51] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16",
        "",
        "",
        "",
        "Traceback (most recent call last):",
        '  File "/opt/sglang/srt/managers/scheduler.py", line 3021, in run_scheduler_process',
        "    scheduler.event_loop_normal_disagg_decode()",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        BATCH.replace("18:22:50", "18:22:55"),
    ])
    document = logs_json(path)
    [event] = [e for e in document["events"] if e["signature"] == "python_traceback"]
    assert event["line"] == 6 and "illegal memory access" in event["message"], event
    assert document["status"] != "clean" and document["exit"] == 1


def test_a_traceback_after_a_catalogued_line_stays_part_of_that_event(tmp_path):
    path = write(tmp_path, "decode.log", [
        BATCH,
        "[2026-12-01 18:22:52] Received sigquit from a child process. It usually means the child failed.",
        "Traceback (most recent call last):",
        '  File "/opt/sglang/srt/entrypoints/engine.py", line 1328, in launch_phase_sigquit_handler',
        "KeyboardInterrupt",
    ])
    events = logs_json(path)["events"]
    assert [e["signature"] for e in events] == ["child_failed"]


def test_uvicorn_errors_are_events_and_the_asgi_traceback_keeps_its_own_name(tmp_path):
    path = write(tmp_path, "prefill.log", [
        BATCH.replace("Decode", "Prefill"),
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
        "ERROR:    Exception in ASGI application",
        "Traceback (most recent call last):",
        '  File "/venv/lib/python3.11/site-packages/uvicorn/protocols/http/httptools_impl.py", line 416, in run_asgi',
        "AttributeError: '_IncludedRouter' object has no attribute 'path'",
    ])
    events = logs_json(path)["events"]
    assert [(e["line"], e["signature"]) for e in events] == [(2, "uvicorn_error"), (3, "asgi_exception")]


def test_mooncakes_session_failure_and_the_bootstrap_fetch_error_are_their_classes(tmp_path):
    path = write(tmp_path, "decode.log", [
        BATCH,
        "[2026-12-01 18:22:51] Session 10.0.3.17:15012 failed.",
        "[2026-12-01 18:22:52] Error fetching prefill parallel info from bootstrap: HTTPConnectionPool"
        "(host='10.0.3.17', port=8998): Max retries exceeded with url: /route",
    ])
    document = logs_json(path)
    assert [e["signature"] for e in document["events"]] == ["mooncake_session_failed", "prefill_info_fetch_failed"]
    assert document["events"][0]["message"].startswith("Session 10.0.3.17:15012")
    classes = {f["class"] for f in document["verdict"]["findings"]}
    assert {"kv_transfer_failures", "bootstrap_server_unreachable"} <= classes


def test_a_glog_line_first_in_the_file_and_a_fatal_one_are_found(tmp_path):
    path = write(tmp_path, "mooncake.log", [
        GLOG[0],
        BATCH,
        "F1201 18:22:54.000001 3561 transfer_engine.cpp:88] Check failed: metadata_ != nullptr",
    ])
    events = scan(path).events
    assert list(zip(events["line"], events["signature"], strict=True)) == [(1, "glog_error"), (3, "glog_fatal")]
    assert events["severity"].tolist() == ["error", "critical"]


def test_info_and_warning_glog_lines_stay_quiet(tmp_path):
    path = write(tmp_path, "mooncake.log", [
        "I1201 02:01:00.759861  3561 transfer_engine_py.cpp:120] Using default malloc/free",
        "W1201 02:01:00.759990  3561 transfer_engine_py.cpp:130] No RDMA device found, falling back to TCP",
        BATCH,
    ])
    document = logs_json(path)
    assert document["events"] == [] and document["status"] == "clean", document["verdict"]


def test_a_glog_error_in_a_journal_line_is_found(tmp_path):
    path = write(tmp_path, "journal.txt", [
        "Dec 01 18:22:50 gpu-7 sglang-decode[3561]: " + BATCH,
        "Dec 01 18:22:51 gpu-7 sglang-decode[3561]: " + GLOG[0],
    ])
    events = scan(path, year=2026).events
    assert list(events["signature"]) == ["glog_error"] and int(events["line"].iloc[0]) == 2


ENGINES = [BYTES_FIND] + ([HYPERSCAN] if hyperscan is not None else [])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_literal_that_starts_with_a_newline_names_the_line_after_it(engine):
    data = b"first line\nE1201 x\nthird\nfoo: E1201 y\n"
    prefilter = LiteralPrefilter([b"\nE1", b": E1"], engine=engine)
    assert prefilter.line_starts(data) == [11, 25]
    assert sorted(prefilter.line_hits(data)) == [11, 25]


def test_glog_entries_prefilter_on_the_level_and_month_not_on_their_common_literal():
    literals = catalogue.literals()
    assert b"] " not in literals
    assert {b"\nE0", b"\nE1", b": F0"} <= set(literals)
