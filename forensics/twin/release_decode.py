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
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from types import SimpleNamespace

import zmq
from packaging.version import Version

from forensics.sandbox.host_memory import LAYERS
from forensics.sandbox.shim import LoadedRelease
from forensics.twin.nixl_transfer import PagePool

logger = logging.getLogger(__name__)


def _install_warning_once() -> None:
    """sglang adds ``Logger.warning_once`` in ``sglang.srt.utils`` (stubbed here); give it back."""
    if hasattr(logging.Logger, "warning_once"):
        return
    seen: set[tuple[str, str]] = set()

    def warning_once(self, msg, *args, **kwargs):
        key = (self.name, str(msg))
        if key not in seen:
            seen.add(key)
            self.warning(msg, *args, **kwargs)

    logging.Logger.warning_once = warning_once  # type: ignore[attr-defined]
    logging.Logger.info_once = warning_once  # type: ignore[attr-defined]


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
    ) -> None:
        _install_warning_once()
        self.release = release
        self.version = Version(release.version)
        self.conn = release.module(f"{backend}.conn")
        self.common = release.module("common.conn")
        self.KVPoll = release.module("base.conn").KVPoll
        self.KVTransferError = self.common.KVTransferError
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
        regions = 2 * LAYERS
        kv_args = SimpleNamespace(
            kv_data_ptrs=[pool.base_ptr] * regions, kv_data_lens=[pool.nbytes] * regions,
            kv_item_lens=[pool.page_bytes] * regions, kv_data_mem_kinds=["DRAM"] * regions, aux_data_ptrs=[aux.base_ptr], aux_data_lens=[aux.nbytes],
            aux_item_lens=[aux.page_bytes], state_data_ptrs=[], state_data_lens=[], state_item_lens=[],
            state_dim_per_tensor=[], state_type="none", gpu_id=0, engine_rank=0, decode_tp_size=1,
            prefill_start_layer=0, page_size=1, ib_device=None, system_dp_rank=0,
        )
        state = {
            "kv_args": kv_args, "agent": agent, "disaggregation_mode": decode_mode, "is_mla_backend": False,
            "local_ip": local_ip, "rank_port": rank_port, "attn_tp_size": 1, "attn_tp_rank": 0,
            "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
            "system_dp_size": 1, "system_dp_rank": 0, "enable_staging": False, "_staging_handler": None,
            "request_status": {}, "failure_records": {}, "failure_lock": threading.Lock(),
            "addr_to_rooms_tracker": defaultdict(set), "connection_pool": {}, "prefill_info_table": {},
            "required_prefill_response_num_table": {}, "prefill_response_tracker": defaultdict(set),
            "transfer_statuses": defaultdict(self._transfer_status_class() or dict), "waiting_timeout": waiting_timeout,
            "connection_lock": threading.Lock(), "defer_decode_allocation": False, "deferred_bootstrap": None,
            "enable_all_cp_ranks_for_transfer": False,
        }
        for key, value in state.items():
            setattr(mgr, key, value)
        self.manager = mgr
        self._sockets: dict[str, tuple[zmq.Socket, threading.Lock]] = {}
        self._ctx = zmq.Context.instance()
        self.registered: set[str] = set()

    def _transfer_status_class(self) -> type | None:
        """The release's NIXL ``TransferStatus``; None (and ``self.unsupported`` says why) when the
        release tracks transfers another way (0.5.23 reports KV status over ZMQ)."""
        for module in (self.conn, self.common):
            found = getattr(module, "TransferStatus", None)
            if found is not None:
                return found
        self.unsupported = (
            f"the twin's decode cannot yet drive sglang {self.release.version}'s NIXL receiver "
            "(no TransferStatus / NIXL-notification tracking in nixl/conn.py); the prefill side runs for real"
        )
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
            sock.connect(endpoint)
            self._sockets[endpoint] = (sock, threading.Lock())
        return self._sockets[endpoint]

    # ---------------------------------------------------------------- receivers

    def receiver(self, bootstrap_addr: str, room: int):
        """The release's receiver for ``room``, constructed by its own ``__init__``."""
        recv = self.receiver_class(self.manager, bootstrap_addr, room)
        recv._connect_to_bootstrap_server = self._connect  # the only piece not from the release
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
        if key not in self.registered:
            recv._register_kv_args()
            self.registered.add(key)
            self.manager.connection_pool[key] = recv.bootstrap_infos
        self.manager.update_status(recv.bootstrap_room, self.KVPoll.WaitingForInput)

    def forget_peer(self, bootstrap_addr: str) -> None:
        """Drop what was registered with ``bootstrap_addr`` (sglang's ``_handle_node_failure`` does
        the same to its connection pool), so the next request registers again."""
        for key in [k for k in self.registered if k.startswith(f"{bootstrap_addr}_")]:
            self.registered.discard(key)
            self.manager.connection_pool.pop(key, None)

    def failure_text(self, recv) -> str:
        """``KVTransferError(...)`` as the scheduler's failure line prints it."""
        try:
            recv.failure_exception()
        except Exception as exc:  # the release raises its own KVTransferError
            return str(exc)
        return "unknown failure"

    def close(self) -> None:
        for sock, _ in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()


class _NoTrace:
    """Stands in for 0.5.23's request-trace context (tracing is stubbed in the sandbox)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None
