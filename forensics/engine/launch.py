"""One real sglang server (prefill or decode), or sglang-router's mini load balancer, from an engine environment.

The measured recipe (``shared/reference/real-sglang-on-cpu.md``): ``python -m
sglang.launch_server`` with ``--device cpu --attention-backend torch_native`` (the x86 default,
``intel_amx``, needs sgl-kernel's CPU ops) ``--disable-cuda-graph --enable-metrics`` and a small
KV pool, in the environment of :func:`forensics.engine.environment.engine_environment_variables`.
Each process runs in its own session (the HTTP server, its scheduler and detokenizer children
share its process group), stdout and stderr together in one log file.

Readiness is ``/health`` answering 200, polled, never slept for; a process that exits first is
reported with its log's last lines. :meth:`EngineProcess.stop` ends the whole tree: SIGTERM to
the group, then SIGKILL after a bounded wait, because a wedged prefill never finishes a SIGTERM
(its tokenizer manager's ``sigterm_watchdog`` waits for the stuck request forever unless
``SGL_FORCE_SHUTDOWN`` is set, which this project never sets).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from forensics.engine.environment import EngineEnvironment, engine_environment_variables
from forensics.exitcodes import EnvironmentProblem, UsageProblem
from forensics.process_start import same_start, start_ticks

HOST = "127.0.0.1"
READY_TIMEOUT_S = 300.0  # ~25 s alone; much more on 2 cores shared with other work
STOP_TIMEOUT_S = 20.0
# --mem-fraction-static: on a CPU sglang measures the machine's available memory before and after
# loading the weights and refuses to start when the drop exceeds 1 - fraction ("Loaded weights leave
# no GPU memory for the KV cache ... Raise --mem-fraction-static above 0.123", seen at 0.1 on a
# machine where other engines were allocating meanwhile). The KV pool stays capped by
# --max-total-tokens, so a larger fraction costs no memory; 0.3 tolerates others' allocations.
SERVER_FLAGS = (
    "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--enable-metrics",
    "--max-total-tokens", "8192", "--mem-fraction-static", "0.3", "--host", HOST,
)


# Flags a release needs on this CPU beyond SERVER_FLAGS, per role; the one place that decides them.
# 0.5.16's prefill: with overlap scheduling on, a prefix-cache hit records a CUDA event
# (disaggregation/prefill.py:1046, `torch.cuda.Event()`), which kills the scheduler on a CPU.
RELEASE_SERVER_FLAGS: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.16": {"prefill": ("--disable-overlap-schedule",)},
}


def release_server_flags(version: str, role: str) -> tuple[str, ...]:
    return RELEASE_SERVER_FLAGS.get(version, {}).get(role, ())


# sglang derives a gRPC port as --port + 10000 and refuses to start when that passes 65535
# (server_args.py, _handle_deprecated_args), even with gRPC off: a server's port is at most this.
MAX_SERVER_PORT = 55535


def free_server_ports(count: int) -> list[int]:
    """``count`` distinct ports free right now on loopback that a real sglang server accepts (racy)."""
    chosen: list[int] = []
    rng = random.SystemRandom()
    for _attempt in range(count * 200):
        port = rng.randrange(20000, MAX_SERVER_PORT + 1)
        if port in chosen:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise EnvironmentProblem(f"found only {len(chosen)} of {count} free ports on {HOST} in 20000-{MAX_SERVER_PORT}")


class EngineStartError(EnvironmentProblem):
    """A real engine process exited or was not ready in time; the message quotes its log's last lines."""


