"""What the twin's three servers share: process set-up, the aiohttp runner, stop on SIGTERM.

Each server runs as ``python -m forensics.twin.<role> --inventory FILE``; the launcher
sends its stdout and stderr to ``<role>.log`` in the twin's directory. A SIGTERM stops
the event loop and the process leaves with ``os._exit`` so that a non-daemon thread
blocked in ``recv`` (sglang's bootstrap thread is one) cannot keep it alive.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from forensics.inventory.twin_table import TwinSettings
from forensics.twin import endpoints, logformat
from forensics.twin import inventory as inventory_mod
from forensics.twin.metrics import TwinMetrics

log = logging.getLogger("sglang.srt.entrypoints.http_server")

# Fire-and-forget tasks (the delayed AbortReq, the router's drain): the event loop keeps only a
# weak reference to a task, so a task nobody holds can be collected before it runs to the end.
_background: set[asyncio.Task] = set()


def spawn(coro) -> asyncio.Task:
    """Run ``coro`` in the background, referenced until it is done; its exception is retrieved."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task


def watch_scheduler(task: asyncio.Task, role: str) -> asyncio.Task:
    """A scheduler loop that dies takes its process with it, traceback in the log, as sglang's
    scheduler does (its crash handler kills the server): never an engine that answers /ping
    while every request waits forever."""

    def died(done: asyncio.Task) -> None:
        if done.cancelled():
            return
        exc = done.exception()
        if exc is None:
            return
        logging.getLogger(__name__).error(f"twin {role}: the scheduler loop died; the process exits",
                                          exc_info=(type(exc), exc, exc.__traceback__))
        _leave(None, 1)

    task.add_done_callback(died)
    return task


def background_tasks() -> set[asyncio.Task]:
    """The background tasks not yet done (for tests and ``server_info``)."""
    return set(_background)


class EngineEndpoints:
    """The endpoints the prefill and decode servers answer alike, with sglang's PD semantics.

    The server supplies ``settings``, ``version``, ``scheduler`` (``submit(request)``,
    ``abort(rid)``), ``metrics``, ``generate``, ``_wait_for_probe(item)`` (waits for the probe's
    one token), and for the informational routes (:mod:`forensics.twin.endpoints`) ``facts``,
    ``load_values()`` and ``twin_state()``.
    """

    def engine_app(self) -> web.Application:
        """The aiohttp app with the routes an sglang engine serves (metrics counted per request)."""
        from forensics.twin import wire

        app = web.Application(middlewares=[metrics_middleware(self.metrics)])
        for endpoint in wire.ENDPOINTS:
            app.router.add_post(endpoint, self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health)
        app.router.add_get("/metrics", metrics_handler(self.metrics))
        # /v1/models, /model_info, /server_info, /v1/loads and their old names: only those the
        # release registers, shaped by its source (a route it lacks answers FastAPI's 404).
        # A mixed-version twin's decode reads its own release's source.
        root = self.settings.release_of(self.facts.mode)[1]
        self.release_endpoints = endpoints.read_release(root, self.version)
        endpoints.register(app, self.release_endpoints, self)
        app.router.add_post("/abort_request", self.abort_request)
        app.router.add_get("/ping", self.ping)
        return app

    async def health(self, request: web.Request) -> web.Response:
        """sglang's /health and /health_generate: a 1-token request on the fake bootstrap path."""
        from forensics.twin import wire

        probe = wire.GenerationRequest(endpoint="/generate", rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
                                       prompt_tokens=1, max_new_tokens=1, stream=False,
                                       bootstrap_host=wire.FAKE_BOOTSTRAP_HOST, bootstrap_port=None,
                                       bootstrap_room=0)
        item = self.scheduler.submit(probe)
        try:
            await asyncio.wait_for(self._wait_for_probe(item), timeout=self.settings.health_timeout_s)
        except TimeoutError:
            log.error("Health check failed. Server couldn't get a response from detokenizer for last "
                      f"{self.settings.health_timeout_s:.0f} seconds.")
            return web.Response(status=503)
        return web.Response(status=200)

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.metrics.num_aborted.inc()
        self.scheduler.abort(str(body.get("rid", "")))
        return web.Response(status=200)


def process_setup(role: str, title: str | None) -> tuple[inventory_mod.Inventory, TwinSettings]:
    """Parse the role's arguments, set its title (None: keep the command line), configure its log."""
    from forensics.twin.processes import watch_lifeline

    watch_lifeline()  # first: a launcher that dies during our start-up takes us with it
    parser = argparse.ArgumentParser(prog=f"forensics.twin.{role}")
    parser.add_argument("--inventory", required=True)
    args = parser.parse_args()
    inv = inventory_mod.load(args.inventory)
    settings = TwinSettings.from_dict(inv.twin)
    if title is not None:
        try:
            from setproctitle import setproctitle

            setproctitle(title)
        except ImportError:  # pragma: no cover - the twin extra installs it
            pass
    logformat.configure(level=settings.log_level, version=inv.sglang or settings.sglang,
                        disaggregation_debug=settings.disaggregation_debug)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    return inv, settings


def metrics_middleware(metrics: TwinMetrics):
    """sglang's HTTP middleware metrics (0.5.10+): requests, responses, active."""

    @web.middleware
    async def middleware(request: web.Request, handler):
        if metrics.http_requests is None or request.path == "/metrics":
            return await handler(request)
        labels = {"endpoint": request.path, "method": request.method}
        metrics.http_requests.labels(**labels).inc()
        active = metrics.http_active.labels(**labels)
        active.inc()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            active.dec()  # as sglang: when the handler returns, not when a stream ends
            metrics.http_responses.labels(status_code=str(status), **labels).inc()

    return middleware


