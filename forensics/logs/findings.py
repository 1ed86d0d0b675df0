"""What a log window says, as a verdict: clean, warnings, findings or inconclusive.

The classes of findings are data (``findings.toml``): each names its severity and the
catalogue signatures whose events are its evidence. Two classes are derived from the
numbers instead: a bootstrap queue that only grows while only health probes run (from
the batch history), and /health answering 5xx (from the access counts).

"Clean" has to be earned: the window must hold sglang lines (at least
``MIN_RECOGNISED_SHARE`` of the lines read are sglang's, uvicorn's or CPython's), every
source must have been readable, and no finding may be critical or error. Anything short
of that is INCONCLUSIVE with the reason, never a silent pass.
"""

from __future__ import annotations

import html
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import PurePath

import numpy as np
import pandas as pd

from forensics.exitcodes import ExitStatus
from forensics.logs.catalogue import derived_releases, signatures
from forensics.logs.source_errors import derived_ids

SEVERITIES = ("critical", "error", "warning")
MIN_RECOGNISED_SHARE = 0.01  # below this share of sglang/uvicorn/CPython lines, no event means nothing
# A bootstrap queue "only grows" over at least this many consecutive prefill batch lines that
# are all one-token health probes, spanning at least this long, ending higher than it began.
BOOTSTRAP_GROWTH_MIN_LINES = 10
BOOTSTRAP_GROWTH_MIN_SPAN = pd.Timedelta(seconds=30)
EVIDENCE_SHOWN = 20  # evidence lines per finding in JSON and displays (the frame keeps all)
EVIDENCE_COLUMNS = ["ts", "host", "role", "source", "line", "signature", "room", "message"]


@dataclass(frozen=True)
class FindingClass:
    id: str
    severity: str
    meaning: str
    signatures: tuple[str, ...]
    derived: str | None = None


@lru_cache(maxsize=1)
def finding_classes() -> tuple[FindingClass, ...]:
    """The classes in ``findings.toml``, checked against the signature catalogue."""

    text = resources.files("forensics.logs").joinpath("findings.toml").read_text(encoding="utf-8")
    known = {signature.id for signature in signatures()} | set(derived_ids())
    classes = []
    claimed: dict[str, str] = {}
    for entry in tomllib.loads(text)["finding"]:
        if entry["severity"] not in SEVERITIES:
            raise ValueError(f"findings.toml: {entry['id']}: severity {entry['severity']!r} not in {SEVERITIES}")
        for signature in entry["signatures"]:
            if signature not in known:
                raise ValueError(f"findings.toml: {entry['id']}: no signature {signature!r} in the catalogue")
            if signature in claimed:
                raise ValueError(f"findings.toml: {signature!r} is in both {claimed[signature]} and {entry['id']}")
            claimed[signature] = entry["id"]
        classes.append(FindingClass(entry["id"], entry["severity"], entry["meaning"], tuple(entry["signatures"]),
                                    entry.get("derived")))
    return tuple(classes)


@dataclass
class Finding:
    """One class of trouble in the window, with the lines that show it."""

    cls: FindingClass
    count: int  # events (or derived episodes) of this class
    evidence: pd.DataFrame  # EVIDENCE_COLUMNS rows for event classes; episode rows for derived ones
    first: pd.Timestamp | None = None
    last: pd.Timestamp | None = None
    detail: str = ""

    @property
    def id(self) -> str:
        return self.cls.id

    @property
    def severity(self) -> str:
        return self.cls.severity

    def sentence(self) -> str:
        when = ""
        if self.first is not None and not pd.isna(self.first):
            when = f" from {self.first.isoformat()}"
            if self.last is not None and not pd.isna(self.last) and self.last != self.first:
                when += f" to {self.last.isoformat()}"
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.severity} {self.id} x{self.count}{when}{detail}"

    def evidence_lines(self, *, short: bool = False, names: Mapping[str, str] | None = None) -> list[str]:
        """``source:line`` of the evidence (or the episode in words for derived classes); ``short``
        names each source as ``names`` says (a terminal's table, where a full path folds), by its
        file name when ``names`` is not given."""
        shown = self.evidence.head(EVIDENCE_SHOWN)
        if "line" in self.evidence.columns:
            rooms = shown["room"] if "room" in shown.columns else pd.Series(pd.NA, index=shown.index)
            return [f"{_source_name(source, names) if short else source}:{line}"
                    + ("" if pd.isna(room) else f" (room {int(room)})")
                    for source, line, room in zip(shown["source"], shown["line"], rooms)]
        if short and "bootstrap_req_first" in shown.columns:
            return [_episode_words(episode, short=True, names=names) for episode in shown.to_dict("records")]
        return [str(text) for text in shown.get("episode", pd.Series(dtype=str))]

    def to_dict(self) -> dict:
        from forensics.jsonable import frame_json

        return {
            "class": self.id, "severity": self.severity, "count": self.count, "meaning": self.cls.meaning,
            "first": None if self.first is None or pd.isna(self.first) else self.first.isoformat(),
            "last": None if self.last is None or pd.isna(self.last) else self.last.isoformat(),
            "detail": self.detail, "evidence": frame_json(self.evidence.head(EVIDENCE_SHOWN)),
        }


