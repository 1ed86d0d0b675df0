"""/metrics parsing: ``forensics.collectors.metrics.parse_exposition`` against prometheus_client's parser.

    python -m benchmarks metrics_parse [--samples 2000] [--rounds 7] [--loops 20] [--scrape-s 10] [--no-write]

One page of about ``--samples`` samples is rendered by prometheus_client itself from a
registry holding sglang's metric names, types and labels (facts sheet §4.4) for a TP-8
prefill: scheduler gauges and counters per ``tp_rank``, ``per_stage_req_latency_seconds``
histograms per stage and rank. Each round times, side by side and in turn, ``--loops``
parses by each parser (ours: :func:`parse_exposition`; theirs:
``list(text_string_to_metric_families(page))`` with every family's samples materialised);
the figure is the best round, per page. Before any figure is written both parsers' samples
are compared: the same (name, labels) keys and the same values (NaN equal to NaN). The
section "metrics-parse" of benchmarks/RESULTS.md is replaced, nothing else.

Then the scraper's own cost: two twin engines' ``/metrics`` (0.5.15 prefill and decode,
prometheus_client pages) served by a child process, scraped by ``MetricsScraper`` at 10 Hz
for ``--scrape-s`` seconds; the figure is this process's CPU time (user + system, from
``resource.getrusage``) over the wall time, i.e. the share of one core (target: under 5%).
"""

from __future__ import annotations

import math
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._results import benchmark_parser, publish

BENCHMARK = ("/metrics parsing: parse_exposition vs prometheus_client's text_string_to_metric_families "
             "on a 2,000-sample sglang page, side by side, values compared")
SECTION_START = "<!-- metrics-parse:start -->"
SECTION_END = "<!-- metrics-parse:end -->"

SCHEDULER_GAUGES = (
    "num_running_reqs", "num_queue_reqs", "num_grammar_queue_reqs", "gen_throughput", "cache_hit_rate",
    "decode_sum_seq_lens", "token_usage", "full_token_usage", "swa_token_usage", "mamba_usage",
    "num_used_tokens", "kv_available_tokens", "kv_evictable_tokens", "kv_used_tokens",
    "swa_available_tokens", "swa_evictable_tokens", "swa_used_tokens", "spec_accept_length",
    "spec_accept_rate", "num_retracted_reqs", "num_paused_reqs", "num_prefill_bootstrap_queue_reqs",
    "num_prefill_inflight_queue_reqs", "num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs",
    "pending_prealloc_token_usage", "utilization", "fwd_occupancy", "new_token_ratio", "is_cuda_graph",
    "max_total_num_tokens", "max_running_requests_under_SLO", "engine_startup_time",
    "engine_load_weights_time", "page_size", "num_pages", "context_len", "startup_available_gpu_memory_gb",
    "num_streaming_sessions", "num_unique_running_routing_keys",
)
SCHEDULER_COUNTERS = (
    "num_retracted_requests", "num_retracted_input_tokens", "num_retracted_output_tokens",
    "estimated_flops_per_gpu", "estimated_read_bytes_per_gpu", "estimated_write_bytes_per_gpu",
    "num_grammar_cache_hit", "num_grammar_aborted", "num_grammar_timeout", "num_grammar",
    "num_bootstrap_failed_reqs", "num_transfer_failed_reqs", "num_prefill_retries",
    "scheduler_idle_seconds", "num_decode_host_receive_reqs",
)
STAGES = ("prefill_bootstrap", "prefill_transfer_kv_cache", "prefill_waiting", "prefill_forward",
          "decode_prepare", "decode_bootstrap", "decode_waiting", "decode_transferred", "fake_output",
          "quick_finish")
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def build_page(target_samples: int = 2000, ranks: int = 8) -> str:
    """A prometheus_client page with sglang's names for a TP-``ranks`` prefill, about ``target_samples``."""
    import random

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    rng = random.Random(1215)
    reg = CollectorRegistry()
    labels = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
    per_rank = [{"model_name": "meta-llama/Llama-3.1-70B-Instruct", "engine_type": "prefill", "tp_rank": str(r),
                 "pp_rank": "0", "moe_ep_rank": "0"} for r in range(ranks)]
    for name in SCHEDULER_GAUGES:
        g = Gauge(f"sglang:{name}", f"{name}.", labels, registry=reg)
        for values in per_rank:
            g.labels(**values).set(rng.choice([0, rng.randint(0, 4096), rng.random()]))
    for name in SCHEDULER_COUNTERS:
        c = Counter(f"sglang:{name}_total", f"{name}.", labels, registry=reg)
        for values in per_rank:
            c.labels(**values).inc(rng.choice([0, rng.randint(1, 10**6), rng.randint(10**12, 10**15)]))
    h = Histogram("sglang:per_stage_req_latency_seconds", "Per-stage request latency.", (*labels, "stage"),
                  buckets=SECONDS_BUCKETS, registry=reg)
    text = generate_latest(reg).decode()
    stage_index = 0
    while text.count("\n") - text.count("\n#") < target_samples and stage_index < len(STAGES) * ranks:
        stage, rank = STAGES[stage_index % len(STAGES)], stage_index // len(STAGES)
        child = h.labels(**per_rank[rank], stage=stage)
        for _ in range(rng.randint(1, 50)):
            child.observe(rng.expovariate(2.0))
        stage_index += 1
        text = generate_latest(reg).decode()
    return text


