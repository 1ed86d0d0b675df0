"""Shared terminal output for the CLI (rich consoles); JSON encoding lives in forensics.jsonable."""

from __future__ import annotations

from forensics.jsonable import encode_json, frame_json, frame_records

__all__ = ["console", "encode_json", "frame_json", "frame_records"]


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)