def _source_name(source, names: Mapping[str, str] | None) -> str:
    """How a terminal names a source: as ``names`` maps it, else by its file name."""
    if source is None or pd.isna(source):
        return str(source)
    if names is not None and str(source) in names:
        return names[str(source)]
    return PurePath(str(source)).name


def _episode_words(episode: dict, *, short: bool = False, names: Mapping[str, str] | None = None) -> str:
    """A bootstrap-queue episode in words; ``short`` (a terminal's table) names the source as
    ``_source_name`` does and the times by the clock when both fall on one day."""
    source, start, until = episode["source"], episode["ts"], episode["until"]
    growth = f"#bootstrap-req {episode['bootstrap_req_first']} -> {episode['bootstrap_req_last']}"
    if not short:
        return (f"{source}: {episode['batch_lines']} probe-only prefill batches {start.isoformat()} .. "
                f"{until.isoformat()}, {growth}")
    when = f"{start:%H:%M:%S}..{until:%H:%M:%S}" if start.date() == until.date() else f"{start.isoformat()}..{until.isoformat()}"
    return f"{_source_name(source, names)} {when}: {episode['batch_lines']} probe-only batches, {growth}"


@dataclass
class LogAssessment:
    """The verdict of a log window (``word``, ``exit_status``), its reasons and its findings."""

    word: str  # clean | warnings | findings | inconclusive
    reasons: list[str]
    findings: list[Finding] = field(default_factory=list)
    lines_read: int = 0
    lines_recognised: int = 0
    # How the terminal view names each source (``naming_sources``); the JSON and frames keep paths.
    source_names: Mapping[str, str] | None = field(default=None, repr=False)

    def naming_sources(self, names: Mapping[str, str]) -> LogAssessment:
        """The same assessment, its terminal view naming each source ``names[source]`` (the names
        the sources table uses, full paths where file names collide)."""
        return replace(self, source_names=dict(names))

    @property
    def exit_status(self) -> ExitStatus:
        return {"clean": ExitStatus.GOOD, "warnings": ExitStatus.GOOD, "findings": ExitStatus.BAD,
                "inconclusive": ExitStatus.INCONCLUSIVE}[self.word]

    @property
    def recognised_share(self) -> float:
        return self.lines_recognised / self.lines_read if self.lines_read else 0.0

    def to_dict(self) -> dict:
        return {"verdict": self.word, "reasons": self.reasons,
                "lines_read": self.lines_read, "lines_recognised": self.lines_recognised,
                "findings": [finding.to_dict() for finding in self.findings]}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({
            "class": [f.id for f in self.findings], "severity": [f.severity for f in self.findings],
            "count": pd.array([f.count for f in self.findings], dtype="Int64"),
            "first": pd.to_datetime([f.first for f in self.findings], utc=True),
            "last": pd.to_datetime([f.last for f in self.findings], utc=True),
            "evidence": [", ".join(f.evidence_lines()[:3]) for f in self.findings],
        })

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        style = {"clean": "bold green", "warnings": "bold yellow", "findings": "bold red",
                 "inconclusive": "bold yellow"}[self.word]
        parts = [Text(f"Verdict: {self.word.upper()}", style=style)]
        parts += [Text(f"  {reason}") for reason in self.reasons]
        if self.findings:
            # The evidence takes what the terminal has left: folded into a narrow column it doubles the table.
            table = Table(show_header=True, header_style="bold", expand=True)
            for column in ("severity", "class", "count"):
                table.add_column(column, overflow="fold")
            table.add_column("first evidence", overflow="fold", ratio=1)
            for finding in self.findings:
                lines = finding.evidence_lines(short=True, names=self.source_names)
                table.add_row(finding.severity, finding.id, str(finding.count), lines[0] if lines else "",
                              style={"critical": "bold red", "error": "red", "warning": "yellow"}[finding.severity])
            parts.append(table)
        return Group(*parts)

    def _repr_html_(self) -> str:
        color = {"clean": "#1a7f37", "warnings": "#9a6700", "findings": "#cf222e", "inconclusive": "#9a6700"}[self.word]
        reasons = "".join(f"<li>{html.escape(r)}</li>" for r in self.reasons)
        rows = "".join(
            f"<tr><td style='text-align:left'>{html.escape(f.severity)}</td>"
            f"<td style='text-align:left'>{html.escape(f.id)}</td><td>{f.count}</td>"
            f"<td style='text-align:left'>{html.escape(', '.join(f.evidence_lines()[:3]))}</td></tr>"
            for f in self.findings)
        table = ("<table><thead><tr><th>severity</th><th>class</th><th>count</th><th>evidence</th></tr></thead>"
                 f"<tbody>{rows}</tbody></table>") if self.findings else ""
        return (f"<div><b style='color:{color}'>Verdict: {self.word.upper()}</b><ul>{reasons}</ul>{table}</div>")


