"""The signature catalogue (``signatures.toml``) loaded into compiled matchers.

Signatures are data: adding one is a TOML entry, not a code path. Each has a literal
that every matching line contains, used as a cheap prefilter before its regex runs.

Each entry also says where its lines come from: ``origin`` (sglang, uvicorn, cpython or
patched_engine) and, for sglang, the ``releases`` that emit it (a PEP 440 specifier) and
the source files that hold its format string (``emitted_in``; ``reason_in`` for the text
its ``reason`` constraint matches). ``tests/test_logs_catalogue_sources.py`` checks these
against the released sources.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from forensics.logs import source_errors

SEVERITIES = ("critical", "error", "warning", "info", "debug")
STEPS = ("trigger", "abort_sent", "thread_death", "stall", "fallout", "probe", "context")
CAPTURED = ("room", "rid", "rank", "reason", "thread", "target", "peer", "addr")
# Who writes the line: sglang's own code, uvicorn's access log, CPython's default thread
# excepthook, this project's patched engine (patched_engine/snippets.py), or a native library
# logging with Google's glog (Mooncake's transfer engine, NIXL's plugins) on the same stderr.
ORIGINS = ("sglang", "uvicorn", "cpython", "patched_engine", "glog")
DERIVED_PRIORITY = -1


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
    origin: str = ""  # one of ORIGINS; required in the catalogue
    releases: str | None = None  # sglang only: PEP 440 specifier of the releases that emit it ("" = all)
    emitted_in: tuple[str, ...] = ()  # sglang only: files (sglang/srt/...) holding the format string
    reason_in: tuple[str, ...] = ()  # sglang only: files holding the text ``reason`` matches
    # What the prefilter looks for instead of ``literal``, when the one constant part of the line is
    # too common to prefilter on (glog's "] "): strings that start the line ("\n" first) or follow
    # a journal prefix (": "), e.g. glog's level letter and the first digit of the month.
    prefilter: tuple[str, ...] = ()
    # Breaks a tie of specificity (higher first); what wins otherwise is the rule, not file order.
    priority: int = 0

    @property
    def specificity(self) -> int:
        """How many characters a matching line must hold literally: the pattern's and the reason's."""
        return literal_chars(self.pattern) + (literal_chars(self.reason) if self.reason else 0)

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.pattern)

    @property
    def release_range(self) -> SpecifierSet | None:
        """``releases`` parsed; None for entries that do not come from sglang."""
        return SpecifierSet(self.releases) if self.releases is not None else None

    def emitted_by(self, version: str | Version) -> bool:
        """Whether sglang ``version`` can write this line (False for non-sglang origins)."""
        spec = self.release_range
        return spec is not None and spec.contains(Version(str(version)), prereleases=True)

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


@cache
def literal_chars(pattern: str) -> int:
    """The characters every match of ``pattern`` holds literally: its literals outside optional
    parts (a repeat that may be absent), and the fewest a branch of an alternation holds."""
    from re import _constants as c
    from re import _parser as parser

    def count(items) -> int:
        total = 0
        for op, value in items:
            if op is c.LITERAL:
                total += 1
            elif op is c.SUBPATTERN:
                total += count(value[-1])
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                low, _high, inner = value
                total += low * count(inner) if low else 0
            elif op is c.BRANCH:
                total += min(count(branch) for branch in value[1])
            elif op is c.ATOMIC_GROUP:
                total += count(value)
        return total

    return count(parser.parse(pattern))


class CatalogueError(ValueError):
    pass


@lru_cache(maxsize=1)
def signatures() -> tuple[Signature, ...]:
    """Every signature, in the catalogue file's order."""
    text = resources.files("forensics.logs").joinpath("signatures.toml").read_text(encoding="utf-8")
    return load(text)


def load(text: str, where: str = "signatures.toml") -> tuple[Signature, ...]:
    """Parse and validate catalogue TOML; a bad entry is a CatalogueError naming it."""
    try:
        entries = tomllib.loads(text)["signature"]
    except (tomllib.TOMLDecodeError, KeyError) as exc:
        raise CatalogueError(f"{where}: not a catalogue ({exc})") from exc
    result = []
    seen = set()
    for index, entry in enumerate(entries):
        name = entry.get("id", f"entry {index + 1}")
        fields = dict(entry)
        for key in ("emitted_in", "reason_in"):
            if key in fields:
                fields[key] = _paths(fields[key], f"{where} {name}: {key}")
        if "prefilter" in fields:
            found = fields["prefilter"]
            if not isinstance(found, list) or not found or not all(isinstance(x, str) and x for x in found):
                raise CatalogueError(f"{where} {name}: prefilter: expected a non-empty list of strings, got {found!r}")
            fields["prefilter"] = tuple(found)
        try:
            signature = Signature(**fields)
        except TypeError as exc:
            raise CatalogueError(f"{where} {name}: {exc}") from exc
        if signature.id in seen:
            raise CatalogueError(f"{where}: duplicate id {signature.id!r}")
        if signature.severity not in SEVERITIES:
            raise CatalogueError(f"{where} {signature.id}: unknown severity {signature.severity!r}")
        if signature.step not in STEPS:
            raise CatalogueError(f"{where} {signature.id}: unknown kill-chain step {signature.step!r}")
        try:
            _ = signature.regex, signature.reason_regex  # compile now: a bad pattern fails at load
        except re.error as exc:
            raise CatalogueError(f"{where} {signature.id}: bad pattern: {exc}") from exc
        _check_origin(signature, where)
        seen.add(signature.id)
        result.append(signature)
    return tuple(result)


