"""The CLI over the log forensics and the demo: JSON on stdout, exit statuses that carry the answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from report_checks import check_gauge_sentences

from forensics.demo import STAGES
from forensics.logs import incident as gen


def run_cli(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "forensics", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def incident_logs(tmp_path_factory):
    incident = gen.generate("0.5.15", steady_seconds=20, after_seconds=320)
    return incident, gen.write_sglang_logs(incident, tmp_path_factory.mktemp("cli"))


def test_logs_json_is_one_document_and_exit_1_on_a_thread_death(incident_logs, tmp_path):
    incident, paths = incident_logs
    csv = tmp_path / "events.csv"
    done = run_cli("logs", str(paths["prefill"]), str(paths["decode"]), "--json", "--csv", str(csv))
    assert done.returncode == 1, done.stderr
    document = json.loads(done.stdout)
    assert document["status"] == "findings" and document["exit"] == 1
    classes = {f["class"]: f for f in document["verdict"]["findings"]}
    assert classes["thread_death"]["severity"] == "critical"
    assert classes["request_timeouts"]["count"] == len(incident.timeout_rooms) + 1  # + the one-time hint
    assert document["summary"]["facts"]["trigger"]["room"] == str(incident.trigger_room)
    assert document["event_counts"]["thread_death"] == 1
    assert any(e["signature"] == "decode_transfer_aborted" and e["room"] == str(incident.trigger_room)
               for e in document["events"])
    frame = pd.read_csv(csv, dtype={"room": "UInt64"})
    aborted = frame.loc[frame["signature"] == "decode_transfer_aborted", "room"]
    assert [int(room) for room in aborted] == [incident.trigger_room]


def test_logs_human_output_and_role_filter(incident_logs):
    incident, paths = incident_logs
    done = run_cli("logs", str(paths["decode"]), "--role", "decode", "--since", "2025-07-01 12:00:00",
                   env={"COLUMNS": "200"})
    # The decode alone has no thread death, but its transfer timeouts are findings (exit 1).
    assert done.returncode == 1, done.stderr
    assert "Log summary" in done.stdout and "Events (" in done.stdout
    assert "request_timeouts" in done.stdout and "Verdict: FINDINGS" in done.stdout
    assert str(incident.trigger_room) in done.stdout


def test_logs_reads_in_an_80_column_terminal(incident_logs):
    incident, paths = incident_logs
    done = run_cli("logs", str(paths["prefill"]), str(paths["decode"]), env={"COLUMNS": "80"})
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    # each event on one line: time, role, signature, the room whole, the message cut with an ellipsis
    line = next(line for line in lines if line.startswith("12:00:") and "decode_transfer_aborted" in line)
    assert f" {incident.trigger_room} Decode transfer" in line and line.endswith("…")
    assert lines[0] == "Verdict: FINDINGS"  # the verdict first, details after


def test_role_option_labels_every_source(incident_logs):
    _, paths = incident_logs
    done = run_cli("logs", str(paths["prefill"]), str(paths["decode"]), "--role", "decode", "--json", "--all")
    document = json.loads(done.stdout)
    assert {e["role"] for e in document["events"]} == {"decode"}
    assert {s["role"] for s in document["sources"]} == {"decode"}


def test_logs_exit_4_when_nothing_is_readable(tmp_path):
    done = run_cli("logs", str(tmp_path / "nope.log"))
    assert done.returncode == 4
    assert "nope.log" in done.stderr and done.stdout == ""


def test_logs_exit_3_when_a_source_could_not_be_read(incident_logs, tmp_path):
    _, paths = incident_logs
    done = run_cli("logs", str(paths["decode"]), str(tmp_path / "missing.log"), "--json", "--until",
                   "2025-07-01 12:00:05")
    assert done.returncode == 3, done.stdout
    document = json.loads(done.stdout)
    assert document["status"] == "inconclusive" and document["exit"] == 3
    assert any("missing.log" in reason for reason in document["verdict"]["reasons"])


def test_logs_bad_time_zone_is_a_usage_error(incident_logs):
    _, paths = incident_logs
    done = run_cli("logs", str(paths["decode"]), "--tz", "Mars/Olympus")
    assert done.returncode == 2
    assert "Mars/Olympus" in done.stderr


@pytest.mark.server
@pytest.mark.timeout(420)
def test_demo_tells_the_whole_story_on_the_twin(tmp_path):
    out = tmp_path / "demo"
    done = run_cli("demo", "--json", "--out", str(out), "--sessions", "8", timeout=400)
    document = json.loads(done.stdout)
    steps = {(s["stage"], s["name"]): s for s in document["steps"]}
    assert [stage for stage in dict.fromkeys(s["stage"] for s in document["steps"])] == list(STAGES)
    # reproduce: one killed client, the thread dead, /health still 200, a new request hung
    assert steps[("reproduce", "prefill bootstrap thread")]["ok"], steps
    assert "hung" in steps[("reproduce", "a new request after the kill")]["detail"]
    assert "Foreign traffic?" in steps[("reproduce", "forensics logs")]["detail"]
    assert steps[("reproduce", "/health")]["detail"] == "prefill 200, decode 200, router 200"
    # diagnose, diff, patch, validate: each saw what the incident predicts
    assert steps[("diagnose", "collect + diagnose")]["detail"].startswith("WEDGED")
    assert "ABORT" in steps[("diff", "NIXL vs Mooncake handlers")]["detail"]
    assert re.match(r"room \d+ marked Failed, ABORT_ACK sent; bootstrap thread alive",
                    steps[("diff", "the same kill on a Mooncake twin")]["detail"])
    assert steps[("patch", "deploy to the wedged twin")]["detail"].startswith("deployed")
    assert steps[("patch", "a new request after the kill")]["ok"]
    assert re.search(r"^0 thread deaths since the deploy; [1-9]\d* ABORT handled",
                     steps[("patch", "forensics logs")]["detail"])
    assert document["ok"] is True and done.returncode == 0, [s for s in document["steps"] if not s["ok"]]
    assert document["status"] == "pass" and document["exit"] == 0
    # what it left: the investigation the report was written from, and the report in three formats
    verdict = json.loads((out / "investigation" / "verdicts" / "incident.json").read_text())
    assert verdict["verdict"] == "WEDGED"
    campaign = json.loads((out / "investigation" / "campaigns" / "validation" / "campaign.json").read_text())
    assert campaign["campaign"] == "PASS" and campaign["aborts"] >= 1
    assert document["report"] == str(out / "report" / "report.html")
    for name in ("report.md", "report.html", "report.pdf"):
        assert (out / "report" / name).stat().st_size > 0, name
    report = (out / "report" / "report.md").read_text()
    # The evidence window starts when the demo did: no 1970 date (a 19-digit room may hold "1970").
    assert "WEDGED" in report and not re.search(r"\b1970-\d\d-\d\d", report)
    # What it says about each queue gauge holds on the twin's own scraped series.
    from forensics.report import Investigation

    metrics = Investigation(out / "investigation", create=False).evidence().frame("metrics")  # the report's
    deaths = [s["at"] for s in verdict["signals"] if s["name"] == "thread_death_logged" and s.get("at")]
    death = min(pd.Timestamp(at) for at in deaths) if deaths else None
    assert check_gauge_sentences(report, metrics, death) >= 1, report
    assert json.loads((out / "demo.json").read_text())["ok"] is True
    # The twin draws 63-bit rooms; the likely trigger must name one its own decode log holds.
    trigger = [s for s in document["log_summary"] if s.startswith("Likely trigger")]
    assert trigger, document["log_summary"]
    room = re.search(r"for room (\d+) ", trigger[0]).group(1)
    assert f"bootstrap_room={room} " in (out / "twin" / "decode.log").read_text(), room
