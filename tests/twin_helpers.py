"""Helpers for the twin tests: kill a streaming client mid-transfer, wait on conditions, py-spy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from forensics.twin import clients


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def status_code(url: str, timeout: float = 30.0) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status


twin_state = clients.twin_state
open_stream = clients.open_stream


def kill_client_during_transfer_wait(twin, prompt_tokens: int = 3000) -> None:
    """A client that dies while its KV is still pending (:mod:`forensics.twin.clients`), asserted."""
    detail = clients.kill_client_during_transfer_wait(twin, prompt_tokens, timeout=20)
    if detail != clients.KILLED_AND_ABORTED:  # say what each role did (pytest's tmp folders are recycled)
        tails = {role: "\n".join(twin.log_text(role).splitlines()[-15:]) for role in ("router", "decode", "prefill")}
        raise AssertionError(f"{detail}; decode state {twin_state(twin.decode)}; logs {tails}")


def py_spy_dump(pid: int) -> str:
    spy = Path(sys.executable).with_name("py-spy")
    result = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


PY_SPY_THREAD = re.compile(r'^Thread (?:0x)?[0-9A-Fa-f]+ \([^)]*\): "(?P<name>[^"]*)"$')


def py_spy_threads(pid: int) -> dict[str, list[str]]:
    """Thread name (as py-spy prints it) -> its stack, innermost frame first, from one ``py-spy dump``."""
    threads: dict[str, list[str]] = {}
    frames: list[str] | None = None
    for line in py_spy_dump(pid).splitlines():
        header = PY_SPY_THREAD.match(line)
        if header:
            assert header["name"] not in threads, f"two threads named {header['name']!r}"
            frames = threads[header["name"]] = []
        elif frames is not None and line.startswith("    "):
            frames.append(line.strip())
    assert threads, "py-spy printed no thread"
    return threads


def guard_line(conn_py: Path) -> int:
    """The line of the GUARD comparison in a copy of nixl/conn.py (what a 3.11 traceback shows)."""
    for number, line in enumerate(conn_py.read_text().splitlines(), 1):
        if "waiting_req_bytes[0] == GUARD" in line:
            return number
    raise AssertionError(f"{conn_py}: no GUARD comparison")
