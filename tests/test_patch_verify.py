"""``verify_release`` in the real engine sandbox: the unpatched death next to the patched survival."""

from __future__ import annotations

import pytest
from rich.console import Console

from forensics.sglang_source import available_releases, fetch
from patched_engine import verify as verify_module
from patched_engine.codemod import patch_source
from patched_engine.verify import (
    ABORT_STEP,
    BOOTSTRAPPING,
    FAILED,
    WAITING_FOR_INPUT,
    run_scenario,
    verify_release,
)

PATCHED_FINAL = {1: WAITING_FOR_INPUT, 2: FAILED, 3: WAITING_FOR_INPUT, 4: WAITING_FOR_INPUT}


def _messages(step) -> list[str]:
    return [r.get("message", "") for r in step.logs]


@pytest.mark.server
@pytest.mark.timeout(180)
def test_fixed_release_survives_abort_but_dies_on_a_foreign_frame_unless_patched() -> None:
    result = verify_release("0.5.23")
    assert result.verdict == "PASS" and result.exit_code == 0
    # 0.5.23 handles ABORT itself (room 2 Failed) but its GUARD assert kills the loop on the foreign frame.
    unpatched = {s.name: s for s in result.unpatched.steps}
    assert unpatched[ABORT_STEP].thread_alive and unpatched[ABORT_STEP].room_states[2] == FAILED
    assert result.unpatched.died_at == "foreign frame"
    assert unpatched["foreign frame"].exceptions[0]["exc_type"] == "AssertionError"
    assert "Foreign traffic?" in unpatched["foreign frame"].exceptions[0]["message"]
    assert result.unpatched.final_states == {1: WAITING_FOR_INPUT, 2: FAILED, 3: WAITING_FOR_INPUT, 4: BOOTSTRAPPING}
    assert not result.vulnerable
    # Patched: alive throughout, the foreign frame dropped with a WARNING that names it.
    assert result.patched.died_at is None
    assert result.patched.final_states == PATCHED_FINAL
    patched = {s.name: s for s in result.patched.steps}
    assert any("Dropping a message on the bootstrap socket" in m and "FOREIGN" in m for m in _messages(patched["foreign frame"]))
    assert all(not s.exceptions for s in result.patched.steps)
    assert [s["status"] for s in result.patch_steps] == ["skipped", "applied", "applied", "applied", "skipped"]

    # It renders itself.
    frame = result.to_frame()
    assert len(frame) == 2 * len(verify_module.SCENARIO)
    row = frame[(frame.run == "unpatched") & (frame.step == "bootstrap room 4")].iloc[0]
    assert (bool(row.thread_alive), row.room_4) == (False, "Bootstrapping")
    console = Console(record=True, width=100)
    console.print(result)
    text = console.export_text()
    assert "PASS" in text and "DEAD" in text and "W F W W" in text and "W F W B" in text
    assert "foreign frame" in result._repr_html_()
    assert result.to_dict()["runs"]["patched"]["final_room_states"] == {
        "1": "WaitingForInput", "2": "Failed", "3": "WaitingForInput", "4": "WaitingForInput"
    }


@pytest.mark.server
@pytest.mark.timeout(180)
def test_a_patch_that_does_not_fix_the_loop_fails(monkeypatch) -> None:
    # Hand verify the unpatched file as if it were the patched one: the verdict must be FAIL.
    monkeypatch.setattr(verify_module, "patched_file_for", lambda source, original: (original, []))
    result = verify_release("0.5.15")
    assert result.verdict == "FAIL" and result.exit_code == 1
    failed = {c.name for c in result.checks if not c.ok}
    assert failed == {"thread alive after every step", "room 2 Failed", "room 3 WaitingForInput", "room 4 WaitingForInput"}
    assert result.patched.died_at == ABORT_STEP


@pytest.mark.server
@pytest.mark.timeout(180)
def test_behaviour_follows_the_code_not_the_version(tmp_path) -> None:
    """0.5.16 with its ABORT case removed dies on ABORT again; the codemod puts a case back."""
    source = fetch("0.5.16")
    original = source.backend_file("nixl").read_text()
    call = "                if self._handle_abort_notification(waiting_req_bytes):\n                    continue\n"
    assert call in original
    stripped = tmp_path / "stripped" / "conn.py"
    stripped.parent.mkdir()
    stripped.write_text(original.replace(call, ""))
    repaired = tmp_path / "repaired" / "conn.py"
    repaired.parent.mkdir()
    repaired.write_text(patch_source(stripped.read_text(), "0.5.16").new_text)

    dead = run_scenario(source, stripped, "unpatched")
    assert dead.died_at == ABORT_STEP
    assert "Foreign traffic?" in dead.death
    assert dead.stuck_rooms() == [3, 4]

    alive = run_scenario(source, repaired, "patched")
    assert alive.died_at is None
    assert alive.final_states == PATCHED_FINAL
    abort_step = next(s for s in alive.steps if s.name == ABORT_STEP)
    assert "Received abort notification for room 2, marked as Failed" in _messages(abort_step)
    assert [r["level"] for r in abort_step.logs
            if r.get("message") == "Received abort notification for room 2, marked as Failed"] == ["INFO"]


@pytest.mark.timeout(120)
def test_missing_release_is_inconclusive() -> None:
    result = verify_release("0.5.99")
    assert result.verdict == "INCONCLUSIVE" and result.exit_code == 3
    assert "0.5.99" in result.reasons[0]
    # Nothing ran, so nothing may be claimed about steps or checks.
    assert not any(check.ok for check in result.checks)
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(result)
    assert "alive after every step" not in console.export_text()


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.timeout(7200)
def test_verify_every_release_and_find_the_vulnerable_window() -> None:
    releases = available_releases("0.5.1", "0.5.23")
    results = {version: verify_release(version) for version in releases}
    inconclusive = {v: r.reasons for v, r in results.items() if r.verdict != "PASS"}
    assert not inconclusive
    vulnerable = [v for v, r in results.items() if r.vulnerable]
    assert vulnerable == ["0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1"]
    # Every release (fixed ones included) still died on some foreign frame before the patch.
    assert all(r.unpatched.died_at is not None for r in results.values())
