"""The twin's own error: it cannot be set up as asked (exit 4, an environment problem)."""

from __future__ import annotations

from forensics.exitcodes import EnvironmentProblem


class TwinError(EnvironmentProblem):
    """The twin cannot be set up as asked; the message says what and why."""
