"""The handler map read from real sglang wheels: boundary releases, findings, diff, matrix, CLI.

Expectations are the reference sheet's (docs: /work/shared/reference/sglang-pd-facts.md),
checked against what the analysis extracts from each release's own source. Line numbers
are never hard-coded: they are looked up in the release's file by the text they hold.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from forensics.handlers import diff, map_release
from forensics.handlers.findings import FRAGILE, UNHANDLED
from forensics.handlers.model import DIES, DROPPED_WARNING, HANDLED, PREFILL
from forensics.sglang_source import fetch
from tests.handler_helpers import copy_release_tree as _copy_tree

BOUNDARY = ["0.5.1", "0.5.9", "0.5.12.post1", "0.5.13", "0.5.15.post1", "0.5.16", "0.5.18", "0.5.19", "0.5.21",
            "0.5.22", "0.5.23"]


@functools.cache
def mapped(version: str):
    return map_release(fetch(version))


def line_of(version: str, relpath: str, text: str) -> int:
    """1-based line of the first line containing ``text`` in the release's file."""
    lines = (fetch(version).disaggregation / relpath).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


def guard_assert_ok(path: Path, line: int) -> bool:
    """``line`` starts the ``assert`` whose message says "Foreign traffic?" (found by its text)."""
    lines = path.read_text().splitlines()
    message = next(number for number, text in enumerate(lines, 1) if "Foreign traffic?" in text)
    return lines[line - 1].lstrip().startswith("assert") and 0 <= message - line <= 3


def abort_deliveries(version: str, backend: str):
    return [d for d in mapped(version).backend(backend).deliveries
            if d.message.tag == "ABORT" and d.message.receiver_role == PREFILL]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", BOUNDARY)
def test_boundary_release_map(version):
    v = Version(version)
    handler_map = mapped(version)
    nixl = handler_map.backend("nixl")
    mooncake = handler_map.backend("mooncake")
    (nixl_prefill,) = nixl.loops_for(PREFILL)

    # The decode sends ABORT from 0.5.13, through abort() and the waiting timeout.
    aborts = abort_deliveries(version, "nixl")
    assert bool(aborts) == (v >= Version("0.5.13"))
    if aborts:
        assert aborts[0].message.function.endswith("_send_abort_notification")
        assert "_check_waiting_timeout" in aborts[0].message.via

    # NIXL's prefill loop: ABORT case from 0.5.16; never daemon; GUARD assert kills foreign frames.
    assert nixl.handles_abort() == (v >= Version("0.5.16"))
    assert nixl_prefill.daemon is False
    assert nixl_prefill.per_message_try is False
    assert nixl_prefill.dies_on_unknown
    assert "Foreign traffic?" in nixl_prefill.foreign.detail
    assert guard_assert_ok(fetch(version).disaggregation / "nixl/conn.py", nixl_prefill.foreign.line)
    assert "GUARD" in nixl_prefill.foreign.source
    assert nixl_prefill.wrapper == ("logs and re-raises" if v >= Version("0.5.21") else "none")
    assert nixl.bootstrap_timeout == (v >= Version("0.5.18"))
    # The vulnerable window comes out of the deliveries: an ABORT that kills the loop.
    kills = any(d.outcome.fate == DIES for d in aborts)
    assert kills == (Version("0.5.13") <= v < Version("0.5.16"))

    # Mooncake: ABORT case from 0.5.13, bootstrap timeout always, daemon from 0.5.21.
    assert mooncake.handles_abort() == (v >= Version("0.5.13"))
    assert mooncake.bootstrap_timeout is True
    assert mooncake.loops_for(PREFILL)[0].daemon == (v >= Version("0.5.21"))

    # ascend inherits Mooncake's loops (it overrides neither thread).
    ascend = handler_map.backend("ascend")
    assert ascend.inherits == "mooncake"
    assert {loop.inherited_from for loop in ascend.loops} == {"mooncake"}
    assert ascend.handles_abort() == mooncake.handles_abort()

    # mori (from 0.5.9): drops ABORT with a warning until 0.5.18, handles it from 0.5.19.
    if v >= Version("0.5.9"):
        mori = handler_map.backend("mori")
        (mori_prefill,) = mori.loops_for(PREFILL)
        assert mori_prefill.daemon is True and mori_prefill.per_message_try is True
        assert not mori_prefill.dies_on_unknown
        mori_aborts = abort_deliveries(version, "mori")
        if Version("0.5.13") <= v <= Version("0.5.18"):
            assert [d.outcome.fate for d in mori_aborts] == [DROPPED_WARNING]
        if v >= Version("0.5.19"):
            assert {d.outcome.fate for d in mori_aborts} == {HANDLED}
        if v < Version("0.5.13"):
            assert mori_aborts == []  # no decode sends ABORT before 0.5.13
    else:
        assert "mori" not in handler_map.backends


