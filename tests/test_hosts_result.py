"""CommandResult's explicit states and rendering, and the quoting of command lines."""

from __future__ import annotations

import shlex

import pytest

from forensics.hosts import CommandResult, State, remote_command_line
from forensics.hosts.quoting import check_argv


def test_state_is_one_of_five_words_never_empty():
    assert {s.value for s in State} == {"ok", "failed", "timed_out", "disconnected", "error"}
    for bad in ("", "OK ", "unknown"):
        with pytest.raises(ValueError):
            CommandResult("h", ("true",), bad)


def test_ok_and_failed_follow_the_state():
    ok = CommandResult("h", ["true"], "ok", exit_code=0)
    assert ok.ok and not ok.failed and ok.state is State.OK and ok.argv == ("true",)
    for state in ("failed", "timed_out", "disconnected", "error"):
        r = CommandResult("h", ("x",), state)
        assert r.failed and not r.ok


def test_text_views_decode_without_raising():
    r = CommandResult("h", ("x",), "failed", exit_code=2, stdout="héllo".encode(), stderr=b"\xff bad")
    assert r.stdout_text == "héllo"
    assert r.stderr_text.endswith(" bad") and "\ufffd" in r.stderr_text
    assert "failed (exit 2)" in r.summary()


def test_renders_in_notebook_and_terminal():
    r = CommandResult(
        "pd-prefill-0", ("cat", "<x>"), "timed_out", stdout=b"<script>", duration_s=1.5, truncated=True,
        error="killed at its 1s deadline",
    )
    html = r._repr_html_()
    assert "timed_out" in html and "&lt;script&gt;" in html and "<script>" not in html and "&lt;x&gt;" in html
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(r)
    text = console.export_text()
    assert "timed_out" in text and "pd-prefill-0" in text and "killed at its 1s deadline" in text


def test_command_line_is_quoted_bounded_and_sudo_never_prompts():
    line = remote_command_line(["cat", "/var/log/a b; rm -rf /"], timeout=30, sudo=True)
    assert shlex.split(line) == ["timeout", "--kill-after=2", "30", "sudo", "-n", "--", "cat", "/var/log/a b; rm -rf /"]
    assert shlex.split(remote_command_line(["true"], timeout=0)) [2] == "0.01"  # never timeout(1)'s "no deadline"


def test_argv_must_be_a_list_of_str():
    with pytest.raises(TypeError):
        check_argv("ls -l")
    with pytest.raises(ValueError):
        check_argv([])
    with pytest.raises(TypeError):
        check_argv(["ls", 3])


def test_hosts_load_lazily_and_local_needs_no_paramiko():
    import subprocess
    import sys

    code = (
        "import sys, forensics as fx\n"
        "assert 'forensics.hosts' not in sys.modules\n"
        "r = fx.hosts.LocalHost().run(['true'])\n"
        "assert r.ok and 'paramiko' not in sys.modules, sorted(m for m in sys.modules if 'paramiko' in m)\n"
        "fx.hosts.SSHHost\n"
        "assert 'paramiko' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
