"""A probe open when its caller exits is handed to a keeper, never closed (docs/probes.md, rule 4).

The caller here is a real child interpreter that probes and exits with its probe still open;
the server is a real HTTP server that records any client that goes away before its answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from test_probes import server  # noqa: F401 - the fixture: an HTTP server that watches its clients
from twin_helpers import wait_until

from forensics.probes import handover, keeper

CALLER = textwrap.dedent("""
    import sys
    import forensics.probes as p
    target = (p.Target("router", "router", sys.argv[1], kinds=("liveness",)) if len(sys.argv) < 4 else
              p.Target("pair", "pd", sys.argv[1], 8998, decode_url=sys.argv[1]))
    results = p.probe_once([target], kinds=("liveness",), deadline_s=0.5, cap_s=float(sys.argv[2]))
    print(results.frame["outcome"].tolist(), flush=True)
""")


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A cache directory of its own, so the records of other tests and sessions stay apart."""
    monkeypatch.setenv("PD_FORENSICS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "open-probes"


def _exit_with_a_probe_open(url: str, cap_s: float, *pair: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CALLER, url, str(cap_s), *pair], capture_output=True, text=True,
                          timeout=120, env=os.environ.copy())


def _done(records_dir) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(records_dir.glob("done-*.json"))]


@pytest.mark.timeout(120)
def test_a_caller_that_exits_with_a_probe_open_hands_it_over_and_nothing_is_closed(server, records):  # noqa: F811
    server.blocked.add("/generate")
    ran = _exit_with_a_probe_open(server.url, 90)
    assert ran.returncode == 0, ran.stderr
    assert "['late']" in ran.stdout
    # The caller is gone; the server still has its client: nothing closed the connection.
    wait_until(lambda: server.open.get("/generate") == 1, 10, "the request reached the server")
    time.sleep(0.5)  # time for a closed connection to show (the old code's disconnect showed in 0.05 s)
    assert server.early_closes == []
    # It said which probe is open, and why it is not closed.
    assert "handed to keeper pid" in ran.stderr and "probe 1 (liveness, router, rid" in ran.stderr
    assert "wedges sglang 0.5.13-0.5.15.post1" in " ".join(ran.stderr.split())
    [record] = handover.held()
    assert record.alive and [p.state for p in record.probes] == ["held"]
    assert record.probes[0].rid.startswith("pd-forensics-probe-")
    assert oct((records / f"keeper-{record.pid}.json").stat().st_mode & 0o777) == "0o600"
    # The answer comes: the keeper reads it to the end, sees the server close, and finishes.
    server.release.set()
    wait_until(lambda: server.served.get("/generate") == 1, 30, "the server answered the held probe")
    wait_until(lambda: not handover.held() and _done(records), 30, "the keeper finished")
    [done] = handover.recently_finished()
    assert done.probes[0].state == "answered" and done.probes[0].status == 200
    assert server.early_closes == []
    assert "answered after" in done.probes[0].line()
    wait_until(lambda: keeper.start_ticks(done.pid) is None, 30, "the keeper process ended")


@pytest.mark.timeout(120)
def test_the_keeper_closes_only_at_the_probes_own_cap(server, records):  # noqa: F811
    server.blocked.add("/generate")
    started = time.time()
    ran = _exit_with_a_probe_open(server.url, 6)
    assert ran.returncode == 0, ran.stderr
    assert server.early_closes == []
    wait_until(lambda: server.early_closes, 60, "the keeper closed at the cap")
    [(_, after_arrival_s)] = server.early_closes
    assert after_arrival_s >= 5.0  # the cap counts from the send, not from the hand-over
    wait_until(lambda: _done(records), 30, "the keeper's record was finished")
    [done] = handover.recently_finished()
    assert done.probes[0].state == "unanswered"
    assert done.probes[0].ended_at - started >= 5.0


@pytest.mark.timeout(120)
def test_a_killed_keeper_is_reported_finished_and_a_stranger_with_its_pid_is_not_a_keeper(server, records):  # noqa: F811
    server.blocked.add("/generate")
    ran = _exit_with_a_probe_open(server.url, 90)
    assert ran.returncode == 0, ran.stderr
    [record] = handover.held()
    os.kill(record.pid, signal.SIGKILL)
    wait_until(lambda: not handover.held(), 30, "the killed keeper no longer counts as holding")
    [done] = _done(records)
    assert "gone" in done["ended_by"]
    # A record naming a live process that is not the keeper that wrote it (this test's own pid) is not alive.
    fake = records / f"keeper-{os.getpid()}.json"
    keeper.write_record(str(fake), {"pid": os.getpid(), "start_ticks": keeper.start_ticks() + 1,
                                    "started_at": time.time(), "probes": []})
    assert handover.held() == []
    server.release.set()


