"""Write a large two-service journal (journalctl ``-o short-iso`` text) for the log benchmarks.

One host runs ``sglang-prefill.service`` and ``sglang-decode.service`` (release 0.5.15
formats). The steady mix is drawn line by line from ``MIX`` (batch lines, uvicorn
access lines, DEBUG lines of the NIXL bootstrap loop, other INFO lines, rare aborts);
``incidents`` incident blocks (trigger, ABORT send, thread-death traceback, waiting
timeouts) sit at known places. Every signature line written is tallied, so the
manifest written beside the journal (``<path>.manifest.json``) says exactly what a
reader must find.

``--profile storm`` (or any ``--event-share``) writes the shape of a log during an abort
storm instead: besides the same steady mix, a share of the lines (3% for ``storm``) are
incident events spread through the whole file: decode transfer timeouts
(``... timed out after 300.4s in KVPoll.WaitingForInput``) each followed by its ABORT
send, client aborts (``Abort transfer queue request``, ``Decode transfer failed ...
Aborted by AbortReq.``, ABORT send), prealloc aborts (``Decode handshake failed``) and
prefill bootstrap timeouts. Their rooms are random over [0, 2**63), as sglang's
routers draw them, so the benchmark also proves rooms stay exact.

Line texts come from the builders in ``forensics.logs.incident``; to write a gigabyte
in seconds each builder is called once with marker values and turned into a ``%``
template (``Templates``), which the tests check against the builder itself.

    python -m benchmarks.journal_corpus --size 1G [--out PATH] [--seed N] [--incidents N]
    python -m benchmarks.journal_corpus --profile storm --size 300M     # benchmarks/data/journal-storm-300m.log
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from forensics.logs import incident

RELEASE = "0.5.15"
HOST = "pd-node-1"
DEFAULT_PATH = Path(__file__).parent / "data" / "journal-1g.log"
STORM_PATH = Path(__file__).parent / "data" / "journal-storm-300m.log"
# Profiles: the share of lines that are storm events (on top of the three incidents).
PROFILES = {"steady": 0.0, "storm": 0.03}
DEFAULT_SIZES = {"steady": "1G", "storm": "300M"}
START = datetime(2025, 7, 1, 0, 0, 0, tzinfo=UTC)
LINES_PER_SECOND = 400  # a busy pair of engines with DEBUG logging on
BLOCK_LINES = 20_000  # lines joined and written at once

# The steady mix: (kind, share of lines in percent). Kinds are written by ``_steady_line``.
MIX: tuple[tuple[str, float], ...] = (
    ("prefill_batch", 16.0),
    ("decode_batch", 22.0),
    ("access_generate", 14.0),
    ("access_chat", 8.0),
    ("access_health", 4.0),
    ("access_metrics", 2.0),
    ("debug_multipart", 12.0),
    ("debug_got_info", 10.0),
    ("info_receive", 6.0),
    ("info_finish", 5.86),
    ("debug_abort_queued", 0.08),  # scheduler_abort_request (DEBUG "Abort queued request.")
    ("client_disconnected", 0.06),  # client_disconnected ("Client disconnected: ...")
)
# What each kind is, for the summary line of the mix.
GROUPS = {
    "prefill_batch": "batch lines", "decode_batch": "batch lines",
    "access_generate": "uvicorn access lines", "access_chat": "uvicorn access lines",
    "access_health": "uvicorn access lines", "access_metrics": "uvicorn access lines",
    "debug_multipart": "DEBUG lines", "debug_got_info": "DEBUG lines", "debug_abort_queued": "DEBUG lines",
    "info_receive": "other INFO lines", "info_finish": "other INFO lines", "client_disconnected": "other INFO lines",
    "incident": "incident lines",
    "storm_timeout": "incident lines", "storm_abort": "incident lines", "storm_handshake_abort": "incident lines",
    "storm_bootstrap_timeout": "incident lines",
}
# The catalogue signature each steady kind is, if any.
STEADY_SIGNATURE = {"debug_abort_queued": "scheduler_abort_request", "client_disconnected": "client_disconnected"}
TIMEOUTS_PER_INCIDENT = 20
# Storm event groups: (kind, weight); each kind writes a fixed number of lines (STORM_LINES).
STORM_MIX: tuple[tuple[str, float], ...] = (
    ("storm_timeout", 0.55),  # decode waiting timeout + ABORT send
    ("storm_abort", 0.15),  # client abort in the transfer queue: DEBUG abort, transfer failed, ABORT send
    ("storm_handshake_abort", 0.05),  # abort in the prealloc queue: DEBUG abort, handshake failed, ABORT send
    ("storm_bootstrap_timeout", 0.25),  # prefill request never got its transfer info
)
STORM_LINES = {"storm_timeout": 2, "storm_abort": 3, "storm_handshake_abort": 3, "storm_bootstrap_timeout": 1}
ROOM_BITS = 63  # sglang's mini_lb and Rust router draw rooms from [0, 2**63)
ROOM_MIX = 0x9E3779B97F4A7C15  # odd: n -> n * ROOM_MIX mod 2**63 is a bijection


CORPUS_LAYOUT = 2  # 2: steady rooms spread over [0, 2**63) (1: small sequential rooms)


def room_of(request: int) -> int:
    """The steady mix numbers its requests; each gets a distinct room spread over [0, 2**63)."""
    return (request * ROOM_MIX) % (1 << ROOM_BITS)


PREFILL_FIELDS = ("new_seq", "new_token", "running", "queue", "bootstrap", "inflight", "throughput")
DECODE_FIELDS = ("running", "tokens", "prealloc", "transfer", "throughput")


def _template(text: str, tokens: dict[str, str], placeholders: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """Turn a builder's output into a ``%`` template.

    ``tokens`` maps each field to the exact text the builder printed for its marker value;
    the returned names are the fields in the order ``%`` must receive them.
    """
    for name, token in tokens.items():
        if text.count(token) != 1:
            raise RuntimeError(f"template: marker {token!r} for {name} is not printed exactly once in {text!r}")
    names = tuple(name for _, name in sorted((text.index(token), name) for name, token in tokens.items()))
    for name, token in tokens.items():
        text = text.replace(token, placeholders[name], 1)
    return text, names


class Templates:
    """``%`` templates made from the incident builders, one per line kind."""

    def __init__(self, release: str = RELEASE) -> None:
        marker = dict(zip(PREFILL_FIELDS, range(987_601, 987_700)))
        text = incident.prefill_batch_line(release, *(marker[n] for n in PREFILL_FIELDS[:-1]),
                                           float(marker["throughput"]))
        tokens = {n: str(marker[n]) for n in PREFILL_FIELDS[:-1]}
        tokens["throughput"] = f"{marker['throughput']:.2f}"
        tokens["usage"] = f"token usage: {min(0.99, 0.01 * marker['running']):.2f}"
        placeholders = dict.fromkeys(PREFILL_FIELDS, "%d") | {"throughput": "%.2f", "usage": "token usage: %.2f"}
        self.prefill_batch = _template(text, tokens, placeholders)

        marker = dict(zip(DECODE_FIELDS, range(987_701, 987_800)))
        text = incident.decode_batch_line(release, *(marker[n] for n in DECODE_FIELDS[:-1]),
                                          float(marker["throughput"]))
        tokens = {n: str(marker[n]) for n in DECODE_FIELDS[:-1]}
        tokens["throughput"] = f"{marker['throughput']:.2f}"
        tokens["usage"] = f"token usage: {min(0.99, marker['tokens'] / 200000):.2f}"
        placeholders = dict.fromkeys(DECODE_FIELDS, "%d") | {"throughput": "%.2f", "usage": "token usage: %.2f"}
        self.decode_batch = _template(text, tokens, placeholders)

        # Access lines: method and path are fixed per kind, the client port varies.
        self.access = {}
        for kind, method, path in (("access_generate", "POST", "/generate"),
                                   ("access_chat", "POST", "/v1/chat/completions"),
                                   ("access_health", "GET", "/health"),
                                   ("access_metrics", "GET", "/metrics")):
            self.access[kind] = _template(incident.access_line(method, path, 200, 987_899),
                                          {"port": "987899"}, {"port": "%d"})[0]
        self.thread_death = incident.thread_death_lines(release)

    def render_prefill(self, new_seq, new_token, running, queue, bootstrap, inflight, throughput) -> str:
        template, names = self.prefill_batch
        values = dict(zip(PREFILL_FIELDS, (new_seq, new_token, running, queue, bootstrap, inflight, throughput)))
        values["usage"] = min(0.99, 0.01 * running)
        return template % tuple(values[name] for name in names)

    def render_decode(self, running, tokens, prealloc, transfer, throughput) -> str:
        template, names = self.decode_batch
        values = dict(zip(DECODE_FIELDS, (running, tokens, prealloc, transfer, throughput)))
        values["usage"] = min(0.99, tokens / 200000)
        return template % tuple(values[name] for name in names)


@dataclass
class Manifest:
    """What the generated journal holds, for the benchmark and tests to assert."""

    path: str
    bytes: int = 0
    lines: int = 0
    seed: int = 0
    release: str = RELEASE
    kinds: Counter = field(default_factory=Counter)  # steady line kinds and incident lines
    signatures: Counter = field(default_factory=Counter)  # catalogue signature id -> lines
    incident_lines: list[int] = field(default_factory=list)  # 1-based line of each thread-death header
    trigger_rooms: list[int] = field(default_factory=list)
    seconds: float = 0.0
    event_share: float = 0.0  # share of lines written as storm events (0: the steady profile)
    layout: int = 0  # CORPUS_LAYOUT of the generator that wrote it: an older journal is written anew

    def mix_percent(self) -> dict[str, float]:
        total = sum(self.kinds.values()) or 1
        return {kind: round(100.0 * count / total, 3) for kind, count in self.kinds.most_common()}

    def group_percent(self) -> dict[str, float]:
        groups: Counter = Counter()
        for kind, count in self.kinds.items():
            groups[GROUPS.get(kind, kind)] += count
        total = sum(groups.values()) or 1
        return {group: round(100.0 * count / total, 3) for group, count in groups.most_common()}

    def to_json(self) -> dict:
        return {
            "path": self.path, "bytes": self.bytes, "lines": self.lines, "seed": self.seed,
            "release": self.release, "kinds": dict(self.kinds), "mix_percent": self.mix_percent(),
            "group_percent": self.group_percent(),
            "signatures": dict(self.signatures), "incident_lines": self.incident_lines,
            "trigger_rooms": self.trigger_rooms, "seconds": round(self.seconds, 2),
            "event_share": self.event_share, "layout": self.layout,
        }

    @classmethod
    def load(cls, journal: Path) -> Manifest:
        data = json.loads(manifest_path(journal).read_text())
        return cls(path=data["path"], bytes=data["bytes"], lines=data["lines"], seed=data["seed"],
                   release=data["release"], kinds=Counter(data["kinds"]), signatures=Counter(data["signatures"]),
                   incident_lines=data["incident_lines"], trigger_rooms=data["trigger_rooms"],
                   seconds=data["seconds"], event_share=data.get("event_share", 0.0),
                   layout=data.get("layout", 0))

    @property
    def event_lines(self) -> int:
        """Lines that are one event each in ``scan()`` (every tallied signature line)."""
        return sum(self.signatures.values())


def manifest_path(journal: Path) -> Path:
    return journal.with_name(journal.name + ".manifest.json")


def parse_size(text: str) -> int:
    """'1G', '100M', '64k' or a plain number of bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


