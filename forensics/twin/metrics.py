"""Prometheus metrics with sglang's names, types and labels for one release, read from its source.

Which families exist, their type, documentation, label names and (literal) buckets come
from the release's own collector code (:mod:`forensics.sglang_metrics`), never from a
table here. The twin registers exactly what a default PD engine of that release registers
with ``--enable-metrics``: every unconditional declaration of the scheduler and tokenizer
collectors and of the HTTP middleware. Declarations under an ``if`` (LoRA, HiCache,
streaming sessions, token histograms, ...) are left out, as a default engine leaves them
out; exporting them would be as wrong as a hand table.

Families the twin has nothing honest to put in (grammar, speculative decoding, cache hit
rate, ...) are still exported, at prometheus_client's zero value: a real engine of the
release shows them too, and a reader's "is this metric in this release?" must get the
release's answer. Families whose labels are all the collector's labels get their one
child at start (zero); families with a per-observation label (``stage``, ``mode``,
``endpoint``...) show samples only once the twin observes one, as in prometheus_client.

Each twin server owns one registry. Gauges are written only where sglang writes them
(after a batch, on the 30 s idle tick of a fully idle scheduler), counters where sglang
moves them (immediately), so the twin's ``/metrics`` freezes and moves like a real
engine's during a wedge.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest

from forensics.sglang_metrics import MetricSpec, ReleaseMetrics, release_metrics

CLASSES = {"gauge": Gauge, "counter": Counter, "histogram": Histogram, "summary": Summary}
# Names sglang gave one family over the releases (collectors/renames.toml has the same facts for
# readers); the twin writes whichever the release declares.
BOOTSTRAP_QUEUE = ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_prealloc_queue_reqs")
INFLIGHT_QUEUE = ("sglang:num_prefill_inflight_queue_reqs", "sglang:num_prefill_infight_queue_reqs")


class _Absent:
    """A metric the release does not declare: every write is dropped, nothing is exported."""

    def labels(self, *args, **kwargs) -> _Absent:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass

    def __bool__(self) -> bool:
        return False


ABSENT = _Absent()


class TwinMetrics:
    """The metric families a prefill or decode engine (scheduler, tokenizer, HTTP) of ``version`` exports."""

    def __init__(self, version: str, engine_type: str, model_name: str = "twin-synthetic") -> None:
        self.version = version
        self.engine_type = engine_type
        self.release: ReleaseMetrics = release_metrics(version)
        self.registry = CollectorRegistry()
        # The label values of one TP=1, PP=1, no-DP engine; ``is_streaming`` (0.5.17+ tokenizer
        # counters) is per request in sglang: the twin's call sites do not say, and its clients
        # do not stream by default.
        self._values = {"model_name": model_name, "engine_type": engine_type, "tp_rank": "0", "pp_rank": "0",
                        "moe_ep_rank": "0", "is_streaming": "false"}
        self.families: dict[str, object] = {}
        self.specs: dict[str, MetricSpec] = {}
        for spec in self.release.registered():
            self.specs[spec.name] = spec
            self.families[spec.name] = self._register(spec)

        self.num_running_reqs = self._child("sglang:num_running_reqs")
        self.num_queue_reqs = self._child("sglang:num_queue_reqs")
        self.token_usage = self._child("sglang:token_usage")
        self.gen_throughput = self._child("sglang:gen_throughput")
        self.prefill_bootstrap_queue = self._child(*BOOTSTRAP_QUEUE)
        self.prefill_inflight_queue = self._child(*INFLIGHT_QUEUE)
        self.decode_prealloc_queue = self._child("sglang:num_decode_prealloc_queue_reqs")
        self.decode_transfer_queue = self._child("sglang:num_decode_transfer_queue_reqs")
        self.bootstrap_failed = self._child("sglang:num_bootstrap_failed_reqs_total")
        self.transfer_failed = self._child("sglang:num_transfer_failed_reqs_total")
        # Gauges in 0.5.2 - 0.5.9, histograms from 0.5.10, absent in 0.5.1: observe_transfer asks the spec.
        self.kv_transfer_latency_ms = self._child("sglang:kv_transfer_latency_ms")
        self.kv_transfer_speed = self._child("sglang:kv_transfer_speed_gb_s")
        self.kv_transfer_total_mb = self._child("sglang:kv_transfer_total_mb")
        self.kv_transfer_bootstrap_ms = self._child("sglang:kv_transfer_bootstrap_ms")
        per_stage = self.release.find("sglang:per_stage_req_latency_seconds", collector="scheduler")
        self.per_stage = self.families[per_stage.name] if per_stage else ABSENT
        self._stage_labels = self._bound(per_stage) if per_stage else {}
        # Tokenizer-manager collector.
        self.num_requests = self._child("sglang:num_requests_total")
        self.num_aborted = self._child("sglang:num_aborted_requests_total")
        self.prompt_tokens = self._child("sglang:prompt_tokens_total")
        self.generation_tokens = self._child("sglang:generation_tokens_total")
        self.e2e_latency = self._child("sglang:e2e_request_latency_seconds")
        self.ttft = self._child("sglang:time_to_first_token_seconds")
        # HTTP middleware (in the source from 0.5.7; the active gauge from 0.5.10). None when the
        # release has no middleware metrics, so the twin's middleware skips counting altogether.
        requests = self.release.find("sglang:http_requests_total", collector="http")
        self.http_requests = self.families[requests.name] if requests else None
        self.http_responses = self._family("sglang:http_responses_total") if requests else None
        self.http_active = self._family("sglang:http_requests_active") if requests else None

    # ------------------------------------------------------------------ building

    def _register(self, spec: MetricSpec):
        kwargs = {"registry": self.registry}
        if spec.kind == "histogram" and spec.buckets:
            # sglang's literal buckets; where it computes them (from server args or a helper) the
            # twin keeps prometheus_client's defaults: the family, type and labels still match.
            kwargs["buckets"] = spec.buckets
        metric = CLASSES[spec.kind](spec.name, spec.documentation, spec.labelnames, **kwargs)
        if spec.labelnames and set(spec.labelnames) <= set(self._values):
            metric.labels(**self._bound(spec))  # the one child a single-rank engine writes: exported at 0
        return metric

    def _bound(self, spec: MetricSpec) -> dict[str, str]:
        return {name: self._values[name] for name in spec.labelnames if name in self._values}

    def _family(self, *names: str):
        spec = self.release.find(*names)
        return self.families[spec.name] if spec else ABSENT

    def _child(self, *names: str):
        """The release's metric by any of its names, bound to this engine's labels; ABSENT if undeclared."""
        spec = self.release.find(*names)
        if spec is None:
            return ABSENT
        family = self.families[spec.name]
        return family.labels(**self._bound(spec)) if spec.labelnames else family

    def kind(self, *names: str) -> str | None:
        spec = self.release.find(*names)
        return spec.kind if spec else None

    # ------------------------------------------------------------------ writing

    def observe_stage(self, stage: str, seconds: float) -> None:
        if self.per_stage is not ABSENT:
            self.per_stage.labels(**self._stage_labels, stage=stage).observe(seconds)

    def observe_transfer(self, latency_s: float, nbytes: int, bootstrap_s: float | None) -> None:
        """Record one finished KV transfer the way ``compute_and_observe_kv_transfer_metrics`` does:
        ``set`` where the release declares a gauge, ``observe`` where it declares a histogram."""
        latency_ms = latency_s * 1000
        values = [("sglang:kv_transfer_latency_ms", self.kv_transfer_latency_ms, latency_ms),
                  ("sglang:kv_transfer_speed_gb_s", self.kv_transfer_speed, nbytes / max(latency_s, 1e-9) / 1e9),
                  ("sglang:kv_transfer_total_mb", self.kv_transfer_total_mb, nbytes / 1e6)]
        if bootstrap_s is not None:
            values.append(("sglang:kv_transfer_bootstrap_ms", self.kv_transfer_bootstrap_ms, bootstrap_s * 1000))
        for name, child, value in values:
            kind = self.kind(name)
            if kind == "gauge":
                child.set(value)
            elif kind in ("histogram", "summary"):
                child.observe(value)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