def assess(scan) -> LogAssessment:
    """Judge a ``LogScan``: the findings in its window and whether its evidence can be trusted."""
    stops = _stop_events(scan.events)  # once: two classes (crashes_not_stops, server_stopped) read it
    findings = [finding for cls in finding_classes() if (finding := _find(cls, scan, stops)) is not None]
    findings.sort(key=lambda f: (SEVERITIES.index(f.severity), _sort_time(f.first)))
    lines_read = scan.lines_total
    recognised = scan.lines_recognised
    serious = [f for f in findings if f.severity in ("critical", "error")]
    reasons: list[str] = []
    if serious:
        reasons.append(f"{len(serious)} critical or error finding classes: "
                       + ", ".join(f"{f.id} (x{f.count})" for f in serious))
        word = "findings"
    else:
        word = None
        missing = _missing_evidence(scan, findings, lines_read, recognised)
        if missing:
            reasons.extend(missing)
            word = "inconclusive"
        elif findings:
            reasons.append("only warnings: " + ", ".join(f"{f.id} (x{f.count})" for f in findings))
            word = "warnings"
        elif not derived_releases():
            reasons.append("sglang's own error calls are not known here (no release source in the cache), so "
                           "an error line only they explain would read as an ordinary one: not clean without "
                           "them (forensics logs --sglang VERSION fetches one)")
            word = "inconclusive"
        else:
            reasons.append(f"read {recognised:,} sglang/uvicorn/CPython lines of {lines_read:,} "
                           f"({_percent(recognised, lines_read)}) in {scan.window.describe()}; nothing wrong found")
            word = "clean"
    unreadable = [str(p) for p in scan.problems if p.line is None]
    if serious and unreadable:
        reasons.append(f"{len(unreadable)} sources could not be read fully: " + "; ".join(unreadable[:3]))
    return LogAssessment(word=word, reasons=reasons, findings=findings, lines_read=lines_read,
                         lines_recognised=recognised)


def _missing_evidence(scan, findings, lines_read: int, recognised: int) -> list[str]:
    """Why the window cannot be called clean (empty when it can)."""
    reasons = []
    unreadable = [str(p) for p in scan.problems if p.line is None]
    if unreadable:
        reasons.append(f"{len(unreadable)} of the inputs could not be read (fully): " + "; ".join(unreadable[:3])
                       + (" ..." if len(unreadable) > 3 else ""))
    if lines_read == 0:
        reasons.append("no lines were read")
    elif recognised / lines_read < MIN_RECOGNISED_SHARE and len(scan.events) == 0:
        reasons.append(f"only {recognised:,} of {lines_read:,} lines ({_percent(recognised, lines_read)}) are "
                       f"sglang, uvicorn or CPython lines: this does not look like an sglang log")
    start, end = scan.span
    window = scan.window
    if not window.empty:
        if start is None:
            reasons.append(f"no line carries a time, so the window ({window.describe()}) cannot be applied")
        elif (window.since is not None and window.since > end) or (window.until is not None and window.until < start):
            reasons.append(f"the window ({window.describe()}) holds no log line: the logs span "
                           f"{start.isoformat()} to {end.isoformat()}")
    return reasons


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "0%"


def _sort_time(stamp) -> pd.Timestamp:
    return pd.Timestamp.max.tz_localize("UTC") if stamp is None or pd.isna(stamp) else stamp


