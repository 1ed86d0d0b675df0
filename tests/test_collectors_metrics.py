"""Queue metrics: the exposition parser, renamed gauges, rates, and the scraper against real HTTP servers.

Servers are real ``ThreadingHTTPServer``s on 127.0.0.1 serving the twin's metrics module
(sglang's names per release) rendered by prometheus_client; every wait is on the scraper's
own progress (``wait_for``) with generous deadlines, so a loaded 2-core machine passes.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from forensics.collectors import metrics as mc
from forensics.twin.metrics import TwinMetrics

DEADLINE_S = 60.0


# ----------------------------------------------------------------------------------------------
# A real /metrics server


class MetricsServer:
    """``/metrics`` on 127.0.0.1 from ``render()`` (called per request); ``status`` can be set to fail."""

    def __init__(self, render) -> None:
        self.render = render
        self.status = 200
        self.requests = 0
        self.hold = threading.Event()  # set: answer only when released (a hung engine)
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                outer.requests += 1
                if outer.hold.is_set():
                    outer.released.wait(DEADLINE_S)
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                if outer.status != 200:
                    self.send_error(outer.status, "injected failure")
                    return
                body = outer.render()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="test-metrics-server", daemon=True)
        self.thread.start()
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.released.set()
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(DEADLINE_S)


@pytest.fixture
def servers():
    made: list[MetricsServer] = []

    def make(render) -> MetricsServer:
        server = MetricsServer(render)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def twin_page(version: str, engine_type: str = "prefill", step: int = 5):
    """A render() for a twin engine of ``version``: each scrape sees transfer failures rise by ``step``."""
    metrics = TwinMetrics(version, engine_type)
    served = {"n": 0}

    def render() -> bytes:
        served["n"] += 1
        metrics.transfer_failed.inc(step)
        metrics.prefill_bootstrap_queue.set(served["n"])
        return metrics.exposition()

    return render


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# The parser


def _samples_by_key(page: mc.ExpositionPage) -> dict:
    return {(page.metric[i], tuple(sorted(mc.labels_dict(page.labels[i]).items()))): float(page.value[i])
            for i in range(len(page))}


@pytest.mark.parametrize("version", ["0.5.1", "0.5.11", "0.5.15"])
def test_parser_agrees_with_prometheus_client(version):
    twin = TwinMetrics(version, "prefill")
    twin.transfer_failed.inc(3)
    twin.observe_transfer(0.012, 3 * 10**6, 0.004)
    twin.observe_stage("prefill_bootstrap", 0.2)
    twin.e2e_latency.observe(0.3)
    # prometheus_client's own page of the registry (``_created`` included), not the multiprocess view
    text = generate_latest(twin.registry).decode()
    page = mc.parse_exposition(text)
    theirs = {(s.name, tuple(sorted(s.labels.items()))): float(s.value)
              for family in text_string_to_metric_families(text) for s in family.samples}
    ours = _samples_by_key(page)
    assert ours.keys() == theirs.keys()
    assert all(ours[k] == theirs[k] or (math.isnan(ours[k]) and math.isnan(theirs[k])) for k in ours)
    frame = page.to_frame()
    kinds = dict(zip(frame["metric"], frame["type"], strict=True))
    assert kinds["sglang:num_transfer_failed_reqs_total"] == "counter"
    assert kinds["sglang:num_queue_reqs"] == "gauge"
    assert kinds["sglang:e2e_request_latency_seconds_bucket"] == "histogram"
    assert kinds["sglang:e2e_request_latency_seconds_count"] == "histogram"
    cumulative = dict(zip(page.metric, page.cumulative.tolist(), strict=True))
    assert cumulative["sglang:num_transfer_failed_reqs_total"] is True
    assert cumulative["sglang:e2e_request_latency_seconds_sum"] is True
    assert cumulative["sglang:num_queue_reqs"] is False
    assert cumulative["sglang:num_transfer_failed_reqs_created"] is False


def test_parser_keeps_counters_beyond_2_53_exact():
    big = 2**53 + 1  # 9007199254740993: float() makes it ...992
    huge = 2**64 + 7  # beyond int64 too
    text = (
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
        "# TYPE sglang:prompt_tokens_total counter\n"
        f'sglang:prompt_tokens_total{{model_name="m",engine_type="prefill"}} {big}\n'
        f'sglang:prompt_tokens_total{{model_name="m",engine_type="decode"}} {huge}\n'
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{tp_rank="0"} 1.5e+20\n'
        'sglang:token_usage{tp_rank="1"} -12\n'
        'sglang:token_usage{tp_rank="2"} 7.0\n'
        'sglang:token_usage{tp_rank="3"} NaN\n'
        'sglang:token_usage{tp_rank="4"} +Inf 1700000000000\n'
    )
    page = mc.parse_exposition(text)
    assert float(big) != big  # the trap this test is about
    assert page.value_text[:2] == [str(big), str(huge)]
    assert page.exact(0) == big and isinstance(page.exact(0), int)
    assert page.exact(1) == huge
    frame = page.to_frame()
    assert str(frame["value_int"].dtype) == "Int64"
    assert frame["value_int"].iloc[0] == big  # exact, not ...992
    assert frame["value_int"].isna().iloc[1]  # no int64 for it, but the text is exact
    assert frame["value_text"].iloc[1] == str(huge)
    assert frame["value_int"].isna().iloc[2]  # an exponent is not an exact integer
    assert frame["value_int"].iloc[3] == -12 and frame["value_int"].iloc[4] == 7
    assert math.isnan(frame["value"].iloc[5]) and frame["value"].iloc[6] == math.inf
    assert frame["value_int"].isna().iloc[5] and frame["value_int"].isna().iloc[6]


def test_parser_labels_are_canonical_and_escapes_survive():
    text = (
        "# TYPE m gauge\n"
        'm{b="2",a="1"} 1\n'
        'm{ a = "1" , b="2", } 2\n'
        'm{path="/v1/x,y} z",q="say \\"hi\\"\\\\n\\n"} 3\n'
        "m 4\n"
        'm{a1="x",a="y"} 5\n'
        'm{ a1="x" , a="y" } 6\n'
    )
    page = mc.parse_exposition(text)
    assert page.labels[0] == page.labels[1] == 'a="1",b="2"'
    assert mc.labels_dict(page.labels[2]) == {"path": "/v1/x,y} z", "q": 'say "hi"\\n\n'}
    assert page.labels[3] == ""
    # the tight fast path and the spaced slow path agree, sorted by label name ("a" < "a1")
    assert page.labels[4] == page.labels[5] == 'a="y",a1="x"'
    assert page.type == ["gauge"] * 6


@pytest.mark.parametrize("line, why", [
    ("m{a=1} 2", "bad label set"),
    ('m{a="1",a="2"} 2', "twice"),
    ("m 2 3 4", "not a sample line"),
    ("m notanumber", "bad value"),
])
def test_a_bad_line_is_a_problem_naming_it_and_the_rest_of_the_page_is_kept(line, why):
    page = mc.parse_exposition(f"# TYPE m gauge\nm 1\n{line}\nm{{a=\"z\"}} 5\n")
    assert page.value_text == ["1", "5"] and page.labels == ["", 'a="z"']
    assert page.problems_total == 1 and page.problems[0].lineno == 3 and why in page.problems[0].why
    assert page.problems_text().startswith(f"1 unreadable line(s): line 3: {page.problems[0].why}")
    with pytest.raises(mc.ExpositionParseError, match=why) as caught:
        mc.parse_exposition(f"# TYPE m gauge\nm 1\n{line}\n", strict=True)
    assert caught.value.lineno == 3


def test_a_page_of_garbage_keeps_a_bounded_list_of_its_problems():
    page = mc.parse_exposition("<html>\n" * 5000 + "up 1\n")
    assert page.metric == ["up"] and page.problems_total == 5000
    assert len(page.problems) == 100 and page.problems_text().endswith("and 4997 more")


# Inputs of prometheus_client's own text-format parser tests, and the forms the current text
# format adds (quoted UTF-8 names): each case is read by both parsers and must agree.
FORMAT_CASES = [
    'a 1\n', 'a  1\n', 'a\t1\t123\n', 'a 1 1700000000000\n', 'a +Inf\n', 'a -Inf\n', 'a NaN\n', 'a 1e3\n',
    'a -1.5e-3\n', 'a{} 1\n', 'a{ } 1\n', 'b{,} 2\n', 'a{foo="bar"} 1\n', 'a{foo="bar",} 1\n',
    'a{ foo = "bar" , } 1\n', 'a{\tfoo="bar"\t} 1\n', 'a{foo="bar"}1\n', 'a{foo="bar", baz="q"} 1\n',
    'a{foo="b\\\\a\\"r"} 1\n', 'a{foo="new\\nline"} 1\n', 'a{foo="}{,="} 1\n',
    '{"my.metric"} 1\n', '{"my.metric",a="b"} 1\n', '{ "my.metric" , a="b" } 1\n', 'a{"lbl.x"="v"} 1\n',
    '{"my.metric","lbl.x"="v",b="c"} 1 1700000000\n', '{"sglang:num_queue_reqs"} 0\n',
    "# HELP a some help\n# TYPE a counter\na_total 3\na_created 1.7e9\n",
    "# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.3\nh_count 2\n",
]


@pytest.mark.parametrize("text", FORMAT_CASES)
def test_the_parser_reads_what_prometheus_client_reads(text):
    theirs = sorted((s.name, tuple(sorted(s.labels.items())), repr(float(s.value)))
                    for family in text_string_to_metric_families(text) for s in family.samples)
    page = mc.parse_exposition(text)
    ours = sorted((page.metric[i], tuple(sorted(mc.labels_dict(page.labels[i]).items())), repr(float(page.value[i])))
                  for i in range(len(page)))
    assert not page.problems and ours == theirs


def _fuzzed_lines(seed: int, count: int) -> list[str]:
    import random

    rng = random.Random(seed)
    names = ["a", "sglang:num_queue_reqs", '"my.metric"', "m_total"]
    labels = ['', '{}', '{,}', '{a="1"}', '{ a = "1" , }', '{a="x,y}"}', '{"l.x"="2",b="3"}', '{a="\\"q\\""}']
    blanks = [" ", "\t", "  "]
    values = ["1", "-2.5", "+Inf", "NaN", "1e-3", "7"]
    out = []
    for _ in range(count):
        name = rng.choice(names)
        label = rng.choice(labels)
        if name.startswith('"'):
            inner = label[1:-1] if label.startswith("{") else ""
            inner = inner.strip(" ,")
            label = "{" + name + ("," + inner if inner else "") + "}"
            name = ""
        line = f"{name}{label}{rng.choice(blanks)}{rng.choice(values)}"
        if rng.random() < 0.3:
            line += f" {rng.randrange(10**12, 10**13)}"
        out.append(line)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_fuzzed_pages_agree_with_prometheus_client_line_by_line(seed):
    for line in _fuzzed_lines(seed, 200):
        text = line + "\n"
        theirs = sorted((s.name, tuple(sorted(s.labels.items())), repr(float(s.value)))
                        for family in text_string_to_metric_families(text) for s in family.samples)
        page = mc.parse_exposition(text)
        ours = sorted((page.metric[i], tuple(sorted(mc.labels_dict(page.labels[i]).items())),
                       repr(float(page.value[i]))) for i in range(len(page)))
        assert not page.problems and ours == theirs, line


def test_benchmark_page_agrees_between_parsers():
    from benchmarks import metrics_parse

    page = metrics_parse.build_page(300, ranks=2)
    assert metrics_parse.compare(page) >= 300


# ----------------------------------------------------------------------------------------------
# Renamed gauges


def test_renames_table_maps_old_names_to_current():
    table = mc.renames()
    assert table["sglang:num_prefill_prealloc_queue_reqs"] == "sglang:num_prefill_bootstrap_queue_reqs"
    assert table["sglang:num_prefill_infight_queue_reqs"] == "sglang:num_prefill_inflight_queue_reqs"
    assert mc.canonical_name("sglang:num_queue_reqs") == "sglang:num_queue_reqs"
    assert mc.canonical_name("sglang:num_prefill_prealloc_queue_reqs_created") == \
        "sglang:num_prefill_bootstrap_queue_reqs_created"


def test_the_gateways_underscore_names_are_the_engines_families():
    """sglang's model gateway re-exports a worker's page on /engine_metrics as ``sglang_NAME`` with a
    worker label; read from real 0.5.15's prefill page so spelled, every series keeps its family."""
    real = (Path(__file__).parent / "data" / "real-engine-0.5.15" / "prefill-metrics.txt").read_text()
    gateway = real.replace("sglang:", "sglang_").replace('engine_type="', 'worker="http://10.0.0.7:30000",engine_type="')
    assert "sglang:" not in gateway and "sglang_num_queue_reqs{" in gateway
    engine = mc.parse_exposition(real.encode()).to_frame()
    seen = mc.parse_exposition(gateway.encode()).to_frame()
    assert len(seen) == len(engine)
    assert seen["metric_canonical"].tolist() == engine["metric_canonical"].tolist()
    assert "sglang:num_prefill_bootstrap_queue_reqs" in set(seen["metric_canonical"])
    assert mc.canonical_name("sglang_num_prefill_prealloc_queue_reqs") == "sglang:num_prefill_bootstrap_queue_reqs"