def _ours(page: str) -> dict:
    from forensics.collectors.metrics import labels_dict, parse_exposition

    parsed = parse_exposition(page)
    return {(parsed.metric[i], tuple(sorted(labels_dict(parsed.labels[i]).items()))): float(parsed.value[i])
            for i in range(len(parsed))}


def _theirs(page: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for family in text_string_to_metric_families(page) for s in family.samples}


def compare(page: str) -> int:
    ours, theirs = _ours(page), _theirs(page)
    if ours.keys() != theirs.keys():
        raise AssertionError(f"sample keys differ: ours-only {sorted(ours.keys() - theirs.keys())[:3]}, "
                             f"theirs-only {sorted(theirs.keys() - ours.keys())[:3]}")
    for key, value in ours.items():
        other = theirs[key]
        if not (value == other or (math.isnan(value) and math.isnan(other))):
            raise AssertionError(f"{key}: ours {value!r}, prometheus_client {other!r}")
    return len(ours)


def measure(page: str, rounds: int, loops: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from forensics.collectors.metrics import parse_exposition

    def ours() -> None:
        parse_exposition(page)

    def ours_frame() -> None:
        parse_exposition(page).to_frame()

    def theirs() -> None:
        for family in text_string_to_metric_families(page):
            list(family.samples)

    best = {"ours": math.inf, "ours_frame": math.inf, "prometheus_client": math.inf}
    for _ in range(rounds):
        for name, fn in (("ours", ours), ("prometheus_client", theirs), ("ours_frame", ours_frame)):
            started = time.perf_counter()
            for _ in range(loops):
                fn()
            best[name] = min(best[name], (time.perf_counter() - started) / loops)
    return best


SERVE_CHILD = r"""
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from forensics.twin.metrics import TwinMetrics

def serve(engine_type):
    metrics = TwinMetrics("0.5.15", engine_type)
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        def do_GET(self):
            metrics.transfer_failed.inc()
            body = metrics.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]

print(serve("prefill"), serve("decode"), flush=True)
sys.stdin.read()  # until the parent closes it
"""


def scrape_cost(seconds: float, interval_s: float = 0.1) -> dict[str, float]:
    """Share of one core this process spends scraping two engines at 1/interval_s Hz."""
    import resource
    import subprocess

    from forensics.collectors.metrics import MetricsScraper

    child = subprocess.Popen([sys.executable, "-c", SERVE_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=Path(__file__).parent.parent)
    try:
        ports = child.stdout.readline().split()
        if len(ports) != 2:
            raise RuntimeError("the /metrics server child did not start")
        targets = [("prefill", "twin-prefill", f"http://127.0.0.1:{ports[0]}"),
                   ("decode", "twin-decode", f"http://127.0.0.1:{ports[1]}")]
        scraper = MetricsScraper(targets, interval_s=interval_s)
        before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        scraper.start()
        time.sleep(seconds)  # the scraper's threads run meanwhile
        series = scraper.stop()
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        child.stdin.close()
        child.wait(30)
    scrapes = series.scrapes_frame()
    if not scrapes["ok"].all():
        raise AssertionError(f"failed scrapes while measuring: {scrapes[~scrapes['ok']]['error'].unique()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "share": cpu / wall, "scrapes": float(len(scrapes)),
            "samples": float(scrapes["samples"].mean())}


def section(samples: int, best: dict[str, float], rounds: int, loops: int, cost: dict[str, float] | None) -> str:
    from importlib.metadata import version

    ratio = best["prometheus_client"] / best["ours"]
    lines = [
        SECTION_START,
        "## /metrics parsing (`benchmarks/metrics_parse.py`)",
        "",
        f"One prometheus_client-rendered page of {samples} samples (sglang's names and labels, TP-8 prefill:",
        "scheduler gauges and counters per rank, `per_stage_req_latency_seconds` histograms), parsed by both",
        f"parsers side by side in one run; best of {rounds} rounds of {loops} parses each, per page. Both",
        "parsers' samples were compared first: same (name, labels) keys, same values.",
        "",
        "| parser | ms per page | samples/s |",
        "|---|---|---|",
        f"| `forensics.collectors.metrics.parse_exposition` | {best['ours'] * 1e3:.2f} | "
        f"{samples / best['ours']:,.0f} |",
        f"| `parse_exposition(...).to_frame()` (typed frame, exact ints) | {best['ours_frame'] * 1e3:.2f} | "
        f"{samples / best['ours_frame']:,.0f} |",
        f"| `prometheus_client.parser.text_string_to_metric_families` ({version('prometheus_client')}) | "
        f"{best['prometheus_client'] * 1e3:.2f} | {samples / best['prometheus_client']:,.0f} |",
        "",
        f"Ours is {ratio:.1f}x prometheus_client's speed (target: at least 1x). "
        f"Python {platform.python_version()}, {datetime.now(UTC).strftime('%Y-%m-%d')}.",
    ]
    if cost is not None:
        lines += [
            "",
            f"Scraping two twin engines (0.5.15 prefill and decode, {cost['samples']:.0f} samples a page, served by a",
            f"child process) at 10 Hz with `MetricsScraper` for {cost['wall_s']:.1f} s: {cost['scrapes']:.0f} scrapes, all ok,",
            f"{cost['cpu_s']:.2f} s CPU in the scraping process = **{cost['share'] * 100:.1f}% of one core** (target: under 5%).",
        ]
    lines.append(SECTION_END)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = benchmark_parser("metrics_parse", BENCHMARK)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loops", type=int, default=20)
    parser.add_argument("--scrape-s", type=float, default=10.0, help="seconds of 10 Hz scraping (0: skip)")
    args = parser.parse_args(argv)
    page = build_page(args.samples)
    samples = compare(page)
    best = measure(page, args.rounds, args.loops)
    cost = scrape_cost(args.scrape_s) if args.scrape_s > 0 else None
    text = section(samples, best, args.rounds, args.loops, cost)
    publish(text, SECTION_START, SECTION_END, write=not args.no_write)
    if best["ours"] > best["prometheus_client"]:
        print("FAIL: parse_exposition is slower than prometheus_client's parser", file=sys.stderr)
        return 1
    if cost is not None and cost["share"] >= 0.05:
        print("FAIL: scraping two engines at 10 Hz costs 5% of a core or more", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