class _Writer:
    """Accumulates lines for one second of journal time; the prefixes change once a second."""

    def __init__(self, handle, manifest: Manifest) -> None:
        self.handle = handle
        self.manifest = manifest
        self.lines: list[str] = []
        self.second = -1
        self.prefix = {}
        self.sglang = ""

    def at(self, second: int) -> None:
        if second == self.second:
            return
        self.second = second
        moment = START + timedelta(seconds=second)
        stamp = moment.strftime("%Y-%m-%dT%H:%M:%S+00:00")
        for role in ("prefill", "decode"):
            unit = incident.UNITS[role].removesuffix(".service")
            self.prefix[role] = f"{stamp} {HOST} {unit}[{incident.PIDS[role]}]: "
        self.sglang = moment.strftime("[%Y-%m-%d %H:%M:%S TP0] ")

    def add(self, role: str, message: str, prefixed: bool = True) -> None:
        self.lines.append(self.prefix[role] + (self.sglang + message if prefixed else message))

    def flush(self) -> None:
        if self.lines:
            text = "\n".join(self.lines) + "\n"
            data = text.encode()
            self.handle.write(data)
            self.manifest.bytes += len(data)
            self.manifest.lines += len(self.lines)
            self.lines.clear()


def _steady_line(writer: _Writer, kind: str, rng: random.Random, templates: Templates, state: dict) -> None:
    if kind == "prefill_batch":
        tokens = rng.randint(128, 8192)
        running = rng.randint(0, 24)
        writer.add("prefill", templates.render_prefill(
            rng.randint(1, 4), tokens, running, rng.randint(0, 6), rng.randint(0, 3), rng.randint(0, 4),
            tokens / (0.05 + rng.random())))
    elif kind == "decode_batch":
        running = rng.randint(1, 64)
        writer.add("decode", templates.render_decode(
            running, running * rng.randint(200, 3000), rng.randint(0, 4), rng.randint(0, 8),
            90.0 + 400 * rng.random()))
    elif kind.startswith("access_"):
        role = "prefill" if kind in ("access_health", "access_metrics") and rng.random() < 0.5 else "decode"
        if kind == "access_generate":
            role = "prefill" if rng.random() < 0.5 else "decode"
        writer.add(role, templates.access[kind] % (1024 + rng.getrandbits(15)), prefixed=False)
    elif kind == "debug_multipart":
        writer.add("prefill", f"Received multipart with total byte size {rng.randint(40, 2400)}")
    elif kind == "debug_got_info":
        state["room"] += 1
        writer.add("prefill", f"got info room={room_of(state['room'])} agent_name='decode-{rng.getrandbits(32):08x}' "
                              f"required_dst_info_num=1")
    elif kind == "info_receive":
        writer.add("decode", f"Receive: obj=GenerateReqInput(rid='{rng.getrandbits(64):016x}', "
                             f"sampling_params={{'max_new_tokens': {rng.randint(16, 1024)}, 'temperature': 0.7}}, "
                             f"stream=True, bootstrap_host='10.0.0.2', bootstrap_room={room_of(state['room'])})")
    elif kind == "info_finish":
        writer.add("decode", f"Finish: obj=GenerateReqInput(rid='{rng.getrandbits(64):016x}'), "
                             f"out={{'meta_info': {{'prompt_tokens': {rng.randint(16, 8000)}, "
                             f"'completion_tokens': {rng.randint(1, 1024)}, 'e2e_latency': {rng.random() * 9:.3f}}}}}")
    elif kind == "debug_abort_queued":
        writer.add("decode", f"Abort queued request. req.rid='{rng.getrandbits(64):016x}'")
    elif kind == "client_disconnected":
        writer.add("decode", f"[http_server] Client disconnected: Request is disconnected from the client side "
                             f"(type 3). Abort request obj.rid='{rng.getrandbits(64):016x}'")
    else:
        raise ValueError(f"unknown steady line kind {kind!r}")


