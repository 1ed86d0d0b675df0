"""The release's own Mooncake decode side (KV manager, receiver, ``decode_thread``) for a twin.

The Mooncake counterpart of :mod:`forensics.twin.release_decode`: per request the release's
real ``MooncakeKVReceiver`` on a real ``MooncakeKVManager`` built without its ``__init__``
(GPUs, torch.distributed, a bootstrap server) and given what its methods read. Unlike
NIXL, completion comes back over ZMQ: the prefill's ``transfer_worker`` PUSHes
``[room, status, prefill_rank]`` to this decode's PULL socket, and the release's own
``decode_thread`` (started, with the heartbeat, by the ``start_decode_thread()`` statement
of its ``__init__``'s decode branch) reads it, and ``ABORT_ACK`` too (0.5.13+).

The KV pages arrive by the real transfer engine: the release's wrapper
(:mod:`forensics.sandbox.mooncake_engine`) registers the decode's page pool and aux pool with
the release's own ``register_buffer_to_engine``; the prefill's ``transfer_worker`` writes
into them with ``batch_transfer_sync`` over TCP. Only the ZMQ socket factory is the twin's,
as on the NIXL side.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

import numpy as np
import requests
import zmq
from packaging.version import Version

from forensics.sandbox.host_memory import LAYERS, HostKV
from forensics.sandbox.managers import (
    common_manager_state,
    env_value,
    mooncake_state,
    set_initial_values,
    sglang_envs,
)
from forensics.sandbox.shim import LoadedRelease
from forensics.twin.nixl_transfer import FreeList
from forensics.twin.release_decode import ReleaseDecode

logger = logging.getLogger(__name__)


class HostPagePool(FreeList):
    """The decode's KV (or aux) page pool in host memory, one buffer per region, with a free list.

    Same interface as :class:`forensics.twin.nixl_transfer.PagePool`. Mooncake refuses to
    register overlapping memory ("does not support overlapped memory region"), so unlike the
    NIXL pool, where every layer's K and V points at one buffer, each region (a layer's K or
    V) has its own buffer, as on a GPU. Nothing is registered here: the release's
    ``register_buffer_to_engine`` registers the regions with its engine. A page is intact only
    if every region holds the same bytes for it (the prefill writes the same bytes in each).
    """

    def __init__(self, num_pages: int, page_bytes: int, regions: int = 1) -> None:
        self.num_pages, self.page_bytes = num_pages, page_bytes
        # np.zeros is calloc'd: a region costs memory only where pages are written.
        self.buffers = [np.zeros(num_pages * page_bytes, dtype=np.uint8) for _ in range(regions)]
        self.buffer = self.buffers[0]
        self._free = list(range(num_pages))
        self._lock = threading.Lock()

    base_ptr = property(lambda self: int(self.buffer.ctypes.data))
    base_ptrs = property(lambda self: [int(b.ctypes.data) for b in self.buffers])
    nbytes = property(lambda self: int(self.buffer.nbytes))

    def _pages(self, buffer: np.ndarray, pages: np.ndarray, nbytes: int) -> np.ndarray:
        view = buffer.reshape(self.num_pages, self.page_bytes)
        return view[np.asarray(pages, dtype=np.int64)].reshape(-1)[:nbytes]

    def read(self, pages: np.ndarray, nbytes: int) -> np.ndarray:
        """The bytes ``pages`` hold in the first region; all zeros (never the payload) when another
        region disagrees, so a partial transfer reads as a mismatch."""
        first = self._pages(self.buffer, pages, nbytes).copy()
        if all(np.array_equal(first, self._pages(other, pages, nbytes)) for other in self.buffers[1:]):
            return first
        return np.zeros_like(first)

    def clear(self, pages: np.ndarray) -> None:
        for buffer in self.buffers:
            buffer.reshape(self.num_pages, self.page_bytes)[np.asarray(pages, dtype=np.int64)] = 0

    def close(self) -> None:
        return None


class MooncakeReleaseDecode(ReleaseDecode):
    """One decode rank's ``MooncakeKVManager`` of ``release``, built without ``__init__``.

    Shares the NIXL side's receiver plumbing (route tracking, socket factory, KV-args
    registration on first contact, failure text); differs in the manager, the receiver
    class and the engine."""

    def __init__(self, release: LoadedRelease, *, engine, pool: HostPagePool, aux: HostPagePool, local_ip: str,
                 rank_port: int, waiting_timeout: float, server_socket: zmq.Socket) -> None:
        self.release = release
        self.version = Version(release.version)
        self.conn = release.module("mooncake.conn")
        self.common = release.module("common.conn")
        self.KVPoll = release.module("base.conn").KVPoll
        # common/conn.py holds it from 0.5.13; mooncake/conn.py defines its own before
        self.KVTransferError = getattr(self.common, "KVTransferError", None) or self.conn.KVTransferError
        self.receiver_class = self.conn.MooncakeKVReceiver
        self.pool, self.aux = pool, aux
        self.engine = engine
        self.sends_abort = hasattr(self.common.CommonKVReceiver, "_send_abort_notification")
        self.unsupported = None
        cls = self.conn.MooncakeKVManager
        mgr = cls.__new__(cls)
        decode_mode = release.module("sglang.srt.disaggregation.utils").DisaggregationMode.DECODE
        # The release's own KVArgs, filled as the sandbox fills a prefill's (host_memory.HostKV), over the
        # decode's pools: one buffer per layer's K and V, and the aux pool.
        host = HostKV(kv=pool.buffers, aux=[aux.buffer], kv_item_bytes=pool.page_bytes, aux_item_bytes=aux.page_bytes)
        kv_args = host.kv_args(release.module("base.conn").KVArgs)
        # The sandbox's three layers (its managers module): the release's own initial values, what
        # CommonKVManager.__init__ sets for a TP=1 rank, Mooncake's own attributes with the real
        # engine; then the decode's tables below.
        set_initial_values(mgr)
        common_manager_state(mgr, decode_mode, socket=server_socket, port=rank_port, host=local_ip, agent=None,
                             kv_args=kv_args)
        mooncake_state(mgr, local_ip, rank_port, engine=engine)
        envs = sglang_envs()
        state = {
            "kv_args": kv_args, "engine": engine, "disaggregation_mode": decode_mode, "is_mla_backend": False,
            "local_ip": local_ip, "rank_port": rank_port, "server_socket": server_socket,
            "attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1,
            "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
            "enable_staging": False, "_staging_ctx": None, "_staging_handler": None, "enable_trace": False,
            "request_status": {}, "failure_records": {}, "failure_lock": threading.Lock(),
            "addr_to_rooms_tracker": defaultdict(set), "connection_pool": {}, "prefill_info_table": {},
            "required_prefill_response_num_table": {}, "prefill_response_tracker": defaultdict(set),
            "waiting_timeout": waiting_timeout, "connection_lock": threading.Lock(),
            "defer_decode_allocation": False, "deferred_bootstrap": None, "enable_all_cp_ranks_for_transfer": False,
            "enable_deferred_decode_kv_release": False, "_deferred_abort_ack_tracker": {},
            "heartbeat_failures": {}, "session_pool": defaultdict(requests.Session),
            "session_pool_lock": threading.Lock(), "_heartbeat_shutdown": threading.Event(),
            "heartbeat_interval": max(float(env_value(envs, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0)), 2.0),
            "max_failures": max(int(env_value(envs, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)), 1),
            "prefill_dp_size_table": {}, "prefill_tp_size_table": {}, "prefill_attn_tp_size_table": {},
            "prefill_pp_size_table": {},
            "_zmq_ctx": zmq.Context.instance(), "_socket_cache": {}, "_monitor_cache": {},
            "_socket_lock": threading.Lock(),
        }
        for key, value in state.items():
            setattr(mgr, key, value)
        self.manager = mgr
        if hasattr(mgr, "_bind_server_socket"):
            # Up to 0.5.5.post1 start_decode_thread binds the PULL socket itself (up to 0.5.2 on a port it
            # draws with get_free_port just before); the twin's socket is bound already, on rank_port.
            def bound_by_the_twin() -> None:
                mgr.rank_port = rank_port

            mgr._bind_server_socket = bound_by_the_twin
        mgr.register_buffer_to_engine()  # the release's own batch_register of the pool and aux pool
        self._sockets: dict[str, tuple[zmq.Socket, threading.Lock]] = {}
        self._monitors: dict[str, zmq.Socket] = {}
        self._lost: set[str] = set()
        self._ctx = zmq.Context.instance()
        self.threads: list[threading.Thread] = []

    @property
    def reads_server_socket(self) -> bool:
        """The release's ``decode_thread`` always reads the PULL socket (every Mooncake release)."""
        return any(t.name != "heartbeat" and "heartbeat" not in t.name.lower() for t in self.threads)


