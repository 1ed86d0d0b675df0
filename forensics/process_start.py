"""When a process started, in a form that survives the host's wall clock moving.

psutil's ``create_time`` is the boot time (``btime`` in /proc/stat, whole seconds) plus the
process's start in clock ticks. ``btime`` is the wall clock minus the uptime, so it moves when the
wall clock is stepped or the machine sleeps and resumes (a VM paused and resumed, a laptop lid):
measured here after a pause, every process's ``create_time`` moved by seconds, and a 50 ms
comparison called our own running deployment "not ours". The start in clock ticks since boot
(``/proc/PID/stat`` field 22) never changes for the life of a process, so identities carry it
and compare it exactly; ``create_time`` stays in the records for people and for old records.
"""

from __future__ import annotations

import psutil

CREATE_TIME_SLACK_S = 0.05  # only for a record written before start ticks were kept


def start_ticks(pid: int) -> int | None:
    """The process's start in clock ticks since boot, or None where /proc cannot say."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as handle:
            text = handle.read()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    fields = text[text.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22 overall: the 20th after the name
    except (IndexError, ValueError):
        return None


def same_start(proc: psutil.Process, record: dict) -> bool:
    """Whether ``proc`` started when ``record`` (``start_ticks``, else ``create_time``) says.

    A record with start ticks is compared exactly; one with only ``create_time`` (written by an
    older version) within ``CREATE_TIME_SLACK_S``. Raises psutil errors for a gone process.
    """
    ticks = record.get("start_ticks")
    if isinstance(ticks, int) and not isinstance(ticks, bool):
        return start_ticks(proc.pid) == ticks
    created = record.get("create_time")
    if created is None:
        return False
    return abs(proc.create_time() - float(created)) <= CREATE_TIME_SLACK_S
