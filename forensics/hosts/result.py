"""``CommandResult``: what one command on one Host did, with an explicit state.

In fabric's spirit (``exited``, ``stdout``, ``ok``, ``failed``), one step further: a
command that timed out, lost its connection or could not start has a *state* saying
so, never an empty string standing in for an answer.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from enum import StrEnum


class State(StrEnum):
    OK = "ok"  # ran and exited 0
    FAILED = "failed"  # ran and exited non-zero (exit_code says which)
    TIMED_OUT = "timed_out"  # killed at its deadline (output so far is kept)
    DISCONNECTED = "disconnected"  # the host could not be reached, or the connection dropped
    ERROR = "error"  # could not be started at all (no such program, a local error)


@dataclass(frozen=True)
class CommandResult:
    host: str
    argv: tuple[str, ...]
    state: State
    exit_code: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    duration_s: float = 0.0
    truncated: bool = False  # the byte cap cut stdout or stderr
    error: str | None = None  # one line, for timed_out / disconnected / error
    command_line: str | None = field(default=None, compare=False)  # what the remote shell was given

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", State(self.state))  # a bad word fails here, never later
        object.__setattr__(self, "argv", tuple(self.argv))

    @property
    def ok(self) -> bool:
        return self.state is State.OK

    @property
    def failed(self) -> bool:
        return not self.ok

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")

    def summary(self) -> str:
        """One line: host, command, state (with exit code or reason), duration."""
        what = self.state.value
        if self.exit_code is not None and self.state is not State.OK:
            what += f" (exit {self.exit_code})"
        elif self.error:
            what += f" ({self.error})"
        if self.truncated:
            what += ", output truncated"
        return f"{self.host}: {' '.join(self.argv)[:80]} -> {what} in {self.duration_s:.2f}s"

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        colour = {"ok": "#2e7d32", "failed": "#c62828"}.get(self.state.value, "#ef6c00")
        rows = [
            ("host", self.host),
            ("command", " ".join(self.argv)),
            ("state", f"<b style='color:{colour}'>{html.escape(self.state.value)}</b>"),
            ("exit code", "" if self.exit_code is None else str(self.exit_code)),
            ("duration", f"{self.duration_s:.3f} s"),
            ("truncated", "yes" if self.truncated else "no"),
        ]
        if self.error:
            rows.append(("error", self.error))
        cells = "".join(
            f"<tr><th style='text-align:left'>{k}</th><td>{v if k == 'state' else html.escape(v)}</td></tr>"
            for k, v in rows
        )
        out = "".join(
            f"<details><summary>{name} ({len(data)} bytes)</summary><pre>{html.escape(text[:20000])}</pre></details>"
            for name, data, text in (("stdout", self.stdout, self.stdout_text), ("stderr", self.stderr, self.stderr_text))
            if data
        )
        return f"<table>{cells}</table>{out}"

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        style = {"ok": "green", "failed": "red"}.get(self.state.value, "yellow")
        table = Table(show_header=False, box=None)
        table.add_row("host", self.host)
        table.add_row("command", " ".join(self.argv))
        table.add_row("state", Text(self.state.value, style=f"bold {style}"))
        table.add_row("exit code", "" if self.exit_code is None else str(self.exit_code))
        table.add_row("duration", f"{self.duration_s:.3f} s")
        table.add_row("truncated", "yes" if self.truncated else "no")
        if self.error:
            table.add_row("error", self.error)
        parts = [table]
        if self.stderr:
            parts.append(Text(self.stderr_text[-2000:], style="dim"))
        return Group(*parts)


def timed_out_exit(exit_code: int | None, duration_s: float, timeout: float | None) -> bool:
    """Whether an exit from ``timeout(1)`` means it killed the command at its deadline (124 TERM, 137 KILL)."""
    return timeout is not None and exit_code in (124, 137) and duration_s >= timeout * 0.9
