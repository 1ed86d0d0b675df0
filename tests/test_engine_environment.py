"""The engine environment's build record and the launcher's process handling, without building an environment."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from forensics.engine import environment, launch, pins
from forensics.exitcodes import UsageProblem


def test_a_failed_install_names_the_package_keeps_what_was_built_and_resumes(tmp_path, monkeypatch):
    """No registry reachable (pip told so): the torch step fails naming torch; the venv is kept and reused."""
    monkeypatch.setenv("PD_FORENSICS_CACHE", str(tmp_path / "cache"))
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    steps: list[str] = []
    with pytest.raises(environment.EngineEnvironmentError) as failure:
        environment.prepare("0.5.15", progress=steps.append)
    message = str(failure.value)
    assert "step 'torch'" in message and "torch==2.13.0" in message and "resumes at this step" in message
    assert failure.value.exit_status == 4
    assert steps == ["venv"]
    root = environment.environment_dir("0.5.15")
    assert json.loads((root / "state.json").read_text())["done"] == ["venv"]
    python = root / "venv" / "bin" / "python"
    built = python.lstat().st_ino

    again: list[str] = []
    with pytest.raises(environment.EngineEnvironmentError, match="torch==2.13.0"):
        environment.prepare("0.5.15", progress=again.append)
    assert again == ["venv (kept)"]
    assert python.lstat().st_ino == built  # resumed, not rebuilt


def test_a_release_without_an_environment_is_refused_naming_what_runs():
    """Refused as not worked out here (not as impossible), naming every release that is defined."""
    with pytest.raises(UsageProblem, match=r"sglang 0\.5\.21: its pins and CPU adaptations have not been worked "
                       r"out.*defined: 0\.5\.13, 0\.5\.13\.post1, 0\.5\.14, 0\.5\.15, 0\.5\.15\.post1, 0\.5\.16$"):
        environment.environment_dir("0.5.21")
    assert "stand-in" not in str(pytest.raises(UsageProblem, pins.check_release, "0.5.12").value)


def test_only_0_5_16s_prefill_runs_without_overlap_scheduling(tmp_path):
    """prefill.py:1046 of 0.5.16 calls torch.cuda.Event() under overlap scheduling; only there is it off."""
    def argv(version, role):
        env = environment.EngineEnvironment(version, tmp_path, tmp_path, {})
        return launch.server_argv(env, tmp_path, role, 30000, bootstrap_port=30001)

    assert "--disable-overlap-schedule" in argv("0.5.16", "prefill")
    assert "--disable-overlap-schedule" not in argv("0.5.16", "decode")
    for version in ("0.5.13", "0.5.15", "0.5.15.post1"):
        assert "--disable-overlap-schedule" not in argv(version, "prefill") + argv(version, "decode")


def test_every_package_is_pinned_and_the_cache_key_follows_the_pins():
    for version in pins.supported_releases():
        for _step, requirements in pins.install_steps(version):
            assert all("==" in r for r in requirements), requirements
    assert pins.expected_versions("0.5.13")["transformers"] == "5.8.1"
    assert pins.expected_versions("0.5.15")["transformers"] == "5.12.1"
    assert pins.pin_hash("0.5.13", ["a"]) != pins.pin_hash("0.5.15", ["a"]) != pins.pin_hash("0.5.15", ["a", "b"])
    assert "SGL_FORCE_SHUTDOWN" not in environment.engine_environment_variables()


def test_engine_processes_never_inherit_sgl_force_shutdown(monkeypatch):
    monkeypatch.setenv("SGL_FORCE_SHUTDOWN", "1")
    env = launch.process_environment({"SGL_FORCE_SHUTDOWN": "1"})
    assert "SGL_FORCE_SHUTDOWN" not in env
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["UCX_TLS"] == "tcp,sm,self"


def test_a_server_port_sglang_would_refuse_is_a_usage_error(tmp_path):
    env = environment.EngineEnvironment("0.5.15", tmp_path, tmp_path, {})
    with pytest.raises(UsageProblem, match="55536 is above 55535"):
        launch.server_argv(env, tmp_path, "decode", 55536)
    assert all(20000 <= p <= launch.MAX_SERVER_PORT for p in launch.free_server_ports(3))


def _process(tmp_path, script: str) -> launch.EngineProcess:
    log = tmp_path / "role.log"
    argv = [sys.executable, "-c", textwrap.dedent(script)]
    with open(log, "ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return launch.EngineProcess("prefill", popen, "http://127.0.0.1:9", log, argv)


def test_stop_kills_a_tree_that_never_finishes_its_sigterm(tmp_path):
    """As a wedged prefill: the leader and its child ignore SIGTERM; SIGKILL after the bounded wait."""
    process = _process(tmp_path, """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('child', flush=True); time.sleep(600)"])
        time.sleep(600)
    """)
    deadline = time.monotonic() + 30
    while "child" not in process.log_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    members = [process.pid, *(c.pid for c in psutil.Process(process.pid).children(recursive=True))]
    assert len(members) == 2
    process.remember_tree()  # stop() also finds these by pid and start, should one leave the group
    assert sorted(process.members) == sorted(members)
    assert sorted(proc.pid for proc in process._members_alive()) == sorted(members)
    started = time.monotonic()
    assert process.stop(timeout=2) == "killed"
    assert time.monotonic() - started < 15
    for pid in members:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_that_exits_during_start_up_is_reported_with_its_last_lines(tmp_path):
    process = _process(tmp_path, "import sys; print('ValueError: no model here', flush=True); sys.exit(3)")
    with pytest.raises(launch.EngineStartError, match=r"exited with status 3 .*ValueError: no model here"):
        process.wait_ready(timeout=60)
    assert process.stop() == "terminated"
