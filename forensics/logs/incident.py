"""Write realistic sglang PD incident logs for a chosen release: the documented fixture generator.

sglang's own lines come from the one formatter the twin uses too
(:mod:`forensics.logs.sglang_format`), which reads them from the release's source: the
``[time ranks]`` prefix (``configure_logger``, ``SGLANG_LOG_MS`` where the release has it),
the release's "Prefill batch"/"Decode batch" line, and the file, line and source text of the
GUARD assertion in the thread-death traceback that CPython's default excepthook prints to the
prefill scheduler's stderr (no prefix). Also written: uvicorn access lines (with the ``[time]``
prefix sglang's uvicorn config gives them), the abort lines of the decode and the DEBUG ABORT
send line.

The same records render as sglang log files, as journalctl text (short-iso,
short-precise, json) or as journal export format for systemd-journal-remote, so every
reader is tested against one story:

1. steady traffic: prefill and decode batches, /generate, /health and /metrics;
2. the trigger: a client aborts a request waiting for KV on the decode
   (``Decode transfer failed ... Aborted by AbortReq.``), which sends ABORT;
3. the prefill's ``bootstrap_thread`` dies on the GUARD assertion;
4. afterwards: only one-token health-probe prefill batches with a growing
   ``#bootstrap-req``, /health still 200, and after the waiting timeout a stream of
   decode timeouts, each sending another ABORT.

Bootstrap rooms are random 63-bit values, as sglang's routers draw them, so every test
built on these logs checks that rooms stay exact.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from forensics.logs import sglang_format

DEFAULT_RELEASE = "0.5.15"
UNITS = {"prefill": "sglang-prefill.service", "decode": "sglang-decode.service", "router": "sglang-router.service"}
PIDS = {"prefill": 4101, "decode": 4202, "router": 4303}


@dataclass(frozen=True)
class Record:
    ts: datetime  # UTC
    role: str
    text: str  # message without any prefix
    prefixed: bool = True  # False: raw stderr (tracebacks)
    ranks: str = " TP0"  # "" for uvicorn's access lines, which sglang prefixes with the time only
    release: str = DEFAULT_RELEASE  # whose configure_logger format the prefix follows


@dataclass
class Incident:
    """The facts a generated incident contains, for tests to assert against."""

    release: str
    trigger_room: int
    trigger_rid: str
    trigger_ts: datetime
    death_ts: datetime | None
    stuck_rooms: list[int] = field(default_factory=list)
    timeout_rooms: list[int] = field(default_factory=list)
    last_real_prefill: datetime | None = None
    records: list[Record] = field(default_factory=list)


def prefill_batch_line(release: str, new_seq: int, new_token: int, running: int, queue: int,
                       bootstrap: int, inflight: int, throughput: float, iteration: int | None = None) -> str:
    """The release's ``Prefill batch`` line (a GPU engine without CUDA graphs for prefill)."""
    return sglang_format.prefill_batch_line(
        release, iteration=iteration, new_seq=new_seq, new_token=new_token, cached_token=0,
        token_usage=min(0.99, 0.01 * running), running_req=running, queue_req=queue, pending_token=0,
        bootstrap_req=bootstrap, inflight_req=inflight, cuda_graph=False, input_throughput=throughput)


def decode_batch_line(release: str, running: int, tokens: int, prealloc: int, transfer: int,
                      throughput: float) -> str:
    """The release's ``Decode batch`` line (a GPU engine decoding under CUDA graphs)."""
    return sglang_format.decode_batch_line(
        release, running_req=running, token=tokens, token_usage=min(0.99, tokens / 200000),
        pre_allocated_usage=0.0, prealloc_req=prealloc, transfer_req=transfer, retracted_req=0, cuda_graph=True,
        gen_throughput=throughput, queue_req=0)


def access_line(method: str, path: str, status: int, port: int) -> str:
    phrase = {200: "OK", 503: "Service Unavailable", 500: "Internal Server Error"}.get(status, "OK")
    return f'INFO:     127.0.0.1:{port} - "{method} {path} HTTP/1.1" {status} {phrase}'


def thread_death_lines(release: str, thread_number: int = 5) -> list[str]:
    """CPython 3.11's excepthook output for the loop dying on the GUARD assertion: the thread's target,
    the file, line and source text of each sglang frame are the release's own (read from its source)."""
    site = sglang_format.guard_site(release)
    packages = "/opt/sglang/.venv/lib/python3.11/site-packages"
    lines = [
        f"Exception in thread Thread-{thread_number} ({site.target}):",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
        "    self.run()",
        '  File "/usr/lib/python3.11/threading.py", line 982, in run',
        "    self._target(*self._args, **self._kwargs)",
    ]
    if site.wrapper_line is not None:
        lines += [f'  File "{packages}/{site.path}", line {site.wrapper_line}, in {site.target}',
                  f"    {site.wrapper_text}"]
    lines += [
        f'  File "{packages}/{site.path}", line {site.line}, in {site.function}',
        f"    {site.text}",
        "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?",
    ]
    return lines