@pytest.mark.timeout(120)
def test_0_5_15_findings_say_what_happens():
    handler_map = mapped("0.5.15")
    critical = [f for f in handler_map.findings if f.backend == "nixl" and f.kind == UNHANDLED]
    assert len(critical) == 1
    finding = critical[0]
    assert (finding.severity, finding.tag, finding.fate) == ("critical", "ABORT", DIES)
    assert guard_assert_ok(fetch("0.5.15").disaggregation / "nixl/conn.py", finding.line)
    assert "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?" in finding.summary
    assert "abort" in finding.summary and "_check_waiting_timeout" in finding.summary
    # The frame: [b"ABORT", room, ip, port].
    (delivery,) = abort_deliveries("0.5.15", "nixl")
    assert [e.label() for e in delivery.message.shape.elements] == ["ABORT", "<int>", "<text>", "<int>"]
    # Mooncake marks the room Failed and acks.
    (mooncake_abort,) = abort_deliveries("0.5.15", "mooncake")
    assert mooncake_abort.outcome.fate == HANDLED
    assert mooncake_abort.outcome.line == line_of("0.5.15", "mooncake/conn.py", 'if room == "ABORT":')
    assert "update_status(room_to_be_aborted, KVPoll.Failed)" in mooncake_abort.outcome.source
    assert "ABORT_ACK" in mooncake_abort.outcome.source
    # ...and its ACK is a message the decode side handles.
    acks = [d for d in handler_map.backend("mooncake").deliveries if d.message.tag == "ABORT_ACK"]
    assert acks and all(d.outcome.fate == HANDLED for d in acks)
    # mori drops it with a warning (the room is never failed): a warning finding.
    mori = [f for f in handler_map.findings if f.backend == "mori" and f.tag == "ABORT"]
    assert [(f.severity, f.fate) for f in mori] == [("warning", DROPPED_WARNING)]


@pytest.mark.timeout(120)
def test_0_5_23_nixl_still_dies_on_unknown_tags():
    handler_map = mapped("0.5.23")
    nixl = handler_map.backend("nixl")
    fragile = [f for f in handler_map.findings if f.backend == "nixl" and f.kind == FRAGILE]
    assert [f.receiver_role for f in fragile] == [PREFILL]
    assert fragile[0].line == line_of("0.5.23", "nixl/conn.py", "assert waiting_req_bytes[0] == GUARD")
    assert guard_assert_ok(fetch("0.5.23").disaggregation / "nixl/conn.py", fragile[0].line)
    # ABORT is handled one call deep, through _handle_abort_notification and ABORT_TAG from common/conn.py.
    (prefill,) = nixl.loops_for(PREFILL)
    abort_branch = next(b for b in prefill.branches if "ABORT" in b.tags)
    assert abort_branch.kind == "helper" and "_handle_abort_notification" in abort_branch.source
    (delivery,) = abort_deliveries("0.5.23", "nixl")
    assert delivery.outcome.fate == HANDLED
    # AbortNotification.to_zmq(): 2 frames, then ip/port, then generation.
    assert delivery.message.shape.arity == (2, 5)
    # Unlike Mooncake's recv wrapper, NIXL's loop has no BOOTSTRAP case (prefill_complete policy).
    bootstrap = [d for d in nixl.deliveries if d.message.tag == "BOOTSTRAP"]
    assert bootstrap and bootstrap[0].outcome.fate == DIES
    mooncake_bootstrap = [d for d in handler_map.backend("mooncake").deliveries if d.message.tag == "BOOTSTRAP"]
    assert mooncake_bootstrap[0].outcome.fate == HANDLED
    assert "_make_worker_recv" in mooncake_bootstrap[0].outcome.detail


@pytest.mark.timeout(120)
def test_deleting_the_abort_call_from_0_5_16_brings_the_finding_back(tmp_path):
    from forensics.sglang_source import from_directory

    disaggregation = _copy_tree("0.5.16", tmp_path)
    conn = disaggregation / "nixl" / "conn.py"
    text = conn.read_text()
    call = "                if self._handle_abort_notification(waiting_req_bytes):\n                    continue\n"
    assert text.count(call) == 1
    conn.write_text(text.replace(call, ""))
    handler_map = map_release(from_directory(tmp_path, version="0.5.16+no-abort-call"))
    assert handler_map.version == "0.5.16+no-abort-call"
    critical = [f for f in handler_map.findings if f.backend == "nixl" and f.kind == UNHANDLED and f.tag == "ABORT"]
    assert len(critical) == 1 and critical[0].fate == DIES
    assert guard_assert_ok(conn, critical[0].line)
    assert handler_map.backend("nixl").handles_abort() is False
    # The untouched release still handles it.
    assert mapped("0.5.16").backend("nixl").handles_abort() is True


