"""The one writer of benchmarks/RESULTS.md: each benchmark owns a section between two markers."""

from __future__ import annotations

import argparse
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


def benchmark_parser(name: str, description: str) -> argparse.ArgumentParser:
    """A benchmark's command line (``python -m benchmarks NAME``), with the ``--no-write`` all of them take."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=description)
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    return parser


def publish(text: str, start: str, end: str, *, write: bool) -> None:
    """Print a benchmark's section and, when ``write``, put it in RESULTS.md."""
    print(text)
    if write:
        write_section(text, start, end)