def test_twin_pages_before_and_after_renames_share_canonical_names():
    def canon(version: str) -> set[str]:
        return set(mc.parse_exposition(TwinMetrics(version, "prefill").exposition()).to_frame()["metric_canonical"])

    def raw(version: str) -> set[str]:
        return set(mc.parse_exposition(TwinMetrics(version, "prefill").exposition()).metric)

    old, new = "0.5.11", "0.5.15"
    assert "sglang:num_prefill_prealloc_queue_reqs" in raw(old) - raw(new)
    assert "sglang:num_prefill_bootstrap_queue_reqs" in canon(old) & canon(new)
    assert "sglang:num_prefill_prealloc_queue_reqs" not in canon(old)
    assert "sglang:num_prefill_inflight_queue_reqs" in canon("0.5.1")


# ----------------------------------------------------------------------------------------------
# Rates


def _frame(rows) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["t", "metric", "labels", "value", "type"])
    frame["ts"] = pd.to_datetime(frame.pop("t"), unit="s", utc=True)
    for column in ("role", "host", "url"):
        frame[column] = pd.Series(["prefill"] * len(frame), dtype="string")
    frame["scrape_ok"] = True
    return frame


def test_rates_per_second_per_series_and_resets_never_negative():
    c = "sglang:num_transfer_failed_reqs_total"
    frame = _frame([
        (0, c, 'tp_rank="0"', 10.0, "counter"),
        (0, c, 'tp_rank="1"', 100.0, "counter"),
        (0, "sglang:num_queue_reqs", "", 4.0, "gauge"),
        (1, c, 'tp_rank="0"', 20.0, "counter"),
        (1, c, 'tp_rank="1"', 100.0, "counter"),
        (1, "sglang:num_queue_reqs", "", 2.0, "gauge"),
        (2, c, 'tp_rank="0"', 5.0, "counter"),  # reset: the engine restarted
        (4, c, 'tp_rank="0"', 15.0, "counter"),
        (4, c, 'tp_rank="1"', 160.0, "counter"),
    ])
    rate = mc.add_rates(frame)
    got = {(int(t.timestamp()), lab): r for t, lab, r, m in
           zip(frame["ts"], frame["labels"], rate, frame["metric"], strict=True) if m == c}
    assert math.isnan(got[(0, 'tp_rank="0"')]) and math.isnan(got[(0, 'tp_rank="1"')])
    assert got[(1, 'tp_rank="0"')] == 10.0
    assert got[(1, 'tp_rank="1"')] == 0.0
    assert got[(2, 'tp_rank="0"')] == 5.0  # increase = the value since the reset, over 1 s
    assert got[(4, 'tp_rank="0"')] == 5.0
    assert got[(4, 'tp_rank="1"')] == 20.0  # 60 over 3 s
    assert rate[frame["metric"] == "sglang:num_queue_reqs"].isna().all()
    assert (rate.dropna() >= 0).all()


