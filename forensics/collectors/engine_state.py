"""An engine's own account of itself: ``/server_info`` and ``/v1/loads?include=disagg`` over HTTP.

Both are GETs, so a short timeout that closes them early is harmless (unlike a generation
request, whose close is an abort). Each answer is read within a total deadline and a byte
cap (:mod:`forensics.collectors.bounded_http`). Old releases are asked the deprecated names too:
``/get_server_info`` (every 0.5.x) and ``/get_load`` (no disaggregation columns).

Each endpoint ends in one of these states, kept distinct in :attr:`EngineState.status`
and in the gaps: ``ok``; ``not_served`` (404 on every name: this release does not have
it); ``unreachable`` (no connection); ``timed_out`` (no whole answer within the total
deadline: a stalled or trickling server); ``too_large`` (an answer over the byte cap);
``http_error`` (any other status, 401/403 included, or no HTTP at all); ``bad_json`` (an
answer that is not the JSON expected).

The server info is redacted as it is read (sglang's server args carry ``api_key`` and
``admin_api_key``); the loads become a frame of :data:`LOADS_SCHEMA`, one row per DP rank,
queue lengths exact as Int64. Schemas in docs/settings.md.
"""

from __future__ import annotations

import html
import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from forensics.evidence import Gap
from forensics.redact import redact_text, redact_value

from . import bounded_http
from .bounded_http import JSON_LIMITS, AnswerTooLarge, AnswerTooSlow, ReadLimits

__all__ = [
    "DISAGG_INT_COLUMNS",
    "LOADS_SCHEMA",
    "EngineState",
    "loads_frame",
    "read_engine_state",
]

DEFAULT_TIMEOUT_S = 5.0

DISAGG_INT_COLUMNS = (
    "prefill_bootstrap_queue_reqs",
    "prefill_inflight_queue_reqs",
    "decode_prealloc_queue_reqs",
    "decode_transfer_queue_reqs",
    "decode_retracted_queue_reqs",
)
# The name a column had in older releases' /v1/loads: 0.5.8 to 0.5.11's DisaggregationMetrics call the
# prefill bootstrap queue "prefill_prealloc_queue_reqs" (renamed in 0.5.12, like the gauge).
OLD_DISAGG_NAMES = {"prefill_bootstrap_queue_reqs": "prefill_prealloc_queue_reqs"}
CORE_INT_COLUMNS = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "num_total_tokens",
                    "max_total_num_tokens", "max_running_requests")

LOADS_SCHEMA: dict[str, str] = {
    "ts": "datetime64[ns, UTC]",  # when the answer was read
    "engine": "string",
    "url": "string",
    "endpoint": "string",  # "/v1/loads?include=disagg" or "/get_load"
    "dp_rank": "Int64",
    "mode": "string",  # disaggregation.mode: prefill, decode, null; <NA> when not reported
    **{c: "Int64" for c in DISAGG_INT_COLUMNS},
    "kv_transfer_speed_gb_s": "float64",
    "kv_transfer_latency_ms": "float64",
    **{c: "Int64" for c in CORE_INT_COLUMNS},
    "token_usage": "float64",
}

SERVER_INFO_ENDPOINTS = ("/server_info", "/get_server_info")
LOADS_ENDPOINTS = ("/v1/loads?include=disagg", "/get_load")


@dataclass
class EngineState:
    """What one engine said about itself (server args, version, internal states, loads), and what it did not."""

    engine: str
    url: str
    server_info: dict[str, Any] | None = None  # redacted
    loads: pd.DataFrame | None = None  # LOADS_SCHEMA
    status: dict[str, str] = field(default_factory=dict)  # {"server_info": "ok", "loads": "not_served"}
    endpoints: dict[str, str] = field(default_factory=dict)  # the path that answered, per piece
    gaps: list[Gap] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)  # url, status, duration, outcome

    @property
    def version(self) -> str | None:
        v = (self.server_info or {}).get("version")
        return str(v) if v is not None else None

    @property
    def internal_states(self) -> list[dict[str, Any]]:
        states = (self.server_info or {}).get("internal_states")
        return list(states) if isinstance(states, list) else []

    @property
    def server_args(self) -> dict[str, Any]:
        """The server args (with scheduler info): everything in ``/server_info`` but internal states and version."""
        return {k: v for k, v in (self.server_info or {}).items() if k not in ("internal_states", "version")}

    @property
    def backend(self) -> str | None:
        b = self.server_args.get("disaggregation_transfer_backend")
        return str(b) if b is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "url": self.url, "status": dict(self.status), "endpoints": dict(self.endpoints),
            "version": self.version, "server_info": self.server_info,
            "loads": None if self.loads is None else json.loads(self.loads.to_json(orient="records", date_format="iso")),
            "gaps": [g.to_dict() for g in self.gaps], "requests": list(self.requests),
        }

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in [("engine", self.engine), ("url", self.url), ("version", str(self.version)),
                                    ("backend", str(self.backend))] + sorted(self.status.items()))
        gaps = "".join(f"<li>{html.escape(str(g))}</li>" for g in self.gaps)
        loads = self.loads.to_html(index=False) if self.loads is not None else ""
        return f"<table>{rows}</table>" + (f"<ul>{gaps}</ul>" if gaps else "") + loads

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in self.status.items())
        return f"<EngineState {self.engine} {self.url} version={self.version} {parts}>"


