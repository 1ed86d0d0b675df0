"""Logs from hosts: journals, files and commands read over a real SSH server, streamed into the scan.

The journals are real journal files written by ``forensics.logs.journal_write`` through
systemd-journal-remote from sglang-format text logs, and read back over SSH with
``journalctl --file/-D ... -u UNIT --since``: the events must be the ones the text file gives.
Failures (journalctl missing, permission denied, timeouts, a connection killed part-way)
must be problems naming the host and the log, never an empty result.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import psutil
import pytest

import forensics as fx
from forensics.hosts import LocalHost, SSHHost
from forensics.logs import incident as gen
from forensics.logs.journal_write import journal_remote_path, write_journal
from forensics.logs.remote import host_log_source, scan_hosts

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(600),
    pytest.mark.skipif(journal_remote_path() is None or shutil.which("journalctl") is None,
                       reason="needs systemd-journal-remote and journalctl (./run test installs them as root)"),
]

SINCE = "2025-07-01T12:00:20Z"
SAME = ["ts", "signature", "severity", "room", "rid", "rank", "thread", "message", "role"]
PREFILL_UNIT, DECODE_UNIT = gen.UNITS["prefill"], gen.UNITS["decode"]
TEST_USER = "pdfx-logs-test"


def _ssh(sshd, **overrides) -> SSHHost:
    return SSHHost("127.0.0.1", **{**sshd.host_args(), **overrides})


def _shared_dir(prefix: str) -> Path:
    """A directory every user can traverse (the unprivileged test user reads below it)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def logs():
    """The incident as sglang text logs and as journal files (one per unit) in one directory."""
    root = _shared_dir("pdfx-remote-logs-")
    incident = gen.generate("0.5.15", steady_seconds=30, after_seconds=330)
    text = gen.write_sglang_logs(incident, root / "text")
    journals = root / "journal"
    prefill = write_journal(text["prefill"], journals, unit=PREFILL_UNIT, hostname="pd-node-1")
    decode = write_journal(text["decode"], journals, unit="sglang-decode", hostname="pd-node-1")
    yield {"incident": incident, "text": text, "dir": journals, "prefill": prefill, "decode": decode}
    shutil.rmtree(root, ignore_errors=True)


def _local(path: Path, role: str, since=SINCE):
    return fx.logs.scan(fx.logs.LogSource(path, role=role), since=since)


def _assert_same_events(remote, local) -> None:
    assert len(remote.events)
    pd.testing.assert_frame_equal(remote.events[SAME].reset_index(drop=True), local.events[SAME].reset_index(drop=True))


# ------------------------------------------------------------------ journal files over SSH


def test_journal_write_sets_unit_identifier_and_the_lines_own_times(logs):
    out = subprocess.run(["journalctl", "--file", str(logs["prefill"]), "-o", "json", "--no-pager"],
                         capture_output=True, check=True, timeout=120).stdout.splitlines()
    entries = [json.loads(line) for line in out]
    text_lines = logs["text"]["prefill"].read_text().splitlines()
    assert [e["MESSAGE"] for e in entries] == text_lines
    assert {e["_SYSTEMD_UNIT"] for e in entries} == {PREFILL_UNIT}
    assert {e["SYSLOG_IDENTIFIER"] for e in entries} == {"sglang-prefill"}
    first = entries[0]
    assert text_lines[0].startswith("[2025-07-01 12:00:00") and first["__REALTIME_TIMESTAMP"] == "1751371200000000"
    death = next(i for i, line in enumerate(text_lines) if line.startswith("Exception in thread"))
    # the traceback has no time of its own: it carries the time of the line before it
    assert entries[death]["__REALTIME_TIMESTAMP"] == entries[death - 1]["__REALTIME_TIMESTAMP"]


def test_lines_before_the_first_time_take_it_and_non_utf8_survives():
    from forensics.logs.journal_write import export_entries

    lines = [b"banner\n", b"[2025-07-01 12:00:00.250 TP0] x\n", b"\xff raw\n", b"[2025-07-01 14:00:00] y\n"]
    entries = list(export_entries(lines, unit="u.service", identifier="u", hostname="h", pid=1, tz="Europe/Paris"))
    stamps = [next(f for f in e.split(b"\n") if f.startswith(b"__REALTIME_TIMESTAMP=")) for e in entries]
    # Paris is UTC+2 in July: 12:00:00.250 there is 10:00:00.250 UTC
    assert stamps == [b"__REALTIME_TIMESTAMP=1751364000250000"] * 3 + [b"__REALTIME_TIMESTAMP=1751371200000000"]
    assert b"MESSAGE=\xff raw\n" in entries[2]


