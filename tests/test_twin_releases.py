"""Fixed releases survive the kill; 0.5.17 to 0.5.23 serve; 0.5.23 dies on a foreign frame unless patched; bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from packaging.version import Version
from twin_helpers import kill_client_during_transfer_wait, twin_state, wait_until

import forensics.twin as twin_api
from forensics.crosscheck import FOREIGN_FRAME, push_frames
from forensics.exitcodes import EnvironmentProblem
from forensics.sglang_source import SglangSource
from forensics.twin import processes
from forensics.twin.release_mooncake import check_mooncake_served

pytestmark = [pytest.mark.server]
TEST_SETTINGS = {"prefill_rate_tps": 400.0, "decode_rate_tps": 50.0}


def _send_foreign_frame(twin) -> int:
    before = push_frames(twin, FOREIGN_FRAME)
    wait_until(lambda: twin_state(twin.prefill)["frames_consumed"] > before, 10, "the loop to take the frame")
    return before


@pytest.mark.timeout(180)
def test_fixed_release_survives_the_kill_and_down_leaves_nothing(tmp_path, leak_guard):
    twin = twin_api.up("0.5.16", waiting_timeout=15, directory=tmp_path, **TEST_SETTINGS)
    pids = [twin.pid(role) for role in processes.ROLE_ORDER]

    def processes_of_the_twin() -> list[int]:
        """Every process in the twin's sessions (each role starts its own; its title hides the command line)."""
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) in pids and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc.pid)
            except (OSError, psutil.Error):
                pass
        return sorted(found)

    try:
        # What down must remove is there and findable (so the checks after down can fail).
        assert all(processes.alive(pid) for pid in pids)
        tree = processes_of_the_twin()  # the router; each engine's front, scheduler, detokenizer, resource tracker
        assert set(pids) <= set(tree) and len(tree) == 1 + 2 * 4, tree
        assert sorted(p.name for p in twin.directory.glob("*.pid")) == [
            "decode.pid", "decode.scheduler.pid", "prefill.pid", "prefill.scheduler.pid", "router.pid"]
        kill_client_during_transfer_wait(twin)
        [room] = re.findall(r"Sent abort notification for room (\d+) to ", twin.log_text("decode"))
        # The ABORT reached the prefill's loop, which failed that room with 0.5.16's own handler and went on.
        wait_until(lambda: f"Received abort notification for room {room}, marked as Failed" in twin.log_text("prefill"),
                   10, "the prefill to take the ABORT")
        response = httpx.post(twin.router + "/generate", json={"text": "after the kill", "sampling_params":
                                                               {"max_new_tokens": 2}}, timeout=30)
        assert response.status_code == 200 and response.json()["meta_info"]["kv_intact"] is True
        assert twin_state(twin.prefill)["bootstrap_thread_alive"] is True
        prefill_log = twin.log_text("prefill")
        assert "Foreign traffic?" not in prefill_log and "Exception in thread" not in prefill_log
    finally:
        stopped = twin.down()
    assert stopped == ["router", "decode", "prefill"]
    assert not any(psutil.pid_exists(pid) and processes.alive(pid) for pid in pids)
    assert processes_of_the_twin() == []
    # (other suites on this machine may reuse the freed ports at once, so a port check proves nothing)
    assert not list(twin.directory.glob("*.pid"))


def _generate(twin, text: str, *, stream: bool = False, max_new_tokens: int = 3) -> dict:
    """One /generate through the router; the decode's meta_info (``kv_intact``: the pages it read
    are the bytes the prefill must have sent for that room)."""
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}, "stream": stream}
    if not stream:
        response = httpx.post(twin.router + "/generate", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["meta_info"]
    with httpx.stream("POST", twin.router + "/generate", json=body, timeout=60) as response:
        assert response.status_code == 200
        chunks = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]", chunks[-3:]
    meta = json.loads(chunks[-2])["meta_info"]
    assert meta["completion_tokens"] == max_new_tokens and len(chunks) == max_new_tokens + 2
    return meta


