"""Diff two captures (the real engine's, the twin's) into a list of differences.

Every difference is one row: aspect (metrics, endpoints, generate, processes, threads, logs,
reader), role, item (a family, a route, a process title, a line template...), kind (``missing``:
the twin lacks what the real engine has; ``extra``: the twin has what the real engine lacks;
``different``: both have it, not alike; ``unrecognised``: a real line ``forensics logs`` cannot
place), what each side shows, and the reason when :mod:`forensics.fidelity.allowed` allows it.

Logs are compared twice: per event, the catalogue signatures each side's lines raise (the
evidence every reader builds on); per role, the *formats*: each twin line's template (its
message with numbers, ids, quoted strings and paths masked) must be one a real line of the same
role has. Real lines the twin does not write at all (model loading, say) are counted, not
differences: readers only rely on lines the catalogue or the batch parser know, and those are
compared by signature. Every real line must be recognised by ``forensics logs`` (its format
known), or it is reported as a reader difference.
"""

from __future__ import annotations

import html
import re
import tempfile
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from forensics.exitcodes import BAD, GOOD
from forensics.fidelity.allowed import allowed_reason
from forensics.fidelity.capture import Capture
from forensics.fidelity.scenario import EVENTS

COLUMNS = ("aspect", "role", "item", "kind", "real", "twin", "allowed")
_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: [A-Z_]+\d+)*\] ?")
_MASKS = (
    (re.compile(r"'[^']*'"), "'<s>'"),
    (re.compile(r'"[^"]*"'), '"<s>"'),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<hex>"),
    (re.compile(r"(?<![\w.])/[\w./-]+"), "<path>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<ip>"),
    (re.compile(r"(?<![A-Za-z])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"), "<n>"),
)


def template(line: str) -> str:
    """A line's format: its sglang prefix dropped, variable parts masked."""
    text = _PREFIX.sub("", line.rstrip())
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return text


@dataclass
class Difference:
    aspect: str
    role: str
    item: str
    kind: str
    real: str = ""
    twin: str = ""
    allowed: str | None = None  # the reason, when allowed


@dataclass
class LogFacts:
    """What ``forensics logs`` made of one event's lines of one role."""

    lines: int
    signatures: list[str]
    unknown: list[tuple[int, str]]  # (line in the slice, text) of lines in no known format
    event_lines: set[int] = field(default_factory=set)  # 1-based lines the catalogue placed
    kinds: set[str] = field(default_factory=set)  # "batch", "access": the lines readers parse for numbers


def log_facts(lines: list[str], role: str) -> LogFacts:
    """Scan ``lines`` with :func:`forensics.logs.scan` (the reader under test) from a file."""
    from forensics.logs import scan

    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        path = Path(tmp) / f"{role}.log"
        path.write_text("".join(line + "\n" for line in lines))
        result = scan([str(path)], role=role)
        samples = [pair for found in result.unknown_samples.values() for pair in found]
        signatures = sorted(set(result.events["signature"].astype(str))) if len(result.events) else []
        event_lines = {int(n) for n in result.events["line"].dropna()} if len(result.events) else set()
        kinds = {kind for kind, frame in (("batch", result.batches), ("access", result.access)) if len(frame)}
        unknown = int(result.sources["lines_unknown"].sum()) if len(result.sources) else 0
        if unknown and len(samples) < unknown:  # the scanner keeps a sample; name the rest by count
            samples.append((0, f"... and {unknown - len(samples)} more"))
    return LogFacts(len(lines), signatures, samples, event_lines, kinds)


