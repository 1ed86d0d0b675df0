"""A real unprivileged user for permission tests: made with useradd, removed with its processes.

``test_user(name)`` is a context manager giving the name; it needs root and useradd (the
caller skips otherwise: ``skip_reason()``). The account has no password at all (``*``)
but is not locked, so the test sshd (shared authorized_keys) lets it in by key.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


def skip_reason() -> str | None:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return "needs root and useradd to make an unprivileged user"
    return None


def remove_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    procs = [p for p in psutil.process_iter(["username"]) if p.info["username"] == name]
    for p in procs:  # only processes of our own test user
        try:
            p.kill()
        except psutil.NoSuchProcess:  # it left between the listing and the kill (an sshd session ending)
            pass
    psutil.wait_procs(procs, timeout=30)
    subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)


@contextmanager
def test_user(name: str) -> Iterator[str]:
    remove_user(name)  # a run killed before its cleanup left it behind
    # '*' = no password at all, but not a locked account (sshd refuses locked ones without PAM).
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*", name],
                   check=True, capture_output=True, timeout=60)
    try:
        yield name
    finally:
        remove_user(name)


test_user.__test__ = False  # not a test, despite its name


def install_sudoers(path, rules: str) -> None:
    """Check ``rules`` with visudo, then put them at ``path`` (mode 0440) in one rename."""
    from pathlib import Path

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")  # sudo ignores names holding a '.'
    tmp.write_text(rules)
    tmp.chmod(0o440)
    check = subprocess.run(["visudo", "-c", "-f", str(tmp)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    os.replace(tmp, path)
