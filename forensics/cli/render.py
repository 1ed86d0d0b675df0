"""Shared terminal output for the CLI: one JSON document on stdout, or rich tables."""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime

import click


def _default(value):
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
        if isinstance(value, pd.Timestamp):
            return value.isoformat()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def emit_json(document) -> None:
    """Print exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, default=_default, indent=2, allow_nan=False) + "\n")


def frame_records(frame, columns=None) -> list[dict]:
    import pandas as pd

    if columns is not None:
        frame = frame[[c for c in columns if c in frame.columns]]
    records = []
    for row in frame.to_dict("records"):
        clean = {}
        for key, value in row.items():
            if value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
                clean[key] = None
            elif isinstance(value, pd.Timestamp):
                clean[key] = value.isoformat()
            elif hasattr(value, "item"):
                clean[key] = value.item()
            else:
                clean[key] = value
        records.append(clean)
    return records


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def fail_usage(message: str) -> None:
    raise click.UsageError(message)
