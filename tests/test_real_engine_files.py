"""Our readers on what real sglang 0.5.15 wrote (tests/data/real-engine-0.5.15/, see its README).

The files come from a real PD prefill and decode on this CPU (``forensics.fidelity`` captured
them: start-up, one served request, a streaming client killed while its KV was pending, the
prefill's ``bootstrap_thread`` dying on the decode's ABORT, and a waiting timeout). Every reader
must hold on them: the log scanner, the metrics parser, the thread-dump parser and check, the
diagnosis rules and the fidelity comparison. Fast, no engine needed: these run in CI.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

import forensics.logs as logs
from forensics.collectors.metrics import canonical_name, parse_exposition
from forensics.diagnosis import decide
from forensics.evidence import Evidence
from forensics.fidelity import Capture, compare
from forensics.fidelity.capture import metric_families
from forensics.logs.findings import assess
from forensics.threads import check_threads, expected_threads, parse_dump
from forensics.threads import schema as thread_schema
from forensics.threads.dump import ThreadDump

DATA = Path(__file__).parent / "data" / "real-engine-0.5.15"
ROLES = ("prefill", "decode")


@pytest.fixture(scope="module")
def scans():
    return {role: logs.scan([str(DATA / f"{role}.log")], role=role) for role in ROLES}


def test_every_line_real_sglang_wrote_is_recognised(scans):
    """Python warnings (with their indented message and source lines), the ANSI-coloured
    deprecation notice and tqdm's progress bar included: nothing is in an unknown format."""
    for role, scan in scans.items():
        assert int(scan.sources["lines_unknown"].sum()) == 0, (role, scan.unknown_samples)
        assert int(scan.sources["lines"].sum()) > 150


def test_a_warning_glued_to_the_progress_bar_at_a_restart_is_recognised():
    """``patch deploy`` restarting the real prefill: SIGTERM, the scheduler's exit -15, a fresh
    start-up in which a UserWarning's first line came after tqdm's carriage return, so its source line
    follows a progress-bar line. Every line is known, and the stop is a stop, not a crash."""
    path = DATA / "prefill-deploy-restart.log"
    text = path.read_text()
    assert "?it/s]/" in text and "UserWarning: Only CUDA, HIP and XPU" in text
    scan = logs.scan([str(path)], role="prefill")
    assert int(scan.sources["lines_unknown"].sum()) == 0, scan.unknown_samples
    assert list(scan.events["signature"]) == ["subprocess_exited", "child_failed", "crash_diagnostics_skipped",
                                              "server_ready"]
    judged = assess(scan)
    assert [f.id for f in judged.findings] == ["server_stopped"] and judged.word == "warnings", judged.to_dict()


@pytest.mark.parametrize("name", ["prefill-startup.log", "decode-startup.log",
                                  "prefill-validate-patched.log", "decode-validate-patched.log"])
def test_a_traceback_real_0513_logs_inside_a_message_is_one_error_event(name):
    """Real 0.5.13 at start-up logs "Can not initialize OpenAIServingResponses, error: Traceback (most
    recent call last):" and the frames on the lines after (its environment has no openai_harmony):
    one python_traceback event named by its exception, its frames known lines, never clean. The
    validate logs hold enough rare lines for the bulk classification of a chunk, which once let
    the header line through as a plain message and read its frames as unknown."""
    path = DATA.parent / "real-engine-0.5.13" / name
    text = path.read_text()
    assert "OpenAIServingResponses, error: Traceback (most recent call last):" in text
    scan = logs.scan([str(path)], role=name.split("-")[0])
    assert int(scan.sources["lines_unknown"].sum()) == 0, scan.unknown_samples
    [traceback] = scan.events[scan.events["signature"] == "python_traceback"].to_dict(orient="records")
    assert traceback["message"] == "ModuleNotFoundError: No module named 'openai_harmony'"
    lines = path.read_bytes().split(b"\n")  # bytes: read_text would turn tqdm's carriage returns into newlines
    assert traceback["line"] == 1 + next(i for i, line in enumerate(lines)
                                         if line.endswith(b"Traceback (most recent call last):"))
    assert traceback["frame_file"].endswith("serving_responses.py")
    judged = assess(scan)
    expected = ["errors_logged"] + (["aborted_requests"] if "validate" in name else [])  # the cycle's storm
    assert judged.word == "findings" and [f.id for f in judged.findings] == expected, judged.to_dict()
    assert "server_ready" in set(scan.events["signature"])


