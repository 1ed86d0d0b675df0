"""The storm's nemesis at scale: 1,000 streaming sessions open through the twin's router, then reset.

    python -m benchmarks storm_reset [--sessions 1000] [--no-write]

A patched 0.5.15 twin with fast rates (prefill 1,000,000 tokens/s, decode 1 iteration/s, so
each stream stays open and quiet); ``--sessions`` streaming chat completions (8 prompt tokens,
100,000 output tokens) opened in-process by the storm's raw-socket client; a session counts as
open when its request was sent and its first streamed token came back. Then one kill signal:
the nemesis resets every socket (SO_LINGER {1, 0} then close: an RST). Reported: how long the
sessions took to open, the spread of the resets (first to last) and the time from the signal
to the last reset, and how many disconnects the router counted afterwards.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._results import benchmark_parser, publish

BENCHMARK = "1,000 streaming sessions open through the twin's router, all reset (RST) within 100 ms"
SECTION_START = "<!-- storm-reset:start -->"
SECTION_END = "<!-- storm-reset:end -->"
TWIN_SETTINGS = {"prefill_rate_tps": 1_000_000.0, "decode_rate_tps": 1.0, "decode_log_interval": 1000}
OPEN_TIMEOUT_S = 120.0


async def _storm(router: str, sessions: int) -> dict:
    from forensics.storm import client, generator, nemesis

    host, port = generator.router_address(router)
    loop = asyncio.get_running_loop()
    specs = generator.plan_sessions(sessions, cycle=1, storm=generator.storm_id(), prompt_tokens=8,
                                    max_tokens=100_000)
    states = [client.SessionState(rid=spec.rid) for spec in specs]
    started = time.perf_counter()
    tasks = [loop.create_task(client.run_session(state, host, port, client.request_bytes(host, port, spec.body()),
                                                 timeout_s=OPEN_TIMEOUT_S + 60))
             for spec, state in zip(specs, states, strict=True)]
    deadline = started + OPEN_TIMEOUT_S
    while time.perf_counter() < deadline:
        if all(s.phase == "streaming" or not s.open for s in states):
            break
        await asyncio.sleep(0.05)
    open_s = time.perf_counter() - started
    streaming = sum(s.open and s.phase == "streaming" for s in states)
    failures = sorted({s.detail for s in states if s.outcome == "fail"})
    strike = nemesis.strike_rst(states, "stream", loop)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"sessions": sessions, "streaming": streaming, "open_s": open_s, "killed": strike.killed,
            "spread_s": strike.spread_s, "after_signal_s": strike.after_signal_s, "failures": failures[:3],
            "phases": {p: sum(s.phase_at_kill == p for s in states) for p in ("sent", "waiting", "streaming")}}


def _router_disconnects(twin) -> int:
    return int(twin.server_info("router")["counters"]["client_disconnects"])


def measure(sessions: int) -> dict:
    import forensics.twin as twin_api

    with tempfile.TemporaryDirectory() as directory:
        twin = twin_api.up("0.5.15", patched=True, directory=Path(directory) / "twin", **TWIN_SETTINGS)
        try:
            before = _router_disconnects(twin)
            result = asyncio.run(_storm(twin.router, sessions))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and _router_disconnects(twin) - before < result["killed"]:
                time.sleep(0.1)
            result["router_disconnects"] = _router_disconnects(twin) - before
            result["router_seen_s"] = round(20 - max(0.0, deadline - time.monotonic()), 1)
        finally:
            twin.down()
    return result


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds:.1f} ms"


def section(result: dict) -> str:
    load = os.getloadavg()
    within = result["after_signal_s"] is not None and result["after_signal_s"] <= 0.1
    lines = [
        SECTION_START,
        "## Storm: 1,000 sessions reset at once",
        "",
        f"`python -m benchmarks storm_reset` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; {os.cpu_count()} CPUs).",
        "",
        f"- {result['sessions']} streaming chat completions through a patched 0.5.15 twin's router, opened "
        f"in-process: **{result['streaming']}** open (request sent, first streamed token back) after "
        f"**{result['open_s']:.1f} s**" + (f"; failures: {'; '.join(result['failures'])}" if result["failures"] else "")
        + ".",
        f"- one kill signal, every socket reset (SO_LINGER {{1, 0}}, close: RST): **{result['killed']}** sockets, "
        f"spread (first to last reset) **{_ms(result['spread_s'])}**, signal to last reset "
        f"**{_ms(result['after_signal_s'])}** ({'within' if within else 'NOT within'} the 100 ms target).",
        f"- the router counted {result['router_disconnects']} client disconnects within {result['router_seen_s']} s.",
        SECTION_END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("storm_reset", BENCHMARK)
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args(argv)
    result = measure(args.sessions)
    text = section(result)
    publish(text, SECTION_START, SECTION_END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
