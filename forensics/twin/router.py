"""The twin's router, modelled on sglang_router's mini_lb (facts §6.3).

For each request: a random ``bootstrap_room`` (``random.randint(0, 2**63 - 1)``), the
prefill's host and bootstrap port added to the body, the same body POSTed to the
prefill and the decode concurrently; non-streaming returns the decode's JSON once both
answered (a decode that failed the request is answered at once, see ``forward``),
streaming relays the decode's stream.

When the router's client disconnects, the router closes both upstream requests, so a
killed client becomes an AbortReq on the decode. Whether the production routers
propagate a disconnect like this is unconfirmed upstream; the twin does, and says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from urllib.parse import urlparse

import aiohttp
from aiohttp import web

from forensics.twin import httpserver, wire
from forensics.twin.settings import TwinSettings

log = logging.getLogger("sglang_router.mini_lb")
REQUEST_TIMEOUT_S = 1800  # sglang_router's request_timeout_secs


class Router:
    def __init__(self, settings: TwinSettings) -> None:
        self.settings = settings
        self.prefill = settings.url(settings.prefill_port)
        self.decode = settings.url(settings.decode_port)
        self.bootstrap_host = urlparse(self.prefill).hostname
        self.session: aiohttp.ClientSession | None = None
        self.counters = {"requests": 0, "client_disconnects": 0, "completed": 0, "decode_failed": 0}
        self.started = time.time()
        app = web.Application()
        for endpoint in wire.ENDPOINTS:
            app.router.add_post(endpoint, self.forward)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/server_info", self.server_info)
        self.app = app

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "body must be a JSON object"}}, status=400)
        self.counters["requests"] += 1
        body = dict(body, bootstrap_host=self.bootstrap_host, bootstrap_port=self.settings.bootstrap_port,
                    bootstrap_room=random.randint(0, 2**63 - 1))
        path = request.path
        prefill_call = self.session.post(self.prefill + path, json=body)
        decode_call = self.session.post(self.decode + path, json=body)
        responses: list[aiohttp.ClientResponse] = []
        try:
            if not body.get("stream"):
                prefill_task = asyncio.ensure_future(prefill_call)
                try:
                    decode_resp = await decode_call
                    responses.append(decode_resp)
                    payload = await decode_resp.read()
                    if decode_resp.status != 200:
                        # The decode failed the request (its release's own reason): that is the
                        # answer, at once. mini_lb would still wait for the prefill, whose NIXL room
                        # before 0.5.18 never times out once its decode gave up: a silent hang. The
                        # Rust PD router waits only for the decode. Closing the prefill request makes
                        # it an AbortReq there, as a client that went away.
                        self.counters["decode_failed"] += 1
                        return web.Response(body=payload, status=decode_resp.status, content_type="application/json")
                    prefill_resp = await prefill_task
                    responses.append(prefill_resp)
                    await prefill_resp.read()
                finally:
                    prefill_task.cancel()  # a no-op once it is done
                    if prefill_task.done() and not prefill_task.cancelled() and prefill_task.exception() is None \
                            and prefill_task.result() not in responses:
                        prefill_task.result().close()
                self.counters["completed"] += 1
                return web.Response(body=payload, status=decode_resp.status, content_type="application/json")
            prefill_resp, decode_resp = await asyncio.gather(prefill_call, decode_call)
            responses = [prefill_resp, decode_resp]
            # A gone client closes the prefill connection under the drain: that outcome is expected,
            # so spawn retrieves it rather than leave "Task exception was never retrieved" in the log.
            drain = httpserver.spawn(prefill_resp.read())
            response = web.StreamResponse(status=decode_resp.status,
                                          headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for chunk in decode_resp.content.iter_any():
                await response.write(chunk)
            await drain
            self.counters["completed"] += 1
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.counters["client_disconnects"] += 1
            raise
        finally:
            for upstream in responses:
                upstream.close()  # a gone client closes both upstream connections

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)  # mini_lb: always

    async def health_generate(self, request: web.Request) -> web.Response:
        async def probe(url: str) -> None:
            try:
                async with self.session.get(url + "/health_generate") as resp:
                    await resp.read()
            except aiohttp.ClientError:
                pass

        await asyncio.gather(probe(self.prefill), probe(self.decode))
        return web.Response(status=200)  # mini_lb does not look at the status codes

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"router": "mini_lb (twin)", "prefill": [self.prefill], "decode": [self.decode],
                                  "counters": dict(self.counters), "uptime_s": round(time.time() - self.started, 3)})


def main() -> None:
    inv, settings = httpserver.process_setup("router", "sglang::router")
    router = Router(settings)
    httpserver.serve(router.app, settings.host, settings.router_port, on_start=router.start)


if __name__ == "__main__":
    main()
