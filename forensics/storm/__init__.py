"""The abort storm, in Jepsen's terms (docs/storm.md).

* :mod:`~forensics.storm.generator`: N concurrent streaming chat completions, in waves, each with its rid;
* :mod:`~forensics.storm.nemesis`: kills the clients at a chosen phase (RST in-process, or SIGKILL);
* :mod:`~forensics.storm.client`: one session over a raw socket (standard library only);
* :mod:`~forensics.storm.history`: one row per op, ok / fail / info;
* :mod:`~forensics.storm.checker`: the live diagnosis after each cycle, and which decode queue each abort hit;
* :mod:`~forensics.storm.runner`: :func:`run_storm`, returning a :class:`StormResult`.
"""

from __future__ import annotations

from .history import HISTORY_COLUMNS
from .nemesis import MODES, PHASES
from .plan import ConfirmationNeeded, StormPlan
from .result import CycleResult, StormResult
from .runner import make_plan, run_storm

__all__ = ["HISTORY_COLUMNS", "MODES", "PHASES", "ConfirmationNeeded", "CycleResult", "StormPlan", "StormResult",
           "make_plan", "run_storm"]
