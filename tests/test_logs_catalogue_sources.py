"""The signature catalogue against the code that really writes the lines.

sglang entries name the releases that emit them (``releases``, a PEP 440 specifier) and
the files holding their format strings (``emitted_in``). For one release, every string
those files can produce is read with ``ast``: f-strings, %-format (``%`` and logger calls
with arguments), ``str.format``, and messages built up with ``+=`` across statements.
Each is rendered with representative values (a full-range 63-bit room, a uuid rid, an
ip:port, ...); an exception placeholder becomes ``KVTransferError(bootstrap_room=...):
<reason>``, the reason rendered from the entry's ``reason_in`` files. The entry holds in
that release when a rendering is classified as this entry by ``catalogue.classify`` (first
match wins, as in the scanner) and its captured room, rid and rank read back exactly.
Outside the range no string anywhere under ``sglang/srt`` may render to the entry.

That catches both an entry no release emits and a release that rewords a message: in
either case no rendering classifies as the entry any more.

The default run checks each range's boundaries (its first and last release, and the
releases just outside it, within 0.5.1 .. 0.5.23); ``-m slow`` checks all 42 releases.
uvicorn, CPython and patched-engine entries are checked against what those write: a real
thread that dies in a subprocess, sglang's uvicorn access format read from its source,
the patched engine's own templates.
"""

from __future__ import annotations

import ast
import logging
import re
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pandas as pd
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from sglang_releases import EVERY_RELEASE, FIRST, LAST

from forensics import sglang_source
from forensics.logs import catalogue
from forensics.logs.catalogue import CatalogueError, Signature
from forensics.logs.source_messages import (
    ADDR,
    ELAPSED,
    GENERIC_FAILURE,
    IP,
    PORT,
    RANK,
    RID,
    ROOM,
    ModuleMessages,
    Template,
    has_exception,
    render,
)

# FIRST, LAST (sglang_releases): the releases these ranges were read from

@cache
def _module_templates(path: str) -> tuple[frozenset[Template], dict[str, object]]:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    messages = ModuleMessages(ast.parse(text, filename=path))
    return messages.templates(), messages.constants


def renderings(path: Path, failures: tuple[str, ...] = (GENERIC_FAILURE,)) -> list[str]:
    """Every message the module at ``path`` can write, rendered with representative values."""
    templates, constants = _module_templates(str(path))
    out = []
    for template in templates:
        for failure in failures if has_exception(template) else failures[:1]:
            out.append(render(template, failure, constants))
    return out


# --------------------------------------------------------------------------- the check


def sglang_entries() -> list[Signature]:
    return [s for s in catalogue.signatures() if s.origin == "sglang"]


@cache
def source(version: str) -> sglang_source.SglangSource:
    return sglang_source.fetch(version)


@cache
def releases() -> tuple[str, ...]:
    return tuple(sglang_source.available_releases(FIRST, LAST))


def _failures(entry: Signature, root: Path) -> tuple[str, ...]:
    """What ``{e}`` prints for this entry: reasons its ``reason`` constraint accepts, from ``reason_in``."""
    if entry.reason_regex is None:
        return (GENERIC_FAILURE,)
    reasons = sorted({r for rel in entry.reason_in if (root / rel).is_file()
                      for r in renderings(root / rel) if entry.reason_regex.search(r)})
    return tuple(f"KVTransferError(bootstrap_room={ROOM}): {r}" for r in reasons)


def _captured_exactly(fields: dict[str, str | None]) -> bool:
    expected = {"room": str(ROOM), "rid": RID, "rank": str(RANK)}
    return all(fields.get(k) in (None, v) for k, v in expected.items())


def messages_for(entry: Signature, root: Path, files: list[Path]) -> list[str]:
    """Renderings from ``files`` that the catalogue classifies as ``entry``, fields read back exactly."""
    failures = _failures(entry, root)
    if not failures:
        return []
    hits = []
    for path in files:
        for message in renderings(path, failures):
            if entry.literal not in message:
                continue
            found = catalogue.classify(message)
            if found is not None and found[0].id == entry.id and _captured_exactly(found[1]):
                hits.append(message)
    return sorted(set(hits))