def mooncake_decode(settings, release: LoadedRelease, pull: zmq.Socket, rank_port: int):
    """What the decode twin needs for ``--backend mooncake``: ``(engine, pool, aux, release decode)``,
    the engine being the release's own ``MooncakeTransferEngine`` over TCP."""
    from forensics.sandbox.mooncake_engine import make_engine
    from forensics.twin.nixl_transfer import AUX_ITEM_BYTES

    engine = make_engine(settings.release_of("decode")[1], release.version, settings.host)
    pool = HostPagePool(settings.pool_pages, settings.page_bytes, regions=2 * LAYERS)
    aux = HostPagePool(4096, AUX_ITEM_BYTES)
    rd = MooncakeReleaseDecode(release, engine=engine, pool=pool, aux=aux, local_ip=settings.host,
                               rank_port=rank_port, waiting_timeout=settings.waiting_timeout_s, server_socket=pull)
    return engine, pool, aux, rd


def check_mooncake_served(source) -> None:
    """Refuse (exit 4, naming why) a Mooncake twin that could not serve, decided up front from
    this machine and the release's code, never by a request that hangs:

    * the release has no ``MooncakeTransferEngine`` wrapper (every 0.5.x release has one:
      ``disaggregation/mooncake/transfer_engine.py`` up to 0.5.8.post1, ``distributed/
      device_communicators/mooncake_transfer_engine.py`` from 0.5.9; a tree without either,
      e.g. a trimmed checkout, is refused);
    * the transfer engine does not import here (package or Debian libraries missing).

    What changed across releases and how the twin meets it, so nothing else needs refusing:

    * up to 0.5.9 the wrapper builds its session id, and ``mooncake/conn.py`` the decode's
      status endpoint, with ``sglang.srt.utils`` helpers the sandbox stubs; the release's own
      definitions of those standard-library helpers take the stubs' place
      (:mod:`forensics.sandbox.release_utils`);
    * up to 0.5.9 ``MooncakeKVReceiver`` has no ``send_metadata``: its ``__init__`` asks the
      prefill's bootstrap server (the release's own, as for NIXL) and ``init(kv_indices,
      aux_index)`` sends the transfer info, which the twin's decode drives as it does NIXL's
      (:attr:`ReleaseDecode.bootstraps_in_receiver_init`);
    * TCP: ``MC_FORCE_TCP=1`` up to 0.5.12.post1 ("rdma" hard-coded), ``MOONCAKE_PROTOCOL=tcp``
      from 0.5.13 (:func:`forensics.sandbox.mooncake_engine.transport_choice`).

    Served and run end to end here (KV intact): 0.5.1 to 0.5.23.
    """
    from forensics.sandbox.mooncake_engine import engine_import_problem, wrapper_problem
    from forensics.twin.errors import TwinError

    problem = wrapper_problem(source.root)
    if problem:
        raise TwinError(f"sglang {source.version} --backend mooncake: {problem}; the Mooncake twin runs the "
                        "release's own wrapper")
    # Last: what the release's code rules out holds on any machine; the engine is this machine's.
    problem = engine_import_problem()
    if problem:
        raise TwinError(f"sglang {source.version} --backend mooncake: {problem}")