# ----------------------------------------------------------------------------------------------
# The scraper against real servers


def _dt_seconds(ts: pd.Series) -> np.ndarray:
    return np.diff(pd.DatetimeIndex(ts).asi8) / 1e9


def test_scrape_two_releases_at_10hz(servers):
    old = servers(twin_page("0.5.11", step=5))  # before the bootstrap-queue rename
    new = servers(twin_page("0.5.15", step=5))  # after it
    targets = [("prefill", "p-old", old.url), ("prefill", "p-new", new.url + "/metrics")]
    # the default deadline at 10 Hz is 1 s; a loaded 2-core CI worker has taken longer than that to
    # answer the first scrape, and this test is about what good scrapes hold, not about deadlines
    scraper = mc.MetricsScraper(targets, interval_s=0.1, timeout_s=DEADLINE_S)
    with scraper:
        assert scraper.wait_for(10, DEADLINE_S), "ten scrapes of each target"
    assert not scraper.running
    series = scraper.result()
    samples, scrapes = series.to_frame(), series.scrapes_frame()

    assert {c: str(t) for c, t in samples.dtypes.items()} == mc.SAMPLES_SCHEMA
    assert {c: str(t) for c, t in scrapes.dtypes.items()} == mc.SCRAPES_SCHEMA
    assert str(samples["ts"].dt.tz) == "UTC"
    assert scrapes["ok"].all() and (scrapes["http_status"] == 200).all()
    assert scrapes.groupby("host").size().min() >= 10
    # one scrape_ok row per scrape, plus every sample of its page
    per_scrape = samples.groupby(["host", "ts"]).size()
    ok_rows = samples[samples["metric"] == mc.SCRAPE_OK_METRIC]
    assert len(ok_rows) == len(scrapes) and (ok_rows["value"] == 1.0).all()
    for host, server_page in (("p-old", TwinMetrics("0.5.11", "prefill")), ("p-new", TwinMetrics("0.5.15", "prefill"))):
        server_page.transfer_failed.inc(5)  # what twin_page writes before its first page: the counter shows
        expected = len(mc.parse_exposition(server_page.exposition())) + 1
        assert (per_scrape[host] == expected).all()
    assert samples["error"].isna().all() and samples["scrape_ok"].all()

    # renamed gauge: both names, one canonical column, original kept
    gauge = series.select("sglang:num_prefill_bootstrap_queue_reqs")
    assert set(gauge["host"]) == {"p-old", "p-new"}
    assert set(gauge["metric_canonical"]) == {"sglang:num_prefill_bootstrap_queue_reqs"}
    assert dict(gauge.groupby("host")["metric"].first()) == {
        "p-old": "sglang:num_prefill_prealloc_queue_reqs", "p-new": "sglang:num_prefill_bootstrap_queue_reqs"}
    assert gauge["rate"].isna().all()  # gauges have no rate
    old_name = series.select("sglang:num_prefill_prealloc_queue_reqs")
    assert len(old_name) == len(gauge)  # asking by the old name finds both releases too
    assert (gauge["value_int"] >= 1).all()

    # counters: each scrape saw +5, so rate * dt == 5 between consecutive scrapes of a series
    counter = samples[samples["metric"] == "sglang:num_transfer_failed_reqs_total"]
    for _, group in counter.groupby("host"):
        group = group.sort_values("ts")
        dt = _dt_seconds(group["ts"])
        assert (dt > 0).all()
        assert math.isnan(group["rate"].iloc[0])
        np.testing.assert_allclose(group["rate"].to_numpy()[1:] * dt, 5.0, rtol=1e-6)
        assert (np.diff(group["value_int"].to_numpy(dtype=np.int64)) == 5).all()
        # paced by the interval, not a busy loop: no two scrapes closer than the interval allows
        assert np.median(dt) >= 0.05
    created = samples[samples["metric"].str.endswith("_created")]
    assert created["rate"].isna().all()
    buckets = samples[samples["metric"] == "sglang:kv_transfer_latency_ms_count"]
    assert buckets["rate"].notna().any() or (buckets["value"] == 0).all()


