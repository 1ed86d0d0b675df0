"""``patch status`` and the deploy's plan on an engine environment: the fix and the CPU adaptation never blur.

No engine runs here. Each test lays out a directory like an engine environment (the layout
contract of docs/engine.md: ``<cache>/engine/deployments/<key>/env/venv/lib/python3.11/
site-packages/`` and the environment's build record ``state.json``) in a private cache whose
wheel cache is the shared one, and writes real bytes into its ``nixl/conn.py``: the 0.5.15
wheel's (``forensics.sglang_source.fetch``), the CPU-adapted ones
(``forensics.engine.adaptations``) and the fix's codemod applied to either. The running-engine
check is real too: the inventory's ``pid_file`` names a process started before or after the write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from forensics.cache import cache_dir
from forensics.engine import adaptations
from forensics.engine.adaptations import NIXL_CONN, NIXL_DRAM
from forensics.engine.environment import STEPS
from forensics.sglang_source import fetch
from patched_engine import deploy as deploy_mod
from patched_engine.baselines import accepted_baselines, adapted_baseline_problem, release_conn

VERSION = "0.5.15"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def release():
    return release_conn(VERSION)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private cache whose wheel cache is the shared one (a symlink): engine environments laid out here."""
    shared_wheels = os.path.realpath(cache_dir() / "sglang")
    root = tmp_path / "cache"
    root.mkdir()
    (root / "sglang").symlink_to(shared_wheels, target_is_directory=True)
    monkeypatch.setenv("PD_FORENSICS_CACHE", str(root))
    return root


def site_packages(env_root: Path, conn: bytes, *, record: bool | str = True) -> Path:
    """``env_root`` laid out like an engine environment: sglang 0.5.15's version file and ``conn``
    as its nixl/conn.py; ``record``: write the build record of the adaptation (a sha256 to record
    another one)."""
    source = fetch(VERSION)
    site = env_root / "venv/lib/python3.11/site-packages"
    nixl = site / "sglang/srt/disaggregation/nixl"
    nixl.mkdir(parents=True)
    (site / "sglang/__init__.py").write_text("")
    (site / "sglang/_version.py").write_bytes(source.verified_read_bytes(source.root / "sglang/_version.py"))
    common = site / "sglang/srt/disaggregation/common"
    common.mkdir(parents=True)
    (common / "conn.py").write_bytes(source.verified_read_bytes(source.root / "sglang/srt/disaggregation/common/conn.py"))
    (nixl / "conn.py").write_bytes(conn)
    if record:
        digest = record if isinstance(record, str) else adaptations.adapted_baseline(VERSION)[NIXL_CONN]
        state = {"format": 1, "done": list(STEPS),
                 "adapted": {NIXL_CONN: {"adaptation": NIXL_DRAM.name, "lines": None, "sha256": digest}}}
        (env_root / "state.json").write_text(json.dumps(state))
    return site


def deployment_env(cache: Path, key: str = "0123456789abcdef") -> Path:
    return cache / "engine" / "deployments" / key / "env"


def inventory(directory: Path, prefill_site: Path, *, pid_file: Path | None = None, decode_site: Path | None = None,
              twin: dict | None = None) -> Path:
    prefill = {"role": "prefill", "host": "local", "url": "http://127.0.0.1:9", "bootstrap_port": 10,
               "python": sys.executable, "sglang_location": str(prefill_site), "restart": "/bin/true"}
    if pid_file is not None:
        prefill["pid_file"] = str(pid_file)
    decode = {"role": "decode", "host": "local", "url": "http://127.0.0.1:11", "python": sys.executable,
              "restart": "/bin/true"}
    if decode_site is not None:
        decode["sglang_location"] = str(decode_site)
    engines = [prefill, decode]
    document = {"deployment": {"name": "engine-env", "sglang": VERSION}, "engine": engines}
    if twin:
        document["twin"] = twin
    path = directory / "inventory.toml"
    path.write_text(tomli_w.dumps(document))
    return path


