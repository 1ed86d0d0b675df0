"""The engine sandbox runs Mooncake with the release's own MooncakeTransferEngine (TCP), where it can."""

from __future__ import annotations

import pytest

from forensics.sandbox import EngineSandbox
from forensics.sandbox.mooncake_engine import (
    engine_import_problem,
    engine_or_reason,
    transport_choice,
    wrapper_problem,
)
from forensics.sglang_source import fetch

ENGINE_PROBLEM = engine_import_problem()


@pytest.mark.server
@pytest.mark.timeout(120)
@pytest.mark.skipif(ENGINE_PROBLEM is not None, reason=ENGINE_PROBLEM or "")
def test_mooncake_sandbox_registers_with_the_real_engines_session_id():
    with EngineSandbox(fetch("0.5.14"), backend="mooncake") as sb:
        assert sb.info["agent"] == "mooncake transfer engine (TCP)" and sb.info["engine_note"] is None
        room = 2**63 - 7  # full-range room, exact
        sb.create_rooms([room])
        registration = sb.frames.registration()
        session = registration[3].decode()
        host, port = session.rsplit(":", 1)
        # The engine's own RPC endpoint (P2PHANDSHAKE), not the decode's ZMQ rank port.
        assert host == "127.0.0.1" and int(port) != int(registration[2])
        sb.send(registration)
        sb.send(sb.frames.transfer_info(room=room))
        assert sb.settle() == "consumed"
        assert sb.room_states() == {room: 2}  # WaitingForInput


@pytest.mark.timeout(180)
@pytest.mark.skipif(ENGINE_PROBLEM is not None, reason=ENGINE_PROBLEM or "")
# 0.5.1: the old wrapper file and sglang/srt/utils.py; 0.5.6: the old wrapper and utils/common.py;
# 0.5.9: the wrapper under distributed/, its session id still from maybe_wrap_ipv6_address.
@pytest.mark.server
@pytest.mark.parametrize("release", ["0.5.1", "0.5.6", "0.5.9"])
def test_old_releases_use_the_real_engine_with_a_real_session_id(release):
    with EngineSandbox(fetch(release), backend="mooncake") as sb:
        assert sb.info["agent"] == "mooncake transfer engine (TCP)" and sb.info["engine_note"] is None
        room = 2**63 - 7
        sb.create_rooms([room])
        registration = sb.frames.registration()
        host, port = registration[3].decode().rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) != int(registration[2])
        sb.send(registration)
        sb.send(sb.frames.transfer_info(room=room))
        assert sb.settle() == "consumed"
        assert sb.room_states() == {room: 2}  # WaitingForInput


def test_a_tree_without_the_wrapper_keeps_the_stand_in_and_says_why(tmp_path):
    (tmp_path / "sglang" / "srt" / "disaggregation" / "mooncake").mkdir(parents=True)
    engine, reason = engine_or_reason(tmp_path, "0.5.6")
    assert engine is None
    assert reason == ("the release has no MooncakeTransferEngine wrapper (neither "
                      "sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py nor "
                      "sglang/srt/disaggregation/mooncake/transfer_engine.py)")


def test_every_cached_wrapper_is_one_the_sandbox_can_load():
    for release in ("0.5.1", "0.5.5.post1", "0.5.8", "0.5.9", "0.5.10", "0.5.20"):
        assert wrapper_problem(fetch(release).root) is None, release


def test_tcp_choice_per_release_range():
    for release in ("0.5.1", "0.5.6", "0.5.9", "0.5.12"):
        assert transport_choice(release).startswith("protocol 'rdma' hard-coded by the release; MC_FORCE_TCP=1")
    assert transport_choice("0.5.13").startswith("MOONCAKE_PROTOCOL=tcp")
    assert transport_choice("0.5.23").startswith("MOONCAKE_PROTOCOL=tcp")
