"""The storm and the demo on real sglang: the same commands, with their default options, as on the twin.

One real deployment for the storm tests (0.5.15, the tiny model, sglang's default waiting timeout),
started through the CLI as a user would (the decode preallocates at most two 3,000-token sessions
at a time in its 8,192 tokens, so the others wait in its prealloc queue; with the slow-prefill
model a loaded machine spends minutes on the killed sessions' prefills): ``storm --sessions 8 --cycles 1 --phase kv``
exits 1 on it unpatched (WEDGED: the GUARD assertion in the real prefill's log), ``patch deploy``
restarts its prefill and decode with the fix, and the same storm then exits 0 (HEALTHY). Each kill
was chosen by the real decode's own arrival counter (``observed_by: decode-metrics``) and each
attributed abort is the real decode's own line for that rid. The demo test starts its own
deployment (after the storm's is down: one real deployment at a time).
"""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
from cli_helpers import one_document, run_forensics
from storm_helpers import check_kills
from test_engine_deployment import enough_memory

from forensics.engine.deployment import attach

STORM = ("--sessions", "8", "--cycles", "1", "--phase", "kv")
GUARD = "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?"
pytestmark = [pytest.mark.server, pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    enough_memory()
    directory = tmp_path_factory.mktemp("storm-engine") / "pd"
    result = run_forensics("twin", "up", "--engine", "sglang", "--model", "tiny", "--dir", str(directory),
                           "--json", timeout=1500)
    assert result.returncode == 0, result.stderr
    deployment = attach(one_document(result.stdout)["inventory"])
    try:
        yield deployment
    finally:
        if (directory / "inventory.toml").exists():
            run_forensics("twin", "down", "--inventory", str(directory / "inventory.toml"), timeout=300)


def _storm(deployment) -> tuple[int, dict, pd.DataFrame, str]:
    started = time.monotonic()
    result = run_forensics("storm", "--inventory", str(deployment.inventory_path), *STORM, "--json", timeout=1200)
    doc = one_document(result.stdout)
    print(f"storm on real sglang: exit {result.returncode} in {time.monotonic() - started:.1f} s")
    return result.returncode, doc, pd.DataFrame(json.loads(json.dumps(doc["history"]))), result.stderr


def test_unpatched_real_engine_storm_exits_1_wedged_with_kills_chosen_by_the_decode(real):
    status, doc, history, err = _storm(real)
    assert status == 1, (doc.get("summary"), err[-2000:])
    assert doc["status"] == "wedged" and doc["cycles"][0]["verdict"] == "WEDGED", doc.get("summary")
    check_kills(doc, history, real.log_text("decode"), 8)
    assert GUARD in real.log_text("prefill")


def test_patch_deploy_then_the_same_storm_exits_0_healthy(real):
    started = time.monotonic()
    deploy = run_forensics("patch", "deploy", "--inventory", str(real.inventory_path), "--json", timeout=1800)
    record = one_document(deploy.stdout)
    assert deploy.returncode == 0 and record["status"] == "deployed", (record.get("message"), deploy.stderr[-2000:])
    print(f"patch deploy on the wedged real engine: {time.monotonic() - started:.1f} s")
    status, doc, history, err = _storm(real)
    assert status == 0, (doc.get("summary"), err[-2000:])
    assert doc["status"] == "healthy", doc.get("summary")
    check_kills(doc, history, real.log_text("decode"), 8)
    assert "Received abort notification for room" in real.log_text("prefill")  # the patched loop took them


def test_demo_on_real_sglang_tells_the_six_stages_and_names_the_engine(real, tmp_path):
    real.take_down()  # one real deployment at a time: the demo starts its own
    enough_memory()
    out = tmp_path / "demo"
    result = run_forensics("demo", "--engine", "sglang", "--out", str(out), "--json", timeout=3000)
    doc = one_document(result.stdout)
    failed = [step for step in doc["steps"] if not step["ok"]]
    assert result.returncode == 0 and doc["ok"], failed or result.stderr[-2000:]
    assert {step["stage"] for step in doc["steps"]} == {"reproduce", "diagnose", "diff", "patch", "validate",
                                                         "report"}
    assert doc["engine"] == "sglang"
    assert json.loads((out / "demo.json").read_text())["engine"] == "sglang"
    report = (out / "report" / "report.md").read_text()
    assert "real sglang 0.5.15" in report and "real engine" in report
