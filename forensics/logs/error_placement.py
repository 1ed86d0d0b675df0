"""Where the catalogue places each error call of one sglang release: the table the tests print.

    python -m forensics.logs.error_placement 0.5.15

Every call :func:`forensics.logs.source_errors.error_calls` finds is one row: its file, line, level
and message, and ``placed``: ``catalogue`` (a hand entry of ``signatures.toml`` is its line, the
entry named in ``entry``), ``derived`` (an entry of its own, :mod:`forensics.logs.source_errors`) or
``unrecognisable`` (too little literal text to be told from other lines).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from forensics import sglang_source
from forensics.logs import catalogue
from forensics.logs.source_errors import ErrorCall, error_calls, step_of

COLUMNS = ["file", "line", "level", "message", "placed", "entry", "step"]


def placed_as(call: ErrorCall, hand: tuple[catalogue.Signature, ...]) -> catalogue.Signature | None:
    """The hand-written entry the call's rendered message is (in matching order), or None."""
    rendering = call.rendering
    return next((s for s in hand if s.match(rendering) is not None), None)


def placement(version: str, *, offline: bool = False) -> pd.DataFrame:
    """Every error call of release ``version`` and where the catalogue places it."""
    hand = catalogue.hand_event_signatures()
    rows = []
    for call in error_calls(sglang_source.fetch(version, offline=offline)):
        entry = placed_as(call, hand)
        if entry is not None:
            placed, name, step = "catalogue", entry.id, entry.step
        elif call.recognisable:
            placed, name, step = "derived", call.class_id, step_of(call)
        else:
            placed, name, step = "unrecognisable", "", ""
        rows.append({"file": call.file.removeprefix("sglang/srt/"), "line": call.line, "level": call.level,
                     "message": call.shown, "placed": placed, "entry": name, "step": step})
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forensics.logs.error_placement", description=__doc__.split("\n")[0])
    parser.add_argument("release")
    args = parser.parse_args(argv)
    table = placement(args.release)
    print(table.to_string(max_colwidth=90))
    print(table["placed"].value_counts().to_string(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
