"""``forensics threads check``: dumps as people have them, from real sglang 0.5.13 and real tools.

The material is real (tests/data/real-engine-0.5.13/threads/README.md): py-spy's text, --native and
JSON dumps of a real PD pair's schedulers, HTTP server and detokenizer; the faulthandler dumps
sglang's scheduler wrote on SIGABRT; the py-spy blocks sglang's own watchdog wrote into its log.
Where a case needs what no real engine gave (200 threads, --locals, --subprocesses), a real
process is dumped by the real tool (py-spy, faulthandler).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.exitcodes import EnvironmentProblem
from forensics.threads import check_dump_files, read_dump_file
from forensics.threads.filecheck import CLEAN, FINDINGS, INCONCLUSIVE, NOT_CHECKED
from forensics.threads.textdump import FAULTHANDLER, PYSPY_JSON, PYSPY_NATIVE, PYSPY_TEXT, thread_target

DATA = Path(__file__).parent / "data" / "real-engine-0.5.13" / "threads"
RELEASE = "0.5.13"
PY_SPY = str(Path(sys.executable).with_name("py-spy"))  # ./run installs it beside the interpreter

# file -> (format, pid, threads, process, role): what each real dump is
REAL_DUMPS = {
    "prefill-scheduler.pyspy.txt": (PYSPY_TEXT, 4148, 8, "scheduler", "prefill"),
    "prefill-scheduler.pyspy-native.txt": (PYSPY_NATIVE, 4148, 8, "scheduler", "prefill"),
    "prefill-scheduler.pyspy.json": (PYSPY_JSON, 4148, 8, "scheduler", "prefill"),
    "prefill-scheduler-wedged.pyspy.txt": (PYSPY_TEXT, 4148, 7, "scheduler", "prefill"),
    "prefill-scheduler-wedged.pyspy-native.txt": (PYSPY_NATIVE, 4148, 7, "scheduler", "prefill"),
    "decode-scheduler.pyspy.txt": (PYSPY_TEXT, 4145, 4, "scheduler", "decode"),
    "decode-scheduler.pyspy-native.txt": (PYSPY_NATIVE, 4145, 4, "scheduler", "decode"),
    "prefill-detokenizer.pyspy.txt": (PYSPY_TEXT, 4149, 2, "detokenizer", None),
    "prefill-http-server.pyspy.txt": (PYSPY_TEXT, 6643, 5, "http server", None),
    "decode-http-server.pyspy.txt": (PYSPY_TEXT, None, None, "http server", None),
    "prefill-sigabrt-faulthandler.log": (FAULTHANDLER, None, 7, "scheduler", "prefill"),
    "decode-sigabrt-faulthandler.log": (FAULTHANDLER, None, 4, "scheduler", "decode"),
}


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_every_real_dump_is_read_whole_and_told_apart(name):
    from forensics.threads.filecheck import identify

    fmt, pid, threads, process, role = REAL_DUMPS[name]
    dumps = read_dump_file(DATA / name)
    assert len(dumps) == 1, dumps
    dump = dumps[0]
    assert dump.format == fmt
    assert dump.problems == [] and dump.truncated == [] and dump.complete
    if pid is not None:
        assert dump.pid == pid
    if threads is not None:
        assert dump.thread_count() == threads
    identity = identify(dump)
    assert (identity.process, identity.role) == (process, role), identity
    assert str(dump.frame["thread_id"].dtype) == "uint64"


@pytest.mark.parametrize("name, role, status", [
    ("prefill-scheduler.pyspy.txt", "prefill", CLEAN),
    ("prefill-scheduler.pyspy-native.txt", "prefill", CLEAN),
    ("prefill-scheduler.pyspy.json", "prefill", CLEAN),
    ("prefill-scheduler-wedged.pyspy.txt", "prefill", FINDINGS),
    ("prefill-scheduler-wedged.pyspy-native.txt", "prefill", FINDINGS),
    ("prefill-sigabrt-faulthandler.log", "prefill", FINDINGS),
    ("decode-scheduler.pyspy.txt", "decode", CLEAN),
    ("decode-scheduler.pyspy-native.txt", "decode", CLEAN),
    ("decode-sigabrt-faulthandler.log", "decode", CLEAN),
])
def test_real_scheduler_dumps_are_checked_against_the_release(name, role, status):
    check = check_dump_files([DATA / name], sglang=RELEASE, role=role)
    assert check.status == status, check.text()
    assert check.exit_status == {CLEAN: 0, FINDINGS: 1}[status]
    frame = check.frame()
    if status == FINDINGS:
        missing = frame[frame["status"] == "missing"]
        assert list(missing["logical_name"]) == ["bootstrap"]
        assert "bootstrap_thread missing" in check.text()
    transfer = frame[frame["logical_name"] == "transfer_worker"]
    if role == "prefill":
        assert list(transfer["found"]) == [4]  # every one of the four, by name or by its stack


def test_a_faulthandler_dump_knows_each_thread_by_the_function_it_was_started_on():
    (dump,) = read_dump_file(DATA / "prefill-sigabrt-faulthandler.log")
    targets = [t and t[0] for t in map(thread_target, dump.frame["frames"])]
    assert targets == ["transfer_worker"] * 4 + ["_watchdog_thread", "run", None]  # tqdm's TMonitor.run; main
    assert dump.pid is None and dump.context == "Fatal Python error: Aborted"
    assert not dump.named and dump.line == 119  # the "Fatal Python error" line


def test_sglangs_own_pyspy_blocks_in_its_log_are_each_a_dump_with_the_time_of_its_line():
    check = check_dump_files([DATA / "prefill-watchdog-pyspy.log"], sglang=RELEASE, role="prefill")
    dumps = [r.dump for r in check.results]
    assert [d.pid for d in dumps] == [5528, 5528, 5528]
    assert {d.format for d in dumps} == {PYSPY_NATIVE}  # the command in sglang's line says --native
    assert [d.logged_at for d in dumps] == [datetime(2026, 12, 3, 12, 43, s, tzinfo=UTC) for s in (11, 28)] + [
        datetime(2026, 12, 3, 12, 43, 41, tzinfo=UTC)]
    assert [r.status for r in check.results] == [CLEAN, CLEAN, FINDINGS]  # bootstrap_thread died in between
    assert all(d.complete for d in dumps), [d.problems for d in dumps]
    assert check.exit_status == 1


@pytest.mark.parametrize("name, role", [
    ("prefill-http-server.pyspy.txt", "prefill"),
    ("prefill-detokenizer.pyspy.txt", "prefill"),
    ("decode-sigabrt-faulthandler.log", "prefill"),  # the other role's scheduler
    ("prefill-scheduler.pyspy.txt", "decode"),
])
def test_a_dump_of_another_process_or_role_is_undecidable_and_says_which_it_is(name, role):
    check = check_dump_files([DATA / name], sglang=RELEASE, role=role)
    assert check.status == INCONCLUSIVE and check.exit_status == 3
    (result,) = check.results
    assert result.status == NOT_CHECKED
    assert any(word in " ".join(result.reasons) for word in ("http server", "detokenizer", "scheduler's dump"))
    assert f"no dump of a {role} scheduler" in check.text()


def test_other_processes_beside_the_scheduler_do_not_hide_its_verdict():
    files = [DATA / "prefill-http-server.pyspy.txt", DATA / "prefill-scheduler-wedged.pyspy.txt",
             DATA / "prefill-detokenizer.pyspy.txt"]
    check = check_dump_files(files, sglang=RELEASE, role="prefill")
    assert check.status == FINDINGS and [r.status for r in check.results] == [NOT_CHECKED, FINDINGS, NOT_CHECKED]
    healthy = check_dump_files([files[0], DATA / "prefill-scheduler.pyspy.txt"], sglang=RELEASE, role="prefill")
    assert healthy.status == CLEAN


def _damaged(tmp_path: Path, keep_bootstrap: bool) -> Path:
    lines = (DATA / "prefill-scheduler.pyspy.txt").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "(bootstrap_thread)" in line)
    garbage = ["    \x1b[31m##### ?? ####", "@@@@ binary-ish \ufffd\ufffd 0x00", "    )))((( not a frame", "%%%%"]
    kept = lines if keep_bootstrap else lines[:cut]
    path = tmp_path / "pasted dump (1).txt"
    path.write_text("\n".join(kept[:10] + garbage + kept[10:]) + "\n")
    return path


def test_a_dump_half_text_half_garbage_keeps_what_it_read_and_never_calls_a_lost_thread_missing(tmp_path):
    lost = check_dump_files([_damaged(tmp_path, keep_bootstrap=False)], sglang=RELEASE, role="prefill")
    (result,) = lost.results
    assert result.dump.damaged and len(result.dump.problems) == 4
    assert all("pasted dump (1).txt:" in p for p in result.dump.problems)  # file and line named
    assert lost.status == INCONCLUSIVE and lost.exit_status == 3, lost.text()
    frame = lost.frame()
    assert frame.set_index("logical_name").loc["bootstrap", "status"] == "inconclusive"
    assert frame.set_index("logical_name").loc["transfer_worker", "found"] == 4
    kept = check_dump_files([_damaged(tmp_path, keep_bootstrap=True)], sglang=RELEASE, role="prefill")
    assert kept.status == CLEAN  # what was read proves every thread there


_KV_MODULE = textwrap.dedent("""
    import threading
    stop = threading.Event()
    def transfer_worker():
        stop.wait()
