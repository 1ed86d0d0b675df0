"""The Mooncake twin survives the killed client that wedges the NIXL twin (sglang 0.5.14).

One test, both twins, same release, same kill: a streaming client dies while its KV is still
pending, so the decode's own receiver sends ``[b"ABORT", room, ip, port]`` to the prefill.
NIXL 0.5.14's bootstrap loop has no ABORT case and its thread dies ("Foreign traffic?");
Mooncake 0.5.14's loop marks the room Failed, PUSHes ``ABORT_ACK`` back, and keeps serving:
the next request's KV pages cross by the real transfer engine, intact.
"""

from __future__ import annotations

import httpx
import pytest
from twin_helpers import kill_client_during_transfer_wait, twin_state, wait_until

import forensics.twin as twin_api
from forensics.sandbox.mooncake_engine import engine_import_problem

pytestmark = [pytest.mark.server]
RELEASE = "0.5.14"
# A slow prefill (400 tokens/s: 7.5 s for the 3000-token prompt) keeps the killed client's room in
# the decode's transfer wait long enough for its AbortReq (2 s after the disconnect) to land there.
SETTINGS = {"prefill_rate_tps": 400.0, "decode_rate_tps": 50.0, "decode_log_interval": 10}
ENGINE_PROBLEM = engine_import_problem()


def _bootstrap_alive(twin) -> bool:
    return twin_state(twin.prefill)["bootstrap_thread_alive"] is True


def _kill_until(twin, done, what: str) -> None:
    """Kill a client during the transfer wait until ``done()``: on a loaded machine a kill can land
    outside that wait (then no ABORT is sent), so try up to three times."""
    for _ in range(3):
        try:
            kill_client_during_transfer_wait(twin)
            wait_until(done, 30, what)
            return
        except AssertionError:
            continue
    assert done(), f"three killed clients: still not {what}"


def _up(backend: str, tmp_path, leak_guard, **extra):
    twin = twin_api.up(RELEASE, backend=backend, waiting_timeout=15, directory=tmp_path / backend,
                       **SETTINGS, **extra)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(twin.pid(role))
    return twin


@pytest.mark.skipif(ENGINE_PROBLEM is not None, reason=ENGINE_PROBLEM or "")
def test_killed_client_wedges_nixl_twin_but_mooncake_twin_stays_live(tmp_path, leak_guard):
    # NIXL 0.5.14: the ABORT frame kills the bootstrap thread; the process and /health stay up.
    nixl = _up("nixl", tmp_path, leak_guard)
    try:
        assert nixl.inventory.backend == "nixl"
        _kill_until(nixl, lambda: not _bootstrap_alive(nixl), "the NIXL prefill's bootstrap thread dead")
        assert "Foreign traffic?" in nixl.log_text("prefill")
        assert nixl.status()["roles"]["prefill"]["alive"], "the wedged prefill process stays up"
    finally:
        nixl.down()

    # Mooncake 0.5.14, same release, same kill. Debug logging shows the release's own ABORT lines.
    mooncake = _up("mooncake", tmp_path, leak_guard, log_level="debug")
    try:
        assert mooncake.inventory.backend == "mooncake"
        assert mooncake.inventory.name == f"twin-{RELEASE}-mooncake"
        prefill_state = twin_state(mooncake.prefill)
        assert prefill_state["nixl_agent"] == "mooncake transfer engine (TCP)"
        assert len(prefill_state["transfer_workers"]) >= 1  # the release's own transfer_worker threads

        _kill_until(mooncake, lambda: "marked as Failed" in mooncake.log_text("prefill"),
                    "the Mooncake prefill to mark the aborted room Failed")
        prefill_log = mooncake.log_text("prefill")
        aborted = [line for line in prefill_log.splitlines() if "Received abort notification for room" in line]
        room = int(aborted[-1].split("for room ")[1].split(",")[0])  # exact: rooms are 63-bit ints
        assert 0 <= room < 2**63
        assert f"Sent ABORT_ACK for room {room}" in prefill_log
        wait_until(lambda: f"Received ABORT_ACK for room {room}" in mooncake.log_text("decode"), 30,
                   "the decode's decode_thread to read ABORT_ACK")
        assert "Foreign traffic?" not in prefill_log
        assert _bootstrap_alive(mooncake), "Mooncake's bootstrap thread survives the ABORT"
        assert all(t["alive"] for t in twin_state(mooncake.prefill)["transfer_workers"])

        # A new request completes: bootstrap, transfer by the real engine, pages intact. (A short
        # prompt: it queues behind the killed client's 7.5 s prefill batch, within the 15 s timeout.)
        response = httpx.post(mooncake.router + "/generate", timeout=120,
                              json={"input_ids": list(range(400)), "sampling_params": {"max_new_tokens": 2}})
        assert response.status_code == 200, response.text
        meta = response.json()["meta_info"]
        assert meta["kv_intact"] is True and meta["kv_bytes"] == 400 * 256
        assert mooncake.status().healthy
    finally:
        mooncake.down()


