"""Identifiers and counters stay exact through every output of the log forensics.

sglang's bootstrap rooms are random 63-bit integers (mini_lb, the Rust router), and
``room + i`` for n > 1 reaches just above 2**63; a float64 keeps 53 bits. Each test puts
rooms a float cannot hold beside events without a room (the case that used to turn the
whole column into float64) and reads them back from the frames, the summary, JSON, CSV,
HTML and the terminal table.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import forensics as fx
from forensics.logs import incident as gen
from forensics.logs import scanner
from tests.cli_helpers import invoke

ROOM = 7461092837465012345  # float64 makes this 7461092837465012224
NEAR_TOP = [2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1]


def aborted_line(room: int, rid: str = "0a1b2c3d4e5f6789", second: int = 1) -> str:
    return (f"[2025-07-01 12:00:{second:02d} DP0 TP0] Decode transfer failed for request rank=0 "
            f"decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={room} with exception "
            f"KVTransferError(bootstrap_room={room}): Aborted by AbortReq.")


def roomless_line(second: int = 0) -> str:
    return (f"[2025-07-01 12:00:{second:02d} DP0 TP0] Some requests fail to receive KV Cache transfer done signal "
            "after bootstrapping. If a greater mean TTFT is acceptable, you can 'export "
            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax the timeout condition.")


def write_files(directory: Path, groups: list[list[int | None]]) -> list[Path]:
    """One decode log per group; None is a room-less event."""
    paths = []
    for index, rooms in enumerate(groups):
        lines = [roomless_line(0)]
        for second, room in enumerate(rooms, start=1):
            lines.append(roomless_line(second) if room is None else aborted_line(room, second=second))
        path = directory / f"decode-{index}.log"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def check_every_output(directory: Path, groups: list[list[int | None]]) -> None:
    paths = write_files(directory, groups)
    rooms = [room for group in groups for room in group if room is not None]
    scan = fx.logs.scan(paths)
    events = scan.events
    assert str(events["room"].dtype) == "UInt64"
    found = events.loc[events["signature"] == "decode_transfer_aborted", "room"]
    assert sorted(int(r) for r in found) == sorted(rooms)
    assert events["room"].isna().sum() == len(events) - len(rooms)
    # timeline() is the same frame
    assert sorted(int(r) for r in fx.logs.timeline(paths)["room"].dropna()) == sorted(rooms)
    # summary facts and text
    summary = scan.summary()
    assert summary.facts["rooms_affected"] == sorted(set(rooms))
    text = str(summary) + scan._repr_html_()  # the summary and the verdict with its evidence
    for room in sorted(set(rooms))[:10]:
        assert str(room) in text
    # JSON: rooms are strings of digits, exactly
    status, stdout, stderr = invoke("logs", *map(str, paths), "--json", "--all",
                                    "--csv", str(directory / "events.csv"))
    document = json.loads(stdout)
    assert document["exit"] == status, stderr
    json_rooms = [e["room"] for e in document["events"] if e["signature"] == "decode_transfer_aborted"]
    assert all(isinstance(r, str) for r in json_rooms)
    assert sorted(map(int, json_rooms)) == sorted(rooms)
    assert document["summary"]["facts"]["rooms_affected"] == [str(r) for r in sorted(set(rooms))]
    # CSV: plain digits, read back exactly with an explicit dtype
    back = pd.read_csv(directory / "events.csv", dtype={"room": "UInt64"})
    assert sorted(int(r) for r in back["room"].dropna()) == sorted(rooms)
    # the terminal table, one line per event (wide enough not to fold a room), names the same rooms
    status, stdout, _ = invoke("logs", *map(str, paths), "--each", columns=250)
    for room in rooms:
        assert str(room) in stdout
    # grouped (the default): one line for every abort, its first room whole beside the count
    status, stdout, _ = invoke("logs", *map(str, paths), columns=250)
    aborts = [line.split() for line in stdout.splitlines() if " decode_transfer_aborted " in line]
    assert len(aborts) == (1 if rooms else 0), stdout
    if rooms:
        assert int(aborts[0][3]) in rooms
        assert (f"x{len(rooms)}" == aborts[0][4]) if len(rooms) > 1 else not aborts[0][4].startswith("x")


def test_room_beyond_float_precision_beside_roomless_events(tmp_path):
    check_every_output(tmp_path, [[None, ROOM, None]])


def test_rooms_at_and_above_two_to_the_63(tmp_path):
    check_every_output(tmp_path, [[None, *NEAR_TOP]])


def test_several_files_stay_exact_together(tmp_path):
    # One file has no room-less event between its rooms, the other has only room-less events:
    # concatenating them used to round the exact one.
    check_every_output(tmp_path, [[ROOM, ROOM + 1], [None, None], [2**64 - 1]])


def test_room_outside_the_unsigned_range_is_a_problem_not_a_crash(tmp_path):
    path = tmp_path / "decode.log"
    path.write_text(aborted_line(2**64) + "\n" + aborted_line(ROOM, second=2) + "\n")
    scan = fx.logs.scan(path)
    assert [int(r) for r in scan.events["room"].dropna()] == [ROOM]
    assert any("outside [0, 2**64)" in str(p) and p.line == 1 for p in scan.problems)
    status, stdout, stderr = invoke("logs", str(path), "--json")
    assert status == 0, stderr  # aborts are warnings; never a usage error (2) or a crash (5) as before
    document = json.loads(stdout)
    assert document["status"] == "warnings"
    assert any("outside [0, 2**64)" in p for p in document["problems"])


def test_trigger_of_the_generated_incident_is_exact(tmp_path):
    incident = gen.generate("0.5.15", steady_seconds=20, after_seconds=320)
    assert incident.trigger_room >= 2**53 or any(r >= 2**53 for r in incident.timeout_rooms)
    paths = gen.write_sglang_logs(incident, tmp_path)
    scan = fx.logs.scan([paths["prefill"], paths["decode"]])
    facts = scan.summary().facts
    assert facts["trigger"]["room"] == incident.trigger_room
    assert f"for room {incident.trigger_room} " in str(scan.summary())
    assert incident.trigger_room in set(int(r) for r in scan.events["room"].dropna())


@pytest.mark.thorough  # 25 random groups through every output (15 s): CI; the cases above are in every run
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.one_of(st.none(), st.integers(0, 2**64 - 1), st.sampled_from(NEAR_TOP)),
                         min_size=1, max_size=6), min_size=1, max_size=3))
def test_random_rooms_survive_every_output(groups):
    with tempfile.TemporaryDirectory() as directory:
        check_every_output(Path(directory), groups)


# ------------------------------------------------------------------ batch counters


def scan_batches(path: Path, compiled: bool) -> pd.DataFrame:
    """The batch frame through the compiled scanner or the pure-Python one."""
    saved = scanner._fastscan
    if not compiled:
        scanner._fastscan = None
    try:
        return fx.logs.scan(path).batches
    finally:
        scanner._fastscan = saved


def batch_lines(new_token: int, iteration: int, bootstrap: int) -> list[str]:
    return [f"[2025-07-01 12:00:0{i} TP0] " + gen.prefill_batch_line("0.5.15", 1, new_token + i, 0, 0, bootstrap + i, 0,
                                                                     10.0, iteration=iteration + i)
            for i in range(3)]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("value", [16777217, 2**53 + 1, 2**62 + 3])
def test_batch_counters_are_exact_int64(tmp_path, compiled, value):
    path = tmp_path / "prefill.log"
    path.write_text("\n".join(batch_lines(value, value, value)) + "\n")
    batches = scan_batches(path, compiled)
    for column in ("new_token", "iter", "bootstrap_req"):
        assert str(batches[column].dtype) == "Int64", column
        assert [int(v) for v in batches[column]] == [value, value + 1, value + 2], column


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_odd_counter_texts_are_read_as_written(tmp_path, compiled):
    """A sign, an exponent or a boolean under a counter is never silently turned into another number."""
    base = "[2025-07-01 12:00:0{i} TP0] " + gen.prefill_batch_line("0.5.15", 1, 100, 0, 0, 5, 0, 10.0)
    odd = [("#queue-req: 0", "#queue-req: -1", "queue_req", -1),
           ("#running-req: 0", "#running-req: 3.5e1", "running_req", None),
           ("#inflight-req: 0", "#inflight-req: True", "inflight_req", None)]
    lines = [base.format(i=0)] + [base.format(i=i).replace(old, new) for i, (old, new, _, _) in enumerate(odd, 1)]
    path = tmp_path / "prefill.log"
    path.write_text("\n".join(lines) + "\n")
    batches = scan_batches(path, compiled)
    assert len(batches) == 4
    for row, (_, _, column, expected) in enumerate(odd, 1):
        value = batches[column].iloc[row]
        assert (pd.isna(value) if expected is None else int(value) == expected), (column, value)
        assert int(batches["bootstrap_req"].iloc[row]) == 5  # the rest of the line still reads
