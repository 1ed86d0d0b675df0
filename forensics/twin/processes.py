"""Starting, stopping and finding the twin's processes: pid files, log files, readiness.

Each role runs as ``python -m forensics.twin.<role> --inventory FILE`` in its own
session, stdout and stderr appended to ``<role>.log`` (so a thread's traceback lands
among sglang's lines), its pid in ``<role>.pid`` for py-spy and ``twin down``.
Readiness is polled over HTTP, never slept for; a process that exits early is
reported with the tail of its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from forensics.exitcodes import EnvironmentProblem

ROLE_ORDER = ("prefill", "decode", "router")
READY_TIMEOUT_S = 60.0


class TwinStartError(EnvironmentProblem):
    """A twin process could not start or did not become ready; the message says which and why."""


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports the kernel says are free right now."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


def pid_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.pid"


def log_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.log"


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start(role: str, inventory_path: Path, directory: Path, python: str | None = None) -> subprocess.Popen:
    log_path = log_file(directory, role)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # The twin's processes import forensics from wherever this process did.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [python or sys.executable, "-m", f"forensics.twin.{role}", "--inventory", str(inventory_path)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    pid_file(directory, role).write_text(f"{proc.pid}\n")
    return proc


def wait_ready(role: str, url: str, proc: subprocess.Popen | None, directory: Path,
               timeout: float = READY_TIMEOUT_S) -> float:
    """Poll ``url`` until it answers 200; raise naming the role (with its log tail) if it dies or times out."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise TwinStartError(f"twin {role} exited with status {proc.returncode} before it was ready: "
                                 f"{log_tail(directory, role)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TwinStartError(f"twin {role} not ready at {url} after {timeout:.0f}s: {log_tail(directory, role)}")
        time.sleep(0.02)


def log_tail(directory: Path, role: str, lines: int = 6) -> str:
    try:
        text = log_file(directory, role).read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def stop(directory: Path, role: str, timeout: float = 10.0) -> bool:
    """SIGTERM the role's process group, SIGKILL after ``timeout``; True if something was running."""
    path = pid_file(directory, role)
    pid = read_pid(path)
    was_running = alive(pid)
    if pid is not None and was_running:
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.02)
        if alive(pid):
            _signal_group(pid, signal.SIGKILL)
            kill_deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < kill_deadline:
                _reap(pid)
                time.sleep(0.02)
        _reap(pid)
    path.unlink(missing_ok=True)
    return was_running


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