def test_a_target_that_goes_away_leaves_error_rows(servers):
    server = servers(twin_page("0.5.15"))
    scraper = mc.MetricsScraper([("decode", "d0", server.url)], interval_s=0.1)
    with scraper:
        assert scraper.wait_for(3, DEADLINE_S, ok=True)
        server.close()
        assert scraper.wait_for(3, DEADLINE_S, ok=False), "failed scrapes are recorded"
    series = scraper.result()
    scrapes = series.scrapes_frame()
    failed = scrapes[~scrapes["ok"]]
    assert len(failed) >= 3
    # a request caught mid-close may read as a reset; once the port is closed it is refused
    assert failed["error"].notna().all() and (failed["error"].str.len() > 0).all()
    assert "refused" in failed["error"].iloc[-1].lower()
    assert failed["http_status"].isna().all()
    # the failure is in the samples frame too: a scrape_ok row at 0 with the reason
    rows = series.to_frame()
    bad = rows[~rows["scrape_ok"]]
    assert len(bad) == len(failed)
    assert (bad["metric"] == mc.SCRAPE_OK_METRIC).all() and (bad["value"] == 0.0).all()
    assert bad["error"].notna().all()
    # good scrapes came first, then only failures
    assert scrapes["ok"].iloc[0] and not scrapes["ok"].iloc[-1]


