"""Real journal files, written by systemd-journal-remote and read back through journalctl."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

import forensics as fx
from forensics.logs import incident as gen

JOURNAL_REMOTE = Path("/lib/systemd/systemd-journal-remote")
pytestmark = pytest.mark.skipif(
    not JOURNAL_REMOTE.exists() or shutil.which("journalctl") is None,
    reason="needs Debian's systemd-journal-remote and journalctl (./run test installs them as root)",
)


@pytest.fixture(scope="module")
def journal_file(tmp_path_factory):
    incident = gen.generate("0.5.15", steady_seconds=30, after_seconds=330)
    directory = tmp_path_factory.mktemp("journal")
    export = gen.write_journal_export(incident, directory / "pd.export")
    output = directory / "pd.journal"
    subprocess.run([str(JOURNAL_REMOTE), f"--output={output}", "--split-mode=none", str(export)],
                   check=True, capture_output=True, timeout=120)
    return incident, output


def test_journal_file_gives_the_incident_with_journal_times(journal_file):
    incident, path = journal_file
    scan = fx.logs.scan(path)
    assert scan.sources.iloc[0]["format"] == "json"
    death = scan.events[scan.events["signature"] == "thread_death"].iloc[0]
    assert death["thread"] == "Thread-5 (bootstrap_thread)"
    assert death["ts"] == pd.Timestamp(incident.death_ts)
    assert death["ts_source"] == "journal"
    assert death["unit"] == "sglang-prefill.service" and death["role"] == "prefill"
    assert death["host"] == "pd-node-1"
    trigger = scan.events[scan.events["signature"] == "decode_transfer_aborted"].iloc[0]
    assert trigger["room"] == incident.trigger_room and trigger["role"] == "decode"
    assert sorted(scan.events.loc[scan.events["signature"] == "decode_transfer_timeout", "room"]) == sorted(
        incident.timeout_rooms)
    assert set(scan.batches["role"]) == {"prefill", "decode"}
    assert scan.lines_unknown == 0


def test_directory_of_journal_files(journal_file):
    incident, path = journal_file
    scan = fx.logs.scan(path.parent)
    # the export text in the same directory is read as a file too; the journal is read via journalctl
    journal_rows = scan.sources[scan.sources["format"] == "json"]
    assert len(journal_rows) == 1
    from_journal = scan.events[scan.events["source"] == journal_rows["source"].iloc[0]]
    assert (from_journal["signature"] == "thread_death").sum() == 1
    alone = fx.logs.scan(path)
    assert from_journal["signature"].value_counts().to_dict() == alone.events["signature"].value_counts().to_dict()


def test_a_file_that_is_not_a_journal_is_a_named_problem(tmp_path):
    # Named like a journal, but text: read by its content, as a text line in no known format.
    fake = tmp_path / "broken.journal"
    fake.write_bytes(b"not a journal at all")
    scan = fx.logs.scan(fake)
    assert scan.sources["format"].tolist() == ["plain"] and scan.lines_total == 1 and scan.lines_unknown == 1
    assert not any("journalctl" in str(p) or "empty" in str(p) for p in scan.problems)
    assert any(p.line == 1 and str(fake) in str(p) and "no known format" in p.message for p in scan.problems)
    assert len(scan.events) == 0


def _export_entry(us: int, message: str, unit: str = "mooncake-decode.service") -> str:
    return (f"__REALTIME_TIMESTAMP={us}\n_HOSTNAME=pd-node-2\n_SYSTEMD_UNIT={unit}\nSYSLOG_IDENTIFIER=python3\n"
            f"MESSAGE={message}\n\n")


def test_glog_error_lines_in_a_journal_are_each_an_event_and_never_clean(tmp_path):
    """Mooncake's transfer engine logs through glog: in journalctl's JSON a glog line's MESSAGE
    starts with its level letter, which the prefilter must find on the raw record."""
    start = 1_764_590_400_000_000
    entries = [_export_entry(start + i * 1_000_000, f"[2025-12-01 12:00:{i:02d}] INFO:     127.0.0.1:5{i:04d} - "
                             f'"GET /health HTTP/1.1" 200 OK') for i in range(20)]
    entries += [_export_entry(start + 30_000_000 + i, f"E1201 12:00:30.{i:06d}  4242 rdma_transport.cpp:{300 + i}] "
                              f"Failed to register memory {i}") for i in range(8)]
    export = tmp_path / "mooncake.export"
    export.write_text("".join(entries))
    output = tmp_path / "decode.journal"
    subprocess.run([str(JOURNAL_REMOTE), f"--output={output}", "--split-mode=none", str(export)],
                   check=True, capture_output=True, timeout=120)
    scan = fx.logs.scan(output)
    assert scan.sources.iloc[0]["format"] == "json"
    glog = scan.events[scan.events["signature"] == "glog_error"]
    assert len(glog) == 8 and sorted(glog["line"].tolist()) == list(range(21, 29))
    assert (glog["unit"] == "mooncake-decode.service").all()
    assert scan.assess().word == "findings"  # an error-level class, never clean
