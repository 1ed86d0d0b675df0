"""The twin's prefill server: the release's real bootstrap loop behind an sglang-like scheduler.

In one process (title ``sglang::scheduler``, stderr captured to ``prefill.log``):

* the release's own NIXL prefill KV manager and ``bootstrap_thread`` on a real ZMQ PULL
  socket, through the engine sandbox (:class:`forensics.sandbox.prefill.PrefillLoop`),
  from the twin's own copy of the release's files;
* the release's own bootstrap HTTP server (its ``CommonKVBootstrapServer`` thread, on the
  bootstrap port the launcher bound), where the prefill rank registers its PULL endpoint with
  the release's own registration call;
* a scheduler loop moving requests through the bootstrap queue (rooms created by the
  release's own sender class, bootstrapped only by the real loop), a prefill "forward"
  that takes ``tokens / prefill_rate`` seconds and writes the room's KV pages into this
  engine's KV slots (host memory registered by the release's ``register_buffer_to_engine``),
  and the inflight queue. From 0.5.12 the release's own ``sender.send`` enqueues the pages
  and the release's own ``transfer_worker`` threads (started by the statements of its
  ``NixlKVManager.__init__``) WRITE them with the release's prepared NIXL handles into the
  decode's registered pool, notifying with sglang's tags; before 0.5.12 sglang transfers in
  the scheduler thread, and so does the twin (its own NIXL WRITE, synchronously);
* ``/generate`` and the OpenAI endpoints (what the router sends), ``/health`` and
  ``/health_generate`` with sglang's PD semantics (a fake-bootstrap 1-token batch),
  ``/metrics``, and the informational routes the release serves (``/server_info``, ``/v1/loads``,
  ``/v1/models``, ...: :mod:`forensics.twin.endpoints`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiohttp import web

from forensics.inventory.twin_table import TwinSettings
from forensics.twin import httpserver, role_tree, wire
from forensics.twin import nixl_transfer as nx
from forensics.twin.logformat import prefill_batch_line
from forensics.twin.metrics import TwinMetrics

log = logging.getLogger("sglang.srt.managers.scheduler")
prefill_log = logging.getLogger("sglang.srt.disaggregation.prefill")
IDLE_METRICS_INTERVAL_S = 30.0
AUX_BYTES = 8
AUX_SLOTS = 4096  # metadata buffers (the decode's aux pool has as many)


@dataclass
class PrefillRequest:
    req: wire.GenerationRequest
    done: asyncio.Future
    entered: float = field(default_factory=time.monotonic)
    bootstrapped_at: float | None = None
    aborted: bool = False
    kv_slots: np.ndarray | None = None  # this engine's KV slots holding the room's pages
    aux_index: int | None = None
    sent_at: float | None = None  # handed to the release's sender (transfer_worker path)
    result: dict | None = None  # the synchronous transfer's outcome (before 0.5.12)
    error: BaseException | None = None


class BootstrapServer:
    """The prefill's bootstrap HTTP server: the release's own, unchanged.

    The class is the one the release's ``get_kv_class(backend, BOOTSTRAP_SERVER)`` picks
    (``CommonKVBootstrapServer`` or its backend subclass), built by its own ``__init__``, which
    starts its own ``_run_server`` thread and event loop with its own routes (``/route`` PUT/GET
    in each release's shape, ``/health`` from 0.5.3, ``/register_dp_rank`` and ``/query_dp_ranks``
    from 0.5.10). The prefill rank registers with the release's own ``register_to_bootstrap``
    (``_register_to_bootstrap`` up to 0.5.9) from the prefill's KV manager, so every answer the
    decode reads is that release's. Only the listening socket is the twin's: the launcher bound
    it (no port race), and the ``TCPSite`` the release's ``_run_server`` asks for serves it.
    """

    @staticmethod
    def server_class(release, backend: str) -> type:
        utils = release.module("utils")
        return utils.get_kv_class(utils.TransferBackend(backend), utils.KVClassType.BOOTSTRAP_SERVER)

    def __init__(self, release, backend: str, host: str, port: int) -> None:
        cls = self.server_class(release, backend)
        module_globals = cls._run_server.__globals__  # the module whose _run_server this is
        module_globals["web"] = _ListenerWeb(module_globals["web"], port)
        # 0.5.1 takes (port) and listens on every interface; later releases take (host, port).
        takes_host = "host" in inspect.signature(cls.__init__).parameters
        self.server = cls(host, port) if takes_host else cls(port)
        self.thread = self.server.thread
        self.port = port

    def check_registered(self) -> None:
        """The prefill rank's PUT /route reached this server (the release logs a failure and carries on)."""
        if not self.server.prefill_port_table:
            raise RuntimeError(f"the prefill rank did not register with the release's bootstrap server on "
                               f"{self.port} (see the release's error line above)")


