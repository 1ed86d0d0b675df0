"""The storm's client: one streaming chat completion over a raw socket, kill-able at any moment.

Standard library only: the SIGKILL mode runs this file as its own process
(``python -I client.py``), one per client, as ``curl`` processes were in the incident.

A session walks the client-side phases it can see for itself:

    connecting -> sent -> waiting -> streaming -> finished
                  (request out) (response headers) (first token) ([DONE])

The client cannot see the decode's queues: "waiting" covers both the bootstrap and the
wait for KV. Which decode queue a kill really hit is attributed afterwards from the
decode's log (:mod:`forensics.storm.checker`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

CLIENT_PHASES = ("connecting", "sent", "waiting", "streaming", "finished")
RST_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER {on, 0 s}: close() sends RST, not FIN


@dataclass
class SessionState:
    """What one session saw (wall-clock seconds since the epoch; None = did not happen)."""

    rid: str
    phase: str = "connecting"
    invoked: float | None = None
    sent: float | None = None
    headers: float | None = None
    first_token: float | None = None
    ended: float | None = None
    tokens: int = 0
    http_status: int | None = None
    outcome: str | None = None  # ok | fail | info (None while open)
    detail: str = ""
    killed: bool = False
    phase_at_kill: str | None = None
    kill_perf: float | None = None  # time.perf_counter() right after the socket was reset
    sock: socket.socket | None = field(default=None, repr=False)

    @property
    def open(self) -> bool:
        return self.outcome is None

    def to_event(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("sock",)}


def request_bytes(host: str, port: int, body: dict, path: str = "/v1/chat/completions") -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n")
    return head.encode() + payload


def reset(state: SessionState, loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Close the session's socket hard (RST) now; True if there was an open socket to reset."""
    sock = state.sock
    if sock is None or sock.fileno() < 0:
        return False
    if loop is not None:
        loop.remove_reader(sock.fileno())  # the pending sock_recv stays pending; its task is cancelled after
        loop.remove_writer(sock.fileno())
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST_LINGER)
    except OSError:
        pass
    sock.close()
    state.kill_perf = time.perf_counter()
    return True


class _Body:
    """HTTP/1.1 body decoding (chunked or not) into server-sent events."""

    def __init__(self, chunked: bool) -> None:
        self.chunked = chunked
        self.raw = b""
        self.sse = b""
        self.ended = False  # the last chunk (size 0) arrived

    def feed(self, data: bytes) -> list[bytes]:
        if not self.chunked:
            self.sse += data
        else:
            self.raw += data
            while not self.ended:
                line_end = self.raw.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(self.raw[:line_end].split(b";")[0] or b"0", 16)
                if size == 0:
                    self.ended = True
                    break
                if len(self.raw) < line_end + 2 + size + 2:
                    break
                self.sse += self.raw[line_end + 2: line_end + 2 + size]
                self.raw = self.raw[line_end + 2 + size + 2:]
        events = self.sse.split(b"\n\n")
        self.sse = events.pop()
        return [e.strip() for e in events if e.strip()]


async def run_session(state: SessionState, host: str, port: int, request: bytes, *,
                      timeout_s: float, notify=None) -> SessionState:
    """Send ``request`` and read the stream until [DONE], an error, a close, or ``timeout_s``.

    ``notify(state)`` is called at every phase change. A nemesis may :func:`reset` the socket
    at any moment and cancel this task: the state keeps what was seen up to then.
    """
    loop = asyncio.get_running_loop()

    def moved(phase: str) -> None:
        state.phase = phase
        if notify is not None:
            notify(state)

    state.invoked = time.time()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    state.sock = sock
    try:
        async with asyncio.timeout(timeout_s):
            await loop.sock_connect(sock, (host, port))
            await loop.sock_sendall(sock, request)
            state.sent = time.time()
            moved("sent")
            head = b""
            while b"\r\n\r\n" not in head:
                data = await loop.sock_recv(sock, 65536)
                if not data:
                    return _end(state, "fail", "connection closed before the response headers")
                head += data
            header_block, rest = head.split(b"\r\n\r\n", 1)
            lines = header_block.decode("latin-1").split("\r\n")
            try:
                state.http_status = int(lines[0].split()[1])
            except (IndexError, ValueError):
                return _end(state, "fail", f"bad status line {lines[0][:80]!r}")
            state.headers = time.time()
            moved("waiting")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            body = _Body(headers.get("transfer-encoding", "").lower() == "chunked")
            if state.http_status != 200:
                return _end(state, "fail", f"HTTP {state.http_status}: {(rest[:200]).decode('utf-8', 'replace')}")
            data = rest
            while True:
                for event in body.feed(data):
                    if not event.startswith(b"data:"):
                        continue
                    payload = event[5:].strip()
                    if payload == b"[DONE]":
                        return _end(state, "ok", f"{state.tokens} tokens")
                    if b'"error"' in payload[:20]:
                        return _end(state, "fail", "error event: " + payload[:300].decode("utf-8", "replace"))
                    if b'"content"' in payload:
                        state.tokens += 1
                        if state.first_token is None:
                            state.first_token = time.time()
                            moved("streaming")
                if body.ended:
                    return _end(state, "fail", "the stream ended without [DONE]")
                data = await loop.sock_recv(sock, 65536)
                if not data:
                    return _end(state, "fail", "the server closed the stream without [DONE]")
    except TimeoutError:
        return _end(state, "info", f"no end of stream within {timeout_s:g}s (phase {state.phase})")
    except asyncio.CancelledError:
        if state.killed:
            return state
        raise
    except OSError as exc:
        if state.killed:
            return state
        return _end(state, "fail", f"{type(exc).__name__}: {exc.strerror or exc}")
    finally:
        if sock.fileno() >= 0:  # a killed session's socket not yet reset is reset here (never a FIN)
            if state.killed:
                reset(state)
            else:
                sock.close()


def _end(state: SessionState, outcome: str, detail: str) -> SessionState:
    state.outcome = state.outcome or outcome
    state.detail = state.detail or detail
    state.ended = state.ended or time.time()
    if outcome == "ok":
        state.phase = "finished"
    return state


# --------------------------------------------------------------- SIGKILL mode: one process


def _child_main() -> None:
    """``python -I client.py HOST PORT TIMEOUT`` with one JSON list of [rid, body] on stdin.

    Prints one JSON line per phase change and one per end; the parent SIGKILLs it at will.
    """
    host, port, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    specs = json.loads(sys.stdin.read())
    out = sys.stdout

    def notify(state: SessionState) -> None:
        out.write(json.dumps({"rid": state.rid, "phase": state.phase, "t": time.time(), "pid": os.getpid()}) + "\n")
        out.flush()

    async def main() -> None:
        async def one(rid: str, body: dict) -> None:
            state = SessionState(rid=rid)
            await run_session(state, host, port, request_bytes(host, port, body), timeout_s=timeout_s, notify=notify)
            event = state.to_event()
            event["end"] = True
            out.write(json.dumps(event) + "\n")
            out.flush()

        await asyncio.gather(*(one(rid, body) for rid, body in specs))

    asyncio.run(main())


if __name__ == "__main__":
    _child_main()
