"""The twin checked against the real engine: capture both surfaces, report every difference.

    from forensics import fidelity
    report = fidelity.check("0.5.15", real="tests/data/real-engine-0.5.15/capture.json")
    report.frame()        # one row per difference (aspect, role, item, kind, real, twin, allowed)
    print(report)         # the same for an 80-column terminal

``capture`` takes a side's surface, ``compare`` diffs two captures, ``allowed`` holds the
differences a CPU twin may keep (each with its reason), ``scenario`` drives the events.
"""

from forensics.fidelity.allowed import ALLOWED, Allowed
from forensics.fidelity.capture import Capture, CaptureError, RoleTarget, Target, capture_deployment
from forensics.fidelity.check import check
from forensics.fidelity.compare import Difference, FidelityReport, compare

__all__ = ["ALLOWED", "Allowed", "Capture", "CaptureError", "Difference", "FidelityReport", "RoleTarget", "Target",
           "capture_deployment", "check", "compare"]
