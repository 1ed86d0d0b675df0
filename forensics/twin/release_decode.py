"""The release's own decode-side KV receiver, run against the twin's page pool.

The decode twin does not re-implement the control path: for every request it
builds the release's real ``NixlKVReceiver`` (through the engine sandbox's import
shim) on a real ``NixlKVManager`` that was created without its ``__init__`` (that
one wants GPUs, server args and a scheduler) and given only what the receiver
methods read: a real NIXL agent, the registered page pool, the status tables.

So these are sglang's code, unchanged: the KV-args registration frame
(``_register_kv_args``), the transfer-info frame (``send_metadata``), the
decision to send ABORT and its frame (``abort`` / ``_send_abort_notification``),
the waiting timeout with its log lines (``_check_waiting_timeout``), the parsing
of NIXL notifications (``update_transfer_status``) and the failure reason
(``failure_exception``). Only the socket factory is the twin's (sglang's goes
through ``sglang.srt.utils.network``, which the sandbox stubs): a PUSH socket
configured like the release's ``_connect``.

The manager also runs the release's own decode threads, started by the thread-starting
statements of its ``NixlKVManager.__init__`` decode branch (``forensics.sandbox.init_threads``):
the heartbeat (``Thread-N (heartbeat_checker)``, ``HeartbeatChecker`` from 0.5.21) and, where the
release starts one (0.5.20+), the listener on the decode's PULL socket. The heartbeat: every ``SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL`` (5 s) it
GETs ``/health`` of each prefill bootstrap server the decode knows (the twin's route look-up
enters it in the release's ``prefill_info_table``, as ``try_ensure_parallel_info`` does) and
after ``SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`` (2) failures in a row the release's
``_handle_node_failure`` fails that prefill's rooms and drops its connection entries, so the
next request looks the prefill up and registers again.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

import requests
import zmq
from packaging.version import Version
from zmq.utils.monitor import parse_monitor_message

from forensics.sandbox.host_memory import LAYERS, kv_args_for
from forensics.sandbox.managers import common_manager_state, env_value, set_initial_values, sglang_envs
from forensics.sandbox.shim import LoadedRelease
from forensics.twin.nixl_transfer import PagePool

logger = logging.getLogger(__name__)


class ReleaseDecode:
    """One decode rank's KV manager of ``release`` (backend ``nixl``), built without ``__init__``."""

    def __init__(
        self,
        release: LoadedRelease,
        *,
        agent,
        pool: PagePool,
        aux: PagePool,
        local_ip: str,
        rank_port: int,
        waiting_timeout: float,
        backend: str = "nixl",
        server_socket: zmq.Socket | None = None,
    ) -> None:
        self.release = release
        self.version = Version(release.version)
        self.conn = release.module(f"{backend}.conn")
        self.common = release.module("common.conn")
        self.KVPoll = release.module("base.conn").KVPoll
        self.KVTransferError = getattr(self.common, "KVTransferError", None)  # absent up to 0.5.12
        self.receiver_class = self.conn.NixlKVReceiver
        self.pool, self.aux = pool, aux
        self.sends_abort = hasattr(self.common.CommonKVReceiver, "_send_abort_notification") or hasattr(
            self.common.CommonKVReceiver, "ensure_abort_notified"
        )
        self.unsupported: str | None = None
        manager_class = self.conn.NixlKVManager
        mgr = manager_class.__new__(manager_class)
        decode_mode = release.module("sglang.srt.disaggregation.utils").DisaggregationMode.DECODE
        # One region per layer's K and V, as the prefill's model has (the sandbox's host KV
        # geometry); every region is the same page pool, so page i is the same bytes in all.
        # The release's own KVArgs class, filled as its scheduler's _init_kv_manager fills it
        # (0.5.17+ reads kv_layer_ids and state_layer_ids; the registration packs them).
        regions = 2 * LAYERS
        kv_args = kv_args_for(
            release.module("base.conn").KVArgs,
            kv_data_ptrs=[pool.base_ptr] * regions, kv_data_lens=[pool.nbytes] * regions,
            kv_item_lens=[pool.page_bytes] * regions, aux_data_ptrs=[aux.base_ptr], aux_data_lens=[aux.nbytes],
            aux_item_lens=[aux.page_bytes],
        )
        # The release's own initial values for its bookkeeping, then what CommonKVManager.__init__
        # sets for one TP=1 rank (shared with the engine sandbox, so a release's new manager
        # attributes, e.g. 0.5.17's dcp_size/dcp_rank, are set in one place for both sides).
        set_initial_values(mgr)
        common_manager_state(mgr, decode_mode, socket=server_socket, port=rank_port, host=local_ip, agent=agent,
                             kv_args=kv_args)
        kv_args.kv_data_mem_kinds = ["DRAM"] * regions  # the pool is host memory, registered as DRAM
        state = {
            "is_mla_backend": False, "enable_staging": False, "_staging_handler": None,
            "src_mem_kind": None,  # a prefill-side field; the decode sends nothing from its own KV
            "tp_size": 1, "dp_size": 1,  # read by 0.5.1/0.5.2's receiver
            "addr_to_rooms_tracker": defaultdict(set), "connection_pool": {}, "prefill_info_table": {},
            "required_prefill_response_num_table": {}, "prefill_response_tracker": defaultdict(set),
            "transfer_statuses": defaultdict(self._transfer_status_class() or dict), "waiting_timeout": waiting_timeout,
            "connection_lock": threading.Lock(), "defer_decode_allocation": False, "deferred_bootstrap": None,
            "enable_all_cp_ranks_for_transfer": False,
            # The heartbeat's state, as CommonKVManager.__init__ (decode) sets it; releases before
            # 0.5.11 key the prefills it checks on prefill_dp_size_table.
            "heartbeat_failures": {}, "session_pool": defaultdict(requests.Session),
            "session_pool_lock": threading.Lock(), "_heartbeat_shutdown": threading.Event(),
            "heartbeat_interval": max(float(env_value(sglang_envs(), "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0)), 2.0),
            "max_failures": max(int(env_value(sglang_envs(), "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)), 1),
            "prefill_dp_size_table": {}, "prefill_tp_size_table": {}, "prefill_attn_tp_size_table": {},
            "prefill_pp_size_table": {},
        }
        for key, value in state.items():
            setattr(mgr, key, value)
        self.manager = mgr
        self._sockets: dict[str, tuple[zmq.Socket, threading.Lock]] = {}
        self._monitors: dict[str, zmq.Socket] = {}
        self._lost: set[str] = set()
        self._ctx = zmq.Context.instance()
        self.threads: list[threading.Thread] = []

    _PEER_TABLES = ("prefill_info_table", "prefill_dp_size_table", "prefill_tp_size_table",
                    "prefill_attn_tp_size_table", "prefill_pp_size_table")

    def start_threads(self) -> None:
        """Start the decode threads the release's ``__init__`` starts (heartbeat, listener), with
        the release's own statements."""
        from forensics.sandbox.init_threads import decode_thread_start

        start = decode_thread_start(type(self.manager))
        if start is None:
            return
        before = set(threading.enumerate())
        start(self.manager)
        self.threads = [t for t in threading.enumerate() if t not in before]

    @property
    def completes_by_kv_status(self) -> bool:
        """0.5.23+: the decode learns a transfer's end from the prefill's KV_STATUS message (read by
        its listener thread), not from NIXL notifications tallied in a TransferStatus."""
        return self._transfer_status_class() is None

    @property
    def heartbeat_threads(self) -> list[threading.Thread]:
        return [t for t in self.threads if "heartbeat" in t.name.lower()]

    @property
    def reads_server_socket(self) -> bool:
        """A release thread reads the decode's PULL socket (it must not be closed under it)."""
        return any("heartbeat" not in t.name.lower() for t in self.threads)

    @property
    def has_heartbeat(self) -> bool:
        return any(t.is_alive() for t in self.heartbeat_threads)

    def track(self, bootstrap_addr: str, info: dict) -> None:
        """Enter the prefill behind ``bootstrap_addr`` where the release's heartbeat finds it
        (``try_ensure_parallel_info`` in 0.5.11+; the per-address size tables before)."""
        with self.manager.connection_lock:
            self.manager.prefill_info_table[bootstrap_addr] = dict(info)
            for table in self._PEER_TABLES[1:]:
                getattr(self.manager, table)[bootstrap_addr] = 1

    def knows(self, bootstrap_addr: str) -> bool:
        """False once the release's ``_handle_node_failure`` dropped the prefill (or before it was tracked)."""
        with self.manager.connection_lock:
            return all(bootstrap_addr in getattr(self.manager, table) for table in self._PEER_TABLES)

    def peer_lost(self, bootstrap_info: dict) -> bool:
        """Whether the TCP connection to that prefill rank dropped (a ZMQ monitor event on the PUSH
        socket). With the release's ``RECONNECT_IVL=-1`` that socket never reconnects; the twin's
        prefill restarts within one heartbeat window, which the heartbeat may not see."""
        endpoint = f"tcp://{bootstrap_info['rank_ip']}:{bootstrap_info['rank_port']}"
        monitor = self._monitors.get(endpoint)
        while monitor is not None and monitor.poll(0):
            try:
                event = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if parse_monitor_message(event)["event"] == zmq.EVENT_DISCONNECTED:
                self._lost.add(endpoint)
        return endpoint in self._lost

    def _transfer_status_class(self) -> type | None:
        """The release's NIXL ``TransferStatus`` (the per-room notification tally its
        ``update_transfer_status`` keeps), or None for 0.5.23+, whose decode learns a transfer's
        end from the prefill's ``KV_STATUS`` message (read by its own listener thread) instead."""
        for module in (self.conn, self.common):
            found = getattr(module, "TransferStatus", None)
            if found is not None:
                return found
        return None

    # ------------------------------------------------------------------ sockets

    def _connect(self, bootstrap_info: dict):
        """A PUSH socket to a prefill rank, set up as the release's ``CommonKVReceiver._connect``."""
        endpoint = f"tcp://{bootstrap_info['rank_ip']}:{bootstrap_info['rank_port']}"
        if endpoint not in self._sockets:
            sock = self._ctx.socket(zmq.PUSH)
            if self.version >= Version("0.5.15"):  # 0.5.13/0.5.14 keep ZMQ's defaults
                sock.setsockopt(zmq.RECONNECT_IVL, -1)
                sock.setsockopt(zmq.LINGER, 0)
            else:
                sock.setsockopt(zmq.LINGER, 0)  # the twin must not hang at exit
            self._monitors[endpoint] = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sock.connect(endpoint)
            self._sockets[endpoint] = (sock, threading.Lock())
        return self._sockets[endpoint]

    def _disconnect(self, endpoint: str) -> None:
        sock, _ = self._sockets.pop(endpoint, (None, None))
        monitor = self._monitors.pop(endpoint, None)
        if sock is not None:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            sock.close(linger=0)
        if monitor is not None:
            monitor.close(linger=0)
        self._lost.discard(endpoint)

    # ---------------------------------------------------------------- receivers

    @property
    def bootstraps_in_receiver_init(self) -> bool:
        """Up to 0.5.9 the receiver's own ``__init__`` asks the prefill's bootstrap server (parallel
        info, the rank's route), registers the KV args on first contact, and its ``init(kv_indices,
        aux_index)`` sends the transfer info; from 0.5.10 ``init(prefill_dp_rank)`` bootstraps and
        ``send_metadata`` sends it. Told apart by the method, not by a version list."""
        return not hasattr(self.receiver_class, "send_metadata")

    def receiver(self, bootstrap_addr: str, room: int):
        """The release's receiver for ``room``, constructed by its own ``__init__`` (which may raise:
        0.5.1's unpacks the bootstrap server's answer without a check)."""
        recv = self.receiver_class.__new__(self.receiver_class)
        # The only piece not from the release, set before __init__: up to 0.5.9 it registers there.
        recv._connect_to_bootstrap_server = self._connect
        recv.__init__(self.manager, bootstrap_addr, room)
        if not hasattr(recv, "trace_ctx"):
            recv.trace_ctx = _NoTrace()
        return recv

    def init(self, recv, bootstrap_info: dict) -> None:
        """What ``CommonKVReceiver.init`` ends with for a TP=1 prefill: the rank's bootstrap info,
        and the KV-args registration on first contact with that rank (the release's own frame)."""
        info = dict(bootstrap_info, is_dummy=False)
        recv.bootstrap_infos = [info]
        recv.required_dst_info_num = 1
        recv.required_prefill_response_num = 1
        recv.prefill_dp_rank = 0
        recv.target_tp_rank, recv.target_tp_ranks = 0, [0]
        recv.target_cp_ranks, recv.target_pp_ranks = [0], [0]
        self.manager.required_prefill_response_num_table[recv.bootstrap_room] = 1
        key = f"{recv.bootstrap_addr}_0_0_0"
        with self.manager.connection_lock:
            known = key in self.manager.connection_pool
        if not known:  # first contact, or the heartbeat's _handle_node_failure dropped the entry
            recv._register_kv_args()
            with self.manager.connection_lock:
                self.manager.connection_pool[key] = recv.bootstrap_infos
        self.manager.update_status(recv.bootstrap_room, self.KVPoll.WaitingForInput)

    def send_metadata(self, recv, pages, aux_index: int) -> None:
        """The transfer-info frame, by the release's ``send_metadata`` (0.5.10+) or ``init`` (before);
        no state indices: the twin's model has no mamba/SWA state."""
        send = recv.init if self.bootstraps_in_receiver_init else recv.send_metadata
        send(pages, aux_index)

    def forget_peer(self, bootstrap_addr: str, bootstrap_info: dict | None = None) -> None:
        """Drop what was registered with ``bootstrap_addr`` (as sglang's ``_handle_node_failure``
        does to its connection pool and prefill table), and the socket to its old rank endpoint,
        so the next request looks the prefill up and registers again."""
        with self.manager.connection_lock:
            for key in [k for k in self.manager.connection_pool if k.startswith(f"{bootstrap_addr}_")]:
                del self.manager.connection_pool[key]
            for table in self._PEER_TABLES:
                getattr(self.manager, table).pop(bootstrap_addr, None)
        if bootstrap_info is not None:
            self._disconnect(f"tcp://{bootstrap_info['rank_ip']}:{bootstrap_info['rank_port']}")

    def failure_text(self, recv) -> str:
        """``KVTransferError(...)`` as the scheduler's failure line prints it."""
        try:
            recv.failure_exception()
        except Exception as exc:  # the release raises its own KVTransferError
            return str(exc)
        return "unknown failure"

    def close(self) -> None:
        self.manager._heartbeat_shutdown.set()  # 0.5.21+ ends its loop on it; earlier ones are daemons
        for endpoint in list(self._sockets):
            self._disconnect(endpoint)


class _NoTrace:
    """Stands in for 0.5.23's request-trace context (tracing is stubbed in the sandbox)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None
