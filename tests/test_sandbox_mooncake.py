"""The engine sandbox runs Mooncake with the release's own MooncakeTransferEngine (TCP), where it can."""

from __future__ import annotations

import pytest

from forensics.sandbox import EngineSandbox
from forensics.sandbox.mooncake_engine import engine_import_problem, transport_choice
from forensics.sglang_source import fetch

ENGINE_PROBLEM = engine_import_problem()


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


@pytest.mark.timeout(120)
def test_mooncake_sandbox_keeps_the_stand_in_where_the_release_cannot_use_the_engine():
    with EngineSandbox(fetch("0.5.9"), backend="mooncake") as sb:
        assert sb.info["agent"] == "none (mooncake session stand-in)"
        assert "session id" in sb.info["engine_note"] or "does not import" in sb.info["engine_note"]


def test_tcp_choice_per_release_range():
    assert transport_choice("0.5.12").startswith("protocol 'rdma' hard-coded by the release; MC_FORCE_TCP=1")
    assert transport_choice("0.5.13").startswith("MOONCAKE_PROTOCOL=tcp")
    assert transport_choice("0.5.23").startswith("MOONCAKE_PROTOCOL=tcp")
