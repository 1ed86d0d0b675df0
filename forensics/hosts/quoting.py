"""Argument lists into one shell command line, literally.

A Host runs an *argument list*, never a string built by concatenation: over SSH the
remote login shell parses the command line, so every argument is quoted with
``shlex.join`` (POSIX single quotes), and values holding ``;``, ``$(...)``, quotes,
newlines or any unicode reach the program byte for byte.

The wrappers are argument lists too: ``sudo -n --`` (never a password prompt) and
``timeout --kill-after=K SECONDS`` so that a remote command cannot outlive its deadline
even when the connection that started it is gone (``timeout`` signals its whole
process group: the command's children die with it).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

KILL_AFTER_S = 2  # SIGKILL this long after the SIGTERM at the deadline


def check_argv(argv: Sequence[str]) -> list[str]:
    """The argument list as a list of str; a bare string or an empty list is a caller's mistake."""
    if isinstance(argv, str | bytes):
        raise TypeError("argv must be a list of arguments, not one string (use ['sh', '-c', text] on purpose)")
    out = list(argv)
    if not out:
        raise ValueError("argv is empty")
    for arg in out:
        if not isinstance(arg, str):
            raise TypeError(f"argv holds a {type(arg).__name__}, not str: {arg!r}")
        if "\0" in arg:
            raise ValueError("an argument cannot hold a NUL byte")
    return out


def sudo_argv(argv: Sequence[str]) -> list[str]:
    """``sudo -n -- ARGV``: fails at once with sudo's message instead of asking for a password."""
    return ["sudo", "-n", "--", *argv]


def timeout_argv(argv: Sequence[str], seconds: float, kill_after: float = KILL_AFTER_S) -> list[str]:
    """``timeout --kill-after=K SECONDS ARGV``: TERM at the deadline, KILL ``kill_after`` later."""
    seconds = max(float(seconds), 0.01)  # ``timeout 0`` would mean "no deadline at all"
    return ["timeout", f"--kill-after={_num(kill_after)}", _num(seconds), *argv]


def remote_command_line(argv: Sequence[str], *, timeout: float | None, sudo: bool = False) -> str:
    """The exact text handed to the remote shell for ``argv`` (quoted, sudo'd, time-bounded)."""
    args = check_argv(argv)
    if sudo:
        args = sudo_argv(args)
    if timeout is not None:
        args = timeout_argv(args, timeout)
    return shlex.join(args)


def _num(seconds: float) -> str:
    text = f"{float(seconds):.3f}".rstrip("0").rstrip(".")
    return text or "0"