def _find(cls: FindingClass, scan, stops: np.ndarray) -> Finding | None:
    if cls.derived == "bootstrap_queue_growth":
        return _bootstrap_queue_growth(cls, scan.batches)
    events = scan.events
    columns = [c for c in EVIDENCE_COLUMNS if c in events.columns]
    mask = events["signature"].isin(cls.signatures).to_numpy() if cls.signatures else np.zeros(len(events), bool)
    if cls.derived in ("crashes_not_stops", "server_stopped"):
        mask = mask & ~stops if cls.derived == "crashes_not_stops" else stops
    rows = events.loc[mask, columns]
    extra = None
    if cls.derived == "health_access_errors":
        extra = _health_access_errors(scan.access, scan.events)
    told = events.loc[mask, [c for c in ("source", "line", "raw") if c in events.columns]]
    count = _occurrences(told) + (int(extra["count"].sum()) if extra is not None else 0)
    if count == 0:
        return None
    evidence = rows.reset_index(drop=True)
    times = rows["ts"].dropna()
    first = times.min() if len(times) else None
    last = times.max() if len(times) else None
    detail = ""
    if extra is not None and len(extra):
        codes = ", ".join(f"{int(n)} x {status}" for status, n in extra.groupby("status")["count"].sum().items())
        detail = f"/health answered {codes}"
        minutes = extra["minute"].dropna()
        if len(minutes):
            first = minutes.min() if first is None else min(first, minutes.min())
            last = minutes.max() if last is None else max(last, minutes.max())
    return Finding(cls, count, evidence, first, last, detail)


def _occurrences(rows: pd.DataFrame) -> int:
    """How many things happened in ``rows``: an event whose line lies inside an earlier event's
    lines in the same source (the GUARD assertion that ends a thread's death traceback) is that
    event told twice, not a second death."""
    if len(rows) < 2 or not {"source", "line", "raw"} <= set(rows.columns):
        return len(rows)
    line = pd.array(rows["line"], dtype="Int64").fillna(-1).to_numpy(dtype="int64")
    frame = pd.DataFrame({"source": rows["source"].astype("string").fillna("").to_numpy(), "line": line,
                          "end": line + rows["raw"].astype("string").fillna("").str.count("\n").to_numpy(dtype="int64")})
    frame = frame.sort_values(["source", "line"], kind="stable")
    # The furthest line any earlier event of the same source reaches; a line without a number stands alone.
    reached = frame["end"].where(frame["line"] >= 0, -1).groupby(frame["source"]).cummax()
    before = reached.groupby(frame["source"]).shift(1, fill_value=-1)
    return int(((frame["line"] < 0) | (frame["line"] > before)).sum())


def event_classes(events: pd.DataFrame) -> pd.Series:
    """The finding class of each event (None where it has none), the stop rule applied: what
    ``assess`` counts per class, for readers (the diagnosis) that group events themselves."""
    class_of = {sig: cls.id for cls in finding_classes() for sig in cls.signatures}
    classes = events["signature"].map(class_of).astype(object)
    stops = _stop_events(events)
    if stops.any():
        classes[stops] = "server_stopped"
    return classes.where(classes.notna(), None)


STOP_EXIT_CODES = frozenset({"-15", "-9", "-2"})  # multiprocessing's exit code: minus the signal that ended the child
SIGQUIT_FOLLOWERS = ("child_failed", "crash_diagnostics_skipped")
STOP_FOLLOW_LINES = 5  # sglang's SIGQUIT line comes right after its watchdog's (the same handler)
_EXIT_CODE = re.compile(r"crashed with exit code (\S+?)\. ")


def _stop_events(events: pd.DataFrame) -> np.ndarray:
    """The events of a stop from outside: each ``subprocess_exited`` with a signal's exit code, and
    the lines its SIGQUIT makes within a few lines of it in the same source (``child_failed``, and
    ``crash_diagnostics_skipped`` when the handler finds no scheduler left to dump)."""
    stops = np.zeros(len(events), bool)
    if not len(events):
        return stops
    signature = events["signature"].to_numpy()
    exited = np.flatnonzero(signature == "subprocess_exited")
    if not len(exited):
        return stops
    messages = events["message"].astype(str).to_numpy()
    sources = events["source"].astype(str).to_numpy()
    lines = pd.to_numeric(events["line"], errors="coerce").to_numpy()
    stopped_at: dict[str, list[float]] = {}
    for row in exited:
        code = _EXIT_CODE.search(messages[row])
        if code and code.group(1) in STOP_EXIT_CODES:
            stops[row] = True
            stopped_at.setdefault(sources[row], []).append(lines[row])
    for row in np.flatnonzero(np.isin(signature, SIGQUIT_FOLLOWERS)):
        if any(0 < lines[row] - line <= STOP_FOLLOW_LINES for line in stopped_at.get(sources[row], ())):
            stops[row] = True
    return stops


