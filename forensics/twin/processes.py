"""Starting, stopping and finding the twin's processes: pid files, log files, readiness.

Each role runs as ``python -m forensics.twin.<role> --inventory FILE`` in its own
session, stdout and stderr appended to ``<role>.log`` (so a thread's traceback lands
among sglang's lines), its pid in ``<role>.pid`` for py-spy and ``twin down``.
Readiness is polled over HTTP, never slept for; a process that exits early is
reported with the tail of its log.

Three rules keep the twin from touching what it does not own or leaving things behind:

* **Identity.** Beside ``<role>.pid`` the launcher writes ``<role>.proc.json``: the pid,
  its start (clock ticks since boot, ``forensics.process_start``), its command line and the title the
  role sets. Nothing is signalled unless a live process matches both the start time and
  the command line (or title); a pid file that names anything else is *stale* and is
  removed without a signal.
* **Lifeline.** Every child inherits the read end of a pipe whose write end only the
  launcher holds (``FORENSICS_TWIN_LIFELINE=<fd>``). A daemon thread in the child reads
  it: end-of-file means the launcher died before the twin was handed over, and the child
  leaves. Once every role is ready, :meth:`Child.handover` writes one byte, the child
  stops watching, and the twin outlives the CLI that started it.
* **Sockets.** The launcher binds the listening sockets and passes them to the children
  (``FORENSICS_TWIN_LISTEN_FDS=port:fd,...``), so two twins started at once cannot race
  for the same port between "it was free" and "the child binds it".

Fault injection (for the kill tests, documented in docs/ARCHITECTURE.md): ``FORENSICS_TWIN_FAULT=
STEP:ACTION`` makes the launcher act at ``STEP`` (``after-prefill-started``,
``after-all-started``, ``after-prefill-ready``, ``before-handover``) with ``ACTION`` one of
``SIGKILL``, ``SIGTERM``, ``SIGINT`` (sent to itself) or ``block`` (print
``twin fault: blocked at STEP`` on stderr and wait for a signal).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from forensics.exitcodes import EnvironmentProblem
from forensics.process_start import same_start, start_ticks
from forensics.sandbox.loopback import UCX_LOOPBACK

ROLE_ORDER = ("prefill", "decode", "router")
READY_TIMEOUT_S = 60.0
# The title each role's front process sets (None: it keeps its command line, ``python -m
# forensics.twin.<role>``; its scheduler child is ``sglang::scheduler``, forensics.twin.role_tree).
ROLE_TITLES = {"prefill": None, "decode": None, "router": "sglang::router"}
LIFELINE_ENV = "FORENSICS_TWIN_LIFELINE"
LISTEN_FDS_ENV = "FORENSICS_TWIN_LISTEN_FDS"
FAULT_ENV = "FORENSICS_TWIN_FAULT"
FAULT_STEPS = ("after-prefill-started", "after-all-started", "after-prefill-ready", "before-handover")
HANDOVER = b"H"
PORT_RELEASE_S = 10.0  # after a stopped role is gone, how long its ports may take to close


class TwinStartError(EnvironmentProblem):
    """A twin process could not start or did not become ready; the message says which and why."""


# ------------------------------------------------------------------------------------ ports


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports the kernel says are free right now (racy: prefer :func:`bind_listeners`)."""
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


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port); OSError if it is taken.

    SO_REUSEADDR (as the servers set it) lets a restarted role take its port back over
    connections left in TIME_WAIT; a port another socket listens on still fails (at bind,
    or at listen if two launchers bound it at the same instant).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def inherited_listener(port: int) -> socket.socket | None:
    """In a twin process: the listening socket the launcher passed for ``port``, if any."""
    for item in filter(None, os.environ.get(LISTEN_FDS_ENV, "").split(",")):
        wanted, _, fd = item.partition(":")
        if wanted == str(port):
            sock = socket.socket(fileno=int(fd))
            sock.setblocking(False)
            return sock
    return None


def close_inherited_listeners() -> None:
    """In a child forked by a twin process: close its copies of the launcher's listening sockets."""
    for item in filter(None, os.environ.pop(LISTEN_FDS_ENV, "").split(",")):
        try:
            os.close(int(item.partition(":")[2]))
        except (OSError, ValueError):
            pass


