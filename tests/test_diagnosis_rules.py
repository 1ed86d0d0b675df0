"""The verdict rules on evidence frames shaped as the collectors write them.

The acceptance tests (tests/test_live_acceptance.py) run the same rules on a real twin;
these pin each rule and its boundary: two independent sources for WEDGED, never a
timeout alone, never HEALTHY by default, an old traceback from before a restart ignored.
"""

from __future__ import annotations

import pandas as pd

from forensics.diagnosis import decide
from forensics.evidence import Evidence, Gap

T0 = pd.Timestamp("2026-11-30T03:00:00Z")
ROOM = 2**63 - 12345


def _t(seconds: float) -> pd.Timestamp:
    return T0 + pd.Timedelta(seconds=seconds)


def _engines() -> pd.DataFrame:
    return pd.DataFrame({"name": ["prefill-0", "decode-0", "router-0"], "role": ["prefill", "decode", "router"],
                         "host": ["local"] * 3, "url": ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]})


def _probes(liveness: list[str], health: str = "ok") -> pd.DataFrame:
    rows = []
    for i, outcome in enumerate(liveness):
        rows.append({"ts": _t(10 * i), "target": "router-0", "role": "router", "kind": "liveness", "url": "http://r",
                     "outcome": outcome, "status": 200 if outcome == "ok" else None, "ttfb_s": None,
                     "total_s": 0.2 if outcome == "ok" else None, "waited_s": 0.2 if outcome == "ok" else 9.0,
                     "deadline_s": 5.0, "detail": ""})
    for i, name in enumerate(["prefill-0", "decode-0"]):
        rows.append({"ts": _t(10 * len(liveness) + i), "target": name, "role": name.split("-")[0], "kind": "health",
                     "url": f"http://{name}/health", "outcome": health, "status": 200 if health == "ok" else None,
                     "ttfb_s": 0.001, "total_s": 0.001, "waited_s": 0.001, "deadline_s": 2.0, "detail": ""})
    frame = pd.DataFrame(rows)
    frame["status"] = frame["status"].astype("Int64")
    return frame


STARTED = T0 - pd.Timedelta(hours=1)


def _processes(start: pd.Timestamp = STARTED, *, prefill_state: str = "running") -> pd.DataFrame:
    return pd.DataFrame({"engine": ["prefill-0", "decode-0"], "role": ["prefill", "decode"], "host": ["local", "local"],
                         "pid": pd.array([100, 200] if prefill_state == "running" else [None, 200], dtype="Int64"),
                         "start_time": [start if prefill_state == "running" else pd.NaT, start],
                         "cmdline": ["sglang::scheduler", "sglang::scheduler"],
                         "state": [prefill_state, "running"],
                         "detail": ["" if prefill_state == "running" else "no process matching title='sglang::scheduler'", ""]})


def _thread_check(status: str) -> pd.DataFrame:
    return pd.DataFrame({"engine": ["prefill-0"], "role": ["prefill"], "pid": [100], "logical_name": ["bootstrap"],
                         "thread_name": ["Thread-N (bootstrap_thread)"], "expected": ["1"],
                         "found": [0 if status == "missing" else 1], "status": [status],
                         "source": ["sglang/srt/disaggregation/nixl/conn.py:1234"]})


def _events(death_at: pd.Timestamp | None = None, timeouts: int = 0) -> pd.DataFrame:
    rows = []
    if death_at is not None:
        rows.append({"ts": death_at - pd.Timedelta(seconds=1), "engine": "decode-0", "role": "decode",
                     "signature": "abort_sent", "room": ROOM, "thread": None, "source": "decode.log", "line": 10,
                     "message": f"Sent abort notification for room {ROOM}"})
        rows.append({"ts": death_at, "engine": "prefill-0", "role": "prefill", "signature": "thread_death", "room": None,
                     "thread": "Thread-1 (bootstrap_thread)", "source": "prefill.log", "line": 20,
                     "message": "AssertionError: First message should be GUARD. Foreign traffic?"})
    for i in range(timeouts):
        rows.append({"ts": _t(i), "engine": "decode-0", "role": "decode", "signature": "decode_transfer_timeout",
                     "room": ROOM - i, "thread": None, "source": "decode.log", "line": 30 + i,
                     "message": "Request timed out waiting for KV"})
    columns = ["ts", "engine", "role", "signature", "thread", "source", "line", "message"]
    frame = pd.DataFrame([{k: row[k] for k in columns} for row in rows], columns=columns)
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    # Built from the Python ints directly: a DataFrame of dicts would carry them through float.
    frame["room"] = pd.array([row["room"] for row in rows], dtype="UInt64")
    return frame


