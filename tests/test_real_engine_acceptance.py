"""Acceptance on real sglang 0.5.15 (the CI lane): the twin checked against it, the wedge, the fix
deployed, the fix holding.

One real deployment for the module (``twin up --engine sglang``, the slow-prefill model, so that a
3000-token prompt keeps the prefill busy long enough for a client to die while its KV is pending),
started unpatched through the CLI. The tests run in order on it, in one worker (``--dist loadfile``):

1. the fidelity check, fresh on both sides: the fidelity scenario (start-up, a served request, a
   client killed while its KV is pending, the bootstrap_thread's death, a waiting timeout) on this
   deployment and on a fresh twin; the comparison finds no difference in the /metrics families,
   types, labels and samples, in the lines ``forensics logs`` recognises, in the signatures per
   event or in the endpoints' answers, its processes and their threads;
2. ``patch status`` says ``cpu-adapted`` (exit 1);
3. the scenario's one killed client wedged it as in production: the decode aborted the request and
   sent ABORT, the prefill's ``bootstrap_thread`` died on the GUARD assertion (its traceback in the
   prefill's log), py-spy no longer finds the thread, ``/health`` answers 200 on all three, a real
   request does not complete, and ``diagnose`` says WEDGED (exit 1);
4. ``patch deploy --yes`` writes the fix into the deployment's own clone of the engine environment,
   restarts the wedged prefill (killed after its bounded SIGTERM wait) and, since 0.5.15's decode
   blocks on a restarted prefill, the decode; it proves liveness with a real request;
5. ``patch status`` says ``patched (on the CPU-adapted file)`` (exit 0);
6. the same kill again: the patched prefill logs the ABORT, its thread lives, the next request is
   answered;
7. ``validate`` PASSes;
8. ``patch rollback --yes`` puts the adapted bytes back (slow-marked: out of CI's budget).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from cli_helpers import one_document, run_forensics
from real_engine_helpers import assert_wedged_as_in_production, cli_deployment, post, wait_until

from forensics.engine import clone, environment, state
from forensics.engine.adaptations import NIXL_CONN
from forensics.fidelity.capture import Capture
from forensics.inventory import load
from patched_engine.baselines import release_conn
from patched_engine.deploy_steps import planned

VERSION = "0.5.15"
GUARD = "First message should be b'NixlMsgGuard'. Foreign traffic?"
WAITING_TIMEOUT_S = 120
ABORT_SEEN = "Received abort notification for room"  # the fix logs each ABORT it handles at INFO
# In CI (`./run test` prepares the engine environment first). Inside the suite the lane costs about
# 7 min on its worker (9.5 with the rollback); conftest hands this file out first so that no worker
# ends the run on it.
pytestmark = [pytest.mark.server, pytest.mark.engine, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    # The decode waits up to 120 s for KV: the request after a kill waits for the prefill to finish
    # the aborted one (real sglang's prefill still runs it) on a loaded machine.
    with cli_deployment(tmp_path_factory.mktemp("real-engine") / "pd", WAITING_TIMEOUT_S) as deployed:
        yield deployed


@pytest.fixture(scope="module")
def fidelity(real, tmp_path_factory):
    """``forensics twin fidelity`` on the lane's deployment, first thing after its start-up (the scenario
    ends with it wedged), against a twin the command starts: (its JSON document, the real capture)."""
    deployment, document = real
    where = tmp_path_factory.mktemp("fidelity")
    started = time.monotonic()
    done = run_forensics("twin", "fidelity", "--sglang", VERSION, "--real-inventory", document["inventory"],
                         "--save-real", str(where / "real.json"), "--raw", str(where / "raw"), "--json", timeout=1800)
    print(f"\ntwin fidelity: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    report = one_document(done.stdout)
    assert done.returncode == (1 if report["counts"] else 0) and report["release"] == VERSION, done.stderr[-3000:]
    print(json.dumps(report["counts"]), [d for d in report["differences"] if not d["allowed"]][:40])
    return report, Capture.load(where / "real.json")


@pytest.fixture(scope="module")
def release():
    return release_conn(VERSION)


def unallowed(report: dict, *aspects: str) -> list[dict]:
    return [d for d in report["differences"] if not d["allowed"] and d["aspect"] in aspects]


def test_the_twin_matches_real_sglang_through_the_same_events(fidelity):
    """Metrics (families, types, labels, samples), every real line recognised by ``forensics logs``,
    the twin's signatures per event in the real formats, the endpoints' statuses and keys."""
    report, real_capture = fidelity
    outcomes = real_capture.outcomes
    assert outcomes["served"] == "200" and "bootstrap_thread died" in outcomes["abort"], outcomes
    assert "timed out after" in outcomes["waiting_timeout"], outcomes
    for aspect in ("metrics", "reader", "logs", "endpoints"):
        assert not unallowed(report, aspect), unallowed(report, aspect)
    for role in ("prefill", "decode"):
        assert not [name for name in real_capture.metrics[role] if name.endswith("_created")]
        assert report["figures"]["families"][role]["real"] > 60, report["figures"]  # the page whole, at the end


def test_the_generate_answer_matches(fidelity):
    """The twin's /generate carries the keys real 0.5.15's tokenizer manager writes (read from its source)."""
    report, _real = fidelity
    assert not unallowed(report, "generate"), unallowed(report, "generate")


def test_processes_and_threads_match(fidelity):
    """sglang's tree on both sides: the process serving the URL, its scheduler, detokenizer and
    resource tracker, each with the same threads (what a CPU twin cannot show is allowed, with why)."""
    report, real_capture = fidelity
    for role in ("prefill", "decode"):
        titles = sorted(row["title"] for row in real_capture.processes[role])
        assert "sglang::scheduler" in titles and "sglang::detokenizer" in titles, titles
    assert not unallowed(report, "processes", "threads")


def patch(*args: str, timeout: float = 2400):  # two real restarts: minutes each on a loaded machine
    started = time.monotonic()
    done = run_forensics("patch", *args, timeout=timeout)
    print(f"\npatch {args[0]}: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    return done


def conn_of(deployment) -> Path:
    return Path(deployment.inventory.engine("prefill").sglang_location) / NIXL_CONN


def prefill_status(inventory: str) -> tuple[int, dict]:
    done = patch("status", "--inventory", inventory, "--json")
    document = one_document(done.stdout)
    [engine] = document["engines"]
    return done.returncode, engine


def test_unpatched_status_is_cpu_adapted(real, release):
    deployment, document = real
    assert conn_of(deployment).read_bytes() == release.adapted_bytes
    status, engine = prefill_status(document["inventory"])
    assert status == 1 and engine["state"] == "cpu-adapted" and engine["base"] is None, engine
    assert engine["sha256"] == release.adapted_sha256 and "cpu-nixl-dram" in engine["reason"]


def kill_a_client_while_its_kv_is_pending(deployment) -> None:
    """The demo's kill on real sglang: a streaming client dropped once the decode counts its arrival
    and no token came back; the decode aborts the request and sends ABORT."""
    detail = state.kill_one_client(deployment)
    assert "the decode aborted the transfer" in detail, detail


def test_one_killed_client_wedged_the_unpatched_prefill_and_diagnose_says_wedged(real, fidelity):
    """The fidelity scenario's killed client (its abort event) is the kill that wedged it."""
    deployment, document = real
    _report, real_capture = fidelity
    prefill_abort = "\n".join(real_capture.logs["abort"]["prefill"])
    assert GUARD in prefill_abort
    assert "Exception in thread" in prefill_abort and "(bootstrap_thread)" in prefill_abort
    assert "nixl/conn.py" in prefill_abort
    assert_wedged_as_in_production(deployment, document, health_deadline_s=600)