def emitted_in_release(entry: Signature, version: str) -> list[str]:
    root = source(version).root
    return messages_for(entry, root, [root / rel for rel in entry.emitted_in if (root / rel).is_file()])


def _anchor_words(entry: Signature) -> list[bytes]:
    return [w.encode() for w in re.findall(r"[A-Za-z_]{4,}", entry.literal)]


def emitted_anywhere(entry: Signature, version: str) -> dict[str, list[str]]:
    """Renderings from every file under ``sglang/srt`` that holds the literal's words (moved messages too)."""
    root = source(version).root
    words = _anchor_words(entry)
    found = {}
    for path in sorted(source(version).srt.rglob("*.py")):
        data = path.read_bytes()
        if not all(w in data for w in words):
            continue
        hits = messages_for(entry, root, [path])
        if hits:
            found[str(path.relative_to(root))] = hits
    return found


def boundaries(entry: Signature) -> tuple[list[str], list[str]]:
    """(first and last release in range, releases just outside it) within FIRST .. LAST."""
    every = releases()
    inside = [v for v in every if entry.emitted_by(v)]
    assert inside, f"{entry.id}: releases {entry.releases!r} holds no release in {FIRST} .. {LAST}"
    first, last = every.index(inside[0]), every.index(inside[-1])
    outside = [every[i] for i in (first - 1, last + 1) if 0 <= i < len(every)]
    return sorted({inside[0], inside[-1]}, key=Version), outside


def _check(entry: Signature, version: str) -> str | None:
    """None when release ``version`` agrees with the entry's range, else what is wrong."""
    if entry.emitted_by(version):
        if not emitted_in_release(entry, version):
            root = source(version).root
            if not _failures(entry, root):
                return (f"{entry.id}: sglang {version} is in releases {entry.releases!r} but nothing in "
                        f"{list(entry.reason_in)} renders to a failure text its reason {entry.reason!r} matches")
            present = [rel for rel in entry.emitted_in if (root / rel).is_file()]
            return (f"{entry.id}: sglang {version} is in releases {entry.releases!r} but no format string in "
                    f"{present or list(entry.emitted_in)} renders to a line this entry matches")
        return None
    found = emitted_anywhere(entry, version)
    if found:
        where, hits = next(iter(found.items()))
        return (f"{entry.id}: sglang {version} is outside releases {entry.releases!r} but {where} "
                f"emits it: {hits[0]!r}")
    return None


# --------------------------------------------------------------------------- the tests


SGLANG_IDS = [s.id for s in sglang_entries()]


def test_every_entry_has_an_origin_and_sglang_entries_a_range():
    for entry in catalogue.signatures():
        assert entry.origin in catalogue.ORIGINS, entry.id
        if entry.origin == "sglang":
            assert entry.release_range is not None and entry.emitted_in, entry.id
            assert all(rel.startswith("sglang/srt/") for rel in entry.emitted_in + entry.reason_in), entry.id
        else:
            assert entry.releases is None and not entry.emitted_in and not entry.reason_in, entry.id
            assert not entry.emitted_by("0.5.15"), entry.id
    assert {"sglang", "uvicorn", "cpython"} <= {s.origin for s in catalogue.signatures()}


def test_the_renderer_reads_every_way_sglang_writes_a_message(tmp_path):
    module = tmp_path / "conn.py"
    module.write_text(textwrap.dedent('''
        GUARD = "NixlMsgGuard".encode("ascii")
        def poll(self, decode_req, e, elapsed, room, addr):
            msg = (f"Decode transfer failed for request rank={self.tp_rank} "
                   f"{decode_req.req.rid=} {decode_req.req.bootstrap_room=}")
            msg += f" with exception {e}"
            logger.error(msg)
            logger.debug("Received abort notification for room %s, marked as Failed", room)
            reason = "Request {} timed out after {:.1f}s in KVPoll.Bootstrapping".format(room, elapsed)
            assert frames[0] == GUARD, f"First message should be {GUARD}. Foreign traffic?"
            raise RuntimeError("Lost connection with prefill instance (bootstrap_addr: %s)" % addr)
    '''))
    got = set(renderings(module))
    assert (f"Decode transfer failed for request rank={RANK} decode_req.req.rid={RID!r} "
            f"decode_req.req.bootstrap_room={ROOM} with exception {GENERIC_FAILURE}") in got
    assert f"Received abort notification for room {ROOM}, marked as Failed" in got
    assert f"Request {ROOM} timed out after {ELAPSED:.1f}s in KVPoll.Bootstrapping" in got
    assert "First message should be b'NixlMsgGuard'. Foreign traffic?" in got
    assert f"Lost connection with prefill instance (bootstrap_addr: {ADDR})" in got