""")
_MANY_THREADS = textwrap.dedent("""
    import faulthandler, sys, threading, time
    from sglang.srt.disaggregation.nixl import conn
    def pool_worker():
        conn.stop.wait()
    for _ in range(196):
        threading.Thread(target=pool_worker, daemon=True).start()
    for _ in range(4):  # the newest: faulthandler lists them first; the main thread, oldest, is cut
        threading.Thread(target=conn.transfer_worker, daemon=True).start()
    time.sleep(0.5)
    faulthandler.dump_traceback(sys.stdout, all_threads=True)
""")


def test_a_faulthandler_dump_of_200_threads_is_cut_at_100_and_a_thread_not_seen_is_undecidable(tmp_path):
    package = tmp_path / "sglang" / "srt" / "disaggregation" / "nixl"
    package.mkdir(parents=True)
    (package / "conn.py").write_text(_KV_MODULE)
    script = tmp_path / "scheduler.py"
    script.write_text(_MANY_THREADS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    path = tmp_path / "faulthandler.txt"
    path.write_text(out)
    (dump,) = read_dump_file(path)
    assert dump.format == FAULTHANDLER and dump.thread_count() == 100
    assert dump.truncated and "100" in dump.truncated[0]
    check = check_dump_files([path], sglang=RELEASE, role="prefill")
    (result,) = check.results
    assert "transfer_worker" in result.identity.why  # no main thread: known by the KV manager's threads
    frame = check.frame().set_index("logical_name")
    assert frame.loc["transfer_worker", "found"] == 4 and frame.loc["transfer_worker", "status"] == "ok"
    assert frame.loc["bootstrap", "status"] == "inconclusive"  # it may be among the threads left out
    assert check.status == INCONCLUSIVE and check.exit_status == 3


_PARENT_AND_CHILD = textwrap.dedent("""
    import subprocess, sys, threading, time
    def bootstrap_thread(secret_token):
        local_value = {"room": 2**63 - 1}
        time.sleep(600)
    threading.Thread(target=bootstrap_thread, args=("x",), daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("ready", flush=True)
    time.sleep(600)
""")


def test_pyspy_text_with_locals_and_subprocesses_is_read_one_dump_per_process(tmp_path):
    import psutil

    script = tmp_path / "parent.py"
    script.write_text(_PARENT_AND_CHILD)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        out = subprocess.run([PY_SPY, "dump", "--locals", "--subprocesses", "--pid", str(proc.pid)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
    path = tmp_path / "dump.txt"
    path.write_text(out.stdout)
    dumps = read_dump_file(path)
    assert len(dumps) == 2 and dumps[0].pid == proc.pid and dumps[1].pid != proc.pid
    assert all(d.problems == [] for d in dumps), [d.problems for d in dumps]
    names = list(dumps[0].frame["thread_name"])
    assert "Thread-1 (bootstrap_thread)" in names


def test_inputs_that_are_no_dump_are_named_never_clean(tmp_path):
    broken_json = tmp_path / "dump.json"
    broken_json.write_text((DATA / "prefill-scheduler.pyspy.json").read_text()[:5000])
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x00\x00" + bytes(range(256)) * 10)
    huge_traceback = tmp_path / "prefill.log"
    frame = '  File "/opt/sglang/srt/managers/scheduler.py", line 12, in f\n    f()\n'
    huge_traceback.write_text("[2026-12-03 12:00:00] Traceback (most recent call last):\n"
                              + frame * (10 * 1024 * 1024 // len(frame)) + "RecursionError: deep\n")
    check = check_dump_files([broken_json, binary, huge_traceback], sglang=RELEASE, role="prefill")
    assert check.status == INCONCLUSIVE and check.results == []
    text = check.text()
    assert "dump.json: not py-spy's JSON" in text and "core: binary data" in text
    assert "prefill.log: no thread dump in it" in text
    with pytest.raises(EnvironmentProblem, match="missing.txt: no such dump file"):
        check_dump_files([tmp_path / "missing.txt"], sglang=RELEASE, role="prefill")


def test_the_cli_exits_by_the_contract_and_its_json_holds_every_dump():
    runner = CliRunner()
    base = ["threads", "check", "--sglang", RELEASE, "--role", "prefill"]
    good = runner.invoke(cli, [*base, str(DATA / "prefill-scheduler.pyspy.txt")])
    assert good.exit_code == 0, good.output
    assert good.output.startswith("CLEAN: prefill threads against sglang 0.5.13 nixl")
    bad = runner.invoke(cli, [*base, "--json", str(DATA / "prefill-watchdog-pyspy.log")])
    assert bad.exit_code == 1
    doc = json.loads(bad.output)
    assert doc["status"] == "findings" and doc["exit"] == 1
    assert [d["status"] for d in doc["dumps"]] == ["clean", "clean", "findings"]
    assert [d["pid"] for d in doc["dumps"]] == [5528] * 3
    assert {r["status"] for r in doc["rows"]} == {"ok", "missing"}
    other = runner.invoke(cli, [*base, str(DATA / "prefill-http-server.pyspy.txt")])
    assert other.exit_code == 3 and "http server" in other.output
    for line in runner.invoke(cli, [*base, str(DATA / "prefill-http-server.pyspy.txt")],
                              env={"COLUMNS": "80"}).output.splitlines():
        assert len(line) <= 80 or " " not in line.strip(), line
    missing = subprocess.run([sys.executable, "-m", "forensics", *base, "/nonexistent/dump.txt"],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 4 and "/nonexistent/dump.txt: no such dump file" in missing.stderr
    backend = runner.invoke(cli, [*base, "--backend", "bogus", str(DATA / "prefill-scheduler.pyspy.txt")])
    assert backend.exit_code == 2 and "bogus" in backend.output


# before the scanner knew dump lines: 57, 34 and 477 lines in no known format, and no crash event
@pytest.mark.parametrize("name, unknown", [
    ("prefill-sigabrt-faulthandler.log", 0), ("decode-sigabrt-faulthandler.log", 0),
    ("prefill-watchdog-pyspy.log", 42)])  # 42: the watchdog's "Scheduler debug info:" and py-spy's own error text
def test_forensics_logs_knows_the_dumps_real_sglang_writes_and_the_fatal_error_is_a_crash(name, unknown):
    from forensics.logs import scan

    result = scan([DATA / name], role="prefill")
    assert result.lines_unknown == unknown
    lines = (DATA / name).read_text().splitlines()
    for number, _ in result.unknown_samples.get(str(DATA / name), []):
        assert not read_dump_text_line_is_dump(lines[number - 1]), (number, lines[number - 1])
    signatures = list(result.events["signature"])
    if "faulthandler" in name:
        assert signatures.count("fatal_python_error") == 1
        assessment = result.assess()
        assert assessment.exit_status == 1
        (crash,) = [f for f in assessment.findings if f.id == "engine_crash"]
        assert "fatal_python_error" in set(crash.evidence["signature"])
    else:
        assert signatures.count("pyspy_dump_logged") == 3


def read_dump_text_line_is_dump(line: str) -> bool:
    from forensics.logs.lineformats import THREAD_DUMP_LINE

    return bool(THREAD_DUMP_LINE.match(line.encode()))


def test_the_logs_summary_points_at_the_dumps_and_the_command_that_checks_them():
    from forensics.logs import scan

    path = DATA / "prefill-watchdog-pyspy.log"
    summary = scan([path], role="prefill").summary()
    assert [d["where"] for d in summary.facts["thread_dumps"]] == [f"{path}:{n}" for n in (77, 278, 449)]
    text = " ".join(summary.sentences)
    assert "3 thread dump(s) in these logs" in text
    assert f"`forensics threads check {path} --sglang X --role prefill`" in text
    assert scan([DATA / "prefill-scheduler.pyspy.txt"]).summary().facts["thread_dumps"] == []


def test_a_device_or_a_pipe_named_as_a_dump_is_refused_before_any_read_and_the_rest_is_kept(tmp_path):
    import os

    fifo = tmp_path / "dump.txt"
    os.mkfifo(fifo)  # nothing ever writes to it: a blocking read would wait for good
    check = check_dump_files([Path("/dev/zero"), fifo, DATA / "prefill-scheduler.pyspy.txt"], sglang=RELEASE,
                             role="prefill")
    assert [r.status for r in check.results] == [CLEAN]
    assert check.problems == ["/dev/zero: not a regular file (a character device), not a dump file",
                              f"{fifo}: not a regular file (a named pipe), not a dump file"]
    assert check.status == INCONCLUSIVE
