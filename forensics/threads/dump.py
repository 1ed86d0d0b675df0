"""``dump_threads``: one ``py-spy dump --json`` per pid on a Host, as the ``threads`` frame.

The dump is *blocking* (py-spy's default): py-spy pauses the target while it reads every
thread's stack, so the stacks are consistent with each other (a bootstrap thread caught
mid-``recv_multipart`` really is there). ``--nonblocking`` would not pause the scheduler,
but may return torn or stale stacks; for a wedge diagnosis consistency wins, and the pause
is a few milliseconds per thread. Each pid's failure becomes a :class:`Gap` with its reason
and fix (see :mod:`forensics.threads.failures`); a pid is never reported with zero threads.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from forensics.evidence import Gap, command_record
from forensics.hosts.base import Host
from forensics.hosts.result import CommandResult
from forensics.threads import schema
from forensics.threads.failures import BAD_OUTPUT, NO_THREADS, gap_for, output_gap

DEFAULT_MAX_BYTES = 8 * 1024 * 1024  # a scheduler's dump is tens of KiB; this is far above it


@dataclass
class ThreadDump:
    """The threads of some processes on one host, and what could not be dumped."""

    host: str
    pids: list[int]
    frame: pd.DataFrame  # schema.THREAD_COLUMNS, rows of every pid dumped
    gaps: dict[int, Gap] = field(default_factory=dict)  # pid -> why it has no rows
    raw: dict[int, Any] = field(default_factory=dict)  # pid -> py-spy's parsed JSON, as it printed it
    commands: list[dict] = field(default_factory=list)  # command_record of each py-spy run
    taken_at: dict[int, datetime] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every pid was dumped."""
        return not self.gaps

    def gap(self, pid: int) -> Gap | None:
        return self.gaps.get(pid)

    def threads(self, pid: int) -> pd.DataFrame:
        return self.frame[self.frame["pid"] == pid]

    def to_frame(self) -> pd.DataFrame:
        return self.frame

    def summary(self) -> str:
        parts = []
        for pid in self.pids:
            if pid in self.gaps:
                parts.append(f"pid {pid}: {self.gaps[pid].reason}")
            else:
                parts.append(f"pid {pid}: {int((self.frame['pid'] == pid).sum())} threads")
        return f"{self.host}: " + "; ".join(parts)

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        gaps = "".join(f"<li><b>pid {pid}</b>: {html.escape(str(g))}</li>" for pid, g in self.gaps.items())
        shown = self.frame.drop(columns=["frames"])
        return (f"<p>threads on {html.escape(self.host)}</p>"
                + (f"<ul style='color:#ef6c00'>{gaps}</ul>" if gaps else "")
                + shown._repr_html_())

    def __rich__(self):
        from rich.table import Table

        table = Table(title=f"threads on {self.host}")
        for column in ("pid", "thread_name", "native_id", "idle", "owns_gil", "top_frame"):
            table.add_column(column)
        for row in self.frame.itertuples(index=False):
            table.add_row(str(row.pid), row.thread_name, str(row.native_id), str(row.idle), str(row.owns_gil),
                          row.top_frame)
        for pid, gap in self.gaps.items():
            table.add_row(str(pid), "[yellow]not dumped[/]", "", "", "", gap.reason)
        return table


def _frame_text(frame: dict) -> str:
    name = frame.get("name") or "?"
    where = frame.get("short_filename") or frame.get("filename") or "?"
    line = frame.get("line")
    return f"{name} ({where}:{line})" if line is not None else f"{name} ({where})"


def parse_dump(data: Any, *, host: str, pid: int, taken_at: datetime) -> dict[str, list]:
    """py-spy's JSON (a list of threads, frames innermost first) as per-column lists.

    Raises ValueError when the document is not py-spy's thread list.
    """
    if not isinstance(data, list):
        raise ValueError(f"expected a JSON list of threads, got {type(data).__name__}")
    columns: dict[str, list] = {name: [] for name in schema.THREAD_COLUMNS}
    for thread in data:
        if not isinstance(thread, dict) or "thread_id" not in thread:
            raise ValueError(f"a thread entry without thread_id: {str(thread)[:120]}")
        frames = thread.get("frames") or []
        texts = [_frame_text(f) for f in frames]
        active = bool(thread.get("active", False))
        columns["taken_at"].append(taken_at)
        columns["host"].append(host)
        columns["pid"].append(int(thread.get("pid") or pid))
        columns["thread_id"].append(int(thread["thread_id"]))
        native = thread.get("os_thread_id")
        columns["native_id"].append(None if native is None else int(native))
        columns["thread_name"].append(thread.get("thread_name") or "")
        columns["idle"].append(not active)
        columns["active"].append(active)
        columns["owns_gil"].append(bool(thread.get("owns_gil", False)))
        columns["depth"].append(len(frames))
        columns["top_function"].append((frames[0].get("name") or "") if frames else "")
        columns["top_frame"].append(texts[0] if texts else "")
        columns["frames"].append("\n".join(texts))
    return columns


def py_spy_argv(py_spy: str, pid: int) -> list[str]:
    # Blocking on purpose (see the module docstring); --json for a stable, parseable format.
    return [py_spy, "dump", "--json", "--pid", str(int(pid))]


def dump_threads(
    host: Host,
    pids: int | Iterable[int],
    *,
    py_spy: str = "py-spy",
    sudo: bool = False,
    timeout: float = 30,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    label: str | None = None,
) -> ThreadDump:
    """Dump the Python threads of each pid on ``host`` with ``py-spy dump --json``.

    ``py_spy`` is the program on that host (a name on its PATH or an absolute path), ``sudo``
    runs it through ``sudo -n`` (ptrace of another user's process), ``timeout`` bounds each
    pid's dump, ``max_bytes`` caps its output. ``label`` names the engine in the gaps
    ("prefill-0"). Each pid that could not be dumped has a Gap in ``.gaps`` and no rows.
    """
    pid_list = [int(pids)] if isinstance(pids, int) else [int(p) for p in pids]
    per_pid: list[dict[str, list]] = []
    dump = ThreadDump(host=host.name, pids=pid_list, frame=schema.empty())
    for pid in pid_list:
        target = f"{label + ' ' if label else ''}pid {pid} on {host.name}"
        result: CommandResult = host.run(py_spy_argv(py_spy, pid), timeout=timeout, sudo=sudo, max_bytes=max_bytes)
        taken_at = datetime.now(UTC)
        dump.commands.append(command_record(result))
        gap = gap_for(result, target=target, py_spy=py_spy, sudo=sudo, max_bytes=max_bytes)
        if gap is not None:
            dump.gaps[pid] = gap
            continue
        try:
            data = json.loads(result.stdout)
            columns = parse_dump(data, host=host.name, pid=pid, taken_at=taken_at)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            dump.gaps[pid] = output_gap(result, target=target, cause=BAD_OUTPUT,
                                        detail=f"py-spy's output on {host.name} is not its JSON thread list ({exc})")
            continue
        if not columns["pid"]:
            dump.gaps[pid] = output_gap(result, target=target, cause=NO_THREADS,
                                        detail=f"py-spy reported no Python thread in pid {pid} on {host.name} "
                                               "(an interpreter still starting or shutting down?)")
            continue
        dump.raw[pid] = data
        dump.taken_at[pid] = taken_at
        per_pid.append(columns)
    if per_pid:
        merged = {name: [v for columns in per_pid for v in columns[name]] for name in schema.THREAD_COLUMNS}
        dump.frame = schema.build(merged)
    return dump
