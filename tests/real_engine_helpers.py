"""Small helpers for tests against a real sglang deployment (``twin up --engine sglang``)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import twin_helpers
from cli_helpers import one_document, run_forensics


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


def answers(url: str) -> bool:
    """Whether ``url``'s /health answers 200 now."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=60) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def cli_deployment(directory: Path, waiting_timeout_s: int) -> Iterator[tuple]:
    """A real 0.5.15 deployment (the slow-prefill model) started and ended through the CLI, as a user
    would: yields (the attached deployment, ``twin up``'s JSON document with ``up_s``)."""
    from forensics.engine.deployment import attach

    enough_memory()
    started = time.monotonic()
    result = run_forensics("twin", "up", "--engine", "sglang", "--model", "slow-prefill", "--waiting-timeout",
                           str(waiting_timeout_s), "--dir", str(directory), "--json", timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    document = one_document(result.stdout)
    document["up_s"] = round(time.monotonic() - started, 1)
    print(f"\nreal-engine deployment up in {document['up_s']} s: {document.get('timings_s')}")
    try:
        yield attach(document["inventory"]), document
    finally:
        if (directory / "inventory.toml").exists():
            down = run_forensics("twin", "down", "--inventory", str(directory / "inventory.toml"), "--json", timeout=300)
            print(f"\nreal-engine deployment down (exit {down.returncode}): {down.stdout.strip()[-2000:]}")


def assert_wedged_as_in_production(deployment, document: dict, health_deadline_s: float) -> None:
    """After the prefill's GUARD death: /health answers 200 on all three, py-spy finds no
    ``bootstrap_thread``, a real request does not complete, and ``diagnose`` says WEDGED (exit 1)."""
    # While its scheduler still computes the long prompt the prefill's /health (a generation) waits
    # and may say 503; once that is done the wedged prefill answers 200 again, as in production.
    for role in ("router", "prefill", "decode"):
        wait_until(lambda role=role: answers(document[role]), health_deadline_s, f"the {role}'s /health to answer 200", interval=2)
    status = deployment.status()
    assert status["roles"]["prefill"]["bootstrap_thread_alive"] is False, status  # py-spy: the thread is gone
    assert not status.healthy and "the prefill's bootstrap thread is dead" in status.problems()
    with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
        post(document["router"] + "/generate", {"text": "ba be bi", "sampling_params": {"max_new_tokens": 2}},
             timeout=30)
    result = run_forensics("diagnose", "--inventory", document["inventory"], "--json", timeout=600)
    verdict = one_document(result.stdout)
    assert result.returncode == 1 and verdict["verdict"] == "WEDGED", json.dumps(verdict)[:3000]
