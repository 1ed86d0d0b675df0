"""Soak the PATCHED NIXL bootstrap loop with hostile traffic, and find what kills the UNPATCHED one.

For each release: one engine sandbox running the patched ``nixl/conn.py``; frames from the
seeded :class:`~patched_engine.fuzz.HostileFrames` generator (random tags, truncated,
empty, non-ASCII, oversize, malformed ABORT, staging tags, garbage registrations, mutated
transfer infos) with one well-formed transfer info for a fresh room in every ten frames,
sent in batches straight to the loop's PULL socket; after each batch: settle, thread
alive?, every well-formed room WaitingForInput? Reports frames/s, deaths, rooms not
bootstrapped. Then the same generator against the UNPATCHED file of ``--unpatched``
releases until the thread dies, naming the first killing frame.

    python -m benchmarks.fuzz_soak [--frames 100000] [--sglang 0.5.15 0.5.23] [--unpatched 0.5.23]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from forensics.sandbox import EngineSandbox
from forensics.sglang_source import fetch
from patched_engine.fuzz import FuzzSession, HostileFrames
from patched_engine.verify import patched_file_for

BENCHMARK = "fuzz soak: 100,000 hostile frames per patched release; first killing frame of the unpatched one"


def soak(version: str, *, patched: bool, frames: int, batch: int, seed: int, well_formed_every: int = 10) -> dict:
    source = fetch(version)
    conn = patched_file_for(source, source.backend_file("nixl"))[0] if patched else None
    with EngineSandbox(source, conn_file=conn) as sandbox:
        session = FuzzSession(sandbox)
        generator = HostileFrames(session.template, seed=seed)
        order = random.Random(seed + 1)
        not_bootstrapped: dict[int, int | None] = {}
        alive = True
        started = time.perf_counter()
        while session.sent < frames and alive:
            rooms = session.fresh_rooms(max(1, batch // well_formed_every))
            pending = list(rooms)
            for _ in range(batch - len(rooms)):
                if pending and order.random() < 1 / well_formed_every:
                    session.send("well-formed", session.well_formed(pending.pop()))
                else:
                    session.send(*generator.frame())
            for room in pending:
                session.send("well-formed", session.well_formed(room))
            alive = session.settle(timeout=300)
            if alive:
                not_bootstrapped.update(session.rooms_not_bootstrapped(rooms))
        elapsed = time.perf_counter() - started
        exceptions = sandbox.exceptions()
        session.close()
    tally = session.tally
    return {
        "release": version,
        "file": "patched" if patched else "unpatched",
        "frames": tally.frames,
        "seconds": round(elapsed, 2),
        "frames_per_s": round(tally.frames / elapsed, 1),
        "deaths": tally.deaths,
        "thread_exceptions": len(exceptions),
        "well_formed_rooms": len(tally.well_formed_rooms),
        "rooms_not_bootstrapped": len(not_bootstrapped),
        "first_killing_frame": tally.first_killing_frame,
        "by_kind": tally.by_kind,
    }


def kill_table(version: str, *, seed: int) -> dict[str, str]:
    """One fresh UNPATCHED sandbox per hostile kind, one frame of that kind: what does it do to the loop?"""
    from patched_engine.fuzz import KINDS

    source = fetch(version)
    outcome = {}
    for kind in KINDS:
        with EngineSandbox(source) as sandbox:
            session = FuzzSession(sandbox)
            session.send(*HostileFrames(session.template, seed=seed).frame(kind))
            if session.settle(timeout=60):
                outcome[kind] = "survives"
            else:
                outcome[kind] = f"dies: {session.tally.first_killing_frame['exception'][:90]}"
            session.close()
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sglang", nargs="*", default=["0.5.15", "0.5.23"], help="releases soaked patched")
    parser.add_argument("--unpatched", nargs="*", default=["0.5.23"], help="releases run unpatched until death")
    parser.add_argument("--kill-table", nargs="*", default=[], metavar="RELEASE",
                        help="also: one unpatched sandbox per hostile kind, does one frame kill the loop?")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    tables = {v: kill_table(v, seed=args.seed) for v in args.kill_table}

    results = [soak(v, patched=True, frames=args.frames, batch=args.batch, seed=args.seed) for v in args.sglang]
    results += [soak(v, patched=False, frames=args.frames, batch=args.batch, seed=args.seed) for v in args.unpatched]
    if args.json:
        print(json.dumps({"load_average": os.getloadavg(), "results": results, "kill_tables": tables}, indent=2))
    else:
        print(f"load average {os.getloadavg()}")
        for r in results:
            print(
                f"sglang {r['release']:8} {r['file']:9} frames {r['frames']:>7} in {r['seconds']:>8.1f} s "
                f"= {r['frames_per_s']:>7.1f}/s  deaths {r['deaths']}  well-formed rooms {r['well_formed_rooms']} "
                f"(not bootstrapped: {r['rooms_not_bootstrapped']})"
            )
            if r["first_killing_frame"]:
                print(f"    first killing frame: {json.dumps(r['first_killing_frame'])}")
        for version, table in tables.items():
            print(f"unpatched sglang {version}, one frame of each kind:")
            for kind, result in table.items():
                print(f"    {kind:24} {result}")
    patched_ok = all(r["deaths"] == 0 and r["rooms_not_bootstrapped"] == 0 for r in results if r["file"] == "patched")
    return 0 if patched_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
