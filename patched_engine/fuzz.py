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
# 1 MiB frames cost the loop ~30 ms each (decoding and int() of a megabyte "room"); drawn
# rarely so that a soak measures the loop, not memcpy.
DEFAULT_WEIGHTS = {kind: (0.05 if kind == "oversize" else 1.0) for kind in KINDS}


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
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
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
        kind = kind or self.rng.choices(KINDS, weights=[self.weights.get(k, 0.0) for k in KINDS])[0]
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


class FuzzSession:
    """Many frames through one long-lived :class:`~forensics.sandbox.EngineSandbox`.

    Frames go straight from a PUSH socket here to the loop's PULL endpoint (real ZMQ, no
    pipe round trip per frame); ``settle`` then asks the sandbox to wait until the loop has
    consumed everything sent so far, from both senders.
    """

    def __init__(self, sandbox, *, template_room: int = 999_999) -> None:
        import zmq

        self.sandbox = sandbox
        self.template = sandbox.frames.transfer_info(room=template_room)
        self.registration = sandbox.frames.registration()
        self.sandbox_sent = sandbox.send(self.registration)
        sandbox.settle()
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.setsockopt(zmq.SNDHWM, 0)
        self.push.connect(sandbox.endpoint)
        self.sent = 0  # by this session's socket
        self.next_room = WELL_FORMED_ROOMS_START
        self.tally = FuzzTally()
        self.recent: dict[int, tuple[str, list[bytes]]] = {}  # global message index -> frame, since last settle

    @property
    def total_sent(self) -> int:
        return self.sandbox_sent + self.sent

    def fresh_rooms(self, count: int) -> list[int]:
        """Rooms created on the prefill by the release's sender (Bootstrapping), for well-formed frames."""
        rooms = list(range(self.next_room, self.next_room + count))
        self.next_room += count
        if rooms:
            self.sandbox.create_rooms(rooms)
            self.tally.well_formed_rooms.extend(rooms)
        return rooms

    def well_formed(self, room: int) -> list[bytes]:
        return with_room(self.template, room)

    def send(self, kind: str, frame: list[bytes]) -> None:
        self.push.send_multipart(frame)
        self.sent += 1
        self.recent[self.total_sent] = (kind, frame)
        self.tally.count(kind)

    def settle(self, timeout: float = 60.0) -> bool:
        """Wait until the loop consumed everything; returns whether the thread is alive.

        On the first death, records which frame killed it (the sandbox reports how many
        messages the loop had received when the exception was raised).
        """
        status = self.sandbox.settle(timeout, expected=self.total_sent)
        alive = status == "consumed"
        if not alive and self.tally.first_killing_frame is None:
            self.tally.deaths += 1
            exceptions = self.sandbox.exceptions()
            record = exceptions[0] if exceptions else {}
            index = record.get("message_index")
            kind, frame = self.recent.get(index, ("unknown", []))
            self.tally.first_killing_frame = {
                "message_index": index,
                "kind": kind,
                "frame": describe_frame(frame),
                "exception": f"{record.get('exc_type')}: {record.get('message')}",
                "line": f"{record.get('file')}:{record.get('line')}",
            }
        self.recent.clear()
        return alive

    def rooms_not_bootstrapped(self, rooms: list[int]) -> dict[int, int | None]:
        """Well-formed rooms whose state is not WaitingForInput (2), with the state found."""
        states = self.sandbox.room_states()
        return {room: states.get(room) for room in rooms if states.get(room) != 2}

    def close(self) -> None:
        self.push.close(linger=0)
        self.context.term()
