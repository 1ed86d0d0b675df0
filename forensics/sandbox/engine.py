"""``EngineSandbox``: a release's real prefill bootstrap loop in a fresh interpreter.

>>> with EngineSandbox("0.5.15") as sb:
...     sb.create_rooms([1, 2, 3, 4])
...     sb.send(sb.frames.registration())
...     sb.send(sb.frames.transfer_info(room=1))
...     sb.send(sb.frames.abort(room=2))
...     sb.settle()
...     sb.thread_alive(), sb.room_states()
(False, {1: 2, 2: 1, 3: 1, 4: 1})

One child process per sandbox (sglang's module names are process-global, and a dead
non-daemon thread must not outlive the check). The child is driven over two dedicated
pipes carrying JSON lines; its stdout and stderr go to files, so :meth:`stderr_text` shows
exactly what a scheduler process would have printed (the thread-death traceback).
"""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from forensics.cache import cache_dir
from forensics.sandbox.child import SETUP_ENV
from forensics.sandbox.errors import SandboxError
from forensics.sandbox.shim import NIXL_SWITCH_ENV
from forensics.sandbox.snapshot import KVPOLL_NAMES, SandboxSnapshot

__all__ = ["KVPOLL_NAMES", "EngineSandbox", "FrameFactory"]

START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0


def _resolve_source(source):
    """(root, version) from an SglangSource, a release number, or a directory."""
    root = getattr(source, "root", None)
    if root is not None:
        return Path(root), source.version
    from forensics.sglang_source import resolve

    resolved = resolve(str(source))
    return Path(resolved.root), resolved.version


class FrameFactory:
    """Frames built in the child by the release's own decode code (``sb.frames.abort(room=2)``)."""

    def __init__(self, sandbox: EngineSandbox) -> None:
        self._sandbox = sandbox

    def _build(self, kind: str, room: int | None = None, **options) -> list[bytes]:
        reply = self._sandbox._request("frames", kind=kind, room=room, **options)
        return [base64.b64decode(frame) for frame in reply["frames"]]

    def registration(self) -> list[bytes]:
        """KV-args registration (room ``"None"``), as ``NixlKVReceiver._register_kv_args`` sends it."""
        return self._build("registration")

    def transfer_info(self, room: int, *, pages: int = 2) -> list[bytes]:
        """Transfer info for ``room`` (required_dst_info_num 1, ``pages`` destination KV pages),
        as ``send_metadata`` sends it."""
        return self._build("transfer_info", room, pages=pages)

    def abort(self, room: int, *, armed: bool = False, hold: bool = False) -> list[bytes]:
        """``[b"ABORT", room, ip, port]`` as ``_send_abort_notification`` sends it (0.5.13+);
        ``armed``: with deferred KV release armed (0.5.22+ adds the generation, 5 frames);
        ``hold``: the decode side keeps holding the room's pages for the prefill's ``ABORT_ACK``
        (:meth:`EngineSandbox.abort_release_safe`)."""
        return self._build("abort", room, armed=armed, hold=hold)

    def abort_from_newer_decode(self, room: int) -> list[bytes]:
        """The 4-frame ABORT of a 0.5.13-0.5.21 decode, for releases whose own decode sends none
        (a mixed-version pair). Written by the sandbox; tested byte for byte against ``abort()``."""
        return self._build("abort_from_newer_decode", room)