def test_every_line_the_real_mini_load_balancer_wrote_is_recognised_and_its_errors_are_events(tmp_path):
    """Bare logger messages ("[MiniLB] ..."), plain uvicorn start-up lines with no time, a
    FastAPIDeprecationWarning and asyncio's "Unclosed connection" report: all in a known format.
    uvicorn's "Exception in ASGI application" with its traceback is an error event (never clean);
    any other uvicorn ERROR line is an event of its own (``uvicorn_error``): never silent."""
    quiet = logs.scan([str(DATA / "router.log")], role="router")
    assert int(quiet.sources["lines_unknown"].sum()) == 0, quiet.unknown_samples
    assert len(quiet.events) == 0
    text = (DATA / "router.log").read_text()
    assert "[MiniLB] Overriding policy to random" in text and "INFO:     Started server process" in text
    assert "Unclosed connection" in text and "FastAPIDeprecationWarning" in text
    deployed = logs.scan([str(DATA / "router-wedge-and-deploy.log")], role="router")
    assert int(deployed.sources["lines_unknown"].sum()) == 0, deployed.unknown_samples
    assert list(deployed.events["signature"]) == ["asgi_exception", "asgi_exception"]
    assessment = assess(deployed)
    assert assessment.word == "findings" and [f.id for f in assessment.findings] == ["http_handler_errors"]
    with_error = tmp_path / "router.log"
    with_error.write_text(text + "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', "
                          "30000): address already in use\n")
    worse = logs.scan([str(with_error)], role="router")
    assert list(worse.events["signature"]) == ["uvicorn_error"]
    assert assess(worse).word == "findings" and [f.id for f in assess(worse).findings] == ["errors_logged"]


def test_the_prefill_log_shows_the_death_on_the_guard_assertion_with_bounded_time(scans):
    events = scans["prefill"].events
    death = events[events["signature"] == "nixl_guard_assertion"]
    assert len(death) == 1
    assert "Foreign traffic?" in death.iloc[0]["message"]
    thread = events[events["signature"] == "thread_death"].iloc[0]
    assert "bootstrap_thread" in str(thread["thread"])
    # the traceback has no time of its own: bounded by the lines around it
    assert thread["ts"] <= thread["ts_upper"]
    assessment = scans["prefill"].assess()
    assert assessment.word == "findings"
    assert [f.cls.id for f in assessment.findings if f.severity == "critical"] == ["thread_death"]


def test_health_503_during_start_up_is_not_a_health_check_failure(scans):
    """sglang answers /health 503 until its warm-up ends ("The server is fired up"): 15 on this prefill."""
    access = scans["prefill"].access
    starting = access[(access["path"] == "/health") & (access["status"] == 503)]
    assert int(starting["count"].sum()) >= 10
    assert "server_ready" in set(scans["prefill"].events["signature"])
    for role, scan in scans.items():
        assert "health_check_failures" not in {f.cls.id for f in scan.assess().findings}, role


def test_the_decode_log_shows_the_abort_and_the_waiting_timeout_with_their_rooms(scans):
    events = scans["decode"].events
    aborted = events[events["signature"] == "decode_transfer_aborted"]
    timed_out = events[events["signature"] == "decode_transfer_timeout"]
    assert len(aborted) == 1 and len(timed_out) == 1
    # rooms exact (63-bit ints), as the line spells them
    assert int(aborted.iloc[0]["room"]) == 3925563661319346376
    assert int(timed_out.iloc[0]["room"]) == 6042980111215335056
    assert "waiting_timeout_hint" in set(events["signature"])
    assert {f.cls.id for f in scans["decode"].assess().findings} >= {"request_timeouts", "aborted_requests"}


def test_the_batch_lines_of_a_cpu_engine_are_parsed(scans):
    batches = scans["prefill"].batches
    assert len(batches) >= 4
    assert set(batches["kind"]) == {"prefill"}
    assert batches["new_token"].max() >= 40  # the served request's 40-token prompt


@pytest.mark.parametrize("role", ROLES)
def test_the_real_metrics_page_is_parsed_whole(role):
    text = (DATA / f"{role}-metrics.txt").read_text()
    page = parse_exposition(text)
    families = metric_families(text)
    assert len(families) == {"prefill": 66, "decode": 64}[role]
    assert not [m for m in page.metric if m.endswith("_created")]  # multiprocess mode: none
    canonical = {canonical_name(m) for m in page.metric}
    queues = ({"sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs"} if role == "prefill"
              else {"sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs"})
    assert queues <= canonical
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(page) == len(samples)  # every sample line read, none lost
    # a gauge in multiprocess mode "all" carries the scheduler's pid
    assert "pid" in families["sglang:num_paused_reqs"]["labels"]


