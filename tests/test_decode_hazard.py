"""Which releases' decodes block for good on a send to a restarted prefill, read from their source."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from patched_engine.decode_hazard import blocking_connect, decode_hazards, release_blocks


def _receiver(body: str) -> str:
    return textwrap.dedent("""
        import zmq

        class CommonKVReceiver:
            @classmethod
            def _connect(cls, endpoint):
                sock = cls._ctx.socket(zmq.PUSH)
        """) + textwrap.indent(textwrap.dedent(body), " " * 8) + "        return sock\n"


def test_a_socket_that_never_reconnects_and_never_times_out_blocks():
    text = _receiver("sock.setsockopt(zmq.RECONNECT_IVL, -1)\nsock.setsockopt(zmq.LINGER, 0)\n")
    assert blocking_connect(text) == 6  # the def line, as in 0.5.15 (1101)


@pytest.mark.parametrize("body", [
    "sock.setsockopt(zmq.RECONNECT_IVL, -1)\nsock.setsockopt(zmq.SNDTIMEO, 30000)\n",  # times out
    "sock.setsockopt(zmq.LINGER, 0)\n",  # reconnects (ZMQ's default interval)
    "sock.setsockopt(zmq.RECONNECT_IVL, 100)\n",
])
def test_a_socket_that_reconnects_or_times_out_does_not(body):
    assert blocking_connect(_receiver(body)) is None


def test_the_method_must_be_the_receivers():
    text = _receiver("sock.setsockopt(zmq.RECONNECT_IVL, -1)\n").replace("CommonKVReceiver", "CommonKVSender")
    assert blocking_connect(text) is None


@pytest.mark.parametrize(("release", "expected"), [
    ("0.5.14", None),  # the sender's sockets have RECONNECT_IVL -1 with SNDTIMEO; the receiver's reconnect
    ("0.5.15", "common/conn.py:1101 CommonKVReceiver._connect"),
    ("0.5.15.post1", "common/conn.py:1101 CommonKVReceiver._connect"),
    ("0.5.16", None),  # RECONNECT_IVL -1 dropped from the receiver's socket
    ("0.5.17", None),  # and SNDTIMEO added
])
def test_read_from_each_releases_own_common_conn(release, expected):
    assert release_blocks(release) == expected


def _decode_site(directory: Path, release: str) -> Path:
    """A site-packages holding the release's version file and nixl/conn.py (what its interpreter reports)."""
    from forensics.sglang_source import fetch

    source = fetch(release)
    site = directory / "site-packages"
    nixl = site / "sglang/srt/disaggregation/nixl"
    nixl.mkdir(parents=True)
    (site / "sglang/__init__.py").write_text("")
    shutil.copyfile(source.root / "sglang/_version.py", site / "sglang/_version.py")
    shutil.copyfile(source.root / "sglang/srt/disaggregation/nixl/conn.py", nixl / "conn.py")
    return site


def _inventory(decode_fields: str):
    from forensics.inventory import loads

    return loads(textwrap.dedent(f"""
        [deployment]
        name = "no-release-given"
        backend = "nixl"

        [[engine]]
        role = "prefill"
        url = "http://127.0.0.1:2"
        bootstrap_port = 3
        host = "local"

        [[engine]]
        role = "decode"
        url = "http://127.0.0.1:1"
        host = "local"
        restart = "systemctl restart sglang-decode.service"
        {decode_fields}
        """))


def test_a_decode_whose_release_is_not_in_the_inventory_is_asked_with_its_own_interpreter(tmp_path):
    site = _decode_site(tmp_path, "0.5.15")
    inv = _inventory(f'python = "{sys.executable}"\nsglang_location = "{site}"')
    hazards, undecided = decode_hazards(inv)
    assert undecided == []
    [hazard] = hazards
    assert (hazard.release, hazard.where) == ("0.5.15", "common/conn.py:1101 CommonKVReceiver._connect")
    assert hazard.restart == ["systemctl", "restart", "sglang-decode.service"]


def test_a_decode_whose_release_cannot_be_had_is_undecided_never_safe(tmp_path):
    inv = _inventory(f'python = "{tmp_path / "no-such-python"}"')
    hazards, undecided = decode_hazards(inv)
    assert hazards == []
    [why] = undecided
    assert why.startswith("decode-0 (local): its sglang release is not in the inventory and could not be asked")
    assert "no-such-python" in why
