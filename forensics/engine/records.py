"""A real-engine deployment's process records, and how its processes are found again and stopped.

Per role, in the deployment directory (the same names as the twin's):

* ``<role>.pid``: the role's leader, the process ``launch_server`` (or ``launch_router``) runs in;
  its pid is also its session's and process group's id;
* ``<role>.proc.json``: the leader's pid, start time (clock ticks since boot, see
  ``forensics.process_start``; psutil's ``create_time`` beside it) and command line,
  and every member seen once the role was ready (scheduler, detokenizer, ...) with its own pid,
  start time and title;
* ``<role>.scheduler.pid`` (prefill and decode): the scheduler's pid, which the inventory's
  process selector names: ``bootstrap_thread`` lives there, and py-spy dumps it.

A process is this deployment's only if it matches a record's pid *and* start time (the leader
also its command line), or if it is in the leader's process group while that group is proved to
be ours (the leader, or a recorded member, still alive in it: a group id cannot be reused while a
member holds it). Anything else, a reused pid included, is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil

from forensics.process_start import same_start, start_ticks

SCHEDULER_TITLE = "sglang::scheduler"
# The title a leader gives itself once running (setproctitle replaces its command line):
# sglang-router's launch_router calls itself "sglang::router"; launch_server keeps its command line.
LEADER_TITLES = {"router": "sglang::router"}


def pid_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.pid"


def record_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.proc.json"


def scheduler_pid_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.scheduler.pid"


def log_file(directory: Path, role: str) -> Path:
    return directory / f"{role}.log"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_leader(directory: Path, role: str, pid: int, create_time: float, argv: list[str]) -> None:
    record = {"role": role, "pid": pid, "create_time": create_time, "start_ticks": start_ticks(pid),
              "cmdline": list(argv),
              "title": LEADER_TITLES.get(role), "launcher_pid": os.getpid(), "members": []}
    _write(record_file(directory, role), json.dumps(record) + "\n")
    _write(pid_file(directory, role), f"{pid}\n")


def read_record(directory: Path, role: str) -> dict | None:
    try:
        data = json.loads(record_file(directory, role).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def _same(proc: psutil.Process, identity: dict) -> bool:
    try:
        return same_start(proc, identity) and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, TypeError, ValueError):
        return False


def leader(directory: Path, role: str) -> psutil.Process | None:
    """The role's leader if it is alive and the very process recorded: pid, start time, and its
    command line as recorded or the title it gives itself."""
    record = read_record(directory, role)
    if record is None:
        return None
    try:
        proc = psutil.Process(record["pid"])
        if not _same(proc, record):
            return None
        cmdline = proc.cmdline()
    except psutil.Error:
        return None
    title = record.get("title")
    shown = " ".join(part for part in cmdline if part).strip()
    if cmdline == record.get("cmdline") or (title and shown == title):
        return proc
    return None


def remember_members(directory: Path, role: str) -> list[dict]:
    """Record the leader's live descendants (pid, start time, title); write the scheduler's pid file."""
    record = read_record(directory, role)
    head = leader(directory, role)
    if record is None or head is None:
        return []
    known = {m["pid"]: m for m in record.get("members", []) if isinstance(m, dict)}
    try:
        descendants = head.children(recursive=True)
    except psutil.Error:
        descendants = []
    for proc in descendants:
        try:
            title = " ".join(part for part in proc.cmdline() if part).strip()
            known[proc.pid] = {"pid": proc.pid, "create_time": proc.create_time(),
                               "start_ticks": start_ticks(proc.pid), "title": title}
        except psutil.Error:
            continue
    record["members"] = sorted(known.values(), key=lambda m: m["pid"])
    _write(record_file(directory, role), json.dumps(record) + "\n")
    schedulers = [m for m in record["members"] if m["title"].startswith(SCHEDULER_TITLE)]
    if schedulers:
        _write(scheduler_pid_file(directory, role), f"{schedulers[0]['pid']}\n")
    return record["members"]


def scheduler(directory: Path, role: str) -> psutil.Process | None:
    """The role's recorded scheduler process, if it is still that process."""
    record = read_record(directory, role) or {}
    for member in record.get("members", []):
        if isinstance(member, dict) and str(member.get("title", "")).startswith(SCHEDULER_TITLE):
            try:
                proc = psutil.Process(member["pid"])
            except psutil.Error:
                return None
            return proc if _same(proc, member) else None
    return None


