"""The handler map never calls code it could not read, or could not interpret, clean.

``forensics handlers check`` is a CI gate: a ``conn.py`` that does not parse, a backend
whose receiver loop was not found, or a loop the interpreter does not model must end
INCONCLUSIVE with the file and the line, never "clean"; a finding on code that was
understood still wins (exit 1) with the unreadable parts listed beside it. Inputs are
real releases' trees, broken the way forks break (a merge conflict left in, a dispatch
rewritten as a ``match`` or a handler table); line numbers are looked up in what the
test wrote, never hard-coded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from forensics.exitcodes import EnvironmentProblem, ExitStatus, Undecided
from forensics.handlers import CLEAN, FINDINGS, INCONCLUSIVE, UnreadableSource, diff, map_release
from forensics.handlers.handler_map import NoDisaggregationCode
from forensics.handlers.model import (
    NO_LOOP,
    NO_MANAGER,
    NOT_INTERPRETED,
    NOT_READ,
    NOT_UNDERSTOOD,
    PREFILL,
    ROLE_UNKNOWN,
    UNPARSEABLE,
)
from forensics.handlers.release_matrix import COLUMNS, HandlerMatrix, matrix_backends, matrix_row
from forensics.sglang_source import fetch, from_directory
from tests.handler_helpers import copy_release_tree as _copy_tree

CONFLICT = (
    "<<<<<<< HEAD\n"
    "PD_FORK_BOOTSTRAP_TIMEOUT = 300\n"
    "=======\n"
    "PD_FORK_BOOTSTRAP_TIMEOUT = 600\n"
    ">>>>>>> fork/longer-bootstrap-timeout\n"
)


def _leave_conflict(conn: Path, before: str) -> int:
    """Leave a merge conflict just above the first line starting with ``before``; its 1-based line."""
    lines = conn.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith(before))
    conn.write_text("".join(lines[:at] + [CONFLICT, "\n"] + lines[at:]))
    return at + 1


def _text(renderable) -> str:
    console = Console(width=240, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def _mori_only(version: str, destination: Path) -> Path:
    """A real release reduced to its mori backend: the one tree the analysis calls clean."""
    disaggregation = _copy_tree(version, destination)
    for backend in ("nixl", "mooncake", "ascend"):
        shutil.rmtree(disaggregation / backend)
    return disaggregation


@pytest.mark.timeout(120)
def test_a_tree_whose_conn_files_all_fail_to_parse_is_inconclusive_with_file_and_line(tmp_path):
    disaggregation = _copy_tree("0.5.15", tmp_path)
    lines = {}
    for backend, manager in (("nixl", "class NixlKVManager"), ("mooncake", "class MooncakeKVManager"),
                             ("mori", "class MoriKVManager"), ("ascend", "class AscendKVManager")):
        lines[backend] = _leave_conflict(disaggregation / backend / "conn.py", manager)
    handler_map = map_release(from_directory(tmp_path, version="0.5.15+conflicts"))

    assert handler_map.findings == [] and handler_map.backends == {}
    assert handler_map.verdict == INCONCLUSIVE and handler_map.exit_status == ExitStatus.INCONCLUSIVE == 3
    by_backend = {u.backend: u for u in handler_map.unreadable}
    assert set(by_backend) == set(lines)
    for backend, line in lines.items():
        entry = by_backend[backend]
        assert (entry.file, entry.line, entry.kind) == (f"{backend}/conn.py", line, UNPARSEABLE)
        assert f"line {line}" in entry.reason and entry.path == str(disaggregation / backend / "conn.py")

    # The exception a caller (the CLI) can raise names the files and lines.
    problem = handler_map.undecided()
    assert isinstance(problem, UnreadableSource) and isinstance(problem, Undecided)
    assert problem.exit_status == ExitStatus.INCONCLUSIVE and f"nixl/conn.py:{lines['nixl']}" in str(problem)
    assert {u.backend for u in problem.unreadable} == set(lines)

    # JSON, terminal and notebook all say it.
    document = json.loads(json.dumps(handler_map.to_dict()))
    assert document["verdict"] == "inconclusive"
    assert {(u["file"], u["line"]) for u in document["unreadable"]} == {
        (f"{b}/conn.py", line) for b, line in lines.items()}
    text = _text(handler_map)
    assert "inconclusive" in text and "clean" not in text.replace("nothing here is called clean", "")
    html = handler_map._repr_html_()
    for backend, line in lines.items():
        assert f"{backend}/conn.py:{line}" in text and f"{backend}/conn.py:{line}" in html


@pytest.mark.timeout(120)
def test_diff_and_matrix_rows_of_an_unreadable_backend_never_read_as_handled(tmp_path):
    disaggregation = _copy_tree("0.5.15", tmp_path)
    line = _leave_conflict(disaggregation / "nixl" / "conn.py", "class NixlKVManager")
    source = from_directory(tmp_path, version="0.5.15+nixl-conflict")

    # Before: KeyError ("no mapped backend"), which the CLI reported as a usage error.
    result = diff(source, "nixl", "mooncake")
    nixl_cells = {(row.role, row.tag): row.cells["nixl"] for row in result.rows}
    assert nixl_cells and {cell.fate for cell in nixl_cells.values()} == {NOT_READ}
    assert all(cell.location == f"nixl/conn.py:{line}" for cell in nixl_cells.values())
    # Mooncake's column is still the analysis of its real loop.
    assert any(row.cells["mooncake"].fate == "handled" for row in result.rows)
    assert any(u.file == "nixl/conn.py" and u.line == line for u in result.unreadable)
    document = result.to_dict()
    assert any(u["line"] == line for u in document["unreadable"])
    assert f"nixl/conn.py:{line}" in result.text(width=240) and f"nixl/conn.py:{line}" in result._repr_html_()
    with pytest.raises(KeyError):
        diff(source, "nixl", "no-such-backend")

    handler_map = map_release(source)
    with pytest.raises(UnreadableSource, match=f"nixl/conn.py:{line}"):
        handler_map.backend("nixl")
    assert "nixl" in matrix_backends(handler_map)
    row = matrix_row(handler_map, "nixl")
    assert set(row) == set(COLUMNS)
    assert row["understood"] is False and f"nixl/conn.py:{line}" in row["unreadable"]
    assert row["handles_abort"] is None and row["abort_kills"] is None and row["dies_on_unknown"] is None
    import pandas as pd

    frame = pd.DataFrame([matrix_row(handler_map, name) for name in matrix_backends(handler_map)], columns=COLUMNS)
    table = HandlerMatrix(frame)
    assert table.verdict == INCONCLUSIVE and table.exit_status == ExitStatus.INCONCLUSIVE
    assert table.window("nixl") == [] and list(table.unreadable_rows()["backend"]) == ["nixl"]
    assert table.to_dict()["unreadable"][0]["backend"] == "nixl"


@pytest.mark.timeout(120)
def test_one_parseable_and_one_unparseable_backend(tmp_path):
    # A finding on code that was read wins (exit 1), and the unreadable backend is still listed.
    disaggregation = _copy_tree("0.5.15", tmp_path / "findings")
    line = _leave_conflict(disaggregation / "mooncake" / "conn.py", "class MooncakeKVManager")
    handler_map = map_release(from_directory(tmp_path / "findings", version="0.5.15+mooncake-conflict"))
    assert handler_map.verdict == FINDINGS and handler_map.exit_status == ExitStatus.BAD
    assert any(f.backend == "nixl" and f.tag == "ABORT" and f.certain for f in handler_map.findings)
    mooncake = next(u for u in handler_map.unreadable if u.backend == "mooncake")
    assert (mooncake.file, mooncake.line, mooncake.kind) == ("mooncake/conn.py", line, UNPARSEABLE)
    # ascend runs mooncake's loops: with mooncake unreadable, ascend's loop is not found either.
    ascend = next(u for u in handler_map.unreadable if u.backend == "ascend")
    assert ascend.kind == NO_LOOP and ascend.file == "ascend/conn.py" and ascend.line
    assert f"mooncake/conn.py:{line}" in _text(handler_map)

    # The same fork without findings elsewhere: mori (clean on its own) plus an unparseable nixl.
    _mori_only("0.5.23", tmp_path / "clean")
    clean = map_release(from_directory(tmp_path / "clean", version="0.5.23+mori"))
    assert clean.verdict == CLEAN and clean.exit_status == ExitStatus.GOOD and clean.unreadable == []
    disaggregation = _mori_only("0.5.23", tmp_path / "blind")
    shutil.copytree(fetch("0.5.23").disaggregation / "nixl", disaggregation / "nixl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    line = _leave_conflict(disaggregation / "nixl" / "conn.py", "class NixlKVManager")
    blind = map_release(from_directory(tmp_path / "blind", version="0.5.23+mori+nixl-conflict"))
    assert blind.findings == [] and list(blind.backends) == ["mori"]
    assert blind.verdict == INCONCLUSIVE and blind.exit_status == ExitStatus.INCONCLUSIVE
    assert [(u.file, u.line) for u in blind.unreadable] == [("nixl/conn.py", line)]
    assert any(f"nixl/conn.py:{line}" in reason for reason in blind.reasons())


MORI_DISPATCH = (
    "                    tag = msg[0]\n"
    "                    if tag == ABORT_TAG:\n"
    "                        self._handle_abort_message(msg)\n"
    "                        continue\n"
)
# Each rewrites the prefill loop's ABORT case as a fork might; the first line of each is the one to name.
REWRITES = {
    "match statement": (
        "                    match msg[0]:\n"
        "                        case b\"ABORT\":\n"
        "                            self._handle_abort_message(msg)\n"
        "                            continue\n"
    ),
    "handler table": (
        "                    self._handlers[msg[0]](msg)\n"
        "                    continue\n"
    ),
    "delegated dispatch": (
        "                    self._dispatch_bootstrap_message(msg)\n"
        "                    continue\n"
    ),
    "tag compared with a run-time value": (
        "                    if msg[0] == self._abort_tag:\n"
        "                        self._handle_abort_message(msg)\n"
        "                        continue\n"
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rewrite", list(REWRITES))
def test_a_loop_that_parses_but_cannot_be_interpreted_is_inconclusive_at_its_line(tmp_path, rewrite):
    disaggregation = _mori_only("0.5.23", tmp_path)
    conn = disaggregation / "mori" / "conn.py"
    text = conn.read_text()
    assert text.count(MORI_DISPATCH) == 1
    conn.write_text(text.replace(MORI_DISPATCH, REWRITES[rewrite]))
    first = REWRITES[rewrite].splitlines()[0]
    line = next(n for n, content in enumerate(conn.read_text().splitlines(), 1) if content == first)
    source = from_directory(tmp_path, version=f"0.5.23+{rewrite.replace(' ', '-')}")
    handler_map = map_release(source)

    (prefill,) = handler_map.backend("mori").loops_for(PREFILL)
    assert not prefill.understood
    assert any((u.file, u.line, u.kind) == ("mori/conn.py", line, NOT_INTERPRETED) for u in prefill.not_understood)
    assert all(u.backend == "mori" for u in handler_map.unreadable)
    assert handler_map.verdict == INCONCLUSIVE and handler_map.exit_status == ExitStatus.INCONCLUSIVE
    # Whatever the guesswork made of the frames, it decides nothing: findings carry a caveat.
    assert all(not f.certain and "mori/conn.py:" in f.caveat for f in handler_map.findings)
    assert handler_map.backend("mori").handles_abort() is None
    assert f"mori/conn.py:{line}" in _text(handler_map) and f"mori/conn.py:{line}" in handler_map._repr_html_()
    assert any(u["line"] == line for u in handler_map.to_dict()["unreadable"])

    result = diff(source, "mori", "mori")
    prefill_cells = [row.cells["mori"] for row in result.rows if row.role == PREFILL]
    assert prefill_cells and {cell.fate for cell in prefill_cells} == {NOT_UNDERSTOOD}
    assert result.verdict == INCONCLUSIVE
    row = matrix_row(handler_map, "mori")
    assert row["understood"] is False and row["handles_abort"] is None and row["dies_on_unknown"] is None


SYNTHETIC_HEADER = '''"""A fork's NIXL backend, cut down to what the handler map reads."""