# ------------------------------------------------------------------------------- pid files


def pid_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.pid"


def scheduler_pid_file(directory: Path, role: str) -> Path:
    """The pid of the role's ``sglang::scheduler`` child (forensics.twin.role_tree writes it)."""
    return directory / f"{role}.scheduler.pid"


def identity_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.proc.json"


def log_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.log"


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def record(directory: Path, role: str, proc: subprocess.Popen, argv: list[str]) -> dict:
    """Write ``<role>.proc.json`` (pid, start time, command line, title) and ``<role>.pid``."""
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        create_time = None
    identity = {"pid": proc.pid, "create_time": create_time, "start_ticks": start_ticks(proc.pid),
                "cmdline": argv, "title": ROLE_TITLES[role],
                "role": role, "launcher_pid": os.getpid()}
    path = identity_file(directory, role)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(identity) + "\n")
    tmp.replace(path)
    pid_file(directory, role).write_text(f"{proc.pid}\n")
    return identity


def read_identity(directory: Path, role: str) -> dict | None:
    try:
        data = json.loads(identity_file(directory, role).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def ours(directory: Path, role: str) -> psutil.Process | None:
    """The live process the pid file names, if and only if it is the one the twin started.

    It must match the recorded start time and the recorded command line or the role's
    process title; a pid that was reused, or a pid file without that record, gives None.
    """
    pid = read_pid(pid_file(directory, role))
    identity = read_identity(directory, role)
    if pid is None or identity is None or identity.get("pid") != pid or identity.get("create_time") is None:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if not same_start(proc, identity):
            return None
        cmdline = proc.cmdline()
    except (psutil.Error, TypeError, ValueError):
        return None
    title = identity.get("title")
    shown = " ".join(part for part in cmdline if part).strip()
    if cmdline == identity.get("cmdline") or (title and shown == title):
        return proc
    return None


def state(directory: Path, role: str) -> str:
    """``running`` (ours, alive), ``stale`` (a pid file naming something else or nothing) or ``absent``."""
    if not pid_file(directory, role).exists():
        return "absent"
    return "running" if ours(directory, role) is not None else "stale"


def running_roles(directory: Path) -> list[str]:
    return [role for role in ROLE_ORDER if ours(directory, role) is not None]


def forget(directory: Path, role: str) -> None:
    pid_file(directory, role).unlink(missing_ok=True)
    identity_file(directory, role).unlink(missing_ok=True)
    scheduler_pid_file(directory, role).unlink(missing_ok=True)


# --------------------------------------------------------------------------- starting


@dataclass
class Child:
    """A started role: its Popen and the write end of its lifeline (None once handed over)."""

    role: str
    proc: subprocess.Popen
    lifeline: int | None = None
    identity: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self):
        return self.proc.poll()

    @property
    def returncode(self):
        return self.proc.returncode

    def handover(self) -> None:
        """Tell the child it is on its own now: it stops watching its launcher."""
        if self.lifeline is None:
            return
        try:
            os.write(self.lifeline, HANDOVER)
        except OSError:
            pass
        self.release_lifeline()

    def release_lifeline(self) -> None:
        if self.lifeline is not None:
            try:
                os.close(self.lifeline)
            except OSError:
                pass
            self.lifeline = None


def start(role: str, inventory_path: Path, directory: Path, python: str | None = None,
          listeners: dict[int, socket.socket] | None = None) -> Child:
    """Start ``role`` with a lifeline (and the listening sockets in ``listeners``, port -> socket)."""
    log_path = log_file(directory, role)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update(UCX_LOOPBACK)  # the twin promises loopback: UCX's listeners too (forensics.sandbox.loopback)
    env.pop(FAULT_ENV, None)
    # The twin's processes import forensics from wherever this process did.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    read_end, write_end = os.pipe()  # both close-on-exec; the child gets read_end through pass_fds
    fds = [read_end]
    env[LIFELINE_ENV] = str(read_end)
    if listeners:
        env[LISTEN_FDS_ENV] = ",".join(f"{port}:{sock.fileno()}" for port, sock in listeners.items())
        fds += [sock.fileno() for sock in listeners.values()]
    else:
        env.pop(LISTEN_FDS_ENV, None)
    argv = [python or sys.executable, "-m", f"forensics.twin.{role}", "--inventory", str(inventory_path)]
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, pass_fds=fds)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    child = Child(role, proc, write_end)
    child.identity = record(directory, role, proc, argv)
    return child


