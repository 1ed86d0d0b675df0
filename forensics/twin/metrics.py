"""Prometheus metrics with sglang's names, types and labels for one release (facts §4).

Each twin server owns one registry. Gauges are written only where sglang writes
them (after a batch, on the 30 s idle tick of a fully idle scheduler), counters
where sglang moves them (immediately), so the twin's ``/metrics`` freezes and
moves like a real engine's during a wedge.
"""

from __future__ import annotations

from packaging.version import Version
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")
LATENCY_MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
BOOTSTRAP_MS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
SPEED_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 400)
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class TwinMetrics:
    """The metric families a prefill or decode scheduler and tokenizer of ``version`` export."""

    def __init__(self, version: str, engine_type: str, model_name: str = "twin-synthetic") -> None:
        v = Version(version)
        self.version = version
        self.engine_type = engine_type
        self.registry = CollectorRegistry()
        reg = self.registry
        s_labels = {"model_name": model_name, "engine_type": engine_type, "tp_rank": "0", "pp_rank": "0",
                    "moe_ep_rank": "0"}
        t_labels = {"model_name": model_name, "engine_type": engine_type}

        def gauge(name: str, doc: str):
            return Gauge(name, doc, SCHEDULER_LABELS, registry=reg).labels(**s_labels)

        def counter(name: str, doc: str, labels=SCHEDULER_LABELS, values=None):
            return Counter(name, doc, labels, registry=reg).labels(**(values or s_labels))

        def histogram(name: str, doc: str, buckets, labels=SCHEDULER_LABELS, values=None):
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(**(values or s_labels))

        self.num_running_reqs = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        bootstrap_name = (
            "sglang:num_prefill_prealloc_queue_reqs" if v < Version("0.5.12") else "sglang:num_prefill_bootstrap_queue_reqs"
        )
        inflight_name = (
            "sglang:num_prefill_infight_queue_reqs" if v < Version("0.5.2") else "sglang:num_prefill_inflight_queue_reqs"
        )
        self.prefill_bootstrap_queue = gauge(bootstrap_name, "The number of requests in the prefill bootstrap queue.")
        self.prefill_inflight_queue = gauge(inflight_name, "The number of requests in the prefill inflight queue.")
        self.decode_prealloc_queue = gauge("sglang:num_decode_prealloc_queue_reqs",
                                           "The number of requests in the decode prealloc queue.")
        self.decode_transfer_queue = gauge("sglang:num_decode_transfer_queue_reqs",
                                           "The number of requests in the decode transfer queue.")
        suffix = "" if v < Version("0.5.2") else "_total"
        self.bootstrap_failed = counter(f"sglang:num_bootstrap_failed_reqs{suffix}",
                                        "The number of bootstrap failed requests.")
        self.transfer_failed = counter(f"sglang:num_transfer_failed_reqs{suffix}",
                                       "The number of transfer failed requests.")
        if Version("0.5.2") <= v < Version("0.5.10"):
            self._latency_gauge = gauge("sglang:kv_transfer_latency_ms", "The KV transfer latency (ms).")
            self._speed_gauge = gauge("sglang:kv_transfer_speed_gb_s", "The KV transfer speed (GB/s).")
            self.kv_transfer_latency_ms = self.kv_transfer_speed = None
        else:
            self._latency_gauge = self._speed_gauge = None
            self.kv_transfer_latency_ms = histogram("sglang:kv_transfer_latency_ms", "The KV transfer latency (ms).",
                                                    LATENCY_MS_BUCKETS)
            self.kv_transfer_speed = histogram("sglang:kv_transfer_speed_gb_s", "The KV transfer speed (GB/s).",
                                               SPEED_BUCKETS)
        self.kv_transfer_total_mb = (
            histogram("sglang:kv_transfer_total_mb", "The KV transfer size (MB).", SPEED_BUCKETS)
            if v >= Version("0.5.7") else None
        )
        self.kv_transfer_bootstrap_ms = (
            histogram("sglang:kv_transfer_bootstrap_ms", "Time waiting in the bootstrap queue (ms).",
                      BOOTSTRAP_MS_BUCKETS)
            if v >= Version("0.5.4.post3") else None
        )
        self.per_stage = Histogram("sglang:per_stage_req_latency_seconds", "Per-stage request latency.",
                                   (*SCHEDULER_LABELS, "stage"), buckets=SECONDS_BUCKETS, registry=reg)
        self._stage_labels = s_labels
        # Tokenizer-manager collector.
        self.num_requests = counter("sglang:num_requests_total", "Number of requests processed.",
                                    TOKENIZER_LABELS, t_labels)
        self.num_aborted = counter("sglang:num_aborted_requests_total", "Number of requests aborted.",
                                   TOKENIZER_LABELS, t_labels)
        self.prompt_tokens = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                                     TOKENIZER_LABELS, t_labels)
        self.generation_tokens = counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         TOKENIZER_LABELS, t_labels)
        self.e2e_latency = histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency.",
                                     SECONDS_BUCKETS, TOKENIZER_LABELS, t_labels)
        self.ttft = histogram("sglang:time_to_first_token_seconds", "Time to first token.", SECONDS_BUCKETS,
                              TOKENIZER_LABELS, t_labels)
        if v >= Version("0.5.10"):
            self.http_requests = Counter("sglang:http_requests_total", "HTTP requests.", ("endpoint", "method"),
                                         registry=reg)
            self.http_responses = Counter("sglang:http_responses_total", "HTTP responses.",
                                          ("endpoint", "status_code", "method"), registry=reg)
            self.http_active = Gauge("sglang:http_requests_active", "Active HTTP requests.", ("endpoint", "method"),
                                     registry=reg)
        else:
            self.http_requests = self.http_responses = self.http_active = None

    def observe_stage(self, stage: str, seconds: float) -> None:
        self.per_stage.labels(**self._stage_labels, stage=stage).observe(seconds)

    def observe_transfer(self, latency_s: float, nbytes: int, bootstrap_s: float | None) -> None:
        """Record one finished KV transfer the way ``compute_and_observe_kv_transfer_metrics`` does."""
        latency_ms = latency_s * 1000
        speed = nbytes / max(latency_s, 1e-9) / 1e9
        if self.kv_transfer_latency_ms is not None:
            self.kv_transfer_latency_ms.observe(latency_ms)
            self.kv_transfer_speed.observe(speed)
        else:
            self._latency_gauge.set(latency_ms)
            self._speed_gauge.set(speed)
        if self.kv_transfer_total_mb is not None:
            self.kv_transfer_total_mb.observe(nbytes / 1e6)
        if self.kv_transfer_bootstrap_ms is not None and bootstrap_s is not None:
            self.kv_transfer_bootstrap_ms.observe(bootstrap_s * 1000)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
