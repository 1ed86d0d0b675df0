"""Drive one PD deployment through the events the fidelity check compares, marking each in the logs.

The same five events on the real engine and on the twin, through the deployment's router:
start-up (everything before the first request), a served request, an abort (a streaming client
killed while its KV is pending, so the decode sends ABORT), the death of the prefill's
``bootstrap_thread`` that an unpatched vulnerable release shows on that ABORT, and a waiting
timeout (a request the dead thread never bootstraps, timed out by the decode's
``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``). Each event's lines are the bytes each role's log
grew by between its marks, so a line is attributed to the event it follows, never guessed.

The abort needs a prefill slow enough that the KV is still pending when the client dies (the
real engine's ``slow-prefill`` model with a 3000-token prompt; the twin's ``prefill_rate_tps``);
waits are on what the logs say, with deadlines, never fixed sleeps for readiness.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forensics.exitcodes import Undecided

EVENTS = ("startup", "served", "abort", "waiting_timeout")
# What each event's end is recognised by, in which role's log (sglang's own words in 0.5.x).
DEATH_MARK = "Foreign traffic"  # the NIXL GUARD assertion's message: bootstrap_thread is dead
TIMEOUT_MARK = "timed out after"  # the decode's "Request R timed out after Xs in KVPoll.WaitingForInput"
LONG_PROMPT_WORDS = 3000
KILL_AFTER_S = 4.0  # the client dies this long after sending: inside the slow prefill's window


class ScenarioError(Undecided):
    """An event did not happen within its deadline (says which, and what the log showed)."""


@dataclass
class Marks:
    """Byte offsets of each role's log at each event's start, and what happened."""

    offsets: dict[str, dict[str, int]] = field(default_factory=dict)  # event -> role -> offset
    ends: dict[str, int] = field(default_factory=dict)  # role -> offset when the scenario ended
    outcomes: dict[str, str] = field(default_factory=dict)  # event -> what was seen
    generate_answer: dict | None = None

    def to_dict(self) -> dict:
        return {"offsets": self.offsets, "ends": self.ends, "outcomes": self.outcomes,
                "generate_answer": self.generate_answer}

    @classmethod
    def from_dict(cls, data: dict) -> Marks:
        return cls(data["offsets"], data["ends"], data["outcomes"], data.get("generate_answer"))

    def span(self, event: str, role: str) -> tuple[int, int]:
        """[start, end) byte offsets of ``event`` in ``role``'s log."""
        index = EVENTS.index(event)
        start = self.offsets[event][role] if event != "startup" else 0
        if index + 1 < len(EVENTS) and EVENTS[index + 1] in self.offsets:
            return start, self.offsets[EVENTS[index + 1]][role]
        return start, self.ends[role]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _wait_for(path: Path, text: str, start: int, deadline_s: float, what: str) -> float:
    began = time.monotonic()
    while time.monotonic() - began < deadline_s:
        with open(path, "rb") as handle:
            handle.seek(start)
            if text.encode() in handle.read():
                return time.monotonic() - began
        time.sleep(0.5)
    raise ScenarioError(f"{what}: {text!r} did not appear in {path} within {deadline_s:.0f} s")


def post_json(url: str, body: dict, timeout: float) -> tuple[int | None, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return None, repr(exc).encode()


def decode_arrivals(decode_url: str) -> Callable[[], int | None]:
    """The decode's own count of ``/generate`` requests that reached it (``sglang:http_requests_total``)."""
    from forensics.storm.observer import DecodeArrivals

    return DecodeArrivals([("decode", decode_url)], "/generate").count


def kill_streaming_client(router: str, body: dict, after_s: float,
                          arrivals: Callable[[], int | None] | None = None, deadline_s: float = 180.0) -> str:
    """Send a streaming request and die abruptly (RST, as a killed process's socket does).

    With ``arrivals`` (the decode's arrival count) the client dies once the decode counts the
    request, while the prefill still computes the long prompt (its KV pending), however loaded the
    machine; without, ``after_s`` after sending. Returns which of the two chose the moment."""
    parsed = urllib.parse.urlsplit(router)
    payload = json.dumps(body).encode()
    before = arrivals() if arrivals is not None else None
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (parsed.netloc.encode(), len(payload)) + payload)
        if before is None:
            time.sleep(after_s)  # the window: the prefill is still computing this prompt
            chosen = f"{after_s:g} s after sending (the decode's arrival count could not be read)"
        else:
            began = time.monotonic()
            while True:
                now = arrivals()
                if now is not None and now > before:
                    break
                if time.monotonic() - began > deadline_s:
                    raise ScenarioError(f"abort: the request never reached the decode within {deadline_s:.0f} s "
                                        f"(its arrival count stayed at {before})")
                time.sleep(0.05)
            chosen = f"when the decode counted the request ({time.monotonic() - began:.1f} s after sending)"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return chosen


def run(router: str, logs: dict[str, Path], words: Callable[[int], str], *, waiting_timeout_s: float,
        on_event: Callable[[str], None] | None = None, death_deadline_s: float = 240.0,
        decode_url: str | None = None) -> Marks:
    """Drive the events through ``router``; ``logs`` maps "prefill"/"decode" to their log files.

    ``decode_url``: the decode server, whose arrival counter times the killed client (see
    :func:`kill_streaming_client`); without it the kill is ``KILL_AFTER_S`` after sending.

    ``on_event(name)`` is called after each event (a capture of /metrics after the served request,
    a thread dump of the wedged prefill). Raises :class:`ScenarioError` naming the event that did
    not happen.
    """
    marks = Marks()

    def mark(event: str) -> None:
        marks.offsets[event] = {role: _size(path) for role, path in logs.items()}

    mark("served")
    status, body = post_json(router + "/generate", {"text": words(40), "sampling_params": {
        "max_new_tokens": 8, "temperature": 0}}, timeout=300)
    if status != 200:
        raise ScenarioError(f"served request: {router}/generate answered {status}: {body[:200]!r}")
    marks.generate_answer = json.loads(body)
    marks.outcomes["served"] = "200"
    if on_event:
        on_event("served")

    mark("abort")
    killed_at = time.monotonic()
    chosen = kill_streaming_client(router, {"text": words(LONG_PROMPT_WORDS), "stream": True,
                                            "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
                                   KILL_AFTER_S, decode_arrivals(decode_url) if decode_url else None)
    _wait_for(logs["prefill"], DEATH_MARK, marks.offsets["abort"]["prefill"], death_deadline_s,
              "the death of bootstrap_thread after the client was killed")
    marks.outcomes["abort"] = (f"bootstrap_thread died {time.monotonic() - killed_at:.1f} s after the request; "
                               f"the client was killed {chosen}")
    if on_event:
        on_event("abort")

    mark("waiting_timeout")
    answer: dict = {}
    sender = threading.Thread(target=lambda: answer.update(r=post_json(
        router + "/generate", {"text": words(20), "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
        timeout=waiting_timeout_s * 3 + 30)), daemon=True)
    sender.start()
    took = _wait_for(logs["decode"], TIMEOUT_MARK, marks.offsets["waiting_timeout"]["decode"],
                     waiting_timeout_s * 3 + 60, "the decode's waiting timeout")
    sender.join(timeout=30)
    status = answer.get("r", (None, b""))[0]
    marks.outcomes["waiting_timeout"] = f"timed out after {took:.1f} s; the client got {status}"
    if on_event:
        on_event("waiting_timeout")
    marks.ends = {role: _size(path) for role, path in logs.items()}
    return marks