def test_unit_filter_really_filters_a_journal_directory(logs):
    def messages(*extra):
        run = subprocess.run(["journalctl", "-D", str(logs["dir"]), *extra, "-o", "json", "--no-pager"],
                             capture_output=True, check=True, timeout=120)
        return [json.loads(line)["_SYSTEMD_UNIT"] for line in run.stdout.splitlines()]

    everything = messages()
    assert set(everything) == {PREFILL_UNIT, DECODE_UNIT}
    assert set(messages("-u", PREFILL_UNIT)) == {PREFILL_UNIT}
    assert set(messages("-u", "sglang-decode")) == {DECODE_UNIT}  # journalctl adds .service, as for real units
    assert len(messages("-u", PREFILL_UNIT)) + len(messages("-u", DECODE_UNIT)) == len(everything)


@pytest.mark.parametrize("kind", ["journal_dir", "journal_file"])
def test_journal_over_ssh_with_unit_and_since_gives_the_text_files_events(sshd, logs, kind):
    value = str(logs["dir"] if kind == "journal_dir" else logs["prefill"])
    with _ssh(sshd) as host:
        source = host_log_source(host, kind, value, unit=PREFILL_UNIT, role="prefill", since=SINCE)
        remote = fx.logs.scan([source], since=SINCE)
    local = _local(logs["text"]["prefill"], "prefill")
    assert remote.problems == [], remote.problems
    _assert_same_events(remote, local)
    label = f"ssh://{sshd.user}@127.0.0.1:{sshd.port} {kind.replace('_', '-')}:{value} unit:{PREFILL_UNIT}"
    assert source.label == label and set(remote.events["source"]) == {label}
    assert set(remote.events["ts_source"]) == {"journal"} and set(remote.events["unit"]) == {PREFILL_UNIT}
    death = remote.events[remote.events["signature"] == "thread_death"].iloc[0]
    assert death["thread"] == "Thread-5 (bootstrap_thread)" and death["host"] == "pd-node-1"
    # --since reached journalctl: nothing before the window came over the wire
    assert remote.sources.iloc[0]["lines"] < logs["text"]["prefill"].read_text().count("\n")
    assert remote.sources.iloc[0]["format"] == "json"
    assert len(remote.batches) == len(local.batches) and set(remote.batches["role"]) == {"prefill"}


def test_scan_hosts_reads_both_units_of_one_directory(sshd, logs):
    with _ssh(sshd) as host:
        scan = scan_hosts([
            {"host": host, "kind": "journal_dir", "value": str(logs["dir"]), "unit": PREFILL_UNIT, "role": "prefill"},
            (host, "file", str(logs["text"]["decode"]), "decode"),
        ], since=SINCE)
    assert scan.problems == []
    incident = logs["incident"]
    trigger = scan.events[scan.events["signature"] == "decode_transfer_aborted"].iloc[0]
    assert trigger["room"] == incident.trigger_room and trigger["role"] == "decode"
    assert (scan.events["signature"] == "thread_death").sum() == 1
    assert scan.summary() is not None and scan.assess().word == "findings"


# ------------------------------------------------------------------ files and commands


def test_file_over_sftp_windowed_by_the_scanner(sshd, logs):
    path = logs["text"]["prefill"]
    with _ssh(sshd) as host:
        source = host_log_source(host, "file", str(path), role="prefill")
        remote = fx.logs.scan([source], since=SINCE)
    assert remote.problems == []
    assert source.label == f"ssh://{sshd.user}@127.0.0.1:{sshd.port} file:{path}"
    _assert_same_events(remote, _local(path, "prefill"))
    # the whole file came over; the window was applied by the scanner
    assert remote.sources.iloc[0]["lines"] == path.read_text().count("\n")


def test_sftp_pieces_are_the_files_bytes(sshd, tmp_path):
    from forensics.logs.remote import SFTP_WINDOW, _sftp_pieces

    for size in (0, 1, SFTP_WINDOW, 2 * SFTP_WINDOW + 12345):
        data = os.urandom(size)
        path = tmp_path / f"blob-{size}"
        path.write_bytes(data)
        with _ssh(sshd) as host:
            pieces = list(_sftp_pieces(host, str(path)))
        assert b"".join(pieces) == data and all(len(p) <= SFTP_WINDOW for p in pieces)