def register_rank(manager, host: str, port: int, http_port: int) -> None:
    """The prefill rank's PUT /route to the bootstrap server on ``port``, by the release's own
    registration method (blocking), as the release's KV manager ``__init__`` makes it."""
    register = getattr(manager, "register_to_bootstrap", None) or manager._register_to_bootstrap
    # What CommonKVManager.__init__ reads from the server args (single node: no dist_init_addr).
    manager.bootstrap_host, manager.bootstrap_port, manager.dist_init_addr = host, port, None
    manager.server_args.port = http_port  # 0.5.16+ registers the prefill's HTTP port too
    if not hasattr(manager, "dp_size"):  # up to 0.5.2, CommonKVManager.__init__ keeps server_args.dp_size
        manager.dp_size = manager.server_args.dp_size
    # sglang.srt.utils is stubbed in the sandbox (it imports torch); the network helpers up to
    # 0.5.9 take their place here: this host is the rank's address, as get_ip would find it.
    from forensics.sandbox.stubs import Stub

    module_globals = register.__func__.__globals__
    helpers = {"get_ip": lambda: host, "get_local_ip_by_remote": lambda: host,
               "maybe_wrap_ipv6_address": lambda h: f"[{h}]" if ":" in h and not h.startswith("[") else h}
    for name, helper in helpers.items():
        if isinstance(module_globals.get(name), Stub):
            module_globals[name] = helper
    if "requests" in module_globals:
        module_globals["requests"] = _StubFreeRequests(module_globals["requests"], Stub)
    register()


class _StubFreeRequests:
    """``requests`` for the release's registration: a payload field whose value came from a
    server-args accessor the sandbox stubs (0.5.22+ reads ``get_parallel()``, ``get_serving()``,
    ``get_disagg()``) is left out rather than sent as a stub, so the release's server applies its
    own default for it (it reads each such field with ``.get``); a required field left out would
    fail the PUT there, loudly."""

    def __init__(self, requests_module, stub_type: type) -> None:
        self._requests = getattr(requests_module, "_requests", requests_module)
        self._stub = stub_type

    def __getattr__(self, name: str):
        return getattr(self._requests, name)

    def put(self, url, *args, json=None, **kwargs):
        if isinstance(json, dict):
            json = {key: value for key, value in json.items() if not isinstance(value, self._stub)}
        return self._requests.put(url, *args, json=json, **kwargs)


class _ListenerWeb:
    """``aiohttp.web`` for the release's bootstrap server module, except that ``TCPSite`` on the
    bootstrap port serves the listening socket the launcher passed (bound before the twin started)."""

    def __init__(self, web_module, port: int) -> None:
        self._web, self._port = getattr(web_module, "_web", web_module), port

    def __getattr__(self, name: str):
        return getattr(self._web, name)

    def TCPSite(self, runner, host=None, port=None, **kwargs):  # noqa: N802 - aiohttp's name
        from forensics.twin.processes import inherited_listener

        sock = inherited_listener(port) if port == self._port else None
        if sock is None:
            return self._web.TCPSite(runner, host=host, port=port, **kwargs)
        return self._web.SockSite(runner, sock, **{k: v for k, v in kwargs.items() if k in ("backlog",)})


