"""A twin role's processes as sglang runs them: the front, its scheduler and detokenizer children,
and multiprocessing's resource tracker.

sglang's ``launch_server`` process (the *front*) listens on the role's URL (and, on a prefill,
runs the bootstrap server's ``_run_server`` thread), starts the scheduler and the detokenizer,
polls them (its ``subprocess-watchdog`` thread) and takes its whole tree down when one dies
(SIGQUIT). The twin's front does the same with the twin's scheduler. It accepts each HTTP
connection on the role's listening socket and hands the connected socket to the scheduler over
a unix socket (SCM_RIGHTS): the scheduler's aiohttp app serves it with the client's own address
and sees the client leave the moment it does (the disconnect that becomes an abort), while
``ps``, py-spy and the forensics' process lookup see sglang's tree: the listening process with
its children, ``bootstrap_thread`` in the child titled ``sglang::scheduler``.

The children are forked once the release's modules are imported (no second import, so no
second start-up cost) and before any thread of the role starts; each dies with the front
(``PR_SET_PDEATHSIG``, as sglang's ``kill_itself_when_parent_died``). The detokenizer
detokenizes nothing (the twin's scheduler writes its answers): it is there so that the tree,
its watchdog and a child's death are sglang's.

Files beside the role's ``<role>.pid`` (the front's, the launcher writes it):
``<role>.scheduler.pid`` (the inventory's ``pid_file``, py-spy's target) and
``<role>.<component>.cpu``: the CPU seconds the front's and the detokenizer's ``monitor``
threads count, which the scheduler's ``/metrics`` reads as sglang's multiprocess collector
gathers every process's files into the front's page.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from forensics.twin.processes import close_inherited_listeners, scheduler_pid_file

SCHEDULER_TITLE = "sglang::scheduler"
DETOKENIZER_TITLE = "sglang::detokenizer"
CHILD_POLL_S = 1.0  # sglang's SubprocessWatchdog interval
CPU_MONITOR_INTERVAL_S = 5.0  # sglang's start_cpu_monitor_thread interval
SCHEDULER_WATCHDOG_TIMEOUT_S = 300.0  # sglang's --watchdog-timeout default
STOP_GRACE_S = 5.0
READY = b"R"
HANDED = b"c"
_PR_SET_PDEATHSIG = 1

# The front writes what sglang's tokenizer manager and engine write, under their loggers.
_tokenizer_log = logging.getLogger("sglang.srt.managers.tokenizer_manager")
_watchdog_log = logging.getLogger("sglang.srt.utils.watchdog")


def cpu_file(directory: Path, role: str, component: str) -> Path:
    return Path(directory) / f"{role}.{component}.cpu"


def cpu_files(directory: Path, role: str) -> dict[str, Path]:
    """sglang's cpu monitor components of a role's page and the files their monitors write."""
    return {component: cpu_file(directory, role, component) for component in ("tokenizer", "detokenizer")}


def read_cpu_seconds(path: Path) -> float | None:
    try:
        return float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux), and leave now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died between the fork and the prctl
        os._exit(0)


def start_cpu_monitor(path: Path, interval: float = CPU_MONITOR_INTERVAL_S) -> threading.Thread:
    """sglang's cpu monitor thread: this process's CPU seconds (user + system) every ``interval``,
    written to ``path`` for the scheduler's ``/metrics``."""

    def monitor() -> None:  # the target's name is the thread's: "Thread-N (monitor)", as sglang's
        process = psutil.Process()
        first = process.cpu_times()
        while True:  # as sglang's: what the process spent since its monitor started
            times = process.cpu_times()
            spent = (times.user - first.user) + (times.system - first.system)
            try:
                _write_atomically(path, f"{spent:.6f}\n")
            except OSError:  # the directory went (twin down): the process is about to go too
                return
            time.sleep(interval)

    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    return thread


def start_scheduler_watchdog(timeout: float = SCHEDULER_WATCHDOG_TIMEOUT_S) -> Callable[[], None]:
    """sglang's scheduler watchdog (``WatchdogRaw``): if the scheduler stops feeding it for
    ``timeout`` seconds, log it and SIGQUIT the parent (the front takes the tree down).

    Returns ``feed``: the scheduler's event loop calls it as it turns."""
    counter = [0]
    parent = psutil.Process().parent()

    def _watchdog_thread() -> None:  # "Thread-N (_watchdog_thread)", as sglang's
        last_counter, last_time = -1, time.perf_counter()
        while True:
            now = time.perf_counter()
            if counter[0] != last_counter:
                last_counter, last_time = counter[0], now
            elif now > last_time + timeout:
                break
            time.sleep(timeout / 2 if timeout < 2 else 1.0)
        _watchdog_log.error(f"Scheduler watchdog timeout (self.watchdog_timeout={timeout}, self.soft=False)")
        time.sleep(5)  # as sglang: time for the parent to print
        try:
            parent.send_signal(signal.SIGQUIT)
        except psutil.Error:
            pass

    threading.Thread(target=_watchdog_thread, daemon=True).start()

    def feed() -> None:
        counter[0] += 1

    return feed


