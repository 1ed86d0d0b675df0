"""The Prometheus text exposition format, read into columns (what sglang's ``/metrics`` serves).

One page in, one :class:`ExpositionPage` out: sample name, canonical labels, value (float64), the
value's text exactly as printed (so counters and IDs stay exact), and the family type its
``# TYPE`` line declares.

What the format allows, the parser accepts, as prometheus_client's own parser does (a differential
test holds the two together): spaces and tabs inside the label braces, an empty label set with a
comma (``b{,} 2``), no space between ``}`` and the value, and the quoted UTF-8 names of the current
text format (``{"my.metric",a="b"} 1``, ``m{"label.name"="v"} 1``). A line it cannot read is a
problem on that line (:attr:`ExpositionPage.problems`, each naming the line and why), and the rest
of the page is kept: one odd line never loses a scrape. ``strict=True`` raises at the first one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from forensics.collectors.renames import SAMPLE_SUFFIXES, canonical_name

__all__ = ["SAMPLE_SUFFIXES", "ExpositionPage", "ExpositionParseError", "ParseCache", "family_of", "labels_dict",
           "parse_exposition"]

# A sample line longer than this is refused (a problem on that line): sglang's longest are a few
# hundred characters, and one 10 MB label value, kept in every scrape's rows, cost 1.9 GB.
MAX_SAMPLE_LINE = 64 * 1024
# Problems kept per page (the count beyond is kept too): a page of garbage stays small.
MAX_PROBLEMS_KEPT = 100

_SAMPLE_RE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+(\S+))?[ \t]*\r?$")
_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_QUOTED_RE = re.compile(r'"((?:[^"\\]|\\.)*)"')
_BLANK_RE = re.compile(r"[ \t]*")
# The canonical label string this module writes: k="v" pairs sorted by name, comma-separated; a
# name that is not a legacy identifier is quoted ("label.name"="v").
_LABEL_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*|"(?:[^"\\]|\\.)*")[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_LABEL_TIGHT_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE_RE = re.compile(r"\\(.)")
_UNESCAPES = {"n": "\n", '"': '"', "\\": "\\"}


class ExpositionParseError(ValueError):
    """A line of a /metrics page that is not the text exposition format."""

    def __init__(self, lineno: int, line: str, why: str) -> None:
        super().__init__(f"line {lineno}: {why}: {line[:200]!r}")
        self.lineno = lineno
        self.line = line
        self.why = why


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return _UNESCAPE_RE.sub(lambda e: _UNESCAPES.get(e.group(1), "\\" + e.group(1)), text)


def labels_dict(canonical: str) -> dict[str, str]:
    """The label names and (unescaped) values of a canonical label string."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(canonical):
        m = _LABEL_RE.match(canonical, pos)
        if m is None:
            raise ValueError(f"not a canonical label string: {canonical!r}")
        name = m.group(1)
        out[_unescape(name[1:-1]) if name[0] == '"' else name] = _unescape(m.group(2))
        pos = m.end()
    return out


def _label_key(name: str) -> str:
    """A label name as the canonical string writes it (quoted where it is not an identifier)."""
    if _LABEL_NAME_RE.fullmatch(name):
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _canonical(pairs: list[tuple[str, str]], lineno: int, line: str) -> str:
    """Sorted ``k="v"`` pairs; ``pairs`` hold unescaped names and still-escaped values."""
    pairs.sort()
    for a, b in zip(pairs, pairs[1:]):
        if a[0] == b[0]:
            raise ExpositionParseError(lineno, line, f"label {a[0]!r} twice")
    return ",".join(f'{_label_key(k)}="{v}"' for k, v in pairs)


@dataclass
class _Sample:
    name: str
    labels: str  # canonical
    value: str
    timestamp: str | None


def _read_braces(line: str, pos: int, lineno: int) -> tuple[str | None, list[tuple[str, str]], int]:
    """The items between ``{`` at ``pos`` and its ``}``: (quoted metric name or None, label pairs,
    position after the ``}``). Items are comma-separated with blanks around; empty items are
    allowed (``{,}``); a bare quoted string is the metric's name (the UTF-8 form)."""
    name: str | None = None
    pairs: list[tuple[str, str]] = []
    pos += 1
    end = len(line)
    while True:
        pos = _BLANK_RE.match(line, pos).end()
        if pos >= end:
            raise ExpositionParseError(lineno, line, "bad label set (no closing brace)")
        if line[pos] == "}":
            return name, pairs, pos + 1
        if line[pos] == ",":
            pos += 1
            continue
        if line[pos] == '"':
            quoted = _QUOTED_RE.match(line, pos)
            if quoted is None:
                raise ExpositionParseError(lineno, line, "bad label set (unterminated quote)")
            key = _unescape(quoted.group(1))
            pos = _BLANK_RE.match(line, quoted.end()).end()
            if pos < end and line[pos] != "=":
                if name is not None or pairs:
                    raise ExpositionParseError(lineno, line, "bad label set (a quoted name not first)")
                name = key
                continue
        else:
            bare = _LABEL_NAME_RE.match(line, pos)
            if bare is None:
                raise ExpositionParseError(lineno, line, "bad label set")
            key = bare.group(0)
            pos = _BLANK_RE.match(line, bare.end()).end()
        if pos >= end or line[pos] != "=":
            raise ExpositionParseError(lineno, line, "bad label set")
        pos = _BLANK_RE.match(line, pos + 1).end()
        value = _QUOTED_RE.match(line, pos)
        if value is None:
            raise ExpositionParseError(lineno, line, "bad label set")
        pairs.append((key, value.group(1)))
        pos = _BLANK_RE.match(line, value.end()).end()
        if pos < end and line[pos] not in ",}":
            raise ExpositionParseError(lineno, line, "bad label set")


