"""A process's identity survives the wall clock moving: start ticks compared exactly.

After this machine's VM was paused and resumed, psutil's ``create_time`` of every running process
had moved by seconds (it counts from ``btime``, the wall clock minus the uptime), and ``twin down``
called our own running real-engine deployment "not a process this twin started". The records now
carry the start in clock ticks since boot, which no clock step moves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import psutil
import pytest

from forensics.engine import records
from forensics.process_start import same_start, start_ticks
from forensics.twin import processes


@pytest.fixture
def odd_named_sleeper(tmp_path):
    """A real process whose command name holds ') ', which /proc/PID/stat puts in parentheses."""
    program = tmp_path / "odd) name"
    shutil.copy(shutil.which("sleep"), program)
    proc = subprocess.Popen([str(program), "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_start_ticks_agree_with_psutil_for_a_process_named_with_a_parenthesis(odd_named_sleeper):
    proc = psutil.Process(odd_named_sleeper.pid)
    assert proc.name().startswith("odd) name")
    ticks = start_ticks(proc.pid)
    hertz = os.sysconf("SC_CLK_TCK")
    assert isinstance(ticks, int)
    assert abs(ticks / hertz - (proc.create_time() - psutil.boot_time())) < 2 / hertz
    assert start_ticks(proc.pid) == ticks  # it never moves
    assert start_ticks(2 ** 22 + 12345) is None  # beyond pid_max: no such process


def test_a_record_with_start_ticks_ignores_a_moved_wall_clock_and_an_old_record_does_not(odd_named_sleeper):
    proc = psutil.Process(odd_named_sleeper.pid)
    created, ticks = proc.create_time(), start_ticks(proc.pid)
    assert same_start(proc, {"create_time": created - 5, "start_ticks": ticks})  # the clock moved by 5 s
    assert not same_start(proc, {"create_time": created, "start_ticks": ticks + 1})  # another process
    assert same_start(proc, {"create_time": created})  # a record from before start ticks
    assert not same_start(proc, {"create_time": created - 5})
    assert not same_start(proc, {})
    assert not same_start(proc, {"create_time": created - 5, "start_ticks": True})  # not ticks: create_time decides


def test_the_twin_and_the_engine_still_know_their_process_after_the_clock_moved(tmp_path, odd_named_sleeper):
    pid = odd_named_sleeper.pid
    argv = psutil.Process(pid).cmdline()
    identity = processes.record(tmp_path, "prefill", odd_named_sleeper, argv)
    assert identity["start_ticks"] == start_ticks(pid)
    identity["create_time"] -= 7  # what a paused and resumed VM does to every create_time
    processes.identity_file(tmp_path, "prefill").write_text(json.dumps(identity))
    assert processes.ours(tmp_path, "prefill").pid == pid
    engine = tmp_path / "engine"
    engine.mkdir()
    records.write_leader(engine, "decode", pid, psutil.Process(pid).create_time() - 7, argv)
    assert records.leader(engine, "decode").pid == pid
    assert [p.pid for p in records.processes(engine, "decode")] == [pid]
    stale = records.read_record(engine, "decode")
    stale["start_ticks"] += 1  # a reused pid: same number, another start
    records.record_file(engine, "decode").write_text(json.dumps(stale))
    assert records.leader(engine, "decode") is None and records.processes(engine, "decode") == []


def test_a_process_running_from_a_deployment_clone_keeps_the_clone(tmp_path, monkeypatch):
    """What 'down' checks before it removes a real-engine clone: a program under the clone, running,
    even when no record proves it ours (it was never signalled), keeps the clone on disk."""
    from forensics.engine import clone

    monkeypatch.setenv("PD_FORENSICS_CACHE", str(tmp_path / "cache"))
    directory = tmp_path / "deployment"
    directory.mkdir()
    home = clone.deployment_cache(directory)
    program = home / "env" / "venv" / "bin" / "python"
    program.parent.mkdir(parents=True)
    shutil.copy(shutil.which("sleep"), program)
    assert clone.users(directory) == []
    proc = subprocess.Popen([str(program), "300"])
    try:
        assert clone.users(directory) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert clone.users(directory) == []
    assert clone.remove(directory) == home and not home.exists()