class Process:
    """A real process for the running-engine check, named by a pid file; stopped at the end."""

    def __init__(self, pid_file: Path):
        self.proc = subprocess.Popen(["sleep", "600"])
        pid_file.write_text(f"{self.proc.pid}\n")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def status_of(path: Path):
    report = deploy_mod.status(path)
    [engine] = report.engines
    return report, engine


def test_original_and_cpu_adapted_are_told_by_their_bytes(cache, release, tmp_path):
    assert release.adapted_sha256 == adaptations.adapted_baseline(VERSION)[NIXL_CONN]  # one derivation
    for conn, state in ((release.conn_bytes, "original"), (release.adapted_bytes, "cpu-adapted")):
        env = deployment_env(cache, state.replace("-", "") * 3)
        inv = inventory(env.parent, site_packages(env, conn))
        report, engine = status_of(inv)
        assert engine.state == state and engine.base is None and engine.text == state, engine.reason
        assert int(report.exit_status) == 1 and report.word == "not-patched"
        assert engine.sha256 == (release.sha256 if state == "original" else release.adapted_sha256)
    assert "cpu-nixl-dram" in engine.reason and "engine environment" in engine.reason


def test_cli_status_json_names_the_state_and_exit_1_for_cpu_adapted(cache, release):
    from cli_helpers import run_forensics

    env = deployment_env(cache)
    inv = inventory(env.parent, site_packages(env, release.adapted_bytes))
    done = run_forensics("patch", "status", "--inventory", str(inv), "--json", env={"PD_FORENSICS_CACHE": str(cache)})
    assert done.returncode == 1, done.stderr
    document = json.loads(done.stdout)
    assert document["status"] == "not-patched"
    [engine] = document["engines"]
    assert engine["state"] == "cpu-adapted" and engine["base"] is None and engine["text"] == "cpu-adapted"


@pytest.mark.parametrize("base", ["original", "cpu-adapted"])
def test_patched_on_either_base_runs_the_fix_only_after_a_restart(cache, release, tmp_path, base):
    patched = release.patched_on_original if base == "original" else release.patched_on_adapted
    assert b"PD_FORENSICS_PATCH" in patched
    assert (b'["DRAM"]' in patched) == (base == "cpu-adapted")  # the fix leaves the adaptation as it found it
    env = deployment_env(cache)
    pid_file = tmp_path / "engine.pid"
    before = Process(pid_file)  # the engine as it ran before the write
    try:
        time.sleep(0.2)  # more than running.ORDER_MARGIN_S between its start and the write
        inv = inventory(env.parent, site_packages(env, patched), pid_file=pid_file)
        report, engine = status_of(inv)
        assert engine.state == "patched-not-running" and engine.base == base, engine.reason
        assert int(report.exit_status) == 1 and report.word == "patched-not-running"
    finally:
        before.stop()
    time.sleep(0.2)
    after = Process(pid_file)  # restarted: it loaded the patched file
    try:
        report, engine = status_of(inv)
    finally:
        after.stop()
    assert engine.state == "patched" and engine.base == base, engine.reason
    assert int(report.exit_status) == 0 and report.word == "patched"
    shown = {"original": "patched (on the original file)", "cpu-adapted": "patched (on the CPU-adapted file)"}
    assert engine.text == shown[base] and engine.to_dict()["text"] == shown[base]


def test_adapted_bytes_outside_an_engine_environment_are_no_baseline(cache, release, tmp_path):
    """A GPU host's install holding the DRAM-adapted file (or the fix on it): a fork, never a baseline."""
    gpu_host = tmp_path / "opt/sglang/venv/lib/python3.11/site-packages"
    for conn in (release.adapted_bytes, release.patched_on_adapted):
        gpu_site = site_packages(tmp_path / "opt/sglang", conn, record=True)  # a record proves nothing there
        inv = inventory(tmp_path, gpu_site)
        report, engine = status_of(inv)
        assert engine.state == "unknown" and engine.base is None, engine.reason
        assert int(report.exit_status) == 1
        assert "DRAM" in engine.reason and "outside every engine environment" in engine.reason
        plan = deploy_mod.plan_deploy(inv)
        assert plan.engines[0].kind == "fork" and plan.forks  # refused without --force, its diff shown
        import shutil

        shutil.rmtree(tmp_path / "opt")
    conn = str(gpu_host / NIXL_CONN)
    assert set(accepted_baselines(VERSION, release, conn)) == {release.sha256}


