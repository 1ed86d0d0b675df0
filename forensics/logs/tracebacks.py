"""Group the lines of CPython thread-death tracebacks into one block per thread.

CPython's default ``threading.excepthook`` writes ``Exception in thread NAME (TARGET):``
then the traceback, line by line, with no log prefix. Two threads dying together can
interleave their lines, so open blocks are tracked side by side and each new line
goes to the block whose traceback grammar expects it (oldest first among equals).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HEADER = re.compile(r"^Exception in thread (?P<thread>.+?)(?: \((?P<target>[^()]*)\))?:\s*$")
TRACEBACK = "Traceback (most recent call last):"
CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# An exception name has a lower-case letter somewhere (AssertionError, zmq.error.Again), which
# keeps "INFO:     ..." access lines and shouting log lines out.
EXCEPTION_LINE = re.compile(r"^(?=[\w.]*[a-z])[A-Za-z_][\w.]*(?:: .*|:)?$")
STALE_AFTER_LINES = 400  # an open block this far behind is closed as incomplete


def line_kind(text: str) -> str:
    """header | traceback | file | code | chain | exception | blank | other"""
    if not text.strip():
        return "blank"
    if text.startswith("Exception in thread ") and HEADER.match(text):
        return "header"
    if text.startswith(TRACEBACK):
        return "traceback"
    if text.startswith('  File "'):
        return "file"
    if text.startswith("    ") or text.startswith("  ") and not text.startswith("  File"):
        return "code"
    if text.startswith(CHAIN_MARKERS):
        return "chain"
    if EXCEPTION_LINE.match(text):
        return "exception"
    return "other"


@dataclass
class Block:
    thread: str | None  # None: a traceback sglang logged itself (logger.exception), no thread header
    target: str | None
    first_line: int
    first_offset: int
    first_ts: object  # whatever the scanner uses for a line's time (may be None)
    lines: list[str] = field(default_factory=list)
    last_kind: str = "header"
    last_line: int = 0
    final: str | None = None
    done: bool = False
    owner: dict | None = None  # the event a logger.exception traceback belongs to
    host: str | None = None
    unit: str | None = None
    upper: tuple | None = None  # time of the next timed line when first_ts was inferred

    @property
    def label(self) -> str:
        if self.thread is None:
            return "(logged traceback)"
        return f"{self.thread} ({self.target})" if self.target else self.thread

    def frames(self) -> list[tuple[str, int, str]]:
        """(file, line, function) of each traceback frame, innermost last."""
        found = []
        for text in self.lines:
            match = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', text)
            if match:
                found.append((match.group(1), int(match.group(2)), match.group(3)))
        return found


# What each kind of line may follow, in order of preference.
_ACCEPTS = {
    "traceback": ("header", "chain"),
    "file": ("traceback", "code", "file"),
    "code": ("file", "code"),
    "exception": ("code", "file"),
}


class BlockTracker:
    """Open thread-death blocks of one source, fed line by line in file order."""

    def __init__(self) -> None:
        self.open: list[Block] = []
        self.recently_done: list[Block] = []

    @property
    def active(self) -> bool:
        return bool(self.open)

    def start(self, block: Block) -> None:
        if block.thread is None:
            block.lines.append(TRACEBACK)
            block.last_kind = "traceback"
        else:
            block.lines.append(f"Exception in thread {block.label}:")
        block.last_line = block.first_line
        self.open.append(block)

    def expects(self, kind: str) -> bool:
        wanted = _ACCEPTS.get(kind, ())
        return any(block.last_kind in wanted for block in self.open)

    def offer(self, text: str, kind: str, line_no: int) -> tuple[bool, Block | None]:
        """Give a line to the blocks. Returns (consumed, block that just completed)."""
        if kind == "blank":
            return bool(self.open), None
        if kind == "chain":
            # A chained exception reopens the block that just printed its exception line.
            if self.recently_done:
                block = self.recently_done.pop()
                block.done = False
                block.last_kind = "chain"
                block.lines.append(text)
                self.open.append(block)
                return True, None
            return False, None
        wanted = _ACCEPTS.get(kind)
        if wanted is None:
            return False, None
        for preferred in wanted:
            for block in self.open:
                if block.last_kind == preferred:
                    block.lines.append(text)
                    block.last_kind = kind
                    block.last_line = line_no
                    if kind == "exception":
                        block.final = text
                        block.done = True
                        self.open.remove(block)
                        self.recently_done = [block]
                        return True, block
                    return True, None
        return False, None

    def expire(self, line_no: int) -> list[Block]:
        """Close blocks that stopped receiving lines long ago (a truncated traceback)."""
        stale = [b for b in self.open if line_no - b.last_line > STALE_AFTER_LINES]
        for block in stale:
            self.open.remove(block)
            block.final = block.final or "(traceback incomplete: no final exception line)"
        return stale

    def close_all(self) -> list[Block]:
        blocks, self.open = self.open, []
        for block in blocks:
            block.final = block.final or "(traceback incomplete: input ended before the exception line)"
        return blocks
