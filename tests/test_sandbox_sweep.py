"""Slow: every 0.5.x release through the sandbox; the vulnerable window must come out of behaviour."""

from __future__ import annotations

import pytest

from forensics.sandbox import EngineSandbox, SandboxError
from forensics.sglang_source import SourceError, available_releases, fetch

WAITING = 2


def same_version_abort_outcome(version: str) -> str:
    """What a same-version decode's ABORT does to this release's NIXL prefill loop.

    "no abort sender", "kills the loop" or "survives" (after registration and one transfer
    info worked), or "inconclusive: <why>".
    """
    try:
        source = fetch(version)
        with EngineSandbox(source) as sb:
            sb.create_rooms([1, 2, 3])
            sb.send(sb.frames.registration())
            sb.send(sb.frames.transfer_info(room=1))
            if sb.settle() != "consumed" or sb.room_states().get(1) != WAITING:
                return f"inconclusive: registration + transfer info did not bootstrap room 1 ({sb.exceptions()})"
            try:
                abort = sb.frames.abort(room=2)
            except SandboxError:
                return "no abort sender"
            sb.send(abort)
            sb.send(sb.frames.transfer_info(room=3))
            return "kills the loop" if sb.settle() == "thread dead" else "survives"
    except (SandboxError, SourceError) as exc:
        return f"inconclusive: {exc}"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_sweep_finds_the_vulnerable_window_from_behaviour():
    releases = available_releases("0.5.1", "0.5.23")
    assert len(releases) == 42
    outcomes = {version: same_version_abort_outcome(version) for version in releases}
    inconclusive = {v: o for v, o in outcomes.items() if o.startswith("inconclusive")}
    assert not inconclusive, inconclusive
    window = [v for v in releases if outcomes[v] == "kills the loop"]
    assert window == ["0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1"], outcomes
    first_sender = releases.index("0.5.13")
    assert all(outcomes[v] == "no abort sender" for v in releases[:first_sender])
    assert all(outcomes[v] == "survives" for v in releases[releases.index("0.5.16"):])
