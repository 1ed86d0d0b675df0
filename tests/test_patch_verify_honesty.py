"""``verify_release`` says which NIXL agent ran, and never claims a step that did not run.

The sandbox runs the release's loop against the real NIXL over UCX when NIXL imports, and
against the recording stand-in (``RecordingAgent``) when it does not or is switched off
(``nixl=False``, ``PD_FORENSICS_SANDBOX_NIXL=off``): the result, its JSON and both
renderings say which. An INCONCLUSIVE result (no source, a sandbox that does not start)
renders no sentence about the bootstrap thread or the rooms.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from rich.console import Console

from forensics.exitcodes import ExitStatus
from forensics.sandbox.shim import NIXL_SWITCH_ENV
from forensics.sglang_source import fetch
from patched_engine import verify as verify_module
from patched_engine.verify import REAL_NIXL, SCENARIO, STAND_IN, UNKNOWN_AGENT, verify_release

# Words that only a run that executed steps may say.
STEP_CLAIMS = ("alive", "died", "DEAD", "stuck", "final rooms", "rooms after", "every step", "WaitingForInput",
               "Bootstrapping", "Failed")

needs_nixl = pytest.mark.skipif(
    importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None,
    reason="NIXL (nixl or nixl_cu12) is not installed here; ./run installs nixl-cu12",
)


def _text(result) -> str:
    console = Console(width=240, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    console.print(result)
    return console.export_text()


def _contract(document: dict) -> None:
    assert list(document)[:2] == ["status", "exit"]
    assert "ok" not in document and "exit_code" not in document
    assert json.loads(json.dumps(document)) == document  # plain JSON all the way down


def _claims(text: str) -> list[str]:
    return [claim for claim in STEP_CLAIMS if claim in text]


@needs_nixl
@pytest.mark.server
@pytest.mark.timeout(180)
def test_verify_with_nixl_reports_the_real_agent(monkeypatch) -> None:
    monkeypatch.delenv(NIXL_SWITCH_ENV, raising=False)
    result = verify_release("0.5.15")
    assert result.verdict == "PASS" and result.exit_status == ExitStatus.GOOD
    for run in (result.unpatched, result.patched):
        assert run.agent.kind == REAL_NIXL and "real" in run.agent.description
        assert run.agent.nixl and "real" in run.agent.nixl
    assert result.agent.kind == REAL_NIXL
    document = result.to_dict()
    _contract(document)
    assert (document["status"], document["exit"], document["verdict"]) == ("pass", 0, "PASS")
    assert document["nixl_agent"]["kind"] == REAL_NIXL
    assert document["runs"]["patched"]["agent"]["kind"] == REAL_NIXL
    assert document["runs"]["patched"]["steps_run"] == len(SCENARIO)
    text = _text(result)
    assert "NIXL agent: real NIXL over UCX" in text and "stand-in" not in text
    assert "real NIXL over UCX" in result._repr_html_()
    assert not any("stand-in" in reason for reason in result.reasons)


@pytest.mark.server
@pytest.mark.timeout(180)
def test_verify_without_nixl_reports_the_recording_stand_in(monkeypatch) -> None:
    # As a machine without NIXL: the switch the sandbox honours, set in the environment ...
    monkeypatch.setenv(NIXL_SWITCH_ENV, "off")
    result = verify_release("0.5.15")
    assert result.verdict == "PASS"  # the bootstrap loop itself ran for real either way
    for run in (result.unpatched, result.patched):
        assert run.agent.kind == STAND_IN and run.agent.description.startswith("recording stand-in")
    document = result.to_dict()
    _contract(document)
    assert document["nixl_agent"]["kind"] == STAND_IN and document["status"] == "pass"
    text = _text(result)
    assert "the recording stand-in, not NIXL" in text and "real NIXL" not in text
    assert "recording stand-in" in result._repr_html_()
    assert any("NIXL was not used" in reason for reason in result.reasons)

    # ... and asked for in Python.
    monkeypatch.delenv(NIXL_SWITCH_ENV)
    result = verify_release("0.5.15", nixl=False)
    assert result.agent.kind == STAND_IN and result.to_dict()["nixl_agent"]["kind"] == STAND_IN


@pytest.mark.timeout(60)
def test_inconclusive_without_source_claims_no_step(tmp_path) -> None:
    result = verify_release(tmp_path / "no-such-checkout")
    assert result.verdict == "INCONCLUSIVE" and result.exit_status == ExitStatus.INCONCLUSIVE
    assert "no-such-checkout" in result.reasons[0]
    document = result.to_dict()
    _contract(document)
    assert (document["status"], document["exit"]) == ("inconclusive", 3)
    assert document["nixl_agent"]["kind"] == UNKNOWN_AGENT
    assert document["vulnerable"] is None and document["unpatched_dies_on_abort"] is None
    assert document["checks"] == []
    for kind in ("unpatched", "patched"):
        run = document["runs"][kind]
        assert run["steps_run"] == 0 and run["summary"] == "not run" and run["final_room_states"] == {}
    text, page = _text(result), result._repr_html_()
    assert _claims(text) == [] and _claims(page) == [], (text, page)
    assert "not run" in text and "no scenario step ran" in page
    assert "NIXL agent: none (no sandbox run started)" in text


@pytest.mark.server
@pytest.mark.timeout(180)
def test_a_sandbox_that_does_not_start_claims_no_step(tmp_path) -> None:
    # A fork whose shared disaggregation code fails at import: neither sandbox run can start.
    source = fetch("0.5.15")
    fork = tmp_path / "fork"
    shutil.copytree(source.root, fork, ignore=shutil.ignore_patterns("__pycache__"))
    common = fork / "sglang" / "srt" / "disaggregation" / "common" / "conn.py"
    common.write_text('raise ImportError("this fork\'s common/conn.py needs a module it never shipped")\n'
                      + common.read_text())
    result = verify_release(fork)
    assert result.verdict == "INCONCLUSIVE" and result.exit_code == 3
    assert "could not run the patched file" in result.reasons[0]
    for run in (result.unpatched, result.patched):
        assert run.steps == [] and run.error and run.summary().startswith("not run: ")
        assert run.agent.kind == UNKNOWN_AGENT
    document = result.to_dict()
    _contract(document)
    assert document["status"] == "inconclusive" and document["checks"] == []
    assert document["vulnerable"] is None and document["abort_from_release_decode"] is None
    assert [line.split(":")[0] for line in result.run_lines()] == ["unpatched", "patched"]
    assert all(line.split(":", 1)[1].lstrip().startswith("not run: ") for line in result.run_lines())
    assert result.agent_lines() == ["NIXL agent: none (no sandbox run started)"]
    text, page = _text(result), result._repr_html_()
    assert _claims(text) == [] and _claims(page) == [], (text, page)
    assert "no scenario step ran" in page


@pytest.mark.server
@pytest.mark.timeout(180)
def test_a_patched_file_that_does_not_load_claims_nothing_for_the_patched_run(tmp_path, monkeypatch) -> None:
    broken = tmp_path / "conn.py"
    broken.write_text('raise ImportError("the patched nixl/conn.py does not import")\n')
    monkeypatch.setattr(verify_module, "patched_file_for", lambda source, original: (broken, []))
    result = verify_release("0.5.15")
    assert result.verdict == "INCONCLUSIVE" and result.exit_code == 3
    assert result.patched.steps == [] and result.patched.summary().startswith("not run: ")
    assert result.checks == []
    # The unpatched run did run: its evidence stays, and the agent line names that run only.
    assert result.unpatched.complete and result.unpatched.died_at == "ABORT room 2"
    assert [line.split(":")[0] for line in result.agent_lines()] == ["NIXL agent (unpatched)"]
    patched_line = result.run_lines()[1]
    assert patched_line.startswith("patched:") and "alive" not in patched_line and "every step" not in patched_line
    text = _text(result)
    assert "patched:   not run: " in text and "bootstrap thread alive after every step" not in text
    document = result.to_dict()
    _contract(document)
    assert document["runs"]["patched"]["steps_run"] == 0 and document["runs"]["unpatched"]["steps_run"] == len(SCENARIO)


def test_a_run_cut_short_says_how_far_it_got() -> None:
    from patched_engine.verify import RunReport, StepReport

    run = RunReport("patched", error="sandbox child exited while answering 'send'")
    run.steps = [StepReport(step.name, True, {1: 1, 2: 1, 3: 1, 4: 1}) for step in SCENARIO[:3]]
    summary = run.summary()
    assert "every step" not in summary and "final rooms" not in summary
    assert f"each of the 3 steps that ran (of {len(SCENARIO)})" in summary
    assert f"stopped before '{SCENARIO[3].name}'" in summary and "sandbox failed" in summary
    assert run.stuck_rooms() == []  # rooms 3 and 4 were never bootstrapped: nothing is "stuck" yet
    assert verify_module.patched_checks(run) == []