def _dump(name: str, pid: int) -> ThreadDump:
    data = json.loads((DATA / name).read_text())
    taken = datetime(2026, 12, 1, 23, 30, 20, tzinfo=UTC)
    columns = parse_dump(data, host="local", pid=pid, taken_at=taken)
    return ThreadDump(host="local", pids=[pid], frame=thread_schema.build(columns), raw={pid: data},
                      taken_at={pid: taken})


def test_the_wedged_prefill_schedulers_dump_lacks_bootstrap_thread_and_keeps_four_transfer_workers():
    dump = _dump("prefill-scheduler-wedged.pyspy.json", 14400)
    names = list(dump.frame["thread_name"].astype(str))
    assert sum("(transfer_worker)" in n for n in names) == 4
    assert not any("bootstrap_thread" in n for n in names)
    check = check_threads(dump, expected_threads("0.5.15", "nixl"), role="prefill")
    statuses = dict(zip(check.frame["logical_name"], check.frame["status"], strict=True))
    assert statuses["bootstrap"] == "missing"
    assert not check.ok


def test_diagnosis_on_the_real_files_is_wedged():
    """The prefill's log (the GUARD death) and its scheduler's dump (no bootstrap_thread): two sources."""
    scan = logs.scan([str(DATA / "prefill.log"), str(DATA / "decode.log")])
    events = scan.events.copy()
    events.insert(0, "engine", pd.array([f"{r}-0" for r in events["role"]], dtype="string"))
    dump = _dump("prefill-scheduler-wedged.pyspy.json", 14400)
    check = check_threads(dump, expected_threads("0.5.15", "nixl"), role="prefill").frame.copy()
    check.insert(0, "engine", pd.array(["prefill-0"] * len(check), dtype="string"))
    check["taken_at"] = pd.Timestamp("2026-12-01T23:30:20Z")
    engines = pd.DataFrame({"name": ["prefill-0", "decode-0"], "role": list(ROLES), "host": ["local"] * 2,
                            "url": ["http://127.0.0.1:51468", "http://127.0.0.1:36754"]})
    verdict = decide(Evidence({"name": "real-0.5.15"}, {"engines": engines, "events": events, "thread_check": check}))
    assert verdict.verdict == "WEDGED", verdict
    # The death has no time of its own: the chain gives its bounds, and the decode's abort (printed
    # inside them) is never called "before" it (tests/test_event_time.py).
    chain = verdict.kill_chain
    assert chain[0].startswith("decode_transfer_aborted for room 3925563661319346376 on the decode at "
                               "2026-12-01T23:30:12+00:00, within the time bounds of the thread death")
    assert "died between 2026-12-01T23:30:04+00:00 and 2026-12-01T23:32:09+00:00" in chain[1]


def test_server_info_of_the_real_engine_keeps_its_numbers():
    info = json.loads((DATA / "prefill-server_info.json").read_text())
    assert info["disaggregation_mode"] == "prefill" and info["version"] == "0.5.15"
    from forensics.redact import redact_value

    for key in ("max_total_num_tokens", "tbo_token_distribution_threshold"):
        if key in info:
            assert redact_value(info[key], key=key) == info[key], key


def test_the_stored_real_capture_compares_equal_to_itself_and_differs_from_a_changed_copy():
    real = Capture.load(DATA / "capture.json")
    assert real.release == "0.5.15" and set(real.metrics) == set(ROLES)
    assert not compare(real, real).unallowed
    changed = Capture.from_dict(json.loads((DATA / "capture.json").read_text()))
    del changed.metrics["prefill"]["sglang:num_prefill_bootstrap_queue_reqs"]
    changed.logs["abort"]["prefill"] = [line for line in changed.logs["abort"]["prefill"] if "Foreign" not in line]
    report = compare(real, changed)
    items = {(d.aspect, d.role, d.item, d.kind) for d in report.unallowed}
    assert ("metrics", "prefill", "sglang:num_prefill_bootstrap_queue_reqs", "missing") in items
    assert ("logs", "prefill", "abort: nixl_guard_assertion", "missing") in items
    assert report.exit_status == 1
    assert all(len(line) <= 80 for line in report.text().splitlines())
