"""A local "deployment" without a twin: a real HTTP server on 127.0.0.1 and a real process.

``FakeEngine`` answers what a collection asks an engine (/health, /health_generate,
/generate, /server_info, /v1/loads, /metrics) and records every request it saw, so a test
can tell whether a command sent anything. ``local_inventory`` writes an inventory whose two
engines (prefill and decode) are served by it, with a real sleeping process per engine
(found by pid file), a log file each, and any extra keys a test wants to plant.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import tomli_w

METRICS_PAGE = (
    "# TYPE sglang:num_prefill_bootstrap_queue_reqs gauge\n"
    'sglang:num_prefill_bootstrap_queue_reqs{model_name="m"} 0\n'
    "# TYPE sglang:num_running_reqs gauge\n"
    'sglang:num_running_reqs{model_name="m"} 0\n'
)


class FakeEngine:
    """A real ThreadingHTTPServer on 127.0.0.1; ``requests`` lists (method, path) in arrival order."""

    def __init__(self, server_info: dict[str, Any] | None = None) -> None:
        self.server_info = server_info or {"version": "0.5.15", "disaggregation_mode": "prefill"}
        self.requests: list[tuple[str, str]] = []
        lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, body: bytes, kind: str = "application/json") -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with lock:
                    engine.requests.append(("GET", self.path))
                path = self.path.split("?")[0]
                if path in ("/server_info", "/get_server_info"):
                    self._answer(json.dumps(engine.server_info).encode())
                elif path == "/metrics":
                    self._answer(METRICS_PAGE.encode(), "text/plain; version=0.0.4")
                elif path == "/v1/loads":
                    self._answer(json.dumps({"loads": []}).encode())
                else:
                    self._answer(b"{}")

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with lock:
                    engine.requests.append(("POST", self.path))
                self._answer(json.dumps({"text": "", "meta_info": {"finish_reason": {"type": "length"}}}).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def __enter__(self) -> FakeEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SleepingProcess:
    """A real process standing for an engine (its argv and environment are what the collectors read)."""

    def __init__(self, argv_tail: list[str], env: dict[str, str], pid_file: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(600)",
                                      *argv_tail], stdin=subprocess.PIPE, env=env)
        pid_file.write_text(f"{self.proc.pid}\n")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def local_inventory(path: Path, engine: FakeEngine, *, logs: dict[str, dict] | None = None,
                    pid_files: dict[str, Path] | None = None, url: str | None = None) -> Path:
    """An inventory: a prefill and a decode on the local host, both served by ``engine``."""
    engines = []
    for role in ("prefill", "decode"):
        entry: dict[str, Any] = {"role": role, "name": f"{role}-0", "host": "local", "url": url or engine.url}
        if role == "prefill":
            entry["bootstrap_port"] = 8998
        if logs and role in logs:
            entry["logs"] = logs[role]
        if pid_files and role in pid_files:
            entry["process"] = {"pid_file": str(pid_files[role])}
        engines.append(entry)
    document = {"deployment": {"name": "local-fake", "sglang": "0.5.15", "backend": "nixl"}, "engine": engines}
    path.write_text(tomli_w.dumps(document))
    return path