@pytest.mark.timeout(120)
def test_bad_input_is_named_and_partial_maps_survive(tmp_path):
    from forensics.handlers.handler_map import NoDisaggregationCode
    from forensics.sglang_source import from_directory

    (tmp_path / "empty" / "sglang" / "srt").mkdir(parents=True)
    with pytest.raises(NoDisaggregationCode, match="disaggregation"):
        map_release(from_directory(tmp_path / "empty"))

    fork = tmp_path / "fork"
    disaggregation = _copy_tree("0.5.15", fork)
    (disaggregation / "mooncake" / "conn.py").write_text("def broken(:\n")
    nixl_conn = disaggregation / "nixl" / "conn.py"
    # A fork that renamed the thread starter and the loop function: still found through Thread(target=...).
    nixl_conn.write_text(nixl_conn.read_text().replace("_start_bootstrap_thread", "_start_prefill_listener")
                         .replace("bootstrap_thread", "prefill_listener"))
    handler_map = map_release(from_directory(fork))
    gap = next(g for g in handler_map.gaps if g.file == "mooncake/conn.py")
    assert "does not parse" in gap.reason and "line 1" in gap.reason
    assert "mooncake" not in handler_map.backends
    # ascend runs mooncake's loop, which does not parse: not a backend, a named gap.
    assert "ascend" not in handler_map.backends and any(g.file == "ascend/conn.py" for g in handler_map.gaps)
    nixl = handler_map.backend("nixl")
    (prefill,) = nixl.loops_for(PREFILL)
    assert prefill.function.endswith("_start_prefill_listener.prefill_listener")
    assert [d.outcome.fate for d in abort_deliveries_of(handler_map, "nixl")] == [DIES]
    with pytest.raises(KeyError, match="mooncake"):
        handler_map.backend("mooncake")


def abort_deliveries_of(handler_map, backend):
    return [d for d in handler_map.backend(backend).deliveries if d.message.tag == "ABORT"]


@pytest.mark.timeout(120)
def test_diff_table_html_and_text_show_the_gap():
    result = diff("0.5.15", "nixl", "mooncake")
    frame = result.to_frame()
    assert frame.loc[("prefill", "ABORT"), "gap"]
    assert frame.loc[("prefill", "ABORT"), "nixl"].startswith("thread dies: AssertionError")
    assert frame.loc[("prefill", "ABORT"), "mooncake"].startswith("handled: Decode-side abort notification")
    assert not frame.loc[("prefill", "WATERMARK"), "gap"]
    html = result._repr_html_()
    assert "GAP" in html and "Foreign traffic?" in html and "room == &quot;ABORT&quot;" in html
    text = result.text(width=200)
    assert "ABORT" in text and "thread dies" in text and 'if room == "ABORT":' in text
    document = result.to_dict()
    row = next(r for r in document["rows"] if r["role"] == "prefill" and r["tag"] == "ABORT")
    assert row["cells"]["nixl"]["fate"] == DIES and row["cells"]["mooncake"]["fate"] == HANDLED


@pytest.mark.server
@pytest.mark.timeout(240)
def test_sandbox_confirms_the_critical_nixl_findings():
    result = diff("0.5.15", "nixl", "mooncake", confirm=True)
    nixl = {(f.kind, f.tag): f.confirmation for f in result.findings if f.backend == "nixl"}
    assert nixl[(UNHANDLED, "ABORT")].startswith("died: AssertionError")
    assert "Foreign traffic?" in nixl[(UNHANDLED, "ABORT")]
    assert nixl[(FRAGILE, "<unknown tag>")].startswith("died")
    assert "static: dies; sandbox: died" in result._repr_html_()
    # 0.5.23: the decode's BOOTSTRAP frame (prefill_complete policy) is new, and the real loop dies on it.
    newer = diff("0.5.23", "nixl", "mooncake", confirm=True)
    bootstrap = [f for f in newer.findings if f.backend == "nixl" and f.tag == "BOOTSTRAP"]
    assert [f.confirmation.split(":")[0] for f in bootstrap] == ["died"]
    assert any("policy" in c for c in bootstrap[0].conditions)


