"""One HTTP request that is never closed before its answer (the probes' only way to talk).

On sglang 0.5.13 to 0.5.15.post1 a client that disconnects early becomes an ``AbortReq``,
then an ABORT frame that kills the NIXL prefill's bootstrap thread: the very wedge a probe
looks for. So an :class:`Exchange` waits for the answer however long it takes, up to a hard
cap (default 330 s, beyond sglang's 300 s bootstrap and waiting timeouts, by when sglang has
failed the request itself). A deadline is not enforced here: the caller only *marks* a probe
late. The connection is closed early in exactly one case: :meth:`Exchange.abandon`, which the
caller reaches only through an explicit ``abandon=True``.

Plain ``http.client`` on a blocking socket: one thread per exchange, nothing in between that
could time out or retry on its own, and a socket another thread can shut down on request.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_CONNECT_S = 5.0  # a connect that does not complete sends nothing, so giving up on it is safe
USER_AGENT = "pd-forensics-probe"


@dataclass
class Answer:
    """How one exchange ended."""

    status: int | None = None
    ttfb_s: float | None = None  # to the status line
    total_s: float | None = None  # to the end of the body (or of the failure)
    body: bytes = b""
    failure: str | None = None  # None, "refused", "error", "unanswered", "abandoned"
    detail: str = ""


class Exchange:
    """One request and its answer; :meth:`run` blocks (up to ``cap_s``), :meth:`abandon` from another thread."""

    def __init__(self, method: str, url: str, body: dict | None = None, *, cap_s: float,
                 connect_s: float = DEFAULT_CONNECT_S) -> None:
        self.method = method
        self.url = url
        self.body = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        self.cap_s = cap_s
        self.connect_s = min(connect_s, cap_s)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._abandoned = False
        self.finished = threading.Event()
        self.answer: Answer | None = None

    def abandon(self) -> bool:
        """Close the connection now (only for an explicit ``abandon=True``); True if one was open."""
        with self._lock:
            self._abandoned = True
            sock = self._sock
        if sock is None or self.finished.is_set():
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked recv; close() alone would not
        except OSError:
            pass
        return True

    def socket_fd(self) -> int | None:
        """The open connection's file descriptor (to hand to a keeper), or None when nothing is open."""
        with self._lock:
            sock = self._sock
            if sock is None or self._abandoned or self.finished.is_set():
                return None
            try:
                fd = sock.fileno()
            except OSError:
                return None
        return fd if fd >= 0 else None

    def run(self) -> Answer:
        started = time.monotonic()
        try:
            answer = self._run(started)
        except Exception as exc:  # never let a probe thread die silently
            answer = Answer(failure="error", detail=f"{type(exc).__name__}: {exc}")
        if answer.total_s is None:
            answer.total_s = time.monotonic() - started
        with self._lock:
            if self._abandoned and answer.failure is not None:
                answer.failure, answer.detail = "abandoned", "closed by the caller (abandon=True): " + answer.detail
        self.answer = answer
        self.finished.set()
        return answer

    def _run(self, started: float) -> Answer:
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=self.connect_s)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        try:
            try:
                conn.connect()
            except ConnectionRefusedError as exc:
                return Answer(failure="refused", detail=f"connection refused ({exc.strerror or exc}); nothing was sent")
            except TimeoutError:
                return Answer(failure="error", detail=f"connect timed out after {self.connect_s:g}s; nothing was sent")
            except OSError as exc:
                return Answer(failure="error", detail=f"connect failed ({exc}); nothing was sent")
            with self._lock:
                if self._abandoned:
                    return Answer(failure="abandoned", detail="abandoned before sending")
                self._sock = sock = conn.sock
            sock.settimeout(self._left(started))
            # Connection: close makes the server close once its answer is sent, so whoever holds
            # the connection then (this thread, or a keeper after the caller exited) sees the end.
            headers = {"User-Agent": USER_AGENT, "Accept": "application/json", "Connection": "close"}
            if self.body is not None:
                headers["Content-Type"] = "application/json"
            try:
                conn.request(self.method, path, body=self.body, headers=headers)
                sock.settimeout(self._left(started))
                response = conn.getresponse()
                ttfb = time.monotonic() - started
                sock.settimeout(self._left(started))  # the response reads from this socket too
                data = response.read()
            except TimeoutError:
                return Answer(failure="unanswered",
                              detail=f"no answer within the cap of {self.cap_s:g}s; the connection is closed now")
            except (OSError, http.client.HTTPException) as exc:
                return Answer(failure="error", detail=f"{type(exc).__name__}: {exc}")
            return Answer(status=response.status, ttfb_s=ttfb, total_s=time.monotonic() - started, body=data)
        finally:
            conn.close()  # after the answer (or the cap, or an abandon): never before

    def _left(self, started: float) -> float:
        return max(self.cap_s - (time.monotonic() - started), 0.001)
