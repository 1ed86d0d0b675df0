"""The real sglang engine as a deployment behind an inventory (``twin up --engine sglang``).

One real deployment for the module (0.5.15, the slow-prefill model, decode waiting timeout 10 s),
started through the CLI as a user would. The cheap faults run first, before it exists (they fail
before or at start-up); the module's tests run serially in one worker (``--dist loadfile``), so
at most one real deployment of this file runs at a time.

The wedge is real sglang behaviour with no client at all: a 3000-token prompt keeps the slow
prefill busy for tens of seconds, the decode's waiting timeout (10 s) expires with the request in
``KVPoll.WaitingForInput``, the decode sends ``ABORT``, and 0.5.15's NIXL bootstrap loop dies on
its GUARD assert. Everything about it is then observed from outside, as on a production host.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from cli_helpers import one_document, run_forensics
from real_engine_helpers import (
    answers,
    assert_wedged_as_in_production,
    cli_deployment,
    enough_memory,
    post,
    wait_until,
)

from forensics.engine import clone, environment
from forensics.exitcodes import ExitStatus

VERSION = "0.5.15"
WAITING_TIMEOUT_S = 10
GUARD = "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?"
pytestmark = [pytest.mark.server, pytest.mark.engine, pytest.mark.timeout(1800)]


def holders(directory: Path) -> set[int]:
    """Every process with a file of ``directory`` open (each engine process writes its role's log there)."""
    prefix = str(directory.resolve()) + os.sep
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if os.readlink(f"/proc/{entry}/fd/{fd}").startswith(prefix):
                    found.add(int(entry))
                    break
        except OSError:
            continue
    return found


def health(url: str) -> int:
    with urllib.request.urlopen(url + "/health", timeout=60) as answer:
        return answer.status


def free_base_port() -> int:
    from forensics.engine.launch import free_server_ports

    while True:
        base = free_server_ports(1)[0]
        if base + 3 <= 55535 and all(_free(base + i) for i in range(4)):
            return base


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("forensics:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


# ----------------------------------------------------------------- faults before a deployment exists


@pytest.mark.parametrize("argv, named", [
    (["--sglang", "0.5.12"], "sglang 0.5.12"),
    (["--sglang", "0.5.21"], "sglang 0.5.21"),  # no engine environment is defined for it
    (["--decode-sglang", "0.5.14"], "--decode-sglang"),
    (["--backend", "mooncake"], "--backend mooncake"),
    (["--waiting-timeout", "2.5"], "--waiting-timeout"),
])
def test_what_the_real_engine_cannot_run_is_refused_before_anything_starts(tmp_path, argv, named):
    directory = tmp_path / "d"
    result = run_forensics("twin", "up", "--engine", "sglang", "--dir", str(directory), "--json", *argv, timeout=120)
    assert result.returncode == ExitStatus.USAGE, result.stderr
    assert named in error_line(result)
    assert one_document(result.stdout)["exit"] == ExitStatus.USAGE
    assert not (directory / "inventory.toml").exists() and not any(directory.glob("*.pid"))
    assert not clone.deployment_cache(directory).exists()


def test_a_port_in_use_is_refused_naming_it_and_nothing_starts(tmp_path):
    base = free_base_port()
    directory = tmp_path / "d"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base + 3))  # the decode's port
        squatter.listen(1)
        result = run_forensics("twin", "up", "--engine", "sglang", "--base-port", str(base), "--dir", str(directory),
                               "--json", timeout=600)
    assert result.returncode == ExitStatus.ENVIRONMENT, result.stderr
    assert f"port {base + 3} (decode)" in error_line(result)
    assert not holders(directory) and not any(directory.glob("*.pid"))
    assert not clone.deployment_cache(directory).exists()


