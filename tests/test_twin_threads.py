"""The twin runs the release's own threads: transfer workers on the prefill, the heartbeat on the decode.

Checked the way an operator would: ``py-spy dump`` of each scheduler process against the
threads read from the release's own source (``forensics.threads``).
"""

from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from packaging.version import Version
from twin_helpers import twin_state, wait_until

import forensics.twin as twin_api
from forensics.hosts import LocalHost
from forensics.threads import check_threads, dump_threads, expected_threads
from forensics.twin import processes

pytestmark = [pytest.mark.server]
TEST_SETTINGS = {"prefill_rate_tps": 4000.0, "decode_rate_tps": 50.0, "decode_log_interval": 10}
PY_SPY = str(Path(sys.executable).with_name("py-spy"))
WORKER = re.compile(r"^Thread-\d+ \(transfer_worker\)$")


@pytest.fixture(scope="module")
def twin(tmp_path_factory, leak_guard):
    deployment = twin_api.up("0.5.15", waiting_timeout=15, directory=tmp_path_factory.mktemp("twin-threads"),
                             **TEST_SETTINGS)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(deployment.pid(role))
    yield deployment
    deployment.down()


def _generate(twin, text: str) -> dict:
    response = httpx.post(twin.router + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 2}},
                          timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["meta_info"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_every_expected_thread_runs(twin, role):
    _generate(twin, "warm up")  # threads that start on first use would show now
    dump = dump_threads(LocalHost(), twin.scheduler_pid(role), py_spy=PY_SPY)
    check = check_threads(dump, expected_threads("0.5.15", "nixl"), role=role)
    assert check.ok, (check.findings, check.frame.to_string())
    found = dict(zip(check.frame["logical_name"], check.frame["found"], strict=True))
    assert found == ({"transfer_worker": 4, "bootstrap": 1} if role == "prefill"
                     else {"heartbeat": 1, "decode_staging": 0})


@pytest.mark.timeout(120)
def test_transfer_workers_are_the_releases(twin):
    pid = twin.scheduler_pid("prefill")
    dump = dump_threads(LocalHost(), pid, py_spy=PY_SPY)
    conn_py = str(twin.nixl_conn())
    workers = [t for t in dump.raw[pid] if WORKER.match(t.get("thread_name") or "")]
    assert len(workers) == 4, [t.get("thread_name") for t in dump.raw[pid]]
    for thread in workers:
        # Blocked in the release's FastQueue.get, called from the release's transfer_worker in the twin's copy.
        frames = [(f["name"], f["filename"]) for f in thread["frames"]]
        assert ("NixlKVManager.transfer_worker", conn_py) in frames, frames
        assert any(name == "FastQueue.get" and path.endswith("disaggregation/common/utils.py")
                   for name, path in frames), frames
    assert not [t for t in dump.raw[pid] if (t.get("thread_name") or "").startswith("transfer_worker_")]
    state = twin_state(twin.prefill)
    assert state["transfers_in"] == "release transfer_worker threads"
    assert [w["alive"] for w in state["transfer_workers"]] == [True] * 4


@pytest.mark.timeout(120)
def test_kv_arrives_intact_through_the_release_workers(twin):
    before = twin_state(twin.decode)["counters"]
    transferred = twin_state(twin.prefill)["counters"]["transferred"]
    prompts = [f"request {i} " * (2 + 12 * i) for i in range(12)]  # 1 to 24 pages of 4 KiB, 2,200 tokens
    with ThreadPoolExecutor(12) as pool:
        metas = list(pool.map(lambda text: _generate(twin, text), prompts))
    assert all(meta["kv_intact"] is True for meta in metas), metas
    after = twin_state(twin.decode)["counters"]
    assert after["kv_intact"] - before["kv_intact"] == 12 and after["kv_mismatch"] == before["kv_mismatch"]
    assert twin_state(twin.prefill)["counters"]["transferred"] - transferred == 12
    state = twin_state(twin.prefill)
    assert state["inflight_queue"] == 0 and state["free_kv_slots"] > 0


@pytest.mark.timeout(150)
def test_decode_heartbeat_notices_a_stopped_prefill(twin, leak_guard):
    _generate(twin, "the decode knows this prefill")
    bootstrap_addr = twin.bootstrap.removeprefix("http://")
    assert bootstrap_addr in twin_state(twin.decode)["known_prefills"]
    log_before = len(twin.log_text("decode"))
    processes.stop(twin.directory, "prefill")
    lost = f"Lost connection with prefill instance (bootstrap_addr: {bootstrap_addr}), "
    # SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL (5 s) x HEARTBEAT_MAX_FAILURE (2), plus one interval of phase.
    wait_until(lambda: lost in twin.log_text("decode")[log_before:], 30, "the release's heartbeat to give up")
    log = twin.log_text("decode")[log_before:]
    assert re.search(rf"^\[[^\]]+\] Attempting to reconnect to {re.escape(bootstrap_addr)}\.\.\.$", log, re.M), log
    assert re.search(rf"^\[[^\]]+\] {re.escape(lost)}\d+ requests affected$", log, re.M), log
    assert bootstrap_addr not in twin_state(twin.decode)["known_prefills"]  # the release's _handle_node_failure
    twin.restart("prefill")
    leak_guard.allow(twin.pid("prefill"))
    meta = _generate(twin, "served again after the restart")
    assert meta["kv_intact"] is True and meta["completion_tokens"] == 2
    log = twin.log_text("decode")[log_before:]
    assert "twin: the connection to prefill rank" not in log  # the heartbeat noticed, not the twin's fallback
    assert twin_state(twin.prefill)["frames_consumed"] == 2  # registered again with the new loop, then the room


@pytest.mark.timeout(150)
@pytest.mark.parametrize("release", ["0.5.16", "0.5.17", "0.5.20", "0.5.23"])
def test_thread_check_ok_on_other_releases(tmp_path, release):
    """0.5.16 and 0.5.17 (the same threads as 0.5.15); 0.5.20 (the decode listener, started
    unconditionally from 0.5.20: KV_STATUS, STAGING_REQ, ABORT_ACK); 0.5.23 (named HeartbeatChecker,
    the listener, workers with an index). Each serves a request first, then py-spy shows what the
    release's own source starts, the listener blocked in the release's loop on the decode's socket."""
    deployment = twin_api.up(release, directory=tmp_path, **TEST_SETTINGS)
    try:
        assert _generate(deployment, f"threads of {release}")["kv_intact"] is True
        listener = Version(release) >= Version("0.5.20")
        expected = expected_threads(release, "nixl")
        for role in ("prefill", "decode"):
            dump = dump_threads(LocalHost(), deployment.scheduler_pid(role), py_spy=PY_SPY)
            check = check_threads(dump, expected, role=role)
            assert check.ok, (release, role, check.findings, check.frame.to_string())
            assert int(check.frame["found"].sum()) == (5 if role == "prefill" else (2 if listener else 1))
        pid = deployment.scheduler_pid("decode")
        dump = dump_threads(LocalHost(), pid, py_spy=PY_SPY)
        listeners = [t for t in dump.raw[pid] if (t.get("thread_name") or "").endswith("(decode_listener_thread)")]
        assert len(listeners) == (1 if listener else 0), [t.get("thread_name") for t in dump.raw[pid]]
        for thread in listeners:
            frames = [(f["name"], f["filename"]) for f in thread["frames"]]
            assert any(name.endswith("decode_listener_thread") and path == str(deployment.nixl_conn())
                       for name, path in frames), frames
        state = twin_state(deployment.decode)
        assert [t["alive"] for t in state["release_threads"]] == [True] * (2 if listener else 1)
    finally:
        deployment.down()
