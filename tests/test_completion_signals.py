"""How a transfer's end reaches a NIXL decode, read from each release's own code (the prefill →
decode half of the mixed-version pair check, ``forensics.twin.completion_signals``).

The releases are those where the signal changes: 0.5.19 (notifications only, no listener by
default), 0.5.20 (a decode listener that also takes KV_STATUS), 0.5.22 (the last prefill that
ends a transfer with the {room}_aux notification) and 0.5.23 (KV_STATUS only, on both sides).
Each expected line is checked against the release's own text, so the test reads no table either.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from forensics.sglang_source import fetch
from forensics.twin.completion_signals import (
    AUX_NOTIFICATION,
    completion_path,
    decode_completes_on,
    failure_fate,
    failure_report,
    missing_completion,
    prefill_sends,
    shared_signals,
)

DISAGGREGATION = "sglang/srt/disaggregation"


def _line(source, where: str) -> str:
    relative, number = where.rsplit(":", 1)
    text = source.verified_read_text(Path(source.root) / DISAGGREGATION / relative)
    return text.splitlines()[int(number) - 1]


def _fork_of(version: str, root: Path, relative: str, old: str, new: str):
    """``version``'s disaggregation conn files with one edit: a fork or a future release, as the check sees it."""
    source = fetch(version)
    for name in ("base/conn.py", "common/conn.py", "nixl/conn.py"):
        text = source.verified_read_text(Path(source.root) / DISAGGREGATION / name)
        if name == relative:
            assert old in text, (relative, old)
            text = text.replace(old, new)
        target = root / DISAGGREGATION / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return SimpleNamespace(root=str(root), version=f"{version}+fork",
                           verified_read_text=lambda path: Path(path).read_text())


@pytest.mark.timeout(120)
def test_what_each_prefill_sends_when_a_transfer_succeeds():
    for version in ("0.5.1", "0.5.19", "0.5.22"):
        source = fetch(version)
        sent = prefill_sends(source)
        assert list(sent) == [AUX_NOTIFICATION], version
        assert "_aux" in _line(source, sent[AUX_NOTIFICATION].where)
    newest = fetch("0.5.23")
    sent = prefill_sends(newest)
    assert list(sent) == ["KV_STATUS"]  # 0.5.23 tags no WRITE: no notification at all
    assert re.search(r"conclude_transfer\(.*KVPoll\.Success", _line(newest, sent["KV_STATUS"].where))


@pytest.mark.timeout(120)
def test_what_each_decode_completes_on():
    assert list(decode_completes_on(fetch("0.5.19"))) == [AUX_NOTIFICATION]  # its listener starts only with staging
    for version in ("0.5.20", "0.5.22"):
        source = fetch(version)
        both = decode_completes_on(source)
        assert set(both) == {AUX_NOTIFICATION, "KV_STATUS"}, version
        assert "check_transfer_done" in _line(source, both[AUX_NOTIFICATION].where)
        assert "apply_prefill_status" in _line(source, both["KV_STATUS"].where)
    newest = fetch("0.5.23")
    only = decode_completes_on(newest)
    assert list(only) == ["KV_STATUS"] and "apply_prefill_status" in _line(newest, only["KV_STATUS"].where)


@pytest.mark.timeout(120)
def test_a_pair_without_a_shared_completion_signal_is_named_with_both_sides_lines():
    old_prefill, new_decode = fetch("0.5.22"), fetch("0.5.23")
    refused = missing_completion(old_prefill, new_decode)
    assert re.search(r"the 0\.5\.23 decode completes a transfer only on the prefill's KV_STATUS \(nixl/conn\.py:\d+, "
                     r"read by its decode listener thread\), which sglang 0\.5\.22's prefill never sends \(it ends a "
                     r"transfer with NIXL notification \{room\}_aux \(nixl/conn\.py:\d+\)\)", refused), refused
    assert "KVPoll.WaitingForInput" in refused and completion_path(old_prefill, new_decode) == ""
    # The other way round the 0.5.22 decode's listener takes 0.5.23's KV_STATUS ...
    assert missing_completion(new_decode, old_prefill) == ""
    assert completion_path(new_decode, old_prefill).startswith("KV_STATUS: sent at prefill nixl/conn.py:")
    # ... which a 0.5.19 decode does not read: it waits for a notification 0.5.23 never sends.
    assert "the 0.5.19 decode completes a transfer only on the prefill's NIXL notification {room}_aux" in (
        missing_completion(new_decode, fetch("0.5.19")))
    # Same-release pairs and pairs on one side of the change serve.
    for prefill, decode in (("0.5.22", "0.5.22"), ("0.5.23", "0.5.23"), ("0.5.19", "0.5.20"), ("0.5.15", "0.5.16")):
        assert missing_completion(fetch(prefill), fetch(decode)) == "", (prefill, decode)
    # What the pair check replays: the status message where it is the only shared signal.
    assert shared_signals(fetch("0.5.23"), fetch("0.5.20")) == ["KV_STATUS"]
    assert shared_signals(fetch("0.5.22"), fetch("0.5.22")) == [AUX_NOTIFICATION]
    assert shared_signals(old_prefill, new_decode) == []


@pytest.mark.timeout(120)
def test_the_decision_follows_the_code_not_the_version(tmp_path):
    # A 0.5.22 whose transfer worker also concludes a successful room with KV_STATUS (as 0.5.23 does)
    # serves a 0.5.23 decode: the check reads the call, not the release number.
    fork = _fork_of("0.5.22", tmp_path / "fork", "nixl/conn.py", "                    self.update_status(room, KVPoll.Success)\n",
                    "                    self.conclude_transfer(bootstrap_room=room, status=KVPoll.Success)\n")
    assert set(prefill_sends(fork)) == {AUX_NOTIFICATION, "KV_STATUS"}
    assert missing_completion(fork, fetch("0.5.23")) == ""


@pytest.mark.timeout(120)
def test_the_failure_report_is_recorded_with_what_the_decode_does_with_it():
    taken, replayable = failure_report(fetch("0.5.22"), fetch("0.5.23"))
    assert replayable and taken == failure_fate(fetch("0.5.22"), fetch("0.5.23"))
    assert re.fullmatch(r"the 0\.5\.22 prefill's KV_STATUS on a failed transfer \(nixl/conn\.py:\d+\) is taken by "
                        r"the 0\.5\.23 decode's listener \(nixl/conn\.py:\d+\)", taken), taken
    unread, replayable = failure_report(fetch("0.5.20"), fetch("0.5.18"))
    assert not replayable
    assert "is unread (its NixlKVManager starts no listener" in unread and "waiting timeout" in unread
    assert "starts the decode listener only when self.enable_staging" in failure_fate(fetch("0.5.23"), fetch("0.5.19"))
    assert failure_fate(fetch("0.5.19"), fetch("0.5.20")).startswith(
        "the 0.5.19 prefill sends no status message on a failed transfer")
