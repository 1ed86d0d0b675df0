"""``fx.diagnose``: a verdict from evidence, a bundle folder, or a live inventory.

A composition above both halves it joins: the bundle reader or the collection gives the
Evidence, :func:`forensics.diagnosis.decide` the verdict. The diagnosis itself never collects.
"""

from __future__ import annotations

from typing import Any

from forensics.diagnosis import Verdict, decide
from forensics.evidence import Evidence
from forensics.exitcodes import UsageProblem


def diagnose(evidence: Evidence | None = None, *, inventory: Any = None, bundle: Any = None,
             **collect_options: Any) -> Verdict:
    """The verdict on ``evidence``; or on a bundle folder (``bundle=``); or, live, on an
    inventory or twin (``inventory=``: collected first with ``collect_options``).

    Example: ``fx.diagnose(bundle="incident-2026-11-30").verdict``
    """
    given = [x is not None for x in (evidence, inventory, bundle)]
    if sum(given) != 1:
        raise UsageProblem("diagnose needs exactly one of: evidence, inventory=, bundle=")
    if bundle is not None:
        from forensics.bundle import open_bundle

        evidence = open_bundle(bundle)
    elif inventory is not None:
        from forensics.collection import collect

        evidence = collect(inventory, **collect_options)
    return decide(evidence)
