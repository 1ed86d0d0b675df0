"""The handler map's data: frames, branches, loops, outcomes, findings and gaps.

Plain dataclasses with ``to_dict`` for JSON; the analysis fills them and the
renderers read them. Fates are a small closed vocabulary so tables and the CLI
can branch on them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# What happens to a frame in a receiver loop.
HANDLED = "handled"
DROPPED_WARNING = "dropped with warning"
DROPPED_LOGGED = "dropped, exception logged"  # a per-message try/except caught what it raised
DROPPED_SILENTLY = "dropped silently"
DIES = "thread dies"
UNREAD = "no reader"  # sent to a role whose backend runs no receiver loop
FATES = (HANDLED, DROPPED_WARNING, DROPPED_LOGGED, DROPPED_SILENTLY, DIES, UNREAD)

CRITICAL = "critical"
WARNING = "warning"

PREFILL = "prefill"
DECODE = "decode"
ROLES = (PREFILL, DECODE)

FOREIGN_TAG = b"<unknown tag>"


def opposite(role: str) -> str:
    return DECODE if role == PREFILL else PREFILL


@dataclass(frozen=True)
class Element:
    """One ZMQ frame as the analysis sees it: a known constant, numeric text, other text, or opaque bytes."""

    kind: str  # "const", "num", "text", "bytes"
    value: bytes | None = None

    def label(self) -> str:
        if self.kind == "const" and self.value is not None:
            return self.value.decode("ascii", "replace")
        return {"num": "<int>", "text": "<text>", "bytes": "<bytes>"}.get(self.kind, "<?>")


@dataclass(frozen=True)
class FrameShape:
    """A multipart message: its leading elements, and how many optional ones may follow."""

    elements: tuple[Element, ...]
    optional: tuple[Element, ...] = ()

    @property
    def arity(self) -> tuple[int, int]:
        return len(self.elements), len(self.elements) + len(self.optional)

    def full(self) -> FrameShape:
        return FrameShape(self.elements + self.optional)

    def tag(self) -> str:
        """The dispatch key a receiver looks at: the first frame, plus the second after a guard."""
        if not self.elements:
            return "<empty>"
        first = self.elements[0]
        if first.kind == "num":
            return "<room>"
        label = first.label()
        if first.kind == "const" and len(self.elements) > 1 and first.value not in (b"None",):
            second = self.elements[1]
            # A guard frame (NixlMsgGuard, MoriMsgGuard) is followed by the real key.
            if label.endswith("Guard") and second.kind in ("const", "num"):
                return f"{label}+{'<room>' if second.kind == 'num' else second.label()}"
        return label

    def describe(self) -> str:
        low, high = self.arity
        arity = f"{low}" if low == high else f"{low}-{high}"
        shown = ", ".join(e.label() for e in self.elements[:4])
        return f"[{shown}{', ...' if low > 4 else ''}] ({arity} frames)"


@dataclass
class SentMessage:
    """A frame some side builds and sends over ZMQ to the other side's PULL socket."""

    backend: str
    sender_role: str  # the role that sends: decode -> prefill loop, prefill -> decode loop
    tag: str
    shape: FrameShape
    file: str
    line: int
    function: str
    via: list[str] = field(default_factory=list)  # callers of the sending function (abort, timeout, ...)
    conditions: list[str] = field(default_factory=list)  # guards seen on the way to the send

    @property
    def receiver_role(self) -> str:
        return opposite(self.sender_role)

    def to_dict(self) -> dict:
        low, high = self.shape.arity
        return {
            "backend": self.backend,
            "sender_role": self.sender_role,
            "receiver_role": self.receiver_role,
            "tag": self.tag,
            "frames": [e.label() for e in self.shape.elements] + [f"[{e.label()}]" for e in self.shape.optional],
            "arity": [low, high],
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "via": self.via,
            "conditions": self.conditions,
        }


@dataclass
class Branch:
    """One case of a loop's ordered dispatch."""

    order: int
    tags: list[str]
    kind: str  # "tag", "helper", "guard-assert", "guard-check", "registration", "room", "status", "fallback"
    summary: str
    file: str
    line: int
    end_line: int
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Outcome:
    """What one frame does to one loop."""

    fate: str
    detail: str
    file: str
    line: int
    branch: str = ""  # the branch that took it, by its summary or tag
    conditional: bool = False  # a non-frame condition (a feature flag) was assumed off on the way
    source: str = ""  # the lines that decide this outcome

    @property
    def kills(self) -> bool:
        return self.fate == DIES

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ReceiverLoop:
    """A thread that reads a backend's PULL socket in a ``while`` loop."""

    backend: str  # where the loop is defined (ascend's loops are mooncake's)
    role: str
    function: str
    file: str
    line: int
    end_line: int
    branches: list[Branch]
    foreign: Outcome  # a frame with a tag no branch matches
    foreign_short: Outcome  # the same with a single frame (IndexError risk)
    per_message_try: bool
    wrapper: str  # "none", "logs and re-raises", "swallows"
    daemon: bool | None
    started_at: str  # file:line of the threading.Thread(...) call
    target: str
    source: str
    inherited_from: str | None = None
    recv_helper: str | None = None  # a wrapper that consumes some frames before the loop sees them

    @property
    def dies_on_unknown(self) -> bool:
        return self.foreign.kills or self.foreign_short.kills

    def to_dict(self, with_source: bool = False) -> dict:
        data = {
            "backend": self.backend,
            "role": self.role,
            "function": self.function,
            "file": self.file,
            "line": self.line,
            "end_line": self.end_line,
            "branches": [b.to_dict() for b in self.branches],
            "unknown_frame": self.foreign.to_dict(),
            "unknown_single_frame": self.foreign_short.to_dict(),
            "dies_on_unknown": self.dies_on_unknown,
            "per_message_try": self.per_message_try,
            "wrapper": self.wrapper,
            "daemon": self.daemon,
            "started_at": self.started_at,
            "target": self.target,
            "inherited_from": self.inherited_from,
            "recv_helper": self.recv_helper,
        }
        if with_source:
            data["source"] = self.source
        return data


@dataclass
class Delivery:
    """One sent message evaluated against one receiver loop of the other side."""

    message: SentMessage
    loop: ReceiverLoop | None
    outcome: Outcome

    def to_dict(self) -> dict:
        return {
            "tag": self.message.tag,
            "sender_role": self.message.sender_role,
            "sender": f"{self.message.file}:{self.message.line} {self.message.function}",
            "via": self.message.via,
            "receiver": None if self.loop is None else f"{self.loop.file}:{self.loop.line} {self.loop.function}",
            **{k: v for k, v in self.outcome.to_dict().items() if k != "source"},
        }


@dataclass
class Gap:
    """Something the analysis looked for and did not find; the map is partial there."""

    file: str
    looked_for: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.reason} (looked for {self.looked_for})"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Finding:
    """A tag some sender emits that a receiver loop does not handle, or a loop that dies on foreign frames."""

    version: str
    backend: str
    severity: str
    kind: str  # "unhandled-tag" or "dies-on-unknown-frame"
    tag: str
    receiver_role: str
    fate: str
    summary: str
    sender: str
    receiver: str
    file: str
    line: int
    conditions: list[str] = field(default_factory=list)
    confirmation: str = "not checked"  # the sandbox's word: "died", "survived", "not confirmed (...)"

    def to_dict(self) -> dict:
        return asdict(self)
