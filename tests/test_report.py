"""The postmortem report: an Investigation folder in, Markdown, HTML and PDF out (docs/report.md).

The inputs are built by hand (no twin): an Evidence shaped as the collectors write it (a wedge:
an ABORT for a full-range 63-bit room, the bootstrap thread's death, health still 200, a frozen
bootstrap-queue gauge), its verdict from the real rules, a saved handler diff and a saved
campaign, with a token planted in every textual input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from report_checks import check_gauge_sentences

from forensics.diagnosis import decide
from forensics.evidence import Evidence, Gap
from forensics.report import Investigation, write_report
from forensics.report.blocks import PLACEHOLDER_MARK

T0 = pd.Timestamp("2026-11-30T03:00:00Z")
ROOM = 2**63 - 12345  # a full-range bootstrap room: float would turn it into 9223372036854763520
TOKEN = "hf_PLANTEDsecretTOKEN0123456789abcdefXYZ"
SECRET = "s3cr3t-planted-password"
REPO = Path(__file__).resolve().parents[1]


def _t(seconds: float) -> pd.Timestamp:
    return T0 + pd.Timedelta(seconds=seconds)


def _evidence() -> Evidence:
    engines = pd.DataFrame({"name": ["prefill-0", "decode-0", "router-0"], "role": ["prefill", "decode", "router"],
                            "host": ["local"] * 3, "url": ["http://127.0.0.1:1", "http://127.0.0.1:2",
                                                            "http://127.0.0.1:3"]})
    rows = []
    for i, outcome in enumerate(["ok", "pending", "pending"]):
        rows.append({"ts": _t(10 * i), "target": "router-0", "role": "router", "kind": "liveness", "url": "http://r",
                     "outcome": outcome, "status": 200 if outcome == "ok" else None, "ttfb_s": None,
                     "total_s": 0.2 if outcome == "ok" else None, "waited_s": 0.2 if outcome == "ok" else 9.0,
                     "deadline_s": 5.0, "detail": ""})
    for i, name in enumerate(["prefill-0", "decode-0"]):
        rows.append({"ts": _t(30 + i), "target": name, "role": name.split("-")[0], "kind": "health",
                     "url": f"http://{name}/health", "outcome": "ok", "status": 200, "ttfb_s": 0.001,
                     "total_s": 0.001, "waited_s": 0.001, "deadline_s": 2.0, "detail": ""})
    probes = pd.DataFrame(rows)
    probes["status"] = probes["status"].astype("Int64")
    processes = pd.DataFrame({"engine": ["prefill-0", "decode-0"], "role": ["prefill", "decode"],
                              "host": ["local", "local"], "pid": pd.array([100, 200], dtype="Int64"),
                              "start_time": [T0 - pd.Timedelta(hours=1)] * 2,
                              "cmdline": ["sglang::scheduler", "sglang::scheduler"], "state": ["running", "running"],
                              "detail": ["", ""]})
    thread_check = pd.DataFrame({"engine": ["prefill-0"], "role": ["prefill"], "pid": [100],
                                 "logical_name": ["bootstrap"], "thread_name": ["Thread-N (bootstrap_thread)"],
                                 "expected": ["1"], "found": [0], "status": ["missing"],
                                 "source": ["sglang/srt/disaggregation/nixl/conn.py:1234"]})
    death = _t(5)
    event_rows = [
        {"ts": death - pd.Timedelta(seconds=1), "engine": "decode-0", "role": "decode", "signature": "abort_sent",
         "room": ROOM, "thread": None, "source": "decode.log", "line": 10,
         "message": f"Sent abort notification for room {ROOM} Authorization: Bearer {TOKEN}"},
        {"ts": death, "engine": "prefill-0", "role": "prefill", "signature": "thread_death", "room": None,
         "thread": "Thread-1 (bootstrap_thread)", "source": "prefill.log", "line": 20,
         "message": "AssertionError: First message should be GUARD. Foreign traffic?"},
    ]
    columns = ["ts", "engine", "role", "signature", "thread", "source", "line", "message"]
    events = pd.DataFrame([{k: row[k] for k in columns} for row in event_rows], columns=columns)
    events["ts"] = pd.to_datetime(events["ts"], utc=True)
    events["room"] = pd.array([row["room"] for row in event_rows], dtype="UInt64")  # never through float
    metrics = pd.DataFrame({
        "ts": pd.to_datetime([_t(0), _t(10), _t(20)], utc=True),
        "role": pd.array(["prefill"] * 3, dtype="string"), "host": pd.array(["prefill-0"] * 3, dtype="string"),
        "url": pd.array(["http://127.0.0.1:1/metrics"] * 3, dtype="string"),
        "metric": pd.array(["sglang:num_prefill_bootstrap_queue_reqs"] * 3, dtype="string"),
        "metric_canonical": pd.array(["sglang:num_prefill_bootstrap_queue_reqs"] * 3, dtype="string"),
        "type": pd.array(["gauge"] * 3, dtype="string"), "labels": pd.array([""] * 3, dtype="string"),
        "value": [7.0, 7.0, 7.0], "value_int": pd.array([7, 7, 7], dtype="Int64"),
        "value_text": pd.array(["7"] * 3, dtype="string"), "rate": [float("nan")] * 3, "scrape_ok": [True] * 3,
        "error": pd.array([pd.NA] * 3, dtype="string")})
    # A histogram whose name says "queue": its bucket and its _created timestamp are no queue depth.
    histogram = metrics.iloc[:2].copy()
    histogram["metric"] = histogram["metric_canonical"] = pd.array(
        ["sglang:queue_time_seconds_bucket", "sglang:queue_time_seconds_created"], dtype="string")
    histogram["type"] = pd.array(["histogram"] * 2, dtype="string")
    histogram["value"] = [3.0, 1796150000.0]
    metrics = pd.concat([metrics, histogram], ignore_index=True)
    gaps = [Gap("settings", "prefill-0 (local)", f"server args unreadable (api_key={SECRET})", "pip install py-spy")]
    return Evidence({"name": "pd-test", "sglang": "0.5.15", "backend": "nixl"},
                    {"engines": engines, "probes": probes, "processes": processes, "thread_check": thread_check,
                     "events": events, "metrics": metrics}, gaps,
                    window={"since": _t(-60).isoformat(), "until": _t(40).isoformat()},
                    collected_at=_t(40).isoformat())


def _handler_diff(folder: Path) -> Path:
    cell = {"fate": "assert", "detail": "", "summary": "", "location": "nixl/conn.py:1301"}
    rows = [{"role": "prefill", "tag": "ABORT", "senders": ["decode"], "gap": True,
             "cells": {"nixl": cell, "mooncake": dict(cell, fate="handled", location="mooncake/conn.py:880")}},
            {"role": "prefill", "tag": "GUARD", "senders": ["decode"], "gap": False,
             "cells": {"nixl": dict(cell, fate="handled"), "mooncake": dict(cell, fate="handled")}}]
    finding = {"version": "0.5.15", "backend": "nixl", "severity": "critical", "kind": "unhandled-tag",
               "tag": "ABORT", "receiver_role": "prefill", "fate": "assert",
               "summary": f"the decode sends ABORT, the NIXL prefill loop has no case for it: thread dies "
                          f"(found with --hf-token {TOKEN})",
               "sender": "decode", "receiver": "bootstrap_thread", "file": "sglang/srt/disaggregation/nixl/conn.py",
               "line": 1301, "conditions": [], "confirmation": "died", "caveat": ""}
    folder.mkdir(parents=True)
    doc = {"version": "0.5.15", "a": "nixl", "b": "mooncake", "verdict": "findings", "unreadable": [],
           "loops": {}, "protection": {}, "rows": rows, "findings": [finding]}
    (folder / "diff.json").write_text(json.dumps(doc), encoding="utf-8")
    (folder / "diff.html").write_text("<p>diff</p>", encoding="utf-8")
    return folder


def _campaign(folder: Path) -> Path:
    checks = [{"name": name, "cycle": 1, "status": "PASS", "reason": reason, "evidence": [], "kill_chain": []}
              for name, reason in (("liveness", "a one-token request completed in 0.4 s"),
                                   ("logs", f"no thread death; 60 aborts (password={SECRET})"),
                                   ("thread", "bootstrap_thread alive"))]
    doc = {"schema": "pd-forensics-campaign/1", "summary": "PASS: 1 cycle, 3 checks passed",
           "deployment": "pd-twin-patched", "target": "twin 0.5.15 patched", "campaign": "PASS", "kill_chain": [],
           "aborts": 60, "cycles_planned": 1, "cycles_run": 1, "stopped": None,
           "started": _t(100).isoformat(), "finished": _t(160).isoformat(), "duration_s": 60.0, "options": {},
           "deploy": None, "cycles": [{"cycle": 1, "started": _t(101).isoformat(), "status": "PASS",
                                       "problem": None, "storm": None, "checks": checks}]}
    folder.mkdir(parents=True)
    (folder / "campaign.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def investigation(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("inv")
    evidence = _evidence()
    verdict = decide(evidence)
    assert verdict.verdict == "WEDGED"
    inv = Investigation(base / "incident", target="pd-test", release="0.5.15", backend="nixl")
    inv.add_bundle(evidence)
    inv.add_verdict(verdict)
    inv.add_handler_diff(_handler_diff(base / "saved-diff"))
    inv.add_campaign(_campaign(base / "saved-campaign"))
    from matplotlib.figure import Figure

    figure = Figure(figsize=(3, 2))
    axes = figure.add_subplot(1, 1, 1)
    axes.plot([0, 1, 2], [7, 7, 7])
    axes.set_xlabel("time (s)")
    axes.set_ylabel("requests (count)")
    inv.add_plot(figure, "queue", "bootstrap queue (requests) over time (s)")
    return inv.directory


def _read(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def written(investigation, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "report"
    write_report(investigation, out, "md,html")
    return out


def test_the_investigation_reads_back_with_its_documented_manifest(investigation):
    import tomllib

    doc = tomllib.loads((investigation / "investigation.toml").read_text())
    assert doc["schema"] == "pd-forensics-investigation/1"
    assert doc["investigation"]["target"] == "pd-test" and doc["investigation"]["release"] == "0.5.15"
    assert {p["kind"] for p in doc["part"]} == {"evidence", "verdict", "handler_diff", "campaign", "plot"}
    again = Investigation(investigation)
    assert again.verdicts()["incident"]["verdict"] == "WEDGED"
    assert again.evidence().frame("events")["room"].iloc[0] == ROOM
    assert again.campaigns()["validation"]["campaign"] == "PASS"
    assert "<svg" in again.plots()["queue"]
    assert again.missing() == []


def test_markdown_and_html_are_byte_identical_across_runs_and_time_zones(investigation, written, tmp_path):
    write_report(investigation, tmp_path / "again", "md,html")
    first = _read(written)
    assert {"report.md", "report.html"} <= set(first) and any(k.startswith("plots/") for k in first)
    assert _read(tmp_path / "again") == first
    for tz in ("America/New_York", "Asia/Kolkata"):
        out = tmp_path / f"tz-{tz.replace('/', '-')}"
        result = _cli(["report", "--investigation", str(investigation), "--out", str(out), "--format", "md,html"],
                      env={"TZ": tz})
        assert result.returncode == 0, result.stderr
        assert _read(out) == first, tz


SECTIONS = ("Summary", "Impact", "Root cause", "Trigger", "Detection", "Resolution", "Timeline", "Action items",
            "Lessons learned", "Appendix A: kill chain", "Appendix C: handler diff", "Appendix D: validation campaign")


def test_every_sre_section_is_there_with_the_evidence_behind_it(written):
    md = (written / "report.md").read_text()
    html = (written / "report.html").read_text()
    for title in SECTIONS:
        assert f"## {title}" in md, title
        assert f">{title}" in html, title
    assert "Requests affected:" in md and "2 of 3 liveness probe(s)" in md and "Duration: at least" in md
    assert "health probe(s) answered 200 while the verdict was WEDGED" in md
    assert "stayed at 7 over 3 sample(s)" in md  # the frozen gauge
    assert "queue_time_seconds" not in md and "1.79615e+09" not in md  # a histogram is no gauge
    assert "NIXL prefill loop has no case for it" in md and "sglang/srt/disaggregation/nixl/conn.py:1301" in md
    assert "| Handle ABORT in the nixl prefill bootstrap loop | prevent |   |" in md  # owner left blank
    assert "| 1 | liveness | PASS |" in md  # the campaign table
    assert "2026-11-30 03:00:04.000 UTC" in md  # times in UTC, one format
    assert html.count("data:image/svg+xml;base64,") == 4  # timeline, probes, gauges, the saved plot: embedded
    assert 'id="plot-timeline"' in html and "plots/timeline.svg" in md
    assert "<link" not in html and "<script" not in html and "src=\"http" not in html  # self-contained


def test_the_deciding_finding_leads_the_root_cause(investigation, tmp_path):
    # The release's real diff: Mooncake's unknown-frame findings sort before NIXL's by name, but
    # the ABORT the NIXL loop has no case for is what decided the incident, so it comes first.
    import shutil

    import forensics as fx

    copy = tmp_path / "incident"
    shutil.copytree(investigation, copy)
    Investigation(copy).add_handler_diff(fx.handlers.diff("0.5.15"))
    write_report(copy, tmp_path / "report", "md")
    root_cause = (tmp_path / "report" / "report.md").read_text().split("## Root cause", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in root_cause.splitlines() if line.startswith("| ") and not line.startswith("| backend")
            and not line.startswith("|---")]
    assert len(rows) == 4 and "| ABORT |" in rows[0], rows


def test_what_the_evidence_cannot_say_is_a_marked_placeholder_with_backed_facts_only(written):
    md = (written / "report.md").read_text()
    lessons = md.split("## Lessons learned")[1].split("## Appendix A")[0]
    for prompt in ("What went well?", "What went wrong?", "Where did we get lucky?"):
        assert f"> **[{PLACEHOLDER_MARK}]** {prompt}" in lessons
    assert "Time from the first signal (2026-11-30 03:00:04.000 UTC) to the verdict" in lessons
    assert "(the evidence backs no fact here)" in lessons  # luck: nothing pre-filled
    assert f"[{PLACEHOLDER_MARK}]" in (written / "report.html").read_text()


def test_the_kill_chain_keeps_the_room_digits_exact(written):
    md = (written / "report.md").read_text()
    html = (written / "report.html").read_text()
    chain = md.split("## Appendix A: kill chain")[1].split("## Appendix B")[0]
    assert f"1. abort_sent for room {ROOM} on the decode" in chain
    assert f"abort_sent room {ROOM}" in md.split("## Timeline")[1]
    assert f"room {ROOM}" in html
    assert str(float(ROOM)) not in md and "9223372036854763520" not in md + html


def test_no_planted_secret_survives(written):
    for name, data in _read(written).items():
        text = data.decode("utf-8")
        assert TOKEN not in text and SECRET not in text, name
    md = (written / "report.md").read_text()
    assert "<redacted>" in md or "&lt;redacted&gt;" in md


def test_a_missing_input_exits_3_naming_it(investigation, tmp_path):
    import shutil

    result = _cli(["report", "--investigation", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")])
    assert result.returncode == 3 and "investigation.toml" in result.stderr
    broken = tmp_path / "broken"
    shutil.copytree(investigation, broken)
    (broken / "verdicts" / "incident.json").unlink()
    result = _cli(["report", "--investigation", str(broken), "--out", str(tmp_path / "o"), "--format", "md",
                   "--json"])
    assert result.returncode == 3, result.stderr
    assert str(broken / "verdicts" / "incident.json") in result.stderr
    doc = json.loads(result.stdout)
    assert doc["exit"] == 3 and "incident.json" in doc["error"]


def test_an_unwritable_output_exits_4(investigation, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = _cli(["report", "--investigation", str(investigation), "--out", str(blocker / "report"),
                   "--format", "md"])
    assert result.returncode == 4, result.stderr
    assert str(blocker) in result.stderr


def _weasyprint_reason() -> str | None:
    try:
        import weasyprint  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"weasyprint cannot be imported here: {exc}"
    return None


@pytest.mark.skipif(_weasyprint_reason() is not None, reason=str(_weasyprint_reason()))
def test_the_pdf_is_the_same_on_every_run_and_has_no_secret(investigation, tmp_path):
    from forensics.report import html as html_render
    from forensics.report import pdf_text
    from forensics.report.postmortem import build

    a = write_report(investigation, tmp_path / "a", "pdf")["pdf"]
    b = write_report(investigation, tmp_path / "b", "pdf")["pdf"]
    assert a.read_bytes()[:5] == b"%PDF-" and a.read_bytes() == b.read_bytes()  # even byte-identical
    page = html_render.render(build(Investigation(investigation)))
    text = pdf_text(page)
    assert text == pdf_text(page)
    assert "Root cause" in text and str(ROOM) in text and TOKEN not in text and SECRET not in text


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``forensics ARGS`` in a child; through a one-command group until ``report`` is registered."""
    from forensics.cli import SUBCOMMANDS

    if "report" in SUBCOMMANDS:
        argv = [sys.executable, "-m", "forensics", *args]
    else:
        argv = [sys.executable, "-c", "import sys, click\nfrom forensics.cli import contract\n"
                "from forensics.cli.report_cmd import command\n"
                "contract.run(click.Group(commands={'report': command}), sys.argv[1:])", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "MPLBACKEND": "Agg", **(env or {})})


