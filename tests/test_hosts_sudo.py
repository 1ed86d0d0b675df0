"""``sudo=True`` runs through ``sudo -n``: allowed commands run as root, anything else fails at once.

The fixture installs Debian's sudo when missing (root with apt only), creates an
unprivileged user whose key the test sshd accepts, and a sudoers rule in /etc/sudoers.d/
for exactly the commands used here; both are removed afterwards.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from forensics.hosts import LocalHost, SSHHost, State

pytestmark = [pytest.mark.server, pytest.mark.needs_root, pytest.mark.timeout(600)]

USER = "pdfx-sudo-test"
SUDOERS = Path("/etc/sudoers.d/pdfx-hosts-test")
MARKER = f"{600 + uuid.uuid4().int % 1000 / 1000:.3f}"  # "sleep 600.xyz", findable among processes


def _ensure_sudo() -> None:
    if shutil.which("sudo") and shutil.which("visudo"):
        return
    if shutil.which("apt-get") is None:
        pytest.skip("sudo missing and no apt-get to install it (./run installs Debian's sudo)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "sudo"]
    if subprocess.run(cmd, env=env, capture_output=True, timeout=400).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=400)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
        if done.returncode != 0:
            pytest.skip(f"apt-get install sudo failed: {done.stderr.strip()[-300:]}")


def _remove_user() -> None:
    from user_helpers import remove_user

    remove_user(USER)


@pytest.fixture(scope="module")
def sudo_user(sshd):
    if os.geteuid() != 0:
        pytest.skip("needs root: adds a user and a sudoers rule")
    if shutil.which("useradd") is None:
        pytest.skip("useradd missing")
    _ensure_sudo()
    _remove_user()
    # '*' = no password at all, but not a locked account (sshd refuses locked ones without PAM).
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*", USER],
                   check=True, capture_output=True, timeout=60)
    rule = (
        f"{USER} ALL=(root) NOPASSWD: {shutil.which('id')} -u, {shutil.which('sleep')} {MARKER}\n"
    )
    from user_helpers import install_sudoers

    install_sudoers(SUDOERS, rule)
    try:
        yield USER
    finally:
        SUDOERS.unlink(missing_ok=True)
        _remove_user()


def _as_user(sshd, user) -> SSHHost:
    return SSHHost("127.0.0.1", **{**sshd.host_args(), "user": user})


def test_allowed_command_runs_as_root_without_a_prompt(sshd, sudo_user):
    uid = pwd.getpwnam(sudo_user).pw_uid
    with _as_user(sshd, sudo_user) as h:
        plain = h.run(["id", "-u"], timeout=60)
        assert plain.ok and plain.stdout == f"{uid}\n".encode(), plain
        root = h.run(["id", "-u"], timeout=60, sudo=True)
        assert root.ok and root.stdout == b"0\n", root
        assert "sudo -n --" in root.command_line


def test_command_not_allowed_fails_with_sudos_message_never_hangs(sshd, sudo_user):
    with _as_user(sshd, sudo_user) as h:
        start = time.monotonic()
        r = h.run(["id", "-g"], timeout=120, sudo=True)
    assert r.state is State.FAILED and r.exit_code == 1, r
    assert b"sudo:" in r.stderr and (b"password is required" in r.stderr or b"not allowed" in r.stderr), r.stderr
    assert time.monotonic() - start < 60  # an answer, not a prompt waiting for its timeout


def test_sudo_command_cannot_outlive_its_timeout(sshd, sudo_user):
    with _as_user(sshd, sudo_user) as h:
        r = h.run(["sleep", MARKER], timeout=3, sudo=True)
    assert r.state is State.TIMED_OUT, r
    left = [p for p in psutil.process_iter(["cmdline"]) if MARKER in " ".join(p.info["cmdline"] or [])]
    _, alive = psutil.wait_procs(left, timeout=30)
    assert not alive, [p.cmdline() for p in alive]


def test_local_sudo_goes_through_sudo_n(sudo_user):
    r = LocalHost().run(["id", "-u"], sudo=True, timeout=60)
    assert r.ok and r.stdout == b"0\n", r