def test_gzipped_file_over_sftp(sshd, logs, tmp_path):
    packed = tmp_path / "prefill.log.gz"
    packed.write_bytes(gzip.compress(logs["text"]["prefill"].read_bytes()))
    with _ssh(sshd) as host:
        remote = fx.logs.scan([host_log_source(host, "file", str(packed), role="prefill")], since=SINCE)
    assert remote.problems == []
    _assert_same_events(remote, _local(logs["text"]["prefill"], "prefill"))


def test_command_output_streamed(sshd, logs):
    path = str(logs["text"]["prefill"])
    with _ssh(sshd) as host:
        source = host_log_source(host, "command", ["cat", path], role="prefill")
        remote = fx.logs.scan([source], since=SINCE)
        failing = fx.logs.scan([host_log_source(host, "command", ["sh", "-c", f"cat {path}; echo boom >&2; exit 3"],
                                                role="prefill")], since=SINCE)
    assert remote.problems == [] and source.label.endswith(f" command:cat {path}")
    _assert_same_events(remote, _local(logs["text"]["prefill"], "prefill"))
    # a command that fails after its output: the lines are kept, the failure is a problem
    _assert_same_events(failing, remote)
    [problem] = failing.problems
    assert "exited with status 3" in problem.message and "boom" in problem.message
    assert "kept them" in problem.message and not problem.unreadable


def test_binary_journal_named_as_a_file_says_how_to_read_it(sshd, logs):
    with _ssh(sshd) as host:
        scan = fx.logs.scan([host_log_source(host, "file", str(logs["prefill"]), role="prefill")])
    [problem] = scan.problems
    assert problem.unreadable and "binary journal" in problem.message and "journal_file" in problem.message


# ------------------------------------------------------------------ failures are problems


def test_journalctl_missing_on_the_host_is_named_with_the_fix(sshd, logs):
    with _ssh(sshd) as host:
        scan = fx.logs.scan([host_log_source(host, "journal_dir", str(logs["dir"]), unit=PREFILL_UNIT,
                                             role="prefill", journalctl="/nonexistent/journalctl")])
    [problem] = scan.problems
    assert problem.unreadable and problem.source.startswith(f"ssh://{sshd.user}@127.0.0.1:{sshd.port} journal-dir:")
    assert "journalctl not found on the host" in problem.message and "fix:" in problem.message
    assert scan.assess().word == "inconclusive"
    local = fx.logs.scan([host_log_source(LocalHost(), "unit", PREFILL_UNIT, role="prefill",
                                          journalctl="/nonexistent/journalctl")])
    assert local.problems[0].unreadable and "journalctl not found" in local.problems[0].message


def test_empty_window_is_an_answer_not_a_read_failure(sshd, logs):
    with _ssh(sshd) as host:
        empty = fx.logs.scan([host_log_source(host, "journal_dir", str(logs["dir"]), unit=PREFILL_UNIT,
                                              role="prefill", since="2030-01-01T00:00:00Z")])
        other_unit = fx.logs.scan([host_log_source(host, "journal_dir", str(logs["dir"]), unit="nosuch.service",
                                                   role="prefill")])
        missing = fx.logs.scan([host_log_source(host, "journal_file", "/nonexistent/x.journal", unit=PREFILL_UNIT,
                                                role="prefill")])
    for scan in (empty, other_unit):
        [problem] = scan.problems
        assert not problem.unreadable and problem.message.startswith("no lines in the window"), problem
    assert "2030-01-01" in empty.problems[0].message and "nosuch.service" in other_unit.problems[0].message
    [problem] = missing.problems
    assert problem.unreadable and "no such journal file" in problem.message


def test_unit_kind_runs_journalctl_u_with_the_window(sshd):
    from forensics.logs.remote import journalctl_argv

    since = pd.Timestamp("2025-07-01T12:00:20.5Z")
    assert journalctl_argv("unit", PREFILL_UNIT, since=since) == [
        "journalctl", "-u", PREFILL_UNIT, "-o", "json", "--all", "--no-pager", "--since", "@1751371220.500000"]
    # this machine runs no journald: the unit has no entries, which is an answer, not a failure
    with _ssh(sshd) as host:
        scan = fx.logs.scan([host_log_source(host, "unit", PREFILL_UNIT, role="prefill", since=since)])
    [problem] = scan.problems
    assert problem.source == f"ssh://{sshd.user}@127.0.0.1:{sshd.port} journal:{PREFILL_UNIT}"
    assert problem.message.startswith("no lines in the window") and not problem.unreadable


