"""An engine's processes on a host, found from a selector and found again without being fooled by pid reuse.

One command per host: ``python3 -c SCRIPT SELECTOR`` where ``SCRIPT`` is a fixed program
passed as one argv element (no shell, nothing to quote) that reads ``/proc`` and prints
JSON, and ``SELECTOR`` is the selector as hex-encoded JSON (so the command line of the
lookup itself never contains the title it looks for). The script skips itself and its
ancestors (``timeout``, ``sudo``, the remote shell). Where the host has no ``python3``,
``ps -eww -o pid=,ppid=,lstart=,args=`` (under ``env LC_ALL=C TZ=UTC``) is read instead, with a
start time to the second and a command line split on spaces.

Each match is a :class:`ProcessInfo`: pid, exact start time (``/proc/PID/stat`` field 22,
in clock ticks since boot, plus the boot time), command line (secrets redacted, see
:mod:`forensics.redact`) and title. A process is the same process only if pid, start
ticks and command line all agree (:meth:`ProcessInfo.same_process`).

Zero matches is a :class:`~forensics.evidence.Gap` ("no process matching title=... on
HOST": the DOWN signal later), never an empty answer standing for "nothing there".
"""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from forensics.evidence import Gap, command_record
from forensics.hosts.base import Host
from forensics.hosts.result import CommandResult, State
from forensics.inventory.model import ProcessSelector
from forensics.redact import redact_argv, redact_text

__all__ = [
    "PROCESSES_SCHEMA",
    "ProcessInfo",
    "ProcessScan",
    "ProcessSelector",
    "find_again",
    "find_processes",
]

PROCESSES_SCHEMA: dict[str, str] = {
    "host": "string",
    "pid": "Int64",
    "ppid": "Int64",
    "start_time": "datetime64[ns, UTC]",
    "start_ticks": "Int64",  # /proc/PID/stat field 22: clock ticks after boot (exact); <NA> from ps
    "title": "string",
    "cmdline": "string",  # shlex-joined, secrets redacted
}

DEFAULT_TIMEOUT_S = 20.0
MAX_BYTES = 32 * 1024 * 1024

# The fixed program run on the host. argv[1] is the selector as hex JSON. It prints one JSON
# document: boot time, clock ticks per second, its own pid, the matching processes, errors.
LOOKUP_SCRIPT = r"""
import json, os, sys, time
sel = json.loads(bytes.fromhex(sys.argv[1]).decode())
out = {"clk_tck": os.sysconf("SC_CLK_TCK"), "self": os.getpid(), "procs": [], "errors": []}
for line in open("/proc/stat"):
    if line.startswith("btime "):
        out["btime"] = int(line.split()[1])
with open("/proc/uptime") as f:
    out["boot_time"] = time.time() - float(f.read().split()[0])
def stat(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read().decode("utf-8", "replace")
    comm = data[data.index("(") + 1:data.rindex(")")]
    rest = data[data.rindex(")") + 2:].split()
    return comm, int(rest[1]), int(rest[19])
skip, pid = set(), os.getpid()
while pid > 1 and pid not in skip:
    skip.add(pid)
    try:
        pid = stat(pid)[1]
    except Exception:
        break
only = sel.get("pid")
if sel.get("pid_file"):
    try:
        with open(sel["pid_file"]) as f:
            text = f.read().strip()
        only = int(text.split()[0])
        out["pid_file_pid"] = only
    except Exception as exc:
        out["pid_file_error"] = "%s: %s" % (type(exc).__name__, exc)
        only = -1
pids = [only] if only is not None else [int(p) for p in os.listdir("/proc") if p.isdigit()]
for pid in pids:
    if pid in skip or pid <= 0:
        continue
    try:
        comm, ppid, ticks = stat(pid)
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read()
        uid = os.stat("/proc/%d" % pid).st_uid
    except Exception:
        continue
    args = [a.decode("utf-8", "surrogateescape").encode("utf-8", "replace").decode() for a in raw.split(b"\0")]
    while args and args[-1] == "":
        args.pop()
    if len(args) == 1:
        args = [args[0].rstrip(" ")]
    title = args[0] if args else "[" + comm + "]"
    joined = " ".join(args)
    t, c = sel.get("title"), sel.get("cmdline")
    if t and not (title.startswith(t) or joined.startswith(t) or (len(t) <= 15 and comm == t)):
        continue
    if c and c not in joined:
        continue
    out["procs"].append({"pid": pid, "ppid": ppid, "ticks": ticks, "comm": comm, "uid": uid, "cmdline": args})
print(json.dumps(out))
"""


