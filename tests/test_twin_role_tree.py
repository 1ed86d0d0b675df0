"""A role's sglang process tree (forensics.twin.role_tree) on its own: a front that hands every
connection to its forked scheduler, and takes the tree down the way sglang does when a child dies.

Each test starts the tree in a fresh interpreter (a small aiohttp app in the scheduler's place)
and drives it over real sockets; the crash lines it writes are read back by ``forensics logs``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest
from twin_helpers import wait_until

pytestmark = [pytest.mark.server, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[1]

TREE = textwrap.dedent("""
    import asyncio, os, sys
    from pathlib import Path
    from aiohttp import web
    from forensics.twin import httpserver, logformat, role_tree
    from forensics.twin.processes import LISTEN_FDS_ENV, bind_listener, inherited_listener

    directory, fail = Path(sys.argv[1]), sys.argv[2] == "fail"
    logformat.configure(level="info", version="0.5.15", disaggregation_debug=False)
    bound = bind_listener("127.0.0.1", 0)  # as the launcher passes it: an inherited descriptor
    port = bound.getsockname()[1]
    os.set_inheritable(bound.fileno(), True)
    os.environ[LISTEN_FDS_ENV] = f"{port}:{bound.detach()}"
    front = role_tree.RoleFront("prefill", directory)
    handoff = front.fork_scheduler()
    if handoff is not None:  # the scheduler
        if fail:
            raise RuntimeError("the scheduler could not start")

        async def who(request):
            peer = request.transport.get_extra_info("peername")
            return web.json_response({"pid": os.getpid(), "peer_port": peer[1]})

        async def hold(request):
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                (directory / "disconnect-seen").write_text("1")
                raise
            return web.Response()

        app = web.Application()
        app.router.add_get("/who", who)
        app.router.add_get("/hold", hold)
        httpserver.serve(app, "127.0.0.1", 0, handoff=handoff)
    front.fork_detokenizer()
    (directory / "port").write_text(str(port))
    front.serve(inherited_listener(port))
""")


class Tree:
    def __init__(self, directory: Path, fail: bool = False) -> None:
        self.directory = directory
        self.log = directory / "prefill.log"
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", TREE, str(directory), "fail" if fail else "ok"],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    @property
    def url(self) -> str:
        wait_until(lambda: (self.directory / "port").is_file(), 60, "the front to listen")
        return f"http://127.0.0.1:{(self.directory / 'port').read_text()}"

    def scheduler_pid(self) -> int:
        return int((self.directory / "prefill.scheduler.pid").read_text())

    def members(self) -> list[int]:
        try:
            return [child.pid for child in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            return []

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


@pytest.fixture
def tree(tmp_path):
    started = Tree(tmp_path)
    yield started
    started.close()


def _titles(pids: list[int]) -> list[str]:
    titles = []
    for pid in pids:
        try:
            titles.append(" ".join(psutil.Process(pid).cmdline()))
        except psutil.Error:
            pass
    return titles


def test_the_scheduler_serves_each_connection_with_the_clients_own_address(tree):
    with httpx.Client(timeout=60) as client:
        answer = client.get(tree.url + "/who").json()
        local_port = None
        for conn in psutil.Process().net_connections(kind="tcp"):
            if conn.raddr and conn.raddr.port == int(tree.url.rsplit(":", 1)[1]):
                local_port = conn.laddr.port
    assert answer["pid"] == tree.scheduler_pid() != tree.proc.pid
    assert answer["peer_port"] == local_port  # the scheduler sees the client, not a proxy
    titles = _titles(tree.members())
    assert any(t.startswith("sglang::scheduler") for t in titles) and any(
        t.startswith("sglang::detokenizer") for t in titles), titles
    assert any("multiprocessing.resource_tracker" in t for t in titles), titles
    # The listening socket is the front's alone: a child holding a copy would keep the port.
    listening = {c.pid for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
                 and c.laddr.port == int(tree.url.rsplit(":", 1)[1])}
    assert listening == {tree.proc.pid}


def test_a_client_that_leaves_is_seen_by_the_scheduler_at_once(tree):
    url = tree.url
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.5)  # the request reaches its handler (the check below waits on the outcome)
    wait_until(lambda: (tree.directory / "disconnect-seen").is_file(), 30, "the scheduler to see the disconnect")


def test_a_killed_scheduler_takes_the_tree_down_with_sglangs_lines(tree):
    httpx.get(tree.url + "/who", timeout=60)
    members = tree.members()
    pid = tree.scheduler_pid()
    os.kill(pid, signal.SIGKILL)
    assert tree.proc.wait(60) == 1
    wait_until(lambda: not [p for p in members if psutil.pid_exists(p) and
                            psutil.Process(p).status() != psutil.STATUS_ZOMBIE], 30, "the tree to go")
    log = tree.log.read_text()
    assert f"Subprocess scheduler_0 (pid={pid}) crashed with exit code -9. Triggering SIGQUIT for cleanup..." in log
    assert "SIGQUIT received. signum=3, frame=<frame at " in log
    assert "It usually means one child failed." in log
    # sglang's own lines, so the readers take them as the crash they are.
    done = subprocess.run([sys.executable, "-m", "forensics", "logs", str(tree.log), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    document = json.loads(done.stdout)
    assert document["status"] != "clean", document
    assert any("It usually means one child failed" in (event.get("text") or event.get("line_text") or
                                                       json.dumps(event)) for event in document["events"])


def test_sigterm_ends_the_front_and_its_children(tree):
    httpx.get(tree.url + "/who", timeout=60)
    members = tree.members()
    os.killpg(tree.proc.pid, signal.SIGTERM)  # as twin down signals a role: its process group
    assert tree.proc.wait(60) == 0
    wait_until(lambda: not [p for p in members if psutil.pid_exists(p) and
                            psutil.Process(p).status() != psutil.STATUS_ZOMBIE], 30, "the children to go")
    assert "crashed with exit code" not in tree.log.read_text()  # a stop is not a crash


def test_a_scheduler_that_dies_starting_is_named_and_the_front_leaves(tmp_path):
    failing = Tree(tmp_path, fail=True)
    try:
        assert failing.proc.wait(60) == 1
        log = failing.log.read_text()
        assert "RuntimeError: the scheduler could not start" in log
        assert "Rank 0 scheduler is dead. Please check if there are relevant logs." in log
        assert "exit code 1" in log
    finally:
        failing.close()
