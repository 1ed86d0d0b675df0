"""NIXL agents built by the twin and the sandbox idle quietly and still move KV and notify.

The strict idle figure (three twin processes over 30 s) is a benchmark
(benchmarks/twin_control_path.py); here a child process with one agent must stay far
from the full core that sglang's own configuration holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from forensics.sandbox import quiet_nixl

pytest.importorskip("nixl_cu12._api", reason="NIXL is not installed here")

# A thread's demand for a core is its CPU time plus the time it waited runnable on the run
# queue (both in /proc/<pid>/task/<tid>/schedstat): a spinning progress thread demands the
# whole core however loaded the machine is, while its CPU time shrinks with the load. The
# watch reads demand, so it means the same on an idle laptop and on a CI runner with four
# pytest workers on two cores.
IDLE_CHILD = """
import json, os, sys, time
import nixl_cu12._api as api
from forensics.sandbox.quiet_nixl import quiet_agent

def demanded_ns():
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                on_cpu, waiting = stat.read().split()[:2]
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        total += int(on_cpu) + int(waiting)
    return total

agent = quiet_agent(api, "idle", api.nixl_agent_config(backends=["UCX"]))
demand0, wall0 = demanded_ns(), time.monotonic_ns()
time.sleep(2.0)
print(json.dumps({"core_demand": (demanded_ns() - demand0) / (time.monotonic_ns() - wall0)}))
"""


def _idle_share(delay: str) -> float:
    done = subprocess.run([sys.executable, "-c", IDLE_CHILD], capture_output=True, text=True, timeout=120,
                          env={**os.environ, quiet_nixl.DELAY_ENV: delay})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["core_demand"]


@pytest.mark.thorough  # watches a NIXL agent's core demand for seconds: CI
@pytest.mark.timeout(300)
def test_an_idle_agent_does_not_hold_a_core():
    quiet = _idle_share(str(quiet_nixl.PROGRESS_DELAY_US))
    busy = _idle_share("0")  # sglang's own configuration: the progress thread never sleeps
    assert quiet < 0.25, quiet
    assert busy > 0.8, busy  # the progress thread spins: the difference is the delay, not the machine


@pytest.mark.timeout(120)
def test_quiet_agents_still_write_and_notify():
    import time

    import nixl_cu12._api as api
    import numpy as np

    config = lambda: api.nixl_agent_config(backends=["UCX"])  # noqa: E731
    sender = quiet_nixl.quiet_agent(api, "prefill-side", config())
    receiver = quiet_nixl.quiet_agent(api, "decode-side", config())
    source = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)
    target = np.zeros(1 << 20, dtype=np.uint8)
    sender.register_memory([(source.ctypes.data, source.nbytes, 0, "")], "DRAM")
    receiver.register_memory([(target.ctypes.data, target.nbytes, 0, "")], "DRAM")
    sender.add_remote_agent(receiver.get_agent_metadata())
    receiver.add_remote_agent(sender.get_agent_metadata())
    local = sender.get_xfer_descs([(source.ctypes.data, source.nbytes, 0)], "DRAM")
    remote = sender.get_xfer_descs([(target.ctypes.data, target.nbytes, 0)], "DRAM")
    room = 7461092837465012345
    handle = sender.initialize_xfer("WRITE", local, remote, "decode-side", f"{room}_kv_0_1_0".encode())
    sender.transfer(handle)
    deadline = time.monotonic() + 60
    while sender.check_xfer_state(handle) != "DONE":
        assert time.monotonic() < deadline, "the WRITE never completed"
        time.sleep(0.001)
    notes: dict = {}
    while not notes.get("prefill-side"):
        assert time.monotonic() < deadline, "the notification never arrived"
        notes = receiver.get_new_notifs()
        time.sleep(0.001)
    sender.release_xfer_handle(handle)
    assert notes["prefill-side"] == [f"{room}_kv_0_1_0".encode()]
    assert (target == source).all()


def test_the_delay_setting_is_checked(monkeypatch):
    monkeypatch.setenv(quiet_nixl.DELAY_ENV, "soon")
    with pytest.raises(ValueError, match="soon"):
        quiet_nixl.progress_delay_us()
    monkeypatch.setenv(quiet_nixl.DELAY_ENV, "-5")
    with pytest.raises(ValueError, match="negative"):
        quiet_nixl.progress_delay_us()
    monkeypatch.setenv(quiet_nixl.DELAY_ENV, "0")
    assert quiet_nixl.progress_delay_us() == 0
    monkeypatch.delenv(quiet_nixl.DELAY_ENV)
    assert quiet_nixl.progress_delay_us() == quiet_nixl.PROGRESS_DELAY_US
