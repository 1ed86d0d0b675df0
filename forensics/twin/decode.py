"""The twin's decode server: the release's own KV receiver per request, synthetic tokens after.

One process (title ``sglang::scheduler``): ``/generate`` and the OpenAI endpoints, each
request walking sglang's decode queues:

* prealloc: the prefill rank is looked up on the prefill's bootstrap server (``GET
  /route``) once per prefill, until the release's own heartbeat thread (its KV manager's
  ``heartbeat_checker``, polling the bootstrap server's ``/health``) declares that prefill
  lost; on first contact the release's ``_register_kv_args`` sends the KV-args
  registration frame (with this process's real NIXL agent metadata and page-pool
  pointer); pages are allocated and the release's ``send_metadata`` sends the
  transfer-info frame (up to 0.5.9 the receiver's own ``__init__`` does the look-up and the
  registration, and its ``init`` sends the transfer info); a request the release fails
  (handshake, transfer, waiting timeout, a receiver that raises) is answered at once with
  the text sglang aborts it with;
* transfer: the release's ``poll`` (waiting timeout, NIXL notification parsing; on 0.5.23 the
  status the release's listener thread set from the prefill's ``KV_STATUS``) until the KV pages
  arrive, which are then compared with what the prefill must have sent; a failed transfer whose
  ABORT armed a drain ack (deferred KV release, 0.5.21+ NIXL) keeps its pages until the prefill's
  ``ABORT_ACK`` or the release's timeout;
* running: one synthetic token per decode iteration, ``Decode batch`` lines every
  ``decode_log_interval`` iterations (when the gauges move too).

An AbortReq (the client went away; for a stream it reaches the scheduler
``abort_delay_s`` later, as sglang's ``create_abort_task``) calls the release's
``abort()`` for a request still in prealloc or transfer, which decides itself
whether to send ABORT; a request already streaming tokens just stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import aiohttp
import numpy as np
import zmq
from aiohttp import web

from forensics import sglang_source
from forensics.inventory.twin_table import TwinSettings
from forensics.sandbox.managers import env_value, sglang_envs
from forensics.sandbox.prefill import CountingSocket
from forensics.twin import generate_answer, httpserver, role_tree, wire
from forensics.twin import nixl_transfer as nx
from forensics.twin.logformat import decode_batch_line
from forensics.twin.metrics import TwinMetrics
from forensics.twin.release_decode import ReleaseDecode

log = logging.getLogger("sglang.srt.managers.scheduler")
decode_log = logging.getLogger("sglang.srt.disaggregation.decode")
TRANSFER_POLL_S = 0.005
ROUTE_TTL_S = 0.5  # releases without a heartbeat thread only: how long a looked-up route is trusted


@dataclass
class DecodeRequest:
    req: wire.GenerationRequest
    events: asyncio.Queue
    receiver: object | None = None
    stage: str = "prealloc"  # prealloc -> transfer -> running -> done
    initialized: bool = False
    pages: np.ndarray | None = None
    aux_index: int | None = None
    kv_bytes: int = 0
    generated: int = 0
    entered: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    meta: dict = field(default_factory=dict)


class DecodeScheduler:
    def __init__(self, settings: TwinSettings, release_decode: ReleaseDecode, metrics: TwinMetrics,
                 version: str) -> None:
        self.settings = settings
        self.rd = release_decode
        self.KVPoll = release_decode.KVPoll
        self.metrics = metrics
        self.version = version
        self.prealloc_queue: list[DecodeRequest] = []
        self.transfer_queue: list[DecodeRequest] = []
        self.running: list[DecodeRequest] = []
        self.aborts: set[str] = set()
        self.bootstrap_info: dict[str, dict] = {}
        self.lookups: dict[str, asyncio.Task] = {}
        self.wakeup = asyncio.Event()
        self.iteration = 0
        self.last_decode = time.monotonic()
        self.tokens_since_log = 0
        self.last_log_time = time.monotonic()
        self.aux_free = list(range(release_decode.aux.num_pages))
        # Arrival to KV verified (bootstrap + prefill forward + NIXL WRITE + notification), for benchmarks.
        self.recent_control_path_ms: deque[float] = deque(maxlen=1000)
        self.counters = {"kv_intact": 0, "kv_mismatch": 0, "transfer_failed": 0, "handshake_failed": 0,
                         "aborts_sent_by_release": 0, "aborted": 0, "finished": 0,
                         "deferred_release_drained": 0, "deferred_release_timeout": 0}
        # Failed transfers whose pages are held until the prefill acks the drain (ABORT_ACK) or the
        # hold times out: (item, deadline, acks required), as sglang's _deferred_releases.
        self.deferred_releases: list[tuple[DecodeRequest, float, int]] = []
        self.deferred_release_timeout_s = float(env_value(
            sglang_envs(), "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0))

    def submit(self, req: wire.GenerationRequest) -> DecodeRequest:
        item = DecodeRequest(req=req, events=asyncio.Queue())
        if req.is_health_probe:
            item.stage = "running"  # FakeKVReceiver: no bootstrap, no KV
            self.running.append(item)
        elif self.rd.unsupported:
            decode_log.error(f"twin: request {req.rid} refused: {self.rd.unsupported}")
            self._finish(item, error=self.rd.unsupported)
        else:
            try:
                item.receiver = self.rd.receiver(req.bootstrap_addr, req.bootstrap_room)
            except Exception as exc:
                # sglang builds the receiver in its scheduler thread, where this exception would end
                # the scheduler; the twin fails this request with the release's own exception (its
                # traceback in the log) and keeps serving the others.
                message = (f"Decode handshake failed for request rank=0 decode_req.req.rid={req.rid!r} "
                           f"decode_req.req.bootstrap_room={req.bootstrap_room} with exception "
                           f"{type(exc).__name__}: {exc}")
                decode_log.error(f"{message} (raised by the release's receiver __init__)", exc_info=True)
                self.metrics.bootstrap_failed.inc()
                self.counters["handshake_failed"] += 1
                self._finish(item, error=message)
                self.wakeup.set()
                return item
            # Up to 0.5.9 the receiver's __init__ did the bootstrap: from here on its poll() decides.
            item.initialized = self.rd.bootstraps_in_receiver_init
            self.prealloc_queue.append(item)
        self.wakeup.set()
        return item

    def abort(self, rid: str) -> None:
        self.aborts.add(rid)
        self.wakeup.set()

    def _fail(self, item, stage: str, counter) -> None:
        """sglang's ERROR line for a failed decode request ("handshake" in prealloc, "transfer" after),
        and, as its ``prepare_abort(req, error_message, 500)``, the same text to the client."""
        message = (
            f"Decode {stage} failed for request rank=0 decode_req.req.rid={item.req.rid!r} "
            f"decode_req.req.bootstrap_room={item.req.bootstrap_room} with exception "
            f"{self.rd.failure_text(item.receiver)}"
        )
        decode_log.error(message)
        counter.inc()
        self.counters[f"{stage}_failed"] += 1
        if stage == "transfer" and self._holds_for_drain(item):
            self.deferred_releases.append((item, time.monotonic() + self.deferred_release_timeout_s,
                                           len(item.receiver.bootstrap_infos)))
        else:
            self._release(item)
        self._finish(item, error=message)

    def _holds_for_drain(self, item: DecodeRequest) -> bool:
        """Whether a failed transfer's pages must wait for the prefill's drain ack (sglang 0.5.19+,
        ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``, default on from 0.5.21 where the backend
        supports it: NIXL from 0.5.21). Until every notified prefill rank has acked, its transfer
        worker may still be writing into these pages; reusing them at once would let a later
        request's KV be overwritten. As sglang's decode: a failure the decode did not initiate
        still notifies (``ensure_abort_notified(force_arm=True)``, 0.5.21+), and a receiver that
        never notified (no metadata published) has nothing in flight and is released at once."""
        recv = item.receiver
        if recv is None or not getattr(self.rd.manager, "enable_deferred_decode_kv_release", False):
            return False
        if not getattr(recv, "abort_notified", False) and hasattr(recv, "ensure_abort_notified"):
            recv.ensure_abort_notified(force_arm=True)
        return bool(getattr(recv, "abort_notified", False)) and getattr(recv, "bootstrap_infos", None) is not None

    def _resolve_deferred_releases(self) -> None:
        """Release held pages once the release's listener thread recorded an ABORT_ACK from every
        notified prefill rank (``is_abort_release_safe``), or the hold timed out (sglang's warning)."""
        if not self.deferred_releases:
            return
        now = time.monotonic()
        held = []
        for item, deadline, required_acks in self.deferred_releases:
            room = item.req.bootstrap_room
            drained = self.rd.manager.is_abort_release_safe(room, required_acks)
            if not drained and now < deadline:
                held.append((item, deadline, required_acks))
                continue
            if not drained:
                decode_log.warning(
                    f"Deferred KV release for room {room} timed out after {self.deferred_release_timeout_s}s "
                    "without a full drain ack from prefill; releasing anyway.")
            self.counters["deferred_release_drained" if drained else "deferred_release_timeout"] += 1
            self._release(item)
        self.deferred_releases = held

    # ------------------------------------------------------------------- loop

    async def run(self) -> None:
        while True:
            self._apply_aborts()
            await self._poll_prealloc()
            self._poll_transfer()
            self._resolve_deferred_releases()
            now = time.monotonic()
            interval = 1.0 / self.settings.decode_rate_tps
            if self.running and now - self.last_decode >= interval:
                self._decode_iteration()
                self.last_decode = now
            if self.running:
                wait = max(0.0, min(interval - (time.monotonic() - self.last_decode), TRANSFER_POLL_S
                                    if (self.transfer_queue or self.prealloc_queue) else interval))
            elif self.transfer_queue or self.prealloc_queue or self.deferred_releases:
                wait = TRANSFER_POLL_S
            else:
                wait = None
            self.wakeup.clear()
            try:
                await asyncio.wait_for(self.wakeup.wait(), timeout=wait)
            except TimeoutError:
                pass

    def _apply_aborts(self) -> None:
        if not self.aborts:
            return
        aborts, self.aborts = self.aborts, set()

        def matches(item: DecodeRequest) -> bool:
            return any(item.req.rid.startswith(rid) for rid in aborts)

        for queue_name, queue in (("prealloc", self.prealloc_queue), ("transfer", self.transfer_queue)):
            for item in queue:
                if matches(item):
                    decode_log.debug(f"Abort {queue_name} queue request. decode_req.req.rid={item.req.rid!r}")
                    before = item.receiver.abort_notified if hasattr(item.receiver, "abort_notified") else None
                    if hasattr(item.receiver, "abort"):  # as the scheduler: 0.5.1/0.5.2 receivers have none
                        item.receiver.abort()  # the release decides whether (and what) to send
                    if before is False and getattr(item.receiver, "abort_notified", False):
                        self.counters["aborts_sent_by_release"] += 1
        for item in list(self.running):
            if matches(item):
                decode_log.debug(f"Abort running request. req.rid={item.req.rid!r}")
                self.running.remove(item)
                self._finish(item, error="aborted")

    async def _poll_prealloc(self) -> None:
        keep = []
        for item in self.prealloc_queue:
            recv = item.receiver
            state = recv.poll() if item.initialized else self._state(item)
            if state == self.KVPoll.Failed:
                self._fail(item, "handshake", self.metrics.bootstrap_failed)
                continue
            if not item.initialized:
                info = self._lookup(item.req.bootstrap_addr)
                if info is None:
                    keep.append(item)
                    continue
                self.rd.init(recv, info)  # registration frame on first contact (release code)
                item.initialized = True
            item.kv_bytes = item.req.prompt_tokens * self.settings.bytes_per_token
            pages = self.rd.pool.allocate(nx.pages_for(item.kv_bytes, self.rd.pool.page_bytes))
            if pages is None or not self.aux_free:
                keep.append(item)  # no room in the KV pool yet: stays in prealloc, as sglang
                continue
            item.pages, item.aux_index = pages, self.aux_free.pop()
            self.rd.send_metadata(recv, pages, item.aux_index)  # the transfer-info frame (release code)
            item.stage = "transfer"
            self.transfer_queue.append(item)
            self.metrics.observe_stage("decode_prepare", time.monotonic() - item.entered)
            self.metrics.observe_bootstrap(time.monotonic() - item.entered)
        self.prealloc_queue = keep

    def _state(self, item: DecodeRequest) -> int:
        return int(self.rd.manager.request_status.get(item.req.bootstrap_room, self.KVPoll.Failed)
                   if item.receiver.conclude_state is None else item.receiver.conclude_state)

    def _lookup(self, addr: str) -> dict | None:
        """The prefill rank behind ``addr`` from its bootstrap server, looked up once and kept while
        the release's heartbeat keeps that prefill in its tables (``_handle_node_failure`` drops it
        after HEARTBEAT_MAX_FAILURE failed ``/health`` polls). A rank at a new endpoint is a new
        peer (KV-args registration again).

        Two fallbacks, both the twin's: a prefill restarted faster than the heartbeat window (the
        twin's takes a second or two, a real one minutes) is noticed when the TCP connection to its
        old rank endpoint dropped (:meth:`ReleaseDecode.peer_lost`); and a release without a
        heartbeat thread re-reads the route after ``ROUTE_TTL_S``."""
        cached = self.bootstrap_info.get(addr)
        if cached is not None and self.rd.knows(addr):
            stale = (not self.rd.has_heartbeat and time.monotonic() - cached["fetched"] >= ROUTE_TTL_S)
            if not stale and not self.rd.peer_lost(cached["info"]):
                return cached["info"]
            if not stale:
                decode_log.info(f"twin: the connection to prefill rank {cached['info']} dropped; "
                                f"looking {addr} up again")
            self.rd.forget_peer(addr, cached["info"])
            del self.bootstrap_info[addr]
            cached = None
        task = self.lookups.get(addr)
        if task is not None and task.done() and task.exception() is not None:
            # 15 look-ups failed: as the release's _ensure_prefill_info, abort (the release's own
            # abort()) every request waiting on that prefill, which then fails its handshake and
            # is answered; a later request looks the prefill up afresh.
            del self.lookups[addr]
            for waiting in self.prealloc_queue:
                if not waiting.initialized and waiting.req.bootstrap_addr == addr and hasattr(waiting.receiver, "abort"):
                    waiting.receiver.abort()
            return None
        if task is None:
            self.lookups[addr] = asyncio.get_running_loop().create_task(self._fetch_route(addr))
            return None
        if not task.done():
            return None
        info = task.result()
        del self.lookups[addr]
        if cached is not None:  # the heartbeat dropped this prefill: a restarted one knows nothing of us
            self.rd.forget_peer(addr, cached["info"] if cached["info"] != info else None)
        self.rd.track(addr, info)  # where the release's heartbeat finds it
        self.bootstrap_info[addr] = {"info": info, "fetched": time.monotonic()}
        return info

    async def _fetch_route(self, addr: str) -> dict:
        url = f"http://{addr}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
        for _attempt in range(15):  # decode.py: 15 tries, 1 s apart
            try:
                async with aiohttp.ClientSession() as session, session.get(url, timeout=5) as response:
                    if response.status == 200:
                        return await response.json()
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(1.0)
            self.wakeup.set()
        decode_log.error(f"Could not fetch prefill parallel info from {addr} after 15 attempts")
        raise RuntimeError(f"no prefill at {addr}")

    def _poll_transfer(self) -> None:
        keep = []
        for item in self.transfer_queue:
            state = item.receiver.poll()  # release code: timeout, notifications, done check
            if state == self.KVPoll.Success:
                got = self.rd.pool.read(item.pages, item.kv_bytes)
                intact = bool(np.array_equal(got, nx.kv_payload(item.req.bootstrap_room, item.kv_bytes)))
                self.counters["kv_intact" if intact else "kv_mismatch"] += 1
                item.meta.update(kv_bytes=item.kv_bytes, kv_intact=intact, bootstrap_room=item.req.bootstrap_room)
                self._release(item)
                item.stage = "running"
                self.running.append(item)
                self.metrics.queue_time.observe(0.0)  # straight to running: the twin's decode has no waiting queue
                control_path = time.monotonic() - item.entered
                self.metrics.observe_stage("decode_transferred", control_path)
                self.recent_control_path_ms.append(round(control_path * 1000, 3))
            elif state == self.KVPoll.Failed:
                self._fail(item, "transfer", self.metrics.transfer_failed)
            else:
                keep.append(item)
        self.transfer_queue = keep

    def _release(self, item: DecodeRequest) -> None:
        if item.pages is not None:
            self.rd.pool.clear(item.pages)
            self.rd.pool.release(item.pages)
            item.pages = None
        if item.aux_index is not None:
            self.aux_free.append(item.aux_index)
            item.aux_index = None
        if item.receiver is not None:
            clear_deferred = getattr(self.rd.manager, "clear_deferred_abort_state", None)
            if clear_deferred is not None:  # 0.5.19+: as sglang's _do_release, before the receiver's clear
                clear_deferred(item.req.bootstrap_room)
            try:
                item.receiver.clear()
            except Exception:  # clear() details differ per release; the room is done either way
                pass

    def _decode_iteration(self) -> None:
        self.iteration += 1
        finished = []
        for item in self.running:
            if item.first_token_at is None:
                item.first_token_at = time.monotonic()
                self.metrics.ttft.observe(item.first_token_at - item.entered)
            item.events.put_nowait(("token", item.generated))
            item.generated += 1
            self.tokens_since_log += 1
            if item.generated >= item.req.max_new_tokens:
                finished.append(item)
        if self.running:
            self.metrics.observe_forward("decode", len(self.running))
        for item in finished:
            self.running.remove(item)
            self._finish(item)
        if self.iteration % self.settings.decode_log_interval == 0:
            now = time.monotonic()
            throughput = self.tokens_since_log / max(now - self.last_log_time, 1e-6)
            self.tokens_since_log, self.last_log_time = 0, now
            used = self.rd.pool.num_pages - self.rd.pool.free_pages
            log.info(decode_batch_line(
                self.version, running_req=len(self.running), num_tokens=used,
                token_usage=used / self.rd.pool.num_pages, preallocated_usage=used / self.rd.pool.num_pages,
                prealloc_req=len(self.prealloc_queue), transfer_req=len(self.transfer_queue),
                gen_throughput=throughput,
            ))
            self.metrics.num_running_reqs.set(len(self.running))
            self.metrics.decode_prealloc_queue.set(len(self.prealloc_queue))
            self.metrics.decode_transfer_queue.set(len(self.transfer_queue))
            self.metrics.gen_throughput.set(throughput)
            self.metrics.write_stats()

    def _finish(self, item: DecodeRequest, *, error: str | None = None) -> None:
        item.stage = "done"
        if error:
            item.events.put_nowait(("error", error))
            return
        self.counters["finished"] += 1
        if not item.req.is_health_probe:
            self.metrics.observe_finished(prompt_tokens=item.req.prompt_tokens, generation_tokens=item.generated,
                                          e2e_s=time.monotonic() - item.entered)
        item.events.put_nowait(("done", item.meta))


class TaggedCountingSocket(CountingSocket):
    """The decode's PULL socket as the release's listener thread reads it, counting each message by
    its first frame when that is a tag (``KV_STATUS``, ``ABORT_ACK``, ``CHUNK_READY``...)."""

    def __init__(self, socket: zmq.Socket) -> None:
        super().__init__(socket)
        self.tags: dict[str, int] = {}

    def recv_multipart(self, *args, **kwargs):
        frames = super().recv_multipart(*args, **kwargs)
        first = frames[0] if frames else b""
        tag = first.decode("ascii", "replace") if first[:1].isalpha() and first.isupper() else "untagged"
        with self.condition:
            self.tags[tag] = self.tags.get(tag, 0) + 1
        return frames


class DecodeServer(httpserver.EngineEndpoints):
    def __init__(self, settings: TwinSettings, version: str) -> None:
        from forensics.sandbox.shim import load_release

        self.settings = settings
        self.version = version
        self.release = load_release(settings.release_of("decode")[1], version=version)
        # The /generate answer's keys, as this release's tokenizer manager writes them (the
        # decode's, which answers the router); what cannot be read is in twin_state(), not
        # guessed, and not in the log (whose lines must stay the release's own).
        self.answer = generate_answer.answer_keys(
            sglang_source.from_directory(settings.release_of("decode")[1], version=version))
        self.zmq = zmq.Context()
        self.pull = self.zmq.socket(zmq.PULL)  # the decode's rank_port (read by the release from 0.5.20)
        self.pull.setsockopt(zmq.LINGER, 0)
        rank_port = self.pull.bind_to_random_port(f"tcp://{settings.host}")
        # What the release's listener thread reads from it (0.5.20+ NIXL; Mooncake's decode_thread),
        # counted by tag (KV_STATUS, ABORT_ACK, ...): the evidence that completions and drain acks
        # arrive the release's way.
        self.listened = TaggedCountingSocket(self.pull)
        # --- backend dispatch: the Mooncake twin lives in forensics.twin.release_mooncake ---
        if settings.backend == "mooncake":
            from forensics.twin.release_mooncake import mooncake_decode

            self.agent, self.pool, self.aux, self.rd = mooncake_decode(settings, self.release, self.listened,
                                                                       rank_port)
        else:
            self.agent = nx.make_agent(str(uuid.uuid4()), num_threads=0)
            self.pool = nx.PagePool(self.agent, settings.pool_pages, settings.page_bytes)
            self.aux = nx.PagePool(self.agent, 4096, nx.AUX_ITEM_BYTES)
            self.rd = ReleaseDecode(self.release, agent=self.agent, pool=self.pool, aux=self.aux,
                                    local_ip=settings.host, rank_port=rank_port,
                                    waiting_timeout=settings.waiting_timeout_s, backend=settings.backend,
                                    server_socket=self.listened)
        # --- end backend dispatch ---
        self.metrics = TwinMetrics(version, "decode")
        self.metrics.follow_cpu_files(role_tree.cpu_files(Path(settings.directory), "decode"))
        self.scheduler = DecodeScheduler(settings, self.rd, self.metrics, version)
        self.rd.start_threads()  # the release's own heartbeat (and, 0.5.20+, listener) threads
        self.started = time.time()
        self.app = self.engine_app()

    async def start(self) -> None:
        self.task = httpserver.watch_scheduler(asyncio.get_running_loop().create_task(self.scheduler.run()), "decode")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            req = wire.parse(request.path, await request.json())
        except (wire.BadRequest, json.JSONDecodeError) as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        if req.bootstrap_room is None or req.bootstrap_host is None or req.bootstrap_port is None:
            return web.json_response(
                {"error": {"message": "PD decode needs bootstrap_host, bootstrap_port and bootstrap_room"}},
                status=400)
        item = self.scheduler.submit(req)
        if not req.stream:
            try:
                text, outcome = await self._collect(item)
            except asyncio.CancelledError:
                self._abort_later(req.rid, 0.0)
                raise
            if outcome[0] == "error":
                return web.json_response({"error": {"message": outcome[1]}}, status=500)
            return web.json_response(wire.final_response(req, text, outcome[1], self.answer))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        text = ""
        try:
            while True:
                kind, value = await item.events.get()
                if kind == "token":
                    text += wire.token_text(value)
                    await response.write(wire.sse(wire.stream_chunk(req, value, text)))
                elif kind == "done":
                    await response.write(wire.sse(wire.final_chunk(req, text, value)))
                    await response.write(wire.sse("[DONE]"))
                    break
                else:
                    await response.write(wire.sse({"error": {"message": value}}))
                    break
        except (asyncio.CancelledError, ConnectionResetError):
            if item.stage != "done":
                self._abort_later(req.rid, self.settings.abort_delay_s)
            raise
        return response

    async def _collect(self, item: DecodeRequest) -> tuple[str, tuple[str, object]]:
        text = ""
        while True:
            kind, value = await item.events.get()
            if kind == "token":
                text += wire.token_text(value)
            else:
                return text, (kind, value)

    def _abort_later(self, rid: str, delay: float) -> None:
        async def abort() -> None:
            await asyncio.sleep(delay)  # sglang's create_abort_task: asyncio.sleep(2) for streams
            self.metrics.num_aborted.inc()
            self.scheduler.abort(rid)

        httpserver.spawn(abort())  # kept referenced until it ran: an AbortReq must not be lost

    async def _wait_for_probe(self, item: DecodeRequest) -> None:
        await self._collect(item)

    # ------------------------------------------------ informational routes (forensics.twin.endpoints)

    @property
    def facts(self):
        from forensics.twin.endpoints import Facts

        return Facts(mode="decode", host=self.settings.host, port=self.settings.decode_port,
                     backend=self.settings.backend, bootstrap_port=None,
                     context_len=self.settings.max_prefill_tokens, max_total_num_tokens=self._capacity(),
                     max_running_requests=self.aux.num_pages, started=self.started)  # one aux page per request

    def _capacity(self) -> int:
        return self.pool.num_pages * self.pool.page_bytes // self.settings.bytes_per_token

    def load_values(self) -> dict:
        """The scheduler's load by the names of sglang's ``/v1/loads`` and ``/get_load`` (live values)."""
        sched = self.scheduler
        capacity = self._capacity()
        used = (self.pool.num_pages - self.pool.free_pages) * self.pool.page_bytes // self.settings.bytes_per_token
        generated = sum(item.generated for item in sched.running)
        return {"num_running_reqs": len(sched.running), "num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0,
                "num_used_tokens": used + generated, "num_total_tokens": used + generated,
                "max_total_num_tokens": capacity, "token_usage": (used + generated) / capacity,
                "gen_throughput": float(len(sched.running) * self.settings.decode_rate_tps),
                "cache_hit_rate": 0.0, "utilization": (used + generated) / capacity,
                "max_running_requests": self.aux.num_pages, "mode": "decode",
                "prefill_bootstrap_queue_reqs": 0, "prefill_prealloc_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": len(sched.prealloc_queue),
                "decode_transfer_queue_reqs": len(sched.transfer_queue), "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}

    @cached_property
    def _completion_signal(self) -> str:
        """How this decode learns that a transfer ended (fixed for the process's life: read once).
        Behind another release's prefill, the signal the pair shares, as the pair check found it
        (a 0.5.22 decode reads both NIXL notifications and KV_STATUS; which one completes depends
        on the prefill)."""
        from forensics.twin.api import PAIR_CHECK_NAME

        pair_file = Path(self.settings.directory) / PAIR_CHECK_NAME
        if self.settings.decode_sglang and pair_file.is_file():
            completion = json.loads(pair_file.read_text(encoding="utf-8")).get("prefill_to_decode", {})
            if completion.get("completion"):
                return completion["completion"]
        if self.rd.completes_by_kv_status:
            return "KV_STATUS from the prefill, read by the release's decode listener"
        return "NIXL notifications, read by the release's poll"

    def twin_state(self) -> dict:
        """The twin's own account (``internal_states[0]["twin"]`` of ``/server_info``)."""
        sched = self.scheduler
        return {
            "sglang_root": self.settings.release_of("decode")[1],
            "generate_answer_unread": list(self.answer.unread),
            "prealloc_queue": len(sched.prealloc_queue),
            "transfer_queue": len(sched.transfer_queue),
            # Which request is where: a queue's length alone cannot tell a probe from a held request.
            "queued_rids": {"prealloc": [item.req.rid for item in sched.prealloc_queue],
                            "transfer": [item.req.rid for item in sched.transfer_queue]},
            "running": len(sched.running),
            "counters": dict(sched.counters),
            "free_pages": self.pool.free_pages,
            "recent_control_path_ms": list(sched.recent_control_path_ms),
            "waiting_timeout_s": self.settings.waiting_timeout_s,
            "release_sends_abort": self.rd.sends_abort,
            "release_threads": [{"name": t.name, "alive": t.is_alive()} for t in self.rd.threads],
            "heartbeat_failures": dict(getattr(self.rd.manager, "heartbeat_failures", {})),
            "known_prefills": sorted(self.rd.manager.prefill_info_table),
            "listener_received": dict(self.listened.tags),
            "completion_signal": self._completion_signal,
            "deferred_kv_release": bool(getattr(self.rd.manager, "enable_deferred_decode_kv_release", False)),
            "held_for_drain": len(sched.deferred_releases),
            "uptime_s": round(time.time() - self.started, 3),
            # Keys of the release's informational answers the twin had no value for (answered null).
            "endpoint_keys_unknown": sorted(self.release_endpoints.unknown),
        }

    def stop(self) -> None:
        self.rd.close()
        if not self.rd.reads_server_socket:  # else a release thread is blocked in it; the process exits
            self.pull.close(linger=0)


def main() -> None:
    from forensics.sandbox.shim import load_release

    inv, settings = httpserver.process_setup("decode", None)
    version = settings.release_of("decode")[0] if settings.decode_sglang else inv.sglang or settings.sglang
    load_release(settings.release_of("decode")[1], version=version)  # imported once, before the fork
    httpserver.run_engine_role("decode", settings, settings.decode_port, lambda: DecodeServer(settings, version))

if __name__ == "__main__":
    main()
