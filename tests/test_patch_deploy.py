"""``patch deploy|status|rollback`` against a real 0.5.15 twin, locally and over a real sshd.

One twin for the module. The acceptance flow deploys over SSH to the twin's own copy of the
release (``twin restart`` restarts the prefill, LIVENESS through the router), reads the status,
rolls back and finds the wheel's bytes again. The refusal, plan-only and kill tests use a
small "deployment" whose sglang is a copy of the release's files in a temporary directory
and whose URLs, process selector and restart line are the twin's prefill's (tests/deploy_helpers.py):
the restart and the liveness check are real.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from cli_helpers import one_document
from deploy_helpers import fake_deployment, fake_site, forensics, with_engine_fields
from live_helpers import ssh_inventory
from user_helpers import install_sudoers

import forensics.twin as twin_api
from forensics.sglang_source import fetch
from patched_engine import deploy as deploy_mod
from patched_engine import snippets
from patched_engine.apply import plan_apply
from patched_engine.remote_file import KILL_ENV, KILL_POINTS

pytestmark = [pytest.mark.server, pytest.mark.timeout(600)]
TEST_SETTINGS = {"prefill_rate_tps": 400.0, "decode_rate_tps": 50.0, "decode_log_interval": 10}
LIVENESS_S = 120.0


@pytest.fixture(scope="module")
def twin(tmp_path_factory, leak_guard):
    deployment = twin_api.up("0.5.15", waiting_timeout=15, directory=tmp_path_factory.mktemp("deploy-twin"),
                             **TEST_SETTINGS)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(deployment.pid(role))
    yield deployment
    deployment.down()


@pytest.fixture(scope="module")
def wheel() -> dict:
    source = fetch("0.5.15")
    original = source.verified_read_bytes(source.backend_file("nixl"))
    return {"root": source.root, "original": original}


@pytest.fixture(scope="module")
def patched_bytes(wheel, tmp_path_factory) -> bytes:
    scratch = tmp_path_factory.mktemp("plan") / "conn.py"
    scratch.write_bytes(wheel["original"])
    return plan_apply(scratch).new_bytes


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- the acceptance flow


def test_deploy_over_ssh_restart_liveness_status_rollback(twin, sshd, wheel, patched_bytes, tmp_path):
    conn = twin.nixl_conn()
    assert conn.read_bytes() == wheel["original"]
    prefill = twin.inventory.engine("prefill")
    inventory = with_engine_fields(
        ssh_inventory(twin, sshd, tmp_path / "over-ssh.toml", logs=None),
        {"prefill": {"python": prefill.python, "sglang_location": prefill.sglang_location,
                     "restart": prefill.restart}})
    before = os.stat(conn)
    pycache = conn.parent / "__pycache__"
    pycache.mkdir(exist_ok=True)
    stale_pyc = pycache / f"conn.{sys.implementation.cache_tag}.pyc"
    stale_pyc.write_bytes(b"stale bytecode")
    pid_before = twin.pid("prefill")

    done = forensics("status", "--inventory", str(inventory), "--json")
    assert done.returncode == 1, done.stderr
    assert [e["state"] for e in one_document(done.stdout)["engines"]] == ["original"]

    # Not a twin (no [twin] table): without --yes only the plan and the diff.
    done = forensics("deploy", "--inventory", str(inventory), "--json")
    assert done.returncode == 0, done.stderr
    plan = one_document(done.stdout)
    assert plan["status"] == "planned" and not plan["steps"]
    engine = plan["engines"][0]
    assert engine["kind"] == "original" and engine["file"] == str(conn) and "+" + snippets.MARK in engine["diff"]
    assert any("bootstrap loop runs on this prefill" in a for a in engine["actions"])
    assert any(c["argv"][:2] == ["mv", "-f"] for c in plan["commands"])
    assert conn.read_bytes() == wheel["original"]

    record = deploy_mod.deploy(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
    assert record.status == "deployed", (record.problem, record.message, [s.to_dict() for s in record.steps])
    assert record.liveness["outcome"] == "ok"
    assert conn.read_bytes() == patched_bytes
    after = os.stat(conn)
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (
        before.st_uid, before.st_gid, stat.S_IMODE(before.st_mode))
    assert not stale_pyc.exists() or stale_pyc.read_bytes() != b"stale bytecode"  # removed (maybe rebuilt)
    assert not list(conn.parent.glob(".conn.py.pd-forensics-deploy.tmp"))
    assert twin.pid("prefill") != pid_before  # really restarted
    names = [s.name for s in record.steps]
    assert "compile check with the target interpreter" in names and "restart" in names
    assert all(s.state == "ok" for s in record.steps)
    assert all(c["state"] == "ok" for s in record.steps for c in s.commands)
    backups = list(conn.parent.glob("conn.py.pd-forensics-backup-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == wheel["original"]
    # Written as the login user (sudo = false): the backup and its record are its own only (issue 19).
    records = list(conn.parent.glob("conn.py.pd-forensics-record-*.json"))
    assert [stat.S_IMODE(p.stat().st_mode) for p in backups + records] == [0o600, 0o600]

    done = forensics("status", "--inventory", str(inventory), "--json")
    assert done.returncode == 0, done.stderr
    report = one_document(done.stdout)
    assert report["status"] == "patched"
    assert [(e["state"], e["patch_id"]) for e in report["engines"]] == [("patched", snippets.PATCH_ID)]

    # Deploying again changes nothing.
    again = deploy_mod.deploy(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
    assert again.status == "already-patched" and conn.read_bytes() == patched_bytes

    done = forensics("rollback", "--inventory", str(inventory), "--yes", "--json", "--liveness-deadline",
                     str(LIVENESS_S))
    assert done.returncode == 0, done.stdout + done.stderr
    rolled = one_document(done.stdout)
    assert rolled["status"] == "rolled-back" and rolled["liveness"]["outcome"] == "ok"
    assert _sha(conn.read_bytes()) == _sha(wheel["original"])
    done = forensics("status", "--inventory", str(inventory), "--json")
    assert done.returncode == 1 and one_document(done.stdout)["engines"][0]["state"] == "original"


def test_twin_inventory_needs_no_yes_and_plan_only_without_it_elsewhere(twin, wheel, patched_bytes, tmp_path):
    """The twin's own inventory deploys without --yes (locally, `twin restart`); its copy without [twin] does not."""
    conn = twin.nixl_conn()
    document = tomllib.loads(Path(twin.inventory_path).read_text())
    assert "twin" in document
    document.pop("twin")
    live_like = tmp_path / "not-a-twin.toml"
    live_like.write_text(tomli_w.dumps(document))

    done = forensics("deploy", "--inventory", str(live_like))
    assert done.returncode == 0, done.stderr
    assert "plan only" in done.stdout and "+" + snippets.MARK in done.stdout
    assert conn.read_bytes() == wheel["original"]

    done = forensics("deploy", "--inventory", str(twin.inventory_path), "--json", "--liveness-deadline",
                     str(LIVENESS_S))
    assert done.returncode == 0, done.stdout + done.stderr
    assert one_document(done.stdout)["status"] == "deployed"
    assert conn.read_bytes() == patched_bytes
    done = forensics("rollback", "--inventory", str(twin.inventory_path), "--json", "--liveness-deadline",
                     str(LIVENESS_S))
    assert done.returncode == 0, done.stdout + done.stderr
    assert conn.read_bytes() == wheel["original"]


