"""The decode side in-process: frames built by the release's own decode code.

``DecodePeer`` is a decode rank of the same release: its KV manager (built without
``__init__``, decode mode, its own host-memory KV registered with its own NIXL agent, a
real PULL socket for anything the prefill sends back) and receivers made per room. Frames
come from calling the release's receiver methods (``_register_kv_args``, ``send_metadata``,
``_send_abort_notification``) with the receiver's connection swapped for a capturing PUSH
socket (inproc), so every byte is what that release's decode would put on the wire.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import threading
import time

import numpy as np
import zmq

from forensics.sandbox.errors import SandboxError
from forensics.sandbox.host_memory import SLOTS, HostKV, make_agent
from forensics.sandbox.managers import common_manager_state, manager_class, mooncake_state, set_initial_values
from forensics.sandbox.shim import LoadedRelease

_capture_ids = itertools.count(1)


class DecodePeer:
    def __init__(
        self,
        release: LoadedRelease,
        *,
        prefill_host: str,
        prefill_port: int,
        backend: str = "nixl",
        host: str = "127.0.0.1",
        mooncake_engine=None,
    ) -> None:
        self.release = release
        self.backend = backend
        self.module = release.module(f"{backend}.conn")
        base = release.module("base.conn")
        utils = release.module("utils")
        self.prefill_host = prefill_host
        self.prefill_port = prefill_port
        self.context = zmq.Context()
        self.inbox = self.context.socket(zmq.PULL)  # the decode's own rank socket (ABORT_ACK, status)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.port = self.inbox.bind_to_random_port(f"tcp://{host}")
        capture_address = f"inproc://sandbox-decode-capture-{next(_capture_ids)}"
        self._capture_in = self.context.socket(zmq.PULL)
        self._capture_in.setsockopt(zmq.LINGER, 0)
        self._capture_in.bind(capture_address)
        self._capture_out = self.context.socket(zmq.PUSH)
        self._capture_out.setsockopt(zmq.LINGER, 0)
        self._capture_out.connect(capture_address)
        self._capture_lock = threading.Lock()
        self.host_kv = HostKV.allocate()
        self.agent, self.agent_kind = make_agent("decode") if backend == "nixl" else (None, "none (mooncake)")
        cls = manager_class(self.module, backend)
        self.manager = cls.__new__(cls)
        set_initial_values(self.manager)
        common_manager_state(
            self.manager,
            utils.DisaggregationMode.DECODE,
            socket=self.inbox,
            port=self.port,
            host=host,
            agent=self.agent,
            kv_args=self.host_kv.kv_args(base.KVArgs),
        )
        self.manager._zmq_ctx = self.context
        # The release's own default (CommonKVManager.__init__, 0.5.19+), before the sandbox turns it
        # off: frames are built plain unless a caller arms them.
        self.defers_kv_release = bool(getattr(self.manager, "enable_deferred_decode_kv_release", False))
        transfer_status = getattr(self.module, "TransferStatus", dict)
        decode_only = {
            "transfer_statuses": collections.defaultdict(transfer_status),
            "connection_pool": {},
            "connection_lock": threading.Lock(),
            "required_prefill_response_num_table": {},
            "prefill_info_table": {},
            "heartbeat_failures": {},
            "session_pool": {},
            "session_pool_lock": threading.Lock(),
            "addr_to_rooms_tracker": collections.defaultdict(set),
            "prefill_response_tracker": collections.defaultdict(set),
            "enable_deferred_decode_kv_release": False,
            "src_mem_kind": None,
        }
        for name, value in decode_only.items():
            setattr(self.manager, name, value)
        if backend == "mooncake":
            mooncake_state(self.manager, host, self.port, engine=mooncake_engine)
            if mooncake_engine is not None:
                self.agent_kind = "mooncake transfer engine (TCP)"
                self.manager.register_buffer_to_engine()  # the release's own batch_register
        if backend == "nixl" and hasattr(self.manager, "register_buffer_to_engine"):
            self.manager.register_buffer_to_engine()

    # ------------------------------------------------------------------ receivers

    def receiver(self, room: int | None):
        """The release's receiver class for ``room``, built without ``__init__`` and pointed at the
        prefill rank (one target rank, not a dummy), its connection replaced by the capture."""
        cls = getattr(self.module, {"nixl": "NixlKVReceiver", "mooncake": "MooncakeKVReceiver"}[self.backend])
        receiver = cls.__new__(cls)
        set_initial_values(receiver)
        bootstrap_info = {
            "rank_ip": self.prefill_host,
            "rank_port": self.prefill_port,
            "is_dummy": False,
            "engine_rank": 0,
        }
        values = {
            "bootstrap_room": room,
            "bootstrap_addr": f"{self.prefill_host}:8998",
            "kv_mgr": self.manager,
            "conclude_state": None,
            "require_staging": False,
            "init_time": None,
            "abort_notified": False,
            "started_transfer": False,
            "bootstrap_infos": [bootstrap_info],
            "required_dst_info_num": 1,
            "required_prefill_response_num": 1,
            "target_tp_rank": 0,
            "target_tp_ranks": [0],
            "target_cp_ranks": [0],
            "target_pp_ranks": [0],
            "prefill_dp_rank": 0,
            "_abort_generation": None,
            "chunk_staging_infos": [],
        }
        if self.backend == "mooncake":
            values["session_id"] = self.manager.engine.get_session_id()
        for name, value in values.items():
            setattr(receiver, name, value)
        # Instance attribute shadows the classmethod: every send goes to the capture socket.
        receiver._connect_to_bootstrap_server = lambda info: (self._capture_out, self._capture_lock)
        return receiver

    def _captured(self, what: str, call) -> list[list[bytes]]:
        call()
        messages = []
        if self._capture_in.poll(1000):
            while self._capture_in.poll(0):
                messages.append(self._capture_in.recv_multipart())
        if not messages:
            raise SandboxError(f"sglang {self.release.version}: the decode's {what} sent nothing")
        return messages

    # ------------------------------------------------------------------ frames

    def registration(self) -> list[bytes]:
        """The KV-args registration (room ``"None"``) from ``_register_kv_args``."""
        receiver = self.receiver(None)
        return self._captured("_register_kv_args()", receiver._register_kv_args)[0]

    def transfer_info(self, room: int, *, pages: int = 2, aux_index: int | None = None) -> list[bytes]:
        """The transfer-info (metadata) frame for ``room`` from ``send_metadata``."""
        receiver = self.receiver(room)
        self.manager.request_status.setdefault(room, 2)
        kv_indices = np.arange(pages, dtype=np.int32) % SLOTS
        arguments = {
            "kv_indices": kv_indices,
            "aux_index": aux_index if aux_index is not None else room % SLOTS,
            "state_indices": None,
            "decode_prefix_len": None,
        }
        # The metadata send is ``send_metadata`` from 0.5.10 on; earlier receivers call it ``init``.
        send = getattr(receiver, "send_metadata", None)
        if send is None or "kv_indices" not in inspect.signature(send).parameters:
            send = receiver.init
        accepted = inspect.signature(send).parameters
        call_arguments = {k: v for k, v in arguments.items() if k in accepted}
        missing = [
            name for name, p in accepted.items()
            if name not in call_arguments and p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if missing:
            raise SandboxError(
                f"sglang {self.release.version}: {send.__name__} needs {missing}, unknown to the sandbox"
            )
        return self._captured(f"{send.__name__}()", lambda: send(**call_arguments))[0]

    def abort(self, room: int, *, armed: bool = False, hold: bool = False) -> list[bytes]:
        """The ABORT frame for ``room`` from ``_send_abort_notification`` (0.5.13+).

        ``armed``: as a decode with deferred KV release whose metadata is already published
        (0.5.19+ arms a deferred ABORT_ACK; 0.5.22+ then adds the generation as a 5th frame).
        ``hold``: the decode then keeps deferred release on, as one holding the room's pages until
        the prefill's ``ABORT_ACK``: its listener counts the ack (:meth:`abort_release_safe`).
        """
        receiver = self.receiver(room)
        send = getattr(receiver, "_send_abort_notification", None)
        if send is None:
            raise SandboxError(
                f"sglang {self.release.version}: the decode receiver has no _send_abort_notification "
                "(this release's decode never sends ABORT)"
            )
        if not armed:
            return self._captured("_send_abort_notification()", send)[0]
        receiver.init_time = time.time()
        previous = self.manager.enable_deferred_decode_kv_release
        self.manager.enable_deferred_decode_kv_release = True
        try:
            return self._captured("_send_abort_notification() (armed)", send)[0]
        finally:
            if not hold:
                self.manager.enable_deferred_decode_kv_release = previous

    def abort_release_safe(self, room: int) -> bool | None:
        """Whether the release's decode may free an aborted ``room``'s pages: every prefill rank
        acked (``is_abort_release_safe(room, 1)``, 0.5.19+); None where the release has no deferred
        KV release."""
        check = getattr(self.manager, "is_abort_release_safe", None)
        return None if check is None else bool(check(int(room), 1))

    def abort_from_newer_decode(self, room: int) -> list[bytes]:
        """The 4-frame ABORT a 0.5.13 to 0.5.21 decode sends, written here (not the release's code).

        For mixed-version checks of releases whose own decode never sends ABORT (before 0.5.13):
        ``[b"ABORT", room, decode ip, decode rank port]``. Tests compare it byte for byte with
        ``abort()`` of releases that do send it.
        """
        return [b"ABORT", str(room).encode("ascii"), self.manager.local_ip.encode("ascii"),
                str(self.port).encode("ascii")]

    def listen(self, rooms) -> None:
        """Start the release's own decode listener thread on this decode's rank socket (0.5.19+:
        ``_start_decode_listener_thread``, which takes ``KV_STATUS`` and ``ABORT_ACK``), with
        ``rooms`` waiting for input as after ``send_metadata``. From then on the listener, not
        :meth:`received`, reads what the prefill sends back."""
        start = getattr(self.manager, "_start_decode_listener_thread", None)
        if start is None:
            raise SandboxError(f"sglang {self.release.version}: the decode's KV manager has no "
                               "_start_decode_listener_thread (nothing reads its rank socket)")
        waiting = self.release.module("base.conn").KVPoll.WaitingForInput
        for room in rooms:
            room = int(room)
            self.manager.update_status(room, waiting)
            self.manager.required_prefill_response_num_table[room] = 1
            self.manager.prefill_response_tracker[room] = set()
        before = set(threading.enumerate())
        start()
        self.listener = next((t for t in threading.enumerate() if t not in before), None)

    def request_states(self) -> dict:
        """The decode's KVPoll ints per room, and whether its listener thread lives."""
        listener = getattr(self, "listener", None)
        return {"rooms": {int(room): int(state) for room, state in dict(self.manager.request_status).items()},
                "listener_alive": bool(listener is not None and listener.is_alive())}

    def received(self, wait: float = 0.0) -> list[list[bytes]]:
        """Messages the prefill sent back to this decode's rank socket (ABORT_ACK, status, ...)."""
        messages = []
        if self.inbox.poll(int(wait * 1000)):
            while self.inbox.poll(0):
                messages.append(self.inbox.recv_multipart())
        return messages

    def close(self) -> None:
        if getattr(self, "listener", None) is not None:
            # The release's listener blocks in recv on the inbox for good (a daemon thread): closing
            # the socket under it, or term() waiting for it, could crash or hang. The sandbox child
            # exits right after close, which ends both.
            return
        for socket in (self._capture_out, self._capture_in, self.inbox):
            socket.close(linger=0)
        self.context.term()
