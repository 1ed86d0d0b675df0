"""``run_storm``: generator, nemesis, history and checker, cycle after cycle.

    result = forensics.storm.run_storm(twin, sessions=60, kill_after=3, cycles=2)
    result.history          # one row per session (forensics.storm.history.HISTORY_COLUMNS)
    result.verdicts         # the live diagnosis after each cycle
    result.exit_status      # 0 stayed HEALTHY, 1 did not, 3 no abort produced

A twin (an inventory with a ``[twin]`` table) is ours to storm; anything else needs
``yes=True`` and otherwise raises :class:`~forensics.storm.plan.ConfirmationNeeded` with
the plan. The cycles stop at the first verdict that is not HEALTHY (a wedged target has
nothing more to tell).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from forensics.collection.run import as_inventory
from forensics.exitcodes import UsageProblem

from . import checker, client, drain, generator, history, nemesis, observer
from .plan import ConfirmationNeeded, StormPlan
from .result import CycleResult, StormResult

Progress = Callable[[dict], None]  # {"cycle", "stage", "sessions", "open", "waiting", "streaming", "killed", ...}
DEFAULT_PROMPT_TOKENS = 3000
DEFAULT_MAX_TOKENS = 64
SIGKILL_CLIENTS = 16  # client processes in sigkill mode (sessions spread over them)
READY_WAIT_S = 10.0  # how long the nemesis waits for a wave to reach its phase before it strikes anyway
HELD_WAIT_S = 60.0  # phase kv: how long the nemesis watches a wave for sessions the decode holds
OBSERVE_POLL_S = 0.05  # phase kv: between two looks at the decode's arrival count
DEFAULT_PHASE = "kv"
DEFAULT_KILL_AFTER_S = 0.0


def _run_coroutine(coroutine):
    """``asyncio.run`` here, or in a worker thread when this thread already runs a loop (Jupyter's kernel)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="storm-cycle") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _seconds(value: Any, name: str, *, zero_ok: bool = True) -> float:
    if isinstance(value, str):
        from forensics.logs.timewindow import parse_duration

        try:
            value = float(value)
        except ValueError:
            value = parse_duration(value, name).total_seconds()
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise UsageProblem(f"{name}: expected seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
        raise UsageProblem(f"{name}: expected a {'non-negative' if zero_ok else 'positive'} duration, got {value!r}")
    return seconds


def make_plan(target: Any, *, sessions: int = 60, kill_after: Any = DEFAULT_KILL_AFTER_S, cycles: int = 1,
              phase: str = DEFAULT_PHASE,
              waves: int = 1, wave_interval: Any = 1.0, prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
              max_tokens: int = DEFAULT_MAX_TOKENS, mode: str = "rst", session_timeout: Any = None,
              settle: Any = 3.0, sample_s: Any = 8.0) -> StormPlan:
    inv = as_inventory(target)
    generator.check_sizes(sessions, prompt_tokens, max_tokens, waves)
    nemesis.check(phase, mode)
    if not isinstance(cycles, int) or isinstance(cycles, bool) or cycles < 1:
        raise UsageProblem(f"cycles: expected a positive integer, got {cycles!r}")
    kill_after_s = _seconds(kill_after, "kill-after")
    timeout_s = _seconds(session_timeout, "session-timeout", zero_ok=False) if session_timeout is not None \
        else kill_after_s + 30.0
    routers = inv.engines_with("router")
    if not routers:
        raise UsageProblem(f"{inv.name}: the storm goes through the router, and the inventory has none")
    generator.router_address(routers[0].url)
    return StormPlan(deployment=inv.name, router=routers[0].url, twin=inv.is_twin, sessions=sessions, waves=waves,
                     wave_interval_s=_seconds(wave_interval, "wave-interval"), prompt_tokens=prompt_tokens,
                     max_tokens=max_tokens, phase=phase, kill_after_s=kill_after_s, mode=mode, cycles=cycles,
                     session_timeout_s=timeout_s, settle_s=_seconds(settle, "settle"),
                     sample_s=_seconds(sample_s, "sample", zero_ok=False))


def run_storm(target: Any, *, yes: bool = False, progress: Progress | None = None,
              collect_options: dict | None = None, **options: Any) -> StormResult:
    """Storm ``target`` (inventory path, Inventory or twin) and check it after each cycle.

    Options are :func:`make_plan`'s (``sessions``, ``kill_after``, ``cycles``, ``phase``,
    ``waves``, ``wave_interval``, ``prompt_tokens``, ``max_tokens``, ``mode``,
    ``session_timeout``, ``settle``, ``sample_s``).

    Example: ``fx.storm.run_storm(twin, sessions=6, phase="kv", kill_after=0).summary()``
    """
    plan = make_plan(target, **options)
    if not plan.twin and not yes:
        raise ConfirmationNeeded(plan)
    inv = as_inventory(target)
    storm = generator.storm_id()
    rows: list[dict] = []
    cycles: list[CycleResult] = []
    for cycle in range(1, plan.cycles + 1):
        specs = generator.plan_sessions(plan.sessions, cycle=cycle, storm=storm, prompt_tokens=plan.prompt_tokens,
                                        max_tokens=plan.max_tokens, waves=plan.waves)
        started = pd.Timestamp.now(tz="UTC")
        watch = observer.KvObserver(observer.DecodeArrivals(
            [(e.name or e.role, e.url) for e in inv.engines_with("decode")], generator.ENDPOINT))
        states, strikes, pids = _run_coroutine(_cycle(plan, specs, cycle, progress, watch))
        # The killed sessions' prefills may still run (seconds to minutes on real sglang): check
        # once the servers answer /health again (a wedged prefill's stays 200), not while busy.
        _tell(progress, cycle=cycle, stage="draining", sessions=len(specs))
        drained = drain.wait_until_serving(inv, drain.cap_for(inv))
        _tell(progress, cycle=cycle, stage="checking", sessions=len(specs))
        since = started.floor("s") - pd.Timedelta(seconds=1)  # log lines carry whole seconds
        options = dict(collect_options or {})
        options["deadlines_s"] = drained.probe_deadlines(options.get("deadlines_s"))
        check = checker.check(inv if inv.path is None else inv.path, since=since, rids={s.rid for s in specs},
                              sample_s=plan.sample_s, **options)
        cycle_rows = [_row(spec, states[spec.rid], pids.get(spec.rid), plan.mode, check) for spec in specs]
        rows.extend(cycle_rows)
        counts = {phase: 0 for phase in history.ATTRIBUTED}
        for row in cycle_rows:
            counts[row["phase_attributed"]] += 1
        cycles.append(CycleResult(cycle=cycle, started=started.isoformat(), verdict=check.verdict,
                                  killed=sum(1 for r in cycle_rows if r["killed"]), aborts=counts,
                                  prefill_abort_frames=check.prefill_abort_frames, aborts_sent=check.aborts_sent,
                                  strikes=strikes, evidence=check.evidence, drained=drained))
        _tell(progress, cycle=cycle, stage=f"verdict {check.verdict.verdict}", sessions=len(specs))
        if check.verdict.verdict != "HEALTHY":
            break
    return StormResult(plan=plan, history=history.build(rows), cycles=cycles)


def _row(spec, state: client.SessionState, pid: int | None, mode: str, check: checker.Check) -> dict:
    found = check.attributed.get(spec.rid)
    attributed = found[0] if found else ("none" if check.logs_read else "unknown")
    return {"cycle": spec.cycle, "wave": spec.wave, "session": spec.session, "rid": spec.rid, "client_pid": pid,
            "invoke": state.invoked, "sent": state.sent, "headers": state.headers, "first_token": state.first_token,
            "end": state.ended, "tokens": state.tokens, "http_status": state.http_status, "killed": state.killed,
            "kill_mode": mode if state.killed else None, "phase_at_kill": state.phase_at_kill,
            "phase_attributed": attributed, "room": found[1] if found else None,
            "outcome": state.outcome or "info", "detail": state.detail or "no outcome recorded"}


def _tell(progress: Progress | None, **fields: Any) -> None:
    if progress is not None:
        progress(fields)


def _counts(states: dict[str, client.SessionState]) -> dict:
    values = list(states.values())
    return {"open": sum(s.open for s in values), "waiting": sum(s.open and s.phase in ("connecting", "sent", "waiting")
                                                                 for s in values),
            "streaming": sum(s.open and s.phase == "streaming" for s in values),
            "killed": sum(s.killed for s in values), "ok": sum(s.outcome == "ok" for s in values),
            "fail": sum(s.outcome == "fail" for s in values)}


async def _cycle(plan: StormPlan, specs: list, cycle: int, progress: Progress | None,
                 watch: observer.KvObserver | None = None):
    host, port = generator.router_address(plan.router)
    states = {spec.rid: client.SessionState(rid=spec.rid) for spec in specs}
    if watch is not None and plan.phase == "kv":
        await asyncio.to_thread(watch.start)
    else:
        watch = None
    ticker = asyncio.get_running_loop().create_task(_ticker(states, cycle, progress)) if progress else None
    try:
        if plan.mode == "rst":
            strikes = await _rst_cycle(plan, specs, states, host, port, watch)
            pids: dict[str, int] = {}
        else:
            strikes, pids = await _sigkill_cycle(plan, specs, states, host, port, watch)
    finally:
        if ticker is not None:
            ticker.cancel()
    return states, strikes, pids


async def _ticker(states, cycle: int, progress: Progress) -> None:
    while True:
        progress({"cycle": cycle, "stage": "storm", "sessions": len(states), **_counts(states)})
        await asyncio.sleep(0.25)


async def _ready(wave_specs: list, states: dict, phase: str, cap_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cap_s
    while loop.time() < deadline and not all(nemesis.ready(states[s.rid], phase) for s in wave_specs):
        await asyncio.sleep(0.005)


async def _waves(plan: StormPlan, specs: list, states: dict, start_wave, strike,
                 watch: observer.KvObserver | None = None) -> list[dict]:
    """Start each wave at its time and strike it ``kill_after`` later; then settle.

    With an observer (phase ``kv``) the nemesis strikes, from ``kill_after`` on, each session
    the moment the observer sees the decode hold it with its KV pending (one strike per look
    that found some), until none of the wave waits for its first token."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    by_wave: dict[int, list] = {}
    for spec in specs:
        by_wave.setdefault(spec.wave, []).append(spec)
    strikes: list[dict] = []

    def record(wave: int, hit: nemesis.Strike, **more: Any) -> None:
        strikes.append({"wave": wave, "killed": hit.killed, "spread_s": hit.spread_s,
                        "after_signal_s": hit.after_signal_s, "at": hit.signal_wall, **more})

    async def one_wave(wave: int, wave_specs: list) -> None:
        await asyncio.sleep(max(0.0, t0 + wave * plan.wave_interval_s - loop.time()))
        began = loop.time()
        await start_wave(wave_specs)
        await asyncio.sleep(max(0.0, began + plan.kill_after_s - loop.time()))
        if watch is not None:
            await _strike_when_held(wave, wave_specs, states, watch, strike, record)
            return
        await _ready(wave_specs, states, plan.phase, READY_WAIT_S)
        record(wave, strike(wave_specs))

    await asyncio.gather(*(one_wave(w, s) for w, s in sorted(by_wave.items())))
    return sorted(strikes, key=lambda s: (s["wave"], s["at"]))


async def _strike_when_held(wave: int, wave_specs: list, states: dict, watch: observer.KvObserver, strike,
                            record) -> None:
    """Phase ``kv``: look at the decode, strike the sessions it holds pending KV, look again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HELD_WAIT_S
    mine = [states[s.rid] for s in wave_specs]
    everyone = list(states.values())
    struck = False
    while True:
        await asyncio.to_thread(watch.refresh)
        held = {s.rid for s in watch.held(mine, everyone)}
        if held:
            hit = strike([s for s in wave_specs if s.rid in held], held)
            record(wave, hit, held=len(held), observed_by=watch.source,
                   arrived_at_decode=watch.arrived)
            struck = True
        if not any(s.open and not s.killed and s.first_token is None for s in mine) or loop.time() >= deadline:
            break
        await asyncio.sleep(OBSERVE_POLL_S)
    if not struck:  # every session got its first token (or ended) before the decode was seen holding it
        record(wave, nemesis.Strike(time.perf_counter(), time.time(), 0, None, None), held=0,
               observed_by=watch.source, arrived_at_decode=watch.arrived,
               detail=watch.arrivals.last_error or "no session was seen held at the decode before its first token")


async def _rst_cycle(plan: StormPlan, specs: list, states: dict, host: str, port: int,
                     watch: observer.KvObserver | None = None) -> list[dict]:
    loop = asyncio.get_running_loop()
    tasks: dict[str, asyncio.Task] = {}

    async def start_wave(wave_specs: list) -> None:
        for spec in wave_specs:
            request = client.request_bytes(host, port, spec.body())
            tasks[spec.rid] = loop.create_task(client.run_session(states[spec.rid], host, port, request,
                                                                  timeout_s=plan.session_timeout_s))
        await asyncio.sleep(0)

    def strike(wave_specs: list, held: set[str] | None = None):
        hit = nemesis.strike_rst([states[s.rid] for s in wave_specs], plan.phase, loop)
        for spec in wave_specs:
            if states[spec.rid].killed:
                tasks[spec.rid].cancel()
        return hit

    strikes = await _waves(plan, specs, states, start_wave, strike, watch)
    settle = loop.create_task(asyncio.sleep(plan.settle_s))  # the AbortReq lands ~2 s after a streamed close
    await asyncio.gather(*tasks.values(), return_exceptions=True)  # each ends by its own timeout at the latest
    await settle
    return strikes


async def _sigkill_cycle(plan: StormPlan, specs: list, states: dict, host: str, port: int,
                         watch: observer.KvObserver | None = None):
    clients = min(len(specs), SIGKILL_CLIENTS)
    groups = [specs[i::clients] for i in range(clients)]
    procs: dict[int, asyncio.subprocess.Process] = {}
    members: dict[int, list[client.SessionState]] = {}
    pids: dict[str, int] = {}
    readers = []
    script = str(Path(client.__file__).resolve())

    async def read(proc: asyncio.subprocess.Process) -> None:
        async for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            state = states.get(event.get("rid"))
            if state is None or state.killed:
                continue
            if event.get("end"):
                for key in ("invoked", "sent", "headers", "first_token", "ended", "tokens", "http_status",
                            "outcome", "detail", "phase"):
                    setattr(state, key, event.get(key))
            else:
                state.phase = event["phase"]
                if state.invoked is None:
                    state.invoked = time.time()
                stamp = {"sent": "sent", "waiting": "headers", "streaming": "first_token"}.get(event["phase"])
                if stamp:
                    setattr(state, stamp, event["t"])

    async def start_wave(wave_specs: list) -> None:
        wanted = {s.rid for s in wave_specs}
        for group in groups:
            mine = [s for s in group if s.rid in wanted]
            if not mine:
                continue
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", script, host, str(port), str(plan.session_timeout_s),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            procs[proc.pid] = proc
            members[proc.pid] = [states[s.rid] for s in mine]
            for spec in mine:
                pids[spec.rid] = proc.pid
                states[spec.rid].invoked = time.time()
            proc.stdin.write(json.dumps([[s.rid, s.body()] for s in mine]).encode())
            proc.stdin.close()
            readers.append(asyncio.get_running_loop().create_task(read(proc)))

    def strike(wave_specs: list, held: set[str] | None = None):
        if held is not None:  # phase kv: the processes holding a session the decode holds
            chosen = {pid: sts for pid, sts in members.items() if any(s.rid in held for s in sts)}
            return nemesis.strike_sigkill(chosen, plan.phase, held)
        wanted = {s.rid for s in wave_specs}
        wave_members = {pid: sts for pid, sts in members.items() if all(s.rid in wanted for s in sts)}
        return nemesis.strike_sigkill(wave_members, plan.phase)

    try:
        strikes = await _waves(plan, specs, states, start_wave, strike, watch)
        settle = asyncio.get_running_loop().create_task(asyncio.sleep(plan.settle_s))
        for proc in procs.values():
            try:
                await asyncio.wait_for(proc.wait(), timeout=plan.session_timeout_s + 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await asyncio.gather(*readers, return_exceptions=True)
        await settle
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    for state in states.values():
        if state.outcome is None:
            state.outcome, state.detail = "info", "the client process ended without reporting an outcome"
    return strikes, pids