def test_only_a_real_engine_environment_of_this_machine_accepts_the_adapted_bytes(cache, release):
    env = deployment_env(cache)
    conn = str(site_packages(env, release.adapted_bytes) / NIXL_CONN)
    assert adapted_baseline_problem(release, conn, local=True) is None
    assert set(accepted_baselines(VERSION, release, conn)) == {release.sha256, release.adapted_sha256}
    assert "another host" in adapted_baseline_problem(release, conn, local=False)
    assert set(accepted_baselines(VERSION, release, conn, local=False)) == {release.sha256}
    (env / "state.json").unlink()  # laid out like one, but no build record says it adapted this file
    assert "no build record" in adapted_baseline_problem(release, conn, local=True)
    other = deployment_env(cache, "fedcba9876543210")
    elsewhere = str(site_packages(other, release.adapted_bytes, record="0" * 64) / NIXL_CONN)
    assert "another release" in adapted_baseline_problem(release, elsewhere, local=True)
    stray = cache / "engine" / "deployments" / "k" / "env" / "lib" / NIXL_CONN  # not the venv's site-packages
    assert "not the environment's own" in adapted_baseline_problem(release, str(stray), local=True)


def test_the_plan_on_a_cpu_adapted_file_writes_the_fix_on_it_and_restarts_the_decode(cache, release):
    env = deployment_env(cache)
    site = site_packages(env, release.adapted_bytes)
    inv = inventory(env.parent, site, decode_site=site)
    plan = deploy_mod.plan_deploy(inv)
    [engine] = plan.engines
    assert engine.kind == "cpu-adapted" and engine.needed and not engine.blocked
    assert engine.new_bytes == release.patched_on_adapted
    assert any("back up the CPU-adapted file" in step for step in engine.actions())
    [hazard] = plan.decode_hazards
    assert hazard.where == "common/conn.py:1101 CommonKVReceiver._connect"
    assert plan.restart_decodes_why and str(env) in plan.restart_decodes_why

    record = deploy_mod.deploy(inv)  # plan only: not a twin, no --yes; the decode restart decided unasked
    assert record.status == "planned" and record.plan.restart_decodes
    [warning] = record.plan.warnings()
    assert "blocks for good" in warning and "the deploy restarts it after the prefill" in warning
    assert "as --restart-decodes does" in warning and "real sglang 0.5.15" in warning
    assert [c["argv"] for c in record.plan.commands()][-1] == ["/bin/true"]  # the decode's restart, shown

    asked_not = deploy_mod.deploy(inv, restart_decodes=False)
    assert not asked_not.plan.restart_decodes and "pass --restart-decodes" in asked_not.plan.warnings()[0]


def test_the_decode_restart_is_opt_in_outside_an_engine_environment(cache, release, tmp_path):
    site = site_packages(tmp_path / "opt/sglang", release.conn_bytes)
    inv = inventory(tmp_path, site, decode_site=site)
    record = deploy_mod.deploy(inv)
    assert record.status == "planned" and record.plan.decode_hazards
    assert not record.plan.restart_decodes and record.plan.restart_decodes_why is None
    assert "pass --restart-decodes" in record.plan.warnings()[0]


def test_the_cached_engine_environment_stays_pristine(cache, release):
    env = cache / "engine" / "env" / f"{VERSION}-0123456789ab"
    inv = inventory(env, site_packages(env, release.adapted_bytes))
    _, engine = status_of(inv)
    assert engine.state == "cpu-adapted"  # it is read as what it is
    plan = deploy_mod.plan_deploy(inv)
    assert plan.engines[0].blocked and "stays pristine" in plan.engines[0].blocked
    record = deploy_mod.deploy(inv, yes=True)
    assert record.status == "failed" and "stays pristine" in record.problem
    assert (env / "venv/lib/python3.11/site-packages" / NIXL_CONN).read_bytes() == release.adapted_bytes
