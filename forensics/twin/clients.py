"""What a client does to a twin, once, for everyone: the demo, the crosscheck, the tests and the benchmarks.

* :func:`twin_state`: the twin's own account of an engine (``internal_states[0]["twin"]`` of its
  server info; ``/get_server_info`` before 0.5.6).
* :func:`open_stream`: a streaming ``/generate`` through the router on a raw socket, left open.
* :func:`kill_client_during_transfer_wait`: the incident's trigger, a streaming client that dies
  while the decode waits for its KV.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

KILLED_AND_ABORTED = "client killed while its KV was pending; the decode aborted the transfer"


def twin_state(base_url: str, timeout: float = 5.0) -> dict:
    """The twin's own account from an engine's server info (``/get_server_info`` before 0.5.6)."""
    try:
        return _twin_account(base_url.rstrip("/") + "/server_info", timeout)
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    return _twin_account(base_url.rstrip("/") + "/get_server_info", timeout)


def _twin_account(url: str, timeout: float) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())["internal_states"][0]["twin"]


def open_stream(router: str, prompt_tokens: int, max_new_tokens: int = 50) -> socket.socket:
    """POST a streaming ``/generate`` of ``prompt_tokens`` token ids to the router and leave it open."""
    url = urlparse(router)
    body = json.dumps({"input_ids": list(range(prompt_tokens)), "sampling_params": {"max_new_tokens": max_new_tokens},
                       "stream": True}).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: twin\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def _wait(predicate, timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


def _stream_started(sock: socket.socket, timeout: float) -> str | None:
    """Read until the router's response headers; None once they say 200, else what came instead."""
    sock.settimeout(timeout)
    received = b""
    try:
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(4096)
            if not chunk:
                return f"the router closed the stream before answering: {received[:200]!r}"
            received += chunk
    except TimeoutError:
        return f"the router did not answer within {timeout:.0f} s"
    return None if received.startswith(b"HTTP/1.1 200") else f"the router answered {received[:80]!r}"


def kill_client_during_transfer_wait(deployment, prompt_tokens: int = 3000, timeout: float = 30.0,
                                     on_close=None) -> str:
    """Open a streaming request, wait until the decode holds it in its transfer queue and the
    router has started the stream, then drop the client; returns what happened
    (:data:`KILLED_AND_ABORTED` when the decode aborted the transfer).

    The router answers the client only once both upstream responses are in hand, and a client
    gone before that leaves them unclosed, so no AbortReq would reach the decode: the client dies
    once its stream is established, as a real client of a started stream does. ``on_close()`` is
    called the moment the socket is closed (a benchmark times from it).
    """
    before = twin_state(deployment.decode)["counters"]["transfer_failed"]
    sock = open_stream(deployment.router, prompt_tokens)
    try:
        if not _wait(lambda: twin_state(deployment.decode)["transfer_queue"] >= 1, timeout):
            return "the request never reached the decode transfer queue"
        problem = _stream_started(sock, timeout)
        if problem is not None:
            return problem
    finally:
        sock.close()  # the client is gone; the router closes its upstream requests
        if on_close is not None:
            on_close()
    if _wait(lambda: twin_state(deployment.decode)["counters"]["transfer_failed"] > before, timeout):
        return KILLED_AND_ABORTED
    return "client killed, but the decode never aborted the transfer"