# ------------------------------------------------------------------------------------- parsing


def _exact_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def loads_frame(payload: Any, *, engine: str = "", url: str = "", endpoint: str = "/v1/loads?include=disagg",
                ts: pd.Timestamp | None = None) -> pd.DataFrame:
    """``/v1/loads`` (``{"loads": [...]}``) or ``/get_load`` (a list, or one dict) as a :data:`LOADS_SCHEMA` frame.

    Raises ``ValueError`` when the payload is not that shape.
    """
    if isinstance(payload, dict) and "loads" in payload:
        rows = payload["loads"]
    elif isinstance(payload, list):
        rows = payload
    elif isinstance(payload, dict):
        rows = [payload]
    else:
        raise ValueError(f"expected a JSON object or list, got {type(payload).__name__}")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError("expected a list of per-DP-rank objects")
    ts = ts if ts is not None else pd.Timestamp.now(tz="UTC")
    disagg = [r.get("disaggregation") if isinstance(r.get("disaggregation"), dict) else {} for r in rows]
    data: dict[str, Any] = {
        "ts": pd.Series([ts] * len(rows), dtype="datetime64[ns, UTC]"),
        "engine": pd.array([engine] * len(rows), dtype="string"),
        "url": pd.array([url] * len(rows), dtype="string"),
        "endpoint": pd.array([endpoint] * len(rows), dtype="string"),
        "dp_rank": pd.array([_exact_int(r.get("dp_rank")) for r in rows], dtype="Int64"),
        "mode": pd.array([d.get("mode") if isinstance(d.get("mode"), str) else None for d in disagg], dtype="string"),
    }
    for column in DISAGG_INT_COLUMNS:
        old = OLD_DISAGG_NAMES.get(column)
        data[column] = pd.array([_exact_int(d[column] if column in d else d.get(old)) for d in disagg], dtype="Int64")
    for column in ("kv_transfer_speed_gb_s", "kv_transfer_latency_ms"):
        data[column] = pd.array([_float(d.get(column)) for d in disagg], dtype="Float64").astype("float64")
    for column in CORE_INT_COLUMNS:
        data[column] = pd.array([_exact_int(r.get(column)) for r in rows], dtype="Int64")
    data["token_usage"] = pd.array([_float(r.get("token_usage")) for r in rows], dtype="Float64").astype("float64")
    frame = pd.DataFrame(data)
    for column, dtype in LOADS_SCHEMA.items():
        if str(frame[column].dtype) != dtype:
            raise TypeError(f"loads column {column!r} is {frame[column].dtype}, schema says {dtype}")
    return frame


# -------------------------------------------------------------------------------------- HTTP


def _get(base: str, path: str, headers: dict[str, str], requests: list, limits: ReadLimits,
         ) -> tuple[str, Any, str]:
    """(outcome, parsed JSON or None, detail) for one GET; outcome as in the module docstring."""
    url = base.rstrip("/") + path
    start = time.monotonic()
    record: dict[str, Any] = {"url": redact_text(url), "status": None}
    try:
        answer = bounded_http.get(url, limits=limits, headers=headers)
    except AnswerTooSlow as exc:
        outcome, body, detail = "timed_out", None, redact_text(str(exc))
    except AnswerTooLarge as exc:
        outcome, body, detail = "too_large", None, redact_text(str(exc))
    except OSError as exc:
        outcome, body, detail = "unreachable", None, redact_text(f"{type(exc).__name__}: {exc}")
    except http.client.HTTPException as exc:
        outcome, body, detail = "http_error", None, redact_text(f"no HTTP answer ({type(exc).__name__}: {exc})")
    else:
        record["status"] = answer.status
        if answer.status == 404:
            outcome, body, detail = "not_served", None, "404"
        elif answer.status != 200:
            outcome, body = "http_error", None
            detail = f"HTTP {answer.status}" + (
                " (the engine wants an API key: pass api_key=...)" if answer.status in (401, 403) else "")
        else:
            try:
                body = answer.json()
                outcome, detail = "ok", ""
            except ValueError as exc:
                outcome, body, detail = "bad_json", None, f"not JSON: {str(exc)[:200]}"
    record.update(outcome=outcome, duration_s=round(time.monotonic() - start, 6), detail=detail)
    requests.append(record)
    return outcome, body, detail


