"""The one writer of benchmarks/RESULTS.md: each benchmark owns a section between two markers."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).parent / "RESULTS.md"


def write_section(text: str, start: str, end: str, results: Path = RESULTS) -> None:
    """Replace the section between ``start`` and ``end`` (``text`` includes both), or append it."""
    current = results.read_text(encoding="utf-8")
    if start in current:
        head, rest = current.split(start, 1)
        results.write_text(head + text + rest.split(end, 1)[1], encoding="utf-8")
    else:
        results.write_text(current.rstrip("\n") + "\n\n" + text + "\n", encoding="utf-8")