@pytest.mark.timeout(120)
def test_matrix_window_comes_from_the_rows(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from forensics.handlers import matrix

    result = matrix(["0.5.12.post1", "0.5.13", "0.5.15.post1", "0.5.16"], workers=1, use_cache=False)
    assert result.window("nixl") == ["0.5.13", "0.5.15.post1"]
    assert result.window("mooncake") == []
    nixl = result.frame[result.frame.backend == "nixl"].set_index("release")
    assert nixl.loc["0.5.16", "handles_abort"] and not nixl.loc["0.5.15.post1", "handles_abort"]
    assert "ABORT" in nixl.loc["0.5.13", "frames_sent"] and "ABORT" not in nixl.loc["0.5.12.post1", "frames_sent"]
    ax = result.plot()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert "nixl: ABORT kills loop" in labels and "0.5.13" in [t.get_text() for t in ax.get_yticklabels()]
    assert "0.5.13 .. 0.5.15.post1" in ax.get_title()
    ax.figure.savefig(tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 10_000


@pytest.mark.timeout(240)
def test_cli_json_exit_codes_and_out_dir(tmp_path):
    forensics = [sys.executable, "-m", "forensics"]
    out = tmp_path / "report"
    proc = subprocess.run([*forensics, "handlers", "diff", "--sglang", "0.5.15", "--no-confirm", "--json",
                           "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    document = json.loads(proc.stdout)  # one JSON document and nothing else
    assert document["version"] == "0.5.15" and (out / "diff.html").is_file()
    assert json.loads((out / "diff.json").read_text())["rows"] == document["rows"]

    clean = tmp_path / "clean"
    disaggregation = _copy_tree("0.5.23", clean)
    import shutil

    for backend in ("nixl", "mooncake", "ascend"):
        shutil.rmtree(disaggregation / backend)
    proc = subprocess.run([*forensics, "handlers", "check", "--source", str(clean), "--json"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["clean"] and report["backends"] == ["mori"]

    proc = subprocess.run([*forensics, "handlers", "check", "--source", str(tmp_path / "nothing-here"), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and "no such directory" in proc.stderr

    proc = subprocess.run([*forensics, "handlers", "matrix", "--from", "0.5.15", "--to", "0.5.16", "--json",
                           "--workers", "1", "--png", str(tmp_path / "m.png")], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["windows"]["nixl"]["abort_kills"] == ["0.5.15", "0.5.15.post1"]
    assert (tmp_path / "m.png").is_file()


MATRIX_SPAN = ["0.5.15", "0.5.15.post1", "0.5.16"]  # every release from 0.5.15 to 0.5.16


@pytest.mark.timeout(180)
def test_matrix_cli_reports_each_release_on_a_stderr_that_is_not_a_terminal():
    # A log or CI job gets one line per release instead of a minute of silence; stdout stays one JSON document.
    proc = subprocess.run([sys.executable, "-m", "forensics", "handlers", "matrix", "--from", "0.5.15", "--to", "0.5.16",
                           "--json", "--workers", "2"], capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr
    total = len(MATRIX_SPAN)
    assert proc.stderr.splitlines() == [f"handlers matrix: {v} ({i}/{total})" for i, v in enumerate(MATRIX_SPAN, 1)]
    document, end = json.JSONDecoder().raw_decode(proc.stdout)
    assert proc.stdout[end:].strip() == "" and document["status"] == "mapped"
    assert sorted({row["release"] for row in document["rows"]}, key=Version) == MATRIX_SPAN


@pytest.mark.timeout(180)
def test_matrix_progress_a_bar_in_ipython_silence_in_a_script_or_a_callback(monkeypatch, capsys):
    import types

    import forensics as fx

    seen: list[str] = []
    fx.handlers.matrix(MATRIX_SPAN, workers=1, progress=seen.append)
    assert seen == MATRIX_SPAN
    assert capsys.readouterr().err == ""

    fx.handlers.matrix(MATRIX_SPAN, workers=1)  # a plain script: no bar
    assert capsys.readouterr().err == ""

    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: object()))
    fx.handlers.matrix(MATRIX_SPAN, workers=1)  # under IPython: tqdm's bar, on stderr here (no ipywidgets)
    bar = capsys.readouterr().err
    assert "handlers matrix" in bar and f"{len(MATRIX_SPAN)}/{len(MATRIX_SPAN)}" in bar and "0.5.16" in bar
    fx.handlers.matrix(MATRIX_SPAN, workers=1, progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_release_window():
    from forensics.handlers import matrix

    result = matrix(use_cache=False)  # every release analysed again, not read from stored rows
    assert result.window("nixl") == ["0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1"]
    assert result.window("mooncake") == [] and result.window("ascend") == []
    mori = result.frame[result.frame.backend == "mori"].set_index("release")
    dropped = sorted(mori[mori.abort_fate == DROPPED_WARNING].index[mori.decode_sends_abort[
        mori.abort_fate == DROPPED_WARNING]], key=Version)
    assert dropped == ["0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18"]
    nixl = result.frame[result.frame.backend == "nixl"]
    assert nixl.dies_on_unknown.all() and not nixl.daemon.any()