def test_a_target_never_up_or_failing_is_not_an_empty_frame(servers):
    failing = servers(twin_page("0.5.15"))
    failing.status = 500
    targets = [("prefill", "gone", f"http://127.0.0.1:{free_port()}"), ("decode", "sick", failing.url)]
    with mc.MetricsScraper(targets, interval_s=0.1) as scraper:
        assert scraper.wait_for(2, DEADLINE_S, ok=False)
    series = scraper.result()
    assert len(series.to_frame()) > 0
    scrapes = series.scrapes_frame()
    assert not scrapes["ok"].any()
    gone = scrapes[scrapes["host"] == "gone"]
    sick = scrapes[scrapes["host"] == "sick"]
    assert gone["error"].str.contains("refused", case=False).all()
    assert (sick["http_status"] == 500).all() and sick["error"].str.startswith("HTTP 500").all()
    assert "gone" in series._repr_html_() and "refused" in series._repr_html_()


def test_garbage_and_hung_pages_are_error_rows(servers):
    garbage = servers(lambda: b"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{tp_rank=0} 1\n")
    hung = servers(twin_page("0.5.15"))
    hung.hold.set()
    targets = [("prefill", "garbage", garbage.url), ("decode", "hung", hung.url)]
    with mc.MetricsScraper(targets, interval_s=0.1, timeout_s=0.3) as scraper:
        assert scraper.wait_for(2, DEADLINE_S, ok=False)
        hung.released.set()
    scrapes = scraper.result().scrapes_frame()
    bad = scrapes[scrapes["host"] == "garbage"]
    assert not bad["ok"].any()
    # Every page that arrived is the parse error (200 and still an error row); on a loaded machine
    # a scrape of it may also miss the 0.3 s deadline, which is a timeout row, never a good one.
    answered = bad[bad["http_status"] == 200]
    assert len(answered) >= 1 and answered["error"].str.startswith("ExpositionParseError: line 2: bad label set").all()
    assert bad[bad["http_status"] != 200]["error"].str.contains("timed out").all()
    slow = scrapes[(scrapes["host"] == "hung") & ~scrapes["ok"]]
    assert len(slow) >= 2 and slow["error"].str.contains("timed out").all()


