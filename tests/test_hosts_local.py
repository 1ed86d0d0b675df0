"""LocalHost: the Host contract on this machine (states, deadlines, byte cap, streaming, files)."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
import uuid

import pytest

from forensics.hosts import LocalHost, State
from tests.process_helpers import gone, procs_with, sleep_marker

pytestmark = pytest.mark.timeout(120)






def test_ok_failed_error_states():
    h = LocalHost()
    ok = h.run(["sh", "-c", "printf out; printf err >&2"])
    assert (ok.state, ok.exit_code, ok.stdout, ok.stderr) == (State.OK, 0, b"out", b"err")
    failed = h.run(["sh", "-c", "exit 7"])
    assert failed.state is State.FAILED and failed.exit_code == 7 and failed.failed
    error = h.run([f"/nonexistent/{uuid.uuid4().hex}"])
    assert error.state is State.ERROR and error.exit_code is None and "no executable program" in error.error
    assert h.run([f"no-such-program-{uuid.uuid4().hex}"]).state is State.ERROR


def test_timeout_kills_the_command_and_its_children():
    marker = sleep_marker()
    start = time.monotonic()
    r = LocalHost().run(["sh", "-c", f"sleep {marker} & trap '' TERM; sleep {marker}; wait"], timeout=1)
    assert r.state is State.TIMED_OUT and r.exit_code is None and r.error
    assert time.monotonic() - start < 30
    assert gone(marker), [p.cmdline() for p in procs_with(marker)]


def test_byte_cap_truncates_and_says_so():
    r = LocalHost().run(["head", "-c", "300000", "/dev/zero"], max_bytes=1000)
    assert r.state is State.OK and r.truncated and len(r.stdout) == 1000
    r = LocalHost().run(["head", "-c", "1000", "/dev/zero"], max_bytes=1000)
    assert not r.truncated and len(r.stdout) == 1000


def test_stream_is_chunked_and_bounded_in_memory():
    total = 64 * 1024 * 1024
    tracemalloc.start()
    try:
        seen = 0
        with LocalHost().stream(["head", "-c", str(total), "/dev/zero"], chunk_size=65536) as s:
            for chunk in s:
                assert 0 < len(chunk) <= 65536
                seen += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == total
    assert s.result.state is State.OK and s.result.stdout == b""
    assert peak < 4 * 1024 * 1024, peak


def test_closing_a_stream_early_stops_the_command():
    marker = sleep_marker()
    with LocalHost().stream(["sh", "-c", f"echo first; exec sleep {marker}"], timeout=300) as s:
        assert next(iter(s)) == b"first\n"
    assert gone(marker)


def test_arguments_pass_literally():
    args = ["; rm -rf /tmp/x", "$(id)", "'\"", "a\nb", "ünï ☃", ""]
    r = LocalHost().run(["printf", "%s\\0", *args])
    assert r.stdout == b"".join(a.encode() + b"\0" for a in args)


def test_read_put_iter_file(tmp_path):
    h = LocalHost()
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 1000)
    dest = tmp_path / "dest.bin"
    h.put_file(src, str(dest))
    assert h.read_file(str(dest)) == src.read_bytes()
    assert b"".join(h.iter_file(str(dest), 4096)) == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest.bin", "src.bin"]
    with pytest.raises(FileNotFoundError):
        h.read_file(str(tmp_path / "missing"))


def test_command_dies_at_its_deadline_even_when_the_caller_is_killed():
    marker = sleep_marker()
    script = (
        "import sys, time\n"
        "from forensics.hosts import LocalHost\n"
        f"s = LocalHost().stream(['sh', '-c', 'echo started; exec sleep {marker}'], timeout=4)\n"
        "it = iter(s)  # kept: dropping the iterator would close the stream and stop the command\n"
        "print(next(it).decode(), end='', flush=True)\n"
        "time.sleep(600)\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert caller.stdout.readline() == b"started\n"
        caller.kill()  # no cleanup runs in the caller
    finally:
        caller.kill()
        caller.wait(30)
        caller.stdout.close()
    assert procs_with(marker)  # orphaned, still running ...
    assert gone(marker, within=4 + 2 + 30)  # ... until its own timeout(1) wrapper ends it