# CI runs the releases where something changed (0.5.17: per-layer ids; 0.5.20: the decode
# listener; 0.5.23: KV_STATUS); the others run in the slow set (CI's 25-minute budget).
NEW_RELEASES = [pytest.param(r, marks=() if r in ("0.5.17", "0.5.20", "0.5.23") else pytest.mark.slow)
                for r in ["0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("release", NEW_RELEASES)
def test_release_serves_and_survives_the_kill(tmp_path, release, leak_guard):
    """0.5.17 to 0.5.23 serve (a non-streaming and a streaming /generate, KV verified by the decode),
    and a client killed while its KV is pending is what the release's code makes of it: the decode's
    own ABORT reaches the prefill's own loop, which fails that room and lives on (all are fixed
    releases); from 0.5.21 the decode holds the room's pages until the prefill's ABORT_ACK, read by
    the release's decode listener thread."""
    twin = twin_api.up(release, waiting_timeout=15, directory=tmp_path, **TEST_SETTINGS)
    try:
        metas = [_generate(twin, "a twin of " + release * 40), _generate(twin, "streamed " * 60, stream=True)]
        assert [m["kv_intact"] for m in metas] == [True, True], metas
        assert all(isinstance(m["bootstrap_room"], int) and 0 <= m["bootstrap_room"] < 2**63 for m in metas)
        decode = twin_state(twin.decode)
        assert (decode["counters"]["kv_intact"], decode["counters"]["kv_mismatch"]) == (2, 0)
        kv_status = release == "0.5.23"  # its decode learns a transfer's end from the prefill's KV_STATUS
        assert decode["completion_signal"].startswith("KV_STATUS" if kv_status else "NIXL notifications")
        assert decode["listener_received"].get("KV_STATUS", 0) == (2 if kv_status else 0)

        kill_client_during_transfer_wait(twin)
        [room] = re.findall(r"Sent abort notification for room (\d+) to ", twin.log_text("decode"))
        wait_until(lambda: f"Received abort notification for room {room}, marked as Failed"
                   in twin.log_text("prefill"), 20, "the prefill's loop to take the ABORT")
        deferred = twin_state(twin.decode)["deferred_kv_release"]
        # SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE defaults on from 0.5.21, where NIXL supports it.
        assert deferred is (Version(release) >= Version("0.5.21"))
        if deferred:
            # The prefill's worker drained the room and acked; the release's listener recorded it.
            wait_until(lambda: twin_state(twin.decode)["counters"]["deferred_release_drained"] == 1, 30,
                       "the decode to release the held pages on the prefill's ABORT_ACK")
            state = twin_state(twin.decode)
            assert state["listener_received"].get("ABORT_ACK") == 1 and state["held_for_drain"] == 0
            assert state["counters"]["deferred_release_timeout"] == 0
        after = _generate(twin, "after the kill", max_new_tokens=2)
        assert after["kv_intact"] is True
        prefill = twin_state(twin.prefill)
        assert prefill["bootstrap_thread_alive"] is True
        log = twin.log_text("prefill")
        assert "Foreign traffic?" not in log and "Exception in thread" not in log
        assert twin_state(twin.decode)["counters"]["kv_mismatch"] == 0
    finally:
        twin.down()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("patched", [False, True], ids=["unpatched", "patched"])
def test_release_0_5_23_serves_50_streams_and_foreign_frame(tmp_path, patched):
    twin = twin_api.up("0.5.23", patched=patched, directory=tmp_path, **TEST_SETTINGS)
    try:
        before = twin_state(twin.decode)
        prompts = [f"stream {i} " * (5 + 3 * i) for i in range(50)]  # 13 to 400 tokens, 1 to 25 pages of 4 KiB
        with ThreadPoolExecutor(50) as pool:
            metas = list(pool.map(lambda text: _generate(twin, text, stream=True), prompts))
        assert all(meta["kv_intact"] is True for meta in metas), [m for m in metas if not m["kv_intact"]]
        assert len({meta["bootstrap_room"] for meta in metas}) == 50
        after = twin_state(twin.decode)
        assert after["counters"]["kv_intact"] - before["counters"]["kv_intact"] == 50
        assert after["counters"]["kv_mismatch"] == 0 and after["counters"]["transfer_failed"] == 0
        # Every completion came the release's way: a KV_STATUS per room, read by its listener thread.
        assert after["listener_received"].get("KV_STATUS", 0) - before["listener_received"].get("KV_STATUS", 0) == 50
        assert [t["alive"] for t in after["release_threads"]] == [True, True]
        assert twin_state(twin.prefill)["counters"]["transferred"] == 50

        _send_foreign_frame(twin)
        log = twin.log_text("prefill")
        if patched:
            assert twin_state(twin.prefill)["bootstrap_thread_alive"] is True
            assert "Foreign traffic?" not in log and "Exception in thread" not in log
            # The patched loop took the frame and said so (the codemod's warning), naming what it dropped.
            dropped = f"Dropping a message on the bootstrap socket whose first part is {FOREIGN_FRAME[0]!r} (2 parts)"
            wait_until(lambda: dropped in twin.log_text("prefill"), 10, "the patched loop's warning")
            assert _generate(twin, "served after the foreign frame", stream=True)["kv_intact"] is True
        else:
            wait_until(lambda: twin_state(twin.prefill)["bootstrap_thread_alive"] is False, 10, "the thread to die")
            log = twin.log_text("prefill")
            assert "prefill bootstrap_thread died on engine_rank=0" in log
            assert "Exception in thread Thread-1 (bootstrap_thread_guarded):" in log
            assert "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?" in log
    finally:
        twin.down()


def test_busy_port_is_a_clear_error_and_nothing_runs(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(EnvironmentProblem, match=rf"port {port} \(router\) on 127.0.0.1 is already in use"):
            twin_api.up("0.5.15", base_port=port, directory=tmp_path)
    assert not list(tmp_path.glob("*.pid"))


def test_release_that_cannot_be_fetched_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_FORENSICS_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_NO_INDEX", "0")
    with pytest.raises(EnvironmentProblem, match=r"could not fetch sglang 0\.5\.99"):
        twin_api.up("0.5.99", directory=tmp_path / "twin")
    assert not (tmp_path / "twin").exists() or not list((tmp_path / "twin").glob("*.pid"))


def test_release_without_the_backend_is_a_clear_error(tmp_path):
    with pytest.raises(EnvironmentProblem, match=r"sglang 0\.5\.1 has no mori backend"):
        twin_api.up("0.5.1", backend="mori", directory=tmp_path)
    with pytest.raises(EnvironmentProblem, match=r"runs the nixl and mooncake backends \(got --backend mori\)"):
        twin_api.up("0.5.15", backend="mori", directory=tmp_path)
    # A Mooncake twin of a tree it cannot serve is refused up front, naming why (never a hang): every
    # 0.5.x wheel has a MooncakeTransferEngine wrapper, a trimmed checkout may not.
    trimmed = tmp_path / "trimmed"
    (trimmed / "sglang" / "srt" / "disaggregation" / "mooncake").mkdir(parents=True)
    with pytest.raises(EnvironmentProblem, match=r"0\.5\.6 --backend mooncake: the release has no "
                                                 r"MooncakeTransferEngine wrapper \(neither .*\)"):
        check_mooncake_served(SglangSource(version="0.5.6", root=trimmed, origin="directory"))
    with pytest.raises(EnvironmentProblem, match=r"--patched applies the NIXL fix to nixl/conn\.py"):
        twin_api.up("0.5.14", backend="mooncake", patched=True, directory=tmp_path)


@pytest.mark.timeout(120)
def test_cli_up_status_down_json(tmp_path):
    forensics = [sys.executable, "-m", "forensics"]
    up = subprocess.run([*forensics, "twin", "up", "--sglang", "0.5.16", "--dir", str(tmp_path), "--json"],
                        capture_output=True, text=True, timeout=90)
    assert up.returncode == 0, up.stderr
    data = json.loads(up.stdout)
    try:
        assert {"router", "prefill", "decode", "inventory"} <= set(data)
        assert data["router"].startswith("http://127.0.0.1:")
        status = subprocess.run([*forensics, "twin", "status", "--inventory", data["inventory"], "--json"],
                                capture_output=True, text=True, timeout=60)
        report = json.loads(status.stdout)
        assert status.returncode == 0 and report["healthy"] is True
        assert report["roles"]["prefill"]["bootstrap_thread_alive"] is True
        assert {role: entry["pid"] for role, entry in report["roles"].items()} == data["pids"]
        assert all(processes.alive(pid) for pid in data["pids"].values())
    finally:
        down = subprocess.run([*forensics, "twin", "down", "--inventory", data["inventory"], "--json"],
                              capture_output=True, text=True, timeout=60)
    stopped = json.loads(down.stdout)
    assert down.returncode == 0 and stopped["exit"] == 0, down.stdout + down.stderr
    assert stopped["stopped"] == ["router", "decode", "prefill"]
    assert not any(processes.alive(pid) for pid in data["pids"].values())
    bad = subprocess.run([*forensics, "twin", "up", "--sglang", "0.5.14", "--backend", "mooncake", "--patched",
                          "--dir", str(tmp_path / "bad"), "--json"], capture_output=True, text=True, timeout=60)
    # The exit contract: 4 (environment), one line on stderr, and with --json one document on stdout.
    assert bad.returncode == 4, bad.stderr
    refusal = "--patched applies the NIXL fix to nixl/conn.py, which a Mooncake twin does not run"
    assert len(bad.stderr.splitlines()) == 1 and refusal in bad.stderr
    error = json.loads(bad.stdout)
    assert (error["status"], error["exit"], error["kind"]) == ("error", 4, "TwinError")
    assert refusal in error["error"]
