"""The exit contract of every ``forensics`` sub-command, written down once.

The status carries the answer where there is one, so scripts and CI gates can branch
on it without parsing output:

    0 GOOD          clean, HEALTHY, PASS
    1 BAD           findings, WEDGED, DEGRADED, DOWN, FAIL
    2 USAGE         a usage error (click's own status)
    3 INCONCLUSIVE  could not decide; the output says what was missing
    4 ENVIRONMENT   missing tool, unreadable or unwritable path, unreachable host
    5 INTERNAL      a bug: one line on stderr naming the saved traceback

Library code raises one of the exceptions below; the CLI maps them to statuses in one
place (``forensics.cli.contract``). Anything else that escapes is a bug (status 5).
"""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    GOOD = 0
    BAD = 1
    USAGE = 2
    INCONCLUSIVE = 3
    ENVIRONMENT = 4
    INTERNAL = 5


# Not an ExitStatus: what a command stopped by SIGINT/SIGTERM exits with (128 + SIGINT, the shell's
# convention), after it printed what it did (a deploy lists its steps and each engine's state).
INTERRUPTED = 130

# Short names kept for the many call sites that compare or exit with them.
GOOD = ExitStatus.GOOD
BAD = ExitStatus.BAD
USAGE = ExitStatus.USAGE
INCONCLUSIVE = ExitStatus.INCONCLUSIVE
ENVIRONMENT = ExitStatus.ENVIRONMENT
INTERNAL = ExitStatus.INTERNAL


class ForensicsError(Exception):
    """Root of every error the tool reports on purpose; ``exit_status`` says which status."""

    exit_status: ExitStatus = ExitStatus.INTERNAL
    word: str = "error"  # the JSON ``status`` word when this ends a command


class UsageProblem(ForensicsError):
    """The caller asked for something that cannot mean anything (a bad option value)."""

    exit_status = ExitStatus.USAGE
    word = "usage"


class Undecided(ForensicsError):
    """The question could not be answered from what was available; the message says what was missing."""

    exit_status = ExitStatus.INCONCLUSIVE
    word = "inconclusive"


class EnvironmentProblem(ForensicsError, RuntimeError):
    """Something outside the code is missing or broken (a tool, a host, a file).

    ``path`` names the file or directory when there is one. The CLI turns it into exit
    status 4 with its message as the one-line reason.
    """

    exit_status = ExitStatus.ENVIRONMENT
    word = "error"

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


def status_word(status: int) -> str:
    """The default JSON ``status`` word for a status number."""
    return {0: "pass", 1: "fail", 2: "usage", 3: "inconclusive", 4: "error", 5: "error"}[int(status)]


def environment_problem_from_os_error(exc: OSError, path: str | None = None,
                                      doing: str = "cannot use") -> EnvironmentProblem:
    """An OSError on one of the user's paths as an exit-4 problem whose line names the path."""
    where = path or exc.filename or "?"
    reason = exc.strerror or str(exc)
    problem = EnvironmentProblem(f"{where}: {doing}: {reason}", path=str(where))
    problem.__cause__ = exc
    return problem