def test_the_plan_warns_of_the_0_5_15_decode_and_restart_decodes_restarts_it(twin, wheel, tmp_path):
    """sglang 0.5.15's decode blocks for good on a send to a restarted prefill (its receiver's socket:
    RECONNECT_IVL -1, no SNDTIMEO): the plan says so, and --restart-decodes restarts it after the prefill."""
    document = tomllib.loads(Path(twin.inventory_path).read_text())
    document.pop("twin")
    live_like = tmp_path / "not-a-twin.toml"
    live_like.write_text(tomli_w.dumps(document))
    planned = forensics("deploy", "--inventory", str(live_like), "--restart-decodes", "--json")
    assert planned.returncode == 0, planned.stderr
    plan = one_document(planned.stdout)
    [hazard] = plan["decode_hazards"]
    assert hazard["engine"] == "decode-0" and hazard["release"] == "0.5.15"
    assert hazard["where"] == "common/conn.py:1101 CommonKVReceiver._connect"
    assert [c["argv"] for c in plan["commands"]][-1] == hazard["restart"]  # shown before anything runs
    shown = forensics("deploy", "--inventory", str(live_like))
    assert "blocks for good" in shown.stdout and "common/conn.py:1101" in shown.stdout, shown.stdout

    decode_before = twin.pid("decode")
    try:
        record = deploy_mod.deploy(twin.inventory_path, restart_decodes=True, liveness_deadline_s=LIVENESS_S)
        assert record.status == "deployed", (record.message, record.problem)
        [step] = [s for s in record.steps if s.name == "restart the decode"]
        assert step.state == "ok" and step.engine == "decode-0" and "common/conn.py:1101" in step.detail
        assert twin.pid("decode") != decode_before
        assert "the deploy restarts it after the prefill" in record._repr_html_()  # a notebook shows it too
        assert record.liveness["outcome"] == "ok"
    finally:
        back = deploy_mod.rollback(twin.inventory_path, restart_decodes=True, liveness_deadline_s=LIVENESS_S)
    assert back.status == "rolled-back", (back.message, back.problem)
    assert twin.nixl_conn().read_bytes() == wheel["original"]


