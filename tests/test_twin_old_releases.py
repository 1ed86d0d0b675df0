"""Old releases on the twin: the release's own bootstrap server, its receivers, its failures answered.

Up to 0.5.9 the decode's receiver asks the prefill's bootstrap server in its ``__init__`` (each
release in its own query shape), so the twin serves those releases only because the prefill runs
the release's own ``CommonKVBootstrapServer``. A request the release's decode fails is answered
at once with the release's reason (never a silent hang), and the twin keeps serving.
"""

from __future__ import annotations

import time
import urllib.parse

import httpx
import pytest
from twin_helpers import twin_state

import forensics.twin as twin_api

pytestmark = [pytest.mark.server]
TEST_SETTINGS = {"prefill_rate_tps": 400.0, "decode_rate_tps": 50.0}


def _generate(url: str, timeout: float = 30.0, **extra) -> httpx.Response:
    body = {"input_ids": list(range(64)), "sampling_params": {"max_new_tokens": 4}, **extra}
    return httpx.post(url + "/generate", json=body, timeout=timeout)


@pytest.mark.timeout(120)
# CI runs one release per family (0.5.1's bootstrap query, 0.5.6's init() receiver, 0.5.10's
# send_metadata); the others run in the slow set (CI's 25-minute budget).
@pytest.mark.parametrize("release", ["0.5.1", pytest.param("0.5.2", marks=pytest.mark.slow),
                                     pytest.param("0.5.5.post3", marks=pytest.mark.slow), "0.5.6",
                                     pytest.param("0.5.9", marks=pytest.mark.slow), "0.5.10",
                                     pytest.param("0.5.11", marks=pytest.mark.slow)])
def test_old_release_serves_a_request_with_its_kv_intact(tmp_path, release):
    twin = twin_api.up(release, directory=tmp_path, **TEST_SETTINGS)
    try:
        response = _generate(twin.router)
        assert response.status_code == 200, response.text
        meta = response.json()["meta_info"]
        assert meta["kv_intact"] is True
        assert isinstance(meta["bootstrap_room"], int)
        # The bootstrap server is the release's own: /health is a route from 0.5.3 on only.
        health = httpx.get(twin.bootstrap + "/health", timeout=5)
        assert health.status_code == (404 if release in ("0.5.1", "0.5.2") else 200)
        assert twin_state(twin.prefill)["bootstrap_thread_alive"] is True
    finally:
        twin.down()


@pytest.mark.timeout(120)
def test_0_5_12_fails_the_request_within_the_waiting_timeout_with_its_own_reason(tmp_path):
    """sglang 0.5.12's NIXL decode waits for state data its prefill never sends (fixed in
    0.5.12.post1): the twin reproduces that, and the client hears the release's reason at the
    release's waiting timeout, not at its own."""
    waiting_timeout = 6.0
    twin = twin_api.up("0.5.12", waiting_timeout=waiting_timeout, directory=tmp_path, **TEST_SETTINGS)
    try:
        for _ in range(2):  # and the twin goes on answering
            started = time.monotonic()
            response = _generate(twin.router, timeout=waiting_timeout + 20)
            took = time.monotonic() - started
            assert response.status_code == 500
            message = response.json()["error"]["message"]
            assert message.startswith("Decode transfer failed for request rank=0")
            assert message.endswith("with exception NIXL KVReceiver Exception")
            assert waiting_timeout <= took < waiting_timeout + 5
        assert "Request " in twin.log_text("decode") and " waiting_timeout" in twin.log_text("decode")
        assert twin_state(twin.decode)["counters"]["transfer_failed"] == 2
    finally:
        twin.down()


@pytest.mark.timeout(120)
def test_a_receiver_that_raises_on_init_fails_only_its_request(tmp_path):
    """0.5.1's receiver unpacks the bootstrap server's parallel info unchecked: pointed at a port
    that answers /route with 404 (the prefill's HTTP port), its __init__ raises TypeError. The
    request gets that text at once; the next one is served."""
    twin = twin_api.up("0.5.1", directory=tmp_path, **TEST_SETTINGS)
    try:
        prefill = urllib.parse.urlparse(twin.prefill)
        started = time.monotonic()
        response = _generate(twin.decode, timeout=20, bootstrap_host=prefill.hostname,
                             bootstrap_port=prefill.port, bootstrap_room=2**63 - 1)
        assert time.monotonic() - started < 5
        assert response.status_code == 500
        message = response.json()["error"]["message"]
        assert "decode_req.req.bootstrap_room=9223372036854775807" in message
        assert message.endswith("with exception TypeError: cannot unpack non-iterable NoneType object")
        log = twin.log_text("decode")
        assert "Failed to get prefill parallel info: 404" in log
        assert "common/conn.py" in log and "in __init__" in log  # the release's own frame
        served = _generate(twin.router)
        assert served.status_code == 200 and served.json()["meta_info"]["kv_intact"] is True
    finally:
        twin.down()


@pytest.mark.timeout(120)
def test_a_prefill_that_cannot_be_looked_up_fails_the_request_after_sglang_s_15_tries(tmp_path):
    """From 0.5.10 the decode looks the prefill up itself (15 tries, 1 s apart), then aborts the
    waiting requests with the release's own abort(): the request is answered, not left waiting."""
    twin = twin_api.up("0.5.10", directory=tmp_path, **TEST_SETTINGS)
    try:
        prefill = urllib.parse.urlparse(twin.prefill)  # answers /route with 404: no bootstrap server there
        started = time.monotonic()
        response = _generate(twin.decode, timeout=40, bootstrap_host=prefill.hostname,
                             bootstrap_port=prefill.port, bootstrap_room=2**62 + 1)
        took = time.monotonic() - started
        assert response.status_code == 500 and 14 <= took < 30, (response.status_code, took)
        assert response.json()["error"]["message"].startswith("Decode handshake failed for request rank=0")
        assert (f"Could not fetch prefill parallel info from {prefill.hostname}:{prefill.port} after 15 attempts"
                in twin.log_text("decode"))
        served = _generate(twin.router)
        assert served.status_code == 200 and served.json()["meta_info"]["kv_intact"] is True
    finally:
        twin.down()
