"""One command on many hosts at once: per-host results, no host waits for another.

Each host's run is bounded by its own deadline (connect timeout + command timeout +
grace), so a dead or hanging host costs its own deadline and nothing more: ``run_many``
returns the results in the hosts' order, ``iter_many`` yields each one as it arrives.
An exception from one host (a refused host key, failed authentication) becomes that
host's ``error`` result and never stops the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from .base import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, Host
from .result import CommandResult, State

MAX_WORKERS = 64


Argv = Sequence[str] | Callable[[Host], Sequence[str]]


def _one(host: Host, argv: Argv, timeout: float, sudo: bool, max_bytes: int | None) -> CommandResult:
    start = time.monotonic()
    try:
        if callable(argv):
            argv = argv(host)
        return host.run(argv, timeout=timeout, sudo=sudo, max_bytes=max_bytes)
    except Exception as exc:  # noqa: BLE001 - one host's problem is its own result
        return CommandResult(
            getattr(host, "name", repr(host)), tuple(argv) if not callable(argv) else (), State.ERROR, duration_s=time.monotonic() - start,
            error=f"{type(exc).__name__}: {' '.join(str(exc).split())}",
        )


def iter_many(
    hosts: Sequence[Host],
    argv: Argv,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    sudo: bool = False,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    max_workers: int = MAX_WORKERS,
) -> Iterator[tuple[int, CommandResult]]:
    """``(index, result)`` pairs in the order the hosts finish.

    ``argv`` is one argument list for every host, or a function giving each host its own.
    """
    argv = argv if callable(argv) else list(argv)
    if not hosts:
        return
    with ThreadPoolExecutor(max_workers=min(max_workers, len(hosts)), thread_name_prefix="fx-fanout") as pool:
        futures = {pool.submit(_one, h, argv, timeout, sudo, max_bytes): i for i, h in enumerate(hosts)}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def run_many(
    hosts: Sequence[Host],
    argv: Argv,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    sudo: bool = False,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    max_workers: int = MAX_WORKERS,
) -> list[CommandResult]:
    """One result per host, in the hosts' order."""
    results: list[CommandResult | None] = [None] * len(hosts)
    for i, result in iter_many(hosts, argv, timeout=timeout, sudo=sudo, max_bytes=max_bytes, max_workers=max_workers):
        results[i] = result
    return results  # type: ignore[return-value]
