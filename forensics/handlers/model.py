"""The handler map's data: frames, branches, loops, outcomes, findings and gaps.

Plain dataclasses with ``to_dict`` for JSON; the analysis fills them and the
renderers read them. Fates are a small closed vocabulary so tables and the CLI
can branch on them.

Whatever the analysis could not read or could not interpret is an :class:`Unreadable`
with its file and line: a verdict of "clean" is never given over it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from forensics.exitcodes import ExitStatus, Undecided

# What happens to a frame in a receiver loop.
HANDLED = "handled"
DROPPED_WARNING = "dropped with warning"
DROPPED_LOGGED = "dropped, exception logged"  # a per-message try/except caught what it raised
DROPPED_SILENTLY = "dropped silently"
DIES = "thread dies"
UNREAD = "no reader"  # sent to a role whose backend runs no receiver loop
NOT_READ = "not read"  # the backend's code could not be read (a conn.py that does not parse)
NOT_UNDERSTOOD = "not understood"  # the loop was read but the analysis could not interpret it
FATES = (HANDLED, DROPPED_WARNING, DROPPED_LOGGED, DROPPED_SILENTLY, DIES, UNREAD, NOT_READ, NOT_UNDERSTOOD)

CRITICAL = "critical"
WARNING = "warning"

# Verdict words of a handler map or diff (the CLI's JSON ``status``) and their exit statuses.
FINDINGS = "findings"
INCONCLUSIVE = "inconclusive"
CLEAN = "clean"
VERDICT_STATUS = {FINDINGS: ExitStatus.BAD, INCONCLUSIVE: ExitStatus.INCONCLUSIVE, CLEAN: ExitStatus.GOOD}

# Why a part of the code could not be read or understood (``Unreadable.kind``).
UNPARSEABLE = "unparseable"  # a file that does not parse (SyntaxError, null bytes, nesting too deep)
UNREADABLE_FILE = "unreadable-file"  # a file that cannot be read (permissions, not UTF-8)
NO_MANAGER = "no-manager"  # a backend conn.py without a *KVManager class
NO_LOOP = "no-loop"  # a backend whose manager starts no (prefill) receiver loop the analysis recognises
NO_READER = "no-reader"  # a message sent to a role for which no receiver loop was found
ROLE_UNKNOWN = "role-unknown"  # a receiver loop whose role (prefill/decode) could not be told
NOT_INTERPRETED = "loop-not-interpreted"  # a loop construct the interpreter does not model
ANALYSIS_ERROR = "analysis-error"  # the analysis itself failed on this loop
UNREADABLE_KINDS = (UNPARSEABLE, UNREADABLE_FILE, NO_MANAGER, NO_LOOP, NO_READER, ROLE_UNKNOWN, NOT_INTERPRETED,
                    ANALYSIS_ERROR)

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


@dataclass(frozen=True)
class Unreadable:
    """A part of a release's code the analysis could not read, or read and could not interpret.

    ``file`` is relative to the ``disaggregation`` directory (``nixl/conn.py``), as everywhere
    in the map; ``path`` is the absolute path. ``line`` is 1-based (a SyntaxError's line, the
    line of the construct the interpreter does not model); None only when no line applies (a
    file that cannot be opened, a file without the class looked for). ``backend`` is the
    backend it blinds, None for a shared file (``common/``, ``base/``) every backend may use.
    """

    file: str
    line: int | None
    backend: str | None
    reason: str
    kind: str = NOT_INTERPRETED
    path: str = ""

    @property
    def where(self) -> str:
        return self.file if self.line is None else f"{self.file}:{self.line}"

    def __str__(self) -> str:
        scope = f"{self.backend}: " if self.backend else "shared: "
        return f"{scope}{self.where}: {self.reason}"

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "line": self.line,
            "backend": self.backend,
            "kind": self.kind,
            "reason": self.reason,
            "path": self.path,
        }


class UnreadableSource(Undecided):
    """The analysis could not read or interpret part of the code, so it cannot call it clean (exit 3).

    ``unreadable`` lists every part with its file and line; the message names them.
    """

    def __init__(self, message: str, unreadable: list[Unreadable] | None = None) -> None:
        super().__init__(message)
        self.unreadable = list(unreadable or [])


class UnreadableBackend(UnreadableSource, KeyError):
    """``HandlerMap.backend(name)`` for a backend whose code is there but could not be read.

    Still a KeyError (no mapped backend by that name), and INCONCLUSIVE if it ends a command.
    """

    def __str__(self) -> str:
        return Exception.__str__(self)


def describe_unreadable(unreadable: list[Unreadable], limit: int = 3) -> str:
    """One line naming the first few unreadable parts by file and line."""
    shown = "; ".join(str(u) for u in unreadable[:limit])
    more = f" (and {len(unreadable) - limit} more)" if len(unreadable) > limit else ""
    return shown + more


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
    # What the interpreter met in this loop (or a helper it followed) and could not interpret:
    # any entry makes every outcome of this loop a guess, so nothing here is called clean.
    not_understood: list[Unreadable] = field(default_factory=list)

    @property
    def understood(self) -> bool:
        return not self.not_understood

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
            "understood": self.understood,
            "not_understood": [u.to_dict() for u in self.not_understood],
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
    # Set when the receiving loop was not fully understood: the fate is then the analysis's best
    # reading, not a fact, and the finding does not decide a verdict on its own.
    caveat: str = ""

    @property
    def certain(self) -> bool:
        return not self.caveat

    def to_dict(self) -> dict:
        return asdict(self)