def test_a_reworded_or_unknown_message_is_caught(tmp_path):
    """The check itself can fail: a renamed message and an entry nobody writes are both reported."""
    entry = catalogue.by_id()["decode_transfer_aborted"]
    root = tmp_path / "src"
    decode = root / "sglang/srt/disaggregation/decode.py"
    conn = root / "sglang/srt/disaggregation/common/conn.py"
    decode.parent.mkdir(parents=True)
    conn.parent.mkdir(parents=True)
    conn.write_text('def abort(self):\n    self.record_failure(self.bootstrap_room, "Aborted by AbortReq.")\n')
    body = ('def pop(self, decode_req, e):\n'
            '    m = f"Decode {word} failed for request rank={{self.tp_rank}} {{decode_req.req.rid=}} '
            '{{decode_req.req.bootstrap_room=}}"\n'
            '    m += f" with exception {{e}}"\n    logger.error(m)\n')
    decode.write_text(body.format(word="transfer"))
    assert messages_for(entry, root, [decode])
    decode.write_text(body.format(word="KV transfer"))  # reworded
    _module_templates.cache_clear()
    assert not messages_for(entry, root, [decode])
    conn.write_text('def abort(self):\n    self.record_failure(self.bootstrap_room, "Aborted by the client.")\n')
    decode.write_text(body.format(word="transfer"))
    _module_templates.cache_clear()
    assert not messages_for(entry, root, [decode])  # the reason is gone: no release could emit it


@pytest.mark.timeout(600)
@pytest.mark.parametrize("entry_id", SGLANG_IDS)
def test_range_boundaries_emit_and_neighbours_do_not(entry_id):
    entry = catalogue.by_id()[entry_id]
    inside, outside = boundaries(entry)
    problems = [p for v in inside + outside if (p := _check(entry, v))]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", EVERY_RELEASE)
def test_every_release_agrees_with_every_range(version):
    assert version in releases()
    problems = [p for entry in sglang_entries() if (p := _check(entry, version))]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_emitted_in_file_emits_its_entry_in_some_release():
    """No stale path: each file named in emitted_in writes the entry in at least one release of its range."""
    stale = []
    for entry in sglang_entries():
        inside = [v for v in releases() if entry.emitted_by(v)]
        for rel in entry.emitted_in:
            if not any((source(v).root / rel).is_file() and messages_for(entry, source(v).root, [source(v).root / rel])
                       for v in inside):
                stale.append(f"{entry.id}: {rel}")
    assert not stale, stale


def test_the_slow_sweep_covers_every_release():
    swept = test_every_release_agrees_with_every_range.pytestmark
    versions = next(m.args[1] for m in swept if m.name == "parametrize")
    assert sorted(versions, key=Version) == list(releases()) and len(versions) == 42


# ------------------------------------------------------------------ the catalogue's own checks

_VALID = '''
[[signature]]
id = "abort_sent"
literal = "Sent abort notification"
pattern = "Sent abort notification for room (?P<room>-?\\\\d+)"
severity = "debug"
step = "abort_sent"
meaning = "m"
'''


