"""No hand-kept per-release tables: the twin's metrics, both writers' log lines and the GUARD traceback
site are read from each release's own source, and checked here against that source by other means.

* Metrics: every family the twin exports is a declaration in the release's collector file (its
  ``name="sglang:..."`` literal at the recorded line), with the release's type and label names;
  an independent text scan of the collector classes finds the same names.
* Batch lines: the twin's and the generator's lines of a release are identical in form (one
  template) and each is a string the release's logging function can build (the catalogue test's
  own ``ast`` extractor, uncapped), and the batch-line parser reads the values back exactly.
* The log prefix has milliseconds only where the release's ``configure_logger`` reads SGLANG_LOG_MS.
* The GUARD assertion's line in the thread-death traceback is the one a 3.11 traceback names.
"""

from __future__ import annotations

import ast
import logging
import re
from datetime import UTC, datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from forensics import sglang_source
from forensics.collectors import metrics as mc
from forensics.collectors import renames as renames_module
from forensics.logs import batchlines, sglang_format
from forensics.logs import incident as gen
from forensics.logs.source_messages import ModuleMessages
from forensics.sglang_metrics import COLLECTOR_CLASSES, release_metrics
from forensics.twin import logformat
from forensics.twin.metrics import TwinMetrics

# Where something changed in the sources: the first and last release and each side of a change.
METRIC_RELEASES = ["0.5.1", "0.5.1.post2", "0.5.2", "0.5.4.post3", "0.5.6.post2", "0.5.7", "0.5.9", "0.5.10",
                   "0.5.11", "0.5.12", "0.5.15", "0.5.17", "0.5.23"]
LINE_RELEASES = ["0.5.1", "0.5.4", "0.5.5", "0.5.10", "0.5.12", "0.5.15", "0.5.23"]


def _families(page: bytes) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(page.decode())
            if not f.name.endswith("_created")}  # the text parser's view of counters' _created samples


@pytest.mark.parametrize("version", METRIC_RELEASES)
@pytest.mark.parametrize("engine_type", ["prefill", "decode"])
def test_twin_exports_exactly_what_the_release_registers(version, engine_type):
    """Registered: every unconditional declaration, with its labels and documentation. Exported as
    sglang's multiprocess collector shows them: no ``_created``, a family from its first write
    (the stats tick's scheduler gauges at once, a labelled counter or histogram only once moved)."""
    release = release_metrics(version)
    twin = TwinMetrics(version, engine_type)
    twin.transfer_failed.inc(2)
    twin.observe_transfer(0.01, 3 * 10**6, 0.004)
    twin.observe_stage("prefill_bootstrap", 0.2)
    page = twin.exposition()
    exported = _families(page)
    registered = {s.family: s.kind for s in release.registered()}
    assert set(twin.families) == {s.name for s in release.registered()}
    assert b"_created" not in page
    assert all(registered.get(name) == kind for name, kind in exported.items()), set(exported) - set(registered)
    ticked = {s.family for s in release.registered() if s.kind == "gauge" and s.collector == "scheduler"
              and set(s.labelnames) <= set(twin._values)
              and (release.tick_written is None or s.attribute in release.tick_written)}
    assert ticked <= set(exported), ticked - set(exported)
    moved = {"sglang:num_transfer_failed_reqs", "sglang:kv_transfer_latency_ms", "sglang:kv_transfer_speed_gb_s",
             "sglang:kv_transfer_total_mb", "sglang:kv_transfer_bootstrap_ms", "sglang:kv_transfer_alloc_ms",
             "sglang:per_stage_req_latency_seconds"}
    never = {s.family for s in release.registered() if s.kind in ("counter", "histogram") and s.labelnames
             and s.family not in moved}
    assert not never & set(exported), never & set(exported)
    root = sglang_source.fetch(version).root
    for spec in release.registered():
        declared = (root / spec.path).read_text(encoding="utf-8").splitlines()
        window = "\n".join(declared[spec.line - 1: spec.line + 3])
        assert f'"{spec.name}"' in window, (spec.name, spec.path, spec.line)
        family = twin.families[spec.name]
        assert tuple(family._labelnames) == spec.labelnames, spec.name
        assert family._documentation == spec.documentation


