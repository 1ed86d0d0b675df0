"""A log window is "clean" only when sglang lines were read and nothing wrong was found.

Each case here once read as clean (exit 0) or as something it was not: transfer
timeouts without a thread death, a bootstrap queue that only grows, random bytes, a
window after the last line, an empty --since.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pandas as pd
import pytest

import forensics as fx
from forensics.exitcodes import UsageProblem
from forensics.logs import findings, timewindow
from forensics.logs import incident as gen

ROOMS = [5871024301998713347, 8120993457711002711, 4611686018427387905]


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "forensics", *args], capture_output=True, text=True, timeout=300,
                          input=stdin, env={**os.environ, "COLUMNS": "200"})


def prefixed(second: float, text: str) -> str:
    stamp = pd.Timestamp("2025-07-01 12:00:00") + pd.Timedelta(seconds=second)
    return f"[{stamp.strftime('%Y-%m-%d %H:%M:%S')} DP0 TP0] {text}"


def timeout_line(second: float, room: int) -> str:
    return prefixed(second, f"Decode transfer failed for request rank=0 decode_req.req.rid='{room % 99991:x}' "
                            f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room="
                            f"{room}): Request {room} timed out after 300.0s in KVPoll.WaitingForInput")


def steady(seconds: int) -> list[str]:
    return [prefixed(s, gen.prefill_batch_line("0.5.15", 2, 900 + s, 1, 0, 0, 1, 2000.0)) for s in range(seconds)]


def test_transfer_timeouts_alone_are_findings(tmp_path):
    path = tmp_path / "sglang-decode.log"
    lines = steady(5) + [timeout_line(10 + i, ROOMS[i % 3] + i) for i in range(14)]
    path.write_text("\n".join(lines) + "\n")
    assessment = fx.logs.scan(path).assess()
    assert assessment.word == "findings" and assessment.exit_status == 1
    (finding,) = [f for f in assessment.findings if f.id == "request_timeouts"]
    assert finding.count == 14 and finding.severity == "error"
    assert finding.evidence_lines()[0] == f"{path}:6 (room {ROOMS[0]})"
    done = run_cli("logs", str(path), "--json")
    assert done.returncode == 1
    document = json.loads(done.stdout)
    assert document["status"] == "findings"
    assert document["verdict"]["findings"][0]["class"] == "request_timeouts"
    assert document["verdict"]["findings"][0]["evidence"][0]["line"] == 6


def test_the_findings_table_names_files_as_the_sources_table_does(tmp_path):
    # Two hosts' files of one name: a bare "decode.log:6" would not say which host's line it is.
    for host in ("host-a", "host-b"):
        (tmp_path / host).mkdir()
        (tmp_path / host / "decode.log").write_text(
            "\n".join(steady(5) + [timeout_line(10 + i, ROOMS[i % 3] + i) for i in range(4)]) + "\n")
    done = run_cli("logs", str(tmp_path / "host-a" / "decode.log"), str(tmp_path / "host-b" / "decode.log"))
    assert done.returncode == 1, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if "request_timeouts" in line and "│" in line]
    assert f"{tmp_path / 'host-a' / 'decode.log'}:6" in row, row
    alone = run_cli("logs", str(tmp_path / "host-a" / "decode.log"))
    (row,) = [line for line in alone.stdout.splitlines() if "request_timeouts" in line and "│" in line]
    assert " decode.log:6 " in row and str(tmp_path) not in row, row


def probe_lines(count: int, step_s: float, start_queue: int) -> list[str]:
    return [prefixed(60 + i * step_s, gen.prefill_batch_line("0.5.15", 1, 1, 0, 0, start_queue + i, 0, 0.05))
            for i in range(count)]


def test_a_bootstrap_queue_that_only_grows_is_a_finding(tmp_path):
    path = tmp_path / "prefill.log"
    path.write_text("\n".join(steady(30) + probe_lines(12, 5.0, 3)) + "\n")
    assessment = fx.logs.scan(path).assess()
    assert assessment.word == "findings"
    (finding,) = [f for f in assessment.findings if f.id == "bootstrap_queue_growth"]
    assert finding.count == 1
    assert "#bootstrap-req 3 -> 14" in finding.detail and "12 probe-only" in finding.detail


@pytest.mark.parametrize("count,step_s,label", [(9, 5.0, "too few lines"), (12, 2.0, "under 30 s")])
def test_short_probe_runs_are_not_growth(tmp_path, count, step_s, label):
    path = tmp_path / "prefill.log"
    path.write_text("\n".join(steady(30) + probe_lines(count, step_s, 3)) + "\n")
    assessment = fx.logs.scan(path).assess()
    assert [f.id for f in assessment.findings] == [], label
    assert assessment.word == "clean"


def test_a_queue_that_shrinks_is_not_growth(tmp_path):
    lines = probe_lines(12, 5.0, 3)
    lines[6] = prefixed(60 + 6 * 5.0, gen.prefill_batch_line("0.5.15", 1, 1, 0, 0, 0, 0, 0.05))  # drained once
    path = tmp_path / "prefill.log"
    path.write_text("\n".join(steady(30) + lines) + "\n")
    assert "bootstrap_queue_growth" not in [f.id for f in fx.logs.scan(path).assess().findings]


def test_warnings_alone_keep_exit_zero(tmp_path):
    path = tmp_path / "decode.log"
    abort = prefixed(7, f"Decode transfer failed for request rank=0 decode_req.req.rid='ab' "
                        f"decode_req.req.bootstrap_room={ROOMS[0]} with exception KVTransferError(bootstrap_room="
                        f"{ROOMS[0]}): Aborted by AbortReq.")
    path.write_text("\n".join(steady(5) + [abort]) + "\n")
    done = run_cli("logs", str(path), "--json")
    document = json.loads(done.stdout)
    assert done.returncode == 0 and document["status"] == "warnings"
    assert [f["class"] for f in document["verdict"]["findings"]] == ["aborted_requests"]


def test_a_healthy_window_is_clean_with_what_was_read(tmp_path):
    path = tmp_path / "prefill.log"
    path.write_text("\n".join(steady(40)) + "\n")
    assessment = fx.logs.scan(path).assess()
    assert assessment.word == "clean" and assessment.exit_status == 0
    assert "read 40 sglang/uvicorn/CPython lines of 40" in assessment.reasons[0]


def test_health_5xx_is_a_finding(tmp_path):
    path = tmp_path / "prefill.log"
    lines = steady(5) + [gen.access_line("GET", "/health", 503, 40000 + i) for i in range(3)]
    path.write_text("\n".join(lines) + "\n")
    (finding,) = fx.logs.scan(path).assess().findings
    assert finding.id == "health_check_failures" and finding.count == 3 and "3 x 503" in finding.detail


def test_random_bytes_are_inconclusive_with_the_share(tmp_path):
    path = tmp_path / "noise.log"
    path.write_bytes(random.Random(3).randbytes(5 << 20))
    done = run_cli("logs", str(path), "--json")
    assert done.returncode == 3, done.stdout[-500:]
    document = json.loads(done.stdout)
    assert document["status"] == "inconclusive"
    assert any("does not look like an sglang log" in r and "%" in r for r in document["verdict"]["reasons"])


def test_an_empty_file_is_not_clean(tmp_path):
    path = tmp_path / "empty.log"
    path.write_text("")
    done = run_cli("logs", str(path), "--json")
    assert done.returncode in (3, 4) and json.loads(done.stdout)["status"] != "clean"


# --------------------------------------------------------------------------- windows


@pytest.fixture()
def incident_file(tmp_path):
    incident = gen.generate("0.5.15", steady_seconds=20, after_seconds=320)
    paths = gen.write_sglang_logs(incident, tmp_path)
    return incident, paths


def test_empty_since_is_a_usage_error(incident_file):
    _, paths = incident_file
    done = run_cli("logs", str(paths["decode"]), "--since", "", "--json")
    assert done.returncode == 2
    document = json.loads(done.stdout)
    assert document["status"] == "usage" and "--since is empty" in document["error"]


def test_until_before_since_is_a_usage_error(incident_file):
    _, paths = incident_file
    done = run_cli("logs", str(paths["decode"]), "--since", "2025-07-01 13:00", "--until", "2025-07-01 12:00")
    assert done.returncode == 2 and "before --since" in done.stderr


def test_a_window_after_the_last_line_is_inconclusive(incident_file):
    _, paths = incident_file
    done = run_cli("logs", str(paths["prefill"]), str(paths["decode"]), "--since", "2025-07-02", "--json")
    assert done.returncode == 3
    reasons = json.loads(done.stdout)["verdict"]["reasons"]
    assert any("holds no log line" in r and "2025-07-01T12:00:00" in r for r in reasons)


def test_untimed_events_are_kept_by_a_window_and_counted(tmp_path):
    path = tmp_path / "prefill.log"
    # A traceback with no timed line anywhere: its thread death has no time at all.
    path.write_text("\n".join(gen.thread_death_lines("0.5.15")) + "\n")
    scan = fx.logs.scan(path, since="2025-07-01 12:00")
    deaths = scan.events[scan.events["signature"] == "thread_death"]
    assert len(deaths) == 1 and pd.isna(deaths["ts"].iloc[0]) and deaths["ts_source"].iloc[0] == "none"
    assert any("carry no time" in note for note in scan.notes)
    assert scan.assess().word == "findings"


def test_last_means_the_end_of_the_logs_themselves(incident_file):
    incident, paths = incident_file
    scan = fx.logs.scan([paths["prefill"], paths["decode"]], last="1m")
    end = scan.span[1]
    assert scan.window.since == end - pd.Timedelta(minutes=1)
    assert scan.events["ts"].dropna().min() >= end - pd.Timedelta(minutes=1)
    assert len(scan.events) and "thread_death" not in set(scan.events["signature"])  # the death is earlier


@pytest.mark.parametrize("text,expected", [
    ("2025-07-01T12:00:00", pd.Timestamp("2025-07-01 12:00:00", tz="UTC")),
    ("2025-07-01 14:00:00+02:00", pd.Timestamp("2025-07-01 12:00:00", tz="UTC")),
    ("@1751371200", pd.Timestamp("2025-07-01 12:00:00", tz="UTC")),
    ("1751371200", pd.Timestamp("2025-07-01 12:00:00", tz="UTC")),
    ("30m", pd.Timestamp("2026-01-01 11:30:00", tz="UTC")),
    ("-2h", pd.Timestamp("2026-01-01 10:00:00", tz="UTC")),
    ("1h 30min ago", pd.Timestamp("2026-01-01 10:30:00", tz="UTC")),
    ("yesterday", pd.Timestamp("2025-12-31 00:00:00", tz="UTC")),
])
def test_bounds_read_like_journalctl(text, expected):
    now = pd.Timestamp("2026-01-01 12:00:00", tz="UTC")
    assert timewindow.parse_bound(text, "UTC", now=now) == expected


@pytest.mark.parametrize("number", [1751371200, 1751371200.0])
def test_a_number_is_epoch_seconds(number):
    # As time.time() gives it (a notebook passes one); pandas alone reads a number as nanoseconds.
    assert timewindow.parse_bound(number) == pd.Timestamp("2025-07-01 12:00:00", tz="UTC")


def test_naive_bounds_are_read_in_the_given_zone():
    assert timewindow.parse_bound("2025-07-01 14:00", "Europe/Berlin") == pd.Timestamp("2025-07-01 12:00", tz="UTC")


@pytest.mark.parametrize("text", ["", "   ", "soon", "30 parsecs", "2025-13-45"])
def test_nonsense_bounds_are_usage_problems(text):
    with pytest.raises(UsageProblem):
        timewindow.parse_bound(text)


# --------------------------------------------------------------------------- summary text


def test_summary_never_dangles_without_a_real_prefill_batch(tmp_path):
    path = tmp_path / "prefill.log"
    path.write_text("\n".join(probe_lines(12, 5.0, 3)) + "\n")
    sentences = fx.logs.scan(path).summary().sentences
    growth = [s for s in sentences if "health-probe batches" in s]
    assert growth and growth[0].startswith("No real prefill batch in these logs; only 12")
    assert not any(s.startswith("After it") for s in sentences)


def test_finding_classes_cover_known_signatures_once():
    classes = findings.finding_classes()
    ids = [c.id for c in classes]
    assert len(ids) == len(set(ids))
    claimed = [s for c in classes for s in c.signatures]
    assert len(claimed) == len(set(claimed))
    # Every error or critical signature of the catalogue belongs to some class.
    from forensics.logs.catalogue import event_signatures

    serious = {s.id for s in event_signatures() if s.severity in ("critical", "error")}
    assert serious <= set(claimed), serious - set(claimed)


def test_journalctl_output_piped_into_logs_dash(tmp_path):
    """`journalctl ... | forensics logs -`: read from standard input, judged like a file."""
    incident = gen.generate("0.5.15", steady_seconds=20, after_seconds=320)
    text = gen.write_journal_text(incident, tmp_path / "journal.txt", style="short-iso").read_text()
    done = run_cli("logs", "-", "--json", stdin=text)
    assert done.returncode == 1, done.stderr
    document = json.loads(done.stdout)
    assert document["sources"][0]["source"] == "<stdin>" and document["sources"][0]["format"] == "short-iso"
    assert document["summary"]["facts"]["trigger"]["room"] == str(incident.trigger_room)
