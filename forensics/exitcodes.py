"""Exit statuses shared by every ``forensics`` sub-command.

The status carries the answer where there is one, so scripts and CI gates can
branch on it without parsing output.
"""

from __future__ import annotations

GOOD = 0  # HEALTHY, PASS, clean
BAD = 1  # WEDGED, DEGRADED, DOWN, FAIL, findings
USAGE = 2  # what click and argparse use for usage errors
INCONCLUSIVE = 3  # could not decide; the output says what was missing
ENVIRONMENT = 4  # missing tool, unreachable host, unreadable input: one line on stderr


class EnvironmentProblem(RuntimeError):
    """Something outside the code is missing or broken (a tool, a host, a file).

    The CLI turns it into exit status 4 with its message as the one-line reason.
    """