@pytest.mark.slow
def test_an_engine_that_crashes_during_start_up_is_quoted_and_nothing_is_left(tmp_path):
    """A bad flag (the test hook) makes the real prefill's argument parser exit during start-up."""
    enough_memory()
    directory = tmp_path / "d"
    hook = {"FORENSICS_ENGINE_EXTRA_ARGS": json.dumps({"prefill": ["--no-such-flag-for-this-test"]})}
    result = run_forensics("twin", "up", "--engine", "sglang", "--dir", str(directory), "--json", env=hook,
                           timeout=900)
    assert result.returncode == ExitStatus.ENVIRONMENT, result.stderr
    line = error_line(result)
    assert "the prefill (sglang 0.5.15) exited with status" in line and "during start-up" in line
    assert "unrecognized arguments: --no-such-flag-for-this-test" in line  # its log's last lines, quoted
    wait_until(lambda: not holders(directory), 60, "every engine process of the failed start to be gone")
    assert not clone.deployment_cache(directory).exists() and not (directory / "inventory.toml").exists()
    assert "unrecognized arguments" in (directory / "prefill.log").read_text()  # the logs stay, for the reason


@pytest.mark.slow
def test_a_router_that_is_not_ready_by_its_deadline_stops_everything(tmp_path):
    """The mini LB listens ~10 s after its start; a 1 s deadline is missed, and all three are stopped."""
    from forensics.engine import deployment, launch

    enough_memory()
    directory = tmp_path / "d"
    with pytest.raises(launch.EngineStartError) as raised:
        deployment.up(VERSION, directory=directory, ready_timeouts={"router": 1.0})
    assert raised.value.exit_status == ExitStatus.ENVIRONMENT
    assert "the router at http://127.0.0.1:" in str(raised.value) and "did not answer /health within 1 s" in str(
        raised.value)
    wait_until(lambda: not holders(directory), 60, "every engine process to be gone")
    assert not clone.deployment_cache(directory).exists()


@pytest.mark.slow
def test_a_killed_up_takes_its_engine_processes_with_it(tmp_path):
    """SIGKILL of ``twin up`` once all three are started: each lifeline shim reads end-of-file and
    kills its engine's process group; a later ``twin down`` on the inventory left behind tidies up."""
    enough_memory()
    directory = tmp_path / "d"
    result = run_forensics("twin", "up", "--engine", "sglang", "--dir", str(directory), "--json",
                           env={"FORENSICS_TWIN_FAULT": "after-all-started:SIGKILL"}, timeout=600)
    assert result.returncode == -signal.SIGKILL
    leaders = [json.loads((directory / f"{role}.proc.json").read_text())["pid"] for role in ("prefill", "decode",
                                                                                                "router")]
    wait_until(lambda: not holders(directory), 60, "the engine processes to die with their launcher")
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in leaders)
    down = run_forensics("twin", "down", "--inventory", str(directory / "inventory.toml"), "--json", timeout=120)
    assert down.returncode == 0, down.stderr
    assert sorted(one_document(down.stdout)["stale"]) == ["decode", "prefill", "router"]
    assert not clone.deployment_cache(directory).exists()


# ------------------------------------------------------------------------- one real deployment


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with cli_deployment(tmp_path_factory.mktemp("engine") / "pd", WAITING_TIMEOUT_S) as deployed:
        yield deployed


