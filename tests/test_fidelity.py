"""The fidelity check's own starts and its stored capture (the fresh comparison is in the CI lane).

The comparison of a fresh real 0.5.15 deployment with a fresh twin runs in CI as the first step of
``tests/test_real_engine_acceptance.py`` (``forensics twin fidelity --real-inventory`` on the lane's
deployment, whose scenario then leaves it wedged for the lane). Here:

* the CLI compares a fresh twin with the stored real capture (``tests/data/real-engine-0.5.15``),
  the way a user without the real engine's environment runs it;
* (slow) the check with no side given starts both itself (``forensics.fidelity.deploy``: the real
  pair with launch's own servers, then the twin), one after the other, and takes both down.

Cost here (2 cores, idle): the real pair ~50 s to start, its scenario ~90 s (60 s of it the
decode's waiting timeout), the twin's ~35 s, the CLI's twin ~35 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from forensics.fidelity.capture import Capture

# The real pair takes ~50 s to start on an idle 2-core machine, several minutes on a loaded one.
pytestmark = [pytest.mark.server, pytest.mark.engine, pytest.mark.timeout(1500)]

VERSION = "0.5.15"
STORED = Path(__file__).parent / "data" / "real-engine-0.5.15" / "capture.json"
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_check_starts_each_side_itself_one_after_the_other(tmp_path):
    from forensics.fidelity.check import check

    report = check(VERSION, raw_dir=tmp_path / "raw", save_real=tmp_path / "real.json")
    real = Capture.load(tmp_path / "real.json")
    assert real.outcomes["served"] == "200" and "bootstrap_thread died" in real.outcomes["abort"], real.outcomes
    assert "timed out after" in real.outcomes["waiting_timeout"], real.outcomes
    assert not report.unallowed, report.text()
    assert (tmp_path / "raw" / "real" / "marks.json").is_file() and (tmp_path / "raw" / "twin" / "marks.json").is_file()


def test_the_cli_compares_a_fresh_twin_with_the_stored_real_capture(tmp_path):
    result = subprocess.run([sys.executable, "-m", "forensics", "twin", "fidelity", "--sglang", VERSION,
                             "--real-capture", str(STORED), "--json"],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    document = json.loads(result.stdout)
    unexpected = [d for d in document["differences"] if d["allowed"] is None]
    assert result.returncode == 0 and not unexpected and not document["counts"], (unexpected, result.stderr[-2000:])
    assert document["release"] == VERSION
    # sglang's tree on the twin too: the front's and the scheduler's differences are the allowed ones.
    allowed = {(d["aspect"], d["role"], d["item"]) for d in document["differences"] if d["aspect"] in
               ("processes", "threads")}
    assert allowed == {(aspect, role, item) for role in ("prefill", "decode") for aspect, item in (
        ("processes", "the process serving the URL"),
        ("threads", "python -m sglang.launch_server: AnyIO worker thread"),
        ("threads", "sglang::scheduler: tqdm_monitor"))}, allowed
    # The stored pages at the scenario's end: 68 and 67 families (the twin's prefill adds the allowed
    # num_bootstrap_failed_reqs_total).
    assert document["figures"]["families"]["prefill"] == {"real": 68, "twin": 69}
    assert document["figures"]["families"]["decode"] == {"real": 67, "twin": 67}
