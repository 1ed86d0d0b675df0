"""A real OpenSSH server on 127.0.0.1 for the tests: its own host key, client key and config.

``start_sshd()`` generates an ed25519 host key and client key with ``ssh-keygen``, writes
``authorized_keys`` and a ``known_hosts`` line from the host's public key, starts
``/usr/sbin/sshd -D -e -f CONFIG`` on a free port and waits until it answers with its
banner (never a fixed sleep). ``TestSSHD.stop()`` ends it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
READY_TIMEOUT_S = 60.0


@dataclass
class TestSSHD:
    __test__ = False  # not a pytest class

    proc: subprocess.Popen
    dir: Path
    port: int
    host_key: Path  # the server's private host key
    host_pub: str  # "ssh-ed25519 AAAA..."
    client_key: Path  # private key the server accepts (root and any test user)
    known_hosts: Path  # one line: [127.0.0.1]:PORT host_pub
    authorized_keys: Path
    log: Path

    @property
    def user(self) -> str:
        import getpass

        return getpass.getuser()

    def host_args(self) -> dict:
        """Keyword arguments for ``SSHHost`` reaching this server as the current user."""
        return dict(
            port=self.port, user=self.user, key_filename=str(self.client_key), known_hosts=str(self.known_hosts),
            allow_agent=False, ssh_config=os.devnull,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        shutil.rmtree(self.dir, ignore_errors=True)


def skip_reason() -> str | None:
    if not os.path.exists(SSHD):
        return f"{SSHD} missing: install openssh-server (./run installs it)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen missing: install openssh-client"
    return None


def keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
    )
    return Path(f"{path}.pub").read_text().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float = READY_TIMEOUT_S) -> None:
    """Until a TCP connection to ``port`` gets an SSH banner; fails with sshd's log if it exits."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.settimeout(10)
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd on port {port} not ready after {timeout}s: {log.read_text(errors='replace')[-2000:]}")
        # Not listening yet: wait on the process rather than spinning.
        try:
            proc.wait(0.05)
        except subprocess.TimeoutExpired:
            pass


def write_config(d: Path, port: int, host_key: Path, authorized_keys: Path) -> Path:
    config = d / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized_keys}",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                "MaxStartups 100",
                "MaxSessions 100",
                "AllowTcpForwarding yes",
                "AllowAgentForwarding no",
                "X11Forwarding no",
                "PrintMotd no",
                "LogLevel INFO",
                "Subsystem sftp internal-sftp",
                "",
            ]
        )
    )
    return config


def start_sshd() -> TestSSHD:
    d = Path(tempfile.mkdtemp(prefix="pdfx-sshd-"))
    d.chmod(0o755)  # a test user (sudo tests) must read authorized_keys as itself
    host_key = d / "host_ed25519"
    host_pub = keygen(host_key, "pdfx-test-host")
    client_key = d / "client_ed25519"
    client_pub = keygen(client_key, "pdfx-test-client")
    authorized_keys = d / "authorized_keys"
    authorized_keys.write_text(client_pub + "\n")
    authorized_keys.chmod(0o644)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    log = d / "sshd.log"
    last_error: Exception | None = None
    for _ in range(3):  # the free port may be taken between probing and binding
        port = free_port()
        config = write_config(d, port, host_key, authorized_keys)
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL, stdout=logf, stderr=logf
            )
        try:
            wait_ready(proc, port, log)
        except RuntimeError as exc:
            last_error = exc
            if proc.poll() is None:
                proc.kill()
            proc.wait(15)
            continue
        known_hosts = d / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub}\n")
        return TestSSHD(proc, d, port, host_key, host_pub, client_key, known_hosts, authorized_keys, log)
    shutil.rmtree(d, ignore_errors=True)
    raise RuntimeError(f"sshd did not start: {last_error}")
