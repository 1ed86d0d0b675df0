"""The twin's processes: only its own are signalled, none outlive a dead launcher, ports never collide.

The kill tests run the real CLI (``python -m forensics twin up``) in a subprocess and stop it at
a named step of ``up`` with the fault-injection hook ``FORENSICS_TWIN_FAULT=STEP:ACTION``
(see ``forensics/twin/processes.py``), then check with psutil, on a deadline, that no process
the launcher started survives.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from twin_helpers import py_spy_dump, wait_until

import forensics.twin as twin_api
from forensics.inventory.twin_table import TwinSettings
from forensics.process_start import start_ticks
from forensics.twin import api, httpserver, inventory, processes

pytestmark = [pytest.mark.server]
FORENSICS = [sys.executable, "-m", "forensics"]


def _cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*FORENSICS, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _recorded(directory: Path) -> list[dict]:
    """What the launcher recorded of each process it started (pid, start time, command line)."""
    found = []
    for path in sorted(directory.glob("*.proc.json")):
        found.append(json.loads(path.read_text()))
    return found


def _survivors(identities: list[dict]) -> list[int]:
    """The recorded processes still alive as themselves (same pid and start time), and their sessions."""
    alive = []
    sessions = {identity["pid"] for identity in identities}
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            mine = any(proc.pid == i["pid"] and abs(proc.info["create_time"] - i["create_time"]) < 0.05
                       for i in identities)
            if mine or os.getsid(proc.pid) in sessions:
                alive.append(proc.pid)
        except (OSError, psutil.Error):
            pass
    return alive


def _fake_twin_inventory(directory: Path) -> Path:
    """A twin inventory with nothing running (for the pid-file checks; no process needed)."""
    settings = TwinSettings(directory=str(directory), sglang="0.5.16", sglang_root=str(directory / "site-packages"),
                            router_port=1, prefill_port=2, bootstrap_port=3, decode_port=4)
    path = directory / api.INVENTORY_NAME
    inventory.dump(api.build_inventory(settings, path), path)
    return path


# ------------------------------------------------------------------ never signal a stranger


def test_down_does_not_signal_what_a_stale_pid_file_names(tmp_path):
    inventory_path = _fake_twin_inventory(tmp_path)
    stranger = subprocess.Popen(["sleep", "300"])
    reused = subprocess.Popen(["sleep", "301"])
    try:
        # An old-style pid file (no record), and one whose record does not match (a reused pid).
        processes.pid_file(tmp_path, "router").write_text(f"{stranger.pid}\n")
        processes.pid_file(tmp_path, "prefill").write_text(f"{reused.pid}\n")
        processes.identity_file(tmp_path, "prefill").write_text(json.dumps({
            "pid": reused.pid, "create_time": psutil.Process(reused.pid).create_time() - 100,
            "start_ticks": start_ticks(reused.pid) - 100,
            "cmdline": ["sleep", "301"], "title": "sglang::scheduler"}))
        assert processes.state(tmp_path, "router") == "stale" and processes.state(tmp_path, "prefill") == "stale"
        down = _cli("twin", "down", "--inventory", str(inventory_path), "--json", timeout=60)
        report = json.loads(down.stdout)
        assert down.returncode == 0, down.stdout + down.stderr
        assert report["stopped"] == [] and sorted(report["stale"]) == ["prefill", "router"]
        assert stranger.poll() is None and reused.poll() is None  # neither was signalled
        human = _cli("twin", "down", "--inventory", str(inventory_path), timeout=60)
        assert human.returncode == 0 and "nothing was running" in human.stdout
        # The pid files are gone; the directory the user named is kept.
        assert not list(tmp_path.glob("*.pid")) and inventory_path.exists()
        processes.pid_file(tmp_path, "decode").write_text(f"{stranger.pid}\n")
        human = _cli("twin", "down", "--inventory", str(inventory_path), timeout=60)
        assert "stale pid file" in " ".join(human.stdout.split()) and f"pid {stranger.pid}" in human.stdout
        assert stranger.poll() is None
    finally:
        for proc in (stranger, reused):
            proc.kill()
            proc.wait()


def _listening(ports) -> list[int]:
    return sorted({conn.laddr.port for conn in psutil.net_connections(kind="tcp")
                   if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in set(ports)})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("staleness", ["start time", "reused pid"])
def test_down_with_a_stale_router_record_stops_the_real_router(tmp_path, staleness):
    twin = twin_api.up("0.5.16", directory=tmp_path / "twin")
    stranger = subprocess.Popen(["sleep", "300"])
    pids = [twin.pid(role) for role in processes.ROLE_ORDER]
    settings = twin.settings
    ports = sorted([settings.router_port, settings.prefill_port, settings.bootstrap_port, settings.decode_port])
    try:
        record = processes.identity_file(twin.directory, "router")
        identity = json.loads(record.read_text())
        if staleness == "start time":
            identity["create_time"] -= 100
            identity["start_ticks"] -= 100
        else:  # the record and pid file name another live process, as after a reboot's pid reuse
            identity["pid"] = stranger.pid
            processes.pid_file(twin.directory, "router").write_text(f"{stranger.pid}\n")
        record.write_text(json.dumps(identity))
        assert processes.state(twin.directory, "router") == "stale" and _listening(ports) == sorted(ports)
        down = _cli("twin", "down", "--inventory", str(twin.inventory_path), "--json", timeout=120)
        report = json.loads(down.stdout)
        assert down.returncode == 0, down.stdout + down.stderr
        assert _listening(ports) == [], f"a port of the twin still listens after 'down' said {report}"
        assert report["recovered"] == ["router"] and sorted(report["stopped"]) == ["decode", "prefill", "router"]
        wait_until(lambda: not [pid for pid in pids if processes.alive(pid)], 30, "the twin's processes to end")
        assert stranger.poll() is None  # the process the stale record named was not signalled
    finally:
        twin.take_down()
        for pid in pids:  # the test started them: none outlives it, whatever 'down' did
            if processes.alive(pid):
                os.killpg(pid, signal.SIGKILL)
        stranger.kill()
        stranger.wait()


LISTENER = "import socket,sys,time; s=socket.create_server(('127.0.0.1',0)); print(s.getsockname()[1], flush=True); " \
           "time.sleep(300)"


def test_down_keeps_a_stale_record_while_a_stranger_listens_on_the_port(tmp_path):
    stranger = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(stranger.stdout.readline())
        settings = TwinSettings(directory=str(tmp_path), sglang="0.5.16", sglang_root=str(tmp_path / "site-packages"),
                                router_port=port, prefill_port=2, bootstrap_port=3, decode_port=4)
        inventory_path = tmp_path / api.INVENTORY_NAME
        inventory.dump(api.build_inventory(settings, inventory_path), inventory_path)
        processes.pid_file(tmp_path, "router").write_text(f"{stranger.pid}\n")  # a record it does not match
        down = _cli("twin", "down", "--inventory", str(inventory_path), "--json", timeout=60)
        report = json.loads(down.stdout)
        assert down.returncode == 1, down.stdout + down.stderr
        assert report["still_running"] == ["router"] and report["listening"] == {"router": [port]}
        assert report["stopped"] == [] and report["recovered"] == []
        assert processes.pid_file(tmp_path, "router").exists()  # kept: the twin is not known to be down
        assert stranger.poll() is None
        human = _cli("twin", "down", "--inventory", str(inventory_path), timeout=60)
        assert human.returncode == 1 and f"port(s) {port} still listen" in human.stdout, human.stdout
    finally:
        stranger.kill()
        stranger.wait()


# A process whose leader thread has exited (a zombie to ps) while another thread still holds a
# listening socket: its parent (the launcher below) does not reap it, as a twin's launcher that
# is not the one running 'down' does not. The thread leaves when a line arrives on stdin.
HALF_EXITED = ("import ctypes,socket,sys,threading; s=socket.create_server(('127.0.0.1',0)); "
               "print(s.getsockname()[1], flush=True); threading.Thread(target=sys.stdin.readline).start(); "
               "ctypes.CDLL(None).pthread_exit(None)")
PARENT_OF_HALF_EXITED = ("import subprocess,sys; p=subprocess.Popen([sys.executable,'-c',sys.argv[1]],"
                         "stdin=subprocess.PIPE,stdout=subprocess.PIPE,text=True); print(p.pid, p.stdout.readline()"
                         ".strip(), flush=True); sys.stdin.readline(); p.stdin.write('go\\n'); p.stdin.flush(); "
                         "sys.stdin.readline()")


def test_a_zombie_leader_whose_threads_still_hold_its_port_is_not_gone_until_they_leave():
    parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_HALF_EXITED, HALF_EXITED], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        pid, port = (int(v) for v in parent.stdout.readline().split())
        proc = psutil.Process(pid)
        wait_until(lambda: proc.status() == psutil.STATUS_ZOMBIE, 30, "the leader thread to exit")
        assert processes.listened([port]) == [port] and processes._threads_left(pid) > 1
        assert processes._wait_gone(proc, 0.5) is False  # a zombie to ps, but it still listens
        parent.stdin.write("release\n")
        parent.stdin.flush()
        assert processes._wait_gone(proc, 60) is True
        assert processes.listened([port]) == []  # gone means its port is free for the next twin
    finally:
        parent.kill()
        parent.wait()


# --------------------------------------------------------------- one twin per directory


@pytest.mark.timeout(240)
def test_up_into_a_running_twins_directory_is_refused(tmp_path):
    twin = twin_api.up("0.5.16", directory=tmp_path)
    try:
        before = {role: twin.pid(role) for role in processes.ROLE_ORDER}
        again = _cli("twin", "up", "--sglang", "0.5.16", "--dir", str(tmp_path), "--json")
        assert again.returncode == 4, again.stdout + again.stderr
        error = json.loads(again.stdout)["error"]
        assert f"a twin is already running in {tmp_path}" in error and twin.router in error
        assert "forensics twin down --inventory" in error and len(again.stderr.splitlines()) == 1
        assert {role: twin.pid(role) for role in processes.ROLE_ORDER} == before  # pid files untouched
        assert processes.running_roles(tmp_path) == list(processes.ROLE_ORDER)
        with pytest.raises(api.TwinError, match="already running"):
            twin_api.up("0.5.16", directory=tmp_path)
    finally:
        report = twin.take_down()
    assert report["stopped"] == ["router", "decode", "prefill"] and report["removed_directory"] is None
    assert tmp_path.is_dir() and (tmp_path / "inventory.toml").exists()  # the user's directory is kept


# ------------------------------------------------------------ a dead launcher leaves nothing


def _read_stderr_until(proc: subprocess.Popen, marker: str, timeout: float) -> str:
    seen = ""
    selector = selectors.DefaultSelector()
    selector.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while marker not in seen:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"no {marker!r} from the CLI (rc {proc.poll()}): {seen[-2000:]}")
            if selector.select(timeout=0.5):
                chunk = os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
                seen += chunk
    finally:
        selector.close()
    return seen


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("step", "how"), [
    ("after-prefill-started", "SIGKILL"),  # the CLI kills itself: no handler, no cleanup
    ("after-all-started", "SIGTERM"),
    ("after-prefill-ready", "SIGINT"),
    ("before-handover", "SIGKILL"),
])
def test_killed_cli_during_up_leaves_no_twin_process(tmp_path, step, how):
    env = dict(os.environ)
    self_kill = step == "after-prefill-started"
    env[processes.FAULT_ENV] = f"{step}:{how if self_kill else 'block'}"
    # SIGINT at its default, as for a command in a terminal's foreground: a test run started from a
    # non-interactive shell's background job (as CI's may be) inherits SIGINT ignored
    # (/proc/PID/status SigIgn), passes that on, and the CLI would never see the signal.
    cli = subprocess.Popen([*FORENSICS, "twin", "up", "--sglang", "0.5.16", "--dir", str(tmp_path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        if self_kill:
            cli.wait(timeout=120)
            assert cli.returncode == -signal.SIGKILL
        else:
            _read_stderr_until(cli, f"twin fault: blocked at {step}", 120)
        identities = _recorded(tmp_path)
        expected = {"after-prefill-started": ["prefill"]}.get(step, ["decode", "prefill", "router"])
        assert sorted(i["role"] for i in identities) == expected
        if not self_kill:
            assert _survivors(identities)  # the launcher's children are there to be taken along
            cli.send_signal(getattr(signal, how))
            try:
                cli.wait(timeout=60)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the CLI outlived {how} at {step} by 60 s; where it was:\n"
                                     + py_spy_dump(cli.pid)) from None
        wait_until(lambda: not _survivors(identities), 60, f"the twin's processes to leave after {how} at {step}")
        assert processes.running_roles(tmp_path) == []
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        cli.stderr.close()
        for identity in _recorded(tmp_path):  # never leave a process behind, even when the test fails
            processes.stop(tmp_path, identity["role"], timeout=5)


LIFELINE_LINE = "twin: the process that started me died before handing the twin over"
SGLANG_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\] ")


@pytest.mark.timeout(600)
def test_a_twin_restarted_after_its_launcher_died_validates_without_a_log_gap(tmp_path, leak_guard):
    import forensics as fx
    from forensics.validation import INCONCLUSIVE

    env = dict(os.environ, **{processes.FAULT_ENV: "before-handover:block"})
    cli = subprocess.Popen([*FORENSICS, "twin", "up", "--sglang", "0.5.16", "--dir", str(tmp_path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        _read_stderr_until(cli, "twin fault: blocked at before-handover", 120)
        identities = _recorded(tmp_path)
        cli.kill()  # the launcher dies before the handover: each role writes its last line and leaves
        cli.wait(timeout=60)
        wait_until(lambda: not _survivors(identities), 60, "the twin's processes to leave after their launcher")
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        cli.stderr.close()
    for role in processes.ROLE_ORDER:
        said = [line for line in processes.log_file(tmp_path, role).read_text().splitlines() if LIFELINE_LINE in line]
        assert said and all(SGLANG_STAMP.match(line) for line in said), (role, said)

    # The same directory, the same log files (appended to), a twin that serves again; one campaign cycle
    # (tests/test_validate.py's storm) reads those logs from the cycle's start.
    twin = twin_api.up("0.5.16", directory=tmp_path, waiting_timeout=15, pool_pages=160, prefill_rate_tps=400.0,
                       decode_rate_tps=50.0, decode_log_interval=10)
    try:
        for role in processes.ROLE_ORDER:
            leak_guard.allow(twin.pid(role))
        campaign = fx.validate(twin, cycles=1, sessions=6, prompt_tokens=1200, max_tokens=16, phase="kv",
                               kill_after=0, sample_s=4)
    finally:
        twin.down()
    logs = campaign.cycles[0].check("logs")
    gaps = [gap for gap in campaign.cycles[0].evidence.gaps if "format" in str(gap) or LIFELINE_LINE in str(gap)]
    assert not gaps, gaps
    assert logs.status != INCONCLUSIVE or "not read whole" not in logs.reason, logs.reason


# ------------------------------------------------- handover, distinct ports, directories


@pytest.mark.timeout(420)
def test_four_concurrent_ups_get_distinct_ports_outlive_the_cli_and_go_down(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the twins' own directories land here
    ups = [subprocess.Popen([*FORENSICS, "twin", "up", "--sglang", "0.5.16", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    docs = []
    try:
        for proc in ups:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, out + err
            docs.append(json.loads(out))
        ports = [int(doc[name].rsplit(":", 1)[1]) for doc in docs for name in ("router", "prefill", "bootstrap",
                                                                                  "decode")]
        assert len(set(ports)) == 16, ports
        for doc in docs:  # handed over: each twin outlives the CLI that started it
            assert Path(doc["directory"]).parent == tmp_path and Path(doc["directory"]).is_dir()
            status = _cli("twin", "status", "--inventory", doc["inventory"], "--json", timeout=60)
            assert status.returncode == 0 and json.loads(status.stdout)["healthy"] is True, status.stdout
    finally:
        for proc in ups:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        downs = [_cli("twin", "down", "--inventory", doc["inventory"], "--json", timeout=60) for doc in docs]
    for doc, down in zip(docs, downs, strict=True):
        report = json.loads(down.stdout)
        assert down.returncode == 0 and report["stopped"] == ["router", "decode", "prefill"], down.stdout
        # The twin made its directory itself: down removes it (37 MB each otherwise).
        assert report["removed_directory"] == doc["directory"] and not Path(doc["directory"]).exists()
        assert not any(processes.alive(pid) for pid in doc["pids"].values())


@pytest.mark.timeout(180)
def test_python_up_without_dir_removes_its_directory_and_a_named_port_clash_says_so(tmp_path):
    with twin_api.up("0.5.16") as twin:
        directory = twin.directory
        assert directory.is_dir() and twin.settings.created_directory is True
        with pytest.raises(api.TwinError, match=r"port \d+ \(router\) on 127\.0\.0\.1 is already in use"):
            twin_api.up("0.5.16", base_port=int(twin.router.rsplit(":", 1)[1]), directory=tmp_path / "other")
    assert not directory.exists()
    assert not list((tmp_path / "other").glob("*.pid"))


# ------------------------------------------------------------------ releases the twin cannot serve


def test_release_the_twin_cannot_serve_is_refused_up_front(tmp_path):
    """A release whose receivers have no way to send the transfer info (a fork with neither
    ``send_metadata`` nor ``init``) is refused at once, naming what it lacks, before anything starts."""
    fork = _fork_of("0.5.16", tmp_path / "fork", {})
    for relative in ("base/conn.py", "common/conn.py", "nixl/conn.py"):
        path = tmp_path / "fork/sglang/srt/disaggregation" / relative
        path.write_text(path.read_text().replace("    def send_metadata(", "    def send_meta(")
                        .replace("    def init(", "    def start("))
    fork.backends = lambda: ["nixl"]
    started = time.monotonic()
    with pytest.raises(api.TwinError, match=r"0\.5\.16\+fork: the twin cannot serve.*send_metadata or init"):
        api._up_in(tmp_path / "twin", False, "0.5.16", patched=False, backend="nixl", base_port=None,
                   host="127.0.0.1", waiting_timeout=30.0, started=started, fetch=lambda version: fork)
    assert not list(tmp_path.rglob("*.pid")) and not (tmp_path / "twin" / api.INVENTORY_NAME).exists()
    assert time.monotonic() - started < 30  # refused before any process started (a start waits up to 60 s)


def _fork_of(version: str, root: Path, edits: dict[str, tuple[str, str]]) -> object:
    """A copy of ``version``'s three conn.py files with ``edits`` (file -> (old, new)) applied: a fork
    or a future release, as the check sees it."""
    from types import SimpleNamespace

    from forensics.sglang_source import fetch

    source = fetch(version)
    for relative in ("base/conn.py", "common/conn.py", "nixl/conn.py"):
        text = source.verified_read_text(Path(source.root) / "sglang/srt/disaggregation" / relative)
        if relative in edits:
            old, new = edits[relative]
            assert old in text, (relative, old)
            text = text.replace(old, new)
        target = root / "sglang/srt/disaggregation" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return SimpleNamespace(root=str(root), version=f"{version}+fork")


def test_the_release_check_reads_the_release_code(tmp_path):
    from forensics.sglang_source import fetch

    for version in ("0.5.1", "0.5.5", "0.5.9", "0.5.10", "0.5.12.post1", "0.5.13", "0.5.16", "0.5.17", "0.5.19",
                    "0.5.22", "0.5.23"):
        api.check_release_served(fetch(version))
    # A KVArgs field the release's scheduler fills and the twin does not: named with its line.
    fork = _fork_of("0.5.23", tmp_path / "kvargs", {"base/conn.py": (
        "    kv_layer_ids: List[int]\n", "    kv_layer_ids: List[int]\n    kv_layer_scales: List[float]\n")})
    with pytest.raises(api.TwinError, match=r"KVArgs\.kv_layer_scales \(base/conn\.py:\d+\) without a default"):
        api.check_release_served(fork)
    # A decode that learns a transfer's end neither from NIXL notifications nor from KV_STATUS.
    fork = _fork_of("0.5.23", tmp_path / "silent", {"nixl/conn.py": ('    kv_status_msg_tag = b"KV_STATUS"\n', "")})
    with pytest.raises(api.TwinError, match=r"learns a transfer's end neither from NIXL notifications"):
        api.check_release_served(fork)
    # The same refusal where up() makes it (the fork stands in for what fetch returns): nothing starts.
    fork.backends = lambda: ["nixl"]
    with pytest.raises(api.TwinError, match=r"0\.5\.23\+fork: the twin cannot serve"):
        api._up_in(tmp_path, False, "0.5.23", patched=False, backend="nixl", base_port=None, host="127.0.0.1",
                   waiting_timeout=30.0, started=time.monotonic(), fetch=lambda version: fork)
    assert not list(tmp_path.glob("*.pid")) and not (tmp_path / api.INVENTORY_NAME).exists()


# ------------------------------------------------------------------ fire-and-forget tasks


def test_spawned_tasks_stay_referenced_until_done():
    async def scenario() -> list[str]:
        ran: list[str] = []
        release = asyncio.Event()

        async def abort() -> None:
            await release.wait()
            ran.append("abort")

        httpserver.spawn(abort())  # the result is dropped, as the AbortReq path drops it
        await asyncio.sleep(0)
        gc.collect()
        assert len(httpserver.background_tasks()) == 1
        release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert httpserver.background_tasks() == set()  # discarded once done

        async def fails() -> None:
            raise ConnectionResetError("client gone")

        httpserver.spawn(fails())
        for _ in range(10):
            await asyncio.sleep(0)
        return ran

    assert asyncio.run(scenario()) == ["abort"]


def test_no_dropped_task_in_the_twin_servers():
    root = Path(processes.__file__).parent
    for name in ("prefill.py", "decode.py", "router.py"):
        for line in (root / name).read_text().splitlines():
            stripped = line.strip()
            if "create_task(" in stripped or "ensure_future(" in stripped:
                assert "=" in stripped.split("create_task(")[0], f"{name}: dropped task: {stripped}"


def test_a_dead_scheduler_loop_ends_its_process_with_the_traceback():
    """What hid 0.5.17's failure: the scheduler task died and the server kept answering /ping."""
    script = (
        "import asyncio\n"
        "from forensics.twin import httpserver\n"
        "async def scheduler():\n"
        "    raise AttributeError(\"'types.SimpleNamespace' object has no attribute 'kv_layer_ids'\")\n"
        "async def main():\n"
        "    httpserver.watch_scheduler(asyncio.get_running_loop().create_task(scheduler()), 'decode')\n"
        "    await asyncio.sleep(30)\n"
        "asyncio.run(main())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "twin decode: the scheduler loop died; the process exits" in result.stderr
    assert "AttributeError: 'types.SimpleNamespace' object has no attribute 'kv_layer_ids'" in result.stderr
