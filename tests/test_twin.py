"""The twin wedges for real on 0.5.15 NIXL, recovers on restart, survives when patched."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import httpx
import pytest
from twin_helpers import (
    guard_line,
    kill_client_during_transfer_wait,
    py_spy_dump,
    py_spy_threads,
    status_code,
    twin_state,
    wait_until,
)

import forensics.twin as twin_api

pytestmark = [pytest.mark.server]
TEST_SETTINGS = {"prefill_rate_tps": 400.0, "decode_rate_tps": 50.0, "decode_log_interval": 10}


@pytest.fixture(scope="module")
def vulnerable(tmp_path_factory, leak_guard):
    twin = twin_api.up("0.5.15", waiting_timeout=15, directory=tmp_path_factory.mktemp("twin-0.5.15"),
                       **TEST_SETTINGS)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(twin.pid(role))
    yield twin
    twin.down()


async def _stream_all(router: str, count: int) -> list[dict]:
    async def one(session: aiohttp.ClientSession, index: int) -> dict:
        body = {"prompt": f"request {index} " * 8, "max_tokens": 5, "stream": True}
        final, tokens = None, 0
        async with session.post(router + "/v1/completions", json=body) as response:
            assert response.status == 200
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "sglang_twin" in chunk:
                    final = chunk["sglang_twin"]
                else:
                    tokens += 1
        return {"index": index, "tokens": tokens, **(final or {})}

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await asyncio.gather(*(one(session, i) for i in range(count)))


def _transfers_counted(prefill: str) -> int:
    """The prefill's ``sglang:kv_transfer_latency_ms_count`` (one sample per KV transfer); 0 before the
    first transfer, when the family is not on the page yet (as in sglang's multiprocess mode)."""
    metrics = httpx.get(prefill + "/metrics").text
    found = re.search(r'^sglang:kv_transfer_latency_ms_count\{engine_type="prefill"[^}]*\} (\d+(?:\.\d+)?)$',
                      metrics, re.M)
    if found is None:
        assert "# TYPE sglang:kv_transfer_latency_ms " not in metrics, metrics[-2000:]
        return 0
    return int(float(found.group(1)))


def _abort_rooms(decode_log: str) -> list[str]:
    return re.findall(r"Sent abort notification for room (\d+) to ", decode_log)


def _wedge(twin) -> str:
    """Kill a client mid-transfer on an unpatched vulnerable twin until its bootstrap thread is dead; the room."""
    before = _abort_rooms(twin.log_text("decode"))
    kill_client_during_transfer_wait(twin)
    wait_until(lambda: twin_state(twin.prefill)["bootstrap_thread_alive"] is False, 20,
               "the prefill's bootstrap thread to die")
    after = _abort_rooms(twin.log_text("decode"))
    assert after[: len(before)] == before and len(after) == len(before) + 1, (before, after)
    return after[-1]


BOOTSTRAP_THREAD = "Thread-1 (bootstrap_thread)"  # threading's name for the release's loop, as py-spy prints it


@pytest.mark.timeout(180)
def test_fifty_concurrent_streams_complete_with_kv_bytes_intact(vulnerable):
    intact_before = twin_state(vulnerable.decode)["counters"]["kv_intact"]
    transfers_before = _transfers_counted(vulnerable.prefill)
    log_before = len(vulnerable.log_text("prefill"))
    results = asyncio.run(_stream_all(vulnerable.router, 50))
    assert [r["tokens"] for r in results] == [5] * 50
    assert all(r["kv_intact"] is True for r in results)
    assert len({r["bootstrap_room"] for r in results}) == 50
    for r in results:  # 256 synthetic KV bytes per prompt token, one token per 4 bytes of text
        assert r["kv_bytes"] == 256 * -(-len(f"request {r['index']} " * 8) // 4)
    counters = twin_state(vulnerable.decode)["counters"]
    assert counters["kv_intact"] - intact_before == 50 and counters["kv_mismatch"] == 0
    prefill_log = vulnerable.log_text("prefill")[log_before:]
    batches = re.findall(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] Prefill batch, #new-seq: (\d+), #new-token: \d+, .*"
                         r"#bootstrap-req: \d+, #inflight-req: \d+, ", prefill_log, re.M)
    assert sum(int(n) for n in batches) == 50, batches  # each stream in exactly one logged prefill batch
    # One transfer per stream reached the prefill's latency histogram (not just a series at 0).
    assert _transfers_counted(vulnerable.prefill) - transfers_before == 50


@pytest.mark.timeout(180)
def test_killed_client_kills_the_bootstrap_thread_and_health_stays_200(vulnerable):
    state = twin_state(vulnerable.prefill)
    assert state["bootstrap_thread_alive"] is True  # what the kill below changes
    before = py_spy_threads(vulnerable.scheduler_pid("prefill"))
    # Before the wedge the dump shows the loop blocked in its receive, under the name py-spy prints.
    assert {"MainThread", BOOTSTRAP_THREAD} <= set(before), before
    assert any(frame.startswith("NixlKVManager._start_bootstrap_thread.<locals>.bootstrap_thread (nixl/conn.py:")
               for frame in before[BOOTSTRAP_THREAD]), before[BOOTSTRAP_THREAD]
    room = _wedge(vulnerable)
    decode_log = vulnerable.log_text("decode")
    failed = re.search(rf"Decode transfer failed for request rank=0 .* decode_req\.req\.bootstrap_room={room} with "
                       rf"exception KVTransferError\(bootstrap_room={room}\): Aborted by AbortReq\.", decode_log)
    assert failed, decode_log[-2000:]
    # The ABORT went to this prefill's PULL socket (the loop's only input).
    port = state["zmq_endpoint"].rsplit(":", 1)[1]
    assert re.search(rf"^\[[^\]]+\] Sent abort notification for room {room} to 127\.0\.0\.1:{port}$", decode_log, re.M)
    conn_py = vulnerable.nixl_conn()
    prefill_log = vulnerable.log_text("prefill")
    assert re.search(r"^Exception in thread Thread-\d+ \(bootstrap_thread\):$", prefill_log, re.M)
    assert f'File "{conn_py}", line {guard_line(conn_py)}, in bootstrap_thread' in prefill_log
    assert "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?" in prefill_log
    # Every new request hangs ...
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(vulnerable.router + "/generate", json={"text": "after the wedge", "sampling_params":
                                                          {"max_new_tokens": 2}}, timeout=4)
    # ... while every health signal stays green.
    for base in (vulnerable.prefill, vulnerable.decode, vulnerable.router):
        assert status_code(base + "/health") == 200
        assert status_code(base + "/health_generate") == 200
    assert httpx.get(vulnerable.bootstrap + "/health").text == "OK"
    # The process is up and serving, but the loop's thread is gone from it: every other thread is still there.
    after = py_spy_threads(vulnerable.scheduler_pid("prefill"))
    assert BOOTSTRAP_THREAD not in after, after
    assert set(before) - {BOOTSTRAP_THREAD} <= set(after), (before, after)
    # Left in the scheduler: the transfer workers and sglang's scheduler watchdog; the release's
    # bootstrap HTTP server and the CPU monitor live in the front, as in sglang, and still run.
    left = {name for name in after if not name.endswith((" (transfer_worker)", " (_watchdog_thread)"))}
    assert left == {"MainThread"}, after
    front = py_spy_threads(vulnerable.pid("prefill"))
    assert {"MainThread", "subprocess-watchdog"} <= set(front), front
    assert {name.split(" ", 1)[1] for name in front if name.startswith("Thread-")} == {"(_run_server)", "(monitor)"}
    assert "bootstrap_thread" not in py_spy_dump(vulnerable.scheduler_pid("prefill"))  # not even as a frame of another


@pytest.mark.timeout(180)
def test_restart_prefill_recovers(vulnerable, leak_guard):
    if twin_state(vulnerable.prefill)["bootstrap_thread_alive"]:  # run alone: wedge it first
        _wedge(vulnerable)
    assert twin_state(vulnerable.prefill)["bootstrap_thread_alive"] is False  # there is something to recover from
    old_pid = vulnerable.pid("prefill")
    vulnerable.restart("prefill")
    leak_guard.allow(vulnerable.pid("prefill"))  # the module fixture's twin, stopped at its teardown
    assert vulnerable.pid("prefill") != old_pid
    state = twin_state(vulnerable.prefill)
    assert state["bootstrap_thread_alive"] is True and state["frames_consumed"] == 0
    response = httpx.post(vulnerable.router + "/generate", json={"text": "after restart", "sampling_params":
                                                                 {"max_new_tokens": 3}}, timeout=30)
    assert response.status_code == 200
    meta = response.json()["meta_info"]
    assert meta["kv_intact"] is True and meta["completion_tokens"] == 3
    # The new loop bootstrapped it: the decode's registration and this room's transfer info.
    state = twin_state(vulnerable.prefill)
    assert state["frames_consumed"] == 2 and state["bootstrap_thread_alive"] is True
    assert f"room={meta['bootstrap_room']} is bootstrapped" in vulnerable.log_text("prefill")


@pytest.mark.timeout(180)
def test_patching_only_the_twins_conn_py_then_restart_changes_the_outcome(vulnerable, leak_guard):
    from patched_engine.apply import apply_file

    applied = apply_file(vulnerable.nixl_conn(), yes=True, backup_dir=vulnerable.directory / "backups",
                         release="0.5.15")
    assert applied.status == "applied"
    vulnerable.restart("prefill")
    leak_guard.allow(vulnerable.pid("prefill"))
    deaths_before = vulnerable.log_text("prefill").count("Exception in thread ")
    aborts_before = _abort_rooms(vulnerable.log_text("decode"))
    kill_client_during_transfer_wait(vulnerable)
    aborts = _abort_rooms(vulnerable.log_text("decode"))
    assert aborts[: len(aborts_before)] == aborts_before and len(aborts) == len(aborts_before) + 1
    room = aborts[-1]
    # The ABORT reached the patched loop, which failed the room and went on.
    wait_until(lambda: f"Received abort notification for room {room}, marked as Failed" in
               vulnerable.log_text("prefill"), 20, "the patched loop to take the ABORT")
    response = httpx.post(vulnerable.router + "/generate", json={"text": "still serving", "sampling_params":
                                                                 {"max_new_tokens": 3}}, timeout=30)
    assert response.status_code == 200 and response.json()["meta_info"]["kv_intact"] is True
    assert twin_state(vulnerable.prefill)["bootstrap_thread_alive"] is True
    prefill_log = vulnerable.log_text("prefill")
    assert prefill_log.count("Exception in thread ") == deaths_before  # no thread died after the patch