@dataclass(frozen=True)
class ProcessInfo:
    """One process: found by pid, start time and command line together (pid reuse cannot fool it)."""

    pid: int
    start_time: pd.Timestamp  # tz-aware UTC
    cmdline: tuple[str, ...]  # secrets redacted
    title: str
    host: str = ""
    start_ticks: int | None = None  # exact: clock ticks after boot; None when read from ps
    ppid: int | None = None
    uid: int | None = None

    def same_process(self, other: ProcessInfo) -> bool:
        """The same process: pid, command line and start (exact ticks when both have them) agree."""
        if self.pid != other.pid or tuple(self.cmdline) != tuple(other.cmdline):
            return False
        if self.start_ticks is not None and other.start_ticks is not None:
            return self.start_ticks == other.start_ticks
        return abs((self.start_time - other.start_time).total_seconds()) < 1.0

    @property
    def command(self) -> str:
        return shlex.join(self.cmdline)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "ppid": self.ppid, "uid": self.uid,
                "start_time": self.start_time.isoformat(), "start_ticks": self.start_ticks,
                "title": self.title, "cmdline": list(self.cmdline)}

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.title}) on {self.host}, started {self.start_time.isoformat()}"


@dataclass
class ProcessScan:
    """What :func:`find_processes` found on one host: processes, gaps, and the command it ran."""

    host: str
    selector: ProcessSelector
    processes: list[ProcessInfo] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    source: str = "proc"  # "proc" (exact) or "ps" (start time to the second)

    def __iter__(self) -> Iterator[ProcessInfo]:
        return iter(self.processes)

    def __len__(self) -> int:
        return len(self.processes)

    @property
    def found(self) -> bool:
        return bool(self.processes)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def to_frame(self) -> pd.DataFrame:
        return processes_frame(self.processes)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "selector": asdict(self.selector), "source": self.source,
                "processes": [p.to_dict() for p in self.processes], "gaps": [g.to_dict() for g in self.gaps],
                "commands": self.commands}

    def _repr_html_(self) -> str:
        gaps = "".join(f"<li>{html.escape(str(g))}</li>" for g in self.gaps)
        return (f"<b>{html.escape(self.selector.describe())}</b> on {html.escape(self.host)}"
                + (f"<ul>{gaps}</ul>" if gaps else "") + self.to_frame().to_html(index=False))

    def __repr__(self) -> str:
        return (f"<ProcessScan {self.host} {self.selector.describe()}: {len(self.processes)} process(es), "
                f"{len(self.gaps)} gap(s)>")


def processes_frame(processes: list[ProcessInfo]) -> pd.DataFrame:
    """The processes as a frame of :data:`PROCESSES_SCHEMA` (integer columns built directly as Int64)."""
    return pd.DataFrame({
        "host": pd.array([p.host for p in processes], dtype="string"),
        "pid": pd.array([p.pid for p in processes], dtype="Int64"),
        "ppid": pd.array([p.ppid for p in processes], dtype="Int64"),
        "start_time": pd.Series([p.start_time for p in processes], dtype="datetime64[ns, UTC]"),
        "start_ticks": pd.array([p.start_ticks for p in processes], dtype="Int64"),
        "title": pd.array([p.title for p in processes], dtype="string"),
        "cmdline": pd.array([p.command for p in processes], dtype="string"),
    })


