"""Loopback means loopback: no socket of a twin (or of the engine sandbox's agents) faces the network.

Each twin process and every child of it is listed with psutil: every TCP and UDP socket it owns,
listening, bound or connected, over IPv4 and IPv6. Any local address outside 127.0.0.0/8 and ::1
fails (an IPv4-mapped ``::ffff:127.x`` on a dual-stack socket is 127.x). Before the fix, NIXL's UCX
listener sat on the machine's eth0 address and Mooncake's two listeners on 0.0.0.0 and ``::``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

import forensics
import forensics.twin as twin_api
from forensics.sandbox.mooncake_engine import engine_import_problem

pytestmark = [pytest.mark.server]
RELEASE = "0.5.14"
ENGINE_PROBLEM = engine_import_problem()
PACKAGE_ROOT = Path(forensics.__file__).resolve().parents[1]


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _sockets(pid: int) -> list[tuple[int, str, str, str, int]]:
    """(pid, type, status, local ip, local port) of every inet socket of ``pid`` and its children."""
    found = []
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        for conn in proc.net_connections(kind="inet"):
            if conn.laddr:
                found.append((proc.pid, conn.type.name, conn.status, conn.laddr.ip, conn.laddr.port))
    return found


def _check_twin(backend: str, tmp_path, leak_guard) -> None:
    twin = twin_api.up(RELEASE, backend=backend, waiting_timeout=15, directory=tmp_path / backend)
    try:
        for role in ("prefill", "decode", "router"):
            leak_guard.allow(twin.pid(role))
        # One request end to end, so every transfer path has opened what it opens.
        answer = httpx.post(twin.router + "/generate", timeout=120,
                            json={"input_ids": list(range(64)), "sampling_params": {"max_new_tokens": 2}})
        assert answer.status_code == 200, answer.text
        seen = {role: _sockets(twin.pid(role)) for role in ("prefill", "decode", "router")}
    finally:
        twin.down()
    facing = {role: [s for s in sockets if not _is_loopback(s[3])] for role, sockets in seen.items()}
    assert not any(facing.values()), f"{backend} twin sockets off loopback: {facing}"
    listeners = [s for sockets in seen.values() for s in sockets if s[2] == psutil.CONN_LISTEN]
    # The HTTP ports (router, prefill, bootstrap, decode) plus the engine's own: the check saw them.
    assert len(listeners) > 4, seen


def test_nixl_twin_binds_loopback_only(tmp_path, leak_guard):
    _check_twin("nixl", tmp_path, leak_guard)


@pytest.mark.skipif(ENGINE_PROBLEM is not None, reason=ENGINE_PROBLEM or "")
def test_mooncake_twin_binds_loopback_only(tmp_path, leak_guard):
    _check_twin("mooncake", tmp_path, leak_guard)


SANDBOX_AGENT = """
import json, os, sys, psutil
import nixl_cu12._api
sys.modules["nixl._api"] = nixl_cu12._api  # what the sandbox's import shim does
from forensics.sandbox.host_memory import make_agent
agent, kind = make_agent("prefill")
print(json.dumps({"kind": kind, "env": os.environ.get("UCX_NET_DEVICES"), "sockets": [
    [c.type.name, c.status, c.laddr.ip] for c in psutil.Process().net_connections(kind="inet") if c.laddr]}))
"""


def test_sandbox_nixl_agent_binds_loopback_only():
    # A fresh interpreter with no UCX_NET_DEVICES of its own, as the sandbox's child is.
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", SANDBOX_AGENT], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["kind"].startswith("nixl (real"), report
    facing = [s for s in report["sockets"] if not _is_loopback(s[2])]
    assert not facing, report
    assert report["env"] == "lo"


@pytest.mark.skipif(ENGINE_PROBLEM is not None, reason=ENGINE_PROBLEM or "")
def test_mooncake_is_never_redirected_off_loopback():
    from forensics.sandbox.loopback import confine_mooncake
    from forensics.sandbox.plt_hook import PltHookError

    with pytest.raises(PltHookError, match="kept on loopback; host '192.0.2.1'"):
        confine_mooncake("192.0.2.1")