def test_without_weasyprint_the_pdf_is_an_environment_problem_naming_it(investigation, tmp_path, monkeypatch):
    from forensics.exitcodes import EnvironmentProblem

    monkeypatch.setitem(sys.modules, "weasyprint", None)  # import weasyprint now raises ImportError
    with pytest.raises(EnvironmentProblem, match="weasyprint") as caught:
        write_report(investigation, tmp_path / "out", "md,pdf")
    assert caught.value.exit_status == 4
    assert not (tmp_path / "out" / "report.md").exists()  # nothing half written


def test_an_investigation_without_verdict_or_evidence_is_undecided(tmp_path):
    from forensics.exitcodes import Undecided

    Investigation(tmp_path / "empty", target="pd-test")
    with pytest.raises(Undecided, match="no verdict and no evidence bundle"):
        write_report(tmp_path / "empty", tmp_path / "out", "md")


def test_the_timeline_plot_draws_each_role_and_signature_with_its_units():
    import forensics as fx

    events = _evidence().frame("events")
    svg = fx.report.timeline_plot(events, T0)
    # Glyphs are paths; matplotlib keeps each text as a comment beside them.
    for text in ("time since 2026-11-30 03:00:00.000 UTC (s)", "role (engine log)", "Log events by role",
                 "prefill", "decode", "abort_sent", "thread_death"):
        assert f"<!-- {text} -->" in svg, text
    assert fx.report.timeline_plot(events, T0) == svg  # the same frame, the same bytes
    assert TOKEN not in svg and str(ROOM) not in svg  # messages and rooms are not drawn
    assert fx.report.timeline_plot(events.iloc[:0], T0) is None
    assert fx.report.timeline_plot(None, T0) is None and fx.report.timeline_plot(events, None) is None
    untimed = events.assign(ts=pd.NaT)
    assert fx.report.timeline_plot(untimed, T0) is None


