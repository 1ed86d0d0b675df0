"""Hostile decode->prefill traffic for the bootstrap loop, and the bookkeeping of a fuzz session.

Frames come in two kinds:

* *well-formed*: the release's own transfer-info frame (built once by its decode code in
  the sandbox) with the room part replaced; each gets a fresh room that was first created
  on the prefill, so after the loop consumed it that room must be WaitingForInput;
* *hostile*: random tags, truncated and emptied frames, non-ASCII and oversize parts,
  malformed ABORTs and staging tags, mutated copies of real frames. They only ever name
  rooms from a separate range, so they can never legitimately fail or bootstrap a
  well-formed room; whatever they do, the patched loop must survive them.

:class:`HostileFrames` is a seeded generator (the soak benchmark's 100,000 frames); the
tests draw the same kinds through Hypothesis strategies built on :data:`KINDS`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

GUARD = b"NixlMsgGuard"
WELL_FORMED_ROOMS_START = 1_000_000
HOSTILE_ROOMS_START = 7_000_000_000
OVERSIZE_BYTES = 1 << 20  # one part of 1 MiB; ZMQ and the loop take it whole

KINDS = (
    "random-tag",
    "truncated",
    "empty",
    "non-ascii",
    "oversize",
    "abort-malformed",
    "abort-unknown-room",
    "staging-tag",
    "registration-garbage",
    "mutated-transfer-info",
    "guard-only",
)


def with_room(template: list[bytes], room: int) -> list[bytes]:
    """A copy of a GUARD-led frame (transfer info: ``[GUARD, room, ...]``) for another room."""
    frame = list(template)
    frame[1] = str(room).encode("ascii")
    return frame


@dataclass
class HostileFrames:
    """Seeded generator of hostile frames, derived from a real transfer-info ``template``."""

    template: list[bytes]
    seed: int = 0
    rng: random.Random = field(init=False)
    next_room: int = field(init=False, default=HOSTILE_ROOMS_START)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def room(self) -> bytes:
        self.next_room += 1
        return str(self.next_room).encode("ascii")

    def junk(self, max_len: int = 24) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_len))

    def frame(self, kind: str | None = None) -> tuple[str, list[bytes]]:
        kind = kind or self.rng.choice(KINDS)
        return kind, getattr(self, "_" + kind.replace("-", "_"))()

    def __iter__(self) -> Iterator[tuple[str, list[bytes]]]:
        while True:
            yield self.frame()

    # -- kinds ---------------------------------------------------------------------------

    def _random_tag(self) -> list[bytes]:
        return [self.junk(16) or b"X", *[self.junk() for _ in range(self.rng.randint(0, 12))]]

    def _truncated(self) -> list[bytes]:
        frame = with_room(self.template, int(self.room()))
        return frame[: self.rng.randint(1, len(frame) - 1)]

    def _empty(self) -> list[bytes]:
        return [b""] * self.rng.randint(1, 4)

    def _non_ascii(self) -> list[bytes]:
        text = self.rng.choice(["комната".encode(), "房间".encode(), b"\xe9", b"\xff\xfe\xfd"])
        head = self.rng.choice([GUARD, b"ABORT", text])
        return [head, text, *[self.rng.choice([text, b"\x80"])] * self.rng.randint(0, 10)]

    def _oversize(self) -> list[bytes]:
        head = self.rng.choice([GUARD, b"ABORT", b"X"])
        return [head, b"9" * OVERSIZE_BYTES, *self.template[2:]]

    def _abort_malformed(self) -> list[bytes]:
        return self.rng.choice(
            [
                [b"ABORT"],
                [b"ABORT", b"not-a-room"],
                [b"ABORT", b""],
                [b"ABORT", self.room(), b"127.0.0.1", b"not-a-port"],
                [b"ABORT", b"-1", b"\xff", b"\xfe", b"extra", b"parts"],
            ]
        )

    def _abort_unknown_room(self) -> list[bytes]:
        return [b"ABORT", self.room(), b"127.0.0.1", str(self.rng.randint(1, 65535)).encode("ascii")]

    def _staging_tag(self) -> list[bytes]:
        return [self.rng.choice([b"WATERMARK", b"STAGING_RSP", b"ABORT_ACK", b"STAGING_REQ"]), *[self.junk() for _ in range(3)]]

    def _registration_garbage(self) -> list[bytes]:
        return [GUARD, b"None", *[self.junk() for _ in range(self.rng.randint(0, 20))]]

    def _mutated_transfer_info(self) -> list[bytes]:
        frame = with_room(self.template, int(self.room()))
        index = self.rng.randint(2, len(frame) - 1)
        frame[index] = self.junk()
        return frame

    def _guard_only(self) -> list[bytes]:
        return [GUARD]


@dataclass
class FuzzTally:
    """What a fuzz session sent and found."""

    frames: int = 0
    well_formed_rooms: list[int] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)
    deaths: int = 0
    first_killing_frame: dict | None = None

    def count(self, kind: str) -> None:
        self.frames += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1


def describe_frame(frame: list[bytes], limit: int = 48) -> dict:
    """A JSON-safe summary of one multipart message, for reports (parts truncated)."""
    return {
        "parts": len(frame),
        "sizes": [len(p) for p in frame],
        "head": [p[:limit].decode("latin-1") for p in frame[:6]],
    }
