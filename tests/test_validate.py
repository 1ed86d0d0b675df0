"""The validation campaign against a real 0.5.15 twin and the real sshd (docs/validate.md).

One twin for the module, used in order: unpatched, the first storm wedges it and the
campaign FAILs with the kill chain; deployed over SSH to its own files, restarted, three
cycles PASS; then the faults (a probe timing out, journal output cut, the sshd killed
mid-campaign) are INCONCLUSIVE with their reason, never PASS; rollback brings the wheel's
bytes back. Each cycle is the storm of tests/test_storm.py's patched test: 6 sessions of
1,200 prompt tokens killed at once while they wait in the decode's queues.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import tomli_w
from cli_helpers import invoke
from live_helpers import ensure_healthy, ssh_inventory
from twin_helpers import twin_state, wait_until

import forensics as fx
import forensics.twin as twin_api
from forensics.sglang_source import fetch
from forensics.validation import FAIL, INCONCLUSIVE, PASS, Campaign, Comparison, checks
from patched_engine import deploy as deploy_mod

TEST_SETTINGS = {"prefill_rate_tps": 400.0, "decode_rate_tps": 50.0, "decode_log_interval": 10}
STORM = dict(sessions=6, prompt_tokens=1200, max_tokens=16, phase="kv", kill_after=0, sample_s=4)
STORM_ARGS = ("--sessions", "6", "--prompt-tokens", "1200", "--max-tokens", "16", "--phase", "kv",
              "--kill-after", "0", "--sample", "4s")
LIVENESS_S = 120.0
state: dict = {}  # what the ordered tests hand on: campaigns, the SSH inventory


@pytest.fixture(scope="module")
def twin(tmp_path_factory, leak_guard):
    # A small decode KV pool (160 pages): two requests in transfer, the rest in prealloc (tests/test_storm.py).
    deployment = twin_api.up("0.5.15", waiting_timeout=15, pool_pages=160,
                             directory=tmp_path_factory.mktemp("validate-0.5.15"), **TEST_SETTINGS)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(deployment.pid(role))
    yield deployment
    deployment.down()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _over_ssh(twin, sshd, path: Path, **kwargs) -> Path:
    """The twin as a live deployment over SSH, with what deploy needs (interpreter, sglang, restart line)."""
    path = ssh_inventory(twin, sshd, path, **kwargs)
    prefill = twin.inventory.engine("prefill")
    document = tomllib.loads(path.read_text())
    for engine in document["engine"]:
        if engine["role"] == "prefill":
            engine.update(python=prefill.python, sglang_location=prefill.sglang_location, restart=prefill.restart)
    path.write_text(tomli_w.dumps(document))
    return path


# ----------------------------------------------------------------------------- without a twin


def test_a_live_deployment_is_refused_without_yes(tmp_path):
    inventory = tmp_path / "live.toml"
    inventory.write_text('[deployment]\nname = "pd-prod-7"\nsglang = "0.5.15"\nbackend = "nixl"\n'
                         + "".join(f'[[engine]]\nrole = "{role}"\nhost = "local"\nurl = "http://127.0.0.1:9"\n{extra}'
                                   for role, extra in (("prefill", "bootstrap_port = 8998\n"), ("decode", ""),
                                                       ("router", ""))))
    status, out, err = invoke("validate", "--inventory", str(inventory), "--deploy", "--cycles", "3", "--json")
    doc = json.loads(out)
    assert (status, doc["status"], doc["exit"]) == (3, "planned", 3), err
    assert doc["plan"]["twin"] is False and doc["plan"]["cycles"] == 3 and "--yes" in doc["refused"]


def _cycle(**fields):
    evidence = fields.pop("evidence", SimpleNamespace(frames={}, gaps=[]))
    base = dict(cycle=1, verdict=None, aborts={"prealloc": 0, "transfer": 0, "none": 6, "unknown": 0},
                abort_count=0, prefill_abort_frames=0, evidence=evidence)
    return SimpleNamespace(**{**base, **fields})


def test_nothing_passes_by_default():
    events = pd.DataFrame({"role": pd.array(["decode"], dtype="string"),
                           "signature": pd.array(["access_completion"], dtype="string")})
    cycle = _cycle(evidence=SimpleNamespace(frames={"events": events}, gaps=[]))
    # Logs read, no death, but no abort: the cycle proves nothing.
    got = checks.logs(cycle)
    assert got.status == INCONCLUSIVE and "no abort" in got.reason
    # No probes, no thread inventory, no metrics: each says what was missing.
    for check in (checks.liveness, checks.threads, lambda c: checks.metrics(c, {})):
        got = check(cycle)
        assert got.status == INCONCLUSIVE and got.reason.startswith("no "), got.reason
    campaign = Campaign("x", None, {}, 1)
    assert campaign.status == INCONCLUSIVE and campaign.exit_status == 3


def _decode_counters(aborted: int, transfer_failed: int) -> pd.DataFrame:
    rows = [("sglang:num_aborted_requests_total", aborted), ("sglang:num_transfer_failed_reqs_total", transfer_failed)]
    return pd.DataFrame({"role": ["decode"] * 2, "host": ["decode-0"] * 2, "scrape_ok": [True] * 2, "ts": [1.0] * 2,
                         "metric_canonical": [m for m, _ in rows], "value_int": [v for _, v in rows],
                         "value": [float(v) for _, v in rows]})


@pytest.mark.parametrize("aborted, transfer_failed, status", [
    (17, 18, PASS),  # as real sglang 0.5.15 counted 18 transfer-queue aborts: the tokenizer saw 17 of them
    (0, 18, FAIL),  # the abort counter never moved
    (18, 17, FAIL),  # a transfer failure the decode did not count
])
def test_the_abort_counter_must_move_and_the_failure_counters_count_every_abort(aborted, transfer_failed, status):
    before = {"decode-0": {"sglang:num_aborted_requests_total": 0, "sglang:num_transfer_failed_reqs_total": 0}}
    cycle = _cycle(aborts={"prealloc": 0, "transfer": 18, "none": 2, "unknown": 0}, abort_count=18,
                   evidence=SimpleNamespace(frames={"metrics": _decode_counters(aborted, transfer_failed)}, gaps=[]))
    got = checks.metrics(cycle, before)
    assert got.status == status, got.reason
    table = got.evidence.set_index("metric")
    assert table.loc["sglang:num_aborted_requests_total", "expected_at_least"] == 1
    assert table.loc["sglang:num_transfer_failed_reqs_total", "expected_at_least"] == 18


# ----------------------------------------------------------------------------- the acceptance flow


@pytest.mark.server
@pytest.mark.timeout(240)
def test_an_unpatched_twin_wedges_on_the_first_storm_and_the_campaign_fails(twin, tmp_path):
    campaign = fx.validate(twin, cycles=2, **STORM)
    state["unpatched"] = campaign
    assert campaign.status == FAIL and campaign.exit_status == 1, campaign.summary()
    assert len(campaign.cycles) == 1 and "not run" in campaign.stopped  # a wedged target has nothing more to tell
    [cycle] = campaign.cycles
    assert cycle.verdict.verdict == "WEDGED"
    by_name = {c.name: c for c in cycle.checks}
    assert by_name["liveness"].status == FAIL and "WEDGED" in by_name["liveness"].reason
    assert by_name["logs"].status == FAIL and "GUARD assertion" in by_name["logs"].reason
    assert set(by_name["logs"].evidence["signature"]) >= {"nixl_guard_assertion", "thread_death"}
    assert by_name["threads"].status == FAIL and "bootstrap thread is gone" in by_name["threads"].reason
    assert campaign.kill_chain and campaign.kill_chain == cycle.verdict.kill_chain
    # The storm really aborted: the decode logged the aborts, the prefill received the ABORT frame.
    assert cycle.storm.abort_count >= 1 and cycle.storm.prefill_abort_frames >= 1
    decode_log, prefill_log = twin.log_text("decode"), twin.log_text("prefill")
    aborted = cycle.history[cycle.history["phase_attributed"] == "transfer"]
    for row in aborted.itertuples():
        assert re.search(rf"Decode transfer failed for request rank=0 decode_req\.req\.rid='{row.rid}' "
                         rf"decode_req\.req\.bootstrap_room={row.room} with exception .*Aborted by AbortReq\.",
                         decode_log), row.rid
    assert re.search(r"Sent abort notification for room \d+ to 127\.0\.0\.1:\d+", decode_log)
    assert "Foreign traffic?" in prefill_log
    # Shown and saved for the report.
    html = campaign._repr_html_()
    assert "FAIL" in html and "Kill chain" in html and campaign.__rich__() is not None
    out = campaign.save(tmp_path / "campaign")
    doc = Campaign.load_document(out)
    assert doc["campaign"] == FAIL and doc["kill_chain"] == campaign.kill_chain
    assert pd.read_parquet(out / "frames/checks.parquet")["status"].tolist() == [c.status for c in cycle.checks]
    assert len(pd.read_parquet(out / "frames/history.parquet")) == STORM["sessions"]
    assert fx.bundle.open(out / "cycles/1").frames["events"] is not None


@pytest.mark.server
@pytest.mark.timeout(420)
def test_deploy_over_ssh_then_three_cycles_pass(twin, sshd, tmp_path_factory):
    # The wedge leaves requests waiting at the decode; when one times out, the release's decode
    # sends ABORT on its socket to the prefill. If that prefill was restarted a moment before,
    # sglang 0.5.15's socket (RECONNECT_IVL -1, no SNDTIMEO: common/conn.py _connect) has no peer
    # and the send blocks the decode for good, in sglang as in the twin. Let them time out first.
    wait_until(lambda: not (twin_state(twin.decode)["prealloc_queue"] or twin_state(twin.decode)["transfer_queue"]),
               90, "the wedge's waiting requests to time out at the decode")
    inventory = _over_ssh(twin, sshd, tmp_path_factory.mktemp("validate-ssh") / "over-ssh.toml")
    state["ssh_inventory"] = inventory
    campaign = fx.validate(inventory, deploy=True, yes=True, cycles=3, liveness_deadline_s=LIVENESS_S, **STORM)
    state["patched"] = campaign
    assert campaign.status == PASS and campaign.exit_status == 0, "\n".join(  # a str: pytest shows it whole
        f"cycle {c.cycle} {c.name} {c.status}: {c.reason}" for c in campaign.checks if c.status != PASS)
    assert campaign.deploy.status == PASS and campaign.deploy_record.status == "deployed"
    assert campaign.deploy_record.liveness["outcome"] == "ok"
    assert len(campaign.cycles) == 3 and all(len(cy.checks) == 4 for cy in campaign.cycles)
    for cy in campaign.cycles:
        assert cy.storm.abort_count >= 1 and cy.storm.prefill_abort_frames >= 1, cy.cycle
        assert set(cy.history["cycle"]) == {cy.cycle}
    assert twin.nixl_conn().read_bytes() != fetch("0.5.15").verified_read_bytes(
        fetch("0.5.15").backend_file("nixl"))
    frame = campaign.checks_frame()
    assert list(frame["check"]) == ["deploy"] + ["liveness", "logs", "threads", "metrics"] * 3
    assert "PASS" in campaign._repr_html_()
    print(f"deploy + 3 cycles: {campaign.duration_s:.1f} s")


@pytest.mark.server
@pytest.mark.timeout(180)
def test_a_probe_timing_out_is_inconclusive_never_pass(twin, tmp_path):
    status, out, err = invoke("validate", "--inventory", str(twin.inventory_path), *STORM_ARGS,
                              "--probe-deadline", "0.001", "--json", "--out", str(tmp_path / "saved"))
    doc = json.loads(out)
    assert (status, doc["exit"], doc["campaign"]) == (3, 3, INCONCLUSIVE), (doc.get("summary"), err)
    liveness = next(c for c in doc["cycles"][0]["checks"] if c["name"] == "liveness")
    assert liveness["status"] == INCONCLUSIVE and "timed out" in liveness["reason"], liveness
    print("probe timing out:", liveness["reason"])
    assert doc["saved"] and (Path(doc["saved"]) / "campaign.json").is_file()


@pytest.mark.server
@pytest.mark.timeout(180)
def test_journal_output_cut_is_inconclusive(twin, sshd, tmp_path):
    fake = tmp_path / "journalctl"
    fake.write_text('#!/bin/sh\nprintf \'{"MESSAGE":"Decode transfer failed for req\'\n')
    fake.chmod(0o755)
    logs = {"prefill": {"unit": "sglang-prefill.service"}, "decode": {"unit": "sglang-decode.service"}}
    inventory = _over_ssh(twin, sshd, tmp_path / "journal.toml", logs=logs, journalctl=str(fake))
    campaign = fx.validate(inventory, yes=True, cycles=1, **STORM)
    assert campaign.status == INCONCLUSIVE, campaign.summary()
    logs_check = campaign.cycles[0].check("logs")
    assert logs_check.status == INCONCLUSIVE and "cut" in logs_check.reason, logs_check.reason
    print("journal cut:", logs_check.reason)
    assert campaign.cycles[0].check("metrics").status != PASS


@pytest.mark.server
@pytest.mark.timeout(240)
def test_sshd_killed_mid_campaign_is_inconclusive(twin, tmp_path):
    from sshd_helpers import start_sshd

    server = start_sshd()
    try:
        inventory = _over_ssh(twin, server, tmp_path / "doomed.toml")

        def progress(info: dict) -> None:
            if info.get("cycle") == 2 and server.proc.poll() is None:
                server.stop()  # the connection to the hosts goes away between two cycles

        campaign = fx.validate(inventory, yes=True, cycles=2, progress=progress, **STORM)
    finally:
        server.stop()
    assert campaign.status == INCONCLUSIVE, campaign.summary()
    assert campaign.cycles[0].status == PASS
    second = campaign.cycles[1]
    undecided = [c for c in second.checks if c.status == INCONCLUSIVE]
    assert undecided and all(c.status != PASS for c in second.checks if c.name in ("logs", "threads"))
    assert any(re.search(r"disconnect|refused|unreachable|connect", c.reason, re.I) for c in undecided), [
        c.reason for c in undecided]
    print("sshd killed:", [(c.name, c.status, c.reason) for c in second.checks])


@pytest.mark.server
@pytest.mark.timeout(240)
def test_rollback_brings_the_original_bytes_back(twin):
    inventory = state.get("ssh_inventory")
    if inventory is None:
        pytest.skip("the deploy test did not run")
    record = deploy_mod.rollback(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
    assert record.status == "rolled-back", (record.problem, record.message)
    source = fetch("0.5.15")
    assert _sha(twin.nixl_conn().read_bytes()) == _sha(source.verified_read_bytes(source.backend_file("nixl")))
    ensure_healthy(twin)


def test_a_b_side_by_side():
    if "unpatched" not in state or "patched" not in state:
        pytest.skip("the campaigns of the acceptance flow did not run")
    ab = Comparison(state["unpatched"], state["patched"])
    assert ab.exit_status == 0 and ab.status == PASS
    rows = ab.rows()
    assert rows[0] == ("-", "deploy", "-", PASS)
    assert ("1", "liveness", FAIL, PASS) in rows and ("3", "metrics", "-", PASS) in rows
    assert "unpatched" in ab._repr_html_() and ab.__rich__() is not None
    assert ab.to_dict()["side_by_side"][1] == {"cycle": "1", "check": "liveness", "unpatched": FAIL, "patched": PASS}


def _liveness_rows(outcomes: list[str]) -> pd.DataFrame:
    n = len(outcomes)
    return pd.DataFrame({"ts": pd.to_datetime([f"2026-12-03T13:40:{10 + i:02d}Z" for i in range(n)]),
                         "kind": ["liveness"] * n, "outcome": outcomes, "target": ["router-0"] * n,
                         "waited_s": [7.0 if o != "ok" else 1.2 for o in outcomes],
                         "total_s": [7.0 if o != "ok" else 1.2 for o in outcomes], "deadline_s": [6.2] * n})


@pytest.mark.parametrize("outcomes, status", [
    (["answered_late", "ok"], PASS),   # real 0.5.15.post1 patched, loaded machine: the last one completed
    (["ok", "answered_late"], INCONCLUSIVE),   # the last one was slow: nothing says it still serves
    (["late", "late"], INCONCLUSIVE),
    (["error", "ok"], FAIL),   # an error is not slowness
    (["ok"], PASS),
])
def test_a_slow_probe_before_a_completed_one_is_slow_not_dead(outcomes, status):
    frames = {"probes": _liveness_rows(outcomes)}
    got = checks.liveness(_cycle(evidence=SimpleNamespace(frames=frames, gaps=[])))
    assert got.status == status, got.reason
    if status == PASS and len(outcomes) > 1:
        assert "slow, not dead" in got.reason
