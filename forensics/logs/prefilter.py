"""Find the few lines of a chunk that contain any of many literals, in one pass when possible.

The catalogue gives every signature a literal that each of its lines contains; the
lines holding none of them never need a regex. Looking for ~30 literals with one
``bytes.find`` pass each reads the chunk ~30 times (about 35 MB/s on this project's
machines); Hyperscan (the ``hyperscan`` package, a wheel with the library inside)
matches all of them in a single pass at several hundred MB/s. Hyperscan is optional:
without it (no wheel for the platform) the ``bytes.find`` passes give the same lines.
"""

from __future__ import annotations

from collections.abc import Sequence

try:  # optional accelerator: pip install hyperscan (the "analysis" extra)
    import hyperscan
except ImportError:  # pragma: no cover - depends on the platform
    hyperscan = None

HYPERSCAN = "hyperscan"
BYTES_FIND = "bytes.find"


class LiteralPrefilter:
    """Line starts of the lines that contain at least one of ``literals``.

    A literal that starts with a newline ("\nE1") finds the line that begins after that newline
    (a line's start); the first line of ``data`` has no newline before it, so a caller that needs
    it checks it itself.

    ``engine`` forces ``"hyperscan"`` or ``"bytes.find"``; by default Hyperscan is used
    when it is installed.
    """

    def __init__(self, literals: Sequence[bytes], engine: str | None = None) -> None:
        self.literals = tuple(dict.fromkeys(bytes(lit) for lit in literals if lit))
        if not self.literals:
            raise ValueError("LiteralPrefilter needs at least one non-empty literal")
        if engine is None:
            engine = HYPERSCAN if hyperscan is not None else BYTES_FIND
        if engine == HYPERSCAN and hyperscan is None:
            raise RuntimeError("the hyperscan package is not installed (pip install hyperscan)")
        if engine not in (HYPERSCAN, BYTES_FIND):
            raise ValueError(f"unknown prefilter engine {engine!r}; use {HYPERSCAN!r} or {BYTES_FIND!r}")
        self.engine = engine
        self._database = self._compile() if engine == HYPERSCAN else None

    def _compile(self):
        database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        count = len(self.literals)
        database.compile(expressions=list(self.literals), ids=list(range(count)), elements=count,
                         flags=[0] * count, literal=True)
        return database

    def line_starts(self, data: bytes) -> list[int]:
        """Sorted offsets of the starts of the lines of ``data`` holding a literal."""
        if self._database is not None:
            return self._hyperscan_starts(data)
        return self._find_starts(data)

    def line_hits(self, data: bytes) -> dict[int, set[int]]:
        """Start of each line of ``data`` holding a literal -> the indices (into ``literals``) found in it.

        The same lines as ``line_starts``; the indices let a classifier try only the
        signatures whose literal the line holds.
        """
        hits: dict[int, set[int]] = {}
        rfind = data.rfind
        if self._database is not None:
            found: list[tuple[int, int]] = []
            append = found.append

            def on_match(literal, _start, end, _flags, _context):
                append((literal, end))

            self._database.scan(data, match_event_handler=on_match)
            for literal, end in found:
                hits.setdefault(rfind(b"\n", 0, end) + 1, set()).add(literal)
            return hits
        find = data.find
        for index, literal in enumerate(self.literals):
            own = 1 if literal.startswith(b"\n") else 0  # "\nE1": the line is the one after that newline
            position = find(literal)
            while position >= 0:
                hits.setdefault(rfind(b"\n", 0, position + own) + 1, set()).add(index)
                newline = find(b"\n", position)
                if newline < 0:
                    break
                position = find(literal, newline + 1)
        return hits

    def _hyperscan_starts(self, data: bytes) -> list[int]:
        ends: list[int] = []
        append = ends.append

        def on_match(_id, _start, end, _flags, _context):
            append(end)

        self._database.scan(data, match_event_handler=on_match)
        rfind = data.rfind
        # A line with several literals is reported several times: the set keeps it once.
        return sorted({rfind(b"\n", 0, end) + 1 for end in ends})

    def _find_starts(self, data: bytes) -> list[int]:
        starts: set[int] = set()
        find = data.find
        rfind = data.rfind
        for literal in self.literals:
            own = 1 if literal.startswith(b"\n") else 0
            position = find(literal)
            while position >= 0:
                starts.add(rfind(b"\n", 0, position + own) + 1)
                newline = find(b"\n", position)
                if newline < 0:
                    break
                position = find(literal, newline + 1)
        return sorted(starts)
