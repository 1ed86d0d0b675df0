"""Every verdict says what to do next: WEDGED how to recover (restart the wedged prefills, whose
SIGTERM does not finish; then the 0.5.15 decodes) and how to keep it from coming back (the fix, or
the first fixed release, held here against the handler matrix read from the releases' own source)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import forensics.logs as logs
from forensics.diagnosis import decide
from forensics.diagnosis.nextsteps import FIRST_FIXED_RELEASE, next_steps
from forensics.evidence import Evidence, Gap
from forensics.threads import check_threads, expected_threads, parse_dump
from forensics.threads import schema as thread_schema
from forensics.threads.dump import ThreadDump

DATA = Path(__file__).parent / "data" / "real-engine-0.5.15"


def _real_wedge_evidence(sglang: str | None) -> Evidence:
    import json
    from datetime import UTC, datetime

    scan = logs.scan([str(DATA / "prefill.log"), str(DATA / "decode.log")])
    events = scan.events.copy()
    events.insert(0, "engine", pd.array([f"{r}-0" for r in events["role"]], dtype="string"))
    data = json.loads((DATA / "prefill-scheduler-wedged.pyspy.json").read_text())
    columns = parse_dump(data, host="local", pid=14400, taken_at=datetime(2026, 12, 1, 23, 30, 20, tzinfo=UTC))
    dump = ThreadDump(host="local", pids=[14400], frame=thread_schema.build(columns))
    check = check_threads(dump, expected_threads("0.5.15", "nixl"), role="prefill").frame.copy()
    check.insert(0, "engine", pd.array(["prefill-0"] * len(check), dtype="string"))
    check["taken_at"] = pd.Timestamp("2026-12-01T23:30:20Z")
    engines = pd.DataFrame({"name": ["prefill-0", "decode-0"], "role": ["prefill", "decode"], "host": ["local"] * 2,
                            "url": ["http://127.0.0.1:51468", "http://127.0.0.1:36754"]})
    deployment = {"name": "real-0.5.15"} | ({"sglang": sglang} if sglang else {})
    return Evidence(deployment, {"engines": engines, "events": events, "thread_check": check})


def test_a_real_wedge_says_restart_the_prefill_then_the_0515_decodes_then_fix_or_upgrade():
    verdict = decide(_real_wedge_evidence("0.5.15"))
    assert verdict.verdict == "WEDGED"
    steps = verdict.next_steps
    assert steps[0].startswith("recover now: restart prefill-0.") and "will not finish a SIGTERM" in steps[0]
    assert steps[1].startswith("then restart the decodes: a 0.5.15 decode blocks")
    assert "forensics patch deploy --inventory INV" in steps[2] and f"upgrade to {FIRST_FIXED_RELEASE}" in steps[2]
    assert "--from 0.5.15 --to 0.5.16" in steps[2]
    assert verdict.to_dict()["next_steps"] == steps
    text = str(verdict)
    assert text.index("Next:") > text.index("Kill chain:")
    assert "<b>Next</b>" in verdict._repr_html_()


def test_a_decode_release_that_does_not_block_skips_the_decode_restart():
    steps = decide(_real_wedge_evidence("0.5.14")).next_steps
    assert len(steps) == 2 and not any("restart the decodes" in s for s in steps)
    unknown = decide(_real_wedge_evidence(None)).next_steps
    assert "if they run 0.5.15" in unknown[1]


def test_inconclusive_names_what_to_collect_and_healthy_says_nothing():
    gap = Gap("threads", "prefill-0 (local)", "py-spy is not installed", fix="pip install py-spy on local")
    evidence = Evidence({"name": "x"}, {}, gaps=[gap])
    assert next_steps("INCONCLUSIVE", [], evidence) == [
        "collect what was missing, then diagnose again: pip install py-spy on local"]
    assert next_steps("HEALTHY", [], evidence) == []
    assert next_steps("DOWN", [], evidence)[0].startswith("bring the engine back")


def test_the_first_fixed_release_is_the_one_the_releases_source_says():
    from forensics import handlers

    window = handlers.matrix(["0.5.15.post1", FIRST_FIXED_RELEASE], progress=False).window("nixl")
    assert window == ["0.5.15.post1"]  # vulnerable up to the one before, not the fixed one


def test_the_decodes_that_block_on_a_restarted_prefill_are_the_ones_the_source_says():
    from forensics.diagnosis.nextsteps import STALLING_DECODE_RELEASES
    from patched_engine.decode_hazard import release_blocks

    window = ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1")
    blocking = tuple(v for v in window if release_blocks(v) is not None)
    assert blocking == STALLING_DECODE_RELEASES
