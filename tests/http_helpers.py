"""A real HTTP server on 127.0.0.1 for collector tests: fixed routes, trickling and oversized answers.

``RoutesServer(routes)`` answers each path of ``routes`` (path with its query, as sent)
with ``(status, body)``; any other path is 404. A body may also be ``Trickle(...)`` (one
byte every ``every_s`` seconds, for ever unless stopped) or ``Oversized(n)`` (``n`` bytes
of one long sample-looking page, sent in chunks, with or without Content-Length). The
server's threads are daemons and ``close()`` stops a trickle at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Trickle:
    every_s: float = 0.5
    declared: int = 1_000_000  # the Content-Length announced (never reached)


@dataclass(frozen=True)
class Oversized:
    size: int
    content_length: bool = True  # False: HTTP/1.0-style, the body ends when the connection closes


class RoutesServer:
    def __init__(self, routes: dict[str, tuple[int, object]]) -> None:
        self.routes = dict(routes)
        self.requests: list[str] = []
        self.stopping = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                outer.requests.append(self.path)
                status, body = outer.routes.get(self.path, (404, b'{"detail":"Not Found"}'))
                try:
                    if isinstance(body, Trickle):
                        self._trickle(status, body)
                    elif isinstance(body, Oversized):
                        self._oversized(status, body)
                    else:
                        data = body.encode() if isinstance(body, str) else bytes(body)
                        self.send_response(status)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                except OSError:  # the client gave up (as it should): nothing to answer
                    self.close_connection = True

            def _trickle(self, status: int, body: Trickle) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(body.declared))
                self.end_headers()
                self.wfile.flush()
                while not outer.stopping.wait(body.every_s):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                self.close_connection = True

            def _oversized(self, status: int, body: Oversized) -> None:
                self.send_response(status)
                if body.content_length:
                    self.send_header("Content-Length", str(body.size))
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                line = b'sglang:num_queue_reqs{engine="x"} 1\n'
                chunk = line * (65536 // len(line))
                left = body.size
                while left > 0 and not outer.stopping.is_set():
                    piece = chunk[:left]
                    self.wfile.write(piece)
                    left -= len(piece)
                self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="test-routes-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def __enter__(self) -> RoutesServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
