"""Count the lines of each catalogue signature, fast, and say the same thing in grep's language.

``count_signatures(paths)`` streams every source once on one core: a multi-literal
prefilter (``prefilter.LiteralPrefilter``: Hyperscan, else ``bytes.find``) picks the
lines holding a catalogue literal, and only those are split and classified exactly as
``scan()`` does (journal prefix, then sglang prefix, then the first signature whose
pattern matches the message). The counts therefore equal the events ``scan()`` finds
per signature, a thread death counting once (its header line).

``grep_patterns(fmt)`` writes the catalogue as POSIX ERE for ``grep -E`` (and, with
``dialect="rust"``, for ripgrep), so the counts can be checked against, and timed
against, the standard tools running "the same patterns".

Known differences from ``scan()``, both outside anything sglang prints: a line inside a
thread-death traceback (a ``File``/code line) that holds a signature is counted here but
taken into the traceback by ``scan()``; for journal ``-o json`` text the literals are
looked for in the JSON-escaped line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from forensics.logs import catalogue
from forensics.logs.lineformats import JOURNAL_ISO, JOURNAL_PRECISE, SGLANG_PREFIX, sniff, split_line
from forensics.logs.prefilter import LiteralPrefilter
from forensics.logs.sources import LogSource, Problem, SourceError, as_sources, open_stream, read_chunks

CHUNK_SIZE = 4 << 20  # fits a large L3 slice; Hyperscan and the find passes both like it
# CPython's excepthook prints "Exception in thread ..." with no sglang prefix, and scan()
# groups only such headers into thread-death events.
UNPREFIXED_ONLY = frozenset({"thread_death"})
# A traceback is a python_traceback event only when no catalogued line just before it owns it,
# which a count of single lines cannot see: counted by scan() alone, never here.
SCAN_ONLY = frozenset({"python_traceback"})
NEVER_ERE = "x^x"  # an ERE no line matches (a line start after a character), in both grep dialects


class CountError(ValueError):
    """Input that cannot be counted at all (a missing file); names the path."""


def count_signatures(path_or_paths: str | os.PathLike | LogSource | Iterable[str | os.PathLike | LogSource], *,
                     fmt: str | None = None, engine: str | None = None,
                     problems: list[Problem] | None = None) -> dict[str, int]:
    """Lines per catalogue signature over every source (all ids, zeros included).

    ``fmt`` forces the text format (plain, short-iso, short-precise, json) instead of
    sniffing each source; ``engine`` forces the prefilter (``hyperscan`` or
    ``bytes.find``). Problems met on the way (a gzip that ends early) are appended to
    ``problems`` when given; a source that cannot be opened raises ``CountError``.
    """
    if isinstance(path_or_paths, (str, os.PathLike, LogSource)):
        path_or_paths = [path_or_paths]
    counts = dict.fromkeys((s.id for s in catalogue.event_signatures()), 0)
    found_problems: list[Problem] = [] if problems is None else problems
    prefilters: dict[str, LiteralPrefilter] = {}
    for source in as_sources(path_or_paths):
        try:
            stream = open_stream(source)
        except SourceError as exc:
            raise CountError(str(exc)) from exc
        try:
            _count_stream(stream, source, fmt, engine, counts, prefilters, found_problems)
        finally:
            stream.close()
    return counts


def _literals_for(fmt: str) -> tuple[bytes, ...]:
    literals = catalogue.literals()
    if fmt == "json":
        # In -o json text the message is a JSON string: look for the literal as JSON writes it.
        literals = tuple(json.dumps(lit.decode())[1:-1].encode() for lit in literals)
    return literals


def _count_stream(stream, source: LogSource, fmt: str | None, engine: str | None, counts: dict[str, int],
                  prefilters: dict[str, LiteralPrefilter], problems: list[Problem]) -> None:
    source_fmt = fmt
    prefilter = None
    for chunk in read_chunks(stream, source, problems, chunk_size=CHUNK_SIZE):
        data = chunk.data
        if prefilter is None:
            if source_fmt is None:
                source_fmt = "json" if source.kind == "journal" else sniff(data[:65536])
            key = f"{source_fmt}/{engine}"
            if key not in prefilters:
                prefilters[key] = LiteralPrefilter(_literals_for(source_fmt), engine=engine)
            prefilter = prefilters[key]
        find = data.find
        for start in prefilter.line_starts(data):
            signature = classify_line(data[start:find(b"\n", start)], source_fmt)
            if signature is not None:
                counts[signature] += 1


def classify_line(line: bytes, fmt: str) -> str | None:
    """The signature id of one raw line in format ``fmt``, as ``scan()`` would name it."""
    line = line.rstrip(b"\r")
    split = split_line(line, fmt)
    message = split.message if split is not None else line
    prefix = SGLANG_PREFIX.match(message)
    body = message[prefix.end():] if prefix else message
    text = body.decode("utf-8", "replace").replace("\x00", "\ufffd")
    matched = catalogue.classify(text)
    if matched is None:
        return None
    signature = matched[0].id
    if (prefix is not None and signature in UNPREFIXED_ONLY) or signature in SCAN_ONLY:
        return None
    return signature


# ------------------------------------------------------------------ grep's language

POSIX = "posix"
RUST = "rust"
_CLASS_ESCAPES = {"d": ("range", "0-9"), "s": ("named", "[:space:]"), "w": ("named", "[:alnum:]_")}
_ESCAPES = {"d": "[0-9]", "s": "[[:space:]]", "S": "[^[:space:]]", "w": "[[:alnum:]_]", "W": "[^[:alnum:]_]"}
_QUANTIFIERS = "*+?}"
# Kept verbatim in ERE: escaped punctuation means itself in both languages.
_LITERAL_ESCAPES = set(".()[]{}?*+|^$\\/-'\" :,=<>#&~!@%")


class PatternError(ValueError):
    """A catalogue pattern uses Python regex syntax that has no ERE equivalent here."""


def to_ere(pattern: str, dialect: str = POSIX) -> str:
    """One Python regex as POSIX ERE (or ripgrep's syntax): groups unnamed, classes spelled out.

    Named and non-capturing groups become plain groups, ``\\d \\s \\S`` become bracket
    expressions, lazy quantifiers become greedy (the set of matching lines is the same).
    """
    if dialect not in (POSIX, RUST):
        raise ValueError(f"unknown dialect {dialect!r}; use {POSIX!r} or {RUST!r}")
    out: list[str] = []
    index = 0
    length = len(pattern)
    while index < length:
        char = pattern[index]
        if char == "\\":
            if index + 1 >= length:
                raise PatternError(f"{pattern!r}: trailing backslash")
            escaped = pattern[index + 1]
            if escaped in _ESCAPES:
                out.append(_ESCAPES[escaped])
            elif escaped in _LITERAL_ESCAPES:
                out.append("\\" + escaped if escaped in ".()[]{}?*+|^$\\" else escaped)
            else:
                raise PatternError(f"{pattern!r}: escape \\{escaped} at {index} has no ERE form here")
            index += 2
        elif char == "[":
            text, index = _bracket(pattern, index, dialect)
            out.append(text)
        elif char == "(":
            if pattern.startswith("(?P<", index):
                close = pattern.index(">", index)
                index = close + 1
            elif pattern.startswith("(?:", index):
                index += 3
            elif pattern.startswith("(?", index):
                raise PatternError(f"{pattern!r}: group {pattern[index:index + 4]!r} at {index} has no ERE form")
            else:
                index += 1
            out.append("(")
        elif char in _QUANTIFIERS:
            out.append(char)
            index += 1
            if index < length and pattern[index] == "?":
                index += 1  # lazy -> greedy: which lines match does not change
            if index < length and pattern[index] == "+":
                raise PatternError(f"{pattern!r}: possessive quantifier at {index}")
        else:
            out.append(char)
            index += 1
    return "".join(out)


def _bracket(pattern: str, index: int, dialect: str) -> tuple[str, int]:
    """One ``[...]`` class, re-emitted in an order that is safe in POSIX brackets."""
    position = index + 1
    negate = pattern.startswith("^", position)
    if negate:
        position += 1
    singles: list[str] = []
    ranges: list[str] = []
    named: list[str] = []
    first = True
    while True:
        if position >= len(pattern):
            raise PatternError(f"{pattern!r}: unclosed [ at {index}")
        char = pattern[position]
        if char == "]" and not first:
            position += 1
            break
        first = False
        if char == "\\":
            escaped = pattern[position + 1]
            if escaped in _CLASS_ESCAPES:
                kind, text = _CLASS_ESCAPES[escaped]
                (ranges if kind == "range" else named).append(text)
            elif escaped.isalnum():
                raise PatternError(f"{pattern!r}: class escape \\{escaped} at {position} has no ERE form here")
            else:
                singles.append(escaped)
            position += 2
            continue
        if position + 2 < len(pattern) and pattern[position + 1] == "-" and pattern[position + 2] != "]":
            ranges.append(pattern[position:position + 3])
            position += 3
            continue
        singles.append(char)
        position += 1
    return _emit_bracket(negate, singles, ranges, named, dialect), position


def _emit_bracket(negate: bool, singles: list[str], ranges: list[str], named: list[str], dialect: str) -> str:
    body = []
    if dialect == RUST:
        special = set("[]\\-^&~")
        body = [("\\" + c if c in special else c) for c in singles] + ranges + named
    else:
        # POSIX: "]" must come first, "[" must not start "[:", "-" goes last, "^" not first.
        plain = [c for c in singles if c not in "]-[^"]
        body = (["]"] if "]" in singles else []) + plain + ranges + named
        body += ["^"] if "^" in singles else []
        body += ["["] if "[" in singles else []
        body += ["-"] if "-" in singles else []
        if not negate and body and body[0] == "^":
            body = body[1:] + ["^"]
    return "[" + ("^" if negate else "") + "".join(body) + "]"


def line_prefix_ere(fmt: str, dialect: str = POSIX) -> str:
    """ERE for what precedes a message at the start of a line: the journal prefix, if any."""
    if fmt == "plain":
        return ""
    if fmt == "short-iso":
        return to_ere(JOURNAL_ISO.pattern.decode(), dialect)
    if fmt == "short-precise":
        return to_ere(JOURNAL_PRECISE.pattern.decode(), dialect)
    raise ValueError(f"no grep patterns for format {fmt!r}: grep sees JSON-escaped text there "
                     f"(use plain, short-iso or short-precise)")


def grep_patterns(fmt: str = "plain", dialect: str = POSIX) -> list[str]:
    """The catalogue as ``grep -E`` patterns, one per signature, in catalogue order.

    A pattern anchored at the message start (``^``) is anchored after the line's journal
    prefix (for ``fmt``) and an optional sglang prefix, where ``scan()`` looks. A
    signature split by its failure reason (``reason``) needs the reason after the
    pattern's final ``(?P<reason>.*)``. First match wins in the catalogue, so a line
    matching an earlier signature's pattern is that signature: to count one signature
    as ``scan()`` does, exclude the lines matched by the patterns before it
    (``grep -E P | grep -cvE -e EARLIER...``). The signatures of ``SCAN_ONLY`` get a pattern
    that matches no line.
    """
    journal = line_prefix_ere(fmt, dialect)
    sglang = to_ere(SGLANG_PREFIX.pattern.decode(), dialect)
    patterns = []
    for signature in catalogue.event_signatures():
        if signature.id in SCAN_ONLY:
            patterns.append(NEVER_ERE)  # its lines are counted by scan() alone (see SCAN_ONLY)
            continue
        pattern = signature.pattern
        if signature.reason:
            tail = "(?P<reason>.*)"
            if not pattern.endswith(tail):
                raise PatternError(f"signature {signature.id}: a reason filter needs the pattern to end with {tail}")
            pattern = pattern[: -len(tail)] + ".*(" + signature.reason + ")"
        ere = to_ere(pattern, dialect)
        if ere.startswith("^"):
            optional = "" if signature.id in UNPREFIXED_ONLY else f"({sglang})?"
            ere = "^" + journal + optional + ere[1:]
        patterns.append(ere)
    return patterns

