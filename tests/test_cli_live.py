"""The collect / diagnose / watch commands: arguments, exit statuses and output shapes."""

from __future__ import annotations

import json

import pandas as pd
from cli_helpers import invoke

import forensics.bundle as bundle
from forensics.evidence import Evidence, Gap

T0 = pd.Timestamp("2026-11-30T03:00:00Z")


def _wedged_bundle(path):
    probes = pd.DataFrame({
        "ts": [T0, T0 + pd.Timedelta(seconds=1), T0 + pd.Timedelta(seconds=2)], "target": ["router-0", "prefill-0", "decode-0"],
        "role": ["router", "prefill", "decode"], "kind": ["liveness", "health", "health"], "url": ["u", "u", "u"],
        "outcome": ["late", "ok", "ok"], "status": pd.array([None, 200, 200], dtype="Int64"),
        "ttfb_s": [None, 0.001, 0.001], "total_s": [None, 0.001, 0.001], "waited_s": [9.0, 0.001, 0.001],
        "deadline_s": [5.0, 2.0, 2.0], "detail": ["", "", ""]})
    check = pd.DataFrame({"engine": ["prefill-0"], "role": ["prefill"], "pid": [4242], "logical_name": ["bootstrap"],
                          "thread_name": ["Thread-N (bootstrap_thread)"], "expected": ["1"], "found": [0],
                          "status": ["missing"], "source": ["sglang/srt/disaggregation/nixl/conn.py:2383"]})
    engines = pd.DataFrame({"name": ["prefill-0", "decode-0", "router-0"], "role": ["prefill", "decode", "router"],
                            "host": ["local"] * 3, "url": ["u"] * 3})
    evidence = Evidence({"name": "pd-prod-7"}, {"engines": engines, "probes": probes, "thread_check": check},
                        [Gap("logs", "prefill-0 (local)", "journalctl not found", "install systemd")])
    return bundle.write(evidence, path)


def test_diagnose_a_bundle_as_json_and_in_80_columns(tmp_path):
    folder = _wedged_bundle(tmp_path / "incident 03h00 (pd-prod-7)")
    status, out, err = invoke("diagnose", "--bundle", str(folder), "--json")
    assert status == 1, err
    doc = json.loads(out)
    assert list(doc)[:3] == ["status", "exit", "verdict"] and doc["status"] == "wedged" and doc["exit"] == 1
    assert doc["verdict"] == "WEDGED" and doc["kill_chain"] and doc["signals"]
    assert {s["source"] for s in doc["signals"]} == {"probes", "threads"}
    status, out, err = invoke("diagnose", "--bundle", str(folder), columns=80)
    assert status == 1 and "WEDGED" in out and "bootstrap_thread" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_usage_errors_and_missing_inputs(tmp_path):
    assert invoke("diagnose")[0] == 2
    assert invoke("diagnose", "--inventory", "a.toml", "--bundle", "b")[0] == 2
    assert invoke("collect", "--out", str(tmp_path / "x"))[0] == 2
    assert invoke("watch")[0] == 2
    status, out, err = invoke("diagnose", "--bundle", str(tmp_path / "nowhere"), "--json")
    assert status == 4 and json.loads(out)["kind"] == "BundleError" and "nowhere" in err
    status, out, err = invoke("collect", "--inventory", str(tmp_path / "missing inv.toml"), "--out", str(tmp_path / "o"))
    assert status == 4 and "missing inv.toml" in err
    status, _, err = invoke("collect", "--inventory", "x.toml", "--out", str(tmp_path / "o"), "--sample", "-3")
    assert status == 2 and "--sample" in err
