"""``forensics patch diff|apply|verify`` as a user runs them: exit statuses and one JSON document."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from forensics.sglang_source import fetch
from patched_engine import snippets


def forensics(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "forensics", "patch", *args], capture_output=True, text=True, timeout=timeout
    )


def one_document(stdout: str) -> dict:
    """The whole of stdout must be exactly one JSON document."""
    document, end = json.JSONDecoder().raw_decode(stdout)
    assert stdout[end:].strip() == ""
    return document


@pytest.mark.server
@pytest.mark.timeout(200)
def test_verify_vulnerable_release_shows_the_death_and_passes_patched() -> None:
    proc = forensics("verify", "--sglang", "0.5.15", "--json")
    assert proc.returncode == 0, proc.stderr
    document = one_document(proc.stdout)
    assert document["verdict"] == "PASS" and document["status"] == "pass" and document["exit"] == 0
    assert document["nixl_agent"]["kind"] in ("real", "stand-in")
    assert document["vulnerable"] is True and document["abort_from_release_decode"] is True
    unpatched = document["runs"]["unpatched"]
    assert unpatched["died_at"] == "ABORT room 2"
    assert "AssertionError" in unpatched["death"] and "Foreign traffic?" in unpatched["death"]
    assert unpatched["final_room_states"] == {
        "1": "WaitingForInput", "2": "Bootstrapping", "3": "Bootstrapping", "4": "Bootstrapping"
    }
    patched = document["runs"]["patched"]
    assert patched["died_at"] is None
    assert patched["final_room_states"] == {
        "1": "WaitingForInput", "2": "Failed", "3": "WaitingForInput", "4": "WaitingForInput"
    }
    assert all(check["ok"] for check in document["checks"]) and len(document["checks"]) == 4
    assert document["elapsed_s"] > 0


@pytest.mark.timeout(120)
def test_verify_and_diff_of_a_release_that_does_not_exist_exit_4() -> None:
    # The same failure (a release that cannot be had) is the same status in every command.
    for command in ("verify", "diff"):
        proc = forensics(command, "--sglang", "0.5.99", "--json")
        assert proc.returncode == 4, (command, proc.stdout)
        document = one_document(proc.stdout)
        assert document["status"] == "error" and document["exit"] == 4 and document["kind"] == "SourceError"
        assert "0.5.99" in document["error"] and "0.5.99" in proc.stderr


@pytest.mark.timeout(120)
def test_diff_json_and_plain() -> None:
    proc = forensics("diff", "--sglang", "0.5.23", "--json")
    assert proc.returncode == 0, proc.stderr
    document = one_document(proc.stdout)
    assert document["release"] == "0.5.23" and document["changed"] is True
    assert [s["name"] for s in document["steps"]] == [
        "abort-branch", "guard-warning", "per-message-try", "daemon-thread", "cleared-room-skip"
    ]
    assert "+        threading.Thread(target=bootstrap_thread_guarded, daemon=True).start()\n" in document["diff"]

    plain = forensics("diff", "--sglang", "0.5.23")
    assert plain.returncode == 0
    # stdout is the bare diff (pipe it into patch); the step table goes to stderr.
    assert plain.stdout == document["diff"]
    assert "per-message-try" in plain.stderr


@pytest.mark.timeout(120)
def test_apply_plans_without_yes_and_patches_with_it(tmp_path) -> None:
    original = fetch("0.5.13").backend_file("nixl").read_text()
    target = tmp_path / "conn.py"
    target.write_text(original)

    plan = forensics("apply", "--file", str(target), "--json")
    assert plan.returncode == 0, plan.stderr
    document = one_document(plan.stdout)
    assert document["status"] == "planned"
    assert target.read_text() == original

    human = forensics("apply", "--file", str(target))
    assert human.returncode == 0
    assert "plan only" in " ".join(human.stdout.split())
    assert f"+++ b/{target}\n" in human.stdout and "+PD_FORENSICS_PATCH = " in human.stdout
    assert target.read_text() == original

    done = forensics("apply", "--file", str(target), "--yes", "--json")
    assert done.returncode == 0, done.stderr
    document = one_document(done.stdout)
    assert document["status"] == "applied"
    assert snippets.SENTINEL_NAME in target.read_text()
    backups = list(tmp_path.glob("conn.py.pd-forensics-backup-*"))
    assert [str(b) for b in backups] == [document["backup"]]
    assert backups[0].read_text() == original

    again = forensics("apply", "--file", str(target), "--yes", "--json")
    assert again.returncode == 0
    assert one_document(again.stdout)["status"] == "already-patched"


@pytest.mark.timeout(120)
def test_apply_refuses_a_mangled_file_with_exit_1(tmp_path) -> None:
    original = fetch("0.5.13").backend_file("nixl").read_text()
    target = tmp_path / "conn.py"
    target.write_text(original.replace("def _start_bootstrap_thread(self):", "def _start_thread(self):"))
    proc = forensics("apply", "--file", str(target), "--yes", "--json")
    assert proc.returncode == 1
    document = one_document(proc.stdout)
    assert "'bootstrap-method'" in document["error"] and "found 0 times" in document["error"]
    assert not list(tmp_path.glob("*backup*"))
