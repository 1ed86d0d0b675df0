"""Small helpers for tests against a real sglang deployment (``twin up --engine sglang``)."""

from __future__ import annotations

import json
import time
import urllib.request

import psutil
import pytest


def enough_memory(gib: float = 7.0) -> None:
    """The machine is shared: wait (bounded) rather than start a 5 GB deployment into an OOM kill."""
    deadline = time.monotonic() + 600
    while psutil.virtual_memory().available < gib * (1 << 30):
        if time.monotonic() > deadline:
            pytest.skip(f"less than {gib} GiB available for a real-engine deployment after 10 min")
        time.sleep(30)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())