def _health_access_errors(access: pd.DataFrame, events: pd.DataFrame | None = None) -> pd.DataFrame:
    """/health* answered 5xx, except a source's answers up to the minute it logged ``server_ready``:
    sglang answers 503 while it starts (a real 0.5.15 server: 15 of them before its warm-up ended),
    and access lines are counted per minute, so the ready line's own minute counts as start-up."""
    if not len(access):
        return access
    paths = access["path"].astype("string")
    status = access["status"]
    failing = paths.str.startswith("/health").fillna(False) & (status >= 500).fillna(False)
    if events is not None and len(events) and "source" in access.columns:
        ready = events.loc[(events["signature"] == "server_ready").to_numpy(), ["source", "ts"]].dropna()
        for source, times in ready.groupby("source")["ts"]:
            minutes = access["minute"]
            for stamp in times:
                # the start-up before this ready line: since the previous ready line of the source (a restart)
                earlier = times[times < stamp]
                since = earlier.max().floor("min") if len(earlier) else None
                starting = (access["source"] == source).fillna(False) & (minutes <= stamp.floor("min")).fillna(False)
                if since is not None:
                    starting &= (minutes > since).fillna(False)
                failing &= ~starting.to_numpy()
    return access[failing.to_numpy()]


def _bootstrap_queue_growth(cls: FindingClass, batches: pd.DataFrame) -> Finding | None:
    """Runs of prefill batch lines that are all one-token probes while #bootstrap-req only grows."""
    needed = {"kind", "new_seq", "new_token", "bootstrap_req", "ts"}
    if not len(batches) or not needed.issubset(batches.columns):
        return None
    wanted = [c for c in ("ts", "source", "host", "dp_rank", "tp_rank", "new_seq", "new_token", "bootstrap_req")
              if c in batches.columns]  # not the whole frame: it has millions of rows
    prefill = batches.loc[(batches["kind"] == "prefill").to_numpy(), wanted]
    if not len(prefill):
        return None
    keys = [c for c in ("source", "host", "dp_rank", "tp_rank") if c in prefill.columns]
    group = prefill.groupby(keys, observed=True, dropna=False, sort=False).ngroup().to_numpy()
    times = prefill["ts"].to_numpy(dtype="datetime64[ns]")
    order = np.lexsort((times, group))
    group, times = group[order], times[order]
    probe = ((prefill["new_seq"].to_numpy(dtype="float64", na_value=np.nan)[order] == 1)
             & (prefill["new_token"].to_numpy(dtype="float64", na_value=np.nan)[order] == 1))
    queue = prefill["bootstrap_req"].to_numpy(dtype="float64", na_value=np.nan)[order]
    usable = probe & ~np.isnan(queue)
    # A run continues while the row is a usable probe in the same group with a queue that did not shrink.
    same = np.r_[False, group[1:] == group[:-1]]
    grows = np.r_[False, queue[1:] >= queue[:-1]]
    continues = usable & np.r_[False, usable[:-1]] & same & grows
    run_id = np.cumsum(~continues)
    episodes = []
    sources = prefill["source"].astype("string").to_numpy()[order] if "source" in prefill else None
    hosts = prefill["host"].astype("string").to_numpy()[order] if "host" in prefill else None
    # Usable rows of one run are contiguous, so each run is (first usable row, row count).
    members = np.flatnonzero(usable)
    _, first_member, lengths = np.unique(run_id[members], return_index=True, return_counts=True)
    long_enough = lengths >= BOOTSTRAP_GROWTH_MIN_LINES
    for offset, length in zip(first_member[long_enough].tolist(), lengths[long_enough].tolist()):
        start, end = members[offset], members[offset + length - 1]
        span = pd.Timedelta(times[end] - times[start])
        if span < BOOTSTRAP_GROWTH_MIN_SPAN or not queue[end] > queue[start]:
            continue
        episodes.append({
            "ts": pd.Timestamp(times[start]).tz_localize("UTC"), "until": pd.Timestamp(times[end]).tz_localize("UTC"),
            "host": None if hosts is None else hosts[start], "source": None if sources is None else sources[start],
            "batch_lines": length, "bootstrap_req_first": int(queue[start]),
            "bootstrap_req_last": int(queue[end]),
        })
    if not episodes:
        return None
    evidence = pd.DataFrame(episodes)
    evidence["episode"] = [_episode_words(e) for e in episodes]
    first = evidence["ts"].min()
    last = evidence["until"].max()
    worst = max(episodes, key=lambda e: e["bootstrap_req_last"] - e["bootstrap_req_first"])
    detail = (f"{worst['batch_lines']} probe-only batches, #bootstrap-req {worst['bootstrap_req_first']} -> "
              f"{worst['bootstrap_req_last']}")
    return Finding(cls, len(episodes), evidence, first, last, detail)
