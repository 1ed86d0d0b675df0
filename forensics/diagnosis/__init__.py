"""The diagnosis: Evidence in, one Verdict out (HEALTHY, WEDGED, DEGRADED, DOWN, INCONCLUSIVE).

    verdict = fx.diagnose(evidence)          # or fx.diagnose(bundle="DIR"), fx.diagnose(inventory="inv.toml")
    verdict.verdict, verdict.reasons, verdict.kill_chain, verdict.signals

It never collects (``forensics.collect`` does), so a live deployment and a bundle read
from disk give the same verdict for the same evidence. The rules are in docs/diagnosis.md.
"""

from __future__ import annotations

from .rules import WEDGE_SOURCES, decide
from .signals import Signal, extract_signals
from .verdict import VERDICTS, Verdict

__all__ = ["VERDICTS", "WEDGE_SOURCES", "Signal", "Verdict", "decide", "extract_signals"]
