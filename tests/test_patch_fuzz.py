"""Hypothesis-driven hostile traffic against the PATCHED bootstrap loop of a vulnerable and a fixed release.

One long-lived sandbox per release; every example sends a sequence of hostile frames with
well-formed transfer infos for fresh rooms interleaved, then checks: the loop consumed it
all, the thread is alive, and every well-formed room is WaitingForInput. Hostile frames
only name rooms from a separate range, so they can never legitimately fail or bootstrap a
well-formed room.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.sandbox import EngineSandbox
from forensics.sglang_source import fetch
from patched_engine.fuzz import (
    GUARD,
    HOSTILE_ROOMS_START,
    OVERSIZE_BYTES,
    WELL_FORMED_ROOMS_START,
    FuzzSession,
    with_room,
)
from patched_engine.verify import patched_file_for

MIN_FRAMES_PER_RELEASE = 2000
WELL_FORMED = object()  # marker: a fresh room's transfer info goes here


def _names_a_well_formed_room(frame: list[bytes]) -> bool:
    """Whether part 1 reads as a room of the well-formed range (hostile frames must not)."""
    if len(frame) < 2:
        return False
    try:
        room = int(frame[1].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return False
    return WELL_FORMED_ROOMS_START <= room < HOSTILE_ROOMS_START


def hostile_frames(template: list[bytes]) -> st.SearchStrategy[list[bytes]]:
    part = st.binary(max_size=32)
    parts = st.lists(part, max_size=12)
    hostile_room = st.integers(HOSTILE_ROOMS_START, HOSTILE_ROOMS_START + 10**9)
    non_ascii = st.text(st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF, exclude_categories=["Cs"]),
                        min_size=1, max_size=8).map(str.encode)
    tags = st.sampled_from([GUARD, b"ABORT", b"WATERMARK", b"STAGING_RSP", b"ABORT_ACK", b"None", b""])
    # A 1 MiB part costs the loop ~30 ms; one hostile frame in 32 is oversize.
    oversize = st.sampled_from([GUARD, b"ABORT", b"X"]).map(lambda head: [head, b"7" * OVERSIZE_BYTES, *template[2:]])
    kinds = st.one_of(
        # random tags, known tags with junk after them
        st.tuples(st.one_of(part, tags), parts).map(lambda t: [t[0], *t[1]]),
        # a real transfer info cut short
        st.tuples(hostile_room, st.integers(1, len(template) - 1)).map(lambda t: with_room(template, t[0])[: t[1]]),
        # empty frames
        st.integers(1, 4).map(lambda n: [b""] * n),
        # non-ASCII where ASCII digits and names are expected
        st.tuples(st.sampled_from([GUARD, b"ABORT"]), non_ascii, st.lists(non_ascii, max_size=12)).map(
            lambda t: [t[0], t[1], *t[2]]
        ),
        # ABORT for rooms nobody created, well- and ill-formed
        st.tuples(hostile_room, st.integers(0, 70000)).map(
            lambda t: [b"ABORT", str(t[0]).encode(), b"127.0.0.1", str(t[1]).encode()]
        ),
        # registrations with garbage after the room "None"
        parts.map(lambda p: [GUARD, b"None", *p]),
        # a real transfer info with one part replaced
        st.tuples(hostile_room, st.integers(2, len(template) - 1), part).map(
            lambda t: [*with_room(template, t[0])[: t[1]], t[2], *with_room(template, t[0])[t[1] + 1:]]
        ),
    )
    mixed = st.integers(0, 31).flatmap(lambda pick: oversize if pick == 0 else kinds)
    return mixed.filter(lambda frame: not _names_a_well_formed_room(frame))


def hostile_class(frame: list[bytes]) -> str:
    """What an UNPATCHED loop does with it: every class below kills some release's loop."""
    if any(len(part) >= OVERSIZE_BYTES for part in frame):
        return "oversize"
    if frame[0] == b"ABORT":
        return "abort"  # the GUARD assert of 0.5.13 - 0.5.15.post1
    if frame[0] == GUARD:
        return "guard-led"  # short or damaged transfer infos and registrations: IndexError, ValueError, ...
    return "foreign"  # the GUARD assert of every release


def fuzz_patched(version: str) -> tuple[FuzzSession, Counter]:
    source = fetch(version)
    classes: Counter = Counter()
    patched, _ = patched_file_for(source, source.backend_file("nixl"))
    with EngineSandbox(source, conn_file=patched) as sandbox:
        session = FuzzSession(sandbox)
        hostile = hostile_frames(session.template)
        # About one frame in five is a well-formed transfer info for a fresh room.
        element = st.integers(0, 4).flatmap(lambda pick: st.just(WELL_FORMED) if pick == 0 else hostile)
        sequences = st.lists(element, min_size=20, max_size=50)

        @settings(max_examples=75, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
        @given(sequence=sequences)
        def loop_survives(sequence) -> None:
            rooms = session.fresh_rooms(sum(1 for f in sequence if f is WELL_FORMED) + 1)
            pending = list(rooms)
            for frame in sequence:
                if frame is WELL_FORMED:
                    session.send("well-formed", session.well_formed(pending.pop()))
                else:
                    classes[hostile_class(frame)] += 1
                    session.send("hostile", frame)
            session.send("well-formed", session.well_formed(pending.pop()))  # at least one per example
            assert session.settle(), session.tally.first_killing_frame
            assert session.rooms_not_bootstrapped(rooms) == {}

        try:
            loop_survives()
            assert sandbox.thread_alive()
            assert sandbox.exceptions() == []
        finally:
            session.close()
    return session, classes


@pytest.mark.server
@pytest.mark.timeout(600)
@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_patched_loop_survives_hostile_traffic(version: str) -> None:
    session, classes = fuzz_patched(version)
    tally = session.tally
    assert tally.deaths == 0 and tally.first_killing_frame is None
    assert tally.frames >= MIN_FRAMES_PER_RELEASE, tally.frames
    assert tally.by_kind["hostile"] > tally.by_kind["well-formed"] > 100
    assert len(tally.well_formed_rooms) == tally.by_kind["well-formed"]
    # The strategies did send what kills the unpatched loops, each class many times over.
    assert sum(classes.values()) == tally.by_kind["hostile"]
    assert min(classes[c] for c in ("foreign", "abort", "guard-led")) >= 100 and classes["oversize"] >= 10, classes
    print(f"sglang {version}: {tally.frames} frames, {tally.by_kind}, {dict(classes)}")