@pytest.mark.slow
def test_the_deployment_is_an_inventory_and_records_with_no_sglang_source(real):
    deployment, document = real
    assert {"router", "prefill", "decode", "inventory"} <= set(document) and document["engine"] == "sglang"
    directory = deployment.directory
    names = sorted(path.name for path in directory.iterdir())
    for role in ("prefill", "decode", "router"):
        assert {f"{role}.log", f"{role}.pid", f"{role}.proc.json"} <= set(names)
    assert not [path for path in directory.rglob("*.py")] and not (directory / "sglang").exists()
    inventory = deployment.inventory
    assert inventory.twin["engine"] == "sglang"
    clone_root = clone.deployment_cache(directory) / "env"
    site = environment._site_packages(clone_root)
    for role in ("prefill", "decode"):
        engine = inventory.engine(role)
        assert engine.url == document[role] and engine.process == "sglang::scheduler"
        assert engine.python == str(clone_root / "venv" / "bin" / "python")
        assert engine.sglang_location == str(site) and (site / "sglang").is_dir()
        assert engine.log_file == str(directory / f"{role}.log")
        scheduler = int(Path(engine.pid_file).read_text())
        assert " ".join(psutil.Process(scheduler).cmdline()).startswith("sglang::scheduler")
        assert psutil.Process(scheduler).ppid() == document["pids"][role]  # a child of the server listening there
        assert psutil.Process(scheduler).cmdline()  # and alive
    record = json.loads((directory / "prefill.proc.json").read_text())
    assert record["pid"] == document["pids"]["prefill"] and record["create_time"] > 0 and record["cmdline"][1:3] == [
        "-m", "sglang.launch_server"]
    # The clone shares the cached environment's inodes; the cached one is not the one that runs.
    cached = environment.environment_dir(VERSION)
    conn = "sglang/srt/disaggregation/nixl/conn.py"
    assert os.stat(site / conn).st_ino == os.stat(environment._site_packages(cached) / conn).st_ino
    assert str(cached) not in engine.python
    rss = {role: _tree_rss_mb(document["pids"][role]) for role in ("prefill", "decode", "router")}
    print(f"\nreal-engine RSS MB per role (leader and its children): {rss}, total {sum(rss.values())}")


def _tree_rss_mb(pid: int) -> int:
    leader = psutil.Process(pid)
    return sum(proc.memory_info().rss for proc in [leader, *leader.children(recursive=True)]) // (1 << 20)