# ------------------------------------------------------------------------------------- parsing


def _start_time(boot_ns: int, ticks: int, clk_tck: int) -> pd.Timestamp:
    seconds, rest = divmod(ticks, clk_tck)
    nanos = rest * 1_000_000_000 // clk_tck
    return pd.Timestamp(boot_ns + seconds * 1_000_000_000 + nanos, tz="UTC")


def _boot_ns(doc: dict[str, Any]) -> int:
    """The host's boot time in ns. ``/proc/stat``'s ``btime`` is cut to the second, which put start
    times up to a second early: a restart then seemed to precede log lines of the old run written
    in the same second. The wall clock less ``/proc/uptime`` (read together, 10 ms steps) is exact
    to a clock tick; ``btime`` stays the fallback for documents without it."""
    if doc.get("boot_time") is not None:
        return round(float(doc["boot_time"]) * 1_000_000_000)
    return int(doc["btime"]) * 1_000_000_000


def parse_proc_json(text: str, host: str) -> tuple[list[ProcessInfo], dict[str, Any]]:
    """The lookup script's JSON: the processes (redacted) and the rest of the document."""
    doc = json.loads(text)
    boot_ns, clk = _boot_ns(doc), int(doc["clk_tck"])
    procs = []
    for p in doc.get("procs", []):
        cmdline = tuple(redact_argv(p["cmdline"]))
        title = redact_text(cmdline[0] if cmdline else f"[{p['comm']}]")
        procs.append(ProcessInfo(pid=int(p["pid"]), start_time=_start_time(boot_ns, int(p["ticks"]), clk),
                                 cmdline=cmdline, title=title, host=host, start_ticks=int(p["ticks"]),
                                 ppid=int(p["ppid"]), uid=int(p["uid"])))
    return procs, doc


def parse_ps(text: str, host: str, selector: ProcessSelector, skip: set[int] = frozenset()) -> list[ProcessInfo]:
    """``ps -eww -o pid=,ppid=,lstart=,args=`` (C locale, TZ=UTC) filtered by ``selector`` (pid files aside)."""
    procs = []
    for line in text.splitlines():
        parts = line.split(None, 7)
        if len(parts) < 8:
            continue
        try:
            pid, ppid = int(parts[0]), int(parts[1])
            started = datetime.strptime(" ".join(parts[2:7]), "%a %b %d %H:%M:%S %Y")
        except ValueError:
            continue
        args = parts[7]
        if pid in skip or (selector.pid is not None and pid != selector.pid):
            continue
        if selector.title and not args.startswith(selector.title):
            continue
        if selector.cmdline and selector.cmdline not in args:
            continue
        cmdline = tuple(redact_argv(args.split(" ")))
        start = pd.Timestamp(started.replace(tzinfo=UTC))  # ps ran under TZ=UTC
        procs.append(ProcessInfo(pid=pid, start_time=start, cmdline=cmdline, title=cmdline[0], host=host,
                                 ppid=ppid))
    return procs


# ------------------------------------------------------------------------------------- lookups


def _no_python(result: CommandResult) -> bool:
    return result.state is State.ERROR or (result.state is State.FAILED and result.exit_code in (126, 127))


