"""The differences between the twin and the real engine that are allowed, each with its reason.

One place: the check (:mod:`forensics.fidelity.compare`) marks a difference allowed only when an
entry here matches it, and ``docs/fidelity.md`` lists the same entries. Only what a CPU engine
of this project cannot show, or what depends on the run rather than the engine, is here; every
other difference is a bug of the twin (or of a reader) and is reported.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True)
class Allowed:
    aspect: str  # "metrics", "endpoints", "processes", "threads", "logs", "generate"
    item: str  # fnmatch pattern over the difference's item
    reason: str
    role: str = "*"
    kind: str = "*"  # "missing" (the twin lacks it), "extra" (the twin has it), "different", ...

    def matches(self, aspect: str, role: str, item: str, kind: str) -> bool:
        return (aspect == self.aspect and fnmatch.fnmatchcase(role, self.role)
                and fnmatch.fnmatchcase(item, self.item) and fnmatch.fnmatchcase(kind, self.kind))


ALLOWED: tuple[Allowed, ...] = (
    Allowed("logs", "waiting_timeout: prefill_bootstrap_aborted", "the router, not the engine: the twin's router "
            "answers at the decode's failure and closes the prefill's request (as sglang's Rust PD router does), "
            "so the twin's prefill logs sglang's own abort line; sglang-router 0.3.2's mini_lb keeps waiting on the "
            "prefill, whose room never times out on 0.5.15", role="prefill", kind="extra"),
    Allowed("metrics", "sglang:num_bootstrap_failed_reqs_total", "the same router difference: when the twin's "
            "router closes the prefill's request at the decode's waiting timeout, the twin's prefill fails the room's "
            "bootstrap and counts it, as sglang does (observability/metrics_collector.py, "
            "increment_bootstrap_failed_reqs); mini_lb keeps waiting, so the real prefill's labelled counter never "
            "gets its first write and multiprocess mode leaves the family off the page", role="prefill", kind="extra"),
    Allowed("processes", "the process serving the URL", "the twin's front (forensics.twin.role_tree) runs as "
            "`python -m forensics.twin.<role>`, the command line `twin down`, a restart and a reader of `ps` know it "
            "by; it takes launch_server's place: it listens on the role's URL and its children are the scheduler, "
            "the detokenizer and the resource tracker; its threads are compared with launch_server's",
            kind="different"),
    Allowed("threads", "python -m sglang.launch_server: AnyIO worker thread", "uvicorn runs FastAPI's synchronous "
            "endpoints on AnyIO's worker threads in sglang's HTTP process; the twin's front serves no endpoint "
            "itself (it hands each connection to its scheduler, which answers on its event loop)", kind="missing"),
    Allowed("threads", "sglang::scheduler: tqdm_monitor", "tqdm's monitor thread, started by the progress bar of "
            "sglang's weight loading ('Multi-thread loading shards'); the twin's scheduler loads no weights",
            kind="missing"),
    Allowed("generate", "/generate meta_info", "the twin's own instrumentation: kv_bytes, kv_intact and "
            "bootstrap_room prove the KV pages arrived intact (tests and benchmarks read them); they are added, "
            "never in place of a key the real engine writes", kind="extra-keys"),
)


def allowed_reason(aspect: str, role: str, item: str, kind: str) -> str | None:
    for entry in ALLOWED:
        if entry.matches(aspect, role, item, kind):
            return entry.reason
    return None
