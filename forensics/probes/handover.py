"""Open probes outlive their caller: the hand-over at exit, and finding held probes again.

A process that exits closes its sockets, and a closed probe connection is the client
disconnect that wedges sglang 0.5.13 to 0.5.15.post1 (docs/probes.md, rule 4). So a
:class:`~forensics.probes.runner.ProbeRunner` that is left with open probes registers here;
at interpreter exit :func:`hand_over_at_exit` gives every connection still open to a keeper
(``forensics/probes/keeper.py``, a detached process that shares the sockets), says on stderr
which probe is open and why, and the caller exits without closing anything the server sees.
If the keeper cannot start, the exit waits for the probes instead (up to their caps), and
says so.

The next command finds the keepers (:func:`held`, :func:`recently_finished`) by their records
in the cache directory's ``open-probes/`` folder, each checked against the live process by pid,
start time and command line, so a record never names a stranger.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.probes import keeper

KEEPER_SCRIPT = Path(keeper.__file__)
READY_TIMEOUT_S = 20.0  # a loaded 2-core machine may take seconds to start an interpreter
DONE_KEPT_S = 24 * 3600.0  # finished records are kept this long for the next command to report

_runners: weakref.WeakSet = weakref.WeakSet()
_registered = threading.Lock()
_state = {"hooked": False, "handed": []}


def record_dir() -> Path:
    """``<cache>/open-probes`` (0700: records name the deployment's URLs)."""
    from forensics.cache import cache_dir

    directory = cache_dir() / "open-probes"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


@dataclass
class HeldProbe:
    """One connection a keeper holds (or held): a probe's leg."""

    probe_id: int
    leg: int
    target: str
    role: str
    kind: str
    url: str
    rid: str | None
    room: int | None
    sent_at: float
    cap_at: float
    state: str  # held, answered, unanswered, error
    status: int | None = None
    ended_at: float | None = None
    detail: str = ""

    @classmethod
    def from_record(cls, entry: dict) -> HeldProbe:
        room = entry.get("room")
        return cls(probe_id=int(entry["probe_id"]), leg=int(entry.get("leg") or 0), target=str(entry["target"]),
                   role=str(entry.get("role") or ""), kind=str(entry["kind"]), url=str(entry["url"]),
                   rid=entry.get("rid"), room=None if room is None else int(room),  # a string of digits: exact
                   sent_at=float(entry["sent_at"]), cap_at=float(entry["cap_at"]), state=str(entry["state"]),
                   status=entry.get("status"), ended_at=entry.get("ended_at"), detail=str(entry.get("detail", "")))

    def line(self) -> str:
        """One line in words (for stderr and the next command's report)."""
        sent = _clock(self.sent_at)
        who = f"probe {self.probe_id} ({self.kind}, {self.target}"
        who += f", rid {self.rid})" if self.rid else ")"
        if self.state == "held":
            return (f"{who} sent {sent}, open for {time.time() - self.sent_at:.0f} s; "
                    f"held until its answer or its cap at {_clock(self.cap_at)}")
        took = "" if self.ended_at is None else f" after {self.ended_at - self.sent_at:.0f} s"
        word = {"answered": "answered", "unanswered": "closed at its cap, unanswered",
                "error": "ended with an error"}.get(self.state, self.state)
        return f"{who} sent {sent}: {word}{took}" + (f" ({self.detail})" if self.state == "error" else "")


@dataclass
class KeeperRecord:
    """A keeper and the probes it holds; ``alive`` only when pid, start time and command line match."""

    pid: int
    start_ticks: int | None
    started_at: float
    caller: dict
    probes: list[HeldProbe]
    path: Path
    alive: bool
    finished_at: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def open(self) -> list[HeldProbe]:
        return [p for p in self.probes if p.state == "held"]

    def __repr__(self) -> str:
        state = "holding" if self.alive else "finished"
        return f"<KeeperRecord pid {self.pid} {state}: {len(self.open)} of {len(self.probes)} held>"


def _clock(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%H:%M:%SZ")


def _is_keeper(pid: int, ticks: int | None) -> bool:
    """Is ``pid`` still the keeper that wrote the record (start time and command line, not just the pid)?"""
    if ticks is None or keeper.start_ticks(pid) != ticks:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return keeper.HOLD_FLAG.encode() in argv and any(arg.endswith(b"keeper.py") for arg in argv)


def _read(path: Path) -> KeeperRecord | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        probes = [HeldProbe.from_record(entry) for entry in data.get("probes", [])]
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a record being replaced, or not one of ours: nothing to report from it
    finished = data.get("finished_at")
    alive = finished is None and _is_keeper(pid, data.get("start_ticks"))
    return KeeperRecord(pid=pid, start_ticks=data.get("start_ticks"), started_at=float(data.get("started_at", 0)),
                        caller=data.get("caller") or {}, probes=probes, path=path, alive=alive,
                        finished_at=finished)


def held() -> list[KeeperRecord]:
    """Keepers still holding an earlier command's probes (verified live), oldest first.

    A record whose keeper is gone without finishing (killed) is moved to the finished ones,
    with its probes' state as last written.
    """
    found = []
    for path in sorted(record_dir().glob(f"{keeper.RECORD_PREFIX}*.json")):
        record = _read(path)
        if record is None:
            continue
        if record.alive:
            found.append(record)
            continue
        with contextlib.suppress(OSError):
            data = json.loads(path.read_text(encoding="utf-8"))
            data["finished_at"] = time.time()
            data["ended_by"] = "the keeper was gone (killed?) before every probe ended"
            keeper.write_record(str(path.with_name(keeper.DONE_PREFIX + path.name)), data)
            path.unlink()
    return sorted(found, key=lambda r: r.started_at)


def recently_finished(since_s: float = 3600.0) -> list[KeeperRecord]:
    """Keepers that ended within ``since_s`` seconds (older records are pruned after a day)."""
    now = time.time()
    found = []
    for path in sorted(record_dir().glob(f"{keeper.DONE_PREFIX}*.json")):
        record = _read(path)
        if record is None or record.finished_at is None:
            continue
        if now - record.finished_at > DONE_KEPT_S:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if now - record.finished_at <= since_s:
            found.append(record)
    return sorted(found, key=lambda r: r.finished_at or 0)


# --------------------------------------------------------------------------- hand-over


def register(runner: Any) -> None:
    """Have ``runner``'s open probes handed to a keeper at interpreter exit (once per process)."""
    with _registered:
        _runners.add(runner)
        if not _state["hooked"]:
            atexit.register(hand_over_at_exit)
            _state["hooked"] = True


def open_connections(runners: Any = None) -> list[tuple[Any, int, Any]]:
    """Every (probe, leg, exchange) still open among ``runners`` (default: the registered ones)."""
    found = []
    for runner in list(_runners if runners is None else runners):
        for probe, leg, exchange in runner.open_exchanges():
            found.append((probe, leg, exchange))
    return found


def describe_open() -> list[dict]:
    """The probes still open among the registered runners, JSON-ready (a command's document lists them)."""
    seen = {}
    for probe, _leg, _exchange in open_connections():
        seen[probe.probe_id] = {"probe_id": probe.probe_id, "kind": probe.kind, "target": probe.target.name,
                                "rid": probe.call.rid, "sent_at": dt.datetime.fromtimestamp(
                                    probe.sent_ns / 1e9, dt.UTC).isoformat(timespec="milliseconds"),
                                "at_exit": "handed to a keeper that holds it until its answer or its cap"}
    return [seen[k] for k in sorted(seen)]


def hand_over(connections: list[tuple[Any, int, Any]], *, caller: dict | None = None) -> KeeperRecord | None:
    """Start a keeper holding ``connections``; its record, or None if it could not start (then nothing changed).

    Each exchange's socket stays open in this process too: the connection is shared, so
    closing this side later (the process exiting) sends nothing to the server.
    """
    spec_probes = []
    fds = []
    for probe, leg, exchange in connections:
        fd = exchange.socket_fd()
        if fd is None:
            continue
        # A copy of the descriptor, taken now: an exchange answered meanwhile closes its own, and
        # one closed descriptor among those passed made the keeper's start fail for every probe.
        try:
            fd = os.dup(fd)
        except OSError:
            continue  # answered and closed since socket_fd(): nothing left to keep
        fds.append(fd)
        spec_probes.append({"fd": fd, "probe_id": probe.probe_id, "leg": leg, "target": probe.target.name,
                            "role": probe.target.role, "kind": probe.kind, "url": probe.call.url,
                            "rid": probe.call.rid, "room": None if probe.call.room is None else str(probe.call.room),
                            "sent_at": probe.sent_ns / 1e9, "cap_at": probe.sent_ns / 1e9 + probe.cap_s})
    if not spec_probes:
        return None
    directory = record_dir()
    spec = {"record_dir": str(directory), "probes": spec_probes,
            "caller": caller or _caller()}
    try:
        proc = subprocess.Popen([sys.executable, "-I", str(KEEPER_SCRIPT), keeper.HOLD_FLAG],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                pass_fds=fds, close_fds=True, start_new_session=True)
    except OSError:
        return None
    finally:
        for fd in fds:  # the keeper has its own copies now (or none was made)
            with contextlib.suppress(OSError):
                os.close(fd)
    try:
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        ready = _read_ready(proc)
    except OSError:
        ready = None
    if ready != proc.pid:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
        return None
    # The keeper is never waited for: it outlives us. Forget it so no ResourceWarning or zombie report follows.
    proc.returncode = 0
    record = _read(directory / f"{keeper.RECORD_PREFIX}{proc.pid}.json")
    if record is not None:
        _state["handed"].append(record)
    return record


def _caller() -> dict:
    """Who handed the probes over: the program and its sub-command only (arguments may hold secrets)."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    if program in ("__main__.py", "-m", "-c"):
        program = "forensics" if "forensics" in (sys.argv[0] or "") else "python"
    words = [w for w in sys.argv[1:] if not w.startswith("-")][:1] if program == "forensics" else []
    return {"pid": os.getpid(), "argv": [program, *words]}


def _read_ready(proc: subprocess.Popen) -> int | None:
    """The keeper's ``ready <pid>`` line, within :data:`READY_TIMEOUT_S`."""
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=READY_TIMEOUT_S):
            return None
    line = proc.stdout.readline().decode(errors="replace").split()
    proc.stdout.close()
    return int(line[1]) if len(line) == 2 and line[0] == "ready" and line[1].isdigit() else None


def handed_over() -> list[KeeperRecord]:
    """The keepers this process handed probes to (at exit, or by :func:`hand_over_at_exit` called early)."""
    return list(_state["handed"])


def hand_over_at_exit(*, stream=None) -> KeeperRecord | None:
    """The atexit hook: every probe still open goes to a keeper; stderr says which and why.

    If no keeper can start, waits for the probes (up to their caps) instead, and says so:
    exiting would close them.
    """
    stream = stream or sys.stderr
    for runner in list(_runners):
        with contextlib.suppress(Exception):  # a runner that cannot stop ticking still hands over what is open
            runner.halt_ticks()
    connections = [c for c in open_connections() if c[2].socket_fd() is not None]
    if not connections:
        return None
    record = hand_over(connections)
    if record is not None:
        _say(stream, f"forensics: {len(record.open)} probe connection(s) still open, handed to keeper pid "
                     f"{record.pid}: it keeps each open until its answer or its cap (closing one early is "
                     "the client disconnect that wedges sglang 0.5.13-0.5.15.post1)")
        for probe in record.open:
            _say(stream, probe.line(), indent="  ")
        return record
    probes = sorted({id(p): p for p, _, _ in connections}.values(), key=lambda p: p.probe_id)
    longest = max(p.sent_ns / 1e9 + p.cap_s for p in probes) - time.time()
    _say(stream, f"forensics: {len(probes)} probe(s) still open and no keeper could start; waiting up to "
                 f"{max(longest, 0):.0f} s for their answers before exiting (exiting would close them)")
    for runner in list(_runners):
        runner.wait_answered(timeout=max(longest, 0.0))
    return None


def report_held(stream=None) -> list[KeeperRecord]:
    """Say (on ``stream``, default stderr) which probes of earlier commands keepers still hold."""
    stream = stream or sys.stderr
    records = held()
    for record in records:
        caller = " ".join(str(a) for a in record.caller.get("argv", [])) or "an earlier command"
        _say(stream, f"forensics: keeper pid {record.pid} still holds {len(record.open)} open probe "
                     f"connection(s) of '{caller}' (pid {record.caller.get('pid', '?')}):")
        for probe in record.open:
            _say(stream, probe.line(), indent="  ")
    return records


def _say(stream, text: str, indent: str = "") -> None:
    """Wrapped to 80 columns: this is read in a terminal, often a narrow one."""
    import textwrap

    lines = textwrap.wrap(text, 80, initial_indent=indent, subsequent_indent=indent + "  ",
                          break_on_hyphens=False, break_long_words=False)
    with contextlib.suppress(Exception):  # a closed stderr must not turn the exit into a crash
        print("\n".join(lines), file=stream, flush=True)