def _command_gap(result: CommandResult, target: str, what: str) -> Gap:
    why = result.error or (result.stderr_text.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
    fix = {State.DISCONNECTED: "check the host is reachable over SSH",
           State.TIMED_OUT: "the host is slow or overloaded; retry with a longer timeout"}.get(result.state)
    return Gap("processes", target, f"{what} on {result.host} {result.state.value}: {redact_text(why)}",
               fix=fix, state=result.state.value)


def find_processes(
    host: Host,
    selector: ProcessSelector,
    *,
    python: str = "python3",
    timeout: float = DEFAULT_TIMEOUT_S,
    sudo: bool = False,
    target: str | None = None,
) -> ProcessScan:
    """The processes on ``host`` matching ``selector``: all of them (one scheduler per TP/DP rank).

    One command runs on the host (``python -c`` with a fixed script; ``ps`` where there is
    no Python). Nothing matching is recorded as a Gap naming the selector and host.
    """
    target = target or host.name
    scan = ProcessScan(host.name, selector)
    result = host.run([python, "-c", LOOKUP_SCRIPT, selector.script_argument()], timeout=timeout, sudo=sudo, max_bytes=MAX_BYTES)
    record = command_record(result)
    record["argv"][2] = f"<process lookup script, {len(LOOKUP_SCRIPT)} characters>"
    scan.commands.append(record)
    doc: dict[str, Any] = {}
    if result.ok and not result.truncated:
        try:
            scan.processes, doc = parse_proc_json(result.stdout_text, host.name)
        except (ValueError, KeyError, TypeError) as exc:
            scan.gaps.append(Gap("processes", target, f"the process lookup on {host.name} printed no valid JSON: "
                                 f"{type(exc).__name__}: {exc}", state=result.state.value))
            return scan
    elif result.ok and result.truncated:
        scan.gaps.append(Gap("processes", target, f"the process list on {host.name} exceeded {MAX_BYTES} bytes",
                             fix="narrow the selector (a pid_file)", state=result.state.value))
        return scan
    elif _no_python(result) and not selector.pid_file:
        scan.source = "ps"
        fallback = host.run(["env", "LC_ALL=C", "TZ=UTC", "ps", "-eww", "-o", "pid=,ppid=,lstart=,args="],
                            timeout=timeout, sudo=sudo, max_bytes=MAX_BYTES)
        scan.commands.append(command_record(fallback))
        if not fallback.ok:
            scan.gaps.append(_command_gap(fallback, target, "ps"))
            return scan
        scan.processes = parse_ps(fallback.stdout_text, host.name, selector)
    else:
        what = f"the process lookup ({python})"
        gap = _command_gap(result, target, what)
        if _no_python(result):
            gap = Gap("processes", target, f"{python} cannot run on {host.name}, and a pid_file needs it",
                      fix="set python = ... (the engine's interpreter) in the inventory", state=result.state.value)
        scan.gaps.append(gap)
        return scan
    unreadable = doc.get("pid_file_error", "")
    if not scan.processes and unreadable and not unreadable.startswith("FileNotFoundError"):
        # Not "no process": we could not read which pid is the engine's (a missing pid file is
        # different: engines remove theirs when they stop).
        scan.gaps.append(Gap("processes", target, f"cannot read the pid file {selector.pid_file} on {host.name} "
                             f"({unreadable}): cannot tell whether the engine runs",
                             fix="make the pid file readable by the login user (as pid files under /run are); "
                                 "the process lookup never runs through sudo (docs/LIVE.md)"))
        return scan
    if not scan.processes:
        where = f"no process matching {selector.describe()} on {host.name}"
        if "pid_file_error" in doc:
            where += f" (pid file unreadable: {doc['pid_file_error']})"
        elif "pid_file_pid" in doc:
            where += f" (pid file names pid {doc['pid_file_pid']}, which is not running or does not match)"
        scan.gaps.append(Gap("processes", target, where,
                             fix="check the engine is running and the process selector in the inventory (where /proc "
                                 "is mounted with hidepid, other users' processes are invisible: sudo = true)"))
    return scan


def find_again(host: Host, info: ProcessInfo, *, python: str = "python3",
               timeout: float = DEFAULT_TIMEOUT_S) -> ProcessInfo | None:
    """``info``'s process if it still runs: same pid, start time and command line; else None."""
    for candidate in find_processes(host, ProcessSelector(pid=info.pid), python=python, timeout=timeout):
        if candidate.same_process(info):
            return candidate
    return None
