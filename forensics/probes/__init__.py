"""Health and liveness probes that never cause the wedge they look for (docs/probes.md).

    results = fx.probes.probe_once(twin)                 # one round, every target and kind
    with fx.probes.ProbeRunner(twin, interval_s=1.0) as runner:
        ...
    runner.results().frame                               # the ``probes`` Evidence frame
    runner.results().findings()                          # health_lies, liveness_failing, ...

A probe is never closed early: its deadline only marks it late (see :mod:`forensics.probes.runner`).
"""

from forensics.probes.calls import DEFAULT_LIVENESS_TEXT, RID_PREFIX
from forensics.probes.findings import ProbeFinding
from forensics.probes.results import ProbeResults
from forensics.probes.runner import ProbeRunner, probe_once
from forensics.probes.schema import DEFAULT_CAP_S, DEFAULT_DEADLINES_S, KINDS, OUTCOMES, PROBES_SCHEMA
from forensics.probes.targets import Target, targets_from

__all__ = [
    "DEFAULT_CAP_S",
    "DEFAULT_DEADLINES_S",
    "DEFAULT_LIVENESS_TEXT",
    "KINDS",
    "OUTCOMES",
    "PROBES_SCHEMA",
    "RID_PREFIX",
    "ProbeFinding",
    "ProbeResults",
    "ProbeRunner",
    "Target",
    "probe_once",
    "targets_from",
]