@pytest.mark.parametrize("keys, complaint", [
    ('', "missing origin"),
    ('origin = "nginx"', "unknown origin 'nginx'"),
    ('origin = "sglang"\nemitted_in = "sglang/srt/disaggregation/common/conn.py"', "needs releases"),
    ('origin = "sglang"\nreleases = "0.5.13"\nemitted_in = "sglang/srt/a.py"', "invalid releases '0.5.13'"),
    ('origin = "sglang"\nreleases = ">=banana"\nemitted_in = "sglang/srt/a.py"', "invalid releases '>=banana'"),
    ('origin = "sglang"\nreleases = 13\nemitted_in = "sglang/srt/a.py"', "releases must be a string"),
    ('origin = "sglang"\nreleases = ">=0.5.13"', "needs emitted_in"),
    ('origin = "sglang"\nreleases = ">=0.5.13"\nemitted_in = "/etc/passwd"', "not a sglang/srt/\\*\\*.py path"),
    ('origin = "sglang"\nreleases = ">=0.5.13"\nemitted_in = []', "non-empty list"),
    ('origin = "uvicorn"\nreleases = ">=0.5.13"', "releases is for sglang entries only"),
    ('origin = "sglang"\nreleases = ">=0.5.13"\nemitted_in = "sglang/srt/a.py"\nreason_in = "sglang/srt/b.py"',
     "reason_in given without a reason"),
])
def test_a_missing_or_invalid_origin_or_range_names_the_entry(keys, complaint):
    with pytest.raises(CatalogueError, match=rf"abort_sent: .*{complaint}"):
        catalogue.load(_VALID + keys + "\n")


def test_valid_keys_are_exposed_on_the_signature():
    (entry,) = catalogue.load(_VALID + 'origin = "sglang"\nreleases = ">=0.5.13,<0.5.16"\n'
                              'emitted_in = ["sglang/srt/disaggregation/common/conn.py"]\n')
    assert entry.origin == "sglang" and entry.emitted_in == ("sglang/srt/disaggregation/common/conn.py",)
    assert entry.release_range == SpecifierSet(">=0.5.13,<0.5.16") and entry.releases == ">=0.5.13,<0.5.16"
    assert [v for v in ("0.5.12.post1", "0.5.13", "0.5.15.post1", "0.5.16") if entry.emitted_by(v)] == [
        "0.5.13", "0.5.15.post1"]
    (other,) = catalogue.load(_VALID + 'origin = "cpython"\n')
    assert other.release_range is None and not other.emitted_by("0.5.15")
    frame = catalogue.to_frame()
    assert {"origin", "releases", "emitted_in", "reason_in"} <= set(frame.columns)


# ------------------------------------------------------------------ CPython, uvicorn, patched engine

_DYING_THREADS = textwrap.dedent('''
    import threading
    GUARD = "NixlMsgGuard".encode("ascii")

    def bootstrap_thread():
        frames = [b"ABORT", b"7461092837465012345", b"10.0.3.17", b"43127"]
        assert (
            frames[0] == GUARD
        ), f"First message should be {GUARD}. Foreign traffic?"

    def heartbeat_checker():
        raise ConnectionError("prefill bootstrap server went away")

    for thread in (threading.Thread(target=bootstrap_thread),
                   threading.Thread(target=heartbeat_checker, name="HeartbeatChecker", daemon=True)):
        thread.start()
        thread.join()
''')