def _incident(writer: _Writer, rng: random.Random, templates: Templates, state: dict, manifest: Manifest) -> None:
    """Trigger, ABORT send, thread death and a first handshake abort, all in one second."""
    tally = manifest.signatures
    state["room"] += 1
    room = room_of(state["room"])
    rid = f"{rng.getrandbits(64):016x}"
    writer.add("decode", f"Abort transfer queue request. decode_req.req.rid='{rid}'")
    tally["scheduler_abort_request"] += 1
    writer.add("decode", f"Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' "
                         f"decode_req.req.bootstrap_room={room} with exception "
                         f"KVTransferError(bootstrap_room={room}): Aborted by AbortReq.")
    tally["decode_transfer_aborted"] += 1
    writer.add("decode", f"Sent abort notification for room {room} to 10.0.0.1:43117")
    tally["abort_sent"] += 1
    writer.add("prefill", "Received multipart with total byte size 37")
    manifest.incident_lines.append(manifest.lines + len(writer.lines) + 1)
    for line in templates.thread_death:
        writer.add("prefill", line, prefixed=False)
    tally["thread_death"] += 1
    tally["nixl_guard_assertion"] += 1
    state["room"] += 1
    writer.add("decode", f"Decode handshake failed for request rank=0 decode_req.req.rid='{rng.getrandbits(64):016x}' "
                         f"decode_req.req.bootstrap_room={room_of(state['room'])} with exception "
                         f"KVTransferError(bootstrap_room={room_of(state['room'])}): Aborted by AbortReq.")
    tally["decode_handshake_aborted"] += 1
    manifest.kinds["incident"] += 5 + len(templates.thread_death)
    manifest.trigger_rooms.append(room)
    state["timeouts_due"] += TIMEOUTS_PER_INCIDENT
    state["hint_due"] = True


