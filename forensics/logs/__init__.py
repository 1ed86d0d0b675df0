"""Log forensics: sglang PD logs, journals and stderr turned into a typed incident timeline.

    import forensics as fx
    scan = fx.logs.scan(["prefill.log", "decode.log"], tz="UTC")
    scan.events        # signature events (schema.EVENT_COLUMNS)
    scan.batches       # numeric "Prefill batch"/"Decode batch" history
    scan.summary()     # first thread death, its trigger, rooms affected, last real prefill batch
"""

from forensics.logs.catalogue import signatures
from forensics.logs.counting import count_signatures, grep_patterns
from forensics.logs.sources import LogSource, Problem
from forensics.logs.timeline import LogScan, batch_stats, scan, summary, timeline

__all__ = ["LogScan", "LogSource", "Problem", "batch_stats", "count_signatures", "grep_patterns", "scan",
           "signatures", "summary", "timeline"]
