"""Which releases' decodes block for good on a send to a restarted prefill, read from their source."""

from __future__ import annotations

import textwrap

import pytest

from patched_engine.decode_hazard import blocking_connect, release_blocks


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
