"""Engine sandbox against real sglang wheels: the real bootstrap loop, real ZMQ, real NIXL agents."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from forensics.sandbox import EngineSandbox, SandboxError, rules_for
from forensics.sglang_source import fetch

pytestmark = pytest.mark.server  # every test here starts a sandbox engine

FAILED, BOOTSTRAPPING, WAITING = 0, 1, 2
GUARD_MESSAGE = "First message should be b'NixlMsgGuard'. Foreign traffic?"
ABORT_HANDLER_CALL = "                if self._handle_abort_notification(waiting_req_bytes):\n                    continue\n"


def guard_line(conn_file: Path) -> int:
    """Line of the GUARD comparison in a nixl/conn.py (what a 3.11 traceback points at)."""
    lines = conn_file.read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if "waiting_req_bytes[0] == GUARD" in line]
    assert len(hits) == 1, f"{conn_file}: expected one GUARD comparison, found {hits}"
    return hits[0]


@pytest.mark.timeout(120)
def test_0_5_15_unpatched_dies_on_abort_and_strands_later_rooms():
    source = fetch("0.5.15")
    conn_file = source.backend_file("nixl")
    with EngineSandbox(source, backend="nixl") as sb:
        assert sb.endpoint.startswith("tcp://127.0.0.1:")
        assert sb.info["nixl"].endswith("(real)")
        assert sb.create_rooms([1, 2, 3, 4]) == {1: BOOTSTRAPPING, 2: BOOTSTRAPPING, 3: BOOTSTRAPPING, 4: BOOTSTRAPPING}

        registration = sb.frames.registration()
        sb.send(registration)
        assert sb.settle() == "consumed"
        assert sb.thread_alive()

        sb.send(sb.frames.transfer_info(room=1))
        assert sb.settle() == "consumed"
        assert sb.room_states()[1] == WAITING

        abort = sb.frames.abort(room=2)
        assert abort[:2] == [b"ABORT", b"2"] and len(abort) == 4
        sb.send(abort)
        assert sb.settle() == "thread dead"
        assert not sb.thread_alive()

        sb.send(sb.frames.transfer_info(room=3))
        sb.send(sb.frames.transfer_info(room=4))
        assert sb.settle() == "thread dead"
        assert sb.room_states() == {1: WAITING, 2: BOOTSTRAPPING, 3: BOOTSTRAPPING, 4: BOOTSTRAPPING}

        [death] = sb.exceptions()
        assert death["exc_type"] == "AssertionError"
        assert death["message"] == GUARD_MESSAGE
        assert death["thread"].endswith("(bootstrap_thread)")
        assert death["bootstrap_thread"] is True
        assert death["message_index"] == 3  # registration, transfer info, then the ABORT
        assert death["file"] == str(conn_file)
        assert death["line"] == guard_line(conn_file) == 2349
        assert death["frames"][-1]["function"] == "bootstrap_thread"

        stderr = sb.stderr_text()
        assert "Exception in thread Thread-1 (bootstrap_thread):" in stderr
        assert f'nixl/conn.py", line {guard_line(conn_file)}, in bootstrap_thread' in stderr
        assert f"AssertionError: {GUARD_MESSAGE}" in stderr
        messages = [r["message"] for r in sb.log_records() if r["bootstrap_thread"]]
        assert "room=1 is bootstrapped" in messages
        assert not any(m.startswith("Sent abort notification") for m in messages)  # the decode side's
    # Teardown is not a death: only the ABORT's AssertionError is reported.
    snapshot = sb.snapshot()
    assert snapshot.thread_word.startswith("bootstrap thread DEAD: AssertionError")
    assert snapshot.to_frame()["state"].tolist() == ["WaitingForInput", "Bootstrapping", "Bootstrapping", "Bootstrapping"]
    assert "DEAD" in sb._repr_html_() and "WaitingForInput" in sb._repr_html_()
    assert [e["exc_type"] for e in sb.exceptions()] == ["AssertionError"]
    assert sb.thread_alive() is False


@pytest.mark.timeout(120)
def test_0_5_16_fails_aborted_room_but_dies_on_foreign_frame():
    source = fetch("0.5.16")
    with EngineSandbox(source) as sb:
        sb.create_rooms([1, 2, 3, 4])
        sb.send(sb.frames.registration())
        sb.send(sb.frames.transfer_info(room=1))
        sb.send(sb.frames.abort(room=2))
        sb.send(sb.frames.transfer_info(room=3))
        assert sb.settle() == "consumed"
        assert sb.thread_alive()
        assert sb.room_states() == {1: WAITING, 2: FAILED, 3: WAITING, 4: BOOTSTRAPPING}
        assert any("Received abort notification for room 2, marked as Failed" in r["message"]
                   for r in sb.log_records())

        sb.send([b"FOREIGN", b"x"])
        sb.send(sb.frames.transfer_info(room=4))
        assert sb.settle() == "thread dead"
        assert sb.room_states()[4] == BOOTSTRAPPING
        [death] = sb.exceptions()
        assert (death["exc_type"], death["message"]) == ("AssertionError", GUARD_MESSAGE)
        assert death["message_index"] == 5
        assert death["line"] == guard_line(source.backend_file("nixl"))
    assert sb.exceptions(include_teardown=True)[-1]["exc_type"] == "AssertionError"


@pytest.mark.timeout(120)
def test_behaviour_follows_the_code_0_5_16_without_its_abort_handler_dies(tmp_path):
    source = fetch("0.5.16")
    original = source.backend_file("nixl").read_text()
    assert original.count(ABORT_HANDLER_CALL) == 1
    modified = tmp_path / "conn.py"
    modified.write_text(original.replace(ABORT_HANDLER_CALL, ""))
    with EngineSandbox(source, conn_file=modified) as sb:
        assert sb.info["conn_module_file"] == str(modified)
        sb.create_rooms([1, 2, 3])
        sb.send(sb.frames.registration())
        sb.send(sb.frames.transfer_info(room=1))
        sb.send(sb.frames.abort(room=2))
        sb.send(sb.frames.transfer_info(room=3))
        assert sb.settle() == "thread dead"
        assert sb.room_states() == {1: WAITING, 2: BOOTSTRAPPING, 3: BOOTSTRAPPING}
        [death] = sb.exceptions()
        assert death["message"] == GUARD_MESSAGE
        assert death["file"] == str(modified)
        assert death["line"] == guard_line(modified)


# release -> (registration frame count, dies on the ABORT its own decode sends)
RELEASES = {
    "0.5.12.post1": (17, None),  # its decode sends no ABORT
    "0.5.13": (18, True),
    "0.5.15": (20, True),
    "0.5.16": (20, False),
    "0.5.18": (24, False),
    "0.5.22": (24, False),
    "0.5.23": (25, False),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_release_scenario(version):
    registration_frames, dies_on_abort = RELEASES[version]
    with EngineSandbox(fetch(version)) as sb:
        # The stub table is minimal: every rule that applies to this release was needed.
        assert set(sb.info["stubbed"].values()) == {rule.module for rule in rules_for(version)}
        assert sb.info["agent"] == "nixl (real, UCX, host memory)"
        sb.create_rooms([1, 2, 3])
        registration = sb.frames.registration()
        assert len(registration) == registration_frames
        assert registration[:2] == [b"NixlMsgGuard", b"None"]
        assert registration[2] == b"127.0.0.1"
        transfer_info = sb.frames.transfer_info(room=1)
        assert transfer_info[:3] == [b"NixlMsgGuard", b"1", b"127.0.0.1"]
        assert transfer_info[4] == registration[4]  # the same decode agent name
        sb.send(registration)
        sb.send(transfer_info)
        assert sb.settle() == "consumed"
        assert sb.room_states()[1] == WAITING
        if dies_on_abort is None:
            with pytest.raises(SandboxError, match="_send_abort_notification"):
                sb.frames.abort(room=2)
            # A newer decode's ABORT (mixed versions) kills this loop too: the assert predates ABORT.
            sb.send(sb.frames.abort_from_newer_decode(room=2))
            assert sb.settle() == "thread dead"
            assert [e["message"] for e in sb.exceptions()] == [GUARD_MESSAGE]
            return
        abort = sb.frames.abort(room=2)
        assert abort == [b"ABORT", b"2", b"127.0.0.1", abort[3]] and abort[3].isdigit()
        # The sandbox's own builder (for releases without a sender) matches the release's code.
        assert sb.frames.abort_from_newer_decode(room=2) == abort
        sb.send(abort)
        sb.send(sb.frames.transfer_info(room=3))
        status = sb.settle()
        if dies_on_abort:
            assert status == "thread dead"
            assert sb.room_states() == {1: WAITING, 2: BOOTSTRAPPING, 3: BOOTSTRAPPING}
            assert [e["message"] for e in sb.exceptions()] == [GUARD_MESSAGE]
        else:
            assert status == "consumed" and sb.thread_alive()
            assert sb.room_states() == {1: WAITING, 2: FAILED, 3: WAITING}
            assert sb.exceptions() == []


@pytest.mark.timeout(120)
def test_an_import_outside_the_real_and_stub_lists_fails_loudly(tmp_path):
    source = fetch("0.5.15")
    patched = tmp_path / "conn.py"
    original = source.backend_file("nixl").read_text()
    anchor = "import numpy as np\n"
    assert original.count(anchor) == 1
    patched.write_text(
        original.replace(anchor, anchor + "import sglang.srt.model_executor.forward_batch_info  # in no list\n")
    )
    import_line = patched.read_text().splitlines().index(
        "import sglang.srt.model_executor.forward_batch_info  # in no list") + 1
    with pytest.raises(SandboxError) as caught:
        EngineSandbox(source, conn_file=patched)
    message = str(caught.value)
    assert "sglang.srt.model_executor" in message
    assert f"imported by sglang.srt.disaggregation.nixl.conn (conn.py:{import_line})" in message
    assert "UnexpectedImport" in message


@pytest.mark.timeout(60)
def test_a_missing_conn_file_is_a_sandbox_error(tmp_path):
    with pytest.raises(SandboxError, match="does not exist"):
        EngineSandbox(fetch("0.5.15"), conn_file=tmp_path / "absent.py")


@pytest.mark.timeout(120)
def test_0_5_22_armed_abort_has_a_generation_and_gets_a_real_drained_ack():
    with EngineSandbox(fetch("0.5.22")) as sb:
        sb.create_rooms([1, 2])
        sb.send(sb.frames.registration())
        sb.send(sb.frames.transfer_info(room=1))
        sb.send(sb.frames.transfer_info(room=2))
        plain = sb.frames.abort(room=2)
        armed = sb.frames.abort(room=2, armed=True)
        assert len(plain) == 4
        assert armed == plain + [b"1"]  # AbortNotification.to_zmq: generation 1 appended
        sb.send(armed)
        assert sb.settle() == "consumed"
        assert sb.room_states() == {1: WAITING, 2: FAILED}
        # The prefill's own deferred-release path answers on the decode's rank socket.
        assert sb.decode_messages(wait=5.0) == [[b"ABORT_ACK", b"2", b"0", b"1"]]


def session_id_line(conn_file: Path) -> int:
    lines = conn_file.read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if "mooncake_session_id = waiting_req_bytes[3]" in line]
    assert len(hits) == 1, hits
    return hits[0]


@pytest.mark.timeout(120)
def test_mooncake_0_5_15_acks_abort_but_a_short_foreign_frame_kills_its_loop():
    source = fetch("0.5.15")
    with EngineSandbox(source, backend="mooncake") as sb:
        assert sb.info["threads"][0]["name"].endswith("(bootstrap_thread)")
        sb.create_rooms([1, 2, 3])
        registration = sb.frames.registration()
        assert len(registration) == 14 and registration[0] == b"None"
        sb.send(registration)
        sb.send(sb.frames.transfer_info(room=1))
        sb.send(sb.frames.abort(room=2))
        sb.send(sb.frames.transfer_info(room=3))
        assert sb.settle() == "consumed"
        assert sb.room_states() == {1: WAITING, 2: FAILED, 3: WAITING}
        assert sb.decode_messages(wait=5.0) == [[b"ABORT_ACK", b"2"]]
        sb.send([b"FOREIGN", b"x"])
        assert sb.settle() == "thread dead"
        [death] = sb.exceptions()
        assert (death["exc_type"], death["message"]) == ("IndexError", "list index out of range")
        assert death["file"] == str(source.backend_file("mooncake"))
        assert death["line"] == session_id_line(source.backend_file("mooncake"))


@pytest.mark.timeout(120)
def test_a_death_on_an_attribute_the_sandbox_did_not_set_is_a_sandbox_error_not_a_finding(tmp_path):
    source = fetch("0.5.16")
    text = source.backend_file("nixl").read_text()
    init_anchor = "        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)\n"
    handler_anchor = "    def _handle_abort_notification(self, msg: List[bytes]) -> bool:\n"
    assert text.count(init_anchor) == 1 and text.count(handler_anchor) == 1
    text = text.replace(init_anchor, init_anchor + "        self.probe_value = uuid.uuid4()\n")
    text = text.replace(handler_anchor, handler_anchor + "        self.probe_value\n")
    modified = tmp_path / "conn.py"
    modified.write_text(text)
    with EngineSandbox(source, conn_file=modified) as sb:
        sb.create_rooms([1])
        sb.send(sb.frames.abort(room=1))
        with pytest.raises(SandboxError, match=r"NixlKVManager\.probe_value.*sandbox gap"):
            sb.settle()
        [death] = sb.exceptions()
        assert death["sandbox_gap"] == "NixlKVManager.probe_value"


@pytest.mark.timeout(120)
def test_without_nixl_the_loop_runs_with_a_recording_agent_and_still_dies_on_abort():
    source = fetch("0.5.15")
    with EngineSandbox(source, nixl=False) as sb:
        assert sb.info["nixl"].startswith("disabled")
        assert sb.info["agent"] == "recording stand-in (NIXL disabled)"
        sb.create_rooms([1, 2, 3])
        registration = sb.frames.registration()
        assert registration[5].startswith(b"recording-agent:")  # the stand-in's metadata blob
        sb.send(registration)
        sb.send(sb.frames.transfer_info(room=1))
        assert sb.settle() == "consumed" and sb.room_states()[1] == WAITING
        sb.send(sb.frames.abort(room=2))
        assert sb.settle() == "thread dead"
        assert [e["line"] for e in sb.exceptions()] == [guard_line(source.backend_file("nixl"))]


@pytest.mark.timeout(120)
def test_a_tree_without_the_backend_is_a_sandbox_error_naming_the_missing_file(tmp_path):
    import shutil

    from forensics.sglang_source import SglangSource

    real = fetch("0.5.15")
    srt = tmp_path / "sglang" / "srt"
    shutil.copytree(real.disaggregation, srt / "disaggregation", ignore=shutil.ignore_patterns("nixl"))
    shutil.copy(real.srt / "environ.py", srt / "environ.py")
    partial = SglangSource(version="0.5.15", root=tmp_path, origin="directory")
    with pytest.raises(SandboxError, match=r"sglang\.srt\.disaggregation\.nixl is not in the tree .*disaggregation/nixl"):
        EngineSandbox(partial)


@pytest.mark.timeout(120)
def test_a_child_that_dies_while_loading_is_a_sandbox_error_with_its_stderr(tmp_path):
    source = fetch("0.5.15")
    crashing = tmp_path / "conn.py"
    crashing.write_text("import os, sys\nsys.stderr.write('conn.py refuses to load\\n')\nos._exit(7)\n")
    with pytest.raises(SandboxError, match=r"(?s)status 7.*conn.py refuses to load"):
        EngineSandbox(source, conn_file=crashing)


@pytest.mark.timeout(120)
def test_a_loop_stuck_inside_a_handler_times_out_settle_and_still_tears_down(tmp_path):
    source = fetch("0.5.16")
    text = source.backend_file("nixl").read_text()
    anchor = "    def _handle_abort_notification(self, msg: List[bytes]) -> bool:\n"
    assert text.count(anchor) == 1
    stuck = tmp_path / "conn.py"
    stuck.write_text(text.replace(anchor, anchor + "        threading.Event().wait()  # never set\n"))
    with EngineSandbox(source, conn_file=stuck) as sb:
        sb.create_rooms([1])
        sb.send(sb.frames.abort(room=1))
        with pytest.raises(SandboxError, match="did not consume 1 messages within 1.0 s"):
            sb.settle(timeout=1.0)
        assert sb.thread_alive()
    assert sb.final_state is not None and sb.final_state["alive"] is True


@pytest.mark.timeout(120)
def test_a_dropped_sandbox_child_exits_on_its_own():
    import psutil

    sb = EngineSandbox(fetch("0.5.15"))
    child = psutil.Process(sb.pid)
    sb.create_rooms([1])
    sb._commands.close()  # what the parent's death or garbage collection does to the pipe
    assert child.wait(timeout=30) == 0
    sb.close()


@pytest.mark.timeout(120)
def test_sandboxes_started_together_run_in_parallel_and_report_set_up_failures_late(tmp_path):
    source = fetch("0.5.15")
    broken = tmp_path / "conn.py"
    broken.write_text("raise ImportError('this conn.py does not load')\n")
    started = time.monotonic()
    unpatched = EngineSandbox(source, wait_ready=False)
    failing = EngineSandbox(source, conn_file=broken, wait_ready=False)
    spawned = time.monotonic() - started
    try:
        with pytest.raises(SandboxError, match="this conn.py does not load"):
            failing.wait_ready()
        with pytest.raises(SandboxError, match="this conn.py does not load"):  # remembered, not re-read
            failing.create_rooms([1])
        assert unpatched.create_rooms([1]) == {1: BOOTSTRAPPING}
        assert unpatched.info["version"] == "0.5.15"
        # Both children were loading at once: the constructors returned long before either was set up.
        ready = time.monotonic() - started
        assert spawned < ready / 4, (spawned, ready)
    finally:
        failing.close()
        unpatched.close()
