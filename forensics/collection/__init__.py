"""``fx.collect(inventory)`` (this package): every piece of live evidence about a deployment, in one go.

    evidence = fx.collect("inventory.toml", since="30m")     # or a twin: fx.collect(twin)
    fx.bundle.write(evidence, "incident-dir")
    fx.diagnose(evidence)

Probes and metrics sample in the background for a short window while, per engine and in
parallel, the collectors read its processes, /server_info and /v1/loads, settings, thread
dumps and logs. A piece that fails becomes a Gap; everything else is kept.
"""

from __future__ import annotations

from .run import DEFAULT_SAMPLE_S, CollectOptions, collect, collection_status

__all__ = ["DEFAULT_SAMPLE_S", "CollectOptions", "collect", "collection_status"]
