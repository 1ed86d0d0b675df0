"""``LocalHost``: commands on this machine, with the same contract as over SSH.

Each command runs in its own session (process group) under ``timeout --kill-after=2 T``
like a remote one, so it dies at its deadline even if this process is gone; at the
deadline the whole group gets SIGTERM, then SIGKILL, so nothing it started outlives
it. If even that wrapper does not end it, we kill the group ourselves a little later.
Waiting is on the pipes (selectors), never a polling loop.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

from .base import DEFAULT_CHUNK, CappedBuffer, Chunks, Host, as_path
from .quoting import KILL_AFTER_S, check_argv, sudo_argv, timeout_argv
from .result import CommandResult, State

GRACE_S = 5.0  # beyond timeout(1)'s deadline + kill-after, before we kill the group ourselves
_TIMEOUT_TOOL = shutil.which("timeout")


class LocalHost(Host):
    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"local:{socket.gethostname()}"

    def _chunks(
        self, argv: Sequence[str], *, timeout: float, sudo: bool, chunk_size: int, max_stderr: int | None
    ) -> Chunks:
        args = check_argv(argv)
        shown = tuple(args)
        start = time.monotonic()
        exe = args[0] if "/" in args[0] else shutil.which(args[0])
        if exe is None or not os.access(exe, os.X_OK):
            return CommandResult(self.name, shown, State.ERROR, error=f"no executable program {args[0]!r}")
        if sudo:
            args = sudo_argv(args)
        if _TIMEOUT_TOOL:
            args = timeout_argv(args, timeout)
            deadline = start + timeout + KILL_AFTER_S + GRACE_S
        else:
            deadline = start + timeout
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
            )
        except OSError as exc:
            return CommandResult(
                self.name, shown, State.ERROR, duration_s=time.monotonic() - start, error=f"{type(exc).__name__}: {exc}"
            )
        err = CappedBuffer(max_stderr)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        timed_out = False
        try:
            while sel.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(remaining):
                    data = os.read(key.fd, chunk_size)
                    if not data:
                        sel.unregister(key.fileobj)
                    elif key.data == "out":
                        yield data
                    else:
                        err.add(data)
            if not timed_out:
                try:
                    proc.wait(max(deadline - time.monotonic(), 0))
                except subprocess.TimeoutExpired:
                    timed_out = True
            if timed_out:
                _stop_group(proc)
        finally:
            if proc.poll() is None:  # closed early by the caller, or an exception
                _stop_group(proc, grace=0)
            sel.close()
            proc.stdout.close()
            proc.stderr.close()
        duration = time.monotonic() - start
        if timed_out:
            return CommandResult(
                self.name, shown, State.TIMED_OUT, stderr=err.value(), duration_s=duration,
                truncated=err.truncated, error=f"killed at its {timeout:g}s deadline",
            )
        code = proc.returncode
        if _TIMEOUT_TOOL and code in (124, 137, -9) and duration >= timeout * 0.9:
            return CommandResult(
                self.name, shown, State.TIMED_OUT, stderr=err.value(), duration_s=duration,
                truncated=err.truncated, error=f"killed at its {timeout:g}s deadline",
            )
        return CommandResult(
            self.name, shown, State.OK if code == 0 else State.FAILED, exit_code=code, stderr=err.value(),
            duration_s=duration, truncated=err.truncated,
        )

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def iter_file(self, path: str, chunk_size: int = DEFAULT_CHUNK) -> Iterator[bytes]:
        with open(path, "rb") as f:
            while chunk := f.read(chunk_size):
                yield chunk

    def put_file(self, local: str | os.PathLike[str], remote: str) -> None:
        """Copy through a temporary file in the target directory, then rename (never half a file)."""
        target = as_path(remote)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(fd)
        try:
            shutil.copyfile(local, tmp)
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise


def _stop_group(proc: subprocess.Popen, grace: float = KILL_AFTER_S) -> None:
    """SIGTERM the command's process group, SIGKILL it after ``grace`` seconds, reap the leader."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        if grace == 0 and sig == signal.SIGTERM:
            continue
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(wait)
            if sig == signal.SIGTERM:
                # The leader is gone; make sure nothing else of its group stays.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        except subprocess.TimeoutExpired:
            continue
