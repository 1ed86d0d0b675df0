"""Finding the processes a host test started, by a marker in their command line."""

from __future__ import annotations

import time
import uuid

import psutil


def sleep_marker() -> str:
    """A ``sleep`` argument no other process uses (600.xyz seconds), to find that sleep again."""
    return f"{600 + uuid.uuid4().int % 1000 / 1000:.3f}"


def procs_with(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def gone(marker: str, within: float = 20.0) -> bool:
    """Whether every process with ``marker`` in its command line ends within ``within`` seconds."""
    deadline = time.monotonic() + within
    while procs_with(marker):
        if time.monotonic() > deadline:
            return False
        psutil.wait_procs(procs_with(marker), timeout=0.5)
    return True
