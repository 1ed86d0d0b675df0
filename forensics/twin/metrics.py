"""Prometheus metrics with sglang's names, types and labels for one release, read from its source.

Which families exist, their type, documentation, label names and (literal) buckets come
from the release's own collector code (:mod:`forensics.sglang_metrics`), never from a
table here. The twin registers exactly what a default PD engine of that release registers
with ``--enable-metrics``: every unconditional declaration of the scheduler and tokenizer
collectors and of the HTTP middleware. Declarations under an ``if`` (LoRA, HiCache,
streaming sessions, token histograms, ...) are left out, as a default engine leaves them
out; exporting them would be as wrong as a hand table.

sglang runs prometheus_client in multiprocess mode, and the page is what its
``MultiProcessCollector`` makes of the processes' value files; the twin's page is made the same
way (:func:`multiprocess_view`, checked against real 0.5.15 pages by ``forensics twin
fidelity``): no ``_created`` series, no family before its first child exists, and a ``pid``
label on gauges in multiprocess mode ``all`` (the Gauge default). So the scheduler's gauges,
which sglang's ``log_stats`` writes on every stats tick (zeros for what the twin has nothing
honest to put in: speculative decoding, cache hit rate, ...), show from the first tick; a
counter or histogram shows from its first write (``num_aborted_requests`` only after an abort,
grammar and retraction families never on a default PD run), as on a real engine.

Each twin server owns one registry. Gauges are written only where sglang writes them
(after a batch, on the 30 s idle tick of a fully idle scheduler), counters where sglang
moves them (immediately), so the twin's ``/metrics`` freezes and moves like a real
engine's during a wedge.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest
from prometheus_client.samples import Sample

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
# sglang/srt/observability/cpu_monitor.py (0.5.15): a Counter outside the collectors, one child per
# component, incremented every 5 s by a "monitor" thread of the tokenizer manager and the detokenizer.
CPU_MONITOR_FILE = "sglang/srt/observability/cpu_monitor.py"
CPU_COUNTER = "sglang:process_cpu_seconds_total"
# Gauge multiprocess modes whose samples carry the writing process's pid (prometheus_client).
PID_MODES = ("all", "liveall")


class _LazyChild:
    """``family.labels(**labels)``, made on the first write."""

    def __init__(self, family, labels: dict[str, str]) -> None:
        self._family, self._labels, self._child = family, labels, None

    def _get(self):
        if self._child is None:
            self._child = self._family.labels(**self._labels)
        return self._child

    def inc(self, amount: float = 1) -> None:
        self._get().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._get().dec(amount)

    def set(self, value: float) -> None:
        self._get().set(value)

    def observe(self, value: float) -> None:
        self._get().observe(value)

    def __getattr__(self, name: str):  # anything else prometheus_client's child offers (_value, ...)
        return getattr(self._get(), name)


class MultiprocessView:
    """A registry's families as ``MultiProcessCollector`` shows them (what sglang's /metrics is):
    ``_created`` samples dropped, families without samples dropped, ``pid`` on ``all``-mode gauges."""

    def __init__(self, registry: CollectorRegistry, pid_gauges: set[str]) -> None:
        self.registry = registry
        self.pid_gauges = pid_gauges
        self.pid = str(os.getpid())

    def collect(self):
        for family in self.registry.collect():
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            if family.name in self.pid_gauges:
                samples = [Sample(s.name, {**s.labels, "pid": self.pid}, s.value, s.timestamp, s.exemplar)
                           for s in samples]
            if samples:
                family.samples = samples
                yield family


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
        self._view = MultiprocessView(self.registry, {
            s.name for s in self.specs.values() if s.kind == "gauge" and s.multiprocess_mode in PID_MODES})
        self._gauge_histograms = [s for s in self.specs.values() if s.bucket_bounds and s.collector == "scheduler"]
        self.cpu_seconds = self._cpu_counter()
        self._cpu_files: dict[str, Path] = {}
        self._cpu_counted: dict[str, float] = {}
        self.realtime_tokens = self._family("sglang:realtime_tokens_total")
        self.cuda_graph_passes = self._family("sglang:cuda_graph_passes_total")
        self._forward_labels = self._bound(self.release.find("sglang:realtime_tokens_total")) if (
            self.realtime_tokens) else {}
        self.write_stats()  # the first stats tick (a real engine's PD warm-up request makes one)

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
        self.prompt_tokens_histogram = self._child("sglang:prompt_tokens_histogram")
        self.uncached_prompt_tokens_histogram = self._child("sglang:uncached_prompt_tokens_histogram")
        self.generation_tokens_histogram = self._child("sglang:generation_tokens_histogram")
        self.queue_time = self._child("sglang:queue_time_seconds")
        self.kv_transfer_alloc_ms = self._child("sglang:kv_transfer_alloc_ms")
        self.ttft = self._child("sglang:time_to_first_token_seconds")
        # Observed by sglang's /v1/loads handler (entrypoints/v1_loads.py), so it shows from the first call.
        self.get_loads_duration = self._child("sglang:get_loads_duration_seconds")
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
        ticked = self.release.tick_written is None or spec.attribute in self.release.tick_written
        if (spec.kind == "gauge" and spec.collector == "scheduler" and ticked
                and set(spec.labelnames) <= set(self._values)):
            # log_stats writes every scheduler gauge on its first tick (the PD warm-up's): the one
            # child a single-rank engine has, at 0 until the twin writes it. Counters and
            # histograms get theirs on their first write, as in multiprocess mode.
            metric.labels(**self._bound(spec))
        return metric

    def _cpu_counter(self):
        """``process_cpu_seconds_total`` where the release has sglang's cpu monitor (read from its source)."""
        from forensics.sglang_source import SourceError, fetch

        try:
            declared = f'"{CPU_COUNTER}"' in fetch(self.version).read(CPU_MONITOR_FILE)
        except SourceError:  # a release without the monitor (before 0.5.15)
            declared = False
        if not declared:
            return ABSENT
        return Counter(CPU_COUNTER, "Total CPU time consumed by this process (user + system)", ["component"],
                       registry=self.registry)

    def follow_cpu_files(self, files: dict[str, Path]) -> None:
        """sglang's ``process_cpu_seconds_total`` per component, as the front's page gathers every
        process's value in multiprocess mode: here from the files the front's ("tokenizer") and the
        detokenizer's ``monitor`` threads write (forensics.twin.role_tree), read at each scrape."""
        if not self.cpu_seconds:
            return
        self._cpu_files = dict(files)
        self._cpu_counted = {component: 0.0 for component in files}
        for component in files:
            self.cpu_seconds.labels(component=component)

    def _count_cpu_files(self) -> None:
        from forensics.twin.role_tree import read_cpu_seconds

        for component, path in self._cpu_files.items():
            seconds = read_cpu_seconds(path)
            if seconds is not None and seconds > self._cpu_counted[component]:
                self.cpu_seconds.labels(component=component).inc(seconds - self._cpu_counted[component])
                self._cpu_counted[component] = seconds

    def _bound(self, spec: MetricSpec) -> dict[str, str]:
        return {name: self._values[name] for name in spec.labelnames if name in self._values}

    def _family(self, *names: str):
        spec = self.release.find(*names)
        return self.families[spec.name] if spec else ABSENT

    def _child(self, *names: str):
        """The release's metric by any of its names, bound to this engine's labels; ABSENT if undeclared.

        The child is made on its first write (:class:`_LazyChild`): in multiprocess mode a family
        with labels shows only once written, so binding it here must not make it show."""
        spec = self.release.find(*names)
        if spec is None:
            return ABSENT
        family = self.families[spec.name]
        return _LazyChild(family, self._bound(spec)) if spec.labelnames else family

    def kind(self, *names: str) -> str | None:
        spec = self.release.find(*names)
        return spec.kind if spec else None

    # ------------------------------------------------------------------ writing

    def observe_forward(self, mode: str, tokens: int) -> None:
        """One forward pass of ``mode`` ("prefill" or "decode") over ``tokens`` new tokens, as the
        scheduler's metrics reporter counts it: a CUDA-graph pass counter (``<mode>_none`` here, no
        graph on a CPU) and the realtime token counter (``prefill_compute`` / ``decode``)."""
        if self.cuda_graph_passes:
            self.cuda_graph_passes.labels(**self._forward_labels, mode=f"{mode}_none").inc(1)
        if self.realtime_tokens and tokens:
            kind = "prefill_compute" if mode == "prefill" else "decode"
            self.realtime_tokens.labels(**self._forward_labels, mode=kind).inc(tokens)

    def write_stats(self) -> None:
        """The part of ``log_stats`` the twin has no value for but sglang writes every tick: the
        routing-key gauge histograms (no routing keys: every (gt, le] bucket at 0)."""
        for spec in self._gauge_histograms:
            bounds = [0.0, *spec.bucket_bounds]
            family = self.families[spec.name]
            for gt, le in zip(bounds, [*spec.bucket_bounds, float("inf")], strict=True):
                family.labels(**self._bound(spec), gt=_bucket_text(gt), le=_bucket_text(le)).set(0)

    def observe_bootstrap(self, bootstrap_s: float) -> None:
        """``observe_kv_transfer_bootstrap`` on the decode: the handshake's time and the allocation's (0 ms)."""
        for name, child, value in (("sglang:kv_transfer_bootstrap_ms", self.kv_transfer_bootstrap_ms, bootstrap_s * 1000),
                                   ("sglang:kv_transfer_alloc_ms", self.kv_transfer_alloc_ms, 0.0)):
            kind = self.kind(name)
            if kind == "gauge":
                child.set(value)
            elif kind in ("histogram", "summary"):
                child.observe(value)

    def observe_finished(self, *, prompt_tokens: int, generation_tokens: int, e2e_s: float,
                         cached_tokens: int = 0) -> None:
        """``observe_one_finished_request``: what the tokenizer manager records when a request ends."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.num_requests.inc()
        self.e2e_latency.observe(e2e_s)
        self.prompt_tokens_histogram.observe(prompt_tokens)
        self.uncached_prompt_tokens_histogram.observe(prompt_tokens - cached_tokens)
        self.generation_tokens_histogram.observe(generation_tokens)

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
            # observe_kv_transfer_bootstrap observes the allocation wait with it; the twin's pages
            # are allocated at once: 0 ms.
            values.append(("sglang:kv_transfer_alloc_ms", self.kv_transfer_alloc_ms, 0.0))
        for name, child, value in values:
            kind = self.kind(name)
            if kind == "gauge":
                child.set(value)
            elif kind in ("histogram", "summary"):
                child.observe(value)

    def exposition(self) -> bytes:
        self._count_cpu_files()
        return generate_latest(self._view)


def _bucket_text(bound: float) -> str:
    """A GaugeHistogram bucket label as sglang writes it: ``1``, ``200``, ``+Inf``."""
    if bound == float("inf"):
        return "+Inf"
    return str(int(bound)) if bound == int(bound) else str(bound)