def _declared_names(version: str) -> set[str]:
    """Every ``name="sglang:..."`` in the scheduler and tokenizer collector classes, by a plain text scan."""
    release = release_metrics(version)
    path = next(s.path for s in release.specs if s.collector == "scheduler")
    text = (sglang_source.fetch(version).root / path).read_text(encoding="utf-8")
    tree = ast.parse(text)
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in COLLECTOR_CLASSES.values():
            names |= set(re.findall(r'name="(sglang:[^"]+)"', ast.get_source_segment(text, node)))
    return names


@pytest.mark.parametrize("version", METRIC_RELEASES)
def test_every_declaration_of_the_collectors_is_read(version):
    release = release_metrics(version)
    read = {s.name for s in release.specs if s.collector in COLLECTOR_CLASSES}
    assert read == _declared_names(version)


def test_metric_facts_read_from_the_sources():
    assert release_metrics("0.5.1").find("sglang:kv_transfer_latency_ms") is None
    assert release_metrics("0.5.1").find("sglang:per_stage_req_latency_seconds") is None
    assert release_metrics("0.5.2").find("sglang:per_stage_req_latency_seconds") is None
    assert release_metrics("0.5.3").find("sglang:per_stage_req_latency_seconds") is not None
    assert release_metrics("0.5.9").find("sglang:kv_transfer_latency_ms").kind == "gauge"
    assert release_metrics("0.5.10").find("sglang:kv_transfer_latency_ms").kind == "histogram"
    assert release_metrics("0.5.9").find("sglang:kv_transfer_bootstrap_ms").kind == "gauge"
    assert release_metrics("0.5.6.post2").find("sglang:http_requests_total") is None
    assert release_metrics("0.5.7").find("sglang:http_requests_total") is not None
    assert release_metrics("0.5.1.post1").find("sglang:num_prefill_infight_queue_reqs") is not None
    assert release_metrics("0.5.1.post2").find("sglang:num_prefill_inflight_queue_reqs") is not None
    assert release_metrics("0.5.11").labels["tokenizer"] == ("model_name", "engine_type")
    assert release_metrics("0.5.10").labels["tokenizer"] == ("model_name",)
    assert "is_streaming" in release_metrics("0.5.17").find("sglang:num_requests_total").labelnames


# The metric names the collectors, the diagnosis and the campaign read (they name the current ones).
NEEDED = ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
          "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
          "sglang:num_bootstrap_failed_reqs_total", "sglang:num_transfer_failed_reqs_total",
          "sglang:num_aborted_requests_total")


@pytest.mark.parametrize("version", METRIC_RELEASES)
def test_the_names_the_readers_need_are_found_where_the_release_has_them(version):
    from forensics.collection.engine_pieces import PROMETHEUS_METRICS
    from forensics.diagnosis.signals import BOOTSTRAP_QUEUE
    from forensics.validation.checks import COUNTER_PHASES

    assert set(NEEDED) >= set(PROMETHEUS_METRICS) | set(COUNTER_PHASES) | {BOOTSTRAP_QUEUE}
    twin = TwinMetrics(version, "prefill")
    for counter in (twin.bootstrap_failed, twin.transfer_failed, twin.num_aborted):
        counter.inc(0)  # a labelled counter shows from its first write, as in sglang's multiprocess mode
    page = mc.parse_exposition(twin.exposition()).to_frame()
    found = set(page["metric_canonical"])
    declared = {mc.canonical_name(s.name.removesuffix("_total") + ("_total" if s.kind == "counter" else ""))
                for s in release_metrics(version).registered()}
    for name in NEEDED:
        assert (name in found) == (name in declared), name  # absent only where the source lacks it: a gap


