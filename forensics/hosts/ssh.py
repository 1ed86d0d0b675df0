"""``SSHHost``: the Host interface over SSH (paramiko), strict about whom it talks to.

- Host keys: known_hosts only (default ``~/.ssh/known_hosts``), unknown and changed keys
  refused with their fingerprint (``HostKeyRefused``, an ``EnvironmentProblem``: exit 4).
- Authentication: private key files (argument or IdentityFile) and ssh-agent; no password
  is accepted, asked for or stored anywhere.
- ``~/.ssh/config`` (or a given file): HostName, User, Port, IdentityFile, ProxyJump.
- A jump host is another ``SSHHost``; the target is reached through a ``direct-tcpip``
  channel on the jump's transport (its host key is checked like any other).
- Every command is ``timeout --kill-after=2 T [sudo -n --] ARGV`` quoted with
  ``shlex.join``: it dies on the remote side at its deadline even if we are gone.
- A host that cannot be reached, or a connection that drops, is a ``disconnected``
  result, not an exception: fan-out over many hosts keeps going.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import paramiko

from ..exitcodes import EnvironmentProblem
from .base import DEFAULT_CHUNK, CappedBuffer, Chunks, Host
from .hostkeys import RefuseUnknownPolicy, changed_key_error
from .quoting import KILL_AFTER_S, check_argv, remote_command_line
from .result import CommandResult, State, timed_out_exit
from .sshconfig import Target, load_config, resolve

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
GRACE_S = 5.0  # beyond the remote deadline + kill-after, before we give up on the channel locally

UNREACHABLE_RETRY_S = 30.0  # a host that could not be reached is not tried again for this long
_NETWORK_ERRORS = (OSError, EOFError, paramiko.SSHException)

# paramiko's transport thread logs every failed handshake at ERROR with its traceback; with no
# handler configured anywhere, Python's last-resort handler prints those on stderr (a dozen
# tracebacks for one silent host). The failure reaches the caller as a ``disconnected`` result
# naming the host; a program that configures logging still gets paramiko's records.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class Unreachable(Exception):
    """Internal: connecting failed for a network reason (becomes a ``disconnected`` result)."""


class SSHHost(Host):
    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        key_filename: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        jump: SSHHost | str | bool | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        allow_agent: bool = True,
        connect_timeout: float = 15.0,
        name: str | None = None,
    ) -> None:
        self._config_path = ssh_config
        config = load_config(ssh_config)
        keys = None
        if key_filename is not None:
            keys = (os.fspath(key_filename),) if isinstance(key_filename, str | os.PathLike) else tuple(
                os.fspath(k) for k in key_filename
            )
        self.target: Target = resolve(host, config, user=user, port=port, identity_files=keys)
        self.known_hosts = os.path.expanduser(os.fspath(known_hosts if known_hosts is not None else DEFAULT_KNOWN_HOSTS))
        self.allow_agent = allow_agent
        self.connect_timeout = connect_timeout
        self.name = name or self.target.label
        self.jump = self._make_jump(jump, config)
        self._lock = threading.Lock()
        self._client: paramiko.SSHClient | None = None
        self._unreachable: tuple[float, str] | None = None  # (when, why) of the last failed connect

    def _make_jump(self, jump: SSHHost | str | bool | None, config) -> SSHHost | None:
        if isinstance(jump, SSHHost):
            return jump
        if jump is False:  # a hop of a ProxyJump chain: its own config ProxyJump is not followed
            return None
        hops = (jump,) if isinstance(jump, str) else self.target.proxy_jump
        # ProxyJump a,b: reach a directly, b through a, the target through b.
        previous: SSHHost | None = None
        for hop in hops:
            previous = SSHHost(
                hop, known_hosts=self.known_hosts, jump=previous if previous is not None else False,
                ssh_config=self._config_path, allow_agent=self.allow_agent, connect_timeout=self.connect_timeout,
            )
        return previous

    # -- connection ---------------------------------------------------------------------------------

    def connect(self) -> paramiko.Transport:
        """The live transport, connecting (and checking the host key) on first use or after a drop.

        Raises ``HostKeyRefused`` or ``EnvironmentProblem`` (authentication) — problems a retry
        will not fix — and ``Unreachable`` for network failures.
        """
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._client.close()
                self._client = None
            if self._unreachable is not None:
                # Every piece of a collection asks the same host: one wait for a silent host, not one each.
                when, why = self._unreachable
                ago = time.monotonic() - when
                if ago < UNREACHABLE_RETRY_S:
                    raise Unreachable(f"{why} (found {ago:.0f} s ago; not tried again for {UNREACHABLE_RETRY_S:g} s)")
            try:
                self._client = self._open_client()
            except Unreachable as exc:
                self._unreachable = (time.monotonic(), str(exc))
                raise
            self._unreachable = None
            return self._client.get_transport()

    def _open_client(self) -> paramiko.SSHClient:
        t = self.target
        sock = None
        if self.jump is not None:
            try:
                sock = self.jump.connect().open_channel(
                    "direct-tcpip", (t.hostname, t.port), ("127.0.0.1", 0), timeout=self.connect_timeout
                )
            except (Unreachable, *_NETWORK_ERRORS) as exc:
                raise Unreachable(f"through jump host {self.jump.name}: {_one_line(exc)}") from exc
        client = paramiko.SSHClient()
        if os.path.isfile(self.known_hosts):
            client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(RefuseUnknownPolicy(self.known_hosts))
        host_label = t.hostname if t.port == 22 else f"[{t.hostname}]:{t.port}"
        try:
            client.connect(
                t.hostname, port=t.port, username=t.user, password=None,
                key_filename=list(t.identity_files) or None, allow_agent=self.allow_agent,
                look_for_keys=not t.identity_files, timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout, sock=sock,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise changed_key_error(exc, host_label, self.known_hosts) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise EnvironmentProblem(
                f"SSH authentication as {t.user} to {host_label} failed ({_one_line(exc)}); "
                f"keys tried: {', '.join(t.identity_files) or 'default keys'}"
                f"{' and ssh-agent' if self.allow_agent else ''}"
            ) from None
        except EnvironmentProblem:
            client.close()
            raise
        except _NETWORK_ERRORS as exc:
            transport = client.get_transport()
            silent = "SSH protocol banner" in str(exc) or (transport is not None and not transport.remote_version)
            client.close()
            if silent:  # paramiko's own words vary with which of its waits gave up first
                raise Unreachable(f"{self.name} ({host_label}) accepted the connection but sent no SSH banner within "
                                  f"{self.connect_timeout:g} s (not an SSH server, or its sshd is stuck)") from None
            raise Unreachable(f"cannot reach {host_label}: {_one_line(exc)}") from exc
        return client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
        if self.jump is not None:
            self.jump.close()

    # -- commands -----------------------------------------------------------------------------------

    def _chunks(
        self, argv: Sequence[str], *, timeout: float, sudo: bool, chunk_size: int, max_stderr: int | None
    ) -> Chunks:
        shown = tuple(check_argv(argv))
        line = remote_command_line(shown, timeout=timeout, sudo=sudo)
        start = time.monotonic()

        def disconnected(why: str, err: CappedBuffer | None = None) -> CommandResult:
            return CommandResult(
                self.name, shown, State.DISCONNECTED, duration_s=time.monotonic() - start, error=why,
                stderr=err.value() if err else b"", truncated=bool(err and err.truncated), command_line=line,
            )

        unanswered = threading.Event()
        try:
            transport = self.connect()
            chan = transport.open_session(timeout=self.connect_timeout)
            # paramiko waits for the answer to the exec request with no timeout: a server that
            # opened the session and never answers would hold this command (and its caller) for ever.
            def give_up() -> None:
                unanswered.set()
                with contextlib.suppress(EOFError, OSError):  # the transport may be gone already
                    chan.close()

            watchdog = threading.Timer(self.connect_timeout, give_up)
            watchdog.daemon = True
            watchdog.start()
            try:
                chan.exec_command(line)
            finally:
                watchdog.cancel()
        except Unreachable as exc:
            return disconnected(str(exc))
        except _NETWORK_ERRORS as exc:
            if unanswered.is_set():
                return disconnected(f"{self.name} opened the session but did not start the command within "
                                    f"{self.connect_timeout:g} s (its sshd is stuck)")
            return disconnected(f"{type(exc).__name__}: {_one_line(exc)}")
        local_deadline = start + timeout + KILL_AFTER_S + GRACE_S
        err = CappedBuffer(max_stderr)
        timed_out_locally = False
        try:
            while True:
                while chan.recv_ready() and time.monotonic() < local_deadline:
                    data = chan.recv(chunk_size)
                    if data:
                        yield data
                while chan.recv_stderr_ready() and time.monotonic() < local_deadline:
                    err.add(chan.recv_stderr(chunk_size))
                remaining = local_deadline - time.monotonic()
                if (chan.recv_ready() or chan.recv_stderr_ready()) and remaining > 0:
                    continue  # output that never pauses still ends at the deadline
                if chan.eof_received or chan.closed:
                    # Output is over; the exit status follows (or the channel closes without one).
                    if chan.status_event.wait(max(remaining, 0)) or chan.closed:
                        break
                    timed_out_locally = True
                    break
                if remaining <= 0:
                    timed_out_locally = True
                    break
                select.select([chan], [], [], remaining)
        finally:
            chan.close()
        duration = time.monotonic() - start
        if timed_out_locally:
            return CommandResult(
                self.name, shown, State.TIMED_OUT, stderr=err.value(), duration_s=duration, truncated=err.truncated,
                error=f"no end {timeout:g}s + {KILL_AFTER_S + GRACE_S:g}s after start; channel closed",
                command_line=line,
            )
        code = chan.exit_status if chan.exit_status_ready() else -1
        if code == -1 and not transport.is_active():
            return disconnected("the connection closed before the command's exit status arrived", err)
        if code == -1:
            # The session ended without an exit status: the process died of a signal (sshd sends
            # "exit-signal", which paramiko does not record). At the deadline that is timeout(1)'s KILL.
            if duration >= timeout * 0.9:
                return CommandResult(
                    self.name, shown, State.TIMED_OUT, stderr=err.value(), duration_s=duration,
                    truncated=err.truncated, error=f"killed on the remote side at its {timeout:g}s deadline (SIGKILL)",
                    command_line=line,
                )
            return CommandResult(
                self.name, shown, State.FAILED, stderr=err.value(), duration_s=duration, truncated=err.truncated,
                error="ended by a signal (no exit status)", command_line=line,
            )
        if timed_out_exit(code, duration, timeout):
            return CommandResult(
                self.name, shown, State.TIMED_OUT, exit_code=None, stderr=err.value(), duration_s=duration,
                truncated=err.truncated, error=f"killed on the remote side at its {timeout:g}s deadline",
                command_line=line,
            )
        return CommandResult(
            self.name, shown, State.OK if code == 0 else State.FAILED, exit_code=code, stderr=err.value(),
            duration_s=duration, truncated=err.truncated, command_line=line,
        )

    # -- files (SFTP) -------------------------------------------------------------------------------

    def _sftp(self) -> paramiko.SFTPClient:
        try:
            return paramiko.SFTPClient.from_transport(self.connect())
        except Unreachable as exc:
            raise EnvironmentProblem(str(exc)) from None

    def read_file(self, path: str) -> bytes:
        return b"".join(self.iter_file(path))

    def iter_file(self, path: str, chunk_size: int = DEFAULT_CHUNK) -> Iterator[bytes]:
        sftp = self._sftp()
        try:
            with sftp.open(path, "rb") as f:
                while chunk := f.read(chunk_size):
                    yield chunk
        finally:
            sftp.close()

    def put_file(self, local: str | os.PathLike[str], remote: str) -> None:
        """Upload to a temporary name beside ``remote``, then rename over it (never half a file)."""
        sftp = self._sftp()
        tmp = f"{remote}.part-{os.getpid()}-{threading.get_ident()}"
        try:
            mode = stat.S_IMODE(os.stat(local).st_mode)
            sftp.put(os.fspath(local), tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, remote)
        except BaseException:
            try:
                sftp.remove(tmp)
            except OSError:
                pass
            raise
        finally:
            sftp.close()



def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())
