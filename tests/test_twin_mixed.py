"""A mixed-version twin, as during a rolling upgrade: the prefill and the decode on different releases.

0.5.15's NIXL prefill loop has no ABORT case; 0.5.16's has one. Whichever side is upgraded
first decides the fate: a 0.5.15 prefill behind a 0.5.16 decode (which sends ABORT) wedges on
the first abort; a 0.5.16 prefill behind a 0.5.15 decode (which sends ABORT too) survives it.
A pair whose serving frames do not fit is refused before anything starts, naming the frame.

The other direction: 0.5.23's decode completes a transfer only on the prefill's KV_STATUS, which a
0.5.22 prefill never sends (it tags its last NIXL WRITE instead), so that pair is refused up front
rather than started to time out every request; a 0.5.23 prefill behind a 0.5.22 decode serves, its
KV_STATUS read by the 0.5.22 decode's listener.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
from twin_helpers import kill_client_during_transfer_wait, twin_state, wait_until

import forensics.twin as twin_api
from forensics.inventory import load
from forensics.twin.pair import check_pair

pytestmark = [pytest.mark.server]
TEST_SETTINGS = {"prefill_rate_tps": 400.0, "decode_rate_tps": 50.0, "waiting_timeout": 15}


def _bootstrap_alive(twin) -> bool:
    return twin_state(twin.prefill)["bootstrap_thread_alive"]


def _kill_until_the_prefill_saw_an_abort(twin) -> None:
    """Kill clients mid-transfer until the decode's ABORT has reached the prefill's loop (at most 3):
    on a loaded machine a kill can land outside the transfer wait, and then nothing is aborted."""
    for _ in range(3):
        before = twin_state(twin.prefill)["frames_consumed"]
        try:
            kill_client_during_transfer_wait(twin)
            wait_until(lambda seen=before: twin_state(twin.prefill)["frames_consumed"] > seen, 20,
                       "the ABORT at the prefill")
            return
        except AssertionError:
            if not _bootstrap_alive(twin):
                return
    raise AssertionError("three killed clients sent no ABORT to the prefill")


def _completes(twin, timeout: float) -> bool:
    try:
        response = httpx.post(twin.router + "/generate", timeout=timeout,
                              json={"text": "after the kill", "sampling_params": {"max_new_tokens": 2}})
    except httpx.TimeoutException:
        return False
    return response.status_code == 200 and response.json()["meta_info"]["kv_intact"] is True


@pytest.mark.timeout(300)
def test_an_old_prefill_behind_a_new_decode_wedges_on_the_first_abort(tmp_path):
    twin = twin_api.up("0.5.15", decode_sglang="0.5.16", directory=tmp_path, **TEST_SETTINGS)
    try:
        # Both releases are recorded: the deployment's (the prefill's) and the decode engine's own.
        inventory = load(twin.inventory_path)
        assert inventory.sglang == "0.5.15" and inventory.engine("decode").sglang == "0.5.16"
        assert twin.server_info("decode")["version"] == "0.5.16"
        assert twin.server_info("prefill")["version"] == "0.5.15"
        assert "wedges on the first abort" in twin.pair["abort_fate"]
        assert _completes(twin, 60)  # the pair serves until the first abort
        _kill_until_the_prefill_saw_an_abort(twin)
        wait_until(lambda: not _bootstrap_alive(twin), 30, "the 0.5.15 bootstrap thread to die")
        assert "Foreign traffic?" in twin.log_text("prefill")
        assert not _completes(twin, 5)  # wedged: a new request hangs
    finally:
        twin.down()


@pytest.mark.timeout(300)
def test_a_new_prefill_behind_an_old_decode_survives_the_same_abort(tmp_path):
    twin = twin_api.up("0.5.16", decode_sglang="0.5.15", directory=tmp_path, **TEST_SETTINGS)
    try:
        assert twin.server_info("decode")["version"] == "0.5.15"
        assert twin.pair["abort_fate"].startswith("it survives the decode's ABORT")
        assert _completes(twin, 60)
        _kill_until_the_prefill_saw_an_abort(twin)
        wait_until(lambda: "marked as Failed" in twin.log_text("prefill"), 20, "0.5.16's ABORT handler")
        assert _bootstrap_alive(twin)
        assert _completes(twin, 60)
        assert "Foreign traffic?" not in twin.log_text("prefill")
    finally:
        twin.down()


@pytest.mark.timeout(180)
def test_a_pair_whose_serving_frames_do_not_fit_is_refused_naming_the_frame(tmp_path):
    from forensics.sglang_source import fetch

    # 0.5.5's prefill loop cannot parse 0.5.16's KV-args registration: every request would hang.
    check = check_pair(fetch("0.5.5"), fetch("0.5.16"))
    assert not check.servable and "KV-args registration" in check.refused
    assert check.frames == {"KV-args registration": check.frames["KV-args registration"]}  # stopped there
    # `twin up` refuses such a pair before anything starts (here 0.5.5 already fails the release check).
    done = subprocess.run([sys.executable, "-m", "forensics", "twin", "up", "--sglang", "0.5.5", "--decode-sglang",
                           "0.5.16", "--dir", str(tmp_path / "cli"), "--json"], capture_output=True, text=True,
                          timeout=170)
    document = json.loads(done.stdout)
    assert done.returncode == 4 and document["exit"] == 4 and "0.5.5" in document["error"]
    assert not list((tmp_path / "cli").glob("*.pid"))


@pytest.mark.timeout(120)
def test_the_pair_check_replays_each_release_s_own_frames():
    from forensics.sglang_source import fetch

    same = check_pair(fetch("0.5.16"), fetch("0.5.16"))
    assert same.servable and same.frames == {"KV-args registration": "taken", "transfer info": "taken",
                                             "ABORT": "taken"}
    assert same.prefill_to_decode["completion"].startswith("NIXL notification {room}_aux: sent at prefill")
    assert "transfers complete on NIXL notification {room}_aux" in same.summary()
    old_prefill = check_pair(fetch("0.5.15"), fetch("0.5.16"))
    assert old_prefill.servable and "Foreign traffic?" in old_prefill.frames["ABORT"]
    # A decode from before 0.5.13 sends no ABORT: nothing to die on, and the check says so.
    quiet_decode = check_pair(fetch("0.5.15"), fetch("0.5.12"))
    assert quiet_decode.servable and "ABORT" not in quiet_decode.frames
    assert quiet_decode.abort_fate.startswith("no ABORT to survive")


@pytest.mark.timeout(240)
def test_a_decode_waiting_for_kv_status_behind_a_prefill_that_never_sends_it_is_refused(tmp_path):
    from forensics.sglang_source import fetch

    # Every decode frame fits the 0.5.22 prefill's loop; what breaks is the way back: started, every
    # request timed out after the waiting timeout in KVPoll.WaitingForInput.
    check = check_pair(fetch("0.5.22"), fetch("0.5.23"))
    assert not check.servable
    assert check.frames == {"KV-args registration": "taken", "transfer info": "taken"}
    assert re.search(r"^the 0\.5\.23 decode completes a transfer only on the prefill's KV_STATUS \(nixl/conn\.py:\d+",
                     check.refused) and "which sglang 0.5.22's prefill never sends" in check.refused
    assert check.prefill_to_decode["completion"] == f"none: {check.refused}"
    assert check.to_dict()["prefill_to_decode"] == check.prefill_to_decode
    done = subprocess.run([sys.executable, "-m", "forensics", "twin", "up", "--sglang", "0.5.22", "--decode-sglang",
                           "0.5.23", "--dir", str(tmp_path / "cli"), "--json"], capture_output=True, text=True,
                          timeout=220)
    document = json.loads(done.stdout)
    assert done.returncode == 4 and document["exit"] == 4, done.stderr
    assert "prefill 0.5.22 / decode 0.5.23 cannot serve" in document["error"] and "KV_STATUS" in document["error"]
    assert not list((tmp_path / "cli").glob("*.pid"))


@pytest.mark.timeout(300)
def test_a_new_prefill_behind_a_decode_with_a_listener_completes_over_kv_status(tmp_path):
    # 0.5.23's prefill tags no NIXL WRITE; the 0.5.22 decode's listener takes its KV_STATUS.
    twin = twin_api.up("0.5.23", decode_sglang="0.5.22", directory=tmp_path, **TEST_SETTINGS)
    try:
        assert twin.pair["servable"] and twin.pair["prefill_to_decode"]["completion"].startswith(
            "KV_STATUS: sent at prefill nixl/conn.py:")
        written = json.loads((tmp_path / "pair-check.json").read_text())
        assert written["prefill_to_decode"] == twin.pair["prefill_to_decode"]
        assert _completes(twin, 60)
        decode = twin_state(twin.decode)
        assert decode["listener_received"].get("KV_STATUS", 0) >= 1
        # What the decode reports is the pair's signal, not its release's default (notifications).
        assert decode["completion_signal"] == twin.pair["prefill_to_decode"]["completion"]
    finally:
        twin.down()


def _release_with_one_file_edited(version: str, root, relative: str, old: str, new: str):
    """``version``'s tree with one disaggregation file edited (every other entry a symlink into the
    cache): a fork or a future release, for both the source reading and the engine sandbox."""
    from pathlib import Path
    from types import SimpleNamespace

    from forensics.sglang_source import fetch

    source = fetch(version)
    original = Path(source.root)
    edited = Path("sglang/srt/disaggregation") / relative
    for depth in range(len(edited.parts)):  # mirror each directory on the way down, link its other entries
        here = Path(*edited.parts[:depth])
        (root / here).mkdir(parents=True, exist_ok=True)
        for entry in (original / here).iterdir():
            if entry.name != edited.parts[depth]:
                (root / here / entry.name).symlink_to(entry)
    text = source.verified_read_text(original / edited)
    assert old in text
    (root / edited).write_text(text.replace(old, new))
    return SimpleNamespace(root=str(root), version=f"{version}+fork",
                           verified_read_text=lambda path: Path(path).read_text())


@pytest.mark.timeout(180)
def test_a_status_message_the_decode_s_listener_does_not_act_on_is_refused_after_the_replay(tmp_path):
    from forensics.sglang_source import fetch

    # Read from the code, this fork of 0.5.23 ends each transfer with KV_STATUS like 0.5.23; but its
    # status field is renumbered, which only the replay shows: the 0.5.22 decode's own listener takes
    # the fork's own bytes and leaves the room waiting.
    fork = _release_with_one_file_edited("0.5.23", tmp_path / "fork", "common/conn.py",
                                         'str(int(status)).encode("ascii"),', 'str(int(status) + 10).encode("ascii"),')
    check = check_pair(fork, fetch("0.5.22"))
    assert not check.servable
    assert check.refused.startswith("the 0.5.22 decode's listener does not complete a transfer on the 0.5.23+fork "
                                    "prefill's status message: replayed in the engine sandbox, the decode's room "
                                    "stays WaitingForInput")
    # The unedited release passes the same replay.
    assert check_pair(fetch("0.5.23"), fetch("0.5.22")).prefill_to_decode["completion"].endswith(
        "replayed in the engine sandbox: the decode's room went Success")


@pytest.mark.timeout(180)
def test_the_pair_check_says_whether_the_prefill_s_abort_ack_frees_the_decode_s_held_pages():
    """Deferred KV release (on by default from 0.5.21): the decode holds an aborted room's pages until
    the prefill's ABORT_ACK. 0.5.22 added a generation to both the ABORT and the ack; across that
    boundary no ack counts, in either direction, and each side's own code says why."""
    from forensics.sglang_source import fetch

    for release in ("0.5.21", "0.5.22"):
        same = check_pair(fetch(release), fetch(release))
        assert same.prefill_to_decode["abort ack"].startswith(f"the {release} prefill's ABORT_ACK frees the decode's "
                                                              "held pages at once"), same.prefill_to_decode
        assert "ABORT_ACK" not in same.summary()
    held = "decode holds each aborted request's KV pages until its deferred-release timeout"
    new_decode = check_pair(fetch("0.5.21"), fetch("0.5.22"))
    ack = new_decode.prefill_to_decode["abort ack"]
    assert ack.startswith("none that counts: the 0.5.22 decode ignores the prefill's ABORT_ACK, which carries no "
                          "generation: 'Generation-less ABORT_ACK received; ignoring it.")
    assert re.search(r"\[sglang/srt/disaggregation/common/conn\.py:\d+\]", ack) and held in ack
    assert new_decode.servable and "ABORT_ACK: none that counts" in new_decode.summary()
    new_prefill = check_pair(fetch("0.5.22"), fetch("0.5.21"))
    assert new_prefill.prefill_to_decode["abort ack"].startswith(
        "none that counts: the 0.5.22 prefill sends no ABORT_ACK for the decode's ABORT, which carries no "
        "generation: 'Generation-less ABORT for room 2; no deferred ACK'")
    # 0.5.20's deferred release is off by default: its prefill never acks.
    off = check_pair(fetch("0.5.20"), fetch("0.5.21")).prefill_to_decode["abort ack"]
    assert off.startswith("none that counts: the 0.5.20 prefill sends no ABORT_ACK (its deferred KV release is off")
    # A decode that does not hold pages does not wait for an ack.
    assert check_pair(fetch("0.5.21"), fetch("0.5.20")).prefill_to_decode["abort ack"].startswith(
        "not waited for: the 0.5.20 decode frees an aborted request's KV pages at once")