# The families of releases before 0.5.10, where the twin's Mooncake path differs:
# * 0.5.1 (to 0.5.2): utils.py (a module, not a package), a prefill that registers with the
#   bootstrap server and draws its rank port inside the replayed __init__ / start thread;
# * 0.5.3 to 0.5.5.post1: utils/common.py; start_*_thread still binds the socket itself;
# * 0.5.6 to 0.5.8.post1: the wrapper in disaggregation/mooncake/transfer_engine.py, receiver init();
# * 0.5.9: the wrapper moved to distributed/, session id still from maybe_wrap_ipv6_address.
# CI runs 0.5.1 and 0.5.6 (plus the later ranges); the other old families run in the slow set.
OLD_RELEASES = [("0.5.1", "rdma"), pytest.param("0.5.3", "rdma", marks=pytest.mark.slow), ("0.5.6", "rdma"),
                pytest.param("0.5.8.post1", "rdma", marks=pytest.mark.slow),
                pytest.param("0.5.9", "rdma", marks=pytest.mark.slow)]


@pytest.mark.timeout(180)
@pytest.mark.skipif(ENGINE_PROBLEM is not None, reason=ENGINE_PROBLEM or "")
@pytest.mark.parametrize(("release", "protocol"),
                         [*OLD_RELEASES, ("0.5.12", "rdma"), ("0.5.14", "tcp"), ("0.5.23", "tcp")])
def test_mooncake_twin_moves_kv_over_tcp_however_the_release_asks(release, protocol, tmp_path, leak_guard):
    """Up to 0.5.12 the release hard-codes "rdma" (the twin's MC_FORCE_TCP=1 makes the engine use TCP);
    from 0.5.13 it reads MOONCAKE_PROTOCOL, which the twin sets to tcp. Either way the pages arrive
    intact, moved by the release's own MooncakeTransferEngine (before 0.5.9 the older wrapper file)."""
    twin = twin_api.up(release, backend="mooncake", waiting_timeout=15, directory=tmp_path / release)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(twin.pid(role))
    try:
        response = httpx.post(twin.router + "/generate", timeout=120,
                              json={"input_ids": list(range(4096)), "sampling_params": {"max_new_tokens": 1}})
        assert response.status_code == 200, response.text
        meta = response.json()["meta_info"]
        assert meta["kv_intact"] is True and meta["kv_bytes"] == 1 << 20
        assert 0 <= meta["bootstrap_room"] < 2**63 and isinstance(meta["bootstrap_room"], int)
        for role in ("prefill", "decode"):
            log = twin.log_text(role)
            assert f"Using default malloc/free for protocol: {protocol}" in log
            assert "TcpTransport: listen on port" in log
            if protocol == "rdma":
                assert "MC_FORCE_TCP is set, using TCP transport only" in log
            assert "sandbox stub" not in log  # no stubbed helper in a session id or an endpoint
        assert twin_state(twin.prefill)["bootstrap_thread_alive"] is True
    finally:
        twin.down()
