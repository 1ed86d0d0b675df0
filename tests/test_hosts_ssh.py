"""SSHHost against a real OpenSSH server on 127.0.0.1 (the session ``sshd`` fixture)."""

from __future__ import annotations

import inspect
import os
import shutil
import signal
import subprocess
import time
import tracemalloc
import uuid

import psutil
import pytest
from sshd_helpers import keygen

from forensics.exitcodes import EnvironmentProblem, ExitStatus
from forensics.hosts import ChangedHostKey, SSHHost, State, UnknownHostKey, fingerprint
from tests.process_helpers import gone, procs_with, sleep_marker

pytestmark = [pytest.mark.server, pytest.mark.timeout(180)]


def _host(sshd, **kw) -> SSHHost:
    return SSHHost("127.0.0.1", **{**sshd.host_args(), **kw})


def _openssh_fingerprint(pub_file) -> str:
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub_file)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return out.split()[1]








def test_run_states_exit_codes_and_output(sshd):
    with _host(sshd) as h:
        ok = h.run(["sh", "-c", "printf out; printf err >&2"], timeout=60)
        assert (ok.state, ok.exit_code, ok.stdout, ok.stderr) == (State.OK, 0, b"out", b"err")
        assert ok.host == f"{sshd.user}@127.0.0.1:{sshd.port}" and ok.argv == ("sh", "-c", "printf out; printf err >&2")
        failed = h.run(["sh", "-c", "exit 3"], timeout=60)
        assert failed.state is State.FAILED and failed.exit_code == 3
        missing = h.run([f"no-such-program-{uuid.uuid4().hex}"], timeout=60)
        assert missing.state is State.FAILED and missing.exit_code == 127


def test_timed_out_command_does_not_outlive_its_deadline_remotely(sshd):
    marker = sleep_marker()  # "sleep 600.xyz": a process we can find on the sshd side
    with _host(sshd) as h:
        start = time.monotonic()
        r = h.run(["sleep", marker], timeout=2)
        assert r.state is State.TIMED_OUT and r.exit_code is None, r
        assert time.monotonic() - start < 2 + 2 + 30
        assert gone(marker), [p.cmdline() for p in procs_with(marker)]
        # A command that ignores SIGTERM, with a child, is killed all the same (KILL after 2 s).
        r = h.run(["sh", "-c", f"trap '' TERM; sleep {marker} & sleep {marker}; wait"], timeout=2)
        assert r.state is State.TIMED_OUT
        assert gone(marker), [p.cmdline() for p in procs_with(marker)]


def test_remote_command_dies_at_deadline_even_when_we_vanish(sshd):
    marker = sleep_marker()
    h = _host(sshd)
    with h.stream(["sh", "-c", f"echo go; exec sleep {marker}"], timeout=8) as s:
        it = iter(s)
        assert next(it) == b"go\n"
        h.close()  # the connection is gone; nobody closes the channel politely
        # Dropping the connection alone does not end it (no pty, no SIGHUP) ...
        assert procs_with(marker)
    # ... its own timeout(1) wrapper does, on the remote side.
    assert gone(marker, within=8 + 2 + 30)


def test_byte_cap_truncates(sshd):
    with _host(sshd) as h:
        r = h.run(["sh", "-c", "head -c 500000 /dev/zero; head -c 500000 /dev/zero >&2"], timeout=60, max_bytes=4096)
        assert r.state is State.OK and r.truncated and len(r.stdout) == 4096 and len(r.stderr) == 4096


def test_stream_long_output_in_bounded_memory(sshd):
    total = 24 * 1024 * 1024
    with _host(sshd) as h:
        h.connect()
        tracemalloc.start()
        seen = 0
        try:
            with h.stream(["head", "-c", str(total), "/dev/zero"], timeout=120, chunk_size=32768) as s:
                for chunk in s:
                    assert 0 < len(chunk) <= 32768
                    seen += len(chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert seen == total and s.result.state is State.OK
    assert peak < 8 * 1024 * 1024, peak  # paramiko's window (2 MiB) plus chunks, never the whole output


def test_sftp_read_iter_put(sshd, tmp_path):
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(300_000))
    src.chmod(0o640)
    remote = str(tmp_path / "remote dir; $(x)" / "copy.bin")
    os.mkdir(os.path.dirname(remote))
    with _host(sshd) as h:
        h.put_file(src, remote)
        assert h.read_file(remote) == src.read_bytes()
        assert b"".join(h.iter_file(remote, 10_000)) == src.read_bytes()
        assert os.listdir(os.path.dirname(remote)) == ["copy.bin"]
        assert os.stat(remote).st_mode & 0o777 == 0o640
        with pytest.raises(FileNotFoundError):
            h.read_file(str(tmp_path / "missing"))


