"""The lifeline shim: holds a real engine process to its launcher until the launcher hands it over.

Run by the engine environment's own interpreter in isolated mode (``python -I``), so it is
stdlib-only and imports nothing of this project or of sglang::

    python -I lifeline_shim.py FD -- ARGV...

``FD`` is this process's end of a socket pair whose other end only the launcher holds. The shim
starts ``ARGV`` (the unchanged sglang command line) as its child in a new session, so the engine's
HTTP server, scheduler and detokenizer share one process group whose id is the child's pid, and
reports ``pid <child pid>`` on the socket. Then it waits for one of three things:

* ``H`` from the launcher: the deployment is handed over; the shim leaves and the engine, reparented,
  outlives the launcher;
* end-of-file: the launcher died before the handover (any death, SIGKILL included: the kernel
  closes its end); the shim SIGKILLs the child's whole process group and leaves. sglang's own
  children set ``PR_SET_PDEATHSIG`` (``kill_itself_when_parent_died``) as well, but only once they
  run; the group kill also covers a child still starting;
* the child's exit (a crash at start-up): the shim kills what is left of its group, reports
  ``exit <status>`` on the socket and waits for the launcher's word or end-of-file.

The shim is the child's parent and reaps it only after killing its group, so the child's pid (and
with it the group id) cannot be reused by another process while the shim may still signal it.
SIGINT and SIGHUP are ignored: a Ctrl-C or a closed terminal reaches the launcher, whose death
(or clean-up) is what the shim answers to. SIGTERM kills the group, as end-of-file does.
"""

import os
import select
import signal
import subprocess
import sys


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _has_exited(pid):
    """Whether the child has exited, without reaping it (WNOWAIT)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None and info.si_pid == pid


def _send(sock_fd, text):
    try:
        os.write(sock_fd, text.encode() + b"\n")
    except OSError:
        pass


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        print("usage: lifeline_shim.py FD -- ARGV...", file=sys.stderr)
        return 2
    fd = int(argv[0])
    command = argv[2:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    terminated = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))
    os.set_inheritable(fd, False)  # the engine never holds the lifeline
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError as exc:
        _send(fd, f"error {exc}")
        return 1
    _send(fd, f"pid {child.pid}")
    try:
        watch = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        watch = None  # polled below instead
    exited = None
    while True:
        if terminated:
            _kill_group(child.pid)
            child.wait()
            return 1
        watched = [fd] + ([watch] if watch is not None and exited is None else [])
        try:
            ready, _, _ = select.select(watched, [], [], 0.5)
        except InterruptedError:
            continue
        if fd in ready:
            try:
                word = os.read(fd, 64)
            except OSError:
                word = b""
            if word.startswith(b"H"):
                return 0  # handed over: the engine is on its own now
            if not word:  # the launcher is gone before the handover: so is the engine
                _kill_group(child.pid)
                child.wait()
                return 1
        if exited is None and _has_exited(child.pid):
            # Killed before it is reaped: until then its pid, and so its group id, is nobody else's.
            _kill_group(child.pid)
            exited = child.wait()
            _send(fd, f"exit {exited}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
