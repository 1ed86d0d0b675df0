"""Arguments with shell metacharacters reach the remote program byte for byte (property test over SSH)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.hosts import LocalHost, SSHHost, State

pytestmark = [pytest.mark.server, pytest.mark.timeout(300)]

NASTY = ["; rm -rf /tmp/pdfx-never", "$(touch /tmp/pdfx-never)", "`id`", "'", '"', "\\", "a\nb", "*", "~", "-n",
         "--", "$HOME", "${IFS}", "&& echo pwned", "| cat", "> /tmp/pdfx-never", "ünïcödé ☃ 𝄞", "", " ", "\t"]

# Any text the kernel can take as an argument: no NUL, valid UTF-8 (surrogates cannot be encoded).
ARG = st.one_of(
    st.sampled_from(NASTY),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40),
)


def _expected(args: list[str]) -> bytes:
    return b"".join(a.encode() + b"\0" for a in args)




def test_nasty_arguments_literally_over_ssh(sshd):
    with SSHHost("127.0.0.1", **sshd.host_args()) as h:
        r = h.run(["printf", "%s\\0", *NASTY], timeout=60)
    assert r.state is State.OK, r
    assert r.stdout == _expected(NASTY)
    assert not os.path.exists("/tmp/pdfx-never")  # no metacharacter was ever interpreted


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(ARG, min_size=1, max_size=6))
def test_property_printf_roundtrip_over_ssh(sshd, args):
    with SSHHost("127.0.0.1", **sshd.host_args()) as h:
        r = h.run(["printf", "%s\\0", *args], timeout=60)
    assert r.state is State.OK, r
    assert r.stdout == _expected(args)


@settings(deadline=None, max_examples=60)
@given(args=st.lists(ARG, min_size=1, max_size=6))
def test_property_printf_roundtrip_local(args):
    r = LocalHost().run(["printf", "%s\\0", *args], timeout=60)
    assert r.stdout == _expected(args)