def test_unknown_host_key_refused_with_fingerprint(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    expected = _openssh_fingerprint(f"{sshd.host_key}.pub")
    assert expected.startswith("SHA256:")
    with _host(sshd, known_hosts=str(empty)) as h:
        with pytest.raises(UnknownHostKey) as info:
            h.run(["true"], timeout=30)
    err = info.value
    assert isinstance(err, EnvironmentProblem) and err.exit_status == ExitStatus.ENVIRONMENT == 4
    assert err.fingerprint == expected and expected in str(err) and f"[127.0.0.1]:{sshd.port}" in str(err)


def test_changed_host_key_refused_with_both_fingerprints(sshd, tmp_path):
    other = tmp_path / "other_host_key"
    other_pub = keygen(other, "impostor")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {other_pub}\n")
    with _host(sshd, known_hosts=str(known)) as h:
        with pytest.raises(ChangedHostKey) as info:
            h.run(["true"], timeout=30)
    err = info.value
    assert err.exit_status == 4
    assert err.fingerprint == _openssh_fingerprint(f"{sshd.host_key}.pub")
    assert err.expected_fingerprint == _openssh_fingerprint(f"{other}.pub")
    assert err.fingerprint in str(err) and err.expected_fingerprint in str(err) and "CHANGED" in str(err)


def test_fingerprint_matches_openssh(sshd):
    import paramiko

    key = paramiko.Ed25519Key.from_private_key_file(str(sshd.client_key))
    assert fingerprint(key) == _openssh_fingerprint(f"{sshd.client_key}.pub")


def test_wrong_key_is_an_environment_problem_and_no_password_exists(sshd, tmp_path):
    stranger = tmp_path / "stranger"
    keygen(stranger, "stranger")
    with _host(sshd, key_filename=str(stranger)) as h:
        with pytest.raises(EnvironmentProblem, match="authentication"):
            h.run(["true"], timeout=30)
    assert not any("pass" in p for p in inspect.signature(SSHHost).parameters)


def test_dead_port_is_disconnected_not_an_exception(sshd):
    from sshd_helpers import free_port

    with _host(sshd, port=free_port(), connect_timeout=10) as h:
        r = h.run(["true"], timeout=10)
    assert r.state is State.DISCONNECTED and r.exit_code is None and "cannot reach" in r.error


def test_jump_host_through_direct_tcpip(sshd):
    jump = _host(sshd, name="jump")
    with _host(sshd, jump=jump) as h:
        r = h.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=60)
        assert r.ok, r
        assert h.read_file("/etc/hostname") == open("/etc/hostname", "rb").read()
        # The target's transport runs over a direct-tcpip channel of the jump's connection.
        import paramiko

        assert isinstance(h._client.get_transport().sock, paramiko.Channel)
        assert jump._client is not None and jump.connect().is_active()
    assert jump._client is None  # closing the target closes its jump too


def test_ssh_config_file_hostname_user_port_identity_proxyjump(sshd, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(
        f"""
Host pd-jump
    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}

Host pd-prefill-*
    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    ProxyJump pd-jump
"""
    )
    with SSHHost("pd-prefill-0", ssh_config=str(config), known_hosts=str(sshd.known_hosts), allow_agent=False) as h:
        assert (h.target.hostname, h.target.port, h.target.user) == ("127.0.0.1", sshd.port, sshd.user)
        assert h.target.identity_files == (str(sshd.client_key),)
        assert h.jump is not None and h.jump.target.alias == "pd-jump" and h.jump.jump is None
        r = h.run(["echo", "via config"], timeout=60)
        assert r.ok and r.stdout == b"via config\n"


def test_ssh_agent_authenticates_without_a_key_file(sshd, tmp_path, monkeypatch):
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        pytest.skip("ssh-agent/ssh-add missing (openssh-client)")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert agent.poll() is None and time.monotonic() < deadline, "ssh-agent did not start"
            try:
                agent.wait(0.05)
            except subprocess.TimeoutExpired:
                pass
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", str(sshd.client_key)], env=env, check=True, capture_output=True, timeout=60)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        args = {**sshd.host_args(), "key_filename": None, "allow_agent": True}
        with SSHHost("127.0.0.1", **args) as h:
            assert h.target.identity_files == ()
            # No key file: paramiko would also look in ~/.ssh; an empty HOME leaves only the agent.
            monkeypatch.setenv("HOME", str(tmp_path))
            r = h.run(["true"], timeout=60)
            assert r.ok, r
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)


def test_connection_dropped_mid_command_is_disconnected(sshd):
    marker = sleep_marker()
    with _host(sshd) as h:
        s = h.stream(["sh", "-c", f"echo go; exec sleep {marker}"], timeout=8)
        it = iter(s)
        assert next(it) == b"go\n"
        client_port = h._client.get_transport().sock.getsockname()[1]
        # The sshd process serving this connection (a child of our test sshd): kill it.
        serving = [
            p for p in psutil.Process(sshd.proc.pid).children(recursive=True)
            if any(c.raddr and c.raddr.port == client_port for c in p.net_connections(kind="tcp"))
        ]
        assert serving, "no sshd process serves our connection"
        for p in serving:
            p.kill()
        start = time.monotonic()
        assert list(it) == []
        r = s.result
        assert time.monotonic() - start < 30
    assert r.state is State.DISCONNECTED and r.exit_code is None and "closed" in r.error, r
    assert gone(marker, within=8 + 2 + 30)  # the orphaned command still ends at its deadline