def test_every_gauge_sentence_holds_on_the_series_it_names(written):
    evidence = _evidence()
    md = (written / "report.md").read_text()
    assert check_gauge_sentences(md, evidence.frames["metrics"], _t(5)) == 1
    assert "2 of them after the bootstrap thread died at 03:00:05" in md


def test_a_gauge_that_stays_at_zero_on_a_healthy_deployment_is_not_called_frozen(tmp_path):
    # No death in the evidence: a constant gauge is a fact, "it never moved after the death" is not.
    evidence = _evidence()
    evidence.frames["events"] = evidence.frames["events"].iloc[:0]
    metrics = evidence.frames["metrics"]
    gauge = metrics["type"] == "gauge"
    metrics.loc[gauge, "value"] = 0.0
    metrics["value_int"] = metrics["value_int"].where(~gauge, 0)
    investigation = Investigation(tmp_path / "quiet", target="pd-test", release="0.5.15", backend="nixl")
    investigation.add_bundle(evidence)
    investigation.add_verdict(decide(evidence))
    out = tmp_path / "out"
    write_report(investigation.directory, out, "md")
    md = (out / "report.md").read_text()
    assert check_gauge_sentences(md, metrics, None) == 1
    assert "stayed at 0 over 3 sample(s)" in md and "died" not in md.split("Why health and the gauges")[1][:400]