@pytest.mark.timeout(120)
def test_both_legs_of_a_pair_probe_are_held(server, records):  # noqa: F811
    server.blocked.add("/generate")
    ran = _exit_with_a_probe_open(server.url, 90, "pair")
    assert ran.returncode == 0, ran.stderr
    wait_until(lambda: server.open.get("/generate") == 2, 10, "both legs at the server")
    assert server.early_closes == []
    [record] = handover.held()
    assert sorted(p.leg for p in record.probes) == [0, 1] and {p.room for p in record.probes} != {None}
    assert max(p.room for p in record.probes) < 2**63  # the 63-bit room, exact through the record
    server.release.set()
    wait_until(lambda: server.served.get("/generate") == 2 and not handover.held(), 30, "both legs answered")
    [done] = handover.recently_finished()
    assert [p.state for p in done.probes] == ["answered", "answered"] and server.early_closes == []


def test_nothing_open_means_no_keeper(records):
    assert handover.hand_over([]) is None
    assert handover.hand_over_at_exit() is None


# --------------------------------------------------------------------------------------------
# The case that wedged a twin: a decode stalled while a command probes it, then the command exits.

import httpx  # noqa: E402
import psutil  # noqa: E402
from twin_helpers import twin_state  # noqa: E402

import forensics.twin as twin_api  # noqa: E402

STALLED_CALLERS = {
    "collect": lambda inv, out: ["collect", "--inventory", inv, "--out", out, "--sample", "2s", "--since", "5m"],
    "diagnose": lambda inv, out: ["diagnose", "--inventory", inv, "--sample", "2s", "--since", "5m", "--json"],
    "watch": lambda inv, out: ["watch", "--inventory", inv, "--for", "4s"],
}


@pytest.fixture(scope="module")
def twin(tmp_path_factory, leak_guard):
    # A slow prefill (0.3 tokens/s: the probe's prompt takes 20 s) keeps the probe in the decode's
    # transfer queue, waiting for its KV, past the command's exit: the window in which the old exit's
    # disconnect became an AbortReq, an ABORT frame and a dead bootstrap thread (as measured on the old
    # code: "Abort transfer queue request. decode_req.req.rid='pd-forensics-probe-...'"). The decode's
    # own waiting timeout stays far beyond it: only a client disconnect could abort the probe.
    deployment = twin_api.up("0.5.15", waiting_timeout=120, directory=tmp_path_factory.mktemp("handover-twin"),
                             prefill_rate_tps=0.3)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(deployment.pid(role))
    yield deployment
    deployment.down()


def _tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def _probe_queued_in_decode(twin) -> bool:
    queued = twin_state(twin.decode)["queued_rids"]
    return any(rid.startswith("pd-forensics-probe-") for rids in queued.values() for rid in rids)


@pytest.mark.server
@pytest.mark.timeout(600)
# collect runs in CI; diagnose --inventory (the same Sampling) and watch (its SIGTERM case runs in CI
# below) cost 50 s each on 2 cores, so they run in the slow lane (`./run test -m slow -k stalled`).
@pytest.mark.parametrize("caller", [pytest.param(name, marks=[] if name == "collect" else [pytest.mark.slow])
                                    for name in sorted(STALLED_CALLERS)])