def test_a_fork_is_refused_without_force(twin, wheel, tmp_path):
    fork = wheel["original"].replace(b"GUARD = ", b"# a local edit\nGUARD = ", 1)
    assert fork != wheel["original"]
    inventory, conn = fake_deployment(tmp_path, twin, wheel, conn=fork)
    done = forensics("deploy", "--inventory", str(inventory), "--yes", "--json")
    assert done.returncode == 1, done.stderr
    refused = one_document(done.stdout)
    assert refused["status"] == "refused" and "--force" in refused["message"]
    assert refused["engines"][0]["kind"] == "fork" and refused["engines"][0]["diff"]
    assert conn.read_bytes() == fork

    done = forensics("status", "--inventory", str(inventory), "--json")
    assert done.returncode == 1 and one_document(done.stdout)["engines"][0]["state"] == "unknown"

    record = deploy_mod.deploy(inventory, yes=True, force=True, liveness_deadline_s=LIVENESS_S)
    assert record.status == "deployed", record.problem
    assert deploy_mod.patch_id_of(conn.read_bytes()) == snippets.PATCH_ID
    assert b"# a local edit" in conn.read_bytes()


def test_status_unreadable_is_exit_3(twin, wheel, tmp_path):
    inventory, conn = fake_deployment(tmp_path, twin, wheel)
    shutil.rmtree(conn.parent.parent.parent.parent)  # no sglang at all there any more
    done = forensics("status", "--inventory", str(inventory), "--json")
    assert done.returncode == 3, done.stdout + done.stderr
    assert one_document(done.stdout)["engines"][0]["state"] == "unreadable"


# ----------------------------------------------------------------------------- kill at every step


@pytest.mark.parametrize("over", ["local", "ssh"])
@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_at_each_step_leaves_original_or_patched(twin, sshd, wheel, patched_bytes, tmp_path, point, over):
    inventory, conn = fake_deployment(tmp_path, twin, wheel, sshd=sshd if over == "ssh" else None)
    done = forensics("deploy", "--inventory", str(inventory), "--yes", env={KILL_ENV: point})
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    # Its progress names the private upload directory it made (other workers' deploys make theirs
    # in /tmp at the same time: only this one is the killed run's to clean up).
    leftovers = set(re.findall(r"/tmp/pd-forensics-deploy\.[A-Za-z0-9]{8}", done.stderr))
    assert len(leftovers) == 1 and all(Path(d).is_dir() for d in leftovers), done.stderr  # every point is after it
    now = conn.read_bytes()
    assert now in (wheel["original"], patched_bytes)
    assert now == (patched_bytes if point == "after-mv" else wheel["original"])
    assert stat.S_IMODE(os.stat(conn).st_mode) == 0o644
    record = deploy_mod.deploy(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
    assert record.status == "deployed", (record.problem, record.message)
    assert conn.read_bytes() == patched_bytes
    assert not (conn.parent / ".conn.py.pd-forensics-deploy.tmp").exists()
    if point == "after-mv":  # killed before its restart: the next deploy writes nothing and resumes with it
        assert "resumed with the restart" in record.message
        assert not any(s.name.startswith("install") for s in record.steps)
        assert [s.name for s in record.steps if s.name == "restart"] == ["restart"]
        again = deploy_mod.deploy(inventory, yes=True, restart=True, liveness_deadline_s=LIVENESS_S)
        assert again.status == "already-patched" and [s.name for s in again.steps if s.name == "restart"]
    # The killed run's private upload directory stays (it could not remove it): ours to clean here.
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)


def test_unknown_kill_point_is_refused_before_anything(twin, wheel, tmp_path):
    inventory, conn = fake_deployment(tmp_path, twin, wheel)
    done = forensics("deploy", "--inventory", str(inventory), "--yes", "--json", env={KILL_ENV: "nowhere"})
    assert done.returncode == 4, done.stderr
    assert conn.read_bytes() == wheel["original"]


