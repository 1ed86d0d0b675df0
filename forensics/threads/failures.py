"""Why a ``py-spy dump`` gave no threads, in words, with what to do about it.

Every way a dump can fail becomes a :class:`~forensics.evidence.Gap` for the ``threads``
piece: py-spy missing, ptrace refused, the process gone or not Python, sudo refusing, a
timeout, output cut at the byte cap, the host unreachable. Nothing is turned into "no
threads". The wording of py-spy's own errors (0.3 to 0.4) is matched case-insensitively.
"""

from __future__ import annotations

import re

from forensics.evidence import Gap
from forensics.hosts.result import CommandResult, State

PIECE = "threads"

# Causes, for tests and callers that branch on them (Gap.reason starts with a sentence, these are keys).
NOT_INSTALLED = "py-spy not found"
NOT_EXECUTABLE = "py-spy not executable"
PTRACE_DENIED = "ptrace denied"
NO_PROCESS = "no such process"
NOT_PYTHON = "not a Python process"
SUDO_REFUSED = "sudo refused"
TIMED_OUT = "timed out"
TRUNCATED = "output truncated"
DISCONNECTED = "disconnected"
BAD_OUTPUT = "unreadable output"
NO_THREADS = "no threads"
FAILED = "py-spy failed"

_PTRACE = re.compile(r"permission denied|operation not permitted|os error 1\b|EPERM|ptrace", re.I)
_GONE = re.compile(
    r"no such process|os error 3\b|check that the process is running|failed to open process|process .* not found",
    re.I,
)
_NOT_PYTHON = re.compile(r"failed to find python version|failed to find a python interpreter|"
                         r"failed to get python version|not a python", re.I)
_NOT_FOUND = re.compile(r"command not found|no such file or directory|not found", re.I)
_SUDO = re.compile(r"^sudo: ", re.M)


def cause_of(gap: Gap) -> str:
    """The cause key a Gap from this module was made for (the text before the first ':')."""
    return gap.reason.split(":", 1)[0]


def _first_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith("error:") or line.lower().startswith("permission denied"):
            return line
    return lines[0] if lines else ""


def not_installed_fix(host: str) -> str:
    return (f"install py-spy on {host} (pip install py-spy) or set py_spy = '/path/to/py-spy' for this host "
            "in the inventory")


def ptrace_fix(host: str) -> str:
    return (f"py-spy needs ptrace on {host}: set sudo = true for this host in the inventory (with a NOPASSWD "
            "sudoers rule for py-spy), or allow ptrace (sysctl kernel.yama.ptrace_scope=0), or, in a container, "
            "add CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE / securityContext.capabilities.add: SYS_PTRACE)")


def gap_for(result: CommandResult, *, target: str, py_spy: str, sudo: bool, max_bytes: int | None) -> Gap | None:
    """The Gap a failed ``py-spy dump`` stands for, or None when it ran and exited 0 untruncated."""
    host = result.host
    stderr = result.stderr_text
    said = _first_error_line(stderr)
    said_note = f" (stderr: {said[:200]})" if said else ""

    def gap(cause: str, detail: str, fix: str | None) -> Gap:
        return Gap(PIECE, target, f"{cause}: {detail}", fix, result.state.value)

    if result.state is State.DISCONNECTED:
        return gap(DISCONNECTED, f"could not reach {host} or lost the connection ({result.error})",
                   f"check that {host} is reachable over SSH (host, port, key, known_hosts) and retry")
    if result.state is State.TIMED_OUT:
        return gap(TIMED_OUT, f"py-spy did not finish within its deadline on {host} ({result.error}); a blocking "
                   "dump pauses the target while it reads every thread, which can be slow on a loaded host",
                   "retry with a longer timeout (dump_threads(..., timeout=...)); check the host's load")
    if result.state is State.ERROR:
        # LocalHost: the program could not be started at all.
        return gap(NOT_INSTALLED, f"{py_spy!r} is not an executable program on {host} ({result.error})",
                   not_installed_fix(host))
    if result.state is State.OK:
        if result.truncated:
            return gap(TRUNCATED, f"py-spy's output on {host} was cut at the {max_bytes}-byte cap, so its JSON "
                       "cannot be read whole", "retry with a larger byte cap (dump_threads(..., max_bytes=...))")
        return None
    # FAILED: ran and exited non-zero.
    code = result.exit_code
    if sudo and _SUDO.search(stderr):
        if "command not found" in stderr:
            return gap(NOT_INSTALLED, f"sudo on {host} cannot find {py_spy!r} on its secure_path{said_note}",
                       not_installed_fix(host) + " (under sudo give an absolute path)")
        return gap(SUDO_REFUSED, f"sudo -n refused to run py-spy on {host}{said_note}",
                   f"add a NOPASSWD sudoers rule for {py_spy} on {host}, or set sudo = false and allow ptrace")
    if code == 127 or (code == 126 and _NOT_FOUND.search(stderr)):
        return gap(NOT_INSTALLED, f"{py_spy!r} was not found on {host} (exit {code}){said_note}",
                   not_installed_fix(host))
    if code == 126:
        return gap(NOT_EXECUTABLE, f"{py_spy!r} on {host} cannot be run (exit 126: a directory, or no execute "
                   f"permission){said_note}", not_installed_fix(host))
    if _GONE.search(stderr):
        return gap(NO_PROCESS, f"the process is not running on {host}{said_note}",
                   "check the pid (it may have exited or restarted; find the scheduler process again)")
    if _NOT_PYTHON.search(stderr):
        return gap(NOT_PYTHON, f"py-spy found no Python interpreter in the process on {host}{said_note}",
                   "point at the sglang scheduler process (a Python process), not a wrapper or launcher")
    if _PTRACE.search(stderr):
        return gap(PTRACE_DENIED, f"py-spy was not allowed to ptrace the process on {host}{said_note}",
                   ptrace_fix(host))
    return gap(FAILED, f"py-spy exited {code} on {host}{said_note}", None)


def output_gap(result: CommandResult, *, target: str, cause: str, detail: str) -> Gap:
    """A dump that exited 0 but whose output cannot stand for the process's threads."""
    return Gap(PIECE, target, f"{cause}: {detail}", "retry the dump; if it repeats, report py-spy's output",
               result.state.value)