def _paths(value: object, what: str) -> tuple[str, ...]:
    paths = (value,) if isinstance(value, str) else value
    if not isinstance(paths, list | tuple) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise CatalogueError(f"{what}: expected a path or a non-empty list of paths, got {value!r}")
    for path in paths:
        if not path.startswith("sglang/srt/") or not path.endswith(".py") or ".." in path.split("/"):
            raise CatalogueError(f"{what}: {path!r} is not a sglang/srt/**.py path")
    return tuple(paths)


def _check_origin(signature: Signature, where: str) -> None:
    name = f"{where} {signature.id}"
    if not signature.origin:
        raise CatalogueError(f"{name}: missing origin (one of {', '.join(ORIGINS)})")
    if signature.origin not in ORIGINS:
        raise CatalogueError(f"{name}: unknown origin {signature.origin!r} (one of {', '.join(ORIGINS)})")
    if signature.origin != "sglang":
        for key in ("releases", "emitted_in", "reason_in"):
            if getattr(signature, key):
                raise CatalogueError(f"{name}: {key} is for sglang entries only (origin is {signature.origin})")
        return
    if signature.releases is None:
        raise CatalogueError(f"{name}: an sglang entry needs releases (a PEP 440 specifier, e.g. \">=0.5.13\")")
    if not isinstance(signature.releases, str):
        raise CatalogueError(f"{name}: releases must be a string, got {signature.releases!r}")
    try:
        spec = SpecifierSet(signature.releases)
    except InvalidSpecifier as exc:
        raise CatalogueError(f"{name}: invalid releases {signature.releases!r}: {exc}") from exc
    if any(clause.operator == "===" for clause in spec):
        raise CatalogueError(f"{name}: invalid releases {signature.releases!r}: '===' names no release range")
    if not signature.emitted_in:
        raise CatalogueError(f"{name}: an sglang entry needs emitted_in (the file(s) holding its format string)")
    if signature.reason and not signature.reason_in:
        raise CatalogueError(f"{name}: a reason constraint needs reason_in (the file(s) holding that text)")
    if signature.reason_in and not signature.reason:
        raise CatalogueError(f"{name}: reason_in given without a reason constraint")


def by_id() -> dict[str, Signature]:
    return {s.id: s for s in signatures()}


def event_signatures() -> tuple[Signature, ...]:
    """The signatures that become one event per line (everything but the aggregated ones), in
    matching order: the hand-written entries (``signatures.toml``) first, the most specific first
    (:attr:`Signature.specificity`), then the higher ``priority``, then the file's order; then the
    entries derived from sglang's own error calls (:func:`derived_signatures`), ordered the same way.
    A line two entries match is the more specific one's ("Decode transfer failed ... with exception
    Could not fetch prefill parallel info from ..." is the bootstrap server unreachable, not a
    generic transfer failure), and an entry that says what a line means is preferred to one that only
    knows sglang logs it as an error."""
    global _joined
    hand, derived = hand_event_signatures(), derived_signatures()
    if _joined[0] is not hand or _joined[1] is not derived:
        _joined = (hand, derived, hand + derived)  # one tuple per catalogue: the bulk classifier keys on it
    return _joined[2]


_joined: tuple = (None, None, ())


@lru_cache(maxsize=1)
def hand_event_signatures() -> tuple[Signature, ...]:
    return ordered([s for s in signatures() if not s.aggregate])


@lru_cache(maxsize=1)
def derived_signatures() -> tuple[Signature, ...]:
    """sglang's error-level calls (warning level in disaggregation/) that no hand entry explains, one
    entry each (:mod:`forensics.logs.source_errors`), from the source of :func:`derived_releases`:
    their lines are events, never silence."""
    hand = hand_event_signatures()
    found = []
    for entry in source_errors.catalogue_entries(derived_releases()):
        if any(s.match(entry["rendering"]) is not None for s in hand):
            continue  # a hand entry explains this call's lines
        found.append(Signature(id=entry["id"], literal=entry["literal"], pattern=entry["pattern"],
                               severity=entry["severity"], step=entry["step"], meaning=entry["meaning"],
                               origin="sglang", releases=entry["releases"], emitted_in=tuple(entry["files"]),
                               priority=DERIVED_PRIORITY))
    return ordered(found)


_extra_releases: list[str] = []


def derived_releases() -> tuple[str, ...]:
    """The releases whose error calls the catalogue holds: those of ``source_errors.SHIPPED`` in the
    wheel cache, and every release :func:`add_release` named."""
    cached = source_errors.cached_releases()
    return cached + tuple(v for v in _extra_releases if v not in cached)


def add_release(version: str) -> None:
    """Hold release ``version``'s error calls too (fetching its source if it is not cached):
    ``forensics logs --sglang X``. The matching order is rebuilt on next use."""
    source_errors.release_entries(version, offline=False)
    if version not in _extra_releases and version not in derived_releases():
        _extra_releases.append(version)
        derived_signatures.cache_clear()
        literals.cache_clear()


def ordered(entries) -> tuple[Signature, ...]:
    """``entries`` in matching order: specificity, then priority, both highest first; the given
    order decides only between entries no line matches both of (a test holds that)."""
    ranked = sorted(enumerate(entries), key=lambda item: (-item[1].specificity, -item[1].priority, item[0]))
    return tuple(signature for _index, signature in ranked)


def aggregate_signatures() -> tuple[Signature, ...]:
    return tuple(s for s in signatures() if s.aggregate)


@lru_cache(maxsize=1)
def literals() -> tuple[bytes, ...]:
    """The distinct prefilter literals of the event signatures, as bytes, for scanning raw chunks."""
    return tuple(dict.fromkeys(lit.encode() for s in event_signatures() for lit in (s.prefilter or (s.literal,))))


def classify(message: str) -> tuple[Signature, dict[str, str | None]] | None:
    """The most specific event signature ``message`` matches (:func:`event_signatures`' order), with its fields."""
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
