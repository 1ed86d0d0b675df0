"""The CLI over the log forensics and the demo: JSON on stdout, exit statuses that carry the answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from forensics.logs import incident as gen


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "forensics", *args], capture_output=True, text=True, timeout=timeout)


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
    assert document["status"] == "findings"
    assert document["summary"]["facts"]["trigger"]["room"] == incident.trigger_room
    assert document["event_counts"]["thread_death"] == 1
    assert any(e["signature"] == "decode_transfer_aborted" and e["room"] == incident.trigger_room
               for e in document["events"])
    assert "decode_transfer_aborted" in csv.read_text()


def test_logs_human_output_and_role_filter(incident_logs):
    incident, paths = incident_logs
    done = run_cli("logs", str(paths["decode"]), "--role", "decode", "--since", "2025-07-01 12:00:00")
    assert done.returncode == 0, done.stderr  # the decode alone shows failures, no thread death
    assert "Log summary" in done.stdout and "Events (" in done.stdout
    assert str(incident.trigger_room) in done.stdout


def test_logs_exit_4_when_nothing_is_readable(tmp_path):
    done = run_cli("logs", str(tmp_path / "nope.log"))
    assert done.returncode == 4
    assert "nope.log" in done.stderr and done.stdout == ""


def test_logs_exit_3_when_a_source_could_not_be_read(incident_logs, tmp_path):
    _, paths = incident_logs
    done = run_cli("logs", str(paths["decode"]), str(tmp_path / "missing.log"), "--json")
    assert done.returncode == 3
    assert json.loads(done.stdout)["status"] == "inconclusive"


def test_logs_bad_time_zone_is_a_usage_error(incident_logs):
    _, paths = incident_logs
    done = run_cli("logs", str(paths["decode"]), "--tz", "Mars/Olympus")
    assert done.returncode == 2
    assert "Mars/Olympus" in done.stderr


@pytest.mark.server
@pytest.mark.timeout(420)
def test_demo_tells_the_story_on_the_twin(tmp_path):
    done = run_cli("demo", "--json", "--dir", str(tmp_path), timeout=400)
    document = json.loads(done.stdout)
    steps = {(s["twin"], s["name"]): s for s in document["steps"]}
    assert steps[("vulnerable", "prefill bootstrap thread")]["ok"], steps
    assert "hung" in steps[("vulnerable", "a new request after the kill")]["detail"]
    assert "Foreign traffic?" in steps[("vulnerable", "forensics logs")]["detail"]
    assert steps[("vulnerable", "/health")]["detail"] == "prefill 200, decode 200, router 200"
    assert steps[("patched", "a new request after the kill")]["ok"]
    assert document["ok"] is True and done.returncode == 0