def _evidence(gaps: list[Gap] | None = None, **frames) -> Evidence:
    return Evidence({"name": "pd-test"}, {"engines": _engines(), **frames}, gaps or [])


def test_wedged_needs_two_sources_and_tells_the_kill_chain_with_the_exact_room():
    verdict = decide(_evidence(probes=_probes(["ok", "pending", "pending"]), processes=_processes(),
                               thread_check=_thread_check("missing"), events=_events(death_at=_t(5))))
    assert verdict.verdict == "WEDGED" and verdict.exit_status == 1
    assert "3 independent sources (logs, probes, threads)" in verdict.reasons[0]
    chain = "\n".join(verdict.kill_chain)
    assert f"abort_sent for room {ROOM} on the decode" in chain
    assert "bootstrap thread death on prefill-0" in chain and "health still 200" in chain
    assert {s["name"] for s in verdict.to_dict()["signals"]} >= {"health_lies", "bootstrap_thread_missing",
                                                                "thread_death_logged"}


def test_one_source_alone_is_inconclusive_and_names_what_was_missing_with_the_fix():
    gaps = [Gap("threads", "prefill-0 (local)", "py-spy is not installed", "pip install py-spy"),
            Gap("logs", "prefill-0 (local)", "journalctl not found", "install systemd")]
    verdict = decide(_evidence(gaps, probes=_probes(["ok", "pending"]), processes=_processes()))
    assert verdict.verdict == "INCONCLUSIVE" and verdict.exit_status == 3
    text = "\n".join(verdict.reasons)
    assert "only one source shows a wedge (probes)" in text
    assert "missing threads: py-spy is not installed (fix: pip install py-spy)" in text
    assert "missing logs: journalctl not found" in text


def test_a_timeout_alone_is_degraded_never_wedged():
    verdict = decide(_evidence(probes=_probes(["ok", "late"], health="ok"), processes=_processes(),
                               thread_check=_thread_check("ok"), events=_events(timeouts=3)))
    assert verdict.verdict in ("INCONCLUSIVE", "DEGRADED") and verdict.verdict != "WEDGED"
    verdict = decide(_evidence(probes=_probes(["ok", "late"], health="http_error"), processes=_processes(),
                               thread_check=_thread_check("ok"), events=_events(timeouts=3)))
    assert verdict.verdict == "DEGRADED"
    assert any("requests_timing_out" == s.name for s in verdict.signals)


def test_a_gone_process_is_down():
    verdict = decide(_evidence(probes=_probes(["ok", "pending"], health="refused"),
                               processes=_processes(prefill_state="none_found")))
    assert verdict.verdict == "DOWN" and verdict.exit_status == 1
    assert any("no engine process" in r for r in verdict.reasons)


def test_healthy_needs_a_completed_request():
    verdict = decide(_evidence(probes=_probes(["ok", "ok"]), processes=_processes(), thread_check=_thread_check("ok"),
                               events=_events()))
    assert verdict.verdict == "HEALTHY" and verdict.exit_status == 0
    nothing = decide(_evidence(processes=_processes(), thread_check=_thread_check("ok"), events=_events()))
    assert nothing.verdict == "INCONCLUSIVE"
    assert any("no liveness probe result" in r for r in nothing.reasons)


def test_an_old_traceback_from_before_the_restart_is_history():
    death = T0 - pd.Timedelta(minutes=5)
    restarted = T0 - pd.Timedelta(minutes=1)
    verdict = decide(_evidence(probes=_probes(["ok", "ok"]), processes=_processes(start=restarted),
                               thread_check=_thread_check("ok"), events=_events(death_at=death)))
    assert verdict.verdict == "HEALTHY", verdict
    assert [s.name for s in verdict.signals if s.source == "logs"] == ["old_thread_death"]


def test_a_missing_thread_while_requests_complete_is_degraded():
    verdict = decide(_evidence(probes=_probes(["ok", "ok"]), processes=_processes(), thread_check=_thread_check("missing")))
    assert verdict.verdict == "DEGRADED"
