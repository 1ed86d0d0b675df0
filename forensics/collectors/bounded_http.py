"""One HTTP GET with a total deadline and a byte cap: how every collector reads an HTTP answer.

``urlopen(timeout=)`` and httpx's timeouts bound each socket read, not the answer: a server
that sends one byte every half second keeps such a request alive for ever, and one that
sends a gigabyte has all of it kept in memory. Here every receive of the answer (status
line, headers, body) waits at most until one deadline for the whole exchange, and the body
is read in chunks up to a byte cap, so neither the time nor the memory a read takes depends
on what the server does. Breaking a limit raises :class:`AnswerTooSlow` or
:class:`AnswerTooLarge`, whose message names the URL, what happened and the limit; the
collectors turn it into a failed scrape or a gap.

Only what the collectors need: GET over http (and https), no redirects followed, no proxy
taken from the environment (an engine is reached directly), no compression asked for, the
URL's userinfo sent as Basic authentication. Name resolution is the system's and is not
under the deadline (an engine URL is an address or a name the resolver answers at once).
"""

from __future__ import annotations

import base64
import http.client
import io
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from forensics.redact import redact_url

__all__ = [
    "JSON_LIMITS",
    "METRICS_LIMITS",
    "PROMETHEUS_LIMITS",
    "Answer",
    "AnswerTooLarge",
    "AnswerTooSlow",
    "LimitExceeded",
    "ReadLimits",
    "get",
    "size_text",
]

CHUNK = 64 * 1024
MiB = 1024 * 1024


@dataclass(frozen=True)
class ReadLimits:
    """How long a whole answer may take (wall clock, connect included) and how many body bytes it may have."""

    deadline_s: float
    max_bytes: int

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, not {self.deadline_s!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive integer, not {self.max_bytes!r}")

    def with_deadline(self, deadline_s: float) -> ReadLimits:
        return ReadLimits(float(deadline_s), self.max_bytes)


# Defaults, each far above what sglang serves (a /metrics page is tens to hundreds of KiB,
# /server_info a few KiB; a Prometheus range answer of 720 points per series is ~25 KiB a series).
METRICS_LIMITS = ReadLimits(deadline_s=5.0, max_bytes=32 * MiB)
JSON_LIMITS = ReadLimits(deadline_s=5.0, max_bytes=8 * MiB)
PROMETHEUS_LIMITS = ReadLimits(deadline_s=10.0, max_bytes=64 * MiB)


def size_text(n: int) -> str:
    """``32 MiB``, ``512 KiB`` or ``100 bytes``: a byte count as a limit is written."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


class LimitExceeded(Exception):
    """An answer that broke one of its :class:`ReadLimits` (the message says which, for which URL)."""

    def __init__(self, message: str, *, url: str, limits: ReadLimits, received: int, elapsed_s: float) -> None:
        super().__init__(message)
        self.url = url
        self.limits = limits
        self.received = received  # bytes of the answer read before giving up (headers included)
        self.elapsed_s = elapsed_s


class AnswerTooSlow(LimitExceeded, TimeoutError):
    """The whole answer did not arrive within ``limits.deadline_s`` (a trickling or stalled server)."""


class AnswerTooLarge(LimitExceeded):
    """The body is longer than ``limits.max_bytes`` (said by Content-Length, or seen while reading)."""


@dataclass(frozen=True)
class Answer:
    url: str  # redacted
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    duration_s: float

    def json(self) -> Any:
        import json

        return json.loads(self.body)


class _Expired(Exception):
    """Internal: the deadline passed while waiting for the server."""


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each receive waiting only until the exchange's deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self.sock = sock
        self.deadline = deadline
        self.received = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _Expired
        self.sock.settimeout(remaining)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            raise _Expired from None
        self.received += n
        return n


class _DeadlineSocket:
    """What http.client needs of a socket (sendall, makefile, close), under one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.reader = _DeadlineReader(sock, deadline)

    def sendall(self, data: bytes) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _Expired
        self.sock.settimeout(remaining)  # sendall's timeout bounds the whole send
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise _Expired from None

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        if "r" not in mode:
            raise ValueError(f"only reading through makefile, not {mode!r}")
        return io.BufferedReader(self.reader, CHUNK)

    def close(self) -> None:
        # http.client closes the connection as soon as it has the headers of a "Connection: close"
        # answer, and goes on reading the body through makefile's reader: the socket itself is
        # closed by get() once the body is read.
        pass


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, deadline: float, tls: bool) -> None:
        super().__init__(host, port)
        self.deadline = deadline
        self.tls = tls
        self.opened: _DeadlineSocket | None = None

    def connect(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _Expired
        try:
            sock = socket.create_connection((self.host, self.port), timeout=remaining)
            if self.tls:
                sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        except TimeoutError:
            raise _Expired from None
        self.sock = self.opened = _DeadlineSocket(sock, self.deadline)


def get(url: str, *, limits: ReadLimits, headers: dict[str, str] | None = None) -> Answer:
    """GET ``url`` within ``limits``: the status (any, 404 and 500 included) and the whole body.

    Raises :class:`AnswerTooSlow` or :class:`AnswerTooLarge` when the server breaks a limit,
    ``OSError`` (refused, reset, no route) or ``http.client.HTTPException`` (not HTTP) otherwise.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {redact_url(url)!r}")
    shown = redact_url(url)
    start = time.monotonic()
    deadline = start + limits.deadline_s
    connection = _Connection(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), deadline,
                             tls=parts.scheme == "https")
    sent = {"Accept-Encoding": "identity", "Connection": "close", **(headers or {})}
    if parts.username is not None:
        userinfo = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        sent.setdefault("Authorization", "Basic " + base64.b64encode(userinfo.encode()).decode())
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def received() -> int:
        return connection.opened.reader.received if connection.opened is not None else 0

    try:
        connection.request("GET", target, headers=sent)
        response = connection.getresponse()
        declared = response.getheader("Content-Length", "")
        if declared.strip().isdigit() and int(declared) > limits.max_bytes:
            raise AnswerTooLarge(
                f"{shown}: the answer is {int(declared)} bytes (Content-Length), over the "
                f"{size_text(limits.max_bytes)} cap", url=shown, limits=limits, received=received(),
                elapsed_s=time.monotonic() - start)
        body = bytearray()
        while chunk := response.read(min(CHUNK, limits.max_bytes + 1 - len(body))):
            body += chunk
            if len(body) > limits.max_bytes:
                raise AnswerTooLarge(
                    f"{shown}: the answer is longer than the {size_text(limits.max_bytes)} cap (stopped reading "
                    f"at {len(body)} bytes)", url=shown, limits=limits, received=received(),
                    elapsed_s=time.monotonic() - start)
        return Answer(shown, response.status, response.reason,
                      {k.lower(): v for k, v in response.getheaders()}, bytes(body), time.monotonic() - start)
    except _Expired:
        elapsed = time.monotonic() - start
        raise AnswerTooSlow(
            f"{shown}: timed out: no complete answer within the {limits.deadline_s:g} s total deadline "
            f"({received()} bytes in {elapsed:.1f} s)", url=shown, limits=limits, received=received(),
            elapsed_s=elapsed) from None
    finally:
        connection.close()
        if connection.opened is not None:
            connection.opened.sock.close()
