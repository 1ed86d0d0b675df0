"""The evidence bundle: Parquet frames plus a checksummed manifest, read back exactly."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import forensics.bundle as bundle
from forensics.bundle import BundleError
from forensics.evidence import Evidence, Gap

ROOMS = [7461092837465012345, 2**63 - 1, 2**63, 2**64 - 1]


def _evidence() -> Evidence:
    events = pd.DataFrame({
        "ts": pd.to_datetime(["2026-11-30T03:00:00.123456789Z"] * 4, utc=True),
        "engine": pd.array(["decode-0"] * 4, dtype="string"),
        "room": pd.array(ROOMS, dtype="UInt64"),
        "line": pd.array([1, 2, None, 4], dtype="Int64"),
    })
    threads = pd.DataFrame({"pid": [41, 41], "thread_name": ["MainThread", "Thread-1 (bootstrap_thread)"],
                            "frames": [["main (x.py:1)"], []], "locals": [{"a": 1}, None]})
    return Evidence(deployment={"name": "pd-prod-7", "sglang": "0.5.15"}, frames={"events": events, "threads": threads},
                    gaps=[Gap("logs", "router-0 (local)", "journalctl not found", "apt-get install systemd")],
                    commands=[{"host": "local", "argv": ["py-spy", "dump"], "state": "ok"}],
                    window={"since": "2026-11-30T02:30:00+00:00", "until": None}, collected_at="2026-11-30T03:01:00+00:00")


def test_round_trip_keeps_rooms_times_and_nested_values_exact(tmp_path):
    out = bundle.write(_evidence(), tmp_path / "incident 2026-11-30 (pd-prod-7)")
    back = bundle.open(out)
    events = back.frames["events"]
    assert str(events["room"].dtype) == "UInt64" and [int(r) for r in events["room"]] == ROOMS
    assert events["ts"].iloc[0] == pd.Timestamp("2026-11-30T03:00:00.123456789Z")
    assert events["line"].isna().tolist() == [False, False, True, False]
    threads = back.frames["threads"]
    assert threads["frames"].tolist() == [["main (x.py:1)"], []]
    assert threads["locals"].tolist() == [{"a": 1}, None]
    assert back.gaps == _evidence().gaps and back.commands == _evidence().commands
    assert back.deployment["name"] == "pd-prod-7" and back.window["since"].startswith("2026-11-30T02:30")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema"] == bundle.SCHEMA
    assert manifest["frames"]["events"]["rows"] == 4 and len(manifest["frames"]["events"]["sha256"]) == 64
    assert "probes" in manifest["missing_frames"]


def test_altered_or_incomplete_bundles_are_refused_naming_the_file(tmp_path):
    out = bundle.write(_evidence(), tmp_path / "b")
    frame_file = out / "frames" / "events.parquet"
    data = bytearray(frame_file.read_bytes())
    data[-20] ^= 0xFF
    frame_file.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"events\.parquet: checksum mismatch"):
        bundle.open(out)
    (out / "manifest.json").unlink()
    with pytest.raises(BundleError, match=r"manifest\.json: missing; not a bundle \(it holds 2 frame file"):
        bundle.open(out)
    with pytest.raises(BundleError, match="no such bundle folder"):
        bundle.open(tmp_path / "nowhere")


def test_never_writes_over_another_bundle(tmp_path):
    out = bundle.write(_evidence(), tmp_path / "b")
    with pytest.raises(BundleError, match="not an empty folder"):
        bundle.write(_evidence(), out)