def _timeout(writer: _Writer, rng: random.Random, state: dict, manifest: Manifest) -> None:
    """One decode waiting timeout (and the one-time hint before the first), each sending ABORT."""
    tally = manifest.signatures
    if state["hint_due"]:
        writer.add("decode", "Some requests fail to receive KV Cache transfer done signal after bootstrapping. "
                             "If a greater mean TTFT is acceptable, you can 'export "
                             "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax the timeout condition.")
        tally["waiting_timeout_hint"] += 1
        manifest.kinds["incident"] += 1
        state["hint_due"] = False
    room = room_of(state["room"] - rng.randint(100, 5000))
    writer.add("decode", f"Decode transfer failed for request rank=0 decode_req.req.rid='{rng.getrandbits(64):016x}' "
                         f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room="
                         f"{room}): Request {room} timed out after {300 + rng.random():.1f}s in KVPoll.WaitingForInput")
    writer.add("decode", f"Sent abort notification for room {room} to 10.0.0.1:43117")
    tally["decode_transfer_timeout"] += 1
    tally["abort_sent"] += 1
    manifest.kinds["incident"] += 2
    state["timeouts_due"] -= 1


def _storm_event(writer: _Writer, kind: str, rng: random.Random, manifest: Manifest) -> None:
    """One storm event group (see ``STORM_MIX``); rooms random over [0, 2**63)."""
    tally = manifest.signatures
    room = rng.getrandbits(ROOM_BITS)
    rid = f"{rng.getrandbits(64):016x}"
    if kind == "storm_timeout":
        writer.add("decode", f"Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' "
                             f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room="
                             f"{room}): Request {room} timed out after {300 + rng.random():.1f}s in "
                             f"KVPoll.WaitingForInput")
        writer.add("decode", f"Sent abort notification for room {room} to 10.0.0.1:43117")
        tally["decode_transfer_timeout"] += 1
        tally["abort_sent"] += 1
    elif kind in ("storm_abort", "storm_handshake_abort"):
        queue, what, signature = (("transfer", "transfer", "decode_transfer_aborted") if kind == "storm_abort"
                                  else ("prealloc", "handshake", "decode_handshake_aborted"))
        writer.add("decode", f"Abort {queue} queue request. decode_req.req.rid='{rid}'")
        writer.add("decode", f"Decode {what} failed for request rank=0 decode_req.req.rid='{rid}' "
                             f"decode_req.req.bootstrap_room={room} with exception "
                             f"KVTransferError(bootstrap_room={room}): Aborted by AbortReq.")
        writer.add("decode", f"Sent abort notification for room {room} to 10.0.0.1:43117")
        tally["scheduler_abort_request"] += 1
        tally[signature] += 1
        tally["abort_sent"] += 1
    elif kind == "storm_bootstrap_timeout":
        writer.add("prefill", f"Prefill bootstrap failed for request rank=0 req.rid='{rid}' "
                              f"req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
                              f"Request {room} timed out after {30 + rng.random():.1f}s in KVPoll.Bootstrapping")
        tally["prefill_bootstrap_timeout"] += 1
    else:
        raise ValueError(f"unknown storm event kind {kind!r}")
    manifest.kinds[kind] += STORM_LINES[kind]