@pytest.mark.timeout(60)
def test_thread_death_matches_what_cpython_writes(tmp_path):
    """A real thread dies in a real interpreter; its stderr is what the catalogue must read."""
    done = subprocess.run([sys.executable, "-c", _DYING_THREADS], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    heads = [(line, catalogue.classify(line)) for line in lines if line.startswith("Exception in thread ")]
    assert [(found[0].id, found[1]["thread"], found[1]["target"]) for _, found in heads] == [
        ("thread_death", "Thread-1", "bootstrap_thread"), ("thread_death", "HeartbeatChecker", None)]
    final = lines[lines.index(heads[0][0]) + 1:]
    final = next(line for line in final if not line.startswith((" ", "Traceback")))
    assert final == "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?"
    found = catalogue.classify(final)
    assert found is not None and found[0].id == "nixl_guard_assertion" and found[1]["reason"] == "b'NixlMsgGuard'"
    # The scanner takes the whole traceback as one event, named by the thread and its final line.
    log = tmp_path / "scheduler.stderr"
    log.write_text(done.stderr)
    from forensics.logs import scan

    deaths = scan(log).events
    deaths = deaths[deaths["signature"] == "thread_death"]
    assert len(deaths) == 2
    assert deaths["message"].iloc[0].endswith("Foreign traffic?") and "bootstrap_thread" in deaths["thread"].iloc[0]


# What uvicorn writes for one request: uvicorn/protocols/http/{h11,httptools}_impl.py log
#   access_logger.info('%s - "%s %s HTTP/%s" %d', client_addr, method, path_with_query, http_version, status)
# and uvicorn/logging.py's AccessFormatter turns the args into client_addr, request_line
# ("%s %s HTTP/%s") and status_code ("%s %s" % (code, HTTPStatus(code).phrase), the phrase
# empty for codes HTTPStatus does not know), with
# levelprefix = levelname + ":" + " " * (8 - len(levelname)). Its default access format is
# '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'; sglang replaces it
# (set_uvicorn_logging_configs) with the one read from its source below. uvicorn is not a
# dependency here: when it is installed its own AccessFormatter is used instead of this stand-in.
UVICORN_DEFAULT_ACCESS_FMT = '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'


class _UvicornAccessFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        import http

        client_addr, method, full_path, http_version, status = record.args
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:  # e.g. 499: uvicorn leaves the phrase empty
            phrase = ""
        record.__dict__.update(
            levelprefix=record.levelname + ":" + " " * (8 - len(record.levelname)),
            client_addr=client_addr,
            request_line=f"{method} {full_path} HTTP/{http_version}",
            status_code=f"{status} {phrase}",
        )
        return super().formatMessage(record)


def _access_formatter(fmt: str, datefmt: str | None) -> logging.Formatter:
    try:
        from uvicorn.logging import AccessFormatter
    except ImportError:
        return _UvicornAccessFormatter(fmt, datefmt)
    return AccessFormatter(fmt, datefmt, use_colors=False)


def sglang_access_format(version: str) -> tuple[str, str]:
    """(fmt, datefmt) that sglang's set_uvicorn_logging_configs gives uvicorn's access log."""
    srt = source(version).srt
    for path in (srt / "utils" / "common.py", srt / "utils.py"):
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == "set_uvicorn_logging_configs":
                found = {}
                for assign in ast.walk(node):
                    if isinstance(assign, ast.Assign) and "['access']" in ast.unparse(assign.targets[0]):
                        found[ast.unparse(assign.targets[0]).split("[")[-1].strip("']")] = ast.literal_eval(assign.value)
                return found["fmt"], found.get("datefmt")
    raise AssertionError(f"sglang {version}: no set_uvicorn_logging_configs")


ACCESS_CASES = [
    ("GET", "/health", 200, "access_health"), ("GET", "/health_generate", 503, "access_health"),
    ("GET", "/metrics", 200, "access_metrics"), ("POST", "/generate", 200, "access_completion"),
    ("POST", "/v1/chat/completions", 499, "access_completion"), ("POST", "/v1/completions?stream=1", 200,
                                                                  "access_completion"),
]


def _access_line(fmt: str, datefmt: str | None, method: str, path: str, status: int) -> str:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 0, '%s - "%s %s HTTP/%s" %d',
                               (f"{IP}:{PORT}", method, path, "1.1", status), None)
    return _access_formatter(fmt, datefmt).format(record)


@pytest.mark.parametrize("version", [FIRST, LAST])
def test_access_lines_match_what_uvicorn_writes_for_sglang(version):
    fmt, datefmt = sglang_access_format(version)
    assert "%(request_line)s" in fmt and "%(status_code)s" in fmt
    aggregated = {s.id: s for s in catalogue.aggregate_signatures()}
    for method, path, status, expected in ACCESS_CASES:
        for line in (_access_line(fmt, datefmt, method, path, status),
                     _access_line(UVICORN_DEFAULT_ACCESS_FMT, None, method, path, status)):
            found = aggregated[expected].regex.search(line)
            assert found is not None and found["reason"] == str(status), (expected, line)
            assert [s.id for s in aggregated.values() if s.regex.search(line)][:1] == [expected], line
        assert catalogue.access_signature(method, path.split("?")[0], status) == expected
    # sglang prefixes uvicorn's line with its own timestamp: "[2025-07-01 12:00:00] INFO:     ..."
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] INFO:     10\.0\.3\.17:43127 - \"GET /health HTTP/1\.1\" "
                    r"200 OK$", _access_line(fmt, datefmt, "GET", "/health", 200))


