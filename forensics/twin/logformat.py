"""sglang's log format, written by every twin process to its own log file.

The line format (``[%(asctime)s{ms}{prefix}] %(message)s``, no level, no logger name) and the
periodic batch lines are the release's own, read from its source by the one formatter the
incident generator uses too (:mod:`forensics.logs.sglang_format`). TP=1, no DP: the prefix is
empty. The process's stdout and stderr both go to the same file, as a scheduler's do under a
launcher, so a dying thread's CPython traceback lands between sglang's lines exactly as printed.
"""

from __future__ import annotations

import logging
import os
import sys

from forensics.logs import sglang_format

# Loggers whose DEBUG lines the twin keeps (the ABORT send line is DEBUG in sglang).
DEBUG_LOGGERS = ("sglang.srt.disaggregation",)
DEFAULT_VERSION = "0.5.15"  # a process started without a release (tests of the logging alone)
# The twin runs on a CPU, as real sglang does here: its batch lines say "cpu graph: False" where the
# release labels the graph backend by device (0.5.15's metrics reporter), "cuda graph" where it does not.
DEVICE = "cpu"


class _PrefixFilter(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        record.prefix = self.prefix
        return True


def _formatter(version: str | None) -> logging.Formatter:
    fmt = sglang_format.log_format(version or DEFAULT_VERSION)
    with_ms = os.environ.get("SGLANG_LOG_MS", "").strip().lower() in ("1", "true", "yes")
    return logging.Formatter(fmt.logging_format(with_ms), datefmt=fmt.datefmt)


def configure(*, prefix: str = "", level: str = "info", disaggregation_debug: bool = True,
              version: str | None = None) -> None:
    """Route all logging to stderr in ``version``'s format (the launcher sends stderr to the log file).

    ``SGLANG_LOG_MS=1`` adds milliseconds only where the release's ``configure_logger`` reads it
    (from 0.5.6); older releases ignore it, and so does their twin.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(version))
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


def line(message: str) -> str:
    """``message`` as one log line of this process, timestamped like its sglang lines.

    For what the twin writes outside ``logging`` (its lifeline's last word, which may come before
    :func:`configure` has run: then in the default release's format). A line in no known format
    would be a gap in every later collection of this log, since no window can place it.
    """
    configured = next((h.formatter for h in logging.getLogger().handlers if h.formatter is not None), None)
    record = logging.LogRecord("forensics.twin", logging.WARNING, __file__, 0, message, None, None)
    record.prefix = ""
    return (configured or _formatter(None)).format(record)


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
    """A prefill server's ``Prefill batch`` line in ``version``'s format (a CPU engine: no graph)."""
    return sglang_format.prefill_batch_line(
        version, new_seq=new_seq, new_token=new_token, token_usage=token_usage, running_req=running_req,
        queue_req=queue_req, bootstrap_req=bootstrap_req, inflight_req=inflight_req,
        input_throughput=input_throughput, cached_token=cached_token, pending_token=pending_token, cuda_graph=False,
        device=DEVICE)


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
    return sglang_format.decode_batch_line(
        version, running_req=running_req, token=num_tokens, token_usage=token_usage,
        pre_allocated_usage=preallocated_usage, prealloc_req=prealloc_req, transfer_req=transfer_req,
        gen_throughput=gen_throughput, queue_req=queue_req, retracted_req=retracted_req, cuda_graph=False,
        device=DEVICE)
