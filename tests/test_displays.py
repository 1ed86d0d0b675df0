"""Every display reads well where it is used: JupyterLab (``_repr_html_``) and an 80-column terminal.

What must be visible is checked, not the exact markup: the findings sentence at the top of
the handler diff, code left-aligned (JupyterLab's table CSS right-aligns cells), GAP only
where a backend really gets a frame it does not handle, release names and rooms whole, the
verdict line first, and the patched run's room states (the proof) in ``patch verify``.
"""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from forensics.handlers import diff
from forensics.logs import incident as gen
from forensics.twin.api import TwinStatus
from tests.cli_helpers import invoke

MATRIX_RELEASES = ["0.5.12.post1", "0.5.13", "0.5.15.post1", "0.5.16"]


def text_of(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def tags(html: str, name: str) -> list[str]:
    return re.findall(rf"<{name}\b[^>]*>", html)


# ----------------------------------------------------------------------------- handler diff


@pytest.fixture(scope="module")
def diff_0_5_15():
    return diff("0.5.15", "nixl", "mooncake")


@pytest.mark.timeout(120)
def test_diff_html_findings_first_code_left_aligned(diff_0_5_15):
    html = diff_0_5_15._repr_html_()
    sentence = "the decode sends ABORT, the NIXL prefill loop has no case for it: thread dies"
    assert diff_0_5_15.headline()[0] == sentence
    assert sentence in html and html.index(sentence) < html.index("<table")
    # Every cell and every excerpt says its own alignment (inline styles beat JupyterLab's CSS).
    assert tags(html, "td") and all("text-align:left" in tag for tag in tags(html, "td"))
    assert tags(html, "pre") and all("text-align:left" in tag for tag in tags(html, "pre"))
    assert all("text-align:left" in tag for tag in tags(html, "th"))
    assert "Foreign traffic?" in html and "room == &quot;ABORT&quot;" in html


@pytest.mark.timeout(120)
def test_gap_marks_only_frames_a_backend_really_gets_and_does_not_handle(diff_0_5_15):
    # 0.5.15: the decode's ABORT kills NIXL's prefill loop (Mooncake handles it); an unknown frame
    # kills Mooncake's decode loop (NIXL's logs and drops it). Tags only one backend sends, which
    # the other would choke on but never gets, are wire-format differences, not gaps.
    assert [(row.role, row.tag) for row in diff_0_5_15.gaps()] == [("prefill", "ABORT"), ("decode", "<unknown tag>")]
    frame = diff_0_5_15.to_frame()
    assert not frame.loc[("prefill", "NixlMsgGuard+<room>"), "gap"]  # Mooncake never receives it
    assert not frame.loc[("prefill", "<unknown tag>"), "gap"]  # both die: a finding, not a difference
    html = diff_0_5_15._repr_html_()
    assert html.count("<b style='color:#d93025'>GAP</b>") == 2
    # 0.5.16: NIXL handles ABORT too: no gap on it.
    assert ("prefill", "ABORT") not in [(row.role, row.tag) for row in diff("0.5.16", "nixl", "mooncake").gaps()]


@pytest.mark.timeout(240)
def test_diff_cli_at_80_columns_verdict_then_findings(tmp_path):
    status, stdout, stderr = invoke("handlers", "diff", "--sglang", "0.5.15", "--no-confirm", "--out",
                                    str(tmp_path), columns=80)
    assert status == 1, stderr
    lines = stdout.splitlines()
    assert lines[0] == "sglang 0.5.15 nixl vs mooncake: findings"
    assert lines[1] == "- the decode sends ABORT, the NIXL prefill loop has no case for it: thread dies"
    assert max(len(line) for line in lines) <= 80
    saved = (tmp_path / "diff.html").read_text()
    assert saved.index("has no case for it: thread dies") < saved.index("<table")


# ----------------------------------------------------------------------------- release matrix


@pytest.mark.timeout(240)
def test_matrix_renders_itself_as_a_heatmap_table():
    from forensics.handlers import matrix

    result = matrix(MATRIX_RELEASES, workers=1)
    html = result._repr_html_()
    assert html.index("mapped") < html.index("<table")
    assert "0.5.13 .. 0.5.15.post1" in html
    for release in MATRIX_RELEASES:  # one row each, the name whole and never wrapped
        assert re.search(rf"<td style='[^']*white-space:nowrap[^']*'>{re.escape(release)}</td>", html)
    assert html.count("<tr>") == len(MATRIX_RELEASES) + 2  # two header rows, no 145 x 16 frame
    assert "thread dies" in html and "handled / survives" in html  # the legend
    assert "background:#e06666" in html and "background:#7cc48a" in html  # dies, handled
    text = text_of(result, 80)
    assert text.splitlines()[0].startswith("release matrix: mapped")
    for release in MATRIX_RELEASES:
        assert re.search(rf"^{re.escape(release)} ", text, re.MULTILINE), release


@pytest.mark.timeout(240)
def test_matrix_row_not_read_shows_a_question_mark_and_its_reason():
    from forensics.handlers import matrix
    from forensics.handlers.release_matrix import HandlerMatrix

    frame = matrix(["0.5.15", "0.5.16"], workers=1).frame.astype(object)
    index = frame.index[(frame.backend == "nixl") & (frame.release == "0.5.16")][0]
    for column in ("handles_abort", "abort_kills", "dies_on_unknown", "killing_tags"):
        frame.at[index, column] = None
    frame.at[index, "understood"], frame.at[index, "abort_fate"] = False, "not read"
    frame.at[index, "unreadable"] = "nixl/conn.py:12: a merge conflict marker"
    result = HandlerMatrix(frame)
    html = result._repr_html_()
    assert result.verdict == "inconclusive" and html.index("inconclusive") < html.index("<table")
    assert html.count(">?</td>") == 3 and "nixl/conn.py:12" in html
    text = text_of(result, 80)
    assert re.search(r"^0\.5\.16 +\?/\?", text, re.MULTILINE) and "nixl/conn.py:12" in text


@pytest.mark.timeout(240)
def test_matrix_cli_at_80_columns_keeps_release_names_whole():
    status, stdout, stderr = invoke("handlers", "matrix", "--from", "0.5.15", "--to", "0.5.16", "--workers", "1",
                                    columns=80)
    assert status == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("release matrix: mapped")
    assert any(line.startswith("0.5.15.post1 ") for line in lines)
    assert max(len(line) for line in lines) <= 80


# ----------------------------------------------------------------------------- log events


@pytest.fixture(scope="module")
def incident_logs(tmp_path_factory):
    incident = gen.generate("0.5.15", steady_seconds=20, after_seconds=320)
    return incident, gen.write_sglang_logs(incident, tmp_path_factory.mktemp("displays"))


def test_events_compact_view_with_the_full_frame_one_attribute_away(incident_logs):
    import forensics as fx

    incident, paths = incident_logs
    scan = fx.logs.scan([paths["prefill"], paths["decode"]])
    view = scan.events_view()
    assert list(view.frame.columns[:5]) == ["time", "role", "signature", "room", "message"]
    assert "raw" in scan.events.columns and "raw" in view.full.columns  # the full frame stays
    room = str(incident.trigger_room)
    assert room in view.frame["room"].tolist()
    html = view._repr_html_()
    assert f"<td class='pd-room' style='text-align:left;vertical-align:top;padding:1px 6px;white-space:nowrap;" \
           f"font-family:monospace'>{room}</td>" in html
    assert all("text-align:left" in tag for tag in tags(html, "td"))
    whole = scan._repr_html_()
    assert whole.index("Verdict:") < whole.index("pd-events") and room in whole
    text = text_of(view, 80)
    line = next(line for line in text.splitlines() if "decode_transfer_aborted" in line)
    assert f" {room} " in line and line.endswith("…") and len(line) <= 80


def test_logs_cli_at_80_columns_one_line_per_event(incident_logs):
    incident, paths = incident_logs
    status, stdout, stderr = invoke("logs", str(paths["prefill"]), str(paths["decode"]), columns=80)
    assert status == 1, stderr
    lines = stdout.splitlines()
    assert lines[0] == "Verdict: FINDINGS"
    assert max(len(line) for line in lines) <= 80
    events = [line for line in lines if re.match(r"\d\d:\d\d:\d\d (prefill|decode) ", line)]
    signatures = [line.split()[2] for line in events]
    assert len(signatures) == len(set(signatures)) <= 6, events  # repeats grouped: one line per kind
    room = str(incident.trigger_room)
    aborted = next(line for line in events if "decode_transfer_aborted" in line)
    assert f" {room} " in aborted and aborted.endswith("…")
    status, stdout, _ = invoke("logs", str(paths["prefill"]), str(paths["decode"]), "--each", columns=80)
    each = [line for line in stdout.splitlines() if re.match(r"\d\d:\d\d:\d\d (prefill|decode) ", line)]
    assert len(each) == 42 and max(len(line) for line in each) <= 80  # warning or worse, one line each
    status, stdout, _ = invoke("logs", str(paths["prefill"]), str(paths["decode"]), "--json", columns=80)
    event = next(e for e in json.loads(stdout)["events"] if e["signature"] == "decode_transfer_aborted")
    assert event["room"] == room and "…" not in event["message"] and len(event["message"]) > 60


# ----------------------------------------------------------------------------- twin status


def fake_status(thread_alive) -> TwinStatus:
    roles = {
        "prefill": {"pid": 4242, "alive": True, "url": "http://127.0.0.1:30001", "answering": True,
                    "bootstrap_thread_alive": thread_alive,
                    "queues": {"bootstrap_queue": 638, "waiting_queue": 0, "inflight_queue": 0}},
        "decode": {"pid": 4243, "alive": True, "url": "http://127.0.0.1:30002", "answering": True,
                   "queues": {"prealloc_queue": 3, "transfer_queue": 39, "running": 0}},
        "router": {"pid": 4244, "alive": True, "url": "http://127.0.0.1:30000", "answering": True},
    }
    return TwinStatus(inventory="/tmp/twin/inventory.toml", sglang="0.5.15", patched=False, roles=roles)


def test_twin_status_is_a_dict_that_renders():
    status = fake_status(False)
    assert status["roles"]["prefill"]["pid"] == 4242 and isinstance(status, dict)
    assert json.loads(json.dumps(status)) == status.to_dict()
    assert not status.healthy and fake_status(True).healthy
    html = status._repr_html_()
    assert html.index("UNHEALTHY") < html.index("<table")
    assert "the prefill&#x27;s bootstrap thread is dead" in html and ">DEAD<" in html
    for needed in ("http://127.0.0.1:30001", "4242", "bootstrap 638", "transfer 39"):
        assert needed in html
    assert all("text-align:left" in tag for tag in tags(html, "td"))
    text = text_of(status, 80)
    assert text.splitlines()[0].startswith("twin sglang 0.5.15: UNHEALTHY")
    assert "DEAD" in text and "http://127.0.0.1:30001" in text
    assert text_of(fake_status(True), 80).splitlines()[0] == "twin sglang 0.5.15: healthy"


@pytest.mark.server
@pytest.mark.timeout(180)
def test_twin_status_of_a_running_twin(tmp_path_factory, leak_guard):
    import forensics.twin as twin_api

    twin = twin_api.up("0.5.15", directory=tmp_path_factory.mktemp("twin-displays"))
    try:
        for role in ("prefill", "decode", "router"):
            leak_guard.allow(twin.pid(role))
        status = twin.status()
        assert isinstance(status, TwinStatus) and status.healthy
        assert status["roles"]["prefill"]["queues"]["bootstrap_queue"] == 0
        assert "alive" in status._repr_html_() and twin.prefill in status._repr_html_()
        code, stdout, stderr = invoke("twin", "status", "--inventory", str(twin.inventory_path), columns=80)
        assert code == 0, stderr
        lines = stdout.splitlines()
        assert lines[0] == "twin sglang 0.5.15: healthy" and max(len(line) for line in lines) <= 80
        code, stdout, _ = invoke("twin", "status", "--inventory", str(twin.inventory_path), "--json")
        document = json.loads(stdout)
        assert document["healthy"] is True and document["roles"]["prefill"]["bootstrap_thread_alive"] is True
    finally:
        twin.down()


# ----------------------------------------------------------------------------- patch verify


@pytest.mark.server
@pytest.mark.timeout(240)
def test_patch_verify_at_80_columns_keeps_the_patched_room_states():
    status, stdout, stderr = invoke("patch", "verify", "--sglang", "0.5.15", columns=80)
    assert status == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("sglang 0.5.15: patch verify PASS")
    assert max(len(line) for line in lines) <= 80
    final = next(line for line in lines if line.lstrip().startswith("bootstrap room 4"))
    # unpatched: dead, rooms 3 and 4 stuck Bootstrapping; patched: alive, room 2 Failed, 3-4 WaitingForInput
    assert re.search(r"DEAD\s+W B B B\s+alive\s+W F W W", final), final


# ----------------------------------------------------------------------------- evidence


def collected_evidence():
    """An Evidence shaped as ``fx.collect`` returns it: engines, probes, events, threads, and two gaps."""
    import pandas as pd

    from forensics.evidence import Evidence, Gap

    t0 = pd.Timestamp("2026-11-30T03:00:00Z")
    engines = pd.DataFrame({"name": ["prefill-0", "decode-0", "router-0"], "role": ["prefill", "decode", "router"],
                            "host": ["ssh://ops@10.0.3.17:22", "ssh://ops@10.0.3.18:22", "local"],
                            "url": ["http://10.0.3.17:30001", "http://10.0.3.18:30002", "http://127.0.0.1:30000"]})
    probes = pd.DataFrame({"ts": [t0, t0 + pd.Timedelta(seconds=2)], "target": ["router-0"] * 2,
                           "kind": ["liveness", "health"], "outcome": ["pending", "ok"]})
    events = pd.DataFrame({"ts": [t0] * 3, "role": ["decode", "prefill", "prefill"],
                           "signature": ["abort_sent", "thread_death", "guard_assert"],
                           "room": pd.array([2**63 - 12345, None, None], dtype="UInt64")})
    threads = pd.DataFrame({"pid": [4242] * 4, "thread_name": ["MainThread", "a", "b", "c"]})
    gaps = [Gap("threads", "decode-0 (ssh://ops@10.0.3.18:22)", "py-spy exited 1: <ptrace denied> for pid 4243",
                "run with sudo: true in the inventory"),
            Gap("logs", "prefill-0 (ssh://ops@10.0.3.17:22)", "cut at the byte cap (api_key=s3cr3t-planted)",
                partial=True)]
    return Evidence({"name": "pd-prod-7", "sglang": "0.5.15", "backend": "nixl",
                     "inventory": "/etc/pd/<prod>.toml"},
                    {"engines": engines, "probes": probes, "events": events, "threads": threads}, gaps,
                    commands=[{"host": "local", "argv": ["py-spy", "dump"], "state": "ok"}],
                    window={"since": "2026-11-30T02:30:00+00:00", "until": None},
                    collected_at="2026-11-30T03:01:00.000+00:00")


def test_evidence_renders_its_engines_frames_and_highlighted_gaps():
    evidence = collected_evidence()
    html = evidence._repr_html_()
    assert "pd-prod-7" in html and "sglang 0.5.15" in html and "2026-11-30T03:01:00.000+00:00" in html
    for engine in ("prefill-0", "decode-0", "router-0", "http://10.0.3.17:30001"):
        assert engine in html
    for frame, rows in (("engines", 3), ("probes", 2), ("events", 3), ("threads", 4)):
        assert re.search(rf"<code>{frame}</code></td><td[^>]*>{rows}</td>", html), frame
    assert "not collected: " in html and "metrics" in html.split("not collected: ")[1]
    # Each gap with its reason, on a highlighted row; a '<' in a reason is escaped, never markup.
    assert "2 gap(s)" in html
    assert "py-spy exited 1: &lt;ptrace denied&gt; for pid 4243" in html and "<ptrace" not in html
    assert "run with sudo: true in the inventory" in html
    gap_rows = re.findall(r"<tr style='([^']*)'>", html)
    assert gap_rows == ["background:#fdd", "background:#fff3cd"]  # nothing read; read in part
    assert "/etc/pd/&lt;prod&gt;.toml" in html
    assert "s3cr3t-planted" not in html and "&lt;redacted&gt;" in html
    assert all("text-align:left" in tag for tag in tags(html, "td"))
    text = text_of(evidence, 80)
    assert text.splitlines()[0] == "Evidence 'pd-prod-7' (sglang 0.5.15, nixl)"
    assert text.splitlines()[1].startswith("collected 2026-11-30T03:01:00.000+00:00; window 2026-11-30T02:30")
    assert "py-spy exited 1: <ptrace" in text and "s3cr3t-planted" not in text and "2 gap(s)" in text


def test_evidence_without_gaps_says_so():
    evidence = collected_evidence()
    evidence.gaps = []
    html = evidence._repr_html_()
    assert "no gaps" in html and "background:#fdd" not in html
