"""Property: any room id a router can draw bootstraps through the real loop, and an ABORT fails only its room."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from forensics.sandbox import EngineSandbox
from forensics.sglang_source import fetch

FAILED, WAITING = 0, 2
# mini_lb and the Rust router draw rooms from [0, 2**63); sglang turns a request with n > 1 into
# rooms room + i, so values at and above 2**63 occur too: rooms are exact over [0, 2**64). Each
# example also bootstraps the sibling room + 1 (the n > 1 case), the room an ABORT must leave alone.
ROOMS = st.integers(min_value=0, max_value=2**64 - 2)
# One sandbox serves every example, and a room that was failed stays failed in sglang (as it should:
# routers never reuse a room). So each example needs rooms no earlier example touched.
USED_ROOMS: set[int] = set()


@pytest.fixture(scope="module")
def fixed_release_sandbox():
    with EngineSandbox(fetch("0.5.23")) as sb:
        sb.send(sb.frames.registration())
        assert sb.settle() == "consumed"
        yield sb


@pytest.mark.timeout(300)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(room=ROOMS, pages=st.integers(min_value=0, max_value=16), abort=st.booleans())
# The boundaries no uniform draw is likely to hit: the gRPC router's 2**31 - 1, the last u63 room and
# its sibling 2**63 (room + 1 of a request with n > 1), and the top of the u64 range.
@pytest.mark.server
@example(room=0, pages=1, abort=True)
@example(room=2**31 - 1, pages=2, abort=True)
@example(room=2**63 - 1, pages=2, abort=True)
@example(room=2**63 + 1, pages=0, abort=False)
@example(room=2**64 - 2, pages=16, abort=True)
def test_any_room_bootstraps_and_an_abort_fails_only_that_room(fixed_release_sandbox, room, pages, abort):
    sb = fixed_release_sandbox
    sibling = room + 1
    assume(room not in USED_ROOMS and sibling not in USED_ROOMS)
    USED_ROOMS.update((room, sibling))
    sb.create_rooms([room, sibling])
    initial = sb.room_states()
    frames = sb.frames.transfer_info(room=room, pages=pages)
    assert frames[1] == str(room).encode()
    assert np.frombuffer(frames[5], dtype=np.int32).tolist() == list(range(pages))  # the page indices sent
    sb.send(frames)
    sb.send(sb.frames.transfer_info(room=sibling, pages=pages))
    assert sb.settle() == "consumed"
    before = sb.room_states()
    assert before[room] == before[sibling] == WAITING
    assert {r: s for r, s in before.items() if r not in (room, sibling)} == {
        r: s for r, s in initial.items() if r not in (room, sibling)}
    if abort:
        abort_frames = sb.frames.abort(room=room)
        assert abort_frames[1] == str(room).encode()
        sb.send(abort_frames)
        assert sb.settle() == "consumed"
    after = sb.room_states()
    assert after[room] == (FAILED if abort else WAITING)
    assert after[sibling] == WAITING
    assert {r: s for r, s in after.items() if r != room} == {r: s for r, s in before.items() if r != room}
    assert sb.thread_alive() and sb.exceptions() == []
