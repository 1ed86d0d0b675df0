"""Make docs/img/report-page.png: the first screen of a rendered postmortem report, in chromium.

    .venv/bin/python docs/img/make_report_screenshot.py [DIR]

writes ``report-page.png`` into DIR (default: ``$PD_FORENSICS_SCREENSHOTS``, else this folder).
The investigation is built as tests/test_report.py builds one, from realistic parts: evidence of
the wedge shaped as the collectors write it (an ABORT for a full-range room, the bootstrap thread's
death, /health still 200, a frozen bootstrap-queue gauge), its verdict from the real rules, the real
handler diff of sglang 0.5.15 read from its source (cached under the project's cache directory),
and a saved validation campaign. Debian's chromium is driven by Playwright (``executable_path``;
it cannot download a browser here).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from forensics import handlers  # noqa: E402
from forensics.diagnosis import decide  # noqa: E402
from forensics.evidence import Evidence, Gap  # noqa: E402
from forensics.report import Investigation, write_report  # noqa: E402
from tests.browser_helpers import chromium_executable, launch_chromium  # noqa: E402

T0 = pd.Timestamp("2026-11-30T03:00:00Z")
ROOM = 2**63 - 12345
RELEASE = "0.5.15"


def _t(seconds: float) -> pd.Timestamp:
    return T0 + pd.Timedelta(seconds=seconds)


def _evidence() -> Evidence:
    engines = pd.DataFrame({"name": ["prefill-0", "decode-0", "router-0"], "role": ["prefill", "decode", "router"],
                            "host": ["gpu-node-1", "gpu-node-2", "gpu-node-1"],
                            "url": ["http://10.0.0.11:30000", "http://10.0.0.12:30001", "http://10.0.0.11:8000"]})
    rows = []
    for i, outcome in enumerate(["ok", "pending", "pending"]):
        rows.append({"ts": _t(10 * i), "target": "router-0", "role": "router", "kind": "liveness",
                     "url": "http://10.0.0.11:8000/generate", "outcome": outcome,
                     "status": 200 if outcome == "ok" else None, "ttfb_s": None,
                     "total_s": 0.2 if outcome == "ok" else None, "waited_s": 0.2 if outcome == "ok" else 9.0,
                     "deadline_s": 5.0, "detail": ""})
    for i, (name, url) in enumerate([("prefill-0", "http://10.0.0.11:30000"), ("decode-0", "http://10.0.0.12:30001")]):
        rows.append({"ts": _t(30 + i), "target": name, "role": name.split("-")[0], "kind": "health",
                     "url": f"{url}/health", "outcome": "ok", "status": 200, "ttfb_s": 0.001,
                     "total_s": 0.001, "waited_s": 0.001, "deadline_s": 2.0, "detail": ""})
    probes = pd.DataFrame(rows)
    probes["status"] = probes["status"].astype("Int64")
    processes = pd.DataFrame({"engine": ["prefill-0", "decode-0"], "role": ["prefill", "decode"],
                              "host": ["gpu-node-1", "gpu-node-2"], "pid": pd.array([4100, 4200], dtype="Int64"),
                              "start_time": [T0 - pd.Timedelta(hours=6)] * 2,
                              "cmdline": ["sglang::scheduler", "sglang::scheduler"], "state": ["running", "running"],
                              "detail": ["", ""]})
    thread_check = pd.DataFrame({"engine": ["prefill-0"], "role": ["prefill"], "pid": [4100],
                                 "logical_name": ["bootstrap"], "thread_name": ["Thread-N (bootstrap_thread)"],
                                 "expected": ["1"], "found": [0], "status": ["missing"],
                                 "source": ["sglang/srt/disaggregation/nixl/conn.py:2348"]})
    death = _t(5)
    event_rows = [
        {"ts": death - pd.Timedelta(seconds=1), "engine": "decode-0", "role": "decode", "signature": "abort_sent",
         "room": ROOM, "thread": None, "source": "decode.log", "line": 18211,
         "message": f"Sent abort notification for room {ROOM}"},
        {"ts": death, "engine": "prefill-0", "role": "prefill", "signature": "thread_death", "room": None,
         "thread": "Thread-1 (bootstrap_thread)", "source": "prefill.log", "line": 90412,
         "message": "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?"},
    ]
    columns = ["ts", "engine", "role", "signature", "thread", "source", "line", "message"]
    events = pd.DataFrame([{k: row[k] for k in columns} for row in event_rows], columns=columns)
    events["ts"] = pd.to_datetime(events["ts"], utc=True)
    events["room"] = pd.array([row["room"] for row in event_rows], dtype="UInt64")
    samples = 6
    metrics = pd.DataFrame({
        "ts": pd.to_datetime([_t(10 * i) for i in range(samples)], utc=True),
        "role": pd.array(["prefill"] * samples, dtype="string"),
        "host": pd.array(["prefill-0"] * samples, dtype="string"),
        "url": pd.array(["http://10.0.0.11:30000/metrics"] * samples, dtype="string"),
        "metric": pd.array(["sglang:num_prefill_bootstrap_queue_reqs"] * samples, dtype="string"),
        "metric_canonical": pd.array(["sglang:num_prefill_bootstrap_queue_reqs"] * samples, dtype="string"),
        "type": pd.array(["gauge"] * samples, dtype="string"), "labels": pd.array([""] * samples, dtype="string"),
        "value": [7.0] * samples, "value_int": pd.array([7] * samples, dtype="Int64"),
        "value_text": pd.array(["7"] * samples, dtype="string"), "rate": [float("nan")] * samples,
        "scrape_ok": [True] * samples, "error": pd.array([pd.NA] * samples, dtype="string")})
    gaps = [Gap("threads", "decode-0 (gpu-node-2)", "py-spy is not installed on the host", "pip install py-spy")]
    return Evidence({"name": "pd-prod-eu1", "sglang": RELEASE, "backend": "nixl"},
                    {"engines": engines, "probes": probes, "processes": processes, "thread_check": thread_check,
                     "events": events, "metrics": metrics}, gaps,
                    window={"since": _t(-60).isoformat(), "until": _t(60).isoformat()},
                    collected_at=_t(60).isoformat())


def _campaign(folder: Path) -> Path:
    checks = [{"name": name, "cycle": 1, "status": "PASS", "reason": reason, "evidence": [], "kill_chain": []}
              for name, reason in (("liveness", "a one-token request completed in 0.4 s"),
                                   ("logs", "no thread death or GUARD assertion; 60 aborts sent"),
                                   ("thread", "bootstrap_thread alive"),
                                   ("counters", "abort and failure counters rose by 60, as the history says"))]
    doc = {"schema": "pd-forensics-campaign/1", "summary": "PASS: 1 cycle, 4 checks passed",
           "deployment": "pd-twin-patched", "target": f"twin {RELEASE} patched", "campaign": "PASS",
           "kill_chain": [], "aborts": 60, "cycles_planned": 1, "cycles_run": 1, "stopped": None,
           "started": _t(600).isoformat(), "finished": _t(660).isoformat(), "duration_s": 60.0, "options": {},
           "deploy": None, "cycles": [{"cycle": 1, "started": _t(601).isoformat(), "status": "PASS",
                                       "problem": None, "storm": None, "checks": checks}]}
    folder.mkdir(parents=True)
    (folder / "campaign.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder


def make(out_dir: Path) -> Path:
    executable = chromium_executable()
    if executable is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        evidence = _evidence()
        verdict = decide(evidence)
        inv = Investigation(work / "incident", target="pd-prod-eu1", release=RELEASE, backend="nixl",
                            title=f"Postmortem: NIXL prefill bootstrap thread died on ABORT (sglang {RELEASE})")
        inv.add_bundle(evidence)
        inv.add_verdict(verdict)
        inv.add_handler_diff(handlers.diff(RELEASE, confirm=True))
        inv.add_campaign(_campaign(work / "saved-campaign"))
        page_file = write_report(inv, work / "report", "html")["html"]
        out_dir.mkdir(parents=True, exist_ok=True)
        png = out_dir / "report-page.png"
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright, executable)
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 900}, device_scale_factor=1)
                page.goto(page_file.resolve().as_uri())
                page.screenshot(path=str(png))  # the first screen only: the title, facts and summary
            finally:
                browser.close()
    return png


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PD_FORENSICS_SCREENSHOTS")
                  or Path(__file__).resolve().parent)
    print(make(target))