import threading

import zmq

GUARD = "NixlMsgGuard".encode("ascii")

'''


@pytest.mark.timeout(60)
def test_empty_trees_and_trees_without_loops_are_not_clean(tmp_path):
    # Nothing under sglang/srt: nothing to check is INCONCLUSIVE (exit 3), not an environment error.
    (tmp_path / "empty" / "sglang" / "srt").mkdir(parents=True)
    with pytest.raises(NoDisaggregationCode) as raised:
        map_release(from_directory(tmp_path / "empty", version="0.5.23+empty"))
    assert isinstance(raised.value, Undecided) and raised.value.exit_status == ExitStatus.INCONCLUSIVE
    assert raised.value.exit_status != EnvironmentProblem.exit_status

    # Only the health-check backend (fake), which has no sockets: still nothing to check.
    (tmp_path / "fake-only" / "sglang" / "srt" / "disaggregation" / "fake").mkdir(parents=True)
    shutil.copy(fetch("0.5.23").disaggregation / "fake" / "conn.py",
                tmp_path / "fake-only" / "sglang" / "srt" / "disaggregation" / "fake" / "conn.py")
    with pytest.raises(NoDisaggregationCode):
        map_release(from_directory(tmp_path / "fake-only", version="0.5.23+fake-only"))

    # A conn.py that parses but holds no manager, one whose manager starts no thread, and one whose
    # loop's role cannot be told: each is named, and none is clean.
    nixl = tmp_path / "synthetic" / "sglang" / "srt" / "disaggregation" / "nixl"
    nixl.mkdir(parents=True)
    conn = nixl / "conn.py"
    conn.write_text("")
    handler_map = map_release(from_directory(tmp_path / "synthetic", version="0.5.23+empty-conn"))
    assert handler_map.verdict == INCONCLUSIVE and handler_map.loops_found == 0
    assert [(u.file, u.kind) for u in handler_map.unreadable] == [("nixl/conn.py", NO_MANAGER)]

    conn.write_text(SYNTHETIC_HEADER + (
        "class NixlKVManager:\n"
        "    def __init__(self, args):\n"
        "        self.server_socket = zmq.Context().socket(zmq.PULL)\n"
    ))
    handler_map = map_release(from_directory(tmp_path / "synthetic", version="0.5.23+no-thread"))
    manager_line = SYNTHETIC_HEADER.count("\n") + 1
    assert handler_map.verdict == INCONCLUSIVE
    assert [(u.file, u.line, u.kind) for u in handler_map.unreadable] == [("nixl/conn.py", manager_line, NO_LOOP)]

    conn.write_text(SYNTHETIC_HEADER + (
        "class NixlKVManager:\n"
        "    def __init__(self, args):\n"
        "        self.server_socket = zmq.Context().socket(zmq.PULL)\n"
        "        threading.Thread(target=self._listen).start()\n"
        "\n"
        "    def _listen(self):\n"
        "        while True:\n"
        "            msg = self.server_socket.recv_multipart()\n"
        "            assert msg[0] == GUARD, f\"First message should be {GUARD}. Foreign traffic?\"\n"
    ))
    handler_map = map_release(from_directory(tmp_path / "synthetic", version="0.5.23+no-role"))
    listen_line = SYNTHETIC_HEADER.count("\n") + 6
    kinds = {(u.kind, u.line) for u in handler_map.unreadable}
    assert (ROLE_UNKNOWN, listen_line) in kinds and (NO_LOOP, manager_line) in kinds
    # The loop dies on foreign frames, but on a loop whose role is unknown that decides nothing alone.
    assert handler_map.verdict == INCONCLUSIVE


@pytest.mark.timeout(180)
def test_real_releases_are_read_and_understood_and_keep_their_findings():
    for version in ("0.5.15", "0.5.23"):
        handler_map = map_release(fetch(version))
        assert handler_map.unreadable == [], [str(u) for u in handler_map.unreadable]
        assert all(loop.understood for b in handler_map.backends.values() for loop in b.loops)
        assert handler_map.verdict == FINDINGS and handler_map.exit_status == ExitStatus.BAD
        assert all(f.certain for f in handler_map.findings)
        assert handler_map.undecided() is None
    findings = map_release(fetch("0.5.15")).findings
    assert any(f.backend == "nixl" and f.tag == "ABORT" and f.fate == "thread dies" for f in findings)
    result = diff("0.5.15", "nixl", "mooncake")
    assert result.verdict == FINDINGS and result.unreadable == []
    row = matrix_row(map_release(fetch("0.5.15")), "nixl")
    assert row["understood"] is True and row["abort_kills"] is True and row["unreadable"] == ""
