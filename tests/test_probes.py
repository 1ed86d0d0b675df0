"""Probes: deadlines only mark, connections stay open, one in flight per (target, kind).

Fast tests run against a small threaded HTTP server in this process that records every
connection (how many are open at once, whether the client closed before its answer). The
twin tests then check the rule where it matters: hundreds of late probes against an
unpatched 0.5.15 twin never wedge it, and on a wedged twin health passes while liveness
does not (the ``health_lies`` finding).
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pandas as pd
import pytest
from twin_helpers import twin_state, wait_until

import forensics.probes as probes
from forensics.probes.results import ProbeRow, rows_frame

# --------------------------------------------------------------------------------------------
# A server that watches its clients


class Watcher:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.delays: dict[str, float] = {}
        self.release = threading.Event()  # paths in ``blocked`` wait for this
        self.blocked: set[str] = set()
        self.open: dict[str, int] = {}
        self.max_open: dict[str, int] = {}
        self.served: dict[str, int] = {}
        self.early_closes: list[tuple[str, float]] = []  # (path, seconds after the request arrived)
        self.bodies: list[tuple[str, dict]] = []

    def enter(self, path: str) -> None:
        with self.lock:
            self.open[path] = self.open.get(path, 0) + 1
            self.max_open[path] = max(self.max_open.get(path, 0), self.open[path])

    def leave(self, path: str) -> None:
        with self.lock:
            self.open[path] -= 1
            self.served[path] = self.served.get(path, 0) + 1


def _client_gone(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _handler(watcher: Watcher):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _serve(self) -> None:
            path = self.path
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                with watcher.lock:
                    watcher.bodies.append((path, json.loads(self.rfile.read(length))))
            watcher.enter(path)
            arrived = time.monotonic()
            try:
                until = arrived + watcher.delays.get(path, 0.0)
                while time.monotonic() < until or (path in watcher.blocked and not watcher.release.is_set()):
                    if _client_gone(self.connection):
                        with watcher.lock:
                            watcher.early_closes.append((path, time.monotonic() - arrived))
                        self.close_connection = True
                        return
                    time.sleep(0.01)
                payload = b'{"text": " tok0"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            finally:
                watcher.leave(path)

        do_GET = _serve
        do_POST = _serve

    return Handler


@pytest.fixture
def server():
    watcher = Watcher()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(watcher))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    watcher.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield watcher
    watcher.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outcomes(results, kind: str = "liveness") -> list[str]:
    f = results.frame
    return f[f["kind"] == kind]["outcome"].tolist()


# --------------------------------------------------------------------------------------------
# Fast tests (no twin)


@pytest.mark.timeout(60)
def test_a_late_probe_is_marked_late_keeps_its_connection_and_is_answered_late(server):
    server.delays["/generate"] = 1.2
    router = probes.Target("router", "router", server.url, kinds=("liveness",))
    with probes.ProbeRunner([router], interval_s=0.1, deadline_s=0.3, cap_s=30) as runner:
        assert runner.wait_for(lambda r: "late" in _outcomes(r), 10)
        late = runner.results()
        row = late.frame[late.frame["outcome"] == "late"].iloc[0]
        assert row["waited_s"] > 0.3 and pd.isna(row["total_s"]) and pd.isna(row["status"])
        wait_until(lambda: server.open.get("/generate") == 1, 5, "the server to hold the request")
        assert not server.early_closes  # late, and still open
        assert runner.wait_for(lambda r: "answered_late" in _outcomes(r), 10)
    results = runner.results()  # stop() waited for the open probe
    f = results.frame
    sent = f[f["outcome"] != "pending"]
    assert set(sent["outcome"]) == {"answered_late"}, sent
    assert (sent["total_s"] >= 1.2).all() and (sent["status"] == 200).all()
    assert (sent["ttfb_s"] <= sent["total_s"]).all()
    # The ticks in between sent nothing: they recorded pending rows naming the open probe.
    pending = f[f["outcome"] == "pending"]
    assert len(pending) >= 5
    assert set(pending["probe_id"]) <= set(sent["probe_id"])
    assert pending["detail"].str.startswith("still waiting since ").all()
    assert server.max_open["/generate"] == 1 and server.served["/generate"] == len(sent)
    assert server.early_closes == []
    # A pending row counts as failing only once its probe waited past the deadline.
    failing = results.failing[f["outcome"] == "pending"]
    assert failing.tolist() == (pending["waited_s"] > pending["deadline_s"]).tolist()
    assert results.latest()["outcome"].tolist() == ["answered_late"]


@pytest.mark.timeout(60)
def test_at_most_one_probe_in_flight_per_target_and_kind(server):
    for path in ("/health", "/health_generate", "/generate"):
        server.delays[path] = 0.5
    targets = [probes.Target("r1", "router", server.url), probes.Target("r2", "router", server.url)]
    runner = probes.ProbeRunner(targets, interval_s=0.05, deadline_s=0.2, cap_s=30).start()
    assert runner.wait_for(lambda r: len(r.sent) >= 18, 30)
    results = runner.stop()
    sent = results.sent
    # Two targets per path: never more than two open at the server, one per lane.
    assert max(server.max_open.values()) == 2, server.max_open
    for (_, _), lane in sent.groupby(["target", "kind"]):
        starts = lane["ts"].reset_index(drop=True)
        ends = starts + pd.to_timedelta(lane["total_s"].to_numpy(), unit="s")
        assert (starts.iloc[1:].to_numpy() >= ends.iloc[:-1].to_numpy()).all()  # the next one only after the previous answer
    assert server.early_closes == []
    assert (results.frame["outcome"] == "pending").sum() > len(sent)


@pytest.mark.timeout(60)
def test_the_cap_is_the_only_time_a_probe_closes_by_itself(server):
    server.blocked.add("/health")
    target = probes.Target("engine", "prefill", server.url, kinds=("health",))
    results = probes.probe_once([target], kinds=("health",), deadline_s=0.2, cap_s=1.5, wait=True)
    row = results.frame.iloc[0]
    assert row["outcome"] == "unanswered" and row["total_s"] >= 1.5
    wait_until(lambda: server.early_closes, 5, "the server to see the close")
    assert server.early_closes[0][1] >= 1.4


@pytest.mark.timeout(60)
def test_stop_waits_abandon_closes_detach_leaves_open(server):
    server.blocked.add("/health")
    target = probes.Target("engine", "decode", server.url, kinds=("health",))
    runner = probes.ProbeRunner([target], interval_s=0.1, deadline_s=0.2, cap_s=60).start()
    assert runner.wait_for(lambda r: "late" in _outcomes(r, "health"), 10)
    results = runner.stop(timeout=0.3)  # waited a little, then left it open
    assert _outcomes(results, "health")[0] == "late" and not server.early_closes
    results = runner.stop(abandon=True)  # the caller says so explicitly
    assert _outcomes(results, "health")[0] == "abandoned"
    wait_until(lambda: server.early_closes, 5, "the server to see the close")

    server.early_closes.clear()
    server.blocked.clear()
    server.delays["/health"] = 1.0
    runner = probes.ProbeRunner([target], interval_s=0.1, deadline_s=0.2, cap_s=60).start()
    assert runner.wait_for(lambda r: "late" in _outcomes(r, "health"), 10)
    detached = runner.detach()
    assert _outcomes(detached, "health")[0] == "late"
    wait_until(lambda: "answered_late" in _outcomes(detached.refresh(), "health"), 10, "the detached probe's answer")
    assert not server.early_closes


@pytest.mark.timeout(30)
def test_a_closed_port_is_refused_not_ok():
    url = f"http://127.0.0.1:{_closed_port()}"
    results = probes.probe_once([probes.Target("gone", "router", url)], deadline_s=2.0, cap_s=10)
    assert set(results.frame["outcome"]) == {"refused"}
    assert results.frame["status"].isna().all()
    assert {f.id for f in results.findings()} == {"unreachable", "liveness_failing"}


@pytest.mark.timeout(30)
def test_a_pair_gets_the_same_body_with_a_full_range_room_concurrently(server):
    server.delays["/generate"] = 0.2
    inventory = SimpleNamespace(engines=[
        SimpleNamespace(role="prefill", url=server.url, bootstrap_port=8998),
        SimpleNamespace(role="decode", url=server.url + "/", bootstrap_port=None),
    ])
    targets = probes.targets_from(inventory)
    assert [(t.name, t.role, t.kinds) for t in targets] == [
        ("prefill", "prefill", ("health", "health_generate")), ("decode", "decode", ("health", "health_generate")),
        ("prefill+decode", "pd", ("liveness",))]
    rooms = []
    for _ in range(10):
        results = probes.probe_once(targets, kinds=("liveness",), deadline_s=5.0, cap_s=10, wait=True)
        row = results.frame.iloc[0]
        assert row["outcome"] == "ok" and row["status"] == 200
        rooms.append(int(row["room"]))
    bodies = [body for path, body in server.bodies if path == "/generate"]
    assert len(bodies) == 20
    for first, second, room in zip(bodies[::2], bodies[1::2], rooms, strict=True):
        assert first == second  # the same body to both
        assert first["bootstrap_room"] == room and isinstance(first["bootstrap_room"], int)
        assert first["bootstrap_host"] == "127.0.0.1" and first["bootstrap_port"] == 8998
        assert first["sampling_params"] == {"max_new_tokens": 1, "temperature": 0}
        assert first["rid"].startswith(probes.RID_PREFIX)
    assert all(0 <= r <= 2**63 - 1 for r in rooms) and max(rooms) > 2**53  # beyond float's exact range
    assert server.max_open["/generate"] == 2  # both legs open at once


def test_health_lies_needs_a_passing_health_and_a_failing_liveness_together():
    t0 = time.time_ns()
    big_room = 2**63 - 1

    def row(probe_id, kind, outcome, at_s, waited=0.1, room=None):
        return ProbeRow(ts_ns=t0 + int(at_s * 1e9), probe_id=probe_id, target="router" if kind == "liveness" else
                        "prefill", role="router", kind=kind, url="u", outcome=outcome, deadline_s=1.0,
                        status=200 if outcome == "ok" else None, waited_s=waited, room=room)

    lying = probes.ProbeResults.from_rows([row(1, "health", "ok", 0), row(2, "liveness", "late", 0, 4.0, big_room),
                                           row(2, "liveness", "pending", 1, 1.5, big_room),
                                           row(3, "health_generate", "ok", 2)])
    rooms = lying.frame[lying.frame["kind"] == "liveness"]["room"]
    assert rooms.tolist() == [big_room, big_room] and str(rooms.dtype) == "Int64"  # exact, no float on the way
    finding = lying.findings()[0]
    assert finding.id == "health_lies" and finding.severity == "critical"
    assert sorted(finding.evidence["probe_id"].tolist()) == [1, 2, 2, 3]
    assert json.dumps(finding.to_dict())  # JSON-ready
    honest = probes.ProbeResults.from_rows([row(1, "health", "ok", 0), row(2, "liveness", "ok", 0),
                                            row(2, "liveness", "pending", 0.5, 0.5)])  # pending within deadline
    assert honest.findings() == []
    far = probes.ProbeResults.from_rows([row(1, "health", "ok", 0), row(2, "liveness", "late", 100, 2.0)])
    assert [f.id for f in far.findings(window_s=30)] == ["liveness_failing"]
    assert rows_frame([]).dtypes.astype(str).to_dict() == probes.PROBES_SCHEMA


# --------------------------------------------------------------------------------------------
# Against a real twin (unpatched 0.5.15: a client that disconnects early would wedge it)

import forensics.twin as twin_api  # noqa: E402

SLOW_PROMPT = "probe " * 27  # 41 prompt tokens: 0.1 s of prefill at the twin's 400 tokens/s


@pytest.fixture(scope="module")
def twin(tmp_path_factory, leak_guard):
    deployment = twin_api.up("0.5.15", waiting_timeout=15, directory=tmp_path_factory.mktemp("probes-twin"),
                             prefill_rate_tps=400.0, decode_rate_tps=50.0, decode_log_interval=10)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(deployment.pid(role))
    yield deployment
    deployment.down()


def _aborts_sent(decode_log: str) -> int:
    return len(re.findall(r"Sent abort notification for room \d+ to ", decode_log))


@pytest.mark.server
@pytest.mark.timeout(120)
def test_no_router_liveness_goes_to_prefill_and_decode_like_a_router(twin):
    inventory = SimpleNamespace(engines=[e for e in twin.inventory.engines if e.role != "router"])
    results = probes.probe_once(inventory, deadline_s=10.0, cap_s=60, wait=True)
    f = results.frame
    assert set(f["outcome"]) == {"ok"}, f[["target", "kind", "outcome", "detail"]]
    live = f[f["kind"] == "liveness"].iloc[0]
    assert live["role"] == "pd" and live["status"] == 200
    room = int(live["room"])
    # The prefill's real bootstrap loop bootstrapped exactly that 63-bit room.
    assert f"room={room} is bootstrapped" in twin.log_text("prefill")


@pytest.mark.server
@pytest.mark.timeout(300)
def test_hundreds_of_late_probes_never_wedge_an_unpatched_slow_twin(twin):
    state = twin_state(twin.prefill)
    assert state["bootstrap_thread_alive"] is True
    aborts_before = _aborts_sent(twin.log_text("decode"))
    decode_aborted = twin_state(twin.decode)["counters"]["aborted"]
    disconnects = httpx.get(twin.router + "/get_server_info").json()["twin"]["counters"]["client_disconnects"]
    prefill = twin.inventory.engine("prefill")
    # Liveness on both real paths: through the router, and to the prefill+decode pair directly.
    targets = probes.targets_from(twin) + [probes.Target("pair", "pd", twin.prefill, prefill.bootstrap_port,
                                                         decode_url=twin.decode)]
    started = time.monotonic()
    runner = probes.ProbeRunner(targets, interval_s=0.2, deadline_s={"liveness": 0.05, "health": 5.0,
                                                                     "health_generate": 5.0},
                                cap_s=60, liveness_text=SLOW_PROMPT).start()
    try:
        enough = runner.wait_for(lambda r: _outcomes(r).count("answered_late") >= 200, 240)
    finally:
        results = runner.stop()  # waits for the open probes: nothing is closed early
    elapsed = time.monotonic() - started
    f = results.frame
    sent = results.sent
    print(f"\n{len(sent)} probes sent ({len(f)} rows, {(f['outcome'] == 'pending').sum()} pending) in {elapsed:.1f}s; "
          f"outcomes {sent.groupby('kind')['outcome'].value_counts().to_dict()}")
    assert enough, results.summary()
    live = sent[sent["kind"] == "liveness"]
    assert set(live["role"]) == {"router", "pd"}
    assert set(live["outcome"]) == {"answered_late"} and (live["status"] == 200).all()
    assert (live["total_s"] >= 0.1).all()  # each waited out its full prefill, well past its deadline
    assert not sent["outcome"].isin(["in_flight", "late", "abandoned", "unanswered", "error"]).any()
    # Nothing of ours was aborted: no client disconnect at the router, no AbortReq, no ABORT frame.
    assert httpx.get(twin.router + "/get_server_info").json()["twin"]["counters"]["client_disconnects"] == disconnects
    assert twin_state(twin.decode)["counters"]["aborted"] == decode_aborted
    assert _aborts_sent(twin.log_text("decode")) == aborts_before
    assert twin_state(twin.prefill)["bootstrap_thread_alive"] is True
    response = httpx.post(twin.router + "/generate", json={"text": "still serving", "sampling_params":
                                                           {"max_new_tokens": 3}}, timeout=30)
    assert response.status_code == 200 and response.json()["meta_info"]["kv_intact"] is True


@pytest.mark.server
@pytest.mark.timeout(180)
def test_on_a_wedged_twin_health_lies_and_the_probes_say_so(twin):
    from live_helpers import ensure_wedged

    ensure_wedged(twin)  # retried when a kill lands outside the transfer wait (a loaded machine)
    runner = probes.ProbeRunner(twin, interval_s=0.5, deadline_s={"liveness": 2.0, "health": 10.0,
                                                                   "health_generate": 10.0}, cap_s=120).start()
    try:
        # Four pending ticks, one of them past the liveness deadline: that row still fails once the
        # open probe is abandoned below (an abandoned probe is the caller's doing, not a failure), so
        # health_lies must hold on the closed results too. Four ticks alone left the last at 1.999 s.
        def enough(r) -> bool:
            pending = r.frame[r.frame["outcome"] == "pending"]
            return (any(x.id == "health_lies" for x in r.findings()) and len(pending) >= 4
                    and bool((pending["waited_s"] > pending["deadline_s"]).any()))

        found = runner.wait_for(enough, 60)
        results = runner.results()
    finally:
        closed = runner.stop(abandon=True)  # wedged already: closing now changes nothing
    assert found, results.summary()
    finding = next(x for x in results.findings() if x.id == "health_lies")
    ev = finding.evidence
    assert (ev[ev["kind"] != "liveness"]["status"] == 200).all()
    assert set(ev[ev["kind"] == "liveness"]["outcome"]) <= {"late", "pending"}
    live = results.frame[results.frame["kind"] == "liveness"]
    assert live["probe_id"].nunique() == 1  # one liveness probe, never answered, never a second one
    assert _outcomes(closed)[0] == "abandoned"
    assert "health_lies" in closed._repr_html_()
