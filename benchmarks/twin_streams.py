"""1,000 concurrent streams held open through the twin (router -> prefill + decode), on this machine.

    python -m benchmarks.twin_streams [--streams 1000] [--tokens 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

import aiohttp

import forensics.twin as twin_api


async def run(router: str, streams: int, tokens: int) -> list[dict]:
    open_now = 0
    peak = 0

    async def one(session: aiohttp.ClientSession, index: int) -> dict:
        nonlocal open_now, peak
        body = {"prompt": f"stream {index} " * 8, "max_tokens": tokens, "stream": True}
        started, got, intact = time.monotonic(), 0, None
        async with session.post(router + "/v1/completions", json=body) as response:
            open_now += 1
            peak = max(peak, open_now)
            async for raw in response.content:
                line = raw.decode().strip()
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "sglang_twin" in chunk:
                        intact = chunk["sglang_twin"]["kv_intact"]
                    else:
                        got += 1
            open_now -= 1
        return {"tokens": got, "intact": intact, "seconds": time.monotonic() - started}

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        results = await asyncio.gather(*(one(session, i) for i in range(streams)))
    print(f"peak streams open at once: {peak}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        twin = twin_api.up("0.5.15", directory=directory, decode_rate_tps=2.0)
        try:
            started = time.monotonic()
            results = asyncio.run(run(twin.router, args.streams, args.tokens))
            wall = time.monotonic() - started
        finally:
            twin.down()
    complete = sum(r["tokens"] == args.tokens and r["intact"] for r in results)
    print(f"{complete}/{args.streams} streams complete with KV intact in {wall:.1f}s wall on {os.cpu_count()} cores "
          f"({args.tokens} tokens each at 2 tokens/s)")


if __name__ == "__main__":
    main()
