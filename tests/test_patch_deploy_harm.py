"""Issue 19, "do no harm", for ``patch deploy|status|rollback`` on a real 0.5.15 twin.

* a SIGINT or SIGTERM during the restart step lets the restart finish (the prefill serves
  a real request afterwards) and the JSON lists every step done and each engine's state;
* ``patch status`` says ``patched-not-running`` (exit 1) while the running engine started
  before the file was patched, and the next deploy resumes with the restart;
* a restart line that restarts nothing (``/bin/true``) is ``not-restarted``, never "deployed";
* a rollback refuses a backup whose bytes are not the release's wheel file, whatever its
  record says, unless ``--force``;
* a full install file system leaves no partial ``.tmp`` (exit 4 naming it); a read-only one is
  exit 4 naming the directory, with "set sudo = true" only where sudo would help.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import one_document
from deploy_helpers import fake_deployment, forensics
from twin_helpers import py_spy_dump, wait_until

import forensics.twin as twin_api
from forensics.sglang_source import fetch
from patched_engine import deploy as deploy_mod
from patched_engine.apply import plan_apply
from patched_engine.remote_file import KILL_ENV

pytestmark = [pytest.mark.server, pytest.mark.timeout(600)]
TEST_SETTINGS = {"prefill_rate_tps": 400.0, "decode_rate_tps": 50.0, "decode_log_interval": 10}
LIVENESS_S = 120.0
IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def twin(tmp_path_factory, leak_guard):
    deployment = twin_api.up("0.5.15", waiting_timeout=15, directory=tmp_path_factory.mktemp("harm-twin"),
                             **TEST_SETTINGS)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(deployment.pid(role))
    yield deployment
    deployment.down()


@pytest.fixture(scope="module")
def wheel() -> dict:
    source = fetch("0.5.15")
    return {"root": source.root, "original": source.verified_read_bytes(source.backend_file("nixl"))}


@pytest.fixture(scope="module")
def patched_bytes(wheel, tmp_path_factory) -> bytes:
    scratch = tmp_path_factory.mktemp("plan") / "conn.py"
    scratch.write_bytes(wheel["original"])
    return plan_apply(scratch).new_bytes


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _restore_twin(twin, wheel) -> None:
    """Whatever a test left: the wheel's file back and the prefill restarted on it (never a test's leftover)."""
    conn = twin.nixl_conn()
    if conn.read_bytes() != wheel["original"]:
        back = deploy_mod.rollback(twin.inventory_path, force=True, liveness_deadline_s=LIVENESS_S)
        assert back.status == "rolled-back", (back.status, back.message, back.problem)
    assert conn.read_bytes() == wheel["original"]


# ----------------------------------------------------------------------------- interrupts


def _signal_during_restart(twin, args: list[str], how: signal.Signals) -> tuple[subprocess.Popen, float]:
    """Start ``forensics patch ARGS`` and send ``how`` once its restart has stopped the old prefill
    (the moment a restart killed halfway leaves no prefill). Returns the CLI and the signal's time."""
    old_pid = twin.pid("prefill")
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
    # SIGINT at its default, as for a command in a terminal's foreground: a test run from a
    # non-interactive shell's background job inherits SIGINT ignored (commit b4a21b6).
    cli = subprocess.Popen([sys.executable, "-m", "forensics", "patch", *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: not _alive(old_pid) or cli.poll() is not None, 120,
                   "the restart to stop the old prefill", interval=0.01)
        assert cli.poll() is None, cli.communicate()
        sent = time.monotonic()
        cli.send_signal(how)
    except BaseException:
        cli.kill()
        cli.communicate()
        raise
    return cli, sent


def _alive(pid: int) -> bool:
    """Running (a zombie is not: the twin's first processes are this test process's children)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _finish(cli: subprocess.Popen, sent: float) -> tuple[dict, str, float]:
    try:
        out, err = cli.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        dump = py_spy_dump(cli.pid)
        cli.kill()
        cli.communicate()
        raise AssertionError(f"the CLI outlived the signal by 180 s; where it was:\n{dump}") from None
    return one_document(out.decode()), err.decode(), time.monotonic() - sent


@pytest.mark.parametrize(("action", "how", "over"), [("deploy", signal.SIGINT, "local"),
                                                     ("rollback", signal.SIGTERM, "local"),
                                                     ("deploy", signal.SIGINT, "ssh")])
def test_a_signal_during_the_restart_lets_it_finish_and_the_json_lists_the_steps(twin, sshd, wheel, patched_bytes,
                                                                                tmp_path, action, how, over):
    conn = twin.nixl_conn()
    inventory = twin.inventory_path
    if over == "ssh":  # the twin's own files and restart line, reached through the test sshd (needs --yes)
        from deploy_helpers import with_engine_fields
        from live_helpers import ssh_inventory

        prefill = twin.inventory.engine("prefill")
        inventory = with_engine_fields(ssh_inventory(twin, sshd, tmp_path / "over-ssh.toml", logs=None),
                                       {"prefill": {"python": prefill.python, "sglang_location": prefill.sglang_location,
                                                    "restart": prefill.restart}})
    try:
        if action == "rollback":
            done = deploy_mod.deploy(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
            assert done.status == "deployed", (done.message, done.problem)
        before = twin.pid("prefill")
        cli, sent = _signal_during_restart(twin, [action, "--inventory", str(inventory), "--yes", "--json",
                                                  "--liveness-deadline", str(LIVENESS_S)], how)
        document, stderr, took = _finish(cli, sent)
        assert cli.returncode == 130, (document, stderr)
        assert document["status"] == "interrupted" and document["exit"] == 130
        assert f"{how.name} received" in stderr and "a restart is never cut halfway" in stderr
        steps = [(s["name"], s["state"]) for s in document["steps"]]
        assert ("restart", "ok") in steps, steps  # run to its end, not killed
        assert ("rename over " + str(conn), "ok") in steps
        assert document["interrupted"]["signal"] == how.name
        assert document["interrupted"]["stopped"].startswith("waiting for liveness") or \
            document["interrupted"]["stopped"].startswith("before"), document["interrupted"]
        [state] = document["engine_states"].values()
        assert state.startswith("runs the patched file" if action == "deploy" else "runs the restored file"), state
        assert [r["verdict"] for r in document["running"].values()] == ["this-file"]
        # The prefill the restart started serves: a real one-token request through the router.
        assert twin.pid("prefill") != before and _alive(twin.pid("prefill"))
        assert deploy_mod.wait_liveness(twin.inventory, 60)["outcome"] == "ok"
        assert conn.read_bytes() == (patched_bytes if action == "deploy" else wheel["original"])
        print(f"{action} {how.name} {over}: signal to exit {took:.2f}s, to the stop "
              f"{document['interrupted']['seconds_from_signal_to_stop']}s; restart step "
              f"{[s['duration_s'] for s in document['steps'] if s['name'] == 'restart']}s")
    finally:
        _restore_twin(twin, wheel)


# ----------------------------------------------------------------------------- what runs


def test_status_says_patched_not_running_until_the_restart_and_deploy_resumes_with_it(twin, wheel, patched_bytes):
    """The file patched behind the engine's back (as a deploy killed between write and restart leaves it)."""
    from patched_engine.apply import apply_file

    conn = twin.nixl_conn()
    try:
        assert apply_file(conn, yes=True).status == "applied"
        done = forensics("status", "--inventory", str(twin.inventory_path), "--json")
        assert done.returncode == 1, done.stdout + done.stderr
        report = one_document(done.stdout)
        [engine] = report["engines"]
        assert engine["state"] == "patched-not-running" and report["status"] == "patched-not-running"
        assert "patched on disk, not yet running" in engine["reason"]
        assert engine["running"]["verdict"] == "earlier-file"
        assert engine["running"]["processes"][0]["pid"] == twin.scheduler_pid("prefill")

        before = twin.pid("prefill")
        record = deploy_mod.deploy(twin.inventory_path, liveness_deadline_s=LIVENESS_S)
        assert record.status == "deployed", (record.message, record.problem)
        assert "resumed with the restart" in record.message
        assert [s.name for s in record.steps if s.name == "restart"] == ["restart"]
        assert twin.pid("prefill") != before
        done = forensics("status", "--inventory", str(twin.inventory_path), "--json")
        assert done.returncode == 0, done.stdout
        assert one_document(done.stdout)["engines"][0]["state"] == "patched"
    finally:
        _restore_twin(twin, wheel)


def test_a_restart_line_that_restarts_nothing_is_not_deployed(twin, wheel, patched_bytes, tmp_path):
    inventory, conn = fake_deployment(tmp_path, twin, wheel, restart="/bin/true")
    done = forensics("deploy", "--inventory", str(inventory), "--yes", "--json", "--liveness-deadline",
                     str(LIVENESS_S))
    assert done.returncode == 1, done.stdout + done.stderr
    record = one_document(done.stdout)
    assert record["status"] == "not-restarted", record["message"]
    assert "the restart line `/bin/true` ran but did not restart it" in record["message"]
    assert "still runs the unpatched file" in record["message"]
    assert conn.read_bytes() == patched_bytes  # written, and said to be not running
    done = forensics("status", "--inventory", str(inventory), "--json")
    assert done.returncode == 1 and one_document(done.stdout)["engines"][0]["state"] == "patched-not-running"
    # Without a restart line doing nothing, a second deploy does not claim "after the restart".
    again = forensics("deploy", "--inventory", str(inventory), "--yes", "--json", "--liveness-deadline",
                      str(LIVENESS_S))
    assert again.returncode == 1 and one_document(again.stdout)["status"] == "not-restarted"
    assert "liveness failed" not in one_document(again.stdout)["message"]


# ----------------------------------------------------------------------------- rollback trusts the wheel


def test_rollback_refuses_a_backup_that_is_not_the_wheels_file_whatever_its_record_says(twin, wheel, patched_bytes,
                                                                                        tmp_path):
    inventory, conn = fake_deployment(tmp_path, twin, wheel)
    record = deploy_mod.deploy(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
    assert record.status == "deployed", (record.message, record.problem)
    [backup] = conn.parent.glob("conn.py.pd-forensics-backup-*")
    [record_file] = conn.parent.glob("conn.py.pd-forensics-record-*.json")
    injected = wheel["original"] + b"\nimport os; os.system('touch /tmp/pd-forensics-injected')\n"
    backup.write_bytes(injected)
    content = json.loads(record_file.read_text())
    assert content["kind"] == "original"
    content["sha256"] = _sha(injected)  # the record edited to match: it must not be the trust anchor
    content["size"] = len(injected)
    record_file.write_text(json.dumps(content))

    done = forensics("rollback", "--inventory", str(inventory), "--yes", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    refused = one_document(done.stdout)
    assert refused["status"] == "refused", refused["message"]
    assert str(backup) in refused["message"] and _sha(injected) in refused["message"]
    assert _sha(wheel["original"]) in refused["message"] and "--force" in refused["message"]
    assert conn.read_bytes() == patched_bytes  # nothing restored

    forced = forensics("rollback", "--inventory", str(inventory), "--yes", "--force", "--json",
                       "--liveness-deadline", str(LIVENESS_S))
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert one_document(forced.stdout)["status"] == "rolled-back"
    assert conn.read_bytes() == injected


# ----------------------------------------------------------------------------- full and read-only file systems


def _mount_tmpfs(directory: Path, size: str, options: str = "") -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}{options}", "tmpfs", str(directory)], check=True)


@pytest.mark.skipif(not IS_ROOT, reason="mounting a small tmpfs needs root")
def test_a_full_install_file_system_leaves_no_partial_temp_and_names_the_path(twin, wheel, tmp_path):
    inventory, conn = fake_deployment(tmp_path, twin, wheel)
    nixl = conn.parent
    saved = conn.read_bytes()
    for child in nixl.iterdir():
        child.unlink()
    _mount_tmpfs(nixl, "256k")
    try:
        conn.write_bytes(saved)
        conn.chmod(0o644)
        # Fill the file system but for 8 KiB: the record fits, the backup's install runs out of room.
        free = os.statvfs(nixl).f_bavail * os.statvfs(nixl).f_frsize
        (nixl / "filler").write_bytes(b"\0" * (free - 8192))
        done = forensics("deploy", "--inventory", str(inventory), "--yes", "--json")
        assert done.returncode == 4, done.stdout + done.stderr
        failed = one_document(done.stdout)
        assert failed["status"] == "failed" or failed["exit"] == 4
        temps = sorted(p.name for p in nixl.iterdir() if p.name.endswith(".pd-forensics-deploy.tmp"))
        assert temps == [], temps  # no partial file filling the file system
        assert ".pd-forensics-deploy.tmp" in failed["problem"] and str(nixl) in failed["problem"]
        assert "No space left on device" in failed["problem"] and "is removed" in failed["problem"]
        assert conn.read_bytes() == saved
    finally:
        subprocess.run(["umount", str(nixl)], check=True)


@pytest.mark.skipif(not IS_ROOT, reason="a read-only mount needs root")
def test_a_read_only_install_dir_is_exit_4_naming_it_and_sudo_advice_only_where_it_helps(twin, wheel, tmp_path):
    inventory, conn = fake_deployment(tmp_path, twin, wheel)
    nixl = conn.parent
    saved = conn.read_bytes()
    conn.unlink()
    _mount_tmpfs(nixl, "1m")
    try:
        conn.write_bytes(saved)
        conn.chmod(0o644)
        subprocess.run(["mount", "-o", "remount,ro", str(nixl)], check=True)
        done = forensics("deploy", "--inventory", str(inventory), "--yes", "--json")
        assert done.returncode == 4, done.stdout + done.stderr
        failed = one_document(done.stdout)
        assert f"{nixl} is on a read-only file system" in failed["problem"], failed["problem"]
        assert "sudo = true" not in failed["problem"] + failed["message"]  # root could not write it either
        assert conn.read_bytes() == saved
    finally:
        subprocess.run(["umount", str(nixl)], check=True)


@pytest.mark.skipif(not IS_ROOT, reason="running the locate script as another user needs root")
def test_sudo_advice_is_given_when_only_root_could_write(wheel):
    """The locate script really run as `nobody` against a root-owned install: sudo would help, so say it."""
    import shutil

    from deploy_helpers import fake_site

    from patched_engine.deploy_plan import write_access_problem
    from patched_engine.locate import LOCATE_SCRIPT, Located

    base = Path("/tmp") / f"pdfx-advice-{os.getpid()}"
    try:
        base.mkdir(mode=0o755)
        site = fake_site(base, wheel, wheel["original"])
        for path in [site, *site.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                 "-c", LOCATE_SCRIPT, str(site)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        located = Located(python=answer["python"], package_dir=answer["package_dir"], version=answer["version"],
                          version_source=answer["version_source"], conn=answer["conn"], file=answer["file"],
                          raw=answer)
        assert answer["uid"] == 65534 and answer["file"]["dir_writable"] is False
        advice = write_access_problem(located, sudo=False)
        assert advice and str(site / "sglang/srt/disaggregation/nixl") in advice and "set sudo = true" in advice
        assert write_access_problem(located, sudo=True) is None
    finally:
        shutil.rmtree(base, ignore_errors=True)
