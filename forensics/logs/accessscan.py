"""Access lines (uvicorn's ``"POST /generate HTTP/1.1" 200``) of one chunk, counted per minute and path.

The scanner's part that counts requests without keeping a row per line: one ``findall`` over
the joined lines and a ``Counter`` of the keys (minute, zone, host, unit, method, path,
status); the compiled ``_fastscan`` counts short-iso journals. A mixin of
:class:`forensics.logs.scanner.SourceScanner`, whose state it reads (``fmt``, ``fast``,
``access_key_re``, ``last_minute``, ``result``).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from forensics.logs.lineformats import SGLANG_PREFIX, UVICORN_ACCESS, line_spans, lines_with, split_line

ACCESS_LITERAL = b" HTTP/"


class AccessLineScan:
    """The access-line methods of the scanner (see the module's docstring)."""

    def _access_lines(self, data: bytes, consumed: set[int]) -> int:
        """Count uvicorn access lines per (minute, zone, host, unit, method, path, status).

        Returns the lines counted that the bulk count of plain logs did not already count
        (plain: those without sglang's prefix; journal formats: all of them).
        """
        if self.fmt == "plain":
            return self._access_lines_plain(data)
        if self.fmt == "short-iso" and self.fast is not None:
            counted, declined = self.fast.access_counts(data, self.result.access)
            if declined:
                lines = [data[start:data.find(b"\n", start)] for start in np.frombuffer(declined, dtype=np.int64).tolist()]
                keys = self.access_key_re.findall(b"\n".join(lines))
                self.result.access.update(Counter(keys))
                counted += len(keys)
            return counted
        lines = list(lines_with(data, ACCESS_LITERAL))
        if not lines:
            return 0
        if self.fmt == "json":
            counted = 0
            for line in lines:
                split = split_line(line, "json")
                found = UVICORN_ACCESS.search(split.message) if split is not None else None
                if found is None:
                    continue
                minute = split.journal_ts // 60_000_000 * 60_000_000 if split.journal_ts else None
                self.result.access[(minute, None, split.host, split.unit, found.group(2), found.group(3),
                                    found.group(4))] += 1
                counted += 1
            return counted
        # One findall over the joined lines; Counter counts the tuples in C.
        keys = self.access_key_re.findall(b"\n".join(lines))
        self.result.access.update(Counter(keys))
        return len(keys)

    def _access_lines_plain(self, data: bytes) -> int:
        """Access lines of a plain log; returns how many had no sglang time prefix.

        sglang's own uvicorn config writes ``[2025-07-01 12:00:00] INFO:     ...`` (its time is
        the line's minute); plain uvicorn writes no time at all (then the minute of the nearest
        earlier sglang line is taken). Prefixed lines are already counted by the bulk count.
        """
        find = data.find
        rfind = data.rfind
        counts = self.result.access
        match = UVICORN_ACCESS.match
        prefix_match = SGLANG_PREFIX.match
        unprefixed = 0
        last_minute = self.last_minute
        for start, end in line_spans(data, ACCESS_LITERAL):
            found = match(data, start, end)
            if found is None:
                prefix = prefix_match(data, start, end) if data.startswith(b"[20", start) else None
                found = match(data, prefix.end(), end) if prefix is not None else None
                if found is None:
                    continue
                last_minute = data[start + 1: start + 17]
                counts[(last_minute, None, None, None, found.group(2), found.group(3), found.group(4))] += 1
                continue
            unprefixed += 1
            # uvicorn prints no time: take the minute of the nearest earlier sglang line.
            previous = rfind(b"\n[20", 0, start)
            if previous >= 0:
                last_minute = data[previous + 2: previous + 18]
            elif data.startswith(b"[20"):
                last_minute = data[1:17]
            if last_minute is None:
                following = find(b"\n[20", end - 1)
                minute = data[following + 2: following + 18] if following >= 0 else None
            else:
                minute = last_minute
            counts[(minute, None, None, None, found.group(2), found.group(3), found.group(4))] += 1
        self.last_minute = last_minute
        return unprefixed