def metrics_handler(metrics: TwinMetrics):
    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), content_type="text/plain", charset="utf-8")

    return handle


def serve_handed_connections(runner: web.AppRunner, handoff: socket.socket, on_front_gone: Callable[[], None]) -> None:
    """Serve every connection the role's front hands over ``handoff`` (forensics.twin.role_tree):
    each is a client's socket, accepted by the front, served here as if accepted here."""
    loop = asyncio.get_running_loop()
    handoff.setblocking(False)

    def receive() -> None:
        while True:
            try:
                word, fds, _flags, _addr = socket.recv_fds(handoff, 16, 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                word, fds = b"", []
            if not word and not fds:  # the front is gone (PR_SET_PDEATHSIG ends us too)
                loop.remove_reader(handoff.fileno())
                on_front_gone()
                return
            for fd in fds:
                client = socket.socket(fileno=fd)
                client.setblocking(False)
                spawn(loop.connect_accepted_socket(runner.server, client))

    loop.add_reader(handoff.fileno(), receive)


async def start_site(runner: web.AppRunner, host: str, port: int, *, backlog: int = 128) -> None:
    """Serve ``runner`` on the socket the launcher bound for ``port`` (no bind race), else bind it here."""
    from forensics.twin.processes import inherited_listener

    sock = inherited_listener(port)
    if sock is not None:
        await web.SockSite(runner, sock, backlog=backlog).start()
    else:
        await web.TCPSite(runner, host, port, reuse_address=True, backlog=backlog).start()


class UvicornAccessLogger(AbstractAccessLogger):
    """One line per request as sglang's uvicorn writes it under its own ``[time]`` prefix:
    ``INFO:     127.0.0.1:52262 - "GET /health HTTP/1.1" 200 OK`` (readers count these: /health 5xx)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = f"{peer[0]}:{peer[1]}" if peer else "-"
        version = f"{request.version.major}.{request.version.minor}"
        try:
            phrase = HTTPStatus(response.status).phrase
        except ValueError:
            phrase = ""
        self.logger.info(f'INFO:     {client} - "{request.method} {request.path_qs} HTTP/{version}" '
                         f"{response.status} {phrase}".rstrip())


def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    on_start: Callable[[], Awaitable[None]] | None = None,
    on_stop: Callable[[], None] | None = None,
    access_log: bool = False,
    handoff: socket.socket | None = None,
) -> None:
    """Run ``app`` until SIGTERM/SIGINT, then ``on_stop`` and leave at once.

    ``access_log``: write uvicorn's access line for every request, as an sglang server does.
    ``handoff``: serve the connections a role's front hands over it (a scheduler child: tell
    the front when ready, feed sglang's scheduler watchdog) instead of listening on ``port``."""

    async def main() -> None:
        if access_log:
            runner = web.AppRunner(app, handler_cancellation=True, access_log_class=UvicornAccessLogger,
                                   access_log=logging.getLogger("uvicorn.access"))
        else:
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        if handoff is None:
            await start_site(runner, host, port, backlog=2048)
        else:
            serve_handed_connections(runner, handoff, stop.set)
        if on_start is not None:
            await on_start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if handoff is not None:
            from forensics.twin.role_tree import READY, start_scheduler_watchdog

            feed = start_scheduler_watchdog()

            def turn() -> None:  # the watchdog starves only if this loop stops turning
                feed()
                loop.call_later(1.0, turn)

            turn()
            handoff.send(READY)
        log.info("The server is fired up and ready to roll!")  # entrypoints/http_server.py, as 0.5.x writes it
        await stop.wait()

    started = time.time()
    try:
        asyncio.run(main())
    except Exception as exc:
        logging.getLogger(__name__).exception(f"twin server failed after {time.time() - started:.1f}s: {exc}")
        _leave(on_stop, 1)
    _leave(on_stop, 0)


def run_engine_role(role: str, settings: TwinSettings, port: int, make_server: Callable[[], EngineEndpoints], *,
                    front_work: Callable[[], Callable[[], None]] | None = None) -> None:
    """An engine role as sglang's tree (forensics.twin.role_tree): the forked scheduler serves
    ``make_server()``'s app on the connections the front hands it; the front forks the detokenizer,
    starts ``front_work`` (what launch_server's process runs besides, returning the check to make
    once the scheduler is ready) and serves ``port``. Never returns."""
    from pathlib import Path

    from forensics.twin.processes import bind_listener, inherited_listener
    from forensics.twin.role_tree import RoleFront

    front = RoleFront(role, Path(settings.directory))
    handoff = front.fork_scheduler()
    if handoff is not None:  # the scheduler
        server = make_server()
        serve(server.app, settings.host, port, on_start=server.start, on_stop=server.stop, access_log=True,
              handoff=handoff)
    front.fork_detokenizer()
    when_ready = front_work() if front_work is not None else None
    front.serve(inherited_listener(port) or bind_listener(settings.host, port), when_ready=when_ready)


def _leave(on_stop: Callable[[], None] | None, status: int) -> None:
    if on_stop is not None:
        try:
            on_stop()
        except Exception:  # leaving anyway; the log shows why teardown failed
            logging.getLogger(__name__).exception("teardown failed")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
