"""Which rows of a metrics frame are the PD queue gauges the report draws and describes.

A gauge is what its page's ``# TYPE`` line says is a gauge (the frame's ``type`` column), never
what its name suggests: histogram ``_bucket``/``_sum``/``_count`` samples and ``_created``
timestamps (about 1.8e9) also carry "queue" or "bootstrap" in their names, and reading them as
queue depths made the report call a timestamp a frozen queue.
"""

from __future__ import annotations

import pandas as pd

QUEUE_WORDS = "queue|bootstrap"


def queue_gauge_rows(metrics: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows of ``metrics`` (a samples frame) that are queue gauges; None when the frame cannot
    say (no ``metric_canonical`` or no ``type`` column)."""
    if metrics is None or "metric_canonical" not in metrics or "type" not in metrics:
        return None
    named = metrics["metric_canonical"].astype(str).str.contains(QUEUE_WORDS)
    typed = metrics["type"].astype(str) == "gauge"
    return metrics[named & typed]