@dataclass
class FidelityReport:
    """The differences of a twin from the real engine, and the figures behind them."""

    release: str
    differences: list[Difference] = field(default_factory=list)
    figures: dict[str, dict] = field(default_factory=dict)  # e.g. {"families": {"prefill": {"real": 66, ...}}}
    notes: list[str] = field(default_factory=list)

    @property
    def unallowed(self) -> list[Difference]:
        return [d for d in self.differences if d.allowed is None]

    @property
    def exit_status(self) -> int:
        return BAD if self.unallowed else GOOD

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([[getattr(d, c) for c in COLUMNS] for d in self.differences], columns=list(COLUMNS))

    def to_dict(self) -> dict:
        return {"release": self.release, "verdict": "differences" if self.unallowed else "faithful",
                "differences": [d.__dict__ for d in self.differences], "figures": self.figures,
                "counts": dict(Counter(d.aspect for d in self.unallowed)), "notes": self.notes}

    def text(self, width: int = 80) -> str:
        """The report for a terminal: headline, figures, then one line per difference (``width`` wide)."""
        lines = textwrap.wrap(self.headline(), width)
        for name, per_role in self.figures.items():
            lines += textwrap.wrap(f"{name}: " + "; ".join(f"{role} real {v.get('real')} twin {v.get('twin')}"
                                                          for role, v in per_role.items()),
                                   width, initial_indent="  ", subsequent_indent="    ")
        for aspect in dict.fromkeys(d.aspect for d in self.differences):
            rows = [d for d in self.differences if d.aspect == aspect]
            lines.append(f"{aspect} ({len(rows)}):")
            for d in rows:
                mark = "ok " if d.allowed else "!! "
                detail = f" real={d.real}" if d.real else ""
                detail += f" twin={d.twin}" if d.twin else ""
                lines += textwrap.wrap(f"{mark}{d.role:<7} {d.kind:<12} {d.item}{detail}", width,
                                       initial_indent="  ", subsequent_indent="       ", break_on_hyphens=False)
                if d.allowed:
                    lines += textwrap.wrap(f"allowed: {d.allowed}", width, initial_indent="       ",
                                           subsequent_indent="         ")
        for note in self.notes:
            lines += textwrap.wrap(f"note: {note}", width, subsequent_indent="  ")
        return "\n".join(lines)

    def headline(self) -> str:
        bad = self.unallowed
        if not bad:
            return (f"twin {self.release} is faithful to the real engine: no differences"
                    f" ({len(self.differences)} allowed)")
        counts = ", ".join(f"{n} {a}" for a, n in Counter(d.aspect for d in bad).items())
        return f"twin {self.release} differs from the real engine: {len(bad)} differences ({counts})"

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return f"<p><b>{html.escape(self.headline())}</b></p>" + self.frame().to_html(index=False)


def _add(report: FidelityReport, aspect: str, role: str, item: str, kind: str, real: str = "", twin: str = "") -> None:
    report.differences.append(Difference(aspect, role, item, kind, real, twin, allowed_reason(aspect, role, item, kind)))


def _compare_metrics(real: Capture, twin: Capture, report: FidelityReport) -> None:
    counts = {}
    for role in sorted(set(real.metrics) | set(twin.metrics)):
        r, t = real.metrics.get(role, {}), twin.metrics.get(role, {})
        counts[role] = {"real": len(r), "twin": len(t)}
        for name in sorted(set(r) - set(t)):
            _add(report, "metrics", role, name, "missing", r[name]["type"])
        for name in sorted(set(t) - set(r)):
            _add(report, "metrics", role, name, "extra", twin=t[name]["type"])
        for name in sorted(set(r) & set(t)):
            if r[name]["type"] != t[name]["type"]:
                _add(report, "metrics", role, name, "type", r[name]["type"], t[name]["type"])
            if r[name]["labels"] != t[name]["labels"]:
                _add(report, "metrics", role, name, "labels", ", ".join(r[name]["labels"]), ", ".join(t[name]["labels"]))
            rs, ts = set(r[name]["samples"]), set(t[name]["samples"])
            if rs and ts and rs != ts:  # a family both declare but one has no sample yet is not a format question
                _add(report, "metrics", role, name, "samples", ", ".join(sorted(rs - ts)), ", ".join(sorted(ts - rs)))
    report.figures["families"] = counts


def _compare_endpoints(real: Capture, twin: Capture, report: FidelityReport) -> None:
    for role in sorted(set(real.endpoints) | set(twin.endpoints)):
        r, t = real.endpoints.get(role, {}), twin.endpoints.get(role, {})
        for route in sorted(set(r) | set(t)):
            ra, ta = r.get(route, {}), t.get(route, {})
            if ra.get("status") != ta.get("status"):
                _add(report, "endpoints", role, route, "status", str(ra.get("status")), str(ta.get("status")))
                continue
            rk, tk = set(ra.get("keys") or ()), set(ta.get("keys") or ())
            if rk != tk:
                _add(report, "endpoints", role, route, "keys", ", ".join(sorted(rk - tk)), ", ".join(sorted(tk - rk)))
    for part in sorted(set(real.generate) | set(twin.generate)):
        rk, tk = set(real.generate.get(part, ())), set(twin.generate.get(part, ()))
        if rk - tk:
            _add(report, "generate", "router", f"/generate {part}", "missing-keys", ", ".join(sorted(rk - tk)))
        if tk - rk:
            _add(report, "generate", "router", f"/generate {part}", "extra-keys", twin=", ".join(sorted(tk - rk)))


def _multiset_text(counter: Counter) -> str:
    return ",".join(f"{k}x{n}" if n > 1 else k for k, n in sorted(counter.items()))


def _leader(rows: list[dict]) -> dict | None:
    """The row of the process serving the role's URL (marked by the capture; the first row, the
    tree's root, in a capture made before the mark)."""
    return next((row for row in rows if row.get("leader")), rows[0] if rows else None)