# ----------------------------------------------------------------------------------------------- lines


def _twin_lines(version: str) -> dict[str, str]:
    return {
        "prefill": logformat.prefill_batch_line(version, new_seq=1, new_token=512, token_usage=0.0, running_req=0,
                                                queue_req=0, bootstrap_req=57, inflight_req=1,
                                                input_throughput=1280.0),
        "decode": logformat.decode_batch_line(version, running_req=3, num_tokens=4096, token_usage=0.02,
                                              preallocated_usage=0.0, prealloc_req=0, transfer_req=12,
                                              gen_throughput=95.3),
    }


def _generator_lines(version: str) -> dict[str, str]:
    return {"prefill": gen.prefill_batch_line(version, 1, 512, 0, 0, 57, 1, 1280.0),
            "decode": gen.decode_batch_line(version, 3, 4096, 0, 12, 95.3)}


def _source_strings(version: str, role: str) -> list[re.Pattern]:
    """Every string the file that logs the release's batch line can build, as patterns (the catalogue's
    extractor, without its cap on += chains: the full PD chain is the longest)."""
    template = sglang_format.batch_template(version, role)
    path = sglang_source.fetch(version).root / template.path
    found = ModuleMessages(ast.parse(path.read_text(encoding="utf-8")), max_variants=1 << 13).templates()
    patterns = []
    for parts in found:
        if not (parts and isinstance(parts[0], str) and parts[0].startswith(sglang_format.HEADERS[role])):
            continue
        # a value prints no field separator; a message built elsewhere ({token_usage_msg}) may
        patterns.append(re.compile("".join(
            re.escape(p) if isinstance(p, str) else (".*?" if re.search(r"msg|_parts", p.expr) else "[^,]*?")
            for p in parts) + r"\Z"))
    return patterns


@pytest.mark.parametrize("version", LINE_RELEASES)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_twin_and_generator_write_the_release_batch_line(version, role):
    twin, generated = _twin_lines(version)[role], _generator_lines(version)[role]
    template = sglang_format.batch_template(version, role)
    # the twin runs on a CPU: "cpu graph" where the release labels the graph backend by device
    assert sglang_format.batch_template(version, role, device=logformat.DEVICE).regex().match(twin), twin
    assert template.regex().match(generated), generated
    assert any(p.match(twin) for p in _source_strings(version, role)), twin
    assert any(p.match(generated) for p in _source_strings(version, role)), generated
    kind = sglang_format.HEADERS[role].split()[0].encode()
    header = batchlines.HEADER.match(generated.encode())
    shape = batchlines.learn_shape(kind, generated.encode()[header.end():])
    assert list(shape.labels) == [label.encode() for label in template.labels()]
    values = dict(zip(shape.columns, batchlines.VALUES_IN_LINES.findall(generated.encode()[header.end():]),
                      strict=True))
    if role == "prefill":
        assert values["bootstrap_req"] == b"57" and values["inflight_req"] == b"1"
    else:
        assert values["running_req"] == b"3" and values["token"] == b"4096"


def test_batch_line_forms_that_changed():
    prefill = {v: gen.prefill_batch_line(v, 1, 1, 0, 0, 9, 0, 0.05) for v in LINE_RELEASES + ["0.5.16", "0.5.4.post1"]}
    assert prefill["0.5.1"].startswith("Prefill batch. ") and "#unbootstrapped-req: 9, " in prefill["0.5.1"]
    assert prefill["0.5.4"].startswith("Prefill batch [1], ")
    assert gen.prefill_batch_line("0.5.4", 1, 1, 0, 0, 9, 0, 0.05, iteration=7).startswith("Prefill batch [7], ")
    assert prefill["0.5.4.post1"].startswith("Prefill batch, ")
    assert gen.prefill_batch_line("0.5.5", 1, 1, 0, 0, 9, 0, 0.05, iteration=7).startswith("Prefill batch [7], ")
    assert "#prealloc-req: 9, " in prefill["0.5.10"] and "#bootstrap-req: 9, " in prefill["0.5.12"]
    assert "#optimistic-req" in prefill["0.5.16"] and "#optimistic-req" not in prefill["0.5.15"]
    assert gen.decode_batch_line("0.5.4", 1, 2, 3, 4, 5.0).endswith("#queue-req: 0, ")  # sglang's trailing separator


