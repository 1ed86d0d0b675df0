"""Suite-wide rules: nothing a test starts may outlive it, live tests need an inventory.

Session fixtures that legitimately keep a server for many tests (an sshd, a wedged
twin) register its pids with ``leak_guard.allow(pid)``; anything else a test leaves
running, a child process or a listening socket, fails that test with its name.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter

import psutil
import pytest

LIVE_INVENTORY_ENV = "PD_FORENSICS_LIVE_INVENTORY"

# The fast lane (``./run test fast``, i.e. ``pytest --fast-lane``): the inner loop, under 3
# minutes on 2 cores. It leaves out what starts a server (sshd, prometheus, a twin, a sandbox
# engine, the real engine) and the thorough variations (every kill point, long fuzz runs), and
# runs a test written once per release on the release the incident is about and the first fixed
# one only; the full suite (CI) runs every release.
FAST_LANE_SKIPS = ("slow", "live", "server", "engine", "thorough")
FAST_LANE_RELEASES = {"0.5.15", "0.5.16"}
RELEASE_IN_ID = re.compile(r"(?<![\w.])\d+\.\d+\.\d+(?:\.post\d+)?(?![\w.])")


def pytest_addoption(parser):
    parser.addoption("--fast-lane", action="store_true",
                     help="the inner loop: no server, one release per per-release test (see tests/conftest.py)")


def _outside_fast_lane(item) -> bool:
    if any(mark in item.keywords for mark in FAST_LANE_SKIPS):
        return True
    callspec = getattr(item, "callspec", None)
    releases = set(RELEASE_IN_ID.findall(callspec.id)) if callspec is not None else set()
    return bool(releases - FAST_LANE_RELEASES)


class LeakGuard:
    def __init__(self) -> None:
        self.allowed_pids: set[int] = set()

    def allow(self, pid: int) -> None:
        """``pid`` and its descendants; for a process in a session of its own (a twin or engine
        role, started with start_new_session), the session leader's whole tree: a scheduler's pid
        allows its front, the detokenizer and the resource tracker beside it."""
        self.allowed_pids.add(pid)
        heads = [pid]
        try:
            session = os.getsid(pid)
            if session not in (os.getsid(0), pid):
                heads.append(session)
        except OSError:
            pass
        for head in heads:
            try:
                self.allowed_pids.add(head)
                for child in psutil.Process(head).children(recursive=True):
                    self.allowed_pids.add(child.pid)
            except psutil.Error:
                pass

    def children(self) -> set[int]:
        try:
            return {p.pid for p in psutil.Process().children(recursive=True)}
        except psutil.Error:
            return set()

    def listening(self, pids: set[int]) -> set[tuple[int, str, int]]:
        found = set()
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.pid in pids and conn.laddr:
                found.add((conn.pid, conn.laddr.ip, conn.laddr.port))
        return found

    def describe(self, pid: int) -> str:
        try:
            proc = psutil.Process(pid)
            return f"pid {pid} ({' '.join(proc.cmdline())[:120]})"
        except psutil.Error:
            return f"pid {pid}"


_guard = LeakGuard()


def _alive(pid: int) -> bool:
    """Running and not a zombie; a process that ends while we look is not a leak."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(scope="session")
def leak_guard() -> LeakGuard:
    return _guard


@pytest.fixture(autouse=True)
def _no_leaked_processes_or_ports(request):
    before_children = _guard.children()
    before_listening = _guard.listening(before_children | {os.getpid()})
    yield
    deadline = time.monotonic() + 10.0
    while True:
        # Reap exited children so they do not count as leaks.
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        leaked = _guard.children() - before_children - _guard.allowed_pids
        leaked = {pid for pid in leaked if _alive(pid)}
        tree = (_guard.children() | {os.getpid()}) - _guard.allowed_pids
        sockets = {s for s in _guard.listening(tree) if s not in before_listening}
        if not leaked and not sockets:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    problems = [f"process outlived the test: {_guard.describe(pid)}" for pid in sorted(leaked)]
    problems += [f"listening socket outlived the test: {ip}:{port} (pid {pid})" for pid, ip, port in sorted(sockets)]
    for pid in leaked:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    pytest.fail("; ".join(problems), pytrace=False)


def pytest_collection_modifyitems(config, items):
    if config.getoption("fast_lane"):
        outside = [_outside_fast_lane(item) for item in items]
        left_out = [item for item, out in zip(items, outside, strict=True) if out]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item, out in zip(items, outside, strict=True) if not out]
    # pytest-xdist hands out whole files (--dist loadfile) in this order (--no-loadscope-reorder).
    # The real-engine modules are the longest (a deployment each, minutes): they go first, so that
    # a worker never ends the run on one of them; then, as xdist's own reorder would, the files
    # with the most tests (a rough stand-in for the longest).
    per_file = Counter(item.path for item in items)
    items.sort(key=lambda item: (0 if "engine" in item.keywords else 1, -per_file[item.path]))
    if os.environ.get(LIVE_INVENTORY_ENV):
        return
    skip_live = pytest.mark.skip(reason=f"live test: set {LIVE_INVENTORY_ENV} to a real deployment's inventory")
    for item in items:
        if "live" in item.keywords:
            item.add_marker(skip_live)


@pytest.fixture(scope="session")
def sshd(leak_guard):
    """A real OpenSSH server on 127.0.0.1 (``tests/sshd_helpers.py``), shared by the session."""
    from sshd_helpers import skip_reason, start_sshd

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    server = start_sshd()
    leak_guard.allow(server.proc.pid)
    yield server
    server.stop()
