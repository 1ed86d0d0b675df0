"""Small helpers for tests against a real sglang deployment (``twin up --engine sglang``)."""

from __future__ import annotations

import json
import time
import urllib.request

import psutil
import pytest
import twin_helpers


def enough_memory(gib: float = 7.0) -> None:
    """The machine is shared: wait (bounded) rather than start a 5 GB deployment into an OOM kill."""
    deadline = time.monotonic() + 600
    while psutil.virtual_memory().available < gib * (1 << 30):
        if time.monotonic() > deadline:
            pytest.skip(f"less than {gib} GiB available for a real-engine deployment after 10 min")
        time.sleep(30)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    """The twin tests' wait, polling a real engine ten times less often (its pages cost seconds)."""
    return twin_helpers.wait_until(predicate, timeout, what, interval)


def post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())
