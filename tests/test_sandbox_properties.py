"""Property: any room id a router can draw bootstraps through the real loop, and an ABORT fails only its room."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from forensics.sandbox import EngineSandbox
from forensics.sglang_source import fetch

FAILED, WAITING = 0, 2
ROOMS = st.integers(min_value=0, max_value=2**63 - 1)  # mini_lb / the Rust router: random u63
# One sandbox serves every example, and a room that was failed stays failed in sglang (as it should:
# routers never reuse a room). So each example needs a room no earlier example touched.
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
def test_any_room_bootstraps_and_an_abort_fails_only_that_room(fixed_release_sandbox, room, pages, abort):
    sb = fixed_release_sandbox
    assume(room not in USED_ROOMS)
    USED_ROOMS.add(room)
    sb.create_rooms([room])
    frames = sb.frames.transfer_info(room=room, pages=pages)
    assert frames[1] == str(room).encode()
    assert np.frombuffer(frames[5], dtype=np.int32).tolist() == list(range(pages))  # the page indices sent
    before = sb.room_states()
    sb.send(frames)
    if abort:
        sb.send(sb.frames.abort(room=room))
    assert sb.settle() == "consumed"
    after = sb.room_states()
    assert after[room] == (FAILED if abort else WAITING)
    assert {r: s for r, s in after.items() if r != room} == {r: s for r, s in before.items() if r != room}
    assert sb.thread_alive() and sb.exceptions() == []
