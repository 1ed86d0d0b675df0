"""The log timeline on generated incidents, in every supported text format."""

from __future__ import annotations

import pandas as pd
import pytest

import forensics as fx
from forensics.logs import incident as gen


@pytest.fixture(scope="module")
def incident_0515():
    return gen.generate("0.5.15")


@pytest.fixture(scope="module")
def plain_scan(incident_0515, tmp_path_factory):
    paths = gen.write_sglang_logs(incident_0515, tmp_path_factory.mktemp("plain"))
    return fx.logs.scan([paths["prefill"], paths["decode"]]), paths


def _line_of(path, needle: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def test_thread_death_is_one_event_with_thread_and_final_line(plain_scan, incident_0515):
    scan, paths = plain_scan
    deaths = scan.events[scan.events["signature"] == "thread_death"]
    assert len(deaths) == 1
    death = deaths.iloc[0]
    assert death["thread"] == "Thread-5 (bootstrap_thread)"
    assert death["message"] == "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?"
    assert death["role"] == "prefill"
    assert death["line"] == _line_of(paths["prefill"], "Exception in thread Thread-5")
    assert death["frame_function"] == "bootstrap_thread"
    assert death["frame_line"] == 2349
    assert death["frame_file"].endswith("sglang/srt/disaggregation/nixl/conn.py")
    # The traceback has no time of its own: it lies between its neighbours.
    assert death["ts_source"] == "inferred"
    assert death["ts"] <= pd.Timestamp(incident_0515.death_ts) <= death["ts_upper"]
    assert "Traceback (most recent call last):" in death["raw"]


def test_guard_assertion_is_its_own_signature(plain_scan):
    scan, paths = plain_scan
    guard = scan.events[scan.events["signature"] == "nixl_guard_assertion"]
    assert len(guard) == 1
    assert guard.iloc[0]["thread"] == "Thread-5 (bootstrap_thread)"
    assert guard.iloc[0]["step"] == "thread_death"
    assert guard.iloc[0]["line"] == _line_of(paths["prefill"], "Foreign traffic?")


def test_trigger_room_rid_rank_are_extracted(plain_scan, incident_0515):
    scan, _ = plain_scan
    aborted = scan.events[scan.events["signature"] == "decode_transfer_aborted"]
    assert len(aborted) == 1
    row = aborted.iloc[0]
    assert row["room"] == incident_0515.trigger_room
    assert row["rid"] == incident_0515.trigger_rid
    assert row["rank"] == 0
    assert row["severity"] == "error" and row["step"] == "trigger"
    assert row["ts"] == pd.Timestamp(incident_0515.trigger_ts).floor("s")
    sent = scan.events[(scan.events["signature"] == "abort_sent") & (scan.events["room"] == incident_0515.trigger_room)]
    assert len(sent) == 1 and sent.iloc[0]["severity"] == "debug"


def test_timeouts_name_every_timed_out_room(plain_scan, incident_0515):
    scan, _ = plain_scan
    timeouts = scan.events[scan.events["signature"] == "decode_transfer_timeout"]
    assert sorted(timeouts["room"].astype(int)) == sorted(incident_0515.timeout_rooms)
    assert len(scan.events[scan.events["signature"] == "waiting_timeout_hint"]) == 1


def test_summary_states_the_key_facts(plain_scan, incident_0515):
    scan, _ = plain_scan
    summary = scan.summary()
    facts = summary.facts
    assert facts["first_thread_death"]["thread"] == "Thread-5 (bootstrap_thread)"
    assert facts["trigger"]["room"] == incident_0515.trigger_room
    assert facts["trigger"]["role"] == "decode"
    assert pd.Timestamp(facts["last_real_prefill_batch"]) == pd.Timestamp(incident_0515.last_real_prefill).floor("s")
    assert incident_0515.trigger_room in facts["rooms_affected"]
    assert facts["health_200_after_death"] > 0
    text = str(summary)
    assert "bootstrap_thread" in text and str(incident_0515.trigger_room) in text
    page = summary._repr_html_()
    assert str(incident_0515.trigger_room) in page and "Thread-5 (bootstrap_thread)" in page


def test_batch_history_shows_the_bootstrap_queue_growing(plain_scan, incident_0515):
    scan, _ = plain_scan
    prefill = scan.batches[scan.batches["kind"] == "prefill"]
    probes = prefill[(prefill["new_seq"] == 1) & (prefill["new_token"] == 1)]
    assert probes["bootstrap_req"].is_monotonic_increasing
    assert probes["bootstrap_req"].iloc[-1] > 100
    decode = scan.batches[scan.batches["kind"] == "decode"]
    assert len(decode) > 0 and decode["cuda_graph"].all()
    assert str(prefill["bootstrap_req"].dtype) == "Int64"  # counters are exact, never float32
    assert str(prefill["input_throughput"].dtype) == "float32"
    assert prefill["tp_rank"].eq(0).all()


def test_access_lines_are_counted_per_minute_and_path(plain_scan):
    scan, _ = plain_scan
    access = scan.access
    health = access[(access["path"] == "/health") & (access["status"] == 200)]
    assert health["count"].sum() > 100
    assert set(access["role"]) == {"prefill", "decode"}
    assert access["minute"].notna().all()


@pytest.mark.parametrize("style", ["short-iso", "short-iso-precise", "short-precise", "json"])
def test_journal_text_formats_give_the_same_story(incident_0515, plain_scan, tmp_path, style):
    path = gen.write_journal_text(incident_0515, tmp_path / f"journal-{style}.txt", style=style)
    scan = fx.logs.scan(path)
    plain, _ = plain_scan
    key = ["signature", "room"]
    ours = scan.events[key].astype(str).value_counts().sort_index()
    theirs = plain.events[key].astype(str).value_counts().sort_index()
    assert ours.equals(theirs)
    death = scan.events[scan.events["signature"] == "thread_death"].iloc[0]
    # Journal timestamps win: exact to the microsecond where the format has them.
    assert death["ts_source"] == "journal"
    if style != "short-iso":
        assert death["ts"] == pd.Timestamp(incident_0515.death_ts)
    else:
        assert death["ts"] == pd.Timestamp(incident_0515.death_ts).floor("s")
    assert death["unit"].startswith("sglang-prefill") and death["role"] == "prefill"
    assert death["host"] == "pd-node-1"
    assert scan.lines_unknown == 0
    assert len(scan.batches) == len(plain.batches)
    assert set(scan.batches["role"]) == {"prefill", "decode"}
    # every access line (prefixed by sglang's uvicorn config) is counted in every format
    assert int(scan.access["count"].sum()) == int(plain.access["count"].sum()) > 100
    if style == "short-precise":
        assert any("carry no year" in note for note in scan.notes)
    else:
        assert not any("carry no year" in note for note in scan.notes)


def test_naive_times_are_read_in_the_stated_zone(incident_0515, tmp_path):
    paths = gen.write_sglang_logs(incident_0515, tmp_path, tz="Europe/Berlin")
    scan = fx.logs.scan(paths["decode"], tz="Europe/Berlin")
    row = scan.events[scan.events["signature"] == "decode_transfer_aborted"].iloc[0]
    assert row["ts"] == pd.Timestamp(incident_0515.trigger_ts).floor("s")
    wrong = fx.logs.scan(paths["decode"])  # read as UTC: two hours off, as stated
    shifted = wrong.events[wrong.events["signature"] == "decode_transfer_aborted"].iloc[0]
    assert shifted["ts"] - row["ts"] == pd.Timedelta(hours=2)


def test_since_and_until_bound_every_frame(plain_scan, incident_0515):
    _, paths = plain_scan
    since = pd.Timestamp(incident_0515.trigger_ts).floor("s")
    until = since + pd.Timedelta(seconds=30)
    scan = fx.logs.scan(list(paths.values()), since=since, until=until)
    assert len(scan.events) > 0 and scan.events["ts"].between(since, until).all()
    assert len(scan.batches) > 0 and scan.batches["ts"].between(since, until).all()
    assert "decode_transfer_aborted" in set(scan.events["signature"])
    assert "decode_transfer_timeout" not in set(scan.events["signature"])


def test_release_0523_logs_the_guarded_death_first(tmp_path):
    incident = gen.generate("0.5.23", after_seconds=30)
    paths = gen.write_sglang_logs(incident, tmp_path)
    scan = fx.logs.scan(paths["prefill"])
    died = scan.events[scan.events["signature"] == "bootstrap_thread_died"]
    assert len(died) == 1 and died.iloc[0]["rank"] == 0
    death = scan.events[scan.events["signature"] == "thread_death"].iloc[0]
    assert death["thread"] == "Thread-5 (bootstrap_thread_guarded)"
    prefill = scan.batches[scan.batches["kind"] == "prefill"]
    assert prefill["optimistic_req"].notna().all()


def test_healthy_logs_have_no_thread_death(tmp_path):
    incident = gen.generate("0.5.16", wedge=False, after_seconds=20)
    paths = gen.write_sglang_logs(incident, tmp_path)
    scan = fx.logs.scan(list(paths.values()))
    assert len(scan.batches) > 0 and scan.lines_unknown == 0 and not scan.problems  # it was read
    assert not scan.events["signature"].isin(["thread_death", "nixl_guard_assertion"]).any()
    assert scan.summary().facts["first_thread_death"] is None
    # The one aborted request is a warning; nothing is critical or error.
    assessment = scan.assess()
    assert assessment.word == "warnings" and [f.id for f in assessment.findings] == ["aborted_requests"]


def test_access_rows_carry_their_catalogue_signature(plain_scan):
    scan, _ = plain_scan
    labelled = dict(zip(scan.access["path"], scan.access["signature"]))
    assert labelled["/health"] == "access_health"
    assert labelled["/metrics"] == "access_metrics"
    assert labelled["/generate"] == "access_completion"
    catalogue = fx.logs.catalogue.to_frame()
    assert set(catalogue.loc[catalogue["aggregate"], "id"]) == {"access_health", "access_metrics", "access_completion"}
    # aggregated signatures never become one event per line
    assert not scan.events["signature"].str.startswith("access_").any()