class EngineSandbox:
    """The real bootstrap loop of ``source`` (patched with ``conn_file`` if given) in a child process.

    ``source``: an :class:`~forensics.sglang_source.SglangSource`, a release number
    (fetched into the cache) or a directory holding ``sglang/srt``. ``nixl=False`` runs as on a
    machine without NIXL (``nixl`` unimportable, a recording stand-in agent). Raises
    :class:`SandboxError` when the release cannot be set up here (the message names the
    missing piece), which callers report as INCONCLUSIVE.

    Example: ``with fx.sandbox.EngineSandbox("0.5.15") as sb: sb.create_rooms([1, 2])``
    """

    def __init__(self, source, *, backend: str = "nixl", conn_file: str | Path | None = None,
                 nixl: bool = True, start_timeout: float = START_TIMEOUT_S, wait_ready: bool = True) -> None:
        self.root, self.version = _resolve_source(source)
        self.backend = backend
        self.use_nixl = nixl
        self.conn_file = Path(conn_file).resolve() if conn_file is not None else None
        if self.conn_file is not None and not self.conn_file.is_file():
            raise SandboxError(f"replacement conn file {self.conn_file} does not exist")
        self.frames = FrameFactory(self)
        self._info: dict | None = None
        self._start_error: BaseException | None = None
        self._start_timeout = start_timeout
        self.final_state: dict | None = None
        self._process: subprocess.Popen | None = None
        self._stderr_cache: str | None = None
        self._output_dir = tempfile.TemporaryDirectory(prefix="pd-sandbox-")
        self._stderr_path = Path(self._output_dir.name) / "stderr.txt"
        self._stdout_path = Path(self._output_dir.name) / "stdout.txt"
        self._spawn()
        if wait_ready:
            self.wait_ready()

    # ------------------------------------------------------------------ process

    def _spawn(self) -> None:
        command_read, command_write = os.pipe()
        reply_read, reply_write = os.pipe()
        setup = {"root": str(self.root), "version": self.version, "backend": self.backend,
                 "conn_file": str(self.conn_file) if self.conn_file else None}
        env = dict(os.environ)
        env[SETUP_ENV] = json.dumps(setup)
        if not self.use_nixl:
            env[NIXL_SWITCH_ENV] = "off"
        env.pop("PYTHONOPTIMIZE", None)  # the GUARD is an assert: -O would change the behaviour
        # Bytecode of the release (and of anything else without .pyc) is kept in the cache, not
        # beside the sources: compiling nixl/conn.py and common/conn.py on every start costs more
        # than the rest of the import.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.setdefault("PYTHONPYCACHEPREFIX", str(cache_dir() / "pycache"))
        package_parent = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        with open(self._stdout_path, "wb") as stdout, open(self._stderr_path, "wb") as stderr:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "forensics.sandbox.child", str(command_read), str(reply_write)],
                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
                pass_fds=(command_read, reply_write), close_fds=True,
            )
        os.close(command_read)
        os.close(reply_write)
        self._commands = os.fdopen(command_write, "w", encoding="utf-8", buffering=1)
        self._replies = os.fdopen(reply_read, "r", encoding="utf-8")
        self._spawned_at = time.monotonic()

    def wait_ready(self) -> dict:
        """Wait for the child's set-up (release loaded, loop running); returns :attr:`info`.

        With ``wait_ready=False`` the constructor returns as soon as the child is spawned, so
        several sandboxes (say, verify's unpatched and patched runs) start in parallel; the
        first call that needs the child waits here.
        """
        if self._info is not None:
            return self._info
        if self._start_error is not None:
            raise self._start_error
        remaining = self._start_timeout - (time.monotonic() - self._spawned_at)
        try:
            ready = self._read_reply(max(remaining, 0.1), "start")
        except BaseException as exc:
            self._start_error = exc
            self._kill()
            raise
        if not ready.get("ok"):
            self._start_error = SandboxError(
                f"sglang {self.version} ({self.backend}{', patched' if self.conn_file else ''}) "
                f"could not be set up in the sandbox: {ready.get('error_type')}: {ready.get('error')}"
            )
            self._kill()
            raise self._start_error
        self._info = ready["info"]
        return self._info

    @property
    def info(self) -> dict:
        """What the child loaded: version, conn file, endpoint, NIXL, agent, stubbed modules, threads."""
        return self.wait_ready()

    def _read_reply(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxError(f"sandbox child did not answer {what!r} within {timeout:.0f} s")
            readable, _, _ = select.select([self._replies], [], [], min(remaining, 0.5))
            if readable:
                line = self._replies.readline()
                if line:
                    return json.loads(line)
                raise SandboxError(
                    f"sandbox child exited while answering {what!r} (status {self._process.wait(5)}); "
                    f"stderr: {self.stderr_text()[-2000:]}"
                )
            if self._process.poll() is not None and not select.select([self._replies], [], [], 0)[0]:
                raise SandboxError(
                    f"sandbox child exited with status {self._process.returncode} before answering {what!r}; "
                    f"stderr: {self.stderr_text()[-2000:]}"
                )

    def _request(self, op: str, reply_within: float = REQUEST_TIMEOUT_S, **arguments) -> dict:
        if self._process is None or self.final_state is not None:
            raise SandboxError("the sandbox is closed")
        self.wait_ready()
        try:
            self._commands.write(json.dumps({"op": op, **arguments}) + "\n")
            self._commands.flush()
        except (OSError, ValueError) as exc:  # broken pipe, or our end already closed
            raise SandboxError(f"sandbox child is gone; stderr: {self.stderr_text()[-2000:]}") from exc
        reply = self._read_reply(reply_within, op)
        if not reply.get("ok"):
            raise SandboxError(
                f"sglang {self.version}: sandbox {op} failed: {reply.get('error_type')}: {reply.get('error')}\n"
                f"{reply.get('traceback', '')}"
            )
        return reply

    # ------------------------------------------------------------------ API

    @property
    def endpoint(self) -> str:
        """``tcp://127.0.0.1:PORT`` of the prefill's PULL socket (the loop's only input)."""
        return self.info["endpoint"]

    @property
    def pid(self) -> int:
        return self._process.pid

    def create_rooms(self, rooms) -> dict[int, int]:
        """Create a sender per room with the release's sender class: rooms enter Bootstrapping."""
        reply = self._request("create_rooms", rooms=[int(r) for r in rooms])
        return {int(k): v for k, v in reply["rooms"].items()}

    def send(self, frames: list[bytes]) -> int:
        """Send one multipart message to the loop (from a PUSH socket in the child); returns the count sent."""
        if not isinstance(frames, list | tuple) or not all(isinstance(f, bytes | bytearray) for f in frames):
            raise TypeError("send() takes a list of bytes frames")
        encoded = [base64.b64encode(bytes(frame)).decode("ascii") for frame in frames]
        return self._request("send", frames=encoded)["sent"]

    def settle(self, timeout: float = 10.0, *, expected: int | None = None) -> str:
        """Wait until the loop took every message sent (``expected`` overall, when others sent too)
        and is blocked in its next receive, or died. Returns ``"consumed"`` or ``"thread dead"``;
        raises SandboxError on timeout (the loop is stuck inside a message)."""
        reply = self._request("settle", reply_within=timeout + 5, timeout=timeout, expected=expected)
        if reply["status"] == "thread dead":
            gaps = [e for e in self.exceptions() if e.get("sandbox_gap")]
            if gaps:
                raise SandboxError(
                    f"sglang {self.version}: the loop died on {gaps[0]['sandbox_gap']}, an attribute the "
                    f"release's __init__ sets and the sandbox did not: a sandbox gap, not engine behaviour "
                    f"({gaps[0]['exc_type']}: {gaps[0]['message']} at {gaps[0]['file']}:{gaps[0]['line']})"
                )
        if reply["status"] == "timeout":
            raise SandboxError(
                f"sglang {self.version}: the loop did not consume {reply['sent']} messages within {timeout} s "
                f"(consumed {reply['consumed']}); it may be blocked inside a handler"
            )
        return reply["status"]

    def decode_messages(self, wait: float = 0.0) -> list[list[bytes]]:
        """What the prefill sent back to the decode's rank socket (e.g. ABORT_ACK), waiting up to ``wait`` s."""
        reply = self._request("decode_messages", reply_within=wait + REQUEST_TIMEOUT_S, wait=wait)
        return [[base64.b64decode(f) for f in message] for message in reply["messages"]]

    def conclude(self, room: int, *, succeeded: bool) -> dict[int, int]:
        """End ``room``'s transfer as the prefill release's transfer worker does (0.5.20+): its
        ``conclude_transfer(Success)`` or ``conclude_failure`` pushes its status message to the
        decode endpoint in the room's transfer info. Returns the prefill's room states."""
        reply = self._request("conclude", room=int(room), succeeded=bool(succeeded))
        return {int(k): v for k, v in reply["rooms"].items()}

    def listen_as_decode(self, rooms) -> dict:
        """Start the release's decode listener thread on this sandbox's decode rank socket (the
        endpoint its transfer-info frames name), ``rooms`` waiting for input. Returns
        :meth:`decode_states`."""
        reply = self._request("listen", rooms=[int(r) for r in rooms])
        return {"rooms": {int(k): v for k, v in reply["rooms"].items()}, "listener_alive": reply["listener_alive"]}

    def abort_release_safe(self, room: int) -> bool | None:
        """Whether the decode side may free an aborted ``room``'s held pages: its release's
        ``is_abort_release_safe`` after its listener read the prefill's ``ABORT_ACK`` (None before
        0.5.19, which has no deferred KV release)."""
        return self._request("abort_release_safe", room=int(room))["safe"]

    def decode_states(self) -> dict:
        """The decode side's KVPoll ints per room (``rooms``) and ``listener_alive``."""
        reply = self._request("decode_states")
        return {"rooms": {int(k): v for k, v in reply["rooms"].items()}, "listener_alive": reply["listener_alive"]}

    def state(self) -> dict:
        if self.final_state is not None:
            return self.final_state
        reply = self._request("state")
        return {**reply, "rooms": {int(k): v for k, v in reply["rooms"].items()}}

    def room_states(self) -> dict[int, int]:
        """KVPoll ints per room: Failed 0, Bootstrapping 1, WaitingForInput 2, Transferring 3, Success 4."""
        return self.state()["rooms"]

    def room_state_names(self) -> dict[int, str]:
        """KVPoll names per room: ``sb.room_state_names()`` -> ``{1: "WaitingForInput", 2: "Bootstrapping"}``."""
        return {room: KVPOLL_NAMES.get(value, str(value)) for room, value in self.room_states().items()}

    def thread_alive(self) -> bool:
        """Whether the bootstrap thread is alive (after close: whether it was alive at teardown)."""
        return self.state()["alive"]

    def exceptions(self, *, include_teardown: bool = False) -> list[dict]:
        """Exceptions that ended threads, oldest first. Each: ``thread`` (name), ``exc_type``,
        ``message``, ``traceback`` (text), ``file``/``line`` (innermost frame), ``frames``,
        ``bootstrap_thread`` (the loop's thread?), ``message_index`` (1-based number of the
        message the loop was handling when it died), ``sandbox_gap`` (set when the death is the
        sandbox's own missing attribute), ``during_teardown`` (left out unless asked for)."""
        if self.final_state is not None:
            records = self._final_exceptions
            return [r for r in records if include_teardown or not r["during_teardown"]]
        return self._request("exceptions", include_teardown=include_teardown)["exceptions"]

    def log_records(self, *, include_teardown: bool = False) -> list[dict]:
        """sglang log records (level, logger, message, thread, time), DEBUG and up."""
        if self.final_state is not None:
            return [r for r in self._final_logs if include_teardown or not r["during_teardown"]]
        return self._request("log_records", include_teardown=include_teardown)["records"]

    def stderr_text(self) -> str:
        """The child's stderr: where CPython's default excepthook printed any thread death."""
        if self._stderr_cache is not None:
            return self._stderr_cache
        try:
            return self._stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ teardown

    def close(self, timeout: float = 15.0) -> None:
        """Stop the loop (ZMQ context terminated from another thread), end the child, keep the results."""
        if self._process is None or self.final_state is not None:
            return
        try:
            self._final_exceptions = self._request("exceptions", include_teardown=True)["exceptions"]
            self._final_logs = self._request("log_records", include_teardown=True)["records"]
            reply = self._request("close", reply_within=timeout)
            final = reply["final"]
            self.final_state = {**final, "rooms": {int(k): v for k, v in final["rooms"].items()}}
            self._final_exceptions += [
                r for r in reply["teardown_exceptions"]
                if not any(r["time"] == e["time"] and r["thread"] == e["thread"] for e in self._final_exceptions)
            ]
            self._process.wait(timeout)
        except (SandboxError, subprocess.TimeoutExpired):
            self._kill()
            if self.final_state is None:
                self.final_state = {"rooms": {}, "alive": False, "threads": [], "consumed": None, "sent": None,
                                    "error": "teardown failed; child killed"}
                self._final_exceptions, self._final_logs = [], []
        finally:
            self._close_pipes()
            # stderr stays readable after close: keep it in memory, drop the temp dir.
            self._stderr_cache = self.stderr_text()
            self._output_dir.cleanup()

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for stream in (getattr(self, "_commands", None), getattr(self, "_replies", None)):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def snapshot(self) -> SandboxSnapshot:
        """The loop's thread, rooms and exceptions now (or at teardown, once closed)."""
        state = self.state()
        return SandboxSnapshot(
            version=self.version, backend=self.backend,
            patched=str(self.conn_file) if self.conn_file else None,
            endpoint=(self._info or {}).get("endpoint"), alive=state["alive"], rooms=state["rooms"],
            exceptions=self.exceptions(), consumed=state.get("consumed"), closed=self.final_state is not None,
        )

    def __rich__(self):
        return self.snapshot().__rich__()

    def _repr_html_(self) -> str:
        return self.snapshot()._repr_html_()

    def __enter__(self) -> EngineSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.final_state is not None else f"pid {self._process.pid if self._process else '-'}"
        patched = f", conn_file={self.conn_file}" if self.conn_file else ""
        return f"EngineSandbox(sglang {self.version}, {self.backend}{patched}, {state})"
