"""The twin's router, modelled on sglang_router's mini_lb (facts §6.3).

For each request: a random ``bootstrap_room`` (``random.randint(0, 2**63 - 1)``), the
prefill's host and bootstrap port added to the body, the same body POSTed to the
prefill and the decode concurrently; non-streaming returns the decode's JSON once both
answered (a decode that failed the request is answered at once, see ``forward``),
streaming relays the decode's stream.

When the router's client disconnects, the router closes both upstream requests, so a
killed client becomes an AbortReq on the decode. Whether the production routers
propagate a disconnect like this is unconfirmed upstream; the twin does, and says so.

The informational routes are mini_lb's (sglang-router 0.3.2, ``sglang_router/mini_lb.py``):
``/v1/models`` relays the first prefill's ``/v1/models``; ``/model_info`` and
``/get_model_info`` relay its ``/model_info`` (502 when it does not answer 200, as on a
release before 0.5.6, which has no ``/model_info``); ``/get_server_info`` asks every prefill
and decode for its ``/get_server_info`` and answers ``{"internal_states": <the decodes'>,
"prefill": [...], "decode": [...]}``, plus the twin router's own counters under ``"twin"``.
mini_lb has no ``/server_info``, ``/v1/loads`` or ``/get_load``: 404, FastAPI's body.
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

from forensics.inventory.twin_table import TwinSettings
from forensics.twin import endpoints, httpserver, wire

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
        app = web.Application(middlewares=[endpoints.fastapi_not_found])
        for endpoint in wire.ENDPOINTS:
            app.router.add_post(endpoint, self.forward)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/get_server_info", self.get_server_info)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/model_info", self.model_info)
        app.router.add_get("/get_model_info", self.model_info)
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
        delivered = False  # the whole stream reached the client
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
            delivered = True
            await drain
            self.counters["completed"] += 1
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            # A client that read its whole stream and closed while the prefill's answer was still
            # draining (a loaded machine) went away after its answer: completed, not a disconnect.
            self.counters["completed" if delivered else "client_disconnects"] += 1
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

    async def models(self, request: web.Request) -> web.Response:
        """mini_lb: the first prefill's ``/v1/models``, its status passed on when not 200."""
        try:
            async with self.session.get(self.prefill + "/v1/models") as resp:
                if resp.status != 200:
                    return web.json_response({"detail": f"Prefill server error: Status {resp.status}"},
                                             status=resp.status)
                return web.json_response(await resp.json())
        except (aiohttp.ClientError, ValueError) as exc:
            return web.json_response({"detail": str(exc)}, status=500)

    async def model_info(self, request: web.Request) -> web.Response:
        """mini_lb: the first prefill's ``/model_info``; 502 when it answers otherwise, 503 unreachable."""
        try:
            async with self.session.get(self.prefill + "/model_info") as resp:
                if resp.status != 200:
                    text = await resp.text()
                    return web.json_response(
                        {"detail": f"Failed to get model info from {self.prefill}Status: {resp.status}, "
                                   f"Response: {text}"}, status=502)
                return web.json_response(await resp.json())
        except aiohttp.ClientError:
            return web.json_response({"detail": "Failed to get model info from backend"}, status=503)

    async def get_server_info(self, request: web.Request) -> web.Response:
        """mini_lb: every server's ``/get_server_info``; the decodes' internal states first (or mini_lb's
        placeholder when there are none). ``"twin"``: the twin router's counters (not in mini_lb)."""
        infos = {}
        for role, url in (("prefill", self.prefill), ("decode", self.decode)):
            async with self.session.get(url + "/get_server_info") as resp:
                infos[role] = [await resp.json()]
        states = [s for info in infos["decode"] for s in info.get("internal_states", [])]
        return web.json_response({
            "internal_states": states or [{"last_gen_throughput": 0.0, "avg_spec_accept_length": None}],
            "prefill": infos["prefill"], "decode": infos["decode"],
            "twin": {"router": "mini_lb (twin)", "counters": dict(self.counters),
                     "uptime_s": round(time.time() - self.started, 3)},
        })

def main() -> None:
    inv, settings = httpserver.process_setup("router", "sglang::router")
    router = Router(settings)
    httpserver.serve(router.app, settings.host, settings.router_port, on_start=router.start)


if __name__ == "__main__":
    main()