@pytest.mark.timeout(300)
def test_a_0_5_21_prefill_behind_a_0_5_22_decode_holds_aborted_pages_until_the_timeout(tmp_path, monkeypatch):
    """What the pair check predicts, live: the 0.5.21 prefill drains the aborted room and acks without
    a generation; the 0.5.22 decode's own listener reads the ack and ignores it, so the pages stay
    held until SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT (5 s here), then freed."""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", "5")
    twin = twin_api.up("0.5.21", decode_sglang="0.5.22", directory=tmp_path, **TEST_SETTINGS)
    try:
        ack = twin.pair["prefill_to_decode"]["abort ack"]
        assert ack.startswith("none that counts: the 0.5.22 decode ignores") and "(SGLANG_DISAGGREGATION_DEFERRED_" \
            "DECODE_KV_RELEASE_TIMEOUT, 5 s)" in ack, ack
        assert _completes(twin, 60)
        _kill_until_the_prefill_saw_an_abort(twin)
        wait_until(lambda: twin_state(twin.decode)["counters"]["deferred_release_timeout"] == 1, 60,
                   "the held pages to be freed at the decode's timeout")
        state = twin_state(twin.decode)
        assert state["listener_received"].get("ABORT_ACK") == 1  # it arrived, and did not count
        assert state["counters"]["deferred_release_drained"] == 0 and state["held_for_drain"] == 0
        decode_log = twin.log_text("decode")
        assert "Generation-less ABORT_ACK received; ignoring it." in decode_log
        assert "timed out after 5.0s without a full drain ack from prefill" in decode_log
        assert _bootstrap_alive(twin) and _completes(twin, 60)
    finally:
        twin.down()