def test_stop_is_prompt_while_idle_and_joins(servers):
    server = servers(twin_page("0.5.15"))
    scraper = mc.MetricsScraper([("prefill", "p0", server.url)], interval_s=30.0).start()
    assert scraper.wait_for(1, DEADLINE_S)
    requests = server.requests
    threads = [t for t in threading.enumerate() if t.name.startswith("metrics-scraper-")]
    assert len(threads) == 1
    scraper.stop()  # the thread is waiting out a 30 s interval on an Event: stop wakes it
    assert not threads[0].is_alive()
    assert server.requests == requests  # no scrape in between: waiting, not polling
    assert len(scraper.result().scrapes_frame()) == 1


def test_scraper_rejects_bad_arguments():
    with pytest.raises(ValueError):
        mc.MetricsScraper([], interval_s=1)
    with pytest.raises(ValueError):
        mc.MetricsScraper([("prefill", "h", "http://127.0.0.1:1")], interval_s=0)
    assert mc.metrics_url("http://10.0.3.17:30000") == "http://10.0.3.17:30000/metrics"
    assert mc.metrics_url("http://10.0.3.17:30000/metrics") == "http://10.0.3.17:30000/metrics"
    assert mc.metrics_url("10.0.3.17:30000/") == "http://10.0.3.17:30000/metrics"
    assert mc.redact_url("http://ops:s3cret@10.0.3.17:30000/metrics?token=t0k") == (
        "http://<redacted>@10.0.3.17:30000/metrics?token=<redacted>")
    record = mc.scrape_once("prefill", "h", f"http://ops:s3cret@127.0.0.1:{free_port()}", timeout_s=5)
    assert not record.ok and "s3cret" not in record.url and "s3cret" not in (record.error or "")


