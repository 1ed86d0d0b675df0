"""Helpers for the twin tests: kill a streaming client mid-transfer, wait on conditions, py-spy."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse


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


def twin_state(base_url: str) -> dict:
    """The twin's own account from an engine's server info (``/get_server_info`` before 0.5.6)."""
    try:
        return get_json(base_url + "/server_info")["internal_states"][0]["twin"]
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        return get_json(base_url + "/get_server_info")["internal_states"][0]["twin"]


def open_stream(router: str, prompt_tokens: int) -> socket.socket:
    """POST a streaming /generate to the router over a raw socket and leave it open."""
    url = urlparse(router)
    body = json.dumps({"input_ids": list(range(prompt_tokens)), "sampling_params": {"max_new_tokens": 50},
                       "stream": True}).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: twin\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def kill_client_during_transfer_wait(twin, prompt_tokens: int = 3000) -> None:
    """A client that dies while its KV is still pending: the decode has sent the transfer info."""
    before = twin_state(twin.decode)["counters"]["transfer_failed"]
    sock = open_stream(twin.router, prompt_tokens)
    wait_until(lambda: twin_state(twin.decode)["transfer_queue"] >= 1, 20, "the request in the decode transfer queue")
    # The router answers the client only once both upstream responses are in hand; a client gone
    # before that leaves them unclosed (router.forward's gather), so no AbortReq ever reaches the
    # decode. Die once the stream is established, as a real client of a started stream does.
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(4096)
        assert chunk, f"the router closed the stream before answering: {received!r}"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received
    sock.close()  # the client is gone; the router closes its upstream requests
    try:
        wait_until(lambda: twin_state(twin.decode)["counters"]["transfer_failed"] > before, 20,
                   "the decode to fail the aborted transfer")
    except AssertionError as exc:  # say what each role did (pytest's tmp folders are recycled)
        tails = {role: "\n".join(twin.log_text(role).splitlines()[-15:]) for role in ("router", "decode", "prefill")}
        raise AssertionError(f"{exc}; decode state {twin_state(twin.decode)}; logs {tails}") from None


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