def test_deploy_writes_the_fix_restarts_prefill_and_decode_and_proves_liveness(real, release):
    deployment, document = real
    inventory = document["inventory"]
    # A deployment of ours needs no --yes, so its plan is read through the library (nothing written).
    [warning] = planned("deploy", load(inventory), Path(inventory), None).plan.warnings()
    assert "blocks for good" in warning and "twin up --engine sglang" in warning
    assert "the deploy restarts it after the prefill (as --restart-decodes does, unasked" in warning
    before = {role: deployment.pid(role) for role in ("prefill", "decode", "router")}
    done = patch("deploy", "--inventory", inventory, "--yes", "--json")
    record = one_document(done.stdout)
    assert done.returncode == 0 and record["status"] == "deployed", json.dumps(record)[:4000]
    assert record["restart_decodes"] is True and "real sglang 0.5.15" in record["restart_decodes_why"]
    [engine] = record["engines"]
    assert engine["kind"] == "cpu-adapted" and engine["sha256"] == release.adapted_sha256
    names = [(s["engine"], s["name"], s["state"]) for s in record["steps"]]
    assert ("prefill-0", "restart", "ok") in names and ("decode-0", "restart the decode", "ok") in names
    assert record["liveness"]["outcome"] == "ok"
    print(f"\ndeploy: liveness after {record['liveness']['waited_s']} s; steps "
          f"{[(s['name'], round(s['duration_s'], 1)) for s in record['steps']]}")
    assert deployment.pid("prefill") != before["prefill"] and deployment.pid("decode") != before["decode"]
    assert deployment.pid("router") == before["router"]
    conn = conn_of(deployment)
    assert conn.read_bytes() == release.patched_on_adapted
    [backup] = sorted(conn.parent.glob("conn.py.pd-forensics-backup-*"))
    assert backup.read_bytes() == release.adapted_bytes  # the baseline kept is the adapted file, as it ran
    cached = environment._site_packages(environment.environment_dir(VERSION)) / NIXL_CONN
    assert cached.read_bytes() == release.adapted_bytes  # the release's cached environment stays pristine
    assert os.stat(cached).st_ino != os.stat(conn).st_ino