# ----------------------------------------------------------------------------------------------
# Rendering


def test_series_renders_in_a_notebook_and_plots(servers):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rich.console import Console

    server = servers(twin_page("0.5.11"))
    with mc.MetricsScraper([("prefill", "p0", server.url)], interval_s=0.1) as scraper:
        assert scraper.wait_for(4, DEADLINE_S, ok=True)  # good ones: a loaded machine fails some
    series = scraper.result()
    html = series._repr_html_()
    assert "<table" in html and "p0" in html and "scrapes" in html
    console = Console(record=True, width=160)
    console.print(series)
    assert "p0" in console.export_text()
    ax = series.plot("sglang:num_transfer_failed_reqs_total")
    try:
        assert ax.get_xlabel() == "time (UTC)"
        assert ax.get_ylabel() == "sglang:num_transfer_failed_reqs_total [requests/s]"
        assert len(ax.get_lines()) == 1 and len(ax.get_lines()[0].get_xdata()) >= 4
    finally:
        plt.close(ax.figure)
    ax = series.plot("sglang:num_prefill_prealloc_queue_reqs")  # the old name, shown as the current one
    try:
        assert ax.get_ylabel() == "sglang:num_prefill_bootstrap_queue_reqs [requests]"
    finally:
        plt.close(ax.figure)


def test_lazy_export():
    import forensics as fx

    assert fx.collectors.MetricsScraper is mc.MetricsScraper
    assert "collectors" in dir(fx)


# ----------------------------------------------------------------------------------------------
# The same series from a real Prometheus server's HTTP API


def _static_page(version: str):
    metrics = TwinMetrics(version, "prefill")
    metrics.transfer_failed.inc(7)
    metrics.prefill_bootstrap_queue.set(12)
    metrics.num_queue_reqs.set(3)
    return metrics.exposition


@pytest.fixture
def prometheus(tmp_path, servers):
    """A real Prometheus (Debian's) scraping a 0.5.11 and a 0.5.15 prefill page every 200 ms."""
    from prometheus_helpers import running_prometheus

    old, new = servers(_static_page("0.5.11")), servers(_static_page("0.5.15"))
    targets = {old.url.split("//")[1]: {"role": "prefill", "host": "p-old"},
               new.url.split("//")[1]: {"role": "prefill", "host": "p-new"}}
    with running_prometheus(tmp_path, targets, interval="200ms") as api:
        yield api, old, new