def fault(step: str) -> None:
    """The fault-injection hook (see the module docstring); does nothing unless asked."""
    spec = os.environ.get(FAULT_ENV, "")
    wanted, _, action = spec.partition(":")
    if wanted != step:
        return
    if action == "block":
        print(f"twin fault: blocked at {step} (pid {os.getpid()})", file=sys.stderr, flush=True)
        # Not signal.pause(): a signal that lands after the interpreter's last check and before the
        # pause() call is handled at C level, and pause() then waits for another one. A short sleep
        # in a loop sees a pending handler one tick later at the latest.
        while True:
            time.sleep(0.2)
    sig = getattr(signal, action or "SIGKILL", None)
    if not isinstance(sig, signal.Signals):
        raise ValueError(f"{FAULT_ENV}={spec!r}: action must be SIGKILL, SIGTERM, SIGINT or block")
    os.kill(os.getpid(), sig)
    time.sleep(1)  # SIGINT arrives as KeyboardInterrupt at the next bytecode


# ------------------------------------------------------------------------ in the child


def watch_lifeline() -> None:
    """In a twin process: leave if the launcher dies before handing the twin over."""
    fd_text = os.environ.pop(LIFELINE_ENV, None)
    if not fd_text:
        return
    fd = int(fd_text)
    from forensics.twin.logformat import line as log_line  # imported now, not by a thread at the end

    def watch() -> None:
        try:
            data = os.read(fd, 1)
        except OSError:
            data = b""
        try:
            os.close(fd)
        except OSError:
            pass
        if data == HANDOVER:
            return
        print(log_line(f"twin: the process that started me died before handing the twin over; pid {os.getpid()} leaves"),
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # the server's own clean stop, if it is serving
        time.sleep(5)
        os._exit(1)

    threading.Thread(target=watch, name="twin-lifeline", daemon=True).start()


# -------------------------------------------------------------------------- readiness


def wait_ready(role: str, url: str, proc, directory: Path, timeout: float = READY_TIMEOUT_S) -> float:
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


# --------------------------------------------------------------------------- stopping


def stop(directory: Path, role: str, timeout: float = 10.0, ports: tuple[int, ...] = ()) -> str:
    """Stop the role's process if it is the one the twin started.

    Returns an outcome as :func:`stop_all` names it (``running``, ``recovered``, ``stale``,
    ``listening`` or ``absent``).
    """
    return stop_all(directory, (role,), timeout, {role: ports} if ports else None)[role]


def stop_all(directory: Path, roles, timeout: float = 10.0,
             ports: dict[str, tuple[int, ...]] | None = None) -> dict[str, str]:
    """Stop several roles at once: SIGTERM to each, one shared wait, SIGKILL to whoever is left.

    Each role's outcome:

    * ``running``: its record named it; it is stopped now.
    * ``recovered``: its record was stale (a start time or command line that no longer
      matches), but the role's real process was found by what proves it ours
      (:func:`deployment_process`: its output goes to this directory's ``<role>.log``, it bears
      the role's title or command line, it listens on the role's port) and is stopped now.
    * ``stale``: the record named something else or nothing, and nothing listens on the role's
      ports: the record is removed, nothing signalled.
    * ``listening``: the record is stale and something that cannot be proved ours still listens
      on a port of the role: nothing signalled, the record kept (the twin is not down).
    * ``absent``: no pid file.

    A role that was stopped but whose port still listens ``PORT_RELEASE_S`` after the wait is
    ``listening`` too: what holds the port then is not the process that was stopped.

    ``ports`` (role -> its listening ports) enables the search and the check; without them a
    stale record is removed as before. One at a time, three processes still starting (SIGTERM
    deferred until their interpreter leaves a long C call) could take three times as long to go
    as the slowest one does.
    """
    ports = ports or {}
    outcomes: dict[str, str] = {}
    procs: dict[str, psutil.Process] = {}
    for role in roles:
        proc = ours(directory, role)
        if proc is None and ports.get(role):
            proc = deployment_process(directory, role, ports[role])
            if proc is not None:
                outcomes[role] = "recovered"
        if proc is None:
            if not pid_file(directory, role).exists():
                identity_file(directory, role).unlink(missing_ok=True)
                outcomes[role] = "absent"
            elif listened(ports.get(role, ())):
                outcomes[role] = "listening"
            else:
                forget(directory, role)
                outcomes[role] = "stale"
            continue
        procs[role] = proc
        _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    gone = {role: _wait_gone(proc, max(deadline - time.monotonic(), 0.05)) for role, proc in procs.items()}
    for role, proc in procs.items():
        if not gone[role]:
            _signal(proc, signal.SIGKILL)
            _wait_gone(proc, 5)
        _reap(proc.pid)
        forget(directory, role)
        outcomes.setdefault(role, "running")
    # Gone is not yet free: the kernel closes a dead process's sockets only as its last thread
    # leaves, and a restart (or the next twin) binding these ports must not race that.
    freed = [port for role in procs for port in ports.get(role, ())]
    release_deadline = max(deadline, time.monotonic()) + PORT_RELEASE_S
    while listened(freed) and time.monotonic() < release_deadline:
        time.sleep(0.02)
    for role in procs:
        if listened(ports.get(role, ())):
            outcomes[role] = "listening"
    return outcomes


def listened(ports) -> list[int]:
    """Those of ``ports`` some socket on this machine listens on (any local address)."""
    wanted = set(ports)
    if not wanted:
        return []
    found = {conn.laddr.port for conn in psutil.net_connections(kind="tcp")
             if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in wanted}
    return sorted(found)


def deployment_process(directory: Path, role: str, ports) -> psutil.Process | None:
    """The live process of this deployment's ``role`` when its record cannot name it, or None.

    Only a process that proves itself the role of *this* twin: its stdout or stderr is this
    directory's ``<role>.log`` (the launcher opens it for the role and for no one else), its
    command line is the role's (``-m forensics.twin.<role>``) or bears the role's title, and it
    listens on one of ``ports`` (the launcher hands each role its sockets at birth).
    """
    log = str(log_file(directory, role).resolve())
    wanted = set(ports)
    listeners = {conn.pid for conn in psutil.net_connections(kind="tcp")
                 if conn.status == psutil.CONN_LISTEN and conn.pid and conn.laddr and conn.laddr.port in wanted}
    for pid in sorted(listeners):
        try:
            proc = psutil.Process(pid)
            outputs = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (1, 2)}
            cmdline = proc.cmdline()
        except (OSError, psutil.Error):
            continue
        shown = " ".join(part for part in cmdline if part).strip()
        named = cmdline[1:3] == ["-m", f"forensics.twin.{role}"] or (ROLE_TITLES[role] and shown == ROLE_TITLES[role])
        if log in outputs and named:
            return proc
    return None


def _signal(proc: psutil.Process, sig: int) -> None:
    """Signal the process (and its session's group, which it leads: start_new_session) if still it."""
    try:
        if not proc.is_running():  # psutil compares the start time: a reused pid is not "running"
            return
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError, psutil.Error):
        pass


def _wait_gone(proc: psutil.Process, timeout: float) -> bool:
    """Wait until ``proc`` has exited. Our own child counts only once reaped: a zombie leader
    whose other threads are still exiting holds its sockets (a restart would find its port taken)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reaped = _reap(proc.pid)
        if reaped is True:
            return True
        try:
            if not proc.is_running():
                return True
            if reaped is None and proc.status() == psutil.STATUS_ZOMBIE and _threads_left(proc.pid) <= 1:
                return True  # not our child: its parent reaps it (and its other threads have exited)
        except psutil.Error:
            return True
        time.sleep(0.02)
    return False


def _threads_left(pid: int) -> int:
    """How many threads of ``pid`` the kernel still lists: a zombie leader whose other threads are
    still exiting shows more than one, and holds its sockets until the last one has gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def _reap(pid: int) -> bool | None:
    """True if reaped now, False if our child is still there, None if not our child."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return done == pid
