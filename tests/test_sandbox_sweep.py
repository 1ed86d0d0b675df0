"""Slow: every 0.5.x release through the sandbox; the vulnerable window must come out of behaviour."""

from __future__ import annotations

import pytest

from forensics.sandbox import EngineSandbox, SandboxError
from forensics.sglang_source import SourceError, available_releases, fetch

WAITING = 2


def abort_outcome(version: str, backend: str = "nixl") -> tuple[str, str]:
    """What an ABORT does to this release's prefill loop (``backend``), after registration and one transfer
    info bootstrapped room 1: (same-version decode, newer 0.5.13-0.5.21 decode).

    Each is "kills the loop" or "survives"; the first is "no abort sender" when the release's
    decode sends none; both are "inconclusive: <why>" when the sandbox could not run it.
    """
    try:
        source = fetch(version)
        with EngineSandbox(source, backend=backend) as sb:
            sb.create_rooms([1, 2, 3])
            sb.send(sb.frames.registration())
            sb.send(sb.frames.transfer_info(room=1))
            if sb.settle() != "consumed" or sb.room_states().get(1) != WAITING:
                why = f"inconclusive: registration + transfer info did not bootstrap room 1 ({sb.exceptions()})"
                return why, why
            try:
                abort = sb.frames.abort(room=2)
                same_version = None
            except SandboxError:
                abort = sb.frames.abort_from_newer_decode(room=2)
                same_version = "no abort sender"
            sb.send(abort)
            sb.send(sb.frames.transfer_info(room=3))
            if sb.settle() == "thread dead":
                deaths = [e for e in sb.exceptions() if e["bootstrap_thread"]]
                if len(deaths) != 1:
                    why = f"inconclusive: the loop ended without one exception of its own ({sb.exceptions()})"
                    return why, why
                outcome = "kills the loop"
            elif sb.thread_alive() and sb.room_states().get(3) == WAITING and sb.exceptions() == []:
                outcome = "survives"  # and still bootstraps the room after the ABORT
            else:
                why = f"inconclusive: alive but room 3 not bootstrapped after the ABORT ({sb.room_states()})"
                return why, why
            return same_version or outcome, outcome
    except (SandboxError, SourceError) as exc:
        return f"inconclusive: {exc}", f"inconclusive: {exc}"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sweep_finds_the_vulnerable_window_from_behaviour():
    releases = available_releases("0.5.1", "0.5.23")
    assert len(releases) == 42
    outcomes = {version: abort_outcome(version) for version in releases}
    inconclusive = {v: o for v, o in outcomes.items() if o[0].startswith("inconclusive")}
    assert not inconclusive, inconclusive
    window = [v for v in releases if outcomes[v][0] == "kills the loop"]
    assert window == ["0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1"], outcomes
    before, fixed = releases[: releases.index("0.5.13")], releases[releases.index("0.5.16"):]
    assert all(outcomes[v][0] == "no abort sender" for v in before)
    assert all(outcomes[v][0] == "survives" for v in fixed)
    # Mixed versions: every NIXL prefill up to 0.5.15.post1 dies on a newer decode's ABORT.
    assert [v for v in releases if outcomes[v][1] == "kills the loop"] == before + window


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sweep_mooncake_handles_its_own_abort_but_older_loops_die_on_a_newer_decodes():
    releases = available_releases("0.5.1", "0.5.23")
    assert len(releases) == 42
    outcomes = {version: abort_outcome(version, "mooncake") for version in releases}
    inconclusive = {v: o for v, o in outcomes.items() if o[0].startswith("inconclusive")}
    assert not inconclusive, inconclusive
    first_sender = releases.index("0.5.13")
    before, after = releases[:first_sender], releases[first_sender:]
    assert all(outcomes[v] == ("no abort sender", "kills the loop") for v in before), outcomes
    assert all(outcomes[v] == ("survives", "survives") for v in after), outcomes
