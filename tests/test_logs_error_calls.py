"""sglang's own error calls against the catalogue: every one is placed, and its lines are never silent.

For each release of the catalogue's window (the vulnerable releases and the fixed ones after them),
every ``logger.error`` / ``exception`` / ``critical`` call of the PD modules, and every ``warning``
call in ``disaggregation/``, is read from the release's source (``forensics.logs.source_errors``).
The table of where each lands (a hand entry, an entry derived from the call, or unrecognisable: too
little literal text) is printed, with its counts; then each recognisable message, rendered with
representative values and written as sglang writes a line, is scanned as a log: one event per line,
of the entry the table names, and a log holding an error is never clean.
"""

from __future__ import annotations

import pytest

from forensics import logs
from forensics.logs import catalogue, source_errors
from forensics.logs.error_placement import placement
from forensics.logs.findings import assess, finding_classes
from forensics.logs.source_messages import ROOM

RELEASES = source_errors.SHIPPED
# Messages in disaggregation/ too short to be told from other lines, per release (measured): a
# regression guard; each is listed by the test. ``Server error: {e}``, ``{e}``, ...
MOST_UNRECOGNISABLE_IN_DISAGGREGATION = 12


@pytest.fixture(scope="module", params=RELEASES)
def table(request):
    version = request.param
    found = placement(version, offline=False)
    print(f"\nsglang {version}: {len(found)} error calls in the PD modules")
    print(found.to_string(max_colwidth=70, index=False))
    print(found.groupby(["placed", found["file"].str.startswith("disaggregation/")]).size().to_string())
    return version, found


def test_every_call_is_placed_and_only_outside_disaggregation_unclassified(table):
    version, found = table
    assert len(found) > 100, f"sglang {version}: only {len(found)} error calls read"
    assert set(found["placed"]) <= {"catalogue", "derived", "unrecognisable"}
    inside = found[found["file"].str.startswith("disaggregation/")]
    unclassified = found[found["entry"] == source_errors.UNCLASSIFIED]
    print(f"sglang {version}: {len(unclassified)} calls are unclassified_error, all outside disaggregation/")
    assert not unclassified["file"].str.startswith("disaggregation/").any()
    placed_inside = inside[inside["placed"] != "unrecognisable"]
    assert (placed_inside["step"] != "").all() and (placed_inside["entry"] != "").all()
    assert set(placed_inside["step"]) <= set(catalogue.STEPS)
    lost = inside[inside["placed"] == "unrecognisable"]
    print(f"sglang {version}: unrecognisable in disaggregation/:\n{lost.to_string(index=False)}")
    assert len(lost) <= MOST_UNRECOGNISABLE_IN_DISAGGREGATION
    # The hand entries the incident turns on are found where sglang writes them.
    hand = set(found.loc[found["placed"] == "catalogue", "entry"])
    assert {"decode_transfer_failed", "prefill_transfer_failed", "heartbeat_lost"} <= hand, sorted(hand)


def test_every_derived_class_is_a_finding_class():
    claimed = {s for cls in finding_classes() for s in cls.signatures}
    assert set(source_errors.derived_ids()) <= claimed


def test_each_recognisable_call_written_as_sglang_writes_it_is_its_own_event(table, tmp_path):
    """One log line per recognisable call (sglang's prefix, the rendered message): each is one event,
    of the entry the table names (a hand entry or the derived class), with its 1-based line."""
    version, found = table
    source = {c.rendering: c for c in source_errors.error_calls(logs_source(version)) if c.recognisable}
    wanted = found[found["placed"] != "unrecognisable"]
    renderings = [c.rendering for c in source.values()]
    path = tmp_path / f"sglang-{version}-every-error.log"
    path.write_text("".join(f"[2026-12-01 03:{i // 60 % 60:02d}:{i % 60:02d}] {r}\n" for i, r in enumerate(renderings)))
    scan = logs.scan([str(path)], role="decode")
    events = scan.events
    by_line = {int(line): sig for line, sig in zip(events["line"], events["signature"])}
    missing = [(i + 1, r) for i, r in enumerate(renderings) if (i + 1) not in by_line]
    assert not missing, f"sglang {version}: {len(missing)} lines made no event, e.g. {missing[:3]}"
    classes = set(wanted["entry"])
    assert set(by_line.values()) <= classes | {"python_traceback"}, set(by_line.values()) - classes
    assert assess(scan).word == "findings"  # error lines are never clean


def test_a_derived_line_is_exact_about_its_room_and_says_where_it_comes_from(tmp_path):
    """A line only a derived entry knows (the decode's context-corruption error of 0.5.15): an event
    whose meaning names the file and the lines per release, whose room stays exact in the message."""
    line = (f"[2026-12-01 03:00:00] Context corruption detected: Request 9f1c (bootstrap_room={ROOM}) received "
            f"metadata from bootstrap_room={ROOM - 1}. Metadata buffer index: 17. This indicates metadata buffer "
            f"index collision.")
    path = tmp_path / "decode.log"
    path.write_text(line + "\n")
    scan = logs.scan([str(path)], role="decode")
    assert list(scan.events["signature"]) == ["decode_disaggregation_error"]
    meaning = next(s.meaning for s in catalogue.event_signatures() if s.id == "decode_disaggregation_error"
                   and s.regex.search(line))
    assert "disaggregation/decode.py" in meaning and "0.5.15" in meaning
    assert str(ROOM) in scan.events["message"].iloc[0]
    judged = assess(scan)
    assert judged.word == "findings" and [f.id for f in judged.findings] == ["disaggregation_errors"]


def test_the_catalogue_holds_the_cached_releases_and_one_named_later():
    held = catalogue.derived_releases()
    assert set(held) == set(source_errors.cached_releases())
    assert "0.5.15" in held  # ./run test prepares the window before pytest


def logs_source(version: str):
    from forensics import sglang_source

    return sglang_source.fetch(version, offline=False)


def _logs_cli(*args, env=None):
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "forensics", "logs", *args, "--json"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})
    return done, (json.loads(done.stdout) if done.stdout.strip() else None)


def test_the_cli_names_the_releases_it_knows_and_takes_one_more(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text("[2026-12-01 03:00:00] Request 9f1c exceeds the maximum number of tokens: 9000 > 8192\n")
    done, document = _logs_cli(str(log), "--sglang", "0.5.12")
    assert done.returncode == 1, done.stderr
    assert "0.5.12" in document["error_calls_from"] and "0.5.15" in document["error_calls_from"]
    assert document["event_counts"] == {"disaggregation_error": 1}  # written by the decode and the prefill
    done, _ = _logs_cli(str(log), "--sglang", "9.9.9")
    assert done.returncode == 2 and "--sglang" in done.stderr and "9.9.9" in done.stderr


def test_without_any_release_source_the_output_says_what_it_cannot_know(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text("[2026-12-01 03:00:00] Request 9f1c exceeds the maximum number of tokens: 9000 > 8192\n")
    done, document = _logs_cli(str(log), env={"PD_FORENSICS_CACHE": str(tmp_path / "empty-cache")})
    assert document["error_calls_from"] == []
    assert any("--sglang VERSION" in note for note in document["notes"]), document["notes"]
    assert document["verdict"]["verdict"] == "inconclusive" and done.returncode == 3  # never clean by default
    assert any("--sglang VERSION" in reason for reason in document["verdict"]["reasons"])