def _read_sample(line: str, lineno: int) -> _Sample:
    """A sample line in any form the format allows (the slow path: the fast regex missed)."""
    name: str | None = None
    pos = 0
    bare = _NAME_RE.match(line)
    if bare is not None:
        name, pos = bare.group(0), bare.end()
    pairs: list[tuple[str, str]] = []
    rest = _BLANK_RE.match(line, pos).end()
    if rest < len(line) and line[rest] == "{":
        quoted_name, pairs, pos = _read_braces(line, rest, lineno)
        if quoted_name is not None:
            if name is not None:
                raise ExpositionParseError(lineno, line, "a metric name outside and inside the braces")
            name = quoted_name
    if name is None:
        raise ExpositionParseError(lineno, line, "not a sample line")
    fields = line[pos:].split()
    if len(fields) not in (1, 2):
        raise ExpositionParseError(lineno, line, "not a sample line")
    return _Sample(name, _canonical(pairs, lineno, line), fields[0], fields[1] if len(fields) == 2 else None)


def _canonical_labels(raw: str, lineno: int, line: str) -> str:
    """The canonical form of the text between the braces of a legacy-form line."""
    # Fast path: the tight form prometheus_client writes (k="v",k2="v2"), checked by length.
    pairs = _LABEL_TIGHT_RE.findall(raw)
    if pairs:
        tight = [f'{k}="{v}"' for k, v in pairs]
        if ",".join(tight) == (raw[:-1] if raw[-1] == "," else raw):
            keys = [k for k, _ in pairs]
            if len(set(keys)) == len(keys):
                return ",".join([t for _, t in sorted(zip(keys, tight, strict=True))])
    quoted_name, pairs, end = _read_braces("{" + raw + "}", 0, lineno)
    if quoted_name is not None or end != len(raw) + 2:
        raise ExpositionParseError(lineno, line, "bad label set")
    return _canonical(pairs, lineno, line)


def family_of(name: str, types: dict[str, str]) -> tuple[str, bool]:
    """(family type, cumulative) of a sample name: cumulative samples get rates."""
    if name in types:
        kind = types[name]
        return kind, kind == "counter"
    for suffix in SAMPLE_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in types:
                kind = types[base]
                if suffix == "_created":
                    return kind, False
                if kind == "counter":
                    return kind, suffix == "_total"
                if kind in ("histogram", "summary"):
                    return kind, suffix in ("_bucket", "_count", "_sum")
                return kind, False
    return "untyped", False


def _exact_int(text: str) -> int | None:
    """The integer a value's text spells exactly (``12``, ``-3``, ``7.0``), else None."""
    body = text[1:] if text[:1] in "+-" else text
    head, dot, frac = body.partition(".")
    if not head.isdigit() or not head.isascii():
        return None
    if dot and frac.strip("0"):
        return None
    return int(head) if text[:1] != "-" else -int(head)