def test_status_after_the_deploy_is_patched_on_the_cpu_adapted_file(real):
    deployment, document = real
    status, engine = prefill_status(document["inventory"])
    assert status == 0 and engine["state"] == "patched" and engine["base"] == "cpu-adapted", engine
    assert engine["text"] == "patched (on the CPU-adapted file)" and engine["running"]["verdict"] == "this-file"
    shown = run_forensics("patch", "status", "--inventory", document["inventory"], env={"COLUMNS": "400"},
                          timeout=900)  # wide enough that the table does not wrap the state's text
    assert shown.returncode == 0 and "patched (on the CPU-adapted file)" in shown.stdout, shown.stdout


def test_the_patched_prefill_survives_a_client_killed_while_its_kv_is_pending(real):
    """The kill that wedged it unpatched: the fix marks the room Failed and the loop lives."""
    deployment, document = real
    log_before = len(deployment.log_text("prefill"))
    kill_a_client_while_its_kv_is_pending(deployment)
    wait_until(lambda: ABORT_SEEN in deployment.log_text("prefill")[log_before:], 300,
               "the patched prefill to log the decode's ABORT")
    log = deployment.log_text("prefill")[log_before:]
    assert GUARD not in log and "(bootstrap_thread)" not in log
    status = deployment.status()
    assert status["roles"]["prefill"]["bootstrap_thread_alive"] is True, status  # py-spy: the thread lives
    answer = post(document["router"] + "/generate", {"text": "ba be bi bo", "sampling_params": {"max_new_tokens": 2}},
                  timeout=300)
    assert answer["meta_info"]["completion_tokens"] == 2


def test_validate_passes_on_the_patched_deployment(real):
    deployment, document = real
    started = time.monotonic()
    # A generous liveness deadline: on a loaded CI machine real sglang's one-token answer after a storm
    # can take longer than the probes' own 5 s (then INCONCLUSIVE, "a slow answer is not a completed
    # request"); the default options' figures are the benchmark's (benchmarks/real_engine.py).
    done = run_forensics("validate", "--inventory", document["inventory"], "--cycles", "1", "--sessions", "20",
                         "--probe-deadline", "60", "--json", timeout=1200)
    campaign = one_document(done.stdout)
    print(f"\nvalidate: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    assert done.returncode == 0 and campaign["campaign"] == "PASS", json.dumps(campaign)[:4000]


@pytest.mark.slow  # about 3 min in the suite (two real restarts); the twin's rollback tests run in CI
def test_rollback_puts_the_cpu_adapted_file_back(real, release):
    deployment, document = real
    done = patch("rollback", "--inventory", document["inventory"], "--yes", "--json")
    record = one_document(done.stdout)
    assert done.returncode == 0 and record["status"] == "rolled-back", json.dumps(record)[:4000]
    [step] = [s for s in record["steps"] if s["name"] == "read and check the backup"]
    assert release.adapted_sha256[:12] in step["detail"] and "an engine environment's baseline" in step["detail"]
    assert ("decode-0", "restart the decode", "ok") in [(s["engine"], s["name"], s["state"]) for s in record["steps"]]
    assert conn_of(deployment).read_bytes() == release.adapted_bytes
    status, engine = prefill_status(document["inventory"])
    assert status == 1 and engine["state"] == "cpu-adapted", engine
    assert clone.deployment_cache(deployment.directory).exists()
