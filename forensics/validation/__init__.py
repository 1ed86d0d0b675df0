"""The validation campaign (docs/validate.md): storm cycles plus checks, each PASS, FAIL or INCONCLUSIVE.

* :mod:`~forensics.validation.checks`: :class:`Check` and the four checks after each cycle
  (liveness, logs, threads, metrics);
* :mod:`~forensics.validation.campaign`: :func:`validate`, the run (optional deploy, then N cycles);
* :mod:`~forensics.validation.result`: :class:`Campaign`, which renders, gives frames and saves itself;
* :mod:`~forensics.validation.ab`: :func:`compare`, the same campaign against two deployments.

The package is not named ``validate`` so that ``fx.validate(...)`` can be the function.
"""

from __future__ import annotations

from .ab import Comparison, compare
from .campaign import run_checks, validate
from .checks import CHECKS, FAIL, INCONCLUSIVE, PASS, STATUSES, Check
from .result import Campaign, CycleReport

__all__ = ["CHECKS", "FAIL", "INCONCLUSIVE", "PASS", "STATUSES", "Campaign", "Check", "Comparison", "CycleReport",
           "compare", "run_checks", "validate"]