@dataclass
class ExpositionPage:
    """One parsed /metrics page, column by column (one entry per sample line).

    ``problems``: the lines that could not be read (the first :data:`MAX_PROBLEMS_KEPT`), each an
    :class:`ExpositionParseError` naming its line; ``problems_total`` counts them all.
    """

    metric: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    value: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float64))
    value_text: list[str] = field(default_factory=list)
    type: list[str] = field(default_factory=list)
    cumulative: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    types: dict[str, str] = field(default_factory=dict)  # family -> ``# TYPE``
    problems: list[ExpositionParseError] = field(default_factory=list)
    problems_total: int = 0

    def __len__(self) -> int:
        return len(self.metric)

    def problems_text(self) -> str | None:
        """The problems in one line (the first few named), or None when every line was read."""
        if not self.problems_total:
            return None
        shown = "; ".join(str(p) for p in self.problems[:3])
        more = self.problems_total - min(3, len(self.problems))
        return f"{self.problems_total} unreadable line(s): {shown}" + (f"; and {more} more" if more > 0 else "")

    def exact(self, i: int) -> int | float:
        """Sample ``i``'s value: an exact ``int`` where its text is an integer, else the float."""
        got = _exact_int(self.value_text[i])
        return got if got is not None else float(self.value[i])

    def value_int(self) -> pd.Series:
        """Nullable Int64 of the exact integers (int64 range), built from a buffer and a mask."""
        n = len(self)
        buf = np.zeros(n, dtype=np.int64)
        mask = np.ones(n, dtype=bool)
        v = self.value
        with np.errstate(invalid="ignore"):
            candidates = np.flatnonzero(np.isfinite(v) & (np.floor(v) == v))
        texts = self.value_text
        for i in candidates.tolist():
            got = _exact_int(texts[i])
            if got is not None and -(2**63) <= got < 2**63:
                buf[i] = got
                mask[i] = False
        return pd.Series(pd.arrays.IntegerArray(buf, mask))

    def to_frame(self) -> pd.DataFrame:
        """metric, metric_canonical, type, labels, value, value_int, value_text."""
        metric = pd.Series(self.metric, dtype="string")
        return pd.DataFrame({
            "metric": metric,
            "metric_canonical": pd.Series([canonical_name(m) for m in self.metric], dtype="string"),
            "type": pd.Series(self.type, dtype="string"),
            "labels": pd.Series(self.labels, dtype="string"),
            "value": self.value,
            "value_int": self.value_int(),
            "value_text": pd.Series(self.value_text, dtype="string"),
        })


class ParseCache:
    """Label strings and sample-name facts shared by the pages of one target."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}
        self.names: dict[tuple[str, str], tuple[str, bool]] = {}


def parse_exposition(text: str | bytes, *, cache: ParseCache | None = None, strict: bool = False) -> ExpositionPage:
    """Parse a Prometheus text exposition page (format 0.0.4, with the UTF-8 names) into columns.

    Histograms and summaries come as their ``_bucket``/``_sum``/``_count`` (and quantile)
    samples; ``# HELP`` and other comments are skipped; a sample's own timestamp is read and
    ignored. A line that is not the format is a problem on the page (``page.problems``) and the
    parse goes on; with ``strict=True`` it raises :class:`ExpositionParseError` naming the line.
    """
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("utf-8", "replace")
    cache = cache or ParseCache()
    label_cache = cache.labels
    name_cache = cache.names
    page = ExpositionPage()
    types = page.types
    metrics, labels, texts, kinds = page.metric, page.labels, page.value_text, page.type
    values: list[float] = []
    cumulative: list[bool] = []
    match = _SAMPLE_RE.match

    def problem(error: ExpositionParseError) -> None:
        if strict:
            raise error
        page.problems_total += 1
        if len(page.problems) < MAX_PROBLEMS_KEPT:
            page.problems.append(error)

    for lineno, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# TYPE "):
                parts = line.split()
                if len(parts) != 4:
                    problem(ExpositionParseError(lineno, line, "bad TYPE line"))
                    continue
                types[_unquote_name(parts[2])] = parts[3]
            continue
        if len(line) > MAX_SAMPLE_LINE:
            problem(ExpositionParseError(lineno, line, f"a sample line of {len(line)} characters, over the "
                                                       f"{MAX_SAMPLE_LINE} limit"))
            continue
        try:
            m = match(line)
            if m is not None:
                name, raw, vtext, _timestamp = m.groups()
                if raw:
                    canon = label_cache.get(raw)
                    if canon is None:
                        canon = label_cache[raw] = _canonical_labels(raw, lineno, line)
                else:
                    canon = ""
            else:
                if line.isspace():
                    continue
                sample = _read_sample(line.rstrip("\r"), lineno)
                name, canon, vtext = sample.name, sample.labels, sample.value
            try:
                value = float(vtext)
            except ValueError:
                raise ExpositionParseError(lineno, line, "bad value") from None
        except ExpositionParseError as error:
            problem(error)
            continue
        values.append(value)
        key = (name, types.get(name) or types.get(name.rsplit("_", 1)[0], ""))
        facts = name_cache.get(key)
        if facts is None:
            facts = name_cache[key] = family_of(name, types)
        metrics.append(name)
        labels.append(canon)
        texts.append(vtext)
        kinds.append(facts[0])
        cumulative.append(facts[1])
    page.value = np.array(values, dtype=np.float64)
    page.cumulative = np.array(cumulative, dtype=bool)
    return page


def _unquote_name(name: str) -> str:
    """A ``# TYPE`` line's family name, quoted in the UTF-8 form (``"my.metric"``) or bare."""
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return _unescape(name[1:-1])
    return name