def generate(release: str = "0.5.15", *, start: datetime | None = None, seed: int = 7,
             steady_seconds: float = 120.0, after_seconds: float = 420.0, waiting_timeout: float = 300.0,
             debug: bool = True, wedge: bool = True, requests_per_second: float = 2.0) -> Incident:
    """Build the records of one incident (see the module docstring for the story)."""
    rng = random.Random(seed)
    start = start or datetime(2025, 7, 1, 12, 0, 0, tzinfo=UTC)
    records: list[Record] = []
    port = 40000

    def add(offset: float, role: str, text: str, prefixed: bool = True, ranks: str = " TP0") -> None:
        records.append(Record(start + timedelta(seconds=offset), role, text, prefixed, ranks, release))

    def access(offset: float, role: str, method: str, path: str) -> None:
        # sglang's uvicorn config: "[%(asctime)s] %(levelprefix)s ..." (a time, no ranks)
        add(offset, role, access_line(method, path, 200, next_port()), ranks="")

    def next_port() -> int:
        nonlocal port
        port += 1
        return port

    t = 0.0
    # Rooms as sglang's routers draw them: random over [0, 2**63) (mini_lb, the Rust router),
    # from their own generator so the story's other draws do not depend on them.
    room_rng = random.Random(seed ^ 0x600D_5EED)
    room_counter = iter(lambda: room_rng.randint(0, 2**63 - 1), None)
    in_flight = 0
    last_real = None
    # 1. steady traffic
    while t < steady_seconds:
        next(room_counter)  # every request takes a bootstrap room
        tokens = rng.randint(200, 4000)
        add(t, "prefill", prefill_batch_line(release, 1, tokens, 0, 0, 0, 1, tokens / 0.4))
        last_real = start + timedelta(seconds=t)
        access(t + 0.01, "prefill", "POST", "/generate")
        access(t + 0.3, "decode", "POST", "/generate")
        in_flight = rng.randint(1, 6)
        if int(t) % 2 == 0:
            add(t + 0.2, "decode", decode_batch_line(release, in_flight, 1000 * in_flight, 0, 0, 95.0 + rng.random()))
        if int(t * 10) % 50 == 0:
            access(t + 0.05, "prefill", "GET", "/health")
            access(t + 0.06, "decode", "GET", "/health")
        if int(t * 10) % 150 == 0:
            access(t + 0.07, "prefill", "GET", "/metrics")
        t += 1.0 / requests_per_second
    # 2. the trigger: a client gives up on a request whose KV is still pending
    trigger_room = next(room_counter)
    trigger_rid = f"{rng.getrandbits(64):016x}"
    trigger_t = t + 0.5
    if debug:
        add(trigger_t - 0.001, "decode", f"Abort transfer queue request. decode_req.req.rid='{trigger_rid}'")
    add(trigger_t, "decode",
        f"Decode transfer failed for request rank=0 decode_req.req.rid='{trigger_rid}' "
        f"decode_req.req.bootstrap_room={trigger_room} with exception "
        f"KVTransferError(bootstrap_room={trigger_room}): Aborted by AbortReq.")
    if debug:
        add(trigger_t + 0.001, "decode", f"Sent abort notification for room {trigger_room} to 127.0.0.1:43117")
    death_t = trigger_t + 0.004
    stuck: list[int] = []
    timeouts: list[int] = []
    if wedge:
        died = sglang_format.guard_site(release).died_message  # the 0.5.21+ wrapper's logger.exception
        if died is not None:
            add(death_t - 0.001, "prefill", died)
        for line in thread_death_lines(release):
            add(death_t, "prefill", line, prefixed=False)
    # 3. after: requests pile up; probes keep /health green
    t = trigger_t + 1.0
    bootstrap_queue = 0
    transfer_queue = 0
    sent_times: list[tuple[float, int]] = []
    hinted = False
    while t < trigger_t + after_seconds:
        room = next(room_counter)
        if wedge:
            stuck.append(room)
            bootstrap_queue += 1
            transfer_queue += 1
            sent_times.append((t, room))
        else:
            add(t, "prefill", prefill_batch_line(release, 1, 512, 0, 0, 0, 1, 1280.0))
        if int(t * 10) % 50 == 0:
            # A /health probe that reaches the prefill runs a real one-token batch (facts §4.3).
            add(t + 0.02, "prefill", prefill_batch_line(release, 1, 1, 0, 0, bootstrap_queue, 0, 0.05))
            access(t + 0.03, "prefill", "GET", "/health")
            access(t + 0.04, "decode", "GET", "/health")
        if int(t) % 2 == 0:
            add(t + 0.2, "decode", decode_batch_line(release, 0, 0, 0, transfer_queue, 0.0))
        while wedge and sent_times and t - sent_times[0][0] >= waiting_timeout:
            sent_at, timed_room = sent_times.pop(0)
            transfer_queue -= 1
            timeouts.append(timed_room)
            elapsed = t - sent_at
            if not hinted:
                add(t, "decode", "Some requests fail to receive KV Cache transfer done signal after bootstrapping. "
                    "If a greater mean TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' "
                    "(10 minutes) to relax the timeout condition.")
                hinted = True
            timed_rid = f"{rng.getrandbits(64):016x}"
            add(t + 0.001, "decode",
                f"Decode transfer failed for request rank=0 decode_req.req.rid='{timed_rid}' "
                f"decode_req.req.bootstrap_room={timed_room} with exception KVTransferError(bootstrap_room="
                f"{timed_room}): Request {timed_room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput")
            if debug:
                add(t + 0.002, "decode", f"Sent abort notification for room {timed_room} to 127.0.0.1:43117")
        t += 1.0 / requests_per_second
    records.sort(key=lambda r: r.ts)
    return Incident(release=release, trigger_room=trigger_room, trigger_rid=trigger_rid,
                    trigger_ts=start + timedelta(seconds=trigger_t),
                    death_ts=start + timedelta(seconds=death_t) if wedge else None,
                    stuck_rooms=stuck, timeout_rooms=timeouts, last_real_prefill=last_real, records=records)


