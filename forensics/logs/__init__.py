"""Log forensics: sglang PD logs, journals and stderr turned into a typed incident timeline.

    import forensics as fx
    scan = fx.logs.scan(["prefill.log", "decode.log"], tz="UTC")
    scan.events        # signature events (schema.EVENT_COLUMNS)
    scan.batches       # numeric "Prefill batch"/"Decode batch" history
    scan.summary()     # first thread death, its trigger, rooms affected, last real prefill batch

Logs that live on a host (a unit's journal, a file, a command's output) are streamed in
with ``host_log_source(host, kind, value, role=...)`` or ``scan_hosts([...])``
(``forensics.logs.remote``; loaded on first use, it brings paramiko).
"""

from __future__ import annotations

import importlib
from typing import Any

from forensics.logs.catalogue import signatures
from forensics.logs.counting import count_signatures, grep_patterns
from forensics.logs.sources import LogSource, Problem
from forensics.logs.timeline import LogScan, batch_stats, scan, summary, timeline

_LAZY = {"host_log_source": "forensics.logs.remote", "scan_hosts": "forensics.logs.remote",
         "write_journal": "forensics.logs.journal_write"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LogScan", "LogSource", "Problem", "batch_stats", "count_signatures", "grep_patterns",
           "host_log_source", "scan", "scan_hosts", "signatures", "summary", "timeline", "write_journal"]