# ----------------------------------------------------------------------------- the production path: sudo


@pytest.mark.needs_root
def test_deploy_and_rollback_as_an_unprivileged_user_with_the_generated_sudoers(twin, sshd, wheel, patched_bytes):
    """A root-owned site-packages, an operator account and exactly the rules docs/LIVE.md generates."""
    import uuid

    from user_helpers import skip_reason, test_user

    from patched_engine.live_plan import sudoers_rules

    reason = skip_reason()
    if reason or not shutil.which("sudo") or not shutil.which("visudo"):
        pytest.skip(reason or "sudo/visudo missing")
    name = f"pdfx-deploy-{uuid.uuid4().hex[:6]}"
    base = Path("/tmp") / f"pdfx-deploy-root-{uuid.uuid4().hex[:8]}"  # readable by the test user
    sudoers = Path(f"/etc/sudoers.d/{name}")
    try:
        base.mkdir(mode=0o755)
        site_parent = base / "lib/python3.11"
        site_parent.mkdir(parents=True)
        for directory in (base / "lib", site_parent):
            directory.chmod(0o755)
        site = fake_site(site_parent, wheel, wheel["original"])
        for path in [site, *site.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        conn = site / "sglang/srt/disaggregation/nixl/conn.py"
        pycache = conn.parent / "__pycache__"
        pycache.mkdir(mode=0o755)
        (pycache / "conn.cpython-311.pyc").write_bytes(b"stale")
        with test_user(name) as user:
            inventory = with_engine_fields(
                ssh_inventory(twin, sshd, base / "inventory.toml", logs=None, user=user, sudo=True,
                              name="sudo-over-ssh", pid_dir=base),  # pid files the test user can read
                {"prefill": {"python": "/usr/bin/python3", "sglang_location": str(site), "restart": "true"}})
            # Without the rules: sudo -n fails at once, the step says so, nothing is written (exit 4 in the CLI).
            denied = deploy_mod.deploy(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
            assert denied.status == "failed" and denied.exit_status == 4
            assert "sudo" in denied.problem and "install" in denied.problem, denied.problem
            assert conn.read_bytes() == wheel["original"]
            assert not list(conn.parent.glob("conn.py.pd-forensics-backup-*"))

            rules = sudoers_rules(inventory, user=user, uid=0, gid=0, mode="0644")
            install_sudoers(sudoers, rules)

            # Its restart line is `true`: written, but nothing restarted, and the deploy says so.
            record = deploy_mod.deploy(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
            assert record.status == "not-restarted", (record.problem, [s.to_dict() for s in record.steps][-3:])
            assert "did not restart it" in record.message and record.exit_status == 1
            assert conn.read_bytes() == patched_bytes
            info = os.stat(conn)
            assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o644)
            assert not (pycache / "conn.cpython-311.pyc").exists()
            assert any(c["command_line"] and "sudo -n -- install" in c["command_line"]
                       for s in record.steps for c in s.commands)
            report = deploy_mod.status(inventory)
            assert report.exit_status == 1 and [e.state for e in report.engines] == ["patched-not-running"]

            rolled = deploy_mod.rollback(inventory, yes=True, liveness_deadline_s=LIVENESS_S)
            assert rolled.status == "not-restarted" and rolled.liveness["outcome"] == "ok", rolled.problem
            assert conn.read_bytes() == wheel["original"]
            assert (os.stat(conn).st_uid, stat.S_IMODE(os.stat(conn).st_mode)) == (0, 0o644)
    finally:
        sudoers.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def test_line_endings_and_mode_are_kept_over_ssh(twin, sshd, wheel, tmp_path):
    """A CRLF copy (a fork: --force) with mode 0640 keeps CRLF on every line and its mode."""
    import re

    crlf = wheel["original"].replace(b"\n", b"\r\n")
    inventory, conn = fake_deployment(tmp_path, twin, wheel, conn=crlf, sshd=sshd)
    conn.chmod(0o640)
    record = deploy_mod.deploy(inventory, yes=True, force=True, liveness_deadline_s=LIVENESS_S)
    assert record.status == "deployed", record.problem
    now = conn.read_bytes()
    assert deploy_mod.patch_id_of(now) == snippets.PATCH_ID
    assert not re.search(rb"(?<!\r)\n", now)  # no bare LF: inserted lines take the file's CRLF
    assert stat.S_IMODE(os.stat(conn).st_mode) == 0o640