def _fake_journalctl(directory: Path, script: str) -> str:
    path = directory / "journalctl"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return str(path)


def test_journal_output_cut_mid_line_is_a_problem(sshd, tmp_path):
    entry = json.dumps({"MESSAGE": "[2025-07-01 12:00:00 TP0] hello", "__REALTIME_TIMESTAMP": "1751371200000000"})
    fake = _fake_journalctl(tmp_path, f"printf '%s\\n%s' '{entry}' '{entry[:20]}'")
    with _ssh(sshd) as host:
        scan = fx.logs.scan([host_log_source(host, "unit", PREFILL_UNIT, role="prefill", journalctl=fake)])
    cut = [p for p in scan.problems if "cut" in p.message]
    assert len(cut) == 1 and "middle of a line" in cut[0].message and not cut[0].unreadable, scan.problems
    assert scan.lines_total == 2


def test_journal_hiding_other_users_messages_is_permission_denied(sshd, tmp_path):
    # journalctl as a user outside systemd-journal/adm: exit 0, nothing printed, a hint on stderr
    fake = _fake_journalctl(tmp_path, "echo 'Hint: You are currently not seeing messages from other users and "
                                      "the system.' >&2; exit 0")
    with _ssh(sshd) as host:
        scan = fx.logs.scan([host_log_source(host, "unit", PREFILL_UNIT, role="prefill", journalctl=fake)])
    [problem] = scan.problems
    assert problem.unreadable and "permission denied" in problem.message and "systemd-journal" in problem.message


def test_timeout_keeps_what_came_before(sshd, logs):
    path = str(logs["text"]["prefill"])
    with _ssh(sshd) as host:
        scan = fx.logs.scan([host_log_source(host, "command", ["sh", "-c", f"cat {path}; exec sleep 60"],
                                             role="prefill", timeout=3)], since=SINCE)
        silent = fx.logs.scan([host_log_source(host, "command", ["sleep", "60"], role="prefill", timeout=2)])
    _assert_same_events(scan, _local(logs["text"]["prefill"], "prefill"))
    [problem] = scan.problems
    assert "timed out" in problem.message and "timeout=3" in problem.message and not problem.unreadable
    [problem] = silent.problems
    assert "timed out" in problem.message and problem.unreadable


# ------------------------------------------------------------------ permissions (a real unprivileged user)


@pytest.fixture(scope="module")
def plain_user(sshd):
    from user_helpers import skip_reason, test_user

    if skip_reason():
        pytest.skip(skip_reason())
    with test_user(TEST_USER) as name:
        yield name


def test_permission_denied_is_named_with_the_fix(sshd, logs, plain_user):
    locked = logs["dir"].parent / "locked.log"
    shutil.copy(logs["text"]["prefill"], locked)
    locked.chmod(0o000)
    logs["prefill"].chmod(0o640)  # root's journal file, as journald leaves them
    logs["dir"].chmod(0o755)
    try:
        with _ssh(sshd, user=plain_user) as host:
            scan = fx.logs.scan([
                host_log_source(host, "file", str(locked), role="prefill"),
                host_log_source(host, "journal_file", str(logs["prefill"]), unit=PREFILL_UNIT, role="prefill"),
                host_log_source(host, "file", str(locked), role="prefill", sudo=True),
            ])
    finally:
        locked.unlink()
    file_problem, journal_problem, sudo_problem = scan.problems
    assert file_problem.source == f"ssh://{plain_user}@127.0.0.1:{sshd.port} file:{locked}"
    for problem in scan.problems:
        assert problem.unreadable, problem
    assert "permission denied" in file_problem.message and "sudo = true" in file_problem.message
    assert "permission denied" in journal_problem.message.lower()
    assert "systemd-journal" in journal_problem.message and "sudo = true" in journal_problem.message
    # sudo without a rule for this user: sudo's refusal, with what to allow
    assert "sudo" in sudo_problem.message and "fix:" in sudo_problem.message
    assert len(scan.events) == 0 and scan.assess().word == "inconclusive"