def processes(directory: Path, role: str) -> list[psutil.Process]:
    """Every live process of the role that is provably this deployment's (see the module docstring)."""
    record = read_record(directory, role)
    if record is None:
        return []
    found: dict[int, psutil.Process] = {}
    head = leader(directory, role)
    if head is not None:
        found[head.pid] = head
    for member in record.get("members", []):
        try:
            proc = psutil.Process(member["pid"])
        except (psutil.Error, KeyError, TypeError):
            continue
        if _same(proc, member):
            found[proc.pid] = proc
    group = record["pid"]
    proved = any(_in_group(proc, group) for proc in found.values())
    if proved:  # the group id is held by one of ours, so every process in it is ours
        for proc in psutil.process_iter():
            if proc.pid not in found and _in_group(proc, group):
                found[proc.pid] = proc
        if head is not None:
            try:
                for proc in head.children(recursive=True):
                    found.setdefault(proc.pid, proc)
            except psutil.Error:
                pass
    return [proc for proc in found.values() if _alive(proc)]


def _in_group(proc: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(proc.pid) == pgid
    except OSError:
        return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def running(directory: Path, role: str) -> bool:
    return bool(processes(directory, role))


def stop(directory: Path, roles, timeout: float) -> dict[str, str]:
    """Stop ``roles`` together: SIGTERM to every process of each, one shared wait of at most
    ``timeout`` s, then SIGKILL to whatever is left (a wedged prefill never finishes its SIGTERM:
    sglang's ``sigterm_watchdog`` waits for its stuck request forever).

    Each role's outcome: ``terminated`` (SIGTERM sufficed), ``killed`` (SIGKILL was needed),
    ``stale`` (a record naming no live process of ours: removed, nothing signalled), ``absent``
    (no record), or ``left`` (still running after SIGKILL: the record is kept).
    """
    outcomes: dict[str, str] = {}
    targets: dict[str, list[psutil.Process]] = {}
    for role in roles:
        if read_record(directory, role) is None and not pid_file(directory, role).exists():
            outcomes[role] = "absent"
            continue
        procs = processes(directory, role)
        if not procs:
            outcomes[role] = "stale"
            forget(directory, role)
            continue
        targets[role] = procs
        _signal(procs, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_left(procs) for procs in targets.values()):
        time.sleep(0.1)
    for role, procs in targets.items():
        left = _left(procs)
        if left:
            # Looked for again: a member that appeared after the first look is in the group too.
            fresh = {proc.pid: proc for proc in [*left, *processes(directory, role)]}
            procs[:] = list(fresh.values())
            _signal(procs, signal.SIGKILL)
            outcomes[role] = "killed"
        else:
            outcomes[role] = "terminated"
    kill_deadline = time.monotonic() + 15
    while time.monotonic() < kill_deadline and any(_left(procs) for procs in targets.values()):
        time.sleep(0.05)
    for role, procs in targets.items():
        for proc in procs:
            _reap(proc.pid)
        if _left(procs):
            outcomes[role] = "left"
        else:
            forget(directory, role)
    return outcomes


def _left(procs: list[psutil.Process]) -> list[psutil.Process]:
    for proc in procs:
        _reap(proc.pid)
    return [proc for proc in procs if _alive(proc)]


def _signal(procs: list[psutil.Process], signum: int) -> None:
    for proc in procs:
        try:
            if proc.is_running():  # psutil checks the start time: a reused pid is not "running"
                proc.send_signal(signum)
        except psutil.Error:
            pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def forget(directory: Path, role: str) -> None:
    for path in (pid_file(directory, role), record_file(directory, role), scheduler_pid_file(directory, role)):
        path.unlink(missing_ok=True)