def test_scan_counts_access_lines_as_sglang_writes_them(tmp_path):
    fmt, datefmt = sglang_access_format(LAST)
    log = tmp_path / "prefill.log"
    lines = [_access_line(fmt, datefmt, "GET", "/health", 200) for _ in range(3)]
    log.write_text("[2025-07-01 12:00:00] Decode batch, #running-req: 0\n" + "\n".join(lines) + "\n")
    from forensics.logs import scan

    access = scan(log).access
    assert int(access["count"].sum()) == 3 and set(access["signature"]) == {"access_health"}
    # the minute is the access line's own time (sglang's prefix), not a neighbour's
    assert access["minute"].tolist() == [pd.Timestamp(lines[0][1:17], tz="UTC")]


@pytest.mark.timeout(120)
def test_patched_engine_entries_match_the_patched_source(tmp_path):
    from patched_engine.codemod import patch_source

    original = source("0.5.15").backend_file("nixl").read_text(encoding="utf-8")
    patched = tmp_path / "conn.py"
    patched.write_text(patch_source(original, "0.5.15").new_text)
    plain = tmp_path / "conn_0_5_15.py"
    plain.write_text(original)
    for entry in (s for s in catalogue.signatures() if s.origin == "patched_engine"):
        assert messages_for(entry, tmp_path, [patched]), entry.id
        assert not messages_for(entry, tmp_path, [plain]), entry.id
    # The patch's ABORT handler logs like sglang's own (0.5.16+), so abort_received reads it too.
    assert messages_for(catalogue.by_id()["abort_received"], tmp_path, [patched])
    assert not messages_for(catalogue.by_id()["abort_received"], tmp_path, [plain])


@pytest.mark.parametrize("version", ["0.5.6", "0.5.15"])
def test_the_most_specific_entry_wins_by_rule_not_by_file_order(version):
    """Every message a release's disaggregation code can write (with every failure text the
    catalogue's reasons accept): where several entries match it, the winner is a hand entry over
    one derived from sglang's error calls, and otherwise matches more of it literally, or has the
    higher priority, never only the earlier place in the file; reversing the file's order changes
    no answer."""
    root = source(version).root
    hand, derived = catalogue.hand_event_signatures(), catalogue.derived_signatures()
    events = catalogue.event_signatures()
    assert events == hand + derived
    failures = tuple(sorted({f for entry in hand for f in _failures(entry, root)}))
    reversed_order = catalogue.ordered(reversed(hand)) + catalogue.ordered(reversed(derived))
    files = sorted(source(version).disaggregation.rglob("*.py"))
    overlaps = 0
    for message in sorted({m for path in files for m in renderings(path, failures)}):
        matching = [s for s in events if s.match(message) is not None]
        if len(matching) < 2:
            continue
        overlaps += 1
        winner, *others = matching
        group = hand if winner in hand else derived
        tied = [s.id for s in others if s in group and s.id != winner.id
                and (s.specificity, s.priority) == (winner.specificity, winner.priority)]
        assert not tied, f"{message!r}: {winner.id} wins over {tied} only by file order"
        assert next(s for s in reversed_order if s.match(message) is not None).id == winner.id
        if any(s in derived for s in matching) and any(s in hand for s in matching):
            assert winner in hand, f"{message!r}: derived {winner.id} wins over a hand entry"
    assert overlaps  # the decode's failure lines match the generic and the specific entries


def test_a_bootstrap_server_out_of_reach_is_not_a_generic_transfer_failure():
    line = ("Decode transfer failed for request rank=0 req.rid='r1' req.bootstrap_room=9223372036854775807 "
            "with exception Could not fetch prefill parallel info from bootstrap_addr: 10.0.0.5:8998")
    signature, fields = catalogue.classify(line)
    assert signature.id == "decode_bootstrap_unreachable" and fields["room"] == "9223372036854775807"
    assert "10.0.0.5:8998" in fields["reason"]
    generic = line.replace("Could not fetch prefill parallel info from bootstrap_addr: 10.0.0.5:8998", "Broken pipe")
    assert catalogue.classify(generic)[0].id == "decode_transfer_failed"
    assert catalogue.literal_chars("a(?:bc)?d") == 2 and catalogue.literal_chars("x(?:ab|c)y") == 3