class RoleFront:
    """The role's front process: forks the scheduler and the detokenizer, then hands connections
    to the scheduler and watches both (see the module docstring)."""

    def __init__(self, role: str, directory: Path) -> None:
        self.role = role
        self.directory = Path(directory)
        self.pid = os.getpid()
        self.children: dict[str, int] = {}  # sglang's watchdog names: scheduler_0, detokenizer
        self.stopping = False
        self._handoff: socket.socket | None = None
        for path in cpu_files(self.directory, role).values():  # an earlier run's: counted from 0 again
            path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ forking

    def fork_scheduler(self) -> socket.socket | None:
        """Fork the scheduler. In the child: its end of the hand-off socket; in the front: None."""
        front_end, scheduler_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            front_end.close()
            self._become_child(SCHEDULER_TITLE)
            return scheduler_end
        scheduler_end.close()
        self._handoff = front_end
        self.children["scheduler_0"] = pid
        _write_atomically(scheduler_pid_file(self.directory, self.role), f"{pid}\n")
        return None

    def fork_detokenizer(self) -> None:
        pid = os.fork()
        if pid == 0:
            if self._handoff is not None:
                self._handoff.close()
            self._become_child(DETOKENIZER_TITLE)
            self._detokenizer()
        self.children["detokenizer"] = pid

    def _become_child(self, title: str) -> None:
        die_with_parent(self.pid)
        close_inherited_listeners()  # the front's to serve; a child holding a copy would keep the port
        try:
            from setproctitle import setproctitle

            setproctitle(title)
        except ImportError:  # pragma: no cover - the twin extra installs it
            pass

    def _detokenizer(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: os._exit(0))
        start_cpu_monitor(cpu_file(self.directory, self.role, "detokenizer"))
        while True:
            signal.pause()

    # ------------------------------------------------------------------ serving

    def serve(self, listener: socket.socket, *, when_ready: Callable[[], None] | None = None) -> None:
        """Wait for the scheduler's ready word, then hand it every connection until the role stops
        (never returns: the process leaves with os._exit)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGQUIT, self._on_sigquit)
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()  # its own process under the front, as in every sglang tree
        start_cpu_monitor(cpu_file(self.directory, self.role, "tokenizer"))
        self._wait_ready()
        if when_ready is not None:
            try:
                when_ready()
            except Exception:
                _tokenizer_log.exception(f"twin {self.role}: the front could not start")
                self._leave(1)
        threading.Thread(target=self._watch_children, daemon=True, name="subprocess-watchdog").start()
        listener.setblocking(True)
        while True:
            conn, _ = listener.accept()
            try:
                socket.send_fds(self._handoff, [HANDED], [conn.fileno()])
            except OSError:
                pass  # the scheduler is gone: the watchdog takes the role down within a second
            finally:
                conn.close()

    def _wait_ready(self) -> None:
        pid = self.children["scheduler_0"]
        while True:
            readable, _, _ = select.select([self._handoff], [], [], 1.0)
            if readable:
                try:
                    word = self._handoff.recv(16)
                except OSError:
                    word = b""
                if word == READY:
                    return
            elif _reaped(pid) is None:
                continue
            deadline = time.monotonic() + STOP_GRACE_S  # its end of the socket closes as it exits
            while _reaped(pid) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            code = _reaped(pid)
            _tokenizer_log.error(f"Rank 0 scheduler is dead. Please check if there are relevant logs. "
                                 f"(pid={pid}, exit code {code})")
            self._leave(1)

    def _watch_children(self) -> None:
        """sglang's SubprocessWatchdog: a child that left with a nonzero exit code triggers SIGQUIT."""
        while not self.stopping:
            time.sleep(CHILD_POLL_S)
            for name, pid in self.children.items():
                code = _reaped(pid)
                if code is None or code == 0 or self.stopping:
                    continue
                _watchdog_log.error(f"Subprocess {name} (pid={pid}) crashed with exit code {code}. "
                                    "Triggering SIGQUIT for cleanup...")
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    def _on_sigquit(self, signum, frame) -> None:
        _tokenizer_log.error(f"SIGQUIT received. {signum=}, {frame=}. It usually means one child failed.")
        self.stopping = True
        self._kill_children(signal.SIGKILL)
        self._leave(1)

    def _on_stop(self, signum, frame) -> None:
        self.stopping = True
        self._kill_children(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and self._live_children():
            time.sleep(0.02)
        self._kill_children(signal.SIGKILL)
        self._leave(0)

    def _live_children(self) -> list[int]:
        return [pid for pid in self.children.values() if _reaped(pid) is None]

    def _kill_children(self, sig: int) -> None:
        for pid in self._live_children():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _leave(self, status: int) -> None:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


# The exit codes of reaped children, by pid (the watchdog and the front's waits share them).
_exit_codes_by_pid: dict[int, int] = {}


def _reaped(pid: int) -> int | None:
    """The child's exit code once it has left (negative: the signal that ended it, as
    multiprocessing's ``exitcode``), None while it runs."""
    if pid in _exit_codes_by_pid:
        return _exit_codes_by_pid[pid]
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        _exit_codes_by_pid[pid] = -1
        return -1
    if done != pid:
        return None
    _exit_codes_by_pid[pid] = os.waitstatus_to_exitcode(status)
    return _exit_codes_by_pid[pid]