def test_prefix_has_milliseconds_only_where_the_release_reads_sglang_log_ms():
    record_ts = datetime(2025, 7, 1, 12, 0, 0, 123456, tzinfo=UTC)
    for version in ("0.5.1", "0.5.5.post3", "0.5.6", "0.5.15"):
        root = sglang_source.fetch(version).root
        utils = next(p for p in (root / "sglang/srt/utils/common.py", root / "sglang/srt/utils.py") if p.is_file())
        source = utils.read_text(encoding="utf-8")
        body = source[source.index("def configure_logger"):][:2000]
        reads_ms = "SGLANG_LOG_MS" in body
        record = gen.Record(record_ts, "prefill", "x", release=version)
        line = gen.sglang_line(record, millis=True)
        assert line == ("[2025-07-01 12:00:00.123 TP0] x" if reads_ms else "[2025-07-01 12:00:00 TP0] x"), version
        fmt = sglang_format.log_format(version)
        assert (fmt.fmt_ms is not None) == reads_ms


def test_twin_logging_uses_the_release_format(monkeypatch, capsys):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        for version, expected in (("0.5.5", r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] hello$"),
                                  ("0.5.15", r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] hello$")):
            monkeypatch.setenv("SGLANG_LOG_MS", "1")
            logformat.configure(version=version)
            logging.getLogger("forensics.test").info("hello")
            assert re.match(expected, capsys.readouterr().err.strip().splitlines()[-1]), version
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


@pytest.mark.parametrize("version", ["0.5.1", "0.5.13", "0.5.15", "0.5.20", "0.5.21", "0.5.23"])
def test_guard_line_is_read_from_the_source(version):
    site = sglang_format.guard_site(version)
    lines = sglang_source.fetch(version).read(site.path).splitlines()
    assert "== GUARD" in lines[site.line - 1] and lines[site.line - 1].strip() == site.text
    death = gen.thread_death_lines(version)
    assert f'nixl/conn.py", line {site.line}, in bootstrap_thread' in "\n".join(death)
    assert death[-2] == f"    {site.text}"
    if site.wrapper_line is not None:
        assert lines[site.wrapper_line - 1].strip() == "bootstrap_thread()"
        assert death[0].endswith("(bootstrap_thread_guarded):")
    # the releases the facts sheet names (§5.4)
    assert {"0.5.13": 1850, "0.5.15": 2349}.get(version, site.line) == site.line


@pytest.mark.thorough  # reads every release's metric sources (27 s): CI, not the fast lane
def test_renames_table_agrees_with_the_sources():
    """collectors/renames.toml is read by scrapers that never see a wheel; the sources hold it to account."""
    import tomllib

    from packaging.version import Version

    releases = sglang_source.available_releases("0.5.1", "0.5.23")
    declared = {v: {s.name for s in release_metrics(v).specs} for v in releases}
    rows = tomllib.loads(renames_module.RENAMES_FILE.read_text(encoding="utf-8"))["rename"]
    assert rows
    for row in rows:
        since = Version(row["since"])
        before = [v for v in releases if Version(v) < since]
        after = [v for v in releases if Version(v) >= since]
        assert before and after, row
        assert row["canonical"] in declared[after[0]], row
        assert row["canonical"] not in declared[before[-1]], row
        assert any(name in declared[before[-1]] for name in row["names"]), row
        assert not any(name in declared[v] for v in after for name in row["names"]), row
