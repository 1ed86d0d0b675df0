"""The signature catalogue (``signatures.toml``) loaded into compiled matchers.

Signatures are data: adding one is a TOML entry, not a code path. Each has a literal
that every matching line contains, used as a cheap prefilter before its regex runs.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources

SEVERITIES = ("critical", "error", "warning", "info", "debug")
STEPS = ("trigger", "abort_sent", "thread_death", "stall", "fallout", "probe", "context")
CAPTURED = ("room", "rid", "rank", "reason", "thread", "target", "peer", "addr")


@dataclass(frozen=True)
class Signature:
    id: str
    literal: str
    pattern: str
    severity: str
    step: str
    meaning: str
    reason: str | None = None
    aggregate: bool = False  # counted per minute in the access frame, never one event per line

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.pattern)

    @property
    def reason_regex(self) -> re.Pattern[str] | None:
        return _compile(self.reason) if self.reason else None

    def match(self, message: str) -> dict[str, str | None] | None:
        """Captured fields when ``message`` is this signature, else None."""
        if self.literal not in message:
            return None
        found = self.regex.search(message)
        if found is None:
            return None
        fields = found.groupdict()
        if self.reason_regex is not None and not self.reason_regex.search(fields.get("reason") or ""):
            return None
        return fields


@cache
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


class CatalogueError(ValueError):
    pass


@lru_cache(maxsize=1)
def signatures() -> tuple[Signature, ...]:
    """Every signature, in matching order."""
    text = resources.files("forensics.logs").joinpath("signatures.toml").read_text(encoding="utf-8")
    entries = tomllib.loads(text)["signature"]
    result = []
    seen = set()
    for index, entry in enumerate(entries):
        try:
            signature = Signature(**entry)
        except TypeError as exc:
            raise CatalogueError(f"signatures.toml entry {index + 1}: {exc}") from exc
        if signature.id in seen:
            raise CatalogueError(f"signatures.toml: duplicate id {signature.id!r}")
        if signature.severity not in SEVERITIES:
            raise CatalogueError(f"signatures.toml {signature.id}: unknown severity {signature.severity!r}")
        if signature.step not in STEPS:
            raise CatalogueError(f"signatures.toml {signature.id}: unknown kill-chain step {signature.step!r}")
        try:
            _ = signature.regex, signature.reason_regex  # compile now: a bad pattern fails at load
        except re.error as exc:
            raise CatalogueError(f"signatures.toml {signature.id}: bad pattern: {exc}") from exc
        seen.add(signature.id)
        result.append(signature)
    return tuple(result)


def by_id() -> dict[str, Signature]:
    return {s.id: s for s in signatures()}


@lru_cache(maxsize=1)
def event_signatures() -> tuple[Signature, ...]:
    """The signatures that become one event per line (everything but the aggregated ones)."""
    return tuple(s for s in signatures() if not s.aggregate)


def aggregate_signatures() -> tuple[Signature, ...]:
    return tuple(s for s in signatures() if s.aggregate)


def literals() -> tuple[bytes, ...]:
    """The distinct prefilter literals of the event signatures, as bytes, for scanning raw chunks."""
    return tuple(dict.fromkeys(s.literal.encode() for s in event_signatures()))


def classify(message: str) -> tuple[Signature, dict[str, str | None]] | None:
    """The first event signature that ``message`` matches, with its captured fields."""
    for signature in event_signatures():
        fields = signature.match(message)
        if fields is not None:
            return signature, fields
    return None


def access_signature(method: str, path: str, status: int) -> str | None:
    """The aggregated signature an access line with this method, path and status belongs to."""
    line = f'"{method} {path} HTTP/1.1" {status}'
    for signature in aggregate_signatures():
        if signature.regex.search(line):
            return signature.id
    return None


def to_frame():
    """The catalogue as a DataFrame (for notebooks and docs)."""
    import pandas as pd

    return pd.DataFrame([s.__dict__ for s in signatures()])