# ------------------------------------------------------------------ the connection dropping mid-stream


def _big_log(path: Path, incident, size: int) -> int:
    """The incident's prefill log, then filler lines up to ``size`` bytes; returns the line count."""
    head = "".join(gen.sglang_line(r) + "\n" for r in incident.records if r.role == "prefill")
    filler = "".join(f'[2025-07-01 12:30:{i % 60:02d}] INFO:     127.0.0.1:{40000 + i} - "GET /health HTTP/1.1" '
                     f"200 OK\n" for i in range(5000)).encode()
    lines = head.count("\n")
    with open(path, "wb") as handle:
        handle.write(head.encode())
        written = len(head)
        while written < size:
            handle.write(filler)
            written += len(filler)
            lines += 5000
    return lines


def _kill_sshd(server) -> None:
    """SIGKILL the test sshd and every session process under it: the connection just drops."""
    procs = [server.proc]
    try:
        procs += psutil.Process(server.proc.pid).children(recursive=True)
    except psutil.Error:
        pass
    for proc in reversed(procs):
        try:
            proc.kill()
        except (psutil.Error, ProcessLookupError):
            pass


@pytest.mark.parametrize("kind", ["file", "command"])
def test_sshd_killed_mid_stream_keeps_the_lines_before(logs, kind, tmp_path):
    from sshd_helpers import skip_reason, start_sshd

    if skip_reason():
        pytest.skip(skip_reason())
    big = tmp_path / "big.log"
    total_lines = _big_log(big, logs["incident"], 96 << 20)
    server = start_sshd()
    killed = []

    def progress(label: str, size: int) -> None:
        if not killed:
            killed.append(size)
            _kill_sshd(server)

    try:
        with _ssh(server) as host:
            value = str(big) if kind == "file" else ["cat", str(big)]
            source = host_log_source(host, kind, value, role="prefill")
            scan = fx.logs.scan([source], progress=progress)
    finally:
        _kill_sshd(server)
        server.proc.wait(30)
        server.stop()
    assert killed
    [problem] = scan.problems
    assert problem.source == source.label and source.label.startswith(f"ssh://{server.user}@127.0.0.1:{server.port} ")
    assert "connection" in problem.message and "stopped after" in problem.message and "kept them" in problem.message
    assert not problem.unreadable
    read = int(scan.sources.iloc[0]["lines"])
    assert 0 < read < total_lines
    assert f"stopped after {read} whole lines" in problem.message or "whole lines" in problem.message
    # what came before the drop is all there: the thread death near the start
    assert (scan.events["signature"] == "thread_death").sum() == 1


# ------------------------------------------------------------------ bounded memory


MEMORY_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import forensics as fx
    from forensics.hosts import SSHHost
    from forensics.logs.remote import host_log_source

    args = json.loads(sys.argv[1])
    host = SSHHost("127.0.0.1", **args["host"])
    kind = args["kind"]
    def value(path):
        return path if kind == "file" else ["cat", path]
    # warm up on a log of 16 MiB: imports, the session, the scanner's own per-scan frames
    fx.logs.scan([host_log_source(host, kind, value(args["small"]), role="prefill")])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    scan = fx.logs.scan([host_log_source(host, kind, value(args["big"]), role="prefill")])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    host.close()
    print(json.dumps({"growth": after - before, "lines": int(scan.lines_total),
                      "problems": [str(p) for p in scan.problems]}))
""")


@pytest.mark.parametrize("kind", ["file", "command"])
def test_streaming_a_big_log_costs_far_less_memory_than_the_log(sshd, logs, tmp_path, kind):
    big = tmp_path / "big.log"
    size = 128 << 20
    total_lines = _big_log(big, logs["incident"], size)
    small = tmp_path / "small.log"
    _big_log(small, logs["incident"], 16 << 20)
    host_args = {k: (str(v) if isinstance(v, Path) else v) for k, v in sshd.host_args().items()}
    run = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT,
                          json.dumps({"host": host_args, "big": str(big), "small": str(small), "kind": kind})],
                         capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["problems"] == [] and found["lines"] == total_lines, found
    # reading 8 times as much costs what a local scan of the file costs more (about 25 MiB of the
    # scanner's own on this log): chunks in flight, never the log
    assert found["growth"] < size // 3, (found["growth"], size)
