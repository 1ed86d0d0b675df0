"""The capture reads a role's whole process tree from the process serving its URL, whichever of
its processes the target names (an inventory's pid file names sglang's scheduler)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from forensics.fidelity.capture import CaptureError, RoleTarget

SERVER = textwrap.dedent("""
    import socket, subprocess, sys
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    print(listener.getsockname()[1], child.pid, flush=True)
    sys.stdin.read()
    child.kill()
""")


@pytest.fixture
def server():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port, child = (int(x) for x in proc.stdout.readline().split())
        yield proc.pid, child, port
    finally:
        proc.kill()
        proc.wait(30)


def test_a_pid_of_a_child_climbs_to_the_process_listening_on_the_url(server):
    leader, child, port = server
    found = RoleTarget("prefill", f"http://127.0.0.1:{port}", pid=child).leader()
    assert found.pid == leader
    assert child in {p.pid for p in found.children(recursive=True)}


def test_the_listener_itself_and_no_pid_find_the_same_leader(server):
    leader, _child, port = server
    url = f"http://127.0.0.1:{port}"
    assert RoleTarget("prefill", url, pid=leader).leader().pid == leader
    assert RoleTarget("prefill", url).leader().pid == leader


def test_a_pid_whose_lineage_does_not_listen_is_taken_as_given(server):
    _leader, child, _port = server
    assert RoleTarget("prefill", "http://127.0.0.1:9", pid=child).leader().pid == child


def test_a_gone_pid_is_a_capture_error_naming_the_role():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(gone.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(CaptureError, match="decode: pid"):
        RoleTarget("decode", "http://127.0.0.1:9", pid=gone.pid).leader()
