"""The storm's nemesis: kill clients abruptly at a chosen phase.

Phases the user picks (``--phase``):

* ``bootstrap``: sessions that have sent their request and seen no token, killed as soon as
  the wave is out (``kill_after`` counts from the wave's start; 0 is usual). A kill this early
  may reach the router before it forwarded the request: then the engines never see it;
* ``kv`` (the default): from ``kill_after`` on (0 by default), each session the moment the
  observer (:mod:`forensics.storm.observer`) sees the decode hold it with its KV pending: the
  decode counted its arrival and the client has had no token yet (the decode's prealloc or
  transfer queue, while the KV is on its way). No timer decides: a slow prefill is struck as
  surely as a fast one;
* ``stream``: sessions already streaming tokens at ``kill_after``;
* ``any``: every session still open at ``kill_after``.

The client sees only "no token yet" or "tokens" (and the observer the decode's arrival
count): which decode queue a kill really hit is attributed afterwards from the decode's log. Only a kill that reaches the decode while the
request sits in its prealloc or transfer queue makes sglang 0.5.13+ send ABORT; a streamed
disconnect reaches the engine about 2 s after the socket closed (``create_abort_task``).

Modes: ``rst`` resets the sockets in this process (SO_LINGER {1, 0}, then close: an RST,
the mode for large storms); ``sigkill`` SIGKILLs separate client processes, as ``pkill -9``
did in the incident (the kernel closes their sockets).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

from forensics.exitcodes import UsageProblem

from .client import SessionState, reset

PHASES = ("bootstrap", "kv", "stream", "any")
MODES = ("rst", "sigkill")
_WAITING = ("connecting", "sent", "waiting")


def check(phase: str, mode: str) -> None:
    if phase not in PHASES:
        raise UsageProblem(f"phase {phase!r}: expected one of {', '.join(PHASES)}")
    if mode not in MODES:
        raise UsageProblem(f"mode {mode!r}: expected one of {', '.join(MODES)}")


def targets(state: SessionState, phase: str) -> bool:
    """Whether the nemesis kills this session now, from what the client can see."""
    if not state.open or state.killed:
        return False
    if phase == "any":
        return True
    if phase == "stream":
        return state.phase == "streaming"
    if phase == "kv":
        return state.phase in ("sent", "waiting")  # out, no token: the observer chose it as held
    return state.phase in _WAITING  # bootstrap: out, no token yet


def ready(state: SessionState, phase: str) -> bool:
    """Whether a session has gone far enough for the nemesis to strike it in ``phase`` (or never will)."""
    if not state.open:
        return True
    return state.phase != "connecting"  # never kill a request before it is out


@dataclass
class Strike:
    """One firing of the nemesis: when, how many sessions, how fast the sockets went."""

    signal_perf: float  # time.perf_counter() at the kill signal
    signal_wall: float
    killed: int
    spread_s: float | None  # first to last socket reset (rst) or process kill (sigkill)
    after_signal_s: float | None  # signal to the last reset / kill


def strike_rst(states: list[SessionState], phase: str, loop: asyncio.AbstractEventLoop) -> Strike:
    """Reset, in one go, every session the phase picks; returns the timing."""
    started, wall = time.perf_counter(), time.time()
    hit = []
    for state in states:
        if targets(state, phase):
            state.phase_at_kill = state.phase
            state.killed = True
            if reset(state, loop):
                hit.append(state)
            _killed(state, "rst", wall)
    return _strike(started, wall, [s.kill_perf for s in hit], len(hit))


def strike_sigkill(processes: dict[int, list[SessionState]], phase: str, chosen: set[str] | None = None) -> Strike:
    """SIGKILL every client process holding at least one session the phase picks (of ``chosen``
    rids only, when given: the sessions the observer saw held)."""
    started, wall = time.perf_counter(), time.time()
    times = []
    for pid, states in processes.items():
        if not any(targets(s, phase) and (chosen is None or s.rid in chosen) for s in states):
            continue
        try:
            os.kill(pid, signal.SIGKILL)  # our own child, started by the storm (pid recorded)
        except ProcessLookupError:
            continue
        times.append(time.perf_counter())
        for state in states:
            if state.open and not state.killed:
                state.phase_at_kill = state.phase
                state.killed = True
                _killed(state, "sigkill", wall)
    return _strike(started, wall, times, sum(1 for states in processes.values() for s in states
                                             if s.killed and s.ended == wall))


def _killed(state: SessionState, mode: str, wall: float) -> None:
    state.outcome = "info"
    state.ended = wall
    state.detail = f"killed by the nemesis ({mode}) while {state.phase}"


def _strike(started: float, wall: float, times: list[float | None], killed: int) -> Strike:
    times = [t for t in times if t is not None]
    if not times:
        return Strike(started, wall, killed, None, None)
    return Strike(started, wall, killed, max(times) - min(times), max(times) - started)