def test_a_command_that_exits_while_a_stalled_decode_holds_its_probe_never_wedges_the_twin(
        twin, tmp_path, caller):
    cache = tmp_path / "cache"
    decode_log_before = twin.log_text("decode")
    argv = STALLED_CALLERS[caller](str(twin.inventory_path), str(tmp_path / "bundle"))
    command = subprocess.Popen([sys.executable, "-m", "forensics", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PD_FORENSICS_CACHE": str(cache)})
    stalled = []
    try:
        # The decode holds the probe's request (its rid in the decode's queues), then stalls (SIGSTOP).
        wait_until(lambda: _probe_queued_in_decode(twin), 60, "the liveness probe queued in the decode")
        stalled = _tree(twin.pid("decode"))
        for proc in stalled:
            proc.suspend()
        stdout, stderr = command.communicate(timeout=240)  # the command ends while the decode is stalled
    finally:
        if command.poll() is None:
            command.kill()
            command.communicate()
        for proc in stalled:
            proc.resume()  # SIGCONT: the decode goes on with every request it holds
    assert "handed to keeper pid" in stderr, stderr[:3000]
    assert "liveness" in stderr
    if "--json" in argv:  # the one document lists the probes the command leaves open
        left = json.loads(stdout)["probes_left_open"]
        assert "liveness" in {p["kind"] for p in left} and all(p["at_exit"].startswith("handed") for p in left)
    records = cache / "open-probes"
    wait_until(lambda: list(records.glob("done-*.json")) and not list(records.glob("keeper-*.json")), 200,
               "every keeper finished once the decode answered")
    for done in records.glob("done-*.json"):
        states = {p["kind"]: p["state"] for p in json.loads(done.read_text())["probes"]}
        assert set(states.values()) <= {"answered"}, states
    new_lines = twin.log_text("decode")[len(decode_log_before):]
    assert "Abort transfer queue request" not in new_lines and "Sent abort notification" not in new_lines
    assert twin_state(twin.prefill)["bootstrap_thread_alive"] is True
    # Still serving: a real request through the router completes.
    reply = httpx.post(twin.router + "/generate", json={"text": "still serving", "sampling_params":
                                                        {"max_new_tokens": 2}}, timeout=200)
    assert reply.status_code == 200 and reply.json()["meta_info"]["kv_intact"] is True


@pytest.mark.timeout(180)
def test_sigterm_ends_a_probing_command_through_the_hand_over(server, records, tmp_path):  # noqa: F811
    server.blocked.add("/generate")
    inventory = tmp_path / "inventory.toml"
    inventory.write_text("[deployment]\nname = \"stalled\"\n" + "".join(
        f"\n[[engine]]\nrole = \"{role}\"\nhost = \"local\"\nurl = \"{server.url}\"\n{extra}"
        for role, extra in (("prefill", "bootstrap_port = 8998\n"), ("decode", ""), ("router", ""))))
    command = subprocess.Popen([sys.executable, "-m", "forensics", "watch", "--inventory", str(inventory),
                                "--for", "10m"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=os.environ.copy())
    try:
        wait_until(lambda: server.open.get("/generate") == 1, 60, "the liveness probe reached the server")
        command.send_signal(signal.SIGTERM)
        _, stderr = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
            command.communicate()
    assert command.returncode == 143, stderr
    wait_until(lambda: server.open.get("/generate") == 1, 10, "the request is still at the server")
    assert server.early_closes == [], stderr
    assert "handed to keeper pid" in stderr, stderr
    # The next probing command says what the keeper still holds, naming the command that left it.
    again = subprocess.run([sys.executable, "-m", "forensics", "diagnose", "--inventory", str(tmp_path / "none.toml")],
                           capture_output=True, text=True, timeout=60, env=os.environ.copy())
    assert "still holds 1 open probe connection(s) of 'forensics watch'" in " ".join(again.stderr.split())
    server.release.set()
    wait_until(lambda: not handover.held(), 30, "the keeper finished")
    assert server.early_closes == []


@pytest.mark.timeout(180)
def test_a_notebook_kernel_shut_down_with_a_probe_open_hands_it_over(server, records):  # noqa: F811
    from jupyter_client.manager import start_new_kernel

    server.blocked.add("/generate")
    manager, client = start_new_kernel(kernel_name="python3", env=os.environ.copy())
    try:
        reply = client.execute_interactive(
            "import forensics.probes as p\n"
            f"t = p.Target('router', 'router', {server.url!r}, kinds=('liveness',))\n"
            "r = p.probe_once([t], kinds=('liveness',), deadline_s=0.5, cap_s=90)\n"
            "print(r.frame['outcome'].tolist())", timeout=120)
        assert reply["content"]["status"] == "ok", reply
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)  # what JupyterLab's "Shut Down Kernel" sends
    assert server.open.get("/generate") == 1 and server.early_closes == []
    [record] = handover.held()
    assert [p.kind for p in record.open] == ["liveness"]
    server.release.set()
    wait_until(lambda: not handover.held(), 30, "the keeper finished")
    assert server.early_closes == []


@pytest.mark.timeout(120)
def test_a_probe_answered_during_the_hand_over_does_not_cost_the_others_their_keeper(server, records):  # noqa: F811
    # At SIGTERM a health probe's answer may close its socket between the hand-over listing it and
    # the keeper's start; passing that closed descriptor once made the start fail for every probe
    # (CI: "3 probe(s) still open and no keeper could start", a 330 s wait instead).
    import socket
    from types import SimpleNamespace

    server.blocked.add("/generate")
    held_socket = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10)
    held_socket.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
    wait_until(lambda: server.open.get("/generate") == 1, 10, "the request reached the server")

    def probe(number: int, kind: str):
        target = SimpleNamespace(name="router", role="router")
        call = SimpleNamespace(url=f"{server.url}/generate", rid=f"pd-forensics-probe-{number}", room=None)
        return SimpleNamespace(probe_id=number, target=target, kind=kind, call=call, sent_ns=time.time_ns(), cap_s=60)

    closed = socket.socket()
    closed_fd = closed.fileno()
    closed.close()
    answered = SimpleNamespace(socket_fd=lambda: closed_fd)  # closed since the list was made
    open_one = SimpleNamespace(socket_fd=held_socket.fileno)
    try:
        record = handover.hand_over([(probe(1, "health"), 0, answered), (probe(2, "liveness"), 0, open_one)])
        assert record is not None and [p.probe_id for p in record.probes] == [2]
        held_socket.close()  # ours only: the keeper's copy keeps the connection
        time.sleep(0.5)
        assert server.early_closes == []
    finally:
        server.release.set()
    wait_until(lambda: not handover.held(), 30, "the keeper read the answer and finished")
