"""count_signatures() against scan() and against GNU grep / ripgrep on generated incident logs."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import journal_corpus
from forensics.logs import catalogue, incident, scan
from forensics.logs.counting import (
    RUST,
    CountError,
    PatternError,
    classify_line,
    count_signatures,
    grep_patterns,
    to_ere,
)
from forensics.logs.prefilter import BYTES_FIND, HYPERSCAN, LiteralPrefilter, hyperscan

IDS = list(dict.fromkeys(s.id for s in catalogue.event_signatures()))  # derived entries share ids
GREP_ENV = {**os.environ, "LC_ALL": "C"}


@pytest.fixture(scope="module")
def story() -> incident.Incident:
    # 0.5.15 with DEBUG on: trigger, ABORT sends, thread death, waiting timeouts.
    return incident.generate("0.5.15", steady_seconds=60, after_seconds=330, waiting_timeout=300)


@pytest.fixture(scope="module")
def logs(story, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("counting")
    files = {fmt: incident.write_journal_text(story, root / f"journal-{fmt}.txt", style=fmt)
             for fmt in ("short-iso", "short-precise", "json")}
    files["plain"] = root / "sglang"
    incident.write_sglang_logs(story, files["plain"])
    return files


def _scan_counts(path: Path) -> dict[str, int]:
    found = Counter(scan(path, year=2025).events["signature"])
    return {sid: found.get(sid, 0) for sid in IDS}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["plain", "short-iso", "short-precise", "json"])
def test_counts_equal_scan_events(story, logs, fmt):
    counts = count_signatures(logs[fmt])
    assert counts == _scan_counts(logs[fmt])
    assert list(counts) == IDS
    # The story, line by line: one trigger, one ABORT per trigger and timeout, one thread death.
    assert counts["decode_transfer_aborted"] == 1
    assert counts["thread_death"] == 1
    assert counts["nixl_guard_assertion"] == 1
    assert counts["decode_transfer_timeout"] == len(story.timeout_rooms) > 0
    assert counts["abort_sent"] == 1 + len(story.timeout_rooms)
    assert counts["scheduler_abort_request"] == 1
    assert counts["waiting_timeout_hint"] == 1
    assert sum(counts.values()) == 5 + 2 * len(story.timeout_rooms) + 1


# Hyperscan is a declared dependency on x86_64 (the analysis extra): only other machines may lack it.
@pytest.mark.skipif(platform.machine() != "x86_64" and hyperscan is None, reason="hyperscan has no build here")
@pytest.mark.parametrize("fmt", ["short-iso", "json"])
def test_prefilter_engines_agree(logs, fmt):
    assert count_signatures(logs[fmt], engine=HYPERSCAN) == count_signatures(logs[fmt], engine=BYTES_FIND)


def test_prefilter_line_starts_both_engines():
    data = b"alpha one\nbeta Foreign frame\n\nForeign frame twice Foreign frame\nlast disconnected"
    expected = [data.index(b"beta"), data.index(b"Foreign frame twice"), data.index(b"last")]
    assert LiteralPrefilter([b"Foreign frame", b"disconnected"], engine=BYTES_FIND).line_starts(data) == expected
    if hyperscan is not None:
        assert LiteralPrefilter([b"Foreign frame", b"disconnected"], engine=HYPERSCAN).line_starts(data) == expected
    with pytest.raises(ValueError, match="unknown prefilter engine"):
        LiteralPrefilter([b"x"], engine="grep")


def _grep_count(path: Path, pattern: str, earlier: list[str], tmp_path: Path) -> int:
    """Lines matching ``pattern`` and none of ``earlier``: first match wins, as in the catalogue."""
    first = subprocess.run(["grep", "-a", "-E", "-e", pattern, str(path)], capture_output=True, env=GREP_ENV)
    assert first.returncode in (0, 1), first.stderr
    if not earlier or not first.stdout:
        return first.stdout.count(b"\n")
    exclude = tmp_path / "earlier.txt"
    exclude.write_text("\n".join(earlier) + "\n")
    second = subprocess.run(["grep", "-a", "-c", "-v", "-E", "-f", str(exclude)], input=first.stdout,
                            capture_output=True, env=GREP_ENV)
    assert second.returncode in (0, 1), second.stderr
    return int(second.stdout)


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("grep") is None, reason="GNU grep not installed")
@pytest.mark.parametrize("fmt", ["plain", "short-iso", "short-precise"])
def test_counts_equal_grep_per_pattern(logs, fmt, tmp_path):
    patterns = grep_patterns(fmt)
    signatures = catalogue.event_signatures()
    assert len(patterns) == len(signatures)
    counts = count_signatures(logs[fmt])
    grep_counts = dict.fromkeys(IDS, 0)  # derived entries share an id: their lines add up
    for index, signature in enumerate(signatures):
        grep_counts[signature.id] += sum(_grep_count(f, patterns[index], patterns[:index], tmp_path)
                                         for f in _files(logs[fmt]))
    assert grep_counts == counts
    assert grep_counts["thread_death"] == 1 and grep_counts["decode_transfer_timeout"] > 0
    # One grep over the whole set counts the lines of any signature: the sum of ours.
    every = tmp_path / "all.txt"
    every.write_text("\n".join(patterns) + "\n")
    total = 0
    for f in _files(logs[fmt]):
        done = subprocess.run(["grep", "-a", "-c", "-E", "-f", str(every), str(f)], capture_output=True,
                              env=GREP_ENV, text=True)
        total += int(done.stdout)
    assert total == sum(counts.values())


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep not installed")
def test_ripgrep_dialect_counts_the_same_lines(logs, tmp_path):
    every = tmp_path / "all.txt"
    every.write_text("\n".join(grep_patterns("short-iso", dialect=RUST)) + "\n")
    done = subprocess.run(["rg", "-c", "-f", str(every), str(logs["short-iso"])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == sum(count_signatures(logs["short-iso"]).values())


def test_to_ere_conversions():
    assert to_ere(r"room (?P<room>-?\d+)") == "room (-?[0-9]+)"
    assert to_ere(r"(?:a|b)\S+?\.\.\.") == r"(a|b)[^[:space:]]+\.\.\."
    assert to_ere(r"^Exception in thread (?P<thread>.+?):\s*$") == "^Exception in thread (.+):[[:space:]]*$"
    assert to_ere(r"x.*?y??") == "x.*y?"
    assert to_ere(r"[^\s\[:]+") == "[^:[:space:][]+"
    assert to_ere(r"[ \d]\d") == "[ 0-9][0-9]"
    assert to_ere(r"[^\s\[:]+", dialect=RUST) == r"[^\[:[:space:]]+"
    with pytest.raises(PatternError, match="has no ERE form"):
        to_ere(r"a(?=b)")
    with pytest.raises(PatternError, match=r"\\b"):
        to_ere(r"\bword")


def test_converted_prefixes_match_what_python_matches():
    # The ERE for the journal prefix must accept exactly the lines Python splits (GNU grep decides).
    lines = [
        "2025-07-01T12:00:00+00:00 pd-node-1 sglang-prefill[4101]: Exception in thread Thread-5 (bootstrap_thread):",
        "2025-07-01T12:00:00.5+0000 host unit: Exception in thread T:",
        "2025-07-01T12:00:00+00:00 pd-node-1 sglang-decode[4202]: [2025-07-01 12:00:00 TP0] Abort queued request. "
        "req.rid='ab'",
        "2025-07-01T12:00:00+00:00 pd-node-1 sglang-prefill[4101]: [2025-07-01 12:00:00 TP0] Exception in thread X:",
        "junk Exception in thread X:",
    ]
    patterns = grep_patterns("short-iso")
    expected = [classify_line(line.encode(), "short-iso") for line in lines]
    assert expected == ["thread_death", "thread_death", "scheduler_abort_request", None, None]
    for line, sid in zip(lines, expected):
        for signature, pattern in zip(catalogue.event_signatures(), patterns):
            if signature.id not in ("thread_death", "scheduler_abort_request"):
                continue
            done = subprocess.run(["grep", "-c", "-E", "-e", pattern], input=line + "\n", capture_output=True,
                                  text=True, env=GREP_ENV)
            assert (done.stdout.strip() == "1") == (sid == signature.id), (line, signature.id)


def test_missing_source_is_named(tmp_path):
    with pytest.raises(CountError, match="nope.log"):
        count_signatures(tmp_path / "nope.log")


def test_json_format_has_no_grep_patterns():
    with pytest.raises(ValueError, match="JSON"):
        grep_patterns("json")


# ----------------------------------------------------------------- the benchmark corpus


@pytest.mark.timeout(120)
def test_corpus_counts_match_its_manifest_and_scan(tmp_path):
    path = tmp_path / "journal.log"
    manifest = journal_corpus.generate(path, 3 << 20, seed=11, incidents=2)
    assert path.stat().st_size == manifest.bytes >= 3 << 20
    assert manifest.lines == path.read_bytes().count(b"\n")
    counts = count_signatures(path)
    expected = {sid: manifest.signatures.get(sid, 0) for sid in IDS}
    assert counts == expected
    assert counts["thread_death"] == 2 and counts["decode_transfer_timeout"] == 2 * journal_corpus.TIMEOUTS_PER_INCIDENT
    result = scan(path)
    assert _scan_counts_from(result) == expected
    lines = path.read_bytes().split(b"\n")
    for number in manifest.incident_lines:
        assert b"Exception in thread Thread-5 (bootstrap_thread):" in lines[number - 1]
    assert sorted(result.events.loc[result.events["signature"] == "thread_death", "line"]) == manifest.incident_lines
    kinds = manifest.kinds
    assert len(result.batches) == kinds["prefill_batch"] + kinds["decode_batch"]
    assert int(result.access["count"].sum()) == sum(v for k, v in kinds.items() if k.startswith("access_"))
    assert result.lines_unknown == 0
    # Mix as documented: every steady kind within a point of its share.
    shares = manifest.mix_percent()
    for kind, share in journal_corpus.MIX:
        assert abs(shares[kind] - share) < 1.0, kind


def _scan_counts_from(result) -> dict[str, int]:
    found = Counter(result.events["signature"])
    return {sid: found.get(sid, 0) for sid in IDS}


@settings(deadline=None, max_examples=60)
@given(new_seq=st.integers(0, 10**6), new_token=st.integers(0, 10**6), running=st.integers(0, 500),
       queue=st.integers(0, 10**4), bootstrap=st.integers(0, 10**4), inflight=st.integers(0, 10**4),
       throughput=st.floats(0, 1e7, allow_nan=False))
def test_corpus_templates_equal_the_incident_builders(new_seq, new_token, running, queue, bootstrap, inflight,
                                                      throughput):
    templates = journal_corpus.Templates()
    args = (new_seq, new_token, running, queue, bootstrap, inflight, throughput)
    assert templates.render_prefill(*args) == incident.prefill_batch_line("0.5.15", *args)
    tokens = new_token % 400_000
    decode = (running, tokens, queue, inflight, throughput)
    assert templates.render_decode(*decode) == incident.decode_batch_line("0.5.15", *decode)


def test_parse_size():
    assert journal_corpus.parse_size("1G") == 1 << 30
    assert journal_corpus.parse_size("100M") == 100 << 20
    assert journal_corpus.parse_size("64kb") == 64 << 10
    assert journal_corpus.parse_size("1234") == 1234
    assert journal_corpus.parse_size("1.5M") == 1572864


# ------------------------------------------------------------------ the benchmark itself


@pytest.mark.thorough  # the benchmark script end to end on a small corpus: CI
@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("grep") is None, reason="GNU grep not installed")
def test_throughput_benchmark_ci_sized(tmp_path):
    from benchmarks import logs_throughput

    affinity = os.sched_getaffinity(0)
    try:
        figures = logs_throughput.run(tmp_path / "journal.log", 2 << 20, rounds=1)
    finally:
        os.sched_setaffinity(0, affinity)  # run() pins this process to one CPU
    # run() raises if any tool's count disagrees with the manifest; check the figures it reports.
    assert figures["signature_lines"] == sum(figures["expected"].values()) > 0
    assert figures["expected"]["thread_death"] == 3
    assert figures["scan_mbps"] > 0 and 50 < figures["scan_maxrss_mb"] < 4000
    assert "grep" in figures["best_seconds"] and figures["ratio_grep"] > 0
    section = logs_throughput.render(figures)
    assert "## Log forensics" in section and "MB/s" in section and "batch lines" in section
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Twin\n\nkeep me\n")
    logs_throughput.write_results(section, results)
    logs_throughput.write_results(section.replace("## Log forensics", "## Log forensics (again)"), results)
    text = results.read_text()
    assert "keep me" in text and text.count(logs_throughput.SECTION_START) == 1
    assert "## Log forensics (again)" in text


def test_benchmark_runner_names_unknown_benchmarks(capsys):
    from benchmarks.__main__ import main

    assert main(["no_such_benchmark"]) == 2
    assert main(["journal_corpus"]) == 2  # a generator, not a benchmark
    assert "--list" in capsys.readouterr().err
