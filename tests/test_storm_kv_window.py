"""The storm hits the KV-pending window with its default options, chosen by what the decode exposes.

The acceptance commands, as a user types them (default twin settings, default storm options):
``validate --cycles 1 --sessions 20`` is FAIL (exit 1) on an unpatched 0.5.15 twin and PASS
(exit 0) on a patched one; ``storm --sessions 8 --cycles 1 --phase kv`` exits 1 and 0. Each kill
was chosen by the decode's own arrival counter (``observed_by: decode-metrics``), and the history
attributes the kills to the decode's prealloc / transfer queue from the decode's own lines.
"""

from __future__ import annotations

import json
import socket
import time

import pandas as pd
import pytest
from cli_helpers import invoke
from storm_helpers import check_kills

import forensics.twin as twin_api
from forensics.collectors.metrics import parse_exposition
from forensics.storm import observer
from forensics.storm.client import SessionState

VALIDATE = ("--cycles", "1", "--sessions", "20")
STORM = ("--sessions", "8", "--cycles", "1", "--phase", "kv")
PAGE = """# HELP sglang:http_requests_total Total number of HTTP requests by endpoint and method
# TYPE sglang:http_requests_total counter
sglang:http_requests_total{endpoint="/health",method="GET"} 12.0
{chat}"""


def _twin(tmp_path_factory, leak_guard, name: str, **options):
    twin = twin_api.up("0.5.15", directory=tmp_path_factory.mktemp(name), **options)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(twin.pid(role))
    return twin


def _run(argv: tuple[str, ...], inventory, out_dir) -> tuple[int, dict, pd.DataFrame, str]:
    """The command with its default options (validate saves its campaign, for the history frame)."""
    extra = ("--out", str(out_dir)) if argv[0] == "validate" else ()
    status, out, err = invoke(argv[0], "--inventory", str(inventory), *argv[1:], *extra, "--json")
    doc = json.loads(out)
    history = (pd.read_parquet(out_dir / "frames" / "history.parquet") if argv[0] == "validate"
               else pd.DataFrame(json.loads(json.dumps(doc["history"]))))
    return status, doc, history, err


@pytest.mark.server
@pytest.mark.timeout(240)
def test_unpatched_twin_fails_validate_and_storm_with_the_default_options(tmp_path_factory, leak_guard):
    for argv, sessions in ((("validate", *VALIDATE), 20), (("storm", *STORM), 8)):
        twin = _twin(tmp_path_factory, leak_guard, f"kv-{argv[0]}-unpatched")  # each command wedges its own
        try:
            started = time.monotonic()
            status, doc, history, err = _run(argv, twin.inventory_path, tmp_path_factory.mktemp("campaign"))
            assert status == 1, (argv[0], doc.get("summary"), err[-2000:])
            assert doc.get("campaign", doc["status"]) == ("FAIL" if argv[0] == "validate" else "wedged")
            check_kills(doc, history, twin.log_text("decode"), sessions)
            assert "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?" in twin.log_text("prefill")
            print(f"{argv[0]} unpatched: {time.monotonic() - started:.1f} s")
        finally:
            twin.down()


@pytest.mark.server
@pytest.mark.timeout(240)
def test_patched_twin_passes_validate_and_storm_with_the_default_options(tmp_path_factory, leak_guard):
    twin = _twin(tmp_path_factory, leak_guard, "kv-patched", patched=True)
    try:
        for argv, sessions in ((("storm", *STORM), 8), (("validate", *VALIDATE), 20)):
            started = time.monotonic()
            status, doc, history, err = _run(argv, twin.inventory_path, tmp_path_factory.mktemp("campaign"))
            assert status == 0, (argv[0], doc.get("summary"), err[-2000:])
            assert doc.get("campaign", doc["status"]) == ("PASS" if argv[0] == "validate" else "healthy")
            check_kills(doc, history, twin.log_text("decode"), sessions)
            print(f"{argv[0]} patched: {time.monotonic() - started:.1f} s")
    finally:
        twin.down()


# ----------------------------------------------------------------- the observer's evidence, no server


def test_the_decode_arrival_count_reads_the_chat_endpoint_and_a_declared_family_with_no_series_is_zero():
    chat = 'sglang:http_requests_total{endpoint="/v1/chat/completions",method="POST"} 40.0'
    assert observer.arrivals_from_page(parse_exposition(PAGE.replace("{chat}", chat)), "/v1/chat/completions") == 40
    # A fresh decode has served no chat request yet: the family is declared, the series is not (yet) there.
    assert observer.arrivals_from_page(parse_exposition(PAGE.replace("{chat}", "")), "/v1/chat/completions") == 0
    # Metrics without the HTTP middleware family: the decode's count cannot be told.
    assert observer.arrivals_from_page(parse_exposition("# TYPE up gauge\nup 1\n"), "/v1/chat/completions") is None


class _Counted(observer.DecodeArrivals):
    """A decode whose arrival counter reads the values given, one per scrape (the observer's own logic)."""

    def __init__(self, values):
        super().__init__([("decode", "http://127.0.0.1:9")], "/v1/chat/completions")
        self.values = list(values)

    def count(self):
        return self.values.pop(0)


def _sessions(now: float) -> list[SessionState]:
    sessions = [SessionState(rid=f"r{i}", phase="sent", sent=now - 1.0 + i * 0.01) for i in range(4)]
    sessions[3].first_token, sessions[3].phase = now, "streaming"  # its KV has arrived: not pending
    return sessions


def test_held_sessions_are_the_first_sent_the_decode_counted_and_without_a_token():
    now = time.time()
    sessions = _sessions(now)
    watch = observer.KvObserver(_Counted([100, 102, 104]))
    watch.start()
    watch.refresh()  # the decode counted 2 of this cycle's requests: the two sent first are there
    assert [s.rid for s in watch.held(sessions, sessions)] == ["r0", "r1"] and watch.source == observer.BY_DECODE
    watch.refresh()  # all 4 arrived; r3 streams already (its KV arrived): not held
    assert [s.rid for s in watch.held(sessions, sessions)] == ["r0", "r1", "r2"]


def test_without_the_decode_count_the_client_evidence_stands_in():
    with socket.socket() as sock:  # a port nothing listens on: the decode's /metrics is refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    watch = observer.KvObserver(observer.DecodeArrivals([("decode", f"http://127.0.0.1:{port}")],
                                                        "/v1/chat/completions"))
    watch.start()
    watch.refresh()
    assert watch.arrived is None and watch.source == observer.BY_CLIENT and watch.arrivals.last_error
    now = time.time()
    sessions = _sessions(now)
    sessions[2].sent = now  # just sent, no headers: the router may not have forwarded it yet
    assert [s.rid for s in watch.held(sessions, sessions)] == ["r0", "r1"]
