"""The in-process layer (what the twin's prefill process uses), run in a child interpreter.

sglang's module names are process-global, so the release is loaded in a fresh interpreter
that prints one JSON document; the test asserts on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from forensics.sglang_source import fetch

SCRIPT = textwrap.dedent(
    """
    import json, sys, threading, zmq
    from forensics.sandbox import DecodePeer, PrefillLoop, SandboxError, load_release

    release = load_release(sys.argv[1])
    out = {"version": release.version, "again_same": load_release(sys.argv[1]) is release}
    try:
        load_release(sys.argv[2])
    except SandboxError as exc:
        out["second_release"] = str(exc)
    threads_before = threading.active_count()
    try:
        PrefillLoop(release, backend="fake")
    except SandboxError as exc:
        out["bad_backend"] = str(exc)
    out["threads_after_failed_setup"] = threading.active_count() - threads_before

    loop = PrefillLoop(release)
    peer = DecodePeer(release, prefill_host=loop.host, prefill_port=loop.port)
    out["created"] = loop.create_rooms([7, 8])
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(loop.endpoint)
    for frames in (peer.registration(), peer.transfer_info(7), peer.abort(8)):
        push.send_multipart(frames)
    out["consumed"] = loop.wait_consumed(3)
    out["states"] = loop.room_states()
    out["delivered"] = loop.socket.delivered
    out["peer_registered"] = list(loop.manager.decode_kv_args_table) == [peer.agent.name]
    out["threads"] = loop.thread_info()
    push.close()
    peer.close()
    loop.close()
    out["alive_after_close"] = loop.thread_alive()
    out["deaths"] = [e["exc_type"] for e in loop.exceptions()]
    out["teardown"] = [e["exc_type"] for e in loop.exceptions(include_teardown=True)]
    print(json.dumps(out))
    """
)


@pytest.mark.timeout(120)
def test_prefill_loop_and_decode_peer_in_one_process():
    fixed, other = fetch("0.5.16"), fetch("0.5.15")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(fixed.root), str(other.root)],
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["version"] == "0.5.16" and out["again_same"] is True
    assert "already holds sglang 0.5.16" in out["second_release"]
    assert "backend 'fake' is not supported" in out["bad_backend"]
    assert out["threads_after_failed_setup"] == 0
    assert out["created"] == {"7": 1, "8": 1}
    assert out["consumed"] == "consumed" and out["delivered"] == 3
    assert out["states"] == {"7": 2, "8": 0}
    assert out["peer_registered"] is True
    assert out["threads"] == [{"name": "Thread-1 (bootstrap_thread)", "daemon": False, "alive": True}]
    assert out["alive_after_close"] is False
    assert out["deaths"] == [] and out["teardown"] == ["ContextTerminated"]
