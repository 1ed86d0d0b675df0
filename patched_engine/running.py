"""Does the running engine run the file on disk? Its processes' start times against the file's change time.

A Python process reads ``nixl/conn.py`` once, when it imports it at start-up; a file
replaced after that is not what it runs. So the question "does the engine run this file"
is answered by ordering two instants on the engine's host: the file's change time
(``ctime``, set by the deploy's ``install`` and ``mv``; :mod:`patched_engine.locate`
reports it) and the start time of each process the inventory's selector (``process``,
``pid_file``) finds, exact to a clock tick (:mod:`forensics.collectors.processes`).

Every process started after the change runs this file; any process started before it
runs an earlier one. Instants closer than :data:`ORDER_MARGIN_S` (a clock tick and the
boot-time estimate's error, or a second when only ``ps`` could be read) are not ordered:
undecided, never guessed. No selector in the inventory, or a lookup that failed, is
undecided too, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from forensics.collectors.processes import ProcessSelector, find_processes

ORDER_MARGIN_S = 0.05  # /proc start times: 10 ms ticks, plus the boot time read from wall clock less uptime
PS_ORDER_MARGIN_S = 1.0  # ps prints start times to the second

THIS_FILE = "this-file"  # every engine process started after the file changed
EARLIER_FILE = "earlier-file"  # some engine process started before: it runs what was there before
NO_PROCESS = "no-process"  # the lookup ran and found no engine process
UNDECIDED = "undecided"  # no selector, the lookup failed, or the instants are too close to order


@dataclass
class RunningCheck:
    """Which file the engine's running processes loaded, with the evidence (processes, change time)."""

    verdict: str  # THIS_FILE, EARLIER_FILE, NO_PROCESS, UNDECIDED
    reason: str
    file_changed: str | None = None  # ISO 8601, UTC
    processes: list[dict[str, Any]] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)

    @property
    def runs_this_file(self) -> bool:
        return self.verdict == THIS_FILE

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "file_changed": self.file_changed,
                "processes": self.processes}


def file_changed_at(located) -> pd.Timestamp | None:
    """The file's change time as the engine's host reports it (None from an older locate answer)."""
    ctime_ns = (located.file or {}).get("ctime_ns")
    return None if ctime_ns is None else pd.Timestamp(int(ctime_ns), tz="UTC")


def check_running(inv, engine, located, *, timeout: float = 20.0) -> RunningCheck:
    """Order each of ``engine``'s processes against the change time of the file ``located`` found."""
    changed = file_changed_at(located)
    changed_text = changed.isoformat() if changed is not None else None
    chosen = engine.selector
    if chosen is None:
        return RunningCheck(UNDECIDED, f"{engine.label}: the inventory gives no process selector (process = "
                            "\"TITLE\" or pid_file = \"PATH\"), so which file the running engine loaded cannot be "
                            "told", changed_text)
    if changed is None:
        return RunningCheck(UNDECIDED, f"{engine.label}: the file's change time is not known", changed_text)
    selector = ProcessSelector(title=chosen.title, cmdline=chosen.cmdline, pid_file=chosen.pid_file)
    scan = find_processes(inv.host_for(engine), selector, python=located.python, timeout=timeout,
                          target=engine.name)
    found = [p.to_dict() for p in scan.processes]
    if not scan.processes:
        reasons = "; ".join(g.reason for g in scan.gaps) or "the process lookup answered nothing"
        lookup_ran = bool(scan.commands) and scan.commands[-1].get("state") == "ok"
        verdict = NO_PROCESS if lookup_ran and reasons.startswith("no process matching") else UNDECIDED
        return RunningCheck(verdict, reasons, changed_text, found, scan.commands)
    margin = pd.Timedelta(seconds=PS_ORDER_MARGIN_S if scan.source == "ps" else ORDER_MARGIN_S)
    before = [p for p in scan.processes if p.start_time < changed - margin]
    close = [p for p in scan.processes if changed - margin <= p.start_time <= changed + margin]
    if before:
        names = ", ".join(f"pid {p.pid} started {p.start_time.isoformat()}" for p in before)
        return RunningCheck(EARLIER_FILE, f"{names}, before {located.path} changed at {changed_text}: it runs the "
                            "file that was there before", changed_text, found, scan.commands)
    if close:
        names = ", ".join(f"pid {p.pid} started {p.start_time.isoformat()}" for p in close)
        return RunningCheck(UNDECIDED, f"{names}, within {margin.total_seconds():g} s of the change of "
                            f"{located.path} at {changed_text}: too close to order", changed_text, found,
                            scan.commands)
    names = ", ".join(f"pid {p.pid}" for p in scan.processes)
    return RunningCheck(THIS_FILE, f"{names} started after {located.path} changed at {changed_text}", changed_text,
                        found, scan.commands)
