"""The prefill side in-process: the release's KV manager, a real PULL socket, its own bootstrap thread.

``PrefillLoop`` builds the release's prefill KV manager class without running its
``__init__`` (which needs GPUs, torch.distributed and a bootstrap HTTP server), sets the
attributes its bootstrap loop and the helpers that loop calls read, binds a real ZMQ PULL
socket on 127.0.0.1 and starts the release's own thread (``_start_bootstrap_thread``;
0.5.21+ wraps it in ``bootstrap_thread_guarded``). Rooms are created by the release's own
sender class, so they enter ``Bootstrapping`` exactly as in a scheduler.

The twin's prefill process uses this class directly; :class:`~forensics.sandbox.EngineSandbox`
runs it in a fresh interpreter.
"""

from __future__ import annotations

import inspect
import threading
import time

import zmq

from forensics.sandbox.errors import SandboxError
from forensics.sandbox.host_memory import HostKV, make_agent
from forensics.sandbox.init_defaults import missing_attribute_gap
from forensics.sandbox.init_threads import transfer_worker_start
from forensics.sandbox.managers import (
    SingleRankGroup,
    common_manager_state,
    manager_class,
    mooncake_state,
    set_initial_values,
)
from forensics.sandbox.observe import LogCapture, ThreadWatch
from forensics.sandbox.shim import LoadedRelease

BOOTSTRAP_ADDR = "127.0.0.1:8998"  # where a sender would register its dp rank; never contacted (dp=1)


class CountingSocket:
    """The real PULL socket, counting the messages the loop has taken from it.

    The loop is sequential, so "it has received N messages and is blocked in the next
    receive" means it finished handling all N: that is how ``settle`` knows the loop
    consumed what was sent, without sleeping. Everything else goes to the real socket.
    """

    def __init__(self, socket: zmq.Socket) -> None:
        self._socket = socket
        self.condition = threading.Condition()
        self.delivered = 0
        self.receiving = False
        self.last_frames: list[bytes] | None = None

    def recv_multipart(self, *args, **kwargs):
        with self.condition:
            self.receiving = True
            self.condition.notify_all()
        try:
            frames = self._socket.recv_multipart(*args, **kwargs)
        finally:
            with self.condition:
                self.receiving = False
        with self.condition:
            self.delivered += 1
            self.last_frames = frames
            self.condition.notify_all()
        return frames

    @property
    def real_socket(self) -> zmq.Socket:
        return self._socket

    def __getattr__(self, name: str):
        return getattr(self._socket, name)


