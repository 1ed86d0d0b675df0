"""What each kind of probe sends, to which URL(s).

* ``health`` / ``health_generate``: ``GET /health`` / ``GET /health_generate`` on the target.
* ``liveness``: a real one-token completion on the real path. Through a router: the body as
  a client sends it. To a prefill+decode pair (no router): what sglang's routers do: the same
  body, with ``bootstrap_host`` (the prefill URL's hostname), ``bootstrap_port`` (the
  prefill's bootstrap port) and ``bootstrap_room`` (``random.randint(0, 2**63 - 1)``, a
  Python int end to end), POSTed to the prefill and the decode concurrently.

Every liveness body carries ``rid = "pd-forensics-probe-<hex>"`` so its lines in the engines'
logs can be told apart from real traffic.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from forensics.probes.schema import KIND_PATHS
from forensics.probes.targets import Target
from forensics.redact import redact_url

LIVENESS_ENDPOINTS = ("/generate", "/v1/completions")
DEFAULT_LIVENESS_TEXT = "The capital of France is"
RID_PREFIX = "pd-forensics-probe-"
_rooms = random.SystemRandom()


@dataclass(frozen=True)
class Leg:
    method: str
    url: str
    body: dict | None = None


@dataclass(frozen=True)
class Call:
    """One probe's requests: one leg, or two (prefill first, then decode) for a pd pair."""

    legs: tuple[Leg, ...]
    room: int | None = None
    rid: str | None = None

    @property
    def url(self) -> str:
        """What the frame records: the leg URLs, no secret in them (forensics.redact: userinfo, secret query values)."""
        return " + ".join(redact_url(leg.url) for leg in self.legs)


def liveness_body(endpoint: str, text: str, rid: str) -> dict:
    if endpoint == "/generate":
        return {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}, "rid": rid}
    if endpoint == "/v1/completions":
        return {"prompt": text, "max_tokens": 1, "temperature": 0, "rid": rid}
    raise ValueError(f"liveness endpoint must be one of {LIVENESS_ENDPOINTS}, got {endpoint!r}")


def new_room() -> int:
    """A bootstrap room as sglang's mini_lb draws it: uniform in [0, 2**63 - 1], a Python int."""
    return _rooms.randint(0, 2**63 - 1)


def plan(target: Target, kind: str, *, endpoint: str = "/generate", text: str = DEFAULT_LIVENESS_TEXT) -> Call:
    if kind in KIND_PATHS:
        return Call((Leg("GET", target.url + KIND_PATHS[kind]),))
    if kind != "liveness":
        raise ValueError(f"unknown probe kind {kind!r}")
    rid = RID_PREFIX + uuid.uuid4().hex
    body = liveness_body(endpoint, text, rid)
    if target.role != "pd":
        return Call((Leg("POST", target.url + endpoint, body),), rid=rid)
    room = new_room()
    body = dict(body, bootstrap_host=target.bootstrap_host, bootstrap_port=target.bootstrap_port,
                bootstrap_room=room)
    return Call((Leg("POST", target.url + endpoint, body), Leg("POST", target.decode_url + endpoint, body)),
                room=room, rid=rid)