class PrefillScheduler:
    """The scheduler loop, its queues and the KV transfers (an asyncio task plus worker threads)."""

    def __init__(self, settings: TwinSettings, loop_owner, metrics: TwinMetrics, version: str) -> None:
        self.settings = settings
        self.engine = loop_owner  # forensics.sandbox.prefill.PrefillLoop
        self.KVPoll = loop_owner.KVPoll
        # Before 0.5.13 the backend's conn.py defines KVTransferError (Mooncake's does); 0.5.12's NIXL
        # path has none: its sender's failure_exception raises the stored error or a bare RuntimeError.
        common = loop_owner.release.module("common.conn")
        self.KVTransferError = getattr(common, "KVTransferError", None) or getattr(loop_owner.module, "KVTransferError",
                                                                                   None)
        self.metrics = metrics
        self.version = version
        self.incoming: asyncio.Queue[PrefillRequest] = asyncio.Queue()
        self.bootstrap_queue: list[PrefillRequest] = []
        self.waiting_queue: list[PrefillRequest] = []
        self.inflight_queue: list[PrefillRequest] = []
        self.health_probes: list[PrefillRequest] = []
        self.aborts: set[str] = set()
        self.wakeup = asyncio.Event()
        agent = loop_owner.agent
        self.agent = getattr(agent, "real_agent", agent)
        self.kv = loop_owner.host_kv
        self.page_bytes = self.kv.kv_item_bytes
        self.free_slots = list(range(self.kv.kv[0].nbytes // self.page_bytes))
        self.free_aux = list(range(self.kv.aux[0].nbytes // self.kv.aux_item_bytes))
        self._sources = threading.local()
        self.last_idle_metrics = 0.0
        self.last_input_throughput = 0.0
        self.counters = {"bootstrapped": 0, "transferred": 0, "transfer_failed": 0, "bootstrap_failed": 0,
                         "aborted": 0, "prefill_batches": 0, "health_batches": 0}

    # ------------------------------------------------------------ entry points

    def submit(self, req: wire.GenerationRequest) -> PrefillRequest:
        item = PrefillRequest(req=req, done=asyncio.get_running_loop().create_future())
        self.incoming.put_nowait(item)
        self.wakeup.set()
        return item

    def abort(self, rid: str) -> None:
        """An AbortReq from the tokenizer (client gone): matched by rid prefix, as sglang does."""
        self.aborts.add(rid)
        self.wakeup.set()

    def _fail(self, item: PrefillRequest, stage: str, counter) -> None:
        """sglang's WARNING line for a failed prefill request ("bootstrap" or "transfer" queue)."""
        room = item.req.bootstrap_room
        prefill_log.warning(
            f"Prefill {stage} failed for request rank=0 req.rid={item.req.rid!r} "
            f"req.bootstrap_room={room} with exception {self._failure(room)}"
        )
        counter.inc()
        self.counters[f"{stage}_failed"] += 1
        self._finish(item, error=f"{stage} failed")

    # ------------------------------------------------------------------- loop

    async def run(self) -> None:
        while True:
            progressed = self._admit()
            self._apply_aborts()
            progressed |= self._poll_bootstrap_queue()
            if self.waiting_queue or self.health_probes:
                progressed |= await self._run_batch()
            progressed |= self._poll_inflight_queue()
            if not progressed:
                self._maybe_idle_metrics()
                self.wakeup.clear()
                try:
                    await asyncio.wait_for(self.wakeup.wait(), timeout=0.005)
                except TimeoutError:
                    pass

    def _admit(self) -> bool:
        admitted = False
        while not self.incoming.empty():
            item = self.incoming.get_nowait()
            admitted = True
            if item.req.is_health_probe:
                self.health_probes.append(item)  # FakeKVSender: no bootstrap, no transfer
                continue
            self.engine.create_rooms([item.req.bootstrap_room])  # the release's sender -> Bootstrapping
            self.bootstrap_queue.append(item)
        return admitted

    def _apply_aborts(self) -> None:
        if not self.aborts:
            return
        aborts, self.aborts = self.aborts, set()
        for item in self.bootstrap_queue:
            if any(item.req.rid.startswith(rid) for rid in aborts):
                item.aborted = True
                prefill_log.debug(f"Abort bootstrap queue request. req.rid={item.req.rid!r}")
                sender = self.engine.senders.get(item.req.bootstrap_room)
                # As the release's scheduler: ``if hasattr(req.disagg_kv_sender, "abort")``. Senders
                # up to 0.5.9 have no abort, and there the request stays in the bootstrap queue
                # until the decode's transfer info bootstraps it (NIXL: no bootstrap timeout).
                if sender is not None and hasattr(sender, "abort"):
                    sender.abort()  # the release's own CommonKVSender.abort
        # As sglang's abort_request: a request in the waiting queue (bootstrapped, not prefilled) is
        # popped ("Abort method 1") and never prefilled; its sender was bootstrapped, so no abort().
        keep = []
        for item in self.waiting_queue:
            if any(item.req.rid.startswith(rid) for rid in aborts):
                item.aborted = True
                self._free(item)
                self._finish(item, error="aborted")
                log.debug(f"Abort queued request. req.rid={item.req.rid!r}")
            else:
                keep.append(item)
        self.waiting_queue = keep
        for item in self.inflight_queue:
            if any(item.req.rid.startswith(rid) for rid in aborts):
                item.aborted = True

    def _room_state(self, room: int) -> int:
        return int(self.engine.manager.request_status.get(room, self.KVPoll.Failed))

    def _failure(self, room: int) -> str:
        mgr = self.engine.manager
        with mgr.failure_lock:
            reason = mgr.failure_records.pop(room, None) or f"{type(mgr).__name__[:-len('KVManager')]}KVSender Exception"
        return str(self.KVTransferError(room, reason)) if self.KVTransferError else reason

    def _poll_bootstrap_queue(self) -> bool:
        moved = False
        keep = []
        for item in self.bootstrap_queue:
            room = item.req.bootstrap_room
            state = self._room_state(room)
            if state == self.KVPoll.Failed:
                self._fail(item, "bootstrap", self.metrics.bootstrap_failed)
                moved = True
            elif state >= self.KVPoll.WaitingForInput:  # the real loop got the decode's transfer info
                item.bootstrapped_at = time.monotonic()
                self.metrics.observe_stage("prefill_bootstrap", item.bootstrapped_at - item.entered)
                self.counters["bootstrapped"] += 1
                self.waiting_queue.append(item)
                moved = True
            else:
                keep.append(item)
        self.bootstrap_queue = keep
        return moved

    async def _run_batch(self) -> bool:
        batch, tokens = [], 0
        while self.waiting_queue and (not batch or tokens + self.waiting_queue[0].req.prompt_tokens
                                      <= self.settings.max_prefill_tokens):
            if not self._allocate(self.waiting_queue[0]):
                break  # no free KV slots: the rest waits for transfers to finish, as sglang's allocator
            item = self.waiting_queue.pop(0)
            self.metrics.queue_time.observe(time.monotonic() - (item.bootstrapped_at or item.entered))
            tokens += item.req.prompt_tokens
            batch.append(item)
        probes, self.health_probes = (self.health_probes, []) if not batch else ([], self.health_probes)
        if not batch and not probes:
            return False
        new_tokens = tokens if batch else len(probes)
        started = time.monotonic()
        await asyncio.sleep(new_tokens / self.settings.prefill_rate_tps)  # the forward pass
        elapsed = max(time.monotonic() - started, 1e-6)
        self.last_input_throughput = new_tokens / elapsed
        for item in batch:
            self.inflight_queue.append(item)
            if not item.aborted:
                self._send(item)
        self.counters["prefill_batches" if batch else "health_batches"] += 1
        log.info(prefill_batch_line(
            self.version, new_seq=len(batch) or len(probes), new_token=new_tokens, token_usage=0.0,
            running_req=0, queue_req=len(self.waiting_queue), bootstrap_req=len(self.bootstrap_queue),
            inflight_req=len(self.inflight_queue), input_throughput=self.last_input_throughput,
        ))
        self.metrics.observe_forward("prefill", new_tokens)
        self._report_stats()
        for item in probes:
            self._finish(item, meta={"health": True})
        return True

    def _report_stats(self) -> None:
        """``report_prefill_stats``: the gauges move only here and on the idle tick."""
        self.metrics.prefill_bootstrap_queue.set(len(self.bootstrap_queue))
        self.metrics.prefill_inflight_queue.set(len(self.inflight_queue))
        self.metrics.num_queue_reqs.set(len(self.waiting_queue))
        self.metrics.num_running_reqs.set(0)
        self.metrics.write_stats()

    def _maybe_idle_metrics(self) -> None:
        fully_idle = not (self.bootstrap_queue or self.waiting_queue or self.inflight_queue)
        now = time.monotonic()
        if fully_idle and now - self.last_idle_metrics >= IDLE_METRICS_INTERVAL_S:
            self.last_idle_metrics = now
            self._report_stats()

    def _poll_inflight_queue(self) -> bool:
        moved = False
        keep = []
        for item in self.inflight_queue:
            room = item.req.bootstrap_room
            if item.sent_at is None and item.result is None and item.error is None:
                self._free(item)  # aborted before its transfer started
                self._finish(item, error="aborted")
                moved = True
                continue
            state = self._room_state(room)
            if item.sent_at is not None and state not in (self.KVPoll.Success, self.KVPoll.Failed):
                keep.append(item)  # the release's transfer_worker has it
                continue
            moved = True
            self._free(item)
            if item.error is None and state == self.KVPoll.Success:
                self.counters["transferred"] += 1
                self._finish(item, meta=item.result if item.sent_at is None else self._transferred(item))
            else:
                self._fail(item, "transfer", self.metrics.transfer_failed)
        self.inflight_queue = keep
        return moved

    def _finish(self, item: PrefillRequest, *, meta: dict | None = None, error: str | None = None) -> None:
        self.engine.senders.pop(item.req.bootstrap_room, None)
        getattr(self.engine.manager, "exceptions", {}).pop(item.req.bootstrap_room, None)
        if not item.done.done():
            item.done.set_result({"error": error} if error else (meta or {}))

    # -------------------------------------------------------------- transfer

    def _allocate(self, item: PrefillRequest) -> bool:
        """This engine's KV slots (one per decode page) and a metadata buffer for ``item``."""
        if item.kv_slots is not None or item.aborted:
            return True
        count = nx.pages_for(item.req.prompt_tokens * self.settings.bytes_per_token, self.page_bytes)
        if count > len(self.free_slots) or not self.free_aux:
            return False
        item.kv_slots = np.asarray(self.free_slots[:count], dtype=np.int32)
        del self.free_slots[:count]
        item.aux_index = self.free_aux.pop()
        return True

    def _free(self, item: PrefillRequest) -> None:
        if item.kv_slots is not None:
            self.free_slots.extend(int(s) for s in item.kv_slots)
            item.kv_slots = None
        if item.aux_index is not None:
            self.free_aux.append(item.aux_index)
            item.aux_index = None

    def _write_kv(self, item: PrefillRequest, nbytes: int) -> None:
        """What the forward pass leaves in the KV cache: the room's pages in every layer's K and V
        (the same bytes in each, so the decode can check any), and the room in its aux slot."""
        room = item.req.bootstrap_room
        pages = np.zeros(len(item.kv_slots) * self.page_bytes, dtype=np.uint8)
        pages[:nbytes] = nx.kv_payload(room, nbytes)
        pages = pages.reshape(len(item.kv_slots), self.page_bytes)
        for region in self.kv.kv:
            region.reshape(-1, self.page_bytes)[item.kv_slots] = pages
        aux = self.kv.aux[0].reshape(-1, self.kv.aux_item_bytes)[item.aux_index]
        aux[:] = 0
        aux[:AUX_BYTES] = np.frombuffer(np.int64(room & 0x7FFFFFFFFFFFFFFF).tobytes(), dtype=np.uint8)

    def _send(self, item: PrefillRequest) -> None:
        """Hand the room's pages to the release: its sender enqueues them for its transfer_worker
        threads (0.5.12+); before 0.5.12 the scheduler thread transfers them itself, as sglang's."""
        room = item.req.bootstrap_room
        sender = self.engine.senders.get(room)
        if not self.engine.transfers_in_workers or sender is None:
            try:
                item.result = self._transfer(item)
            except Exception as exc:  # logged and recorded by _transfer
                item.error = exc
            return
        nbytes = item.req.prompt_tokens * self.settings.bytes_per_token
        self._write_kv(item, nbytes)
        item.sent_at = time.perf_counter()
        try:
            sender.init(len(item.kv_slots), item.aux_index)  # as the scheduler does once bootstrapped
            sender.send(item.kv_slots)  # the release's send -> add_transfer_request -> a worker's queue
        except Exception as exc:
            logging.getLogger("sglang.srt.disaggregation.nixl.conn").exception(
                f"Unexpected transfer worker error for room {room}")
            self.engine.manager.record_failure(room, str(exc))
            self.engine.manager.update_status(room, self.KVPoll.Failed)
            item.error = exc

    def _transferred(self, item: PrefillRequest) -> dict:
        latency = time.perf_counter() - item.sent_at
        nbytes = item.req.prompt_tokens * self.settings.bytes_per_token
        bootstrap_s = (item.bootstrapped_at - item.entered) if item.bootstrapped_at else None
        self.metrics.observe_transfer(latency, nbytes, bootstrap_s)
        self.metrics.observe_stage("prefill_transfer_kv_cache", latency)
        return {"kv_bytes": nbytes, "transfer_ms": round(latency * 1000, 3)}

    def _source(self, nbytes: int) -> nx.RegisteredSource:
        source = getattr(self._sources, "buffer", None)
        if source is None or source.buffer.nbytes < nbytes + AUX_BYTES:
            if source is not None:
                source.close()
            size = max(self.settings.max_prefill_tokens * self.settings.bytes_per_token, nbytes) + AUX_BYTES
            source = nx.RegisteredSource(self.agent, size)
            self._sources.buffer = source
        return source

    def _transfer(self, item: PrefillRequest) -> dict:
        """Write the room's KV pages and aux into every decode that sent transfer info (in the
        scheduler thread: releases before 0.5.12, which have no transfer_worker threads)."""
        room = item.req.bootstrap_room
        mgr = self.engine.manager
        started = time.perf_counter()
        nbytes = item.req.prompt_tokens * self.settings.bytes_per_token
        try:
            infos = dict(mgr.transfer_infos.get(room, {}))
            if not infos:
                raise RuntimeError(f"room {room} has no transfer info")
            source = self._source(nbytes)
            payload = source.view(nbytes)
            payload[:] = nx.kv_payload(room, nbytes)
            aux = source.buffer[-AUX_BYTES:]
            aux[:] = np.frombuffer(np.int64(room & 0x7FFFFFFFFFFFFFFF).tobytes(), dtype=np.uint8)
            for agent_name, info in infos.items():
                peer = mgr.decode_kv_args_table[agent_name]
                # 0.5.1's decode sends no item length (0.5.2 adds it): sglang writes with its own (equal TP).
                item_len = getattr(peer, "dst_kv_item_len", None) or self.page_bytes
                nx.write_pages(self.agent, agent_name, payload, peer.dst_kv_ptrs[0], item_len,
                               info.dst_kv_indices, nx.kv_tag(room))
                aux_item = nx.AUX_ITEM_BYTES
                nx.write_pages(self.agent, agent_name, aux, peer.dst_aux_ptrs[0], aux_item,
                               np.array([info.dst_aux_index]), nx.aux_tag(room))
            mgr.update_status(room, self.KVPoll.Success)
        except Exception as exc:
            logging.getLogger("sglang.srt.disaggregation.nixl.conn").exception(
                f"Failed to send kv chunk of room {room}"
            )
            if hasattr(mgr, "record_failure"):  # absent up to 0.5.2: the status alone says Failed
                mgr.record_failure(room, f"Failed to send kv chunk of {room} to decode: {exc}")
            mgr.update_status(room, self.KVPoll.Failed)
            raise
        latency = time.perf_counter() - started
        bootstrap_s = (item.bootstrapped_at - item.entered) if item.bootstrapped_at else None
        self.metrics.observe_transfer(latency, nbytes, bootstrap_s)
        self.metrics.observe_stage("prefill_transfer_kv_cache", latency)
        return {"kv_bytes": nbytes, "transfer_ms": round(latency * 1000, 3)}


class PrefillServer(httpserver.EngineEndpoints):
    def __init__(self, settings: TwinSettings, version: str) -> None:
        from forensics.sandbox.host_memory import HostKV
        from forensics.sandbox.prefill import PrefillLoop
        from forensics.sandbox.shim import load_release

        self.settings = settings
        self.version = version
        self.release = load_release(settings.sglang_root, version=version)
        # KV slots as large as the decode's pages (so the release's transfer moves whole pages), room
        # for two full prefill batches in flight.
        slots = max(64, 2 * nx.pages_for(settings.max_prefill_tokens * settings.bytes_per_token, settings.page_bytes))
        kv = HostKV.allocate(slots=slots, kv_item_bytes=settings.page_bytes, aux_slots=AUX_SLOTS,
                             aux_item_bytes=nx.AUX_ITEM_BYTES)
        # --- backend dispatch: Mooncake moves pages with the release's own MooncakeTransferEngine ---
        engine = None
        if settings.backend == "mooncake":
            from forensics.sandbox.mooncake_engine import make_engine

            engine = make_engine(settings.sglang_root, version, settings.host)
        # --- end backend dispatch ---
        self.loop = PrefillLoop(self.release, backend=settings.backend, host=settings.host, capture_logs=False,
                                kv=kv, transfer_workers=True, mooncake_engine=engine)
        self.metrics = TwinMetrics(version, "prefill")
        self.metrics.follow_cpu_files(role_tree.cpu_files(Path(settings.directory), "prefill"))
        self.scheduler = PrefillScheduler(settings, self.loop, self.metrics, version)
        # As the release's KV manager __init__ does, at once (no executor thread left behind), to
        # the bootstrap server the front runs (forensics.twin.role_tree).
        register_rank(self.loop.manager, settings.host, settings.bootstrap_port, settings.prefill_port)
        self.started = time.time()
        self.app = self.engine_app()

    async def start(self) -> None:
        self.task = httpserver.watch_scheduler(asyncio.get_running_loop().create_task(self.scheduler.run()), "prefill")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        endpoint = request.path
        try:
            req = wire.parse(endpoint, await request.json())
        except (wire.BadRequest, json.JSONDecodeError) as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        if req.bootstrap_room is None:
            return web.json_response({"error": {"message": "PD prefill needs bootstrap_room"}}, status=400)
        item = self.scheduler.submit(req)
        done = item.done
        # observe_one_finished_request: the prefill's tokenizer manager sees one output token per request
        done.add_done_callback(lambda f: None if f.cancelled() or "error" in (f.result() or {}) else
                               self.metrics.observe_finished(prompt_tokens=req.prompt_tokens, generation_tokens=1,
                                                             e2e_s=time.monotonic() - item.entered))
        if not req.stream:
            try:
                result = await asyncio.shield(item.done)
            except asyncio.CancelledError:
                self._abort_later(req.rid, 0.0)  # non-streaming: the tokenizer aborts at once
                raise
            return web.json_response(wire.final_response(req, "", result))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            result = await asyncio.shield(item.done)
            await response.write(wire.sse(wire.stream_chunk(req, 0, "", result)))
            await response.write(wire.sse("[DONE]"))
        except asyncio.CancelledError:
            self._abort_later(req.rid, self.settings.abort_delay_s)
            raise
        return response

    def _abort_later(self, rid: str, delay: float) -> None:
        async def abort() -> None:
            await asyncio.sleep(delay)
            self.metrics.num_aborted.inc()
            self.scheduler.abort(rid)

        httpserver.spawn(abort())  # kept referenced until it ran: an AbortReq must not be lost

    async def _wait_for_probe(self, item) -> None:
        await asyncio.shield(item.done)

    # ------------------------------------------------ informational routes (forensics.twin.endpoints)

    @property
    def facts(self):
        from forensics.twin.endpoints import Facts

        tokens = self.scheduler.kv.kv[0].nbytes // self.settings.bytes_per_token
        return Facts(mode="prefill", host=self.settings.host, port=self.settings.prefill_port,
                     backend=self.settings.backend, bootstrap_port=self.settings.bootstrap_port,
                     context_len=self.settings.max_prefill_tokens, max_total_num_tokens=tokens,
                     max_running_requests=AUX_SLOTS, started=self.started)  # a request holds a metadata buffer

    def load_values(self) -> dict:
        """The scheduler's load by the names of sglang's ``/v1/loads`` and ``/get_load`` (live values)."""
        sched = self.scheduler
        kv, per_token = sched.kv, self.settings.bytes_per_token
        capacity = kv.kv[0].nbytes // per_token
        used = (kv.kv[0].nbytes // kv.kv_item_bytes - len(sched.free_slots)) * kv.kv_item_bytes // per_token
        waiting_tokens = sum(item.req.prompt_tokens for item in sched.waiting_queue)
        bootstrap = len(sched.bootstrap_queue)
        return {"num_running_reqs": 0, "num_waiting_reqs": len(sched.waiting_queue),
                "num_waiting_uncached_tokens": waiting_tokens, "num_used_tokens": used,
                "num_total_tokens": used + waiting_tokens, "max_total_num_tokens": capacity,
                "token_usage": used / capacity, "gen_throughput": 0.0, "cache_hit_rate": 0.0,
                "utilization": used / capacity, "max_running_requests": AUX_SLOTS, "mode": "prefill",
                "prefill_bootstrap_queue_reqs": bootstrap,
                "prefill_prealloc_queue_reqs": bootstrap,  # its name before 0.5.12
                "prefill_inflight_queue_reqs": len(sched.inflight_queue), "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}

    def twin_state(self) -> dict:
        """The twin's own account (``internal_states[0]["twin"]`` of ``/server_info``)."""
        sched = self.scheduler
        return {
            "sglang_root": self.settings.sglang_root,
            "patched": self.settings.patched,
            "bootstrap_thread_alive": self.loop.thread_alive(),
            "bootstrap_threads": self.loop.thread_info(),
            "transfer_workers": [{"name": t.name, "alive": t.is_alive()} for t in self.loop.transfer_threads],
            "transfers_in": "release transfer_worker threads" if self.loop.transfers_in_workers
                            else "scheduler thread (synchronous)",
            "free_kv_slots": len(sched.free_slots),
            "zmq_endpoint": self.loop.endpoint,
            "frames_consumed": self.loop.socket.delivered,
            "bootstrap_queue": len(sched.bootstrap_queue),
            "waiting_queue": len(sched.waiting_queue),
            "inflight_queue": len(sched.inflight_queue),
            "counters": dict(sched.counters),
            "room_states": {str(k): v for k, v in list(self.loop.room_states().items())[-50:]},
            "nixl_agent": self.loop.agent_kind,
            "uptime_s": round(time.time() - self.started, 3),
            # Keys of the release's informational answers the twin had no value for (answered null).
            "endpoint_keys_unknown": sorted(self.release_endpoints.unknown),
        }

    def stop(self) -> None:
        # The process leaves with os._exit right after: the bootstrap thread and the release's
        # transfer workers (daemons blocked on their queues) are not stopped (terminating the
        # loop's ZMQ context would make 0.5.21+ log "bootstrap_thread died" at every shutdown,
        # a false trail in the very log the forensics read).
        return None


def main() -> None:
    from forensics.sandbox.shim import load_release

    inv, settings = httpserver.process_setup("prefill", None)
    version = inv.sglang or settings.sglang
    release = load_release(settings.sglang_root, version=version)
    BootstrapServer.server_class(release, settings.backend)  # imported once, before the fork

    def bootstrap_server():  # in the front, as sglang's tokenizer manager starts it
        return BootstrapServer(release, settings.backend, settings.host, settings.bootstrap_port).check_registered

    httpserver.run_engine_role("prefill", settings, settings.prefill_port, lambda: PrefillServer(settings, version),
                               front_work=bootstrap_server)

if __name__ == "__main__":
    main()