@pytest.mark.server
def test_prometheus_api_gives_the_same_series_as_the_scraper(prometheus):
    from forensics.collectors.prometheus_api import metric_selector

    api, old, new = prometheus
    targets = [("prefill", "p-old", old.url), ("prefill", "p-new", new.url)]
    with mc.MetricsScraper(targets, interval_s=0.2) as scraper:
        assert scraper.wait_for(3, DEADLINE_S, ok=True)
        # readiness: Prometheus has scraped both targets a few times (waiting on our own scrapes)
        for n in range(4, 4 + int(DEADLINE_S / 0.2)):
            got = api.instant('count_over_time(sglang:num_queue_reqs{job="sglang"}[1m])').to_frame()
            if len(got) == 2 and (got["value"] >= 3).all():
                break
            scraper.wait_for(n, DEADLINE_S)  # one more of our scrapes: about one of Prometheus's
        else:
            pytest.fail("Prometheus never scraped both targets")
    ours = scraper.result().to_frame()
    ours = ours[ours["metric"] != mc.SCRAPE_OK_METRIC]
    last_ours = ours.sort_values("ts").groupby(["host", "metric", "labels"]).last()["value"]
    # A scrape of Prometheus's own that timed out on a loaded machine marks its target's series
    # stale until the next one: ask again (bounded) until both targets' last scrapes were good.
    deadline = time.monotonic() + DEADLINE_S
    while True:
        theirs = api.instant('{job="sglang"}').to_frame()
        theirs_by_key = theirs.set_index(["host", "metric", "labels"])["value"]
        common = last_ours.index.intersection(theirs_by_key.index)
        if len(common) == len(last_ours) or time.monotonic() > deadline:
            break
        threading.Event().wait(0.2)
    assert {c: str(t) for c, t in theirs.dtypes.items()} == mc.SAMPLES_SCHEMA
    assert len(common) == len(last_ours)  # every series we scraped, Prometheus has, labels alike
    np.testing.assert_array_equal(last_ours.loc[common].to_numpy(), theirs_by_key.loc[common].to_numpy())
    assert set(theirs["url"]) == {old.url + "/metrics", new.url + "/metrics"}

    # the renamed gauge under both names, in one canonical column, from both sources
    selector = metric_selector("sglang:num_prefill_bootstrap_queue_reqs")
    assert "sglang:num_prefill_prealloc_queue_reqs" in selector
    now = time.time()
    gauge = api.range(selector, now - 30, now, 0.2).to_frame()
    assert set(gauge["host"]) == {"p-old", "p-new"}
    assert set(gauge["metric_canonical"]) == {"sglang:num_prefill_bootstrap_queue_reqs"}
    assert dict(gauge.groupby("host")["metric"].first()) == {
        "p-old": "sglang:num_prefill_prealloc_queue_reqs", "p-new": "sglang:num_prefill_bootstrap_queue_reqs"}
    assert (gauge["value_int"] == 12).all() and gauge["rate"].isna().all()
    counter = api.metric("sglang:num_transfer_failed_reqs_total", now - 30, now, 0.2).to_frame()
    assert (counter["type"] == "counter").all() and (counter["value_int"] == 7).all()
    assert (counter["rate"].dropna() == 0).all() and counter["rate"].notna().any()


def test_prometheus_api_unreachable_is_an_environment_problem():
    from forensics.collectors.prometheus_api import PrometheusAPI, PrometheusQueryError
    from forensics.exitcodes import EnvironmentProblem

    api = PrometheusAPI(f"http://127.0.0.1:{free_port()}", timeout_s=5)
    with pytest.raises(PrometheusQueryError, match="refused") as caught:
        api.instant("up")
    assert isinstance(caught.value, EnvironmentProblem)
    assert not api.ready()


def test_collectors_import_stays_off_the_twin_and_matplotlib():
    import subprocess
    import sys

    code = ("import sys, forensics as fx\n"
            "fx.collectors.MetricsScraper\n"
            "print(','.join(m for m in ('matplotlib', 'forensics.twin', 'prometheus_client') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == ""  # collectors never import the twin; plotting loads matplotlib on use