# ----------------------------------------------------------------------------- rendering


def sglang_line(record: Record, tz: str = "UTC", millis: bool = False) -> str:
    """The record as its log file holds it: the release's ``configure_logger`` prefix (milliseconds
    only where the release reads ``SGLANG_LOG_MS``), uvicorn's ``[time]`` for access lines, nothing
    for raw stderr."""
    if not record.prefixed:
        return record.text
    local = record.ts.astimezone(ZoneInfo(tz))
    # uvicorn's access lines: sglang's uvicorn config prints the time with no milliseconds and no ranks
    head = sglang_format.log_format(record.release).prefix(local, record.ranks, millis=millis and bool(record.ranks))
    return head + record.text


def _journal_prefix(record: Record, style: str, host: str) -> str:
    unit = UNITS[record.role].removesuffix(".service")
    pid = PIDS[record.role]
    if style == "short-iso":
        stamp = record.ts.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    elif style == "short-iso-precise":
        stamp = record.ts.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
    else:  # short-precise, in UTC here
        stamp = record.ts.strftime("%b %d %H:%M:%S.%f")
    return f"{stamp} {host} {unit}[{pid}]: "


def write_sglang_logs(incident: Incident, directory: Path, tz: str = "UTC", millis: bool = False) -> dict[str, Path]:
    """One log file per role, as sglang writes them (stderr merged, so tracebacks are in line)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for role in ("prefill", "decode"):
        path = directory / f"{role}.log"
        with open(path, "w", encoding="utf-8") as handle:
            for record in incident.records:
                if record.role == role:
                    handle.write(sglang_line(record, tz, millis) + "\n")
        paths[role] = path
    return paths


def write_journal_text(incident: Incident, path: Path, style: str = "short-iso", host: str = "pd-node-1") -> Path:
    """Both services in one journalctl text dump (short-iso, short-iso-precise, short-precise or json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in incident.records:
            message = sglang_line(record)
            if style == "json":
                entry = {
                    "__REALTIME_TIMESTAMP": str(int(record.ts.timestamp() * 1_000_000)),
                    "_HOSTNAME": host, "_SYSTEMD_UNIT": UNITS[record.role],
                    "SYSLOG_IDENTIFIER": UNITS[record.role].removesuffix(".service"),
                    "_PID": str(PIDS[record.role]), "PRIORITY": "6", "MESSAGE": message,
                }
                handle.write(json.dumps(entry) + "\n")
            else:
                handle.write(_journal_prefix(record, style, host) + message + "\n")
    return path


def write_journal_export(incident: Incident, path: Path, host: str = "pd-node-1") -> Path:
    """Journal export format (what systemd-journal-remote reads) for both services."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        for number, record in enumerate(incident.records):
            micros = int(record.ts.timestamp() * 1_000_000)
            fields = {
                "__CURSOR": f"s=0;i={number}", "__REALTIME_TIMESTAMP": str(micros),
                "__MONOTONIC_TIMESTAMP": str(number + 1), "_BOOT_ID": "0123456789abcdef0123456789abcdef",
                "_HOSTNAME": host, "_SYSTEMD_UNIT": UNITS[record.role],
                "SYSLOG_IDENTIFIER": UNITS[record.role].removesuffix(".service"), "_PID": str(PIDS[record.role]),
                "PRIORITY": "6", "MESSAGE": sglang_line(record),
            }
            for key, value in fields.items():
                handle.write(f"{key}={value}\n".encode())
            handle.write(b"\n")
    return path