def _first(base: str, paths: tuple[str, ...], headers: dict[str, str], requests: list, limits: ReadLimits,
           ) -> tuple[str, Any, str, str]:
    """Try each path in turn while the answer is 404; (outcome, body, detail, path)."""
    outcome, body, detail, path = "not_served", None, "", paths[0]
    for path in paths:
        outcome, body, detail = _get(base, path, headers, requests, limits)
        if outcome != "not_served":
            break
    return outcome, body, detail, path


def _gap(piece: str, target: str, outcome: str, detail: str, url: str, paths: tuple[str, ...],
         path: str | None = None) -> Gap:
    shown = redact_text(url)
    reasons = {
        "not_served": (f"not served by this release (404 on {' and '.join(paths)})",
                       "nothing to fix: an older (or newer) sglang without this endpoint"),
        "unreachable": (f"unreachable: {shown} ({detail})",
                        "check the engine runs and the url in the inventory (and that this machine can reach it)"),
        "timed_out": (detail, "the engine's HTTP server is stuck, overloaded or answering a byte at a time; "
                              "retry with a longer timeout"),
        "too_large": (detail, "not what sglang serves here: check the URL in the inventory (or raise max_bytes)"),
        "http_error": (f"{shown.rstrip('/')}{path or paths[0]} answered {detail}", None),
        "bad_json": (f"bad JSON from {shown}: {detail}", None),
    }
    reason, fix = reasons[outcome]
    return Gap(piece, target, reason, fix=fix, state=outcome)


def read_engine_state(
    url: str,
    *,
    engine: str = "",
    timeout: float = DEFAULT_TIMEOUT_S,
    api_key: str | None = None,
    loads: bool = True,
    max_bytes: int = JSON_LIMITS.max_bytes,
) -> EngineState:
    """``/server_info`` and ``/v1/loads?include=disagg`` of the engine at ``url`` (each with its old name).

    ``api_key`` is sent as ``Authorization: Bearer`` and recorded nowhere. ``timeout`` bounds
    each answer as a whole (wall clock, connect included) and ``max_bytes`` its body: an
    engine that answers a byte at a time, or with too much, is a gap saying which limit.
    """
    limits = ReadLimits(float(timeout), max_bytes)
    target = f"{engine} ({redact_text(url)})" if engine else redact_text(url)
    state = EngineState(engine=engine, url=redact_text(url))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    outcome, body, detail, path = _first(url, SERVER_INFO_ENDPOINTS, headers, state.requests, limits)
    if outcome == "ok" and not isinstance(body, dict):
        outcome, detail = "bad_json", f"expected a JSON object, got {type(body).__name__}"
    state.status["server_info"] = outcome
    if outcome == "ok":
        state.server_info = redact_value(body)
        state.endpoints["server_info"] = path
    else:
        state.gaps.append(_gap("server_info", target, outcome, detail, url, SERVER_INFO_ENDPOINTS, path))
    if not loads:
        return state
    if outcome in ("unreachable", "timed_out"):  # the same server: do not wait twice
        state.status["loads"] = outcome
        state.gaps.append(_gap("loads", target, outcome, f"not asked: {detail}", url, LOADS_ENDPOINTS))
        return state
    outcome, body, detail, path = _first(url, LOADS_ENDPOINTS, headers, state.requests, limits)
    if outcome == "ok":
        try:
            state.loads = loads_frame(body, engine=engine, url=state.url, endpoint=path)
        except (ValueError, TypeError) as exc:
            outcome, detail = "bad_json", str(exc)
    state.status["loads"] = outcome
    if outcome == "ok":
        state.endpoints["loads"] = path
        if path != LOADS_ENDPOINTS[0]:
            state.gaps.append(Gap("loads", target, f"only {path} is served: no disaggregation queue columns",
                                  partial=True, state="not_served"))
    else:
        state.gaps.append(_gap("loads", target, outcome, detail, url, LOADS_ENDPOINTS, path))
    return state
