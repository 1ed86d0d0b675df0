"""What a running real-engine deployment shows of the wedge, read the way an operator on its host would.

The twin exposes its bootstrap loop's state on ``/server_info`` (``internal_states[0].twin``);
real sglang has no such page, so the demo and the tests read the real thing from outside:

* the prefill's ``bootstrap_thread``: alive when ``py-spy dump`` of the prefill's scheduler
  process (where sglang starts the thread) lists a thread named ``...(bootstrap_thread)``;
* a session at the decode: the decode's own arrival counter (:mod:`forensics.storm.observer`,
  ``sglang:http_requests_total`` for the endpoint), which rises as a request reaches it;
* what each engine did with an abort: its log's signature events (:mod:`forensics.logs`): the
  decode's ``Decode transfer failed`` / ``Decode handshake failed`` lines, the prefill's
  ``Received abort notification`` (the patched loop) or its GUARD assertion (the unpatched one).

Every reading is of the live processes or their own log files; nothing is modelled.
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

DECODE_ABORTS = ("decode_transfer_aborted", "decode_handshake_aborted")
PREFILL_FRAMES = ("abort_received", "nixl_guard_assertion")  # an ABORT the prefill's loop took (either fate)
BOOTSTRAP_THREAD = "bootstrap_thread"
PY_SPY_TIMEOUT_S = 60.0  # a dump of a busy scheduler on a loaded 2-core machine takes seconds


def bootstrap_thread_alive(deployment) -> bool | None:
    """Whether the prefill scheduler runs ``bootstrap_thread`` now (None: its threads cannot be read)."""
    from forensics.hosts import LocalHost
    from forensics.threads.dump import dump_threads

    pid = deployment.scheduler_pid("prefill")
    if pid is None:
        return None
    dump = dump_threads(LocalHost(), pid, py_spy=deployment.inventory.engine("prefill").py_spy,
                        timeout=PY_SPY_TIMEOUT_S, label="prefill")
    if not dump.ok:
        return None
    return bool(dump.frame["thread_name"].astype(str).str.contains(BOOTSTRAP_THREAD, regex=False).any())


def signature_count(deployment, role: str, signatures) -> int:
    """How many of ``signatures`` the role's log holds (scanned by ``forensics logs``)."""
    from forensics.logs import scan

    path = deployment.log_path(role)
    if not path.is_file():
        return 0
    events = scan([path]).events
    return int(events["signature"].isin(list(signatures)).sum())


def decode_aborts(deployment) -> int:
    return signature_count(deployment, "decode", DECODE_ABORTS)


def prefill_frames(deployment) -> int:
    return signature_count(deployment, "prefill", PREFILL_FRAMES)


def aborts_handled(deployment) -> int:
    return signature_count(deployment, "prefill", ("abort_received",))


def decode_arrivals(deployment) -> int | None:
    from forensics.storm import generator, observer

    return observer.DecodeArrivals([("decode", deployment.decode)], generator.ENDPOINT).count()


def kill_one_client(deployment, *, prompt_tokens: int = 3000, timeout: float = 120.0, on_close=None) -> str:
    """Open one streaming chat completion through the router, drop the client the moment the decode
    has counted its arrival and no token came back (its KV pending), then wait for the decode's abort.

    Returns what happened, in the demo's words ("... the decode aborted the transfer" on success);
    ``on_close()`` is called the moment the client's socket is closed (a benchmark times from it)."""
    from forensics.storm import generator

    before_aborts, before_arrivals = decode_aborts(deployment), decode_arrivals(deployment)
    if before_arrivals is None:
        return "the decode's /metrics has no arrival counter (sglang:http_requests_total): cannot see the request"
    spec = generator.SessionSpec(cycle=0, wave=0, session=0, rid=f"demo-kill-{generator.storm_id()}",
                                 prompt_tokens=prompt_tokens, max_tokens=16)
    url = urlparse(deployment.router)
    body = json.dumps(spec.body()).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    try:
        sock.sendall(f"POST {generator.ENDPOINT} HTTP/1.1\r\nHost: {url.hostname}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            arrived = decode_arrivals(deployment)
            if arrived is not None and arrived > before_arrivals:
                break
            time.sleep(0.05)
        else:
            return f"the request never reached the decode within {timeout:.0f} s"
        if _token_came(sock):
            return "the first token came before the kill (the prefill was too fast): nothing pending to abort"
    finally:
        sock.close()  # the client is gone; the mini LB passes a streaming client's disconnect on
        if on_close is not None:
            on_close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if decode_aborts(deployment) > before_aborts:
            return "client killed while its KV was pending; the decode aborted the transfer"
        time.sleep(0.5)
    return f"client killed, but the decode logged no abort within {timeout:.0f} s"


def _token_came(sock: socket.socket) -> bool:
    """Whether a streamed chunk (``data:``) has arrived, without consuming it."""
    sock.setblocking(False)
    try:
        return b"data:" in sock.recv(65536, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return False
    finally:
        sock.setblocking(True)