class PrefillLoop:
    """One prefill rank's real bootstrap loop on a real ZMQ PULL socket on ``host``.

    >>> release = load_release(source.root)
    >>> loop = PrefillLoop(release)            # socket bound, thread started
    >>> loop.create_rooms([1, 2]); loop.room_states()
    {1: 1, 2: 1}
    >>> loop.close()
    """

    def __init__(
        self,
        release: LoadedRelease,
        *,
        backend: str = "nixl",
        host: str = "127.0.0.1",
        watch: ThreadWatch | None = None,
        capture_logs: bool = True,
        kv: HostKV | None = None,
        transfer_workers: bool = False,
        mooncake_engine=None,
    ) -> None:
        self.release = release
        self._mooncake_engine = mooncake_engine  # the release's real MooncakeTransferEngine (twin)
        self._kv = kv
        self._want_transfer_workers = transfer_workers
        self.backend = backend
        self.module = release.module(f"{backend}.conn")
        base = release.module("base.conn")
        self.KVPoll = base.KVPoll
        utils = release.module("utils")
        # Its own context: close() terminates it to end the loop blocked in recv.
        self.context = zmq.Context()
        self.watch = watch or ThreadWatch()
        self.watch.install(self._describe_thread)
        self.logs = LogCapture(self.watch)
        if capture_logs:
            self.logs.attach()
        try:
            self._set_up(base, utils, host)
        except BaseException:
            # Nothing of a half-built loop may outlive the error (socket, context, hooks).
            for socket in list(getattr(self.context, "_sockets", ())):
                socket.close(linger=0)
            self.context.term()
            self.logs.detach()
            self.watch.uninstall()
            raise

    def _set_up(self, base, utils, host: str) -> None:
        self.threads: list[threading.Thread] = []
        self.transfer_threads: list[threading.Thread] = []
        self.host_kv = self._kv if self._kv is not None else HostKV.allocate()
        if self.backend == "nixl":
            self.agent, self.agent_kind = make_agent("prefill")
        else:
            self.agent = None
            self.agent_kind = ("mooncake transfer engine (TCP)" if self._mooncake_engine is not None
                               else "none (mooncake session stand-in)")
        pull = self.context.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, 0)  # as sglang's get_zmq_socket_on_host does for PULL
        pull.setsockopt(zmq.LINGER, 0)
        self.port = pull.bind_to_random_port(f"tcp://{host}")
        self.host = host
        self.endpoint = f"tcp://{host}:{self.port}"
        self.socket = CountingSocket(pull)
        cls = manager_class(self.module, self.backend)
        self.manager = cls.__new__(cls)
        set_initial_values(self.manager)
        common_manager_state(
            self.manager,
            utils.DisaggregationMode.PREFILL,
            socket=self.socket,
            port=self.port,
            host=host,
            agent=self.agent,
            kv_args=self.host_kv.kv_args(base.KVArgs),
        )
        self.manager._zmq_ctx = self.context  # for the sockets the loop opens itself (ABORT_ACK)
        # Where the sandbox replaces a release method, with the reason (shown in EngineSandbox.info).
        self.overrides: dict[str, str] = {}
        if hasattr(self.manager, "_bind_server_socket"):
            # Up to 0.5.8 the thread binds the socket itself, formatting the address with
            # sglang.srt.utils.format_tcp_address (stubbed); the socket is already bound here.
            # Mooncake's start_prefill_thread draws the port first (self.rank_port = get_free_port(),
            # the release's own helper up to 0.5.2): the rank's port is the one bound here instead.
            def bound_by_the_sandbox() -> None:
                self.manager.rank_port = self.port

            self.manager._bind_server_socket = bound_by_the_sandbox
            self.overrides["_bind_server_socket"] = (
                "socket bound by the sandbox (the release formats its address with a stubbed sglang.srt.utils helper)"
            )
        self._backend_state()
        self.senders: dict[int, object] = {}
        self.started_at = time.time()
        self._start_thread()
        if self._want_transfer_workers and self.backend == "nixl":
            self._start_transfer_workers()
        elif self._want_transfer_workers and self._mooncake_engine is not None:
            self._start_mooncake_workers()

    # ------------------------------------------------------------------ setup

    def _backend_state(self) -> None:
        mgr = self.manager
        prefill_only = {
            "is_dummy_cp_rank": False,
            "transfer_infos": {},
            "req_to_decode_prefix_len": {},
            "decode_kv_args_table": {},
            "pp_group": SingleRankGroup(),  # the pipeline of one rank get_pp_group() gives (up to 0.5.9)
            "transfer_queues": [],
            "exceptions": {},
            "_peer_reload_lock": threading.Lock(),
            "_peer_reload_times": {},
        }
        for name, value in prefill_only.items():
            setattr(mgr, name, value)
        if self.backend == "mooncake":
            mooncake_state(mgr, self.host, self.port, engine=self._mooncake_engine)
            if self._mooncake_engine is not None:
                # The release's own registration of this engine's KV and aux memory (batch_register).
                mgr.register_buffer_to_engine()
        if self.backend == "nixl" and hasattr(mgr, "register_buffer_to_engine"):
            # The release's own registration of this engine's KV and aux memory with its agent.
            mgr.register_buffer_to_engine()

    def _start_thread(self) -> None:
        start = getattr(self.manager, "_start_bootstrap_thread", None) or getattr(
            self.manager, "start_prefill_thread", None
        )
        if start is None:
            raise SandboxError(
                f"sglang {self.release.version} {self.backend}/conn.py: the manager has neither "
                "_start_bootstrap_thread nor start_prefill_thread"
            )
        before = set(threading.enumerate())
        start()
        self.threads = [t for t in threading.enumerate() if t not in before]
        self.logs.loop_threads = self.threads
        if not self.threads:
            raise SandboxError(f"sglang {self.release.version}: {start.__name__}() started no thread")

    def _start_transfer_workers(self) -> None:
        """Run the statements of the release's own ``NixlKVManager.__init__`` that create the transfer
        queues and start one ``threading.Thread(target=self.transfer_worker, ...)`` per queue
        (0.5.12+; earlier releases transfer synchronously and start none).

        The statements are the release's own (the prefill branch of ``__init__``, from the queue
        size up to the worker loop; :mod:`.init_threads`): the threads are the release's, as
        py-spy shows them (``Thread-N (transfer_worker)``). They start after the
        bootstrap thread (sglang starts them just before it), so the loop keeps ``Thread-1``.
        """
        statements = transfer_worker_start(type(self.manager))
        if statements is None:
            return
        before = set(threading.enumerate())
        statements(self.manager)
        self.transfer_threads = [t for t in threading.enumerate() if t not in before]

    def _start_mooncake_workers(self) -> None:
        """Run the release's ``MooncakeKVManager.__init__`` prefill statements after its
        ``start_prefill_thread()`` (:func:`.init_threads.mooncake_prefill_start`): its queues,
        executors and ``transfer_worker`` threads, which move pages with the real engine."""
        from forensics.sandbox.init_threads import mooncake_prefill_start

        statements = mooncake_prefill_start(type(self.manager))
        before = set(threading.enumerate())
        statements(self.manager)
        self.transfer_threads = [t for t in threading.enumerate() if t not in before]

    @property
    def transfers_in_workers(self) -> bool:
        """Whether the release's transfer_worker threads do the transfers (``add_transfer_request``
        only enqueues), rather than the scheduler thread (releases before 0.5.12)."""
        return bool(self.transfer_threads)

    def _describe_thread(self, thread: threading.Thread | None, record: dict) -> dict:
        # Any thread of the process may die, even while this loop is still being set up.
        is_loop = thread is not None and thread in getattr(self, "threads", [])
        manager = getattr(self, "manager", None)
        classes = [type(manager)] if manager is not None else []
        classes += {type(sender) for sender in getattr(self, "senders", {}).values()}
        return {
            "bootstrap_thread": is_loop,
            "message_index": self.socket.delivered if is_loop else None,
            # An attribute the release's __init__ sets but the sandbox did not: not engine behaviour.
            "sandbox_gap": missing_attribute_gap(record["exc_type"], record["message"], classes),
        }

    # ------------------------------------------------------------------ rooms

    def create_rooms(self, rooms) -> dict[int, int]:
        """Create one sender per room with the release's own sender class (-> Bootstrapping)."""
        sender_cls = getattr(self.module, {"nixl": "NixlKVSender", "mooncake": "MooncakeKVSender"}[self.backend])
        for room in rooms:
            room = int(room)
            self.senders[room] = sender_cls(**self._sender_arguments(sender_cls, room))
        return self.room_states()

    def _sender_arguments(self, sender_cls: type, room: int) -> dict:
        known = {
            "mgr": self.manager,
            "bootstrap_addr": BOOTSTRAP_ADDR,
            "bootstrap_room": room,
            "dest_tp_ranks": [0],
            "pp_rank": 0,
        }
        arguments = {}
        for name, parameter in inspect.signature(sender_cls.__init__).parameters.items():
            if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            if name in known:
                arguments[name] = known[name]
            elif parameter.default is inspect.Parameter.empty:
                raise SandboxError(
                    f"sglang {self.release.version}: {sender_cls.__name__}.__init__ needs {name!r}, "
                    "which the sandbox does not know how to supply"
                )
        return arguments

    def room_states(self) -> dict[int, int]:
        return {int(room): int(state) for room, state in dict(self.manager.request_status).items()}

    def conclude(self, room: int, *, succeeded: bool) -> None:
        """End ``room``'s transfer with the calls the release's transfer worker makes (0.5.20+):
        ``conclude_transfer(status=KVPoll.Success)`` or ``conclude_failure``, which push the
        release's status message to the decode endpoint the room's transfer info named."""
        method = "conclude_transfer" if succeeded else "conclude_failure"
        if not hasattr(self.manager, method):
            raise SandboxError(f"sglang {self.release.version}: the prefill's KV manager has no {method} "
                               "(this release sends the decode no status message)")
        if succeeded:
            self.manager.conclude_transfer(bootstrap_room=int(room), status=self.KVPoll.Success)
        else:
            self.manager.conclude_failure(bootstrap_room=int(room), failure_reason="sandbox: transfer failed")

    # ------------------------------------------------------------------ observation

    @property
    def bootstrap_thread(self) -> threading.Thread:
        return self.threads[0]

    def thread_alive(self) -> bool:
        return self.bootstrap_thread.is_alive()

    def thread_info(self) -> list[dict]:
        return [{"name": t.name, "daemon": t.daemon, "alive": t.is_alive()} for t in self.threads]

    def exceptions(self, *, include_teardown: bool = False) -> list[dict]:
        return [r for r in self.watch.records if include_teardown or not r["during_teardown"]]

    def log_records(self, *, include_teardown: bool = False) -> list[dict]:
        return [r for r in self.logs.records if include_teardown or not r["during_teardown"]]

    def wait_consumed(self, count: int, timeout: float = 10.0) -> str:
        """Wait until the loop took ``count`` messages and is blocked in the next receive.

        Returns ``"consumed"``, ``"thread dead"`` or ``"timeout"`` (the loop is still busy
        with a message, or fewer than ``count`` arrived).
        """
        deadline = time.monotonic() + timeout
        with self.socket.condition:
            while True:
                if not self.thread_alive():
                    return "thread dead"
                if self.socket.delivered >= count and self.socket.receiving:
                    return "consumed"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                # Woken on every receive; the short cap only notices a thread that died
                # (the excepthook runs in the dying thread, before it is marked dead).
                self.socket.condition.wait(min(remaining, 0.02))

    # ------------------------------------------------------------------ teardown

    def close(self, timeout: float = 5.0) -> None:
        """End the blocked loop by terminating the ZMQ context from another thread.

        The loop's ``recv_multipart`` raises ``ContextTerminated`` and the thread ends; that
        exception is recorded as ``during_teardown``, never as a thread death.
        """
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self.watch.begin_teardown()
        terminator = threading.Thread(target=self.context.term, name="sandbox-zmq-term", daemon=True)
        terminator.start()
        for thread in self.threads:
            thread.join(timeout)
        # The loop is gone: now this thread may close every socket of the context (the PULL
        # socket and any the release opened itself, e.g. its ABORT_ACK PUSH sockets), which
        # lets term() return.
        self.socket.real_socket.close(linger=0)
        for socket in list(getattr(self.context, "_sockets", ())):
            socket.close(linger=0)
        terminator.join(timeout)
        self.logs.detach()
        self.watch.uninstall()

