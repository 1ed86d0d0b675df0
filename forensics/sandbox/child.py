"""The sandbox's child process: one release, one prefill loop, driven over a JSON-lines pipe.

Started by :class:`~forensics.sandbox.engine.EngineSandbox` as
``python -m forensics.sandbox.child CMD_FD REPLY_FD`` with a JSON setup document in the
environment. Requests and replies are one JSON object per line on two dedicated pipes, so
whatever sglang, NIXL or CPython print on stdout/stderr never mixes with the protocol
(stderr is kept: the default thread excepthook prints the thread death there).
Frames travel as base64.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback

SETUP_ENV = "PD_FORENSICS_SANDBOX_SETUP"


def _b64(frames: list[bytes]) -> list[str]:
    return [base64.b64encode(frame).decode("ascii") for frame in frames]


def _unb64(frames: list[str]) -> list[bytes]:
    return [base64.b64decode(frame) for frame in frames]


class Session:
    def __init__(self, setup: dict) -> None:
        import zmq

        from forensics.sandbox.decode import DecodePeer
        from forensics.sandbox.prefill import PrefillLoop
        from forensics.sandbox.shim import load_release

        self.release = load_release(setup["root"], nixl_conn=setup.get("conn_file"), version=setup["version"])
        # Mooncake: each side gets the release's own MooncakeTransferEngine (TCP) where the release's
        # code and this machine allow; otherwise the session stand-in, and info() says why.
        engines, self.engine_note = (None, None), None
        if setup["backend"] == "mooncake":
            from forensics.sandbox.mooncake_engine import engine_or_reason

            prefill_engine, self.engine_note = engine_or_reason(setup["root"], setup["version"])
            decode_engine = engine_or_reason(setup["root"], setup["version"])[0] if prefill_engine else None
            engines = (prefill_engine, decode_engine)
        self.loop = PrefillLoop(self.release, backend=setup["backend"], mooncake_engine=engines[0])
        self.peer = DecodePeer(self.release, prefill_host=self.loop.host, prefill_port=self.loop.port,
                               backend=setup["backend"], mooncake_engine=engines[1])
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.connect(self.loop.endpoint)
        self.sent = 0

    def info(self) -> dict:
        from forensics.sandbox.managers import env_value, sglang_envs

        def release_env(name: str):
            return env_value(sglang_envs(), name, None)

        return {
            "version": self.release.version,
            "root": str(self.release.root),
            "conn_file": str(self.release.nixl_conn) if self.release.nixl_conn else None,
            "conn_module_file": self.loop.module.__file__,
            "backend": self.loop.backend,
            "endpoint": self.loop.endpoint,
            "nixl": self.release.nixl,
            "agent": self.loop.agent_kind,
            "engine_note": self.engine_note,  # why a Mooncake sandbox kept the stand-in (None: real engine)
            "stubbed": dict(sorted(self.release.stubbed.items())),
            "threads": self.loop.thread_info(),
            "overrides": self.loop.overrides,
            # SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE as each side's release defaults it
            # (0.5.19+, on from 0.5.21 where the backend supports it): whether a prefill acks a
            # drained ABORT, and whether a decode holds an aborted room's pages for that ack.
            "deferred_kv_release": {
                "prefill": bool(getattr(self.loop.manager, "enable_deferred_decode_kv_release", False)),
                "decode": self.peer.defers_kv_release,
                "timeout_s": release_env("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"),
            },
            "pid": os.getpid(),
        }

    # Each op returns a JSON-able dict.
    def op_create_rooms(self, rooms: list[int]) -> dict:
        return {"rooms": self.loop.create_rooms(rooms)}

    def op_frames(self, kind: str, room: int | None = None, armed: bool = False, hold: bool = False,
                  pages: int = 2) -> dict:
        if kind == "registration":
            frames = self.peer.registration()
        elif kind == "transfer_info":
            frames = self.peer.transfer_info(int(room), pages=pages)
        elif kind == "abort":
            frames = self.peer.abort(int(room), armed=armed, hold=hold)
        elif kind == "abort_from_newer_decode":
            frames = self.peer.abort_from_newer_decode(int(room))
        else:
            raise ValueError(f"unknown frame kind {kind!r}")
        return {"frames": _b64(frames)}

    def op_conclude(self, room: int, succeeded: bool) -> dict:
        self.loop.conclude(int(room), succeeded=succeeded)
        return {"rooms": self.loop.room_states()}

    def op_listen(self, rooms: list[int]) -> dict:
        self.peer.listen(rooms)
        return self.peer.request_states()

    def op_decode_states(self) -> dict:
        return self.peer.request_states()

    def op_abort_release_safe(self, room: int) -> dict:
        return {"safe": self.peer.abort_release_safe(int(room))}

    def op_decode_messages(self, wait: float = 0.0) -> dict:
        return {"messages": [_b64(m) for m in self.peer.received(wait)]}

    def op_send(self, frames: list[str]) -> dict:
        self.push.send_multipart(_unb64(frames))
        self.sent += 1
        return {"sent": self.sent}

    def op_settle(self, timeout: float, expected: int | None = None) -> dict:
        target = self.sent if expected is None else expected
        status = self.loop.wait_consumed(target, timeout)
        return {"status": status, "sent": self.sent, "consumed": self.loop.socket.delivered}

    def op_state(self) -> dict:
        return {
            "rooms": self.loop.room_states(),
            "alive": self.loop.thread_alive(),
            "threads": self.loop.thread_info(),
            "consumed": self.loop.socket.delivered,
            "sent": self.sent,
            "retired_nixl_kwargs": sorted(getattr(self.loop.agent, "retired_kwargs_seen", ())),
        }

    def op_exceptions(self, include_teardown: bool = False) -> dict:
        return {"exceptions": self.loop.exceptions(include_teardown=include_teardown)}

    def op_log_records(self, include_teardown: bool = False) -> dict:
        return {"records": self.loop.log_records(include_teardown=include_teardown)}

    def close(self) -> dict:
        self.push.close(linger=0)
        self.context.term()
        self.peer.close()
        self.loop.close()
        return {
            "final": self.op_state(),
            "teardown_exceptions": [r for r in self.loop.watch.records if r["during_teardown"]],
        }


def main(argv: list[str]) -> int:
    command_fd, reply_fd = int(argv[1]), int(argv[2])
    commands = os.fdopen(command_fd, "r", encoding="utf-8")
    replies = os.fdopen(reply_fd, "w", encoding="utf-8", buffering=1)

    def reply(document: dict) -> None:
        replies.write(json.dumps(document, default=str) + "\n")
        replies.flush()

    from forensics.sandbox.errors import SandboxError

    setup = json.loads(os.environ[SETUP_ENV])
    try:
        session = Session(setup)
    except BaseException as exc:  # report every set-up failure to the parent, then exit
        reply({"ok": False, "error": str(exc), "error_type": type(exc).__name__,
               "sandbox_error": isinstance(exc, SandboxError), "traceback": traceback.format_exc()})
        return 3
    reply({"ok": True, "info": session.info()})
    for line in commands:
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op == "close":
                reply({"ok": True, **session.close()})
                replies.close()
                sys.stderr.flush()
                # Everything is closed and reported; skip interpreter finalisation (NIXL/UCX
                # destructors, module teardown), which only costs time in a throwaway process.
                os._exit(0)
            result = getattr(session, f"op_{op}")(**request)
            reply({"ok": True, **result})
        except BaseException as exc:
            reply({"ok": False, "error": str(exc), "error_type": type(exc).__name__,
                   "sandbox_error": isinstance(exc, SandboxError), "traceback": traceback.format_exc()})
    # The parent went away without saying close (killed, or the object was dropped): tear down
    # and leave even if a non-daemon thread of the release is stuck somewhere.
    try:
        session.close()
    finally:
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