def generate(path: Path, size: int, *, seed: int = 7, incidents: int = 3, event_share: float = 0.0) -> Manifest:
    """Write about ``size`` bytes of journal to ``path`` (whole lines) and its manifest beside it.

    ``event_share`` > 0 mixes storm events (``STORM_MIX``) into the steady lines so that
    about that share of all lines are storm event lines.
    """
    if not 0.0 <= event_share < 0.5:
        raise ValueError(f"event_share {event_share} is outside [0, 0.5)")
    started = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    # Storm draws come from their own generator: the steady lines stay those of the same seed.
    storm_rng = random.Random(seed ^ 0x5707_3A11)
    storm_kinds = [kind for kind, _ in STORM_MIX]
    storm_weights = [weight for _, weight in STORM_MIX]
    # Storm lines per steady line, so that storm lines / all lines == event_share.
    storm_rate = event_share / (1.0 - event_share)
    storm_credit = 0.0
    templates = Templates()
    manifest = Manifest(path=str(path), seed=seed, event_share=event_share, layout=CORPUS_LAYOUT)
    kinds = [kind for kind, _ in MIX]
    weights = [share for _, share in MIX]
    # An incident starts when the written bytes pass each of these marks.
    marks = [size * (index + 0.5) / incidents for index in range(incidents)] if incidents else []
    state = {"room": 10_000, "timeouts_due": 0, "hint_due": False}
    line_index = 0
    # About 40 blocks for a small journal, so incidents land apart; big ones use BLOCK_LINES.
    block_lines = max(200, min(BLOCK_LINES, size // 200 // 40))
    with open(path, "wb") as handle:
        writer = _Writer(handle, manifest)
        while manifest.bytes < size:
            block = rng.choices(kinds, weights, k=block_lines)
            for kind in block:
                writer.at(line_index // LINES_PER_SECOND)
                _steady_line(writer, kind, rng, templates, state)
                manifest.kinds[kind] += 1
                signature = STEADY_SIGNATURE.get(kind)
                if signature:
                    manifest.signatures[signature] += 1
                line_index += 1
                if state["timeouts_due"] and line_index % 97 == 0:
                    _timeout(writer, rng, state, manifest)
                if storm_rate:
                    storm_credit += storm_rate
                    while storm_credit >= 1.0:
                        storm = storm_rng.choices(storm_kinds, storm_weights)[0]
                        _storm_event(writer, storm, storm_rng, manifest)
                        storm_credit -= STORM_LINES[storm]
            # Incidents go at block boundaries once the bytes pass their mark.
            while marks and manifest.bytes + sum(map(len, writer.lines)) >= marks[0]:
                marks.pop(0)
                _incident(writer, rng, templates, state, manifest)
            writer.flush()
            if manifest.bytes >= size and marks:
                # A small size: place the remaining incidents at the end rather than drop them.
                while marks:
                    marks.pop(0)
                    _incident(writer, rng, templates, state, manifest)
                while state["timeouts_due"]:
                    _timeout(writer, rng, state, manifest)
                writer.flush()
        while state["timeouts_due"]:
            _timeout(writer, rng, state, manifest)
        writer.flush()
    manifest.seconds = time.perf_counter() - started
    manifest_path(path).write_text(json.dumps(manifest.to_json(), indent=1) + "\n")
    return manifest


def ensure(path: Path, size: int, *, seed: int = 7, incidents: int = 3, event_share: float = 0.0) -> Manifest:
    """The journal at ``path`` if one of this size, seed and profile is there already, else a new one."""
    try:
        manifest = Manifest.load(path)
        if manifest.seed == seed and manifest.bytes >= size and path.stat().st_size == manifest.bytes \
                and len(manifest.incident_lines) == incidents and manifest.bytes - size < (1 << 20) \
                and manifest.event_share == event_share and manifest.layout == CORPUS_LAYOUT:
            return manifest
    except (OSError, ValueError, KeyError):
        pass
    return generate(path, size, seed=seed, incidents=incidents, event_share=event_share)


def default_path(profile: str, size: str | None = None) -> Path:
    """Where a corpus of this profile and size lives by default (benchmarks/data/, git-ignored)."""
    size = (size or DEFAULT_SIZES[profile]).lower()
    if profile == "steady":
        return DEFAULT_PATH.with_name(f"journal-{size}.log")
    return STORM_PATH.with_name(f"journal-{profile}-{size}.log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.journal_corpus", description=__doc__.split("\n")[0])
    parser.add_argument("--size", default=None, help="bytes to write: 1G, 100M, ... (default 1G; 300M for storm)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"journal path (default {DEFAULT_PATH}; {STORM_PATH} for --profile storm)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--incidents", type=int, default=3)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="steady",
                        help="steady (rare incidents) or storm (about 3%% of lines are incident events)")
    parser.add_argument("--event-share", type=float, default=None,
                        help="share of lines written as storm events (overrides the profile's)")
    args = parser.parse_args(argv)
    size = args.size or DEFAULT_SIZES[args.profile]
    share = PROFILES[args.profile] if args.event_share is None else args.event_share
    out = args.out or default_path(args.profile, size)
    if args.out is None and share != PROFILES[args.profile]:
        out = out.with_name(f"journal-share{share:g}-{size.lower()}.log")  # never over a profile's default corpus
    args.out = out
    manifest = generate(out, parse_size(size), seed=args.seed, incidents=args.incidents, event_share=share)
    print(f"wrote {manifest.bytes / 1e6:.1f} MB, {manifest.lines} lines to {args.out} in {manifest.seconds:.1f} s",
          file=sys.stderr)
    print(json.dumps(manifest.to_json(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
