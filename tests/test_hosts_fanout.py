"""Fan-out: one slow or dead host never blocks the rest; results per host, in order."""

from __future__ import annotations

import socket
import time

import psutil
import pytest
from sshd_helpers import free_port

from forensics.hosts import LocalHost, SSHHost, State, iter_many, run_many
from tests.process_helpers import sleep_marker

pytestmark = [pytest.mark.server, pytest.mark.timeout(240)]

HANG_TIMEOUT_S = 6.0
CONNECT_TIMEOUT_S = 8.0


def test_good_host_arrives_while_dead_and_hanging_ones_time_out(sshd):
    marker = sleep_marker()
    # A listener that never answers: TCP connects, the SSH banner never comes.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        hosts = [
            SSHHost("127.0.0.1", **{**sshd.host_args(), "port": free_port()}, connect_timeout=CONNECT_TIMEOUT_S, name="dead"),
            SSHHost("127.0.0.1", **{**sshd.host_args(), "port": silent.getsockname()[1]},
                    connect_timeout=CONNECT_TIMEOUT_S, name="silent"),
            SSHHost("127.0.0.1", **sshd.host_args(), connect_timeout=CONNECT_TIMEOUT_S, name="good"),
        ]
        hosts.append(SSHHost("127.0.0.1", **sshd.host_args(), connect_timeout=CONNECT_TIMEOUT_S, name="hang"))
        argvs = {"good": ["echo", "fine"]}  # every other host gets the hanging command
        start = time.monotonic()
        arrivals: dict[str, float] = {}
        results = {}
        for i, r in iter_many(hosts, lambda h: argvs.get(h.name, ["sleep", marker]), timeout=HANG_TIMEOUT_S):
            arrivals[hosts[i].name] = time.monotonic() - start
            results[hosts[i].name] = r
        total = time.monotonic() - start
    finally:
        silent.close()
        for h in hosts:
            h.close()

    assert results["good"].state is State.OK and results["good"].stdout == b"fine\n"
    assert arrivals["good"] < min(arrivals["silent"], arrivals["hang"])
    assert results["dead"].state is State.DISCONNECTED and "cannot reach" in results["dead"].error
    assert results["silent"].state is State.DISCONNECTED
    assert results["hang"].state is State.TIMED_OUT
    # Each within its own deadline (connect, or command + kill-after + grace), concurrently, not summed.
    assert arrivals["silent"] < CONNECT_TIMEOUT_S * 3 + 10
    assert arrivals["hang"] < HANG_TIMEOUT_S + 2 + 5 + 10
    assert total < CONNECT_TIMEOUT_S * 3 + HANG_TIMEOUT_S + 20
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    _, alive = psutil.wait_procs(left, timeout=20)
    assert not alive, "the hanging command outlived its deadline"


def test_run_many_keeps_host_order_and_turns_exceptions_into_error_results(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    hosts = [
        LocalHost(name="local-a"),
        SSHHost("127.0.0.1", **{**sshd.host_args(), "known_hosts": str(empty)}, name="unknown-key"),
        SSHHost("127.0.0.1", **sshd.host_args(), name="ssh-b"),
        LocalHost(name="local-c"),
    ]
    try:
        results = run_many(hosts, ["echo", "x"], timeout=60)
    finally:
        for h in hosts:
            h.close()
    assert [r.host for r in results] == ["local-a", "unknown-key", "ssh-b", "local-c"]
    assert [r.state for r in results] == [State.OK, State.ERROR, State.OK, State.OK]
    assert "UnknownHostKey" in results[1].error and "SHA256:" in results[1].error