@pytest.mark.slow
def test_status_says_healthy_with_the_bootstrap_thread_alive_and_a_request_is_served(real):
    deployment, document = real
    result = run_forensics("twin", "status", "--inventory", document["inventory"], "--json", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    status = one_document(result.stdout)
    assert status["healthy"] is True and status["engine"] == "sglang"
    assert status["roles"]["prefill"]["bootstrap_thread_alive"] is True
    assert all(status["roles"][role]["alive"] and status["roles"][role]["answering"] for role in status["roles"])
    answer = post(document["router"] + "/generate", {"text": "ba be bi bo", "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}}, timeout=120)
    assert answer["meta_info"]["completion_tokens"] == 4


def _killed_restart_then_restart(deployment, document, role: str, least_processes: int) -> None:
    """``twin restart ROLE`` SIGKILLed once the new role is ready (before its handover): the shim kills
    every process of the new role; a second restart brings it back on the same port."""
    before = deployment.pid(role)
    killed = run_forensics("twin", "restart", role, "--inventory", document["inventory"], "--json",
                           env={"FORENSICS_TWIN_FAULT": "before-handover:SIGKILL"}, timeout=900)
    assert killed.returncode == -signal.SIGKILL
    record = json.loads((deployment.directory / f"{role}.proc.json").read_text())
    started = [record["pid"], *[member["pid"] for member in record["members"]]]
    assert record["pid"] != before and len(started) >= least_processes  # it was ready when its launcher died
    wait_until(lambda: not any(_not_zombie(pid) for pid in started), 60, f"the killed restart's {role} to die")
    assert not answers(document[role])
    result = run_forensics("twin", "restart", role, "--inventory", document["inventory"], "--json", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert deployment.pid(role) not in (before, record["pid"])
    assert deployment.inventory.engine(role).url == document[role] and health(document[role]) == 200
    answer = post(document["router"] + "/generate", {"text": "ba be", "sampling_params": {"max_new_tokens": 2}},
                  timeout=120)
    assert answer["meta_info"]["completion_tokens"] == 2


@pytest.mark.slow
def test_a_killed_router_restart_dies_with_its_launcher_and_a_restart_keeps_the_port(real):
    deployment, document = real
    _killed_restart_then_restart(deployment, document, "router", 1)


@pytest.mark.slow
def test_a_killed_decode_restart_takes_its_scheduler_and_detokenizer_with_it(real):
    deployment, document = real
    _killed_restart_then_restart(deployment, document, "decode", 3)  # HTTP server, scheduler, detokenizer


@pytest.mark.slow
def test_a_waiting_timeout_wedges_the_real_prefill_and_diagnose_says_wedged(real):
    """No client dies: the decode times out waiting for KV the busy prefill has not sent, sends ABORT."""
    from forensics.engine.model import prompt_words

    deployment, document = real
    router = document["router"]
    # 2500 tokens: within the decode's limit for this pool (2635); tens of seconds of prefill here.
    body = json.dumps({"text": prompt_words(2500), "sampling_params": {"max_new_tokens": 1}}).encode()
    long_request = socket.create_connection(("127.0.0.1", int(router.rsplit(":", 1)[1])), timeout=10)
    try:
        long_request.sendall(b"POST /generate HTTP/1.1\r\nHost: pd\r\nContent-Type: application/json\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: GUARD in deployment.log_text("prefill"), 300, "the GUARD traceback in the prefill's log")
        log = deployment.log_text("prefill")
        assert "Exception in thread" in log and "(bootstrap_thread)" in log and "nixl/conn.py" in log
        assert "timed out after" in deployment.log_text("decode")  # the decode's own account of the trigger
        assert_wedged_as_in_production(deployment, document, health_deadline_s=900)
    finally:
        long_request.close()


def _active_generates(url: str) -> int:
    """The prefill's own count of /generate requests in flight (sglang's HTTP middleware gauge)."""
    from forensics.collectors.metrics import labels_dict, scrape_once

    record = scrape_once("prefill", "p0", url, timeout_s=30)
    if not record.ok:
        return 0
    page = record.page
    return sum(int(page.value[i]) for i in range(len(page)) if page.metric[i] == "sglang:http_requests_active"
               and labels_dict(page.labels[i]).get("endpoint", "").endswith("generate"))


@pytest.mark.slow
def test_down_ends_every_process_killing_the_wedged_prefill_and_removes_the_clone(real):
    """A wedged prefill with a client still waiting never finishes its SIGTERM (sglang's
    ``sigterm_watchdog`` waits for the remaining request unless SGL_FORCE_SHUTDOWN is set): down
    kills it after its bounded wait. The client is held open here, as a production client is; with
    no request left, SIGTERM alone would end it."""
    deployment, document = real
    directory = deployment.directory
    everything = holders(directory)
    assert len(everything) >= 7  # 3 leaders + schedulers and detokenizers
    router = document["router"]
    body = json.dumps({"text": "ba be bi", "stream": True, "sampling_params": {"max_new_tokens": 2}}).encode()
    waiting = socket.create_connection(("127.0.0.1", int(router.rsplit(":", 1)[1])), timeout=10)
    try:
        waiting.sendall(b"POST /generate HTTP/1.1\r\nHost: pd\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: _active_generates(document["prefill"]) >= 1, 120, "the prefill to hold the waiting request")
        started = time.monotonic()
        result = run_forensics("twin", "down", "--inventory", document["inventory"], "--json", timeout=300)
        seconds = time.monotonic() - started
    finally:
        waiting.close()
    report = one_document(result.stdout)
    assert result.returncode == 0, result.stderr
    assert sorted(report["stopped"]) == ["decode", "prefill", "router"] and report["still_running"] == []
    # sglang's watchdog, waiting (the earlier tests' hung non-streaming request may still count too)
    assert re.search(r"Remaining number of requests [1-9]", deployment.log_text("prefill"))
    assert "prefill" in report["killed"]
    assert not holders(directory) and not any(psutil.pid_exists(pid) for pid in everything if _not_zombie(pid))
    assert not clone.deployment_cache(directory).exists()
    print(f"\nreal-engine down in {seconds:.1f} s: {report}")


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

