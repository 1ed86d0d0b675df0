"""sglang's log format, written by every twin process to its own log file.

``[%(asctime)s{prefix}] %(message)s`` with no level and no logger name, as
``sglang.srt.utils.configure_logger`` writes it (TP=1, no DP: empty prefix). The
process's stdout and stderr both go to the same file, as a scheduler's do under
a launcher, so a dying thread's CPython traceback lands between sglang's lines
exactly as printed.

The batch lines follow the release's format (facts §5.2): ``#prealloc-req`` up to
0.5.11, ``#bootstrap-req`` from 0.5.12; 0.5.23 adds ``#optimistic-req`` on the
prefill.
"""

from __future__ import annotations

import logging
import sys

from packaging.version import Version

SGLANG_FORMAT = "[%(asctime)s%(prefix)s] %(message)s"
# sglang's SGLANG_LOG_MS=1 adds the milliseconds after the seconds (facts §5.1); the twin honours it too.
SGLANG_FORMAT_MS = "[%(asctime)s.%(msecs)03d%(prefix)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
# Loggers whose DEBUG lines the twin keeps (the ABORT send line is DEBUG in sglang).
DEBUG_LOGGERS = ("sglang.srt.disaggregation",)


class _PrefixFilter(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        record.prefix = self.prefix
        return True


def configure(*, prefix: str = "", level: str = "info", disaggregation_debug: bool = True) -> None:
    """Route all logging to stderr in sglang's format (the launcher sends stderr to the log file)."""
    handler = logging.StreamHandler(sys.stderr)
    import os

    with_ms = os.environ.get("SGLANG_LOG_MS", "").strip().lower() in ("1", "true", "yes")
    handler.setFormatter(logging.Formatter(SGLANG_FORMAT_MS if with_ms else SGLANG_FORMAT, datefmt=DATE_FORMAT))
    handler.addFilter(_PrefixFilter(f" {prefix}" if prefix else ""))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    if disaggregation_debug:
        for name in DEBUG_LOGGERS:
            logging.getLogger(name).setLevel(logging.DEBUG)
    # Keep third-party chatter out of the sglang-format log.
    for noisy in ("aiohttp.access", "asyncio", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _bootstrap_label(version: str) -> str:
    return "#prealloc-req" if Version(version) < Version("0.5.12") else "#bootstrap-req"


def _header(kind: str, version: str) -> str:
    v = Version(version)
    if v < Version("0.5.4"):
        return f"{kind} batch."
    return f"{kind} batch,"


def prefill_batch_line(
    version: str,
    *,
    new_seq: int,
    new_token: int,
    token_usage: float,
    running_req: int,
    queue_req: int,
    bootstrap_req: int,
    inflight_req: int,
    input_throughput: float,
    cached_token: int = 0,
    pending_token: int = 0,
) -> str:
    """A prefill server's ``Prefill batch`` line in ``version``'s format."""
    optimistic = "#optimistic-req: 0, " if Version(version) >= Version("0.5.23") else ""
    return (
        f"{_header('Prefill', version)} #new-seq: {new_seq}, #new-token: {new_token}, "
        f"#cached-token: {cached_token}, token usage: {token_usage:.2f}, "
        f"#running-req: {running_req}, #queue-req: {queue_req}, #pending-token: {pending_token}, "
        f"{_bootstrap_label(version)}: {bootstrap_req}, #inflight-req: {inflight_req}, {optimistic}"
        f"cuda graph: False, input throughput (token/s): {input_throughput:.2f}"
    )


def decode_batch_line(
    version: str,
    *,
    running_req: int,
    num_tokens: int,
    token_usage: float,
    preallocated_usage: float,
    prealloc_req: int,
    transfer_req: int,
    gen_throughput: float,
    queue_req: int = 0,
    retracted_req: int = 0,
) -> str:
    """A decode server's ``Decode batch`` line in ``version``'s format."""
    return (
        f"{_header('Decode', version)} #running-req: {running_req}, #token: {num_tokens}, "
        f"token usage: {token_usage:.2f}, pre-allocated usage: {preallocated_usage:.2f}, "
        f"#prealloc-req: {prealloc_req}, #transfer-req: {transfer_req}, #retracted-req: {retracted_req}, "
        f"cuda graph: False, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue_req}"
    )
