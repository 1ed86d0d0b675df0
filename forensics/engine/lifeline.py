"""Start a real engine process held by a lifeline until its launcher hands the deployment over.

sglang's processes are not ours to change, so the twin's way (a thread inside each process reads
a pipe) is not open here. Instead each engine command runs under :mod:`lifeline_shim`, a tiny
stdlib-only process started with the engine environment's interpreter (``python -I``): it
puts the unchanged sglang command in a session of its own, and SIGKILLs that session's process
group when its end of a socket pair reads end-of-file, which is what the kernel gives it the
moment the launcher dies, however it dies (SIGKILL included). After the handover (every role
ready) the launcher writes ``H``, the shim leaves, and the engine, reparented, outlives the CLI.

Why not ``PR_SET_PDEATHSIG`` on the engine itself: it fires when the *thread* that forked the
child exits (not the process), it would have to be undone at the handover (it cannot: it is the
engine's own attribute, and a handed-over engine must outlive its launcher), and a process that
dies before the ``prctl`` runs escapes it. The socket's end-of-file has none of these gaps.
sglang itself sets ``PR_SET_PDEATHSIG`` (SIGKILL) in its scheduler and detokenizer
(``kill_itself_when_parent_died``, ``utils/common.py`` around line 2854 in 0.5.15, called at their
start), so they die with the HTTP server; the group kill covers a child still starting as well.
"""

from __future__ import annotations

import select
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from forensics.exitcodes import EnvironmentProblem

SHIM = Path(__file__).with_name("lifeline_shim.py")
REPORT_TIMEOUT_S = 60.0  # the shim's interpreter start (python -I, stdlib only) on a loaded machine


class LifelineError(EnvironmentProblem):
    """The shim could not start the engine command (the message quotes what it said)."""


@dataclass
class HeldProcess:
    """An engine process under its shim: the engine's pid (its process group's id), until handed over."""

    role: str
    shim: subprocess.Popen
    channel: socket.socket | None
    pid: int
    create_time: float
    argv: list[str]
    exit_status: int | None = None
    _pending: bytes = field(default=b"", repr=False)

    def exited(self) -> int | None:
        """The engine's exit status once it has exited before the handover (the shim reports it), else None."""
        if self.exit_status is not None or self.channel is None:
            return self.exit_status
        while True:
            ready, _, _ = select.select([self.channel], [], [], 0)
            if not ready:
                break
            try:
                data = self.channel.recv(256)
            except OSError:
                data = b""
            if not data:  # the shim itself is gone: whatever it held is no longer held
                self.exit_status = self.exit_status if self.exit_status is not None else -1
                break
            self._pending += data
        while b"\n" in self._pending:
            line, _, self._pending = self._pending.partition(b"\n")
            word, _, value = line.decode(errors="replace").partition(" ")
            if word == "exit":
                self.exit_status = int(value)
        return self.exit_status

    def handover(self) -> None:
        """The deployment is ready: the shim leaves, the engine stays."""
        if self.channel is None:
            return
        try:
            self.channel.sendall(b"H")
        except OSError:
            pass
        self._close()

    def abandon(self) -> None:
        """Not handed over: the shim kills the engine's process group (as if the launcher had died)."""
        self._close()

    def _close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        try:
            self.shim.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.shim.kill()
            self.shim.wait(timeout=10)


def start_held(role: str, python: str | Path, argv: list[str], log_file: Path, env: dict[str, str]) -> HeldProcess:
    """Start ``argv`` under a lifeline shim, stdout and stderr appended to ``log_file``.

    Returns once the shim has started the engine and said its pid. The engine runs in its own
    session (process group id = its pid); ``python`` is the interpreter that runs the shim.
    """
    ours, theirs = socket.socketpair()  # both close-on-exec: only the shim gets ``theirs`` (pass_fds)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log_file, "ab") as log:
            shim = subprocess.Popen([str(python), "-I", str(SHIM), str(theirs.fileno()), "--", *argv],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    pass_fds=[theirs.fileno()], close_fds=True)
    except OSError as exc:
        ours.close()
        raise LifelineError(f"{role}: cannot start {python} ({exc.strerror})", path=str(python)) from None
    finally:
        theirs.close()
    line = _first_line(ours, shim, role, log_file)
    word, _, value = line.partition(" ")
    if word != "pid":
        ours.close()
        shim.wait(timeout=30)
        raise LifelineError(f"{role}: could not start {argv[0]}: {value or line}", path=str(argv[0]))
    pid = int(value)
    try:
        create_time = psutil.Process(pid).create_time()  # unreaped by the shim until it kills the group
    except psutil.Error:
        create_time = 0.0
    return HeldProcess(role, shim, ours, pid, create_time, list(argv))


def _first_line(channel: socket.socket, shim: subprocess.Popen, role: str, log_file: Path) -> str:
    deadline = time.monotonic() + REPORT_TIMEOUT_S
    received = b""
    while b"\n" not in received:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            shim.kill()
            shim.wait()
            channel.close()
            raise LifelineError(f"{role}: the lifeline shim did not report within {REPORT_TIMEOUT_S:.0f} s",
                                path=str(log_file))
        ready, _, _ = select.select([channel], [], [], min(remaining, 1.0))
        if ready:
            chunk = channel.recv(256)
            if not chunk:
                shim.wait(timeout=30)
                channel.close()
                tail = _tail(log_file)
                raise LifelineError(f"{role}: the lifeline shim exited with status {shim.returncode} before "
                                    f"starting the engine: {tail}", path=str(log_file))
            received += chunk
    return received.partition(b"\n")[0].decode(errors="replace")


def _tail(log_file: Path, lines: int = 4) -> str:
    try:
        return " | ".join(log_file.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