@dataclass
class EngineProcess:
    """One started process tree: its leader, log and the URL it serves."""

    role: str
    popen: subprocess.Popen
    url: str
    log_file: Path
    argv: list[str]
    members: dict[int, dict] = field(default_factory=dict)  # pid -> its start (process_start), for stop()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line for line in text.strip().splitlines()[-lines:])

    def remember_tree(self) -> None:
        """Record the leader's descendants (scheduler, detokenizer) so stop() finds any that left the group."""
        try:
            leader = psutil.Process(self.pid)
            for proc in [leader, *leader.children(recursive=True)]:
                self.members[proc.pid] = {"start_ticks": start_ticks(proc.pid), "create_time": proc.create_time()}
        except psutil.Error:
            pass

    def wait_ready(self, timeout: float = READY_TIMEOUT_S, path: str = "/health") -> float:
        """Seconds until ``GET path`` answered 200; EngineStartError (its log quoted) otherwise."""
        started = time.monotonic()
        deadline = started + timeout
        while True:
            code = self.popen.poll()
            if code is not None:
                raise EngineStartError(f"{self.role} ({' '.join(self.argv[:3])} ...) exited with status {code} "
                                       f"before {path} answered: {self.log_tail()}", path=str(self.log_file))
            try:
                with urllib.request.urlopen(self.url + path, timeout=5) as answer:
                    if answer.status == 200:
                        self.remember_tree()
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise EngineStartError(f"{self.role} at {self.url}: {path} did not answer 200 within {timeout:.0f} s: "
                                       f"{self.log_tail()}", path=str(self.log_file))
            time.sleep(0.5)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> str:
        """End the whole tree; "terminated" if SIGTERM sufficed, "killed" if SIGKILL was needed."""
        self.remember_tree()
        how = "terminated"
        if self.popen.poll() is None or self.alive():
            self._signal_all(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                self.popen.poll()
                time.sleep(0.2)
            if self.alive():
                how = "killed"
                self._signal_all(signal.SIGKILL)
                deadline = time.monotonic() + 10
                while self.alive() and time.monotonic() < deadline:
                    self.popen.poll()
                    time.sleep(0.1)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return how

    def _members_alive(self) -> list[psutil.Process]:
        alive = []
        for pid, started in self.members.items():
            try:
                proc = psutil.Process(pid)
                if same_start(proc, started) and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)  # the same process (pid + start time), not a stranger reusing the pid
            except psutil.Error:
                pass
        return alive

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return any(p.status() != psutil.STATUS_ZOMBIE for p in _group_members(self.pid))

    def alive(self) -> bool:
        """Whether any process of the tree (its group, or a recorded member) still runs."""
        return self._group_alive() or bool(self._members_alive())

    def _signal_all(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in self._members_alive():
            try:
                proc.send_signal(signum)
            except psutil.Error:
                pass


def _group_members(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc)
        except (ProcessLookupError, psutil.Error, OSError):
            pass
    return found


def _start(role: str, argv: list[str], log_file: Path, url: str, env: dict[str, str]) -> EngineProcess:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, start_new_session=True, close_fds=True)
    return EngineProcess(role, popen, url, log_file, argv)


def process_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SGL_FORCE_SHUTDOWN"}
    env.update(engine_environment_variables())
    env.update(extra or {})
    env.pop("SGL_FORCE_SHUTDOWN", None)
    return env


def server_argv(environment: EngineEnvironment, model: Path, role: str, port: int, *,
                bootstrap_port: int | None = None, backend: str = "nixl", extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command line of one PD server (``role`` "prefill" or "decode")."""
    if role not in ("prefill", "decode"):
        raise ValueError(f"role must be prefill or decode, not {role!r}")
    if not 1 <= port <= MAX_SERVER_PORT:
        raise UsageProblem(f"the {role}'s port {port} is above {MAX_SERVER_PORT}: real sglang derives a gRPC port "
                           "as port + 10000 and refuses to start when it passes 65535")
    argv = [str(environment.python), "-m", "sglang.launch_server", "--model-path", str(model), *SERVER_FLAGS,
            "--port", str(port), "--disaggregation-mode", role, "--disaggregation-transfer-backend", backend]
    if role == "prefill":
        if bootstrap_port is None:
            raise ValueError("a prefill needs its bootstrap port")
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    return [*argv, *release_server_flags(environment.version, role), *extra_args]


def start_server(environment: EngineEnvironment, model: Path, role: str, port: int, log_file: Path, *,
                 bootstrap_port: int | None = None, backend: str = "nixl", extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> EngineProcess:
    """Start one real sglang PD server (not waited for: call :meth:`EngineProcess.wait_ready`)."""
    argv = server_argv(environment, model, role, port, bootstrap_port=bootstrap_port, backend=backend,
                       extra_args=extra_args)
    return _start(role, argv, log_file, f"http://{HOST}:{port}", process_environment(env))


def router_argv(environment: EngineEnvironment, prefill_url: str, bootstrap_port: int, decode_url: str,
                port: int) -> list[str]:
    """sglang-router's mini load balancer in front of one prefill and one decode."""
    return [str(environment.python), "-m", "sglang_router.launch_router", "--pd-disaggregation", "--mini-lb",
            "--prefill", prefill_url, str(bootstrap_port), "--decode", decode_url, "--host", HOST, "--port", str(port)]


def start_router(environment: EngineEnvironment, prefill_url: str, bootstrap_port: int, decode_url: str,
                 port: int, log_file: Path, *, env: dict[str, str] | None = None) -> EngineProcess:
    argv = router_argv(environment, prefill_url, bootstrap_port, decode_url, port)
    return _start("router", argv, log_file, f"http://{HOST}:{port}", process_environment(env))
