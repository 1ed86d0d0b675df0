"""The twin checked against real sglang 0.5.15: one real PD deployment and one twin, the same events.

A real prefill + decode + mini LB (``forensics.fidelity.deploy.real_engine``, module-scoped:
started once, captured once, taken down) and a twin go through the same scenario (start-up, a
served request, a killed streaming client, the bootstrap_thread's death, a waiting timeout);
the comparison must find no difference in what the readers rely on: the /metrics families, types,
labels and samples; every real log line recognised; the same catalogue signatures per event and
the twin's lines in the real engine's formats; the endpoints' answers. What the twin does not
yet match (one process per role where sglang runs three) is a strict xfail: fixing it fails the
test until the expectation moves. The CLI is checked against the stored real capture.

Cost here (2 cores, idle): the real pair ~50 s to start, its scenario ~90 s (60 s of it the
decode's waiting timeout), the twin's ~35 s, the CLI's twin ~35 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from forensics.engine.model import prompt_words
from forensics.fidelity import compare, deploy
from forensics.fidelity.capture import capture_deployment

# The real pair takes ~50 s to start on an idle 2-core machine, several minutes on a loaded one.
pytestmark = [pytest.mark.server, pytest.mark.engine, pytest.mark.timeout(1500)]

VERSION = "0.5.15"
STORED = Path(__file__).parent / "data" / "real-engine-0.5.15" / "capture.json"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    raw = tmp_path_factory.mktemp("real")
    with deploy.real_engine(VERSION, directory=raw / "deployment") as target:
        return capture_deployment(target, prompt_words, raw_dir=raw / "raw")


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    with deploy.twin(VERSION) as target:
        return capture_deployment(target, prompt_words, raw_dir=tmp_path_factory.mktemp("twin"))


@pytest.fixture(scope="module")
def report(real, twin):
    found = compare(real, twin)
    print(f"\n{found.text()}")
    return found


def _unallowed(report, *aspects):
    return [d for d in report.unallowed if d.aspect in aspects]


@pytest.mark.slow
def test_both_sides_went_through_every_event(real, twin):
    for side in (real, twin):
        assert side.outcomes["served"] == "200", side.outcomes
        assert "bootstrap_thread died" in side.outcomes["abort"], side.outcomes
        assert "timed out after" in side.outcomes["waiting_timeout"], side.outcomes


@pytest.mark.slow
def test_metrics_families_types_labels_and_samples_match(report, real):
    assert not _unallowed(report, "metrics"), _unallowed(report, "metrics")
    for role in ("prefill", "decode"):
        assert not [name for name in real.metrics[role] if name.endswith("_created")]
        assert report.figures["families"][role]["real"] == report.figures["families"][role]["twin"]


@pytest.mark.slow
def test_every_line_the_real_engine_wrote_is_recognised_by_forensics_logs(report):
    assert not _unallowed(report, "reader"), _unallowed(report, "reader")


@pytest.mark.slow
def test_the_twin_writes_the_same_signatures_per_event_in_the_real_formats(report):
    assert not _unallowed(report, "logs"), _unallowed(report, "logs")


@pytest.mark.slow
def test_the_endpoints_answer_with_the_same_status_and_keys(report):
    assert not _unallowed(report, "endpoints"), _unallowed(report, "endpoints")


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="the twin runs one process per role (sglang: the HTTP server, its "
                   "scheduler, detokenizer and resource tracker), and its /generate lacks 0.5.15's timing keys "
                   "and output_ids: docs/fidelity.md, 'Not yet matched'")
def test_processes_threads_and_generate_answer_match(report):
    assert not _unallowed(report, "processes", "threads", "generate")


def test_the_cli_compares_a_fresh_twin_with_the_stored_real_capture(tmp_path):
    result = subprocess.run([sys.executable, "-m", "forensics", "twin", "fidelity", "--sglang", VERSION,
                             "--real-capture", str(STORED), "--json"],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    document = json.loads(result.stdout)
    assert result.returncode == (1 if document["counts"] else 0), result.stderr[-2000:]
    assert document["release"] == VERSION
    assert set(document["counts"]) <= {"processes", "threads", "generate"}, document["counts"]
    assert document["figures"]["families"]["prefill"] == {"real": 66, "twin": 66}