def _compare_processes(real: Capture, twin: Capture, report: FidelityReport) -> None:
    for role in sorted(set(real.processes) | set(twin.processes)):
        real_rows, twin_rows = real.processes.get(role, []), twin.processes.get(role, [])
        r = {row["title"]: row for row in real_rows}
        t = {row["title"]: row for row in twin_rows}
        # The leaders (sglang's launch_server, the twin's front) are one process under two titles:
        # the title is one difference, their threads are compared under the real engine's title.
        real_leader, twin_leader = _leader(real_rows), _leader(twin_rows)
        if real_leader and twin_leader and real_leader["title"] != twin_leader["title"]:
            _add(report, "processes", role, "the process serving the URL", "different", real_leader["title"],
                 twin_leader["title"])
            if real_leader["title"] not in t:
                del t[twin_leader["title"]]
                t[real_leader["title"]] = twin_leader
        for title in sorted(set(r) - set(t)):
            _add(report, "processes", role, title, "missing", f"{len(r[title].get('threads') or [])} threads")
        for title in sorted(set(t) - set(r)):
            _add(report, "processes", role, title, "extra", twin=f"{len(t[title].get('threads') or [])} threads")
        for title in sorted(set(r) & set(t)):
            rt, tt = r[title].get("threads"), t[title].get("threads")
            if rt is None or tt is None:
                report.notes.append(f"{role} {title}: threads unknown on the {'real' if rt is None else 'twin'} "
                                    f"side ({(r if rt is None else t)[title].get('gap')})")
                continue
            rc, tc = Counter(rt), Counter(tt)
            for name in sorted(set(rc) | set(tc)):
                if rc[name] != tc[name]:
                    kind = "missing" if tc[name] < rc[name] else "extra"
                    _add(report, "threads", role, f"{title}: {name}", kind, str(rc[name]), str(tc[name]))


def _compare_logs(real: Capture, twin: Capture, report: FidelityReport) -> None:
    lines_seen = {}
    templates: dict[tuple[str, str], dict[str, str]] = {}  # (side, role) -> template -> a line
    kinds: dict[tuple[str, str], set[str]] = {}  # (side, role) -> the kinds of numeric lines seen
    for event in EVENTS:
        for role in sorted(set(real.logs.get(event, {})) | set(twin.logs.get(event, {}))):
            rl, tl = real.logs.get(event, {}).get(role, []), twin.logs.get(event, {}).get(role, [])
            rf, tf = log_facts(rl, role), log_facts(tl, role)
            lines_seen.setdefault(role, {"real": 0, "twin": 0})
            lines_seen[role]["real"] += rf.lines
            lines_seen[role]["twin"] += tf.lines
            for number, text in rf.unknown:
                _add(report, "reader", role, f"{event} line {number}", "unrecognised", text.strip()[:200])
            for name in sorted(set(rf.signatures) - set(tf.signatures)):
                _add(report, "logs", role, f"{event}: {name}", "missing", "signature")
            for name in sorted(set(tf.signatures) - set(rf.signatures)):
                _add(report, "logs", role, f"{event}: {name}", "extra", twin="signature")
            for side, lines, facts in (("real", rl, rf), ("twin", tl, tf)):
                kinds.setdefault((side, role), set()).update(facts.kinds)
                bucket = templates.setdefault((side, role), {})
                for number, line in enumerate(lines, 1):
                    # a line the catalogue placed is checked by its signature (the catalogue's
                    # patterns are sglang's format strings), wherever the twin wrote it
                    if line.strip() and number not in facts.event_lines:
                        bucket.setdefault(template(line), line)
    for role in sorted({role for _side, role in templates}):
        real_t, twin_t = templates.get(("real", role), {}), templates.get(("twin", role), {})
        for shape in sorted(set(twin_t) - set(real_t)):
            _add(report, "logs", role, shape[:160], "format", twin=twin_t[shape].strip()[:160])
        for kind in sorted(kinds.get(("real", role), set()) - kinds.get(("twin", role), set())):
            _add(report, "logs", role, f"{kind} lines", "missing", "written", "none")
        unmatched = len(set(real_t) - set(twin_t))
        report.notes.append(f"{role}: {unmatched} of the real engine's {len(real_t)} line formats are not "
                            "written by the twin (model loading, server arguments, ...); compared by signature")
    report.figures["log lines"] = lines_seen


def compare(real: Capture, twin: Capture) -> FidelityReport:
    """Every difference of ``twin`` from ``real`` (both of one release)."""
    report = FidelityReport(real.release)
    if real.release and twin.release and real.release != twin.release:
        report.notes.append(f"the captures are of different releases: real {real.release}, twin {twin.release}")
    _compare_metrics(real, twin, report)
    _compare_endpoints(real, twin, report)
    _compare_processes(real, twin, report)
    _compare_logs(real, twin, report)
    for event in EVENTS[1:]:
        if real.outcomes.get(event) is None or twin.outcomes.get(event) is None:
            report.notes.append(f"{event}: not driven on {'the real engine' if event not in real.outcomes else 'the twin'}")
    return report
