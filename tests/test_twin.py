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


@pytest.mark.timeout(180)
def test_fifty_concurrent_streams_complete_with_kv_bytes_intact(vulnerable):
    results = asyncio.run(_stream_all(vulnerable.router, 50))
    assert [r["tokens"] for r in results] == [5] * 50
    assert all(r["kv_intact"] is True for r in results)
    assert len({r["bootstrap_room"] for r in results}) == 50
    for r in results:  # 256 synthetic KV bytes per prompt token, one token per 4 bytes of text
        assert r["kv_bytes"] == 256 * -(-len(f"request {r['index']} " * 8) // 4)
    counters = twin_state(vulnerable.decode)["counters"]
    assert counters["kv_intact"] >= 50 and counters["kv_mismatch"] == 0
    prefill_log = vulnerable.log_text("prefill")
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] Prefill batch, #new-seq: \d+, #new-token: \d+", prefill_log, re.M)
    assert "#bootstrap-req: " in prefill_log
    metrics = httpx.get(vulnerable.prefill + "/metrics").text
    assert re.search(r'sglang:kv_transfer_latency_ms_count\{engine_type="prefill".*\} (\d+)', metrics)


@pytest.mark.timeout(180)
def test_killed_client_kills_the_bootstrap_thread_and_health_stays_200(vulnerable):
    kill_client_during_transfer_wait(vulnerable)
    wait_until(lambda: twin_state(vulnerable.prefill)["bootstrap_thread_alive"] is False, 20,
               "the prefill's bootstrap thread to die")
    decode_log = vulnerable.log_text("decode")
    failed = re.search(r"Decode transfer failed for request rank=0 .* decode_req\.req\.bootstrap_room=(\d+) with "
                       r"exception KVTransferError\(bootstrap_room=\1\): Aborted by AbortReq\.", decode_log)
    assert failed, decode_log[-2000:]
    room = failed.group(1)
    assert re.search(rf"Sent abort notification for room {room} to 127\.0\.0\.1:\d+", decode_log)
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
    dump = py_spy_dump(vulnerable.pid("prefill"))
    assert "transfer_worker" in dump or "Thread" in dump
    assert "bootstrap_thread" not in dump


@pytest.mark.timeout(180)
def test_restart_prefill_recovers(vulnerable, leak_guard):
    vulnerable.restart("prefill")
    leak_guard.allow(vulnerable.pid("prefill"))  # the module fixture's twin, stopped at its teardown
    assert twin_state(vulnerable.prefill)["bootstrap_thread_alive"] is True
    response = httpx.post(vulnerable.router + "/generate", json={"text": "after restart", "sampling_params":
                                                                 {"max_new_tokens": 3}}, timeout=30)
    assert response.status_code == 200
    assert response.json()["meta_info"]["kv_intact"] is True


@pytest.mark.timeout(180)
def test_patching_only_the_twins_conn_py_then_restart_changes_the_outcome(vulnerable, leak_guard):
    from patched_engine.apply import apply_file

    apply_file(vulnerable.nixl_conn(), yes=True, backup_dir=vulnerable.directory / "backups", release="0.5.15")
    vulnerable.restart("prefill")
    leak_guard.allow(vulnerable.pid("prefill"))
    kill_client_during_transfer_wait(vulnerable)
    aborts = len(re.findall(r"Sent abort notification for room", vulnerable.log_text("decode")))
    assert aborts >= 2
    response = httpx.post(vulnerable.router + "/generate", json={"text": "still serving", "sampling_params":
                                                                 {"max_new_tokens": 3}}, timeout=30)
    assert response.status_code == 200 and response.json()["meta_info"]["kv_intact"] is True
    assert twin_state(vulnerable.prefill)["bootstrap_thread_alive"] is True
    assert vulnerable.log_text("prefill").count("Foreign traffic?") == 1  # only the first, unpatched death
