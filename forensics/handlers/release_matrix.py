"""The release matrix: per release x backend, what the map says, and a heatmap of it.

Each row is computed from that release's own source (``build``); the vulnerable window is
read off the rows (the releases where the decode sends a tag the prefill loop dies on),
never from a list. Rows are cached per wheel sha256 and analysis version under the cache
directory, so a second run over 42 releases reads JSON; ``cached=False`` recomputes.

A backend whose code could not be read (or whose prefill loop was not understood) keeps
its row, with ``understood`` False, the reason with file and line in ``unreadable`` and
None (unknown) in every column it cannot vouch for: it never reads as handling ABORT or
as surviving foreign frames. ``verdict`` is then "inconclusive".
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from packaging.version import Version

from forensics.exitcodes import ExitStatus
from forensics.handlers.model import DECODE, DIES, HANDLED, INCONCLUSIVE, NOT_READ, NOT_UNDERSTOOD, PREFILL

ANALYSIS_VERSION = "3"  # bump when the analysis changes what a row says
MAPPED = "mapped"  # the matrix's verdict when every release x backend was read and understood
COLUMNS = [
    "release", "backend", "inherits", "decode_sends_abort", "handles_abort", "abort_fate", "abort_kills",
    "dies_on_unknown", "daemon", "wrapper", "per_message_try", "bootstrap_timeout", "frames_sent",
    "killing_tags", "dropped_tags", "gaps", "understood", "unreadable",
]


def matrix_backends(handler_map) -> list[str]:
    """Mapped backends, then those whose code is there but could not be read."""
    names = list(handler_map.backends)
    for entry in handler_map.unreadable:
        if entry.backend and entry.backend not in names:
            names.append(entry.backend)
    return names


def matrix_row(handler_map, backend_name: str) -> dict:
    blind = handler_map.unreadable_for(backend_name)
    if backend_name not in handler_map.backends:
        row = dict.fromkeys(COLUMNS)
        row.update(release=handler_map.version, backend=backend_name, abort_fate=NOT_READ,
                   gaps=len([g for g in handler_map.gaps if g.file.startswith(f"{backend_name}/")]),
                   understood=False, unreadable="; ".join(str(u) for u in blind))
        return row
    backend = handler_map.backends[backend_name]
    prefill = backend.loops_for(PREFILL)
    to_prefill = [d for d in backend.deliveries if d.message.receiver_role == PREFILL]
    aborts = [d for d in to_prefill if d.message.tag == "ABORT"]
    killing = sorted({d.message.tag for d in backend.deliveries if d.outcome.fate == DIES})
    dropped = sorted({d.message.tag for d in backend.deliveries if d.outcome.fate not in (DIES, HANDLED, "no reader")})
    abort_fate = aborts[0].outcome.fate if aborts else next(
        (o.fate for o in backend.abort_probe.values()), None
    )
    row = {
        "release": handler_map.version,
        "backend": backend_name,
        "inherits": backend.inherits,
        "decode_sends_abort": bool(aborts),
        "handles_abort": backend.handles_abort(),
        "abort_fate": abort_fate,
        "abort_kills": any(d.outcome.fate == DIES for d in aborts),
        "dies_on_unknown": any(loop.dies_on_unknown for loop in backend.loops if loop.role == PREFILL),
        "daemon": prefill[0].daemon if prefill else None,
        "wrapper": prefill[0].wrapper if prefill else None,
        "per_message_try": prefill[0].per_message_try if prefill else None,
        "bootstrap_timeout": backend.bootstrap_timeout,
        "frames_sent": ", ".join(sorted({m.tag for m in backend.sent_by(DECODE)})),
        "killing_tags": ", ".join(killing),
        "dropped_tags": ", ".join(dropped),
        "gaps": len([g for g in handler_map.gaps if g.file.startswith(f"{backend_name}/")]),
        "understood": not blind,
        "unreadable": "; ".join(str(u) for u in blind),
    }
    if not prefill or not all(loop.understood for loop in prefill):
        # Nothing about the prefill loop is known for sure: unknown, never "handled" or "survives".
        row.update(handles_abort=None, abort_kills=None, dies_on_unknown=None,
                   abort_fate=NOT_UNDERSTOOD if prefill else NOT_READ)
    if not backend.understood:
        row.update(killing_tags=None, dropped_tags=None)
    return row


def _rows_for(version: str, use_cache: bool) -> list[dict]:
    from forensics.cache import cache_dir
    from forensics.handlers.handler_map import build
    from forensics.sglang_source import fetch

    source = fetch(version)
    cache_file = None
    if use_cache and source.sha256:
        cache_file = cache_dir() / "handlers" / f"{version}-{source.sha256[:16]}-v{ANALYSIS_VERSION}.json"
        if cache_file.is_file():
            return json.loads(cache_file.read_text())
    handler_map = build(source)
    rows = [matrix_row(handler_map, name) for name in matrix_backends(handler_map)]
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, cache_file)
    return rows


@dataclass
class HandlerMatrix:
    frame: object  # pandas.DataFrame, one row per release x backend

    def to_frame(self):
        return self.frame

    def unreadable_rows(self):
        """Rows (release x backend) whose code could not be read or was not understood."""
        return self.frame[~self.frame["understood"].astype(bool)]

    @property
    def verdict(self) -> str:
        """"mapped" when every release x backend was read and understood, else "inconclusive"."""
        return INCONCLUSIVE if len(self.unreadable_rows()) else MAPPED

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.INCONCLUSIVE if self.verdict == INCONCLUSIVE else ExitStatus.GOOD

    def window(self, backend: str = "nixl", column: str = "abort_kills") -> list[str]:
        """Releases where ``column`` is true for ``backend`` (default: an ABORT the decode sends kills it)."""
        rows = self.frame[(self.frame["backend"] == backend) & (self.frame[column] == True)]  # noqa: E712
        return sorted(rows["release"].tolist(), key=Version)

    def window_text(self, backend: str = "nixl", column: str = "abort_kills") -> str:
        releases = self.window(backend, column)
        if not releases:
            return "none"
        return f"{releases[0]} .. {releases[-1]} ({len(releases)} releases)"

    def to_dict(self) -> dict:
        records = self.frame.to_dict(orient="records")
        return {
            "verdict": self.verdict,
            "unreadable": [
                {"release": r["release"], "backend": r["backend"], "unreadable": r["unreadable"]}
                for r in records if not bool(r["understood"])
            ],
            "rows": records,
            "windows": {
                backend: {"abort_kills": self.window(backend), "killing_tags": sorted(
                    {r["release"] for r in records if r["backend"] == backend and r["killing_tags"]}, key=Version)}
                for backend in sorted(set(self.frame["backend"]))
            },
        }

    def _repr_html_(self) -> str:
        """A compact heatmap table: one row per release, per backend what the decode's ABORT and an
        unknown frame do to the prefill loop and which sent tags kill a loop; a legend; the verdict
        and the NIXL window first. Release names are never wrapped or cut."""
        return matrix_html(self)

    def __rich__(self):
        return matrix_renderable(self)

    def plot(self, ax=None, backends: Iterable[str] | None = None):
        """Heatmap: releases down, (backend, property) across; red where the loop is exposed."""
        import matplotlib.pyplot as plt
        import numpy as np
        from matplotlib.colors import ListedColormap

        frame = self.frame
        chosen = list(backends) if backends else [b for b in ("nixl", "mooncake", "mori", "ascend")
                                                 if b in set(frame["backend"])]
        properties = [
            ("decode_sends_abort", "decode sends ABORT", False),
            ("handles_abort", "prefill handles ABORT", True),
            ("abort_kills", "ABORT kills loop", False),
            ("dies_on_unknown", "dies on unknown frame", False),
            ("daemon", "daemon thread", True),
            ("bootstrap_timeout", "bootstrap timeout", True),
        ]
        releases = sorted(set(frame["release"]), key=Version)
        # 0 = good, 1 = bad, 0.5 = informational true, nan = absent
        grid = np.full((len(releases), len(chosen) * len(properties)), np.nan)
        labels = []
        for b_index, backend in enumerate(chosen):
            for p_index, (column, label, good_when_true) in enumerate(properties):
                labels.append(f"{backend}: {label}")
                for r_index, release in enumerate(releases):
                    match = frame[(frame["release"] == release) & (frame["backend"] == backend)]
                    if match.empty or match.iloc[0][column] is None:
                        continue
                    value = bool(match.iloc[0][column])
                    if column == "decode_sends_abort":
                        grid[r_index, b_index * len(properties) + p_index] = 0.5 if value else 0.0
                    else:
                        grid[r_index, b_index * len(properties) + p_index] = 0.0 if value == good_when_true else 1.0
        if ax is None:
            _, ax = plt.subplots(figsize=(max(8, 0.55 * len(labels)), max(6, 0.24 * len(releases))))
        cmap = ListedColormap(["#7cc48a", "#9ab7de", "#e06666"]).with_extremes(bad="#eeeeee")
        ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        unread = 0
        for b_index, backend in enumerate(chosen):
            for r_index, release in enumerate(releases):
                match = frame[(frame["release"] == release) & (frame["backend"] == backend)]
                if not match.empty and not bool(match.iloc[0]["understood"]):
                    unread += 1
                    for p_index in range(len(properties)):
                        ax.text(b_index * len(properties) + p_index, r_index, "?", ha="center", va="center",
                                fontsize=7, fontweight="bold")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(releases)))
        ax.set_yticklabels(releases, fontsize=7)
        for boundary in range(1, len(chosen)):
            ax.axvline(boundary * len(properties) - 0.5, color="black", linewidth=1)
        window = self.window("nixl") if "nixl" in chosen else []
        title = "sglang PD receiver loops by release (red: exposed, green: safe, blue: decode sends ABORT, grey: absent)"
        if window:
            title += f"\nNIXL prefill killed by the decode's own ABORT: {window[0]} .. {window[-1]}"
        if unread:
            title += f"\n?: {unread} release x backend not read or not understood (see unreadable_rows())"
        ax.set_title(title, fontsize=9)
        ax.figure.tight_layout()
        return ax


# Outcome -> (cell colour, legend word); the heatmap's colours, so the table and plot agree.
OUTCOME_COLOURS = {
    "handled": ("#7cc48a", "handled / survives"),
    "dies": ("#e06666", "thread dies"),
    "dropped": ("#f6b26b", "dropped (logged or silent)"),
    "not sent": ("#9ab7de", "decode does not send ABORT"),
    "unknown": ("#eeeeee", "not read or not understood (?)"),
    "absent": ("#ffffff", "backend not in this release"),
}
MATRIX_BACKENDS = ("nixl", "mooncake", "mori", "ascend")


def _missing(value) -> bool:
    """None or NaN: what a frame holds where the analysis could not vouch for a value."""
    return value is None or (isinstance(value, float) and value != value)


def _abort_outcome(row: dict) -> str:
    if not row.get("understood", True) or row.get("abort_fate") in (NOT_READ, NOT_UNDERSTOOD):
        return "unknown"
    if not row.get("decode_sends_abort"):
        return "not sent"
    if _missing(row.get("abort_kills")) and _missing(row.get("abort_fate")):
        return "unknown"
    kills = row.get("abort_kills")
    if (not _missing(kills) and bool(kills)) or row.get("abort_fate") == DIES:
        return "dies"
    if row.get("abort_fate") == HANDLED or row.get("handles_abort"):
        return "handled"
    return "dropped"


def _unknown_frame_outcome(row: dict) -> str:
    value = row.get("dies_on_unknown")
    if _missing(value) or not row.get("understood", True):
        return "unknown"
    return "dies" if value else "handled"


def _killing_outcome(row: dict) -> str:
    value = row.get("killing_tags")
    if _missing(value) or not row.get("understood", True):
        return "unknown"
    return "dies" if value else "handled"


MATRIX_CELLS = (
    ("ABORT", "the decode's ABORT at the prefill loop", _abort_outcome,
     lambda r: "" if _missing(r.get("abort_fate")) else str(r.get("abort_fate"))),
    ("unknown", "an unknown frame at the prefill loop", _unknown_frame_outcome, lambda r: ""),
    ("kills", "tags its own side sends that kill a loop", _killing_outcome,
     lambda r: "" if _missing(r.get("killing_tags")) else str(r.get("killing_tags"))),
)


def _matrix_layout(result: HandlerMatrix):
    frame = result.frame
    present = set(frame["backend"])
    backends = [b for b in MATRIX_BACKENDS if b in present] + sorted(present - set(MATRIX_BACKENDS))
    rows: dict[str, dict[str, dict]] = {}
    for record in frame.to_dict(orient="records"):
        rows.setdefault(record["release"], {})[record["backend"]] = record
    releases = sorted(rows, key=Version)
    return backends, releases, rows


def matrix_html(result: HandlerMatrix) -> str:
    import html

    backends, releases, rows = _matrix_layout(result)
    left = "text-align:left;white-space:nowrap"
    cell = "width:1.6em;height:1.1em;padding:0 2px;border:1px solid #fff;text-align:center;font-size:10px"
    verdict_colour = "#b06000" if result.verdict == INCONCLUSIVE else "#188038"
    out = [
        f"<div class='pd-release-matrix' style='text-align:left'>"
        f"<p><b style='color:{verdict_colour}'>release matrix: {html.escape(result.verdict)}</b> "
        f"({len(releases)} releases x {len(backends)} backends)<br>"
        f"NIXL prefill killed by the decode's own ABORT: <b>{html.escape(result.window_text('nixl'))}</b></p>",
        "<table style='border-collapse:collapse;font-size:11px'>",
        f"<tr><th style='{left}'></th>"
        + "".join(f"<th colspan='{len(MATRIX_CELLS)}' style='text-align:center;border-left:2px solid #333'>"
                  f"{html.escape(b)}</th>" for b in backends) + "</tr>",
        f"<tr><th style='{left}'>release</th>"
        + "".join(f"<th style='text-align:center;font-weight:normal;font-size:9px"
                  f"{';border-left:2px solid #333' if i == 0 else ''}' title='{html.escape(title)}'>"
                  f"{html.escape(short)}</th>"
                  for _ in backends for i, (short, title, _f, _d) in enumerate(MATRIX_CELLS)) + "</tr>",
    ]
    for release in releases:
        out.append(f"<tr><td style='{left};font-family:monospace;padding-right:8px'>{html.escape(release)}</td>")
        for backend in backends:
            record = rows[release].get(backend)
            for index, (_short, title, outcome_of, detail_of) in enumerate(MATRIX_CELLS):
                outcome = outcome_of(record) if record is not None else "absent"
                colour, word = OUTCOME_COLOURS[outcome]
                mark = "?" if outcome == "unknown" else ""
                tip = f"{release} {backend} {title}: {word}"
                if record is not None and detail_of(record):
                    tip += f" ({detail_of(record)})"
                if record is not None and record.get("unreadable"):
                    tip += f"; not read: {record['unreadable']}"
                edge = ";border-left:2px solid #333" if index == 0 else ""
                out.append(f"<td style='{cell};background:{colour}{edge}' title='{html.escape(tip, quote=True)}'>"
                           f"{mark}</td>")
        out.append("</tr>")
    out.append("</table><p style='text-align:left;font-size:11px'>")
    out.append(" ".join(
        f"<span style='display:inline-block;width:1em;height:1em;background:{colour};border:1px solid #999;"
        f"vertical-align:middle'></span> {html.escape(word)}&nbsp;&nbsp;"
        for colour, word in OUTCOME_COLOURS.values()))
    out.append("<br>columns: " + "; ".join(f"<b>{html.escape(s)}</b>: {html.escape(t)}"
                                           for s, t, _f, _d in MATRIX_CELLS))
    out.append(". The full frame: <code>.frame</code>.</p></div>")
    return "".join(out)


MATRIX_SYMBOLS = {"handled": ("ok", "green"), "dies": ("DIES", "bold red"), "dropped": ("drop", "yellow"),
                  "not sent": ("-", "blue"), "unknown": ("?", "bold magenta"), "absent": ("", "")}


def matrix_renderable(result: HandlerMatrix):
    """The terminal's matrix: verdict and NIXL window first, then one line per release with the
    release name whole (never cut), per backend ABORT / unknown-frame outcomes and killing tags."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    backends, releases, rows = _matrix_layout(result)
    style = "bold yellow" if result.verdict == INCONCLUSIVE else "bold green"
    verdict = Text(f"release matrix: {result.verdict} ({len(releases)} releases x {len(backends)} backends)",
                   style=style)
    window = Text(f"NIXL prefill killed by the decode's own ABORT: {result.window_text('nixl')}", style="bold")
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    table.add_column("release", no_wrap=True, min_width=max((len(r) for r in releases), default=7))
    for backend in backends:
        table.add_column(f"{backend}\nABORT/unk", no_wrap=True)
    for release in releases:
        cells = []
        for backend in backends:
            record = rows[release].get(backend)
            if record is None:
                cells.append(Text(""))
                continue
            text = Text()
            for outcome in (_abort_outcome(record), _unknown_frame_outcome(record)):
                symbol, colour = MATRIX_SYMBOLS[outcome]
                if len(text):
                    text.append("/")
                text.append(symbol, style=colour)
            cells.append(text)
        table.add_row(release, *cells)
    legend = Text("ABORT: what the decode's ABORT does to the prefill loop (-: not sent); unk: an unknown "
                  "frame; ok / drop / DIES / ?: not read. Every column: --json.", style="dim")
    unread = Text()
    for record in result.unreadable_rows().to_dict(orient="records"):
        unread.append(f"? {record['release']} {record['backend']}: {record['unreadable']}\n", style="yellow")
    return Group(verdict, window, table, legend, unread)


def matrix(
    releases: Iterable[str],
    *,
    workers: int | None = None,
    use_cache: bool = True,
    progress: Callable[[str], None] | None = None,
) -> HandlerMatrix:
    """Map every release (fetching wheels as needed) into one frame; ``workers`` processes in parallel."""
    import pandas as pd

    versions = list(releases)
    workers = workers if workers is not None else min(2, os.cpu_count() or 1)
    rows: list[dict] = []
    if workers <= 1 or len(versions) <= 1:
        for version in versions:
            rows.extend(_rows_for(version, use_cache))
            if progress:
                progress(version)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for version, result in zip(versions, pool.map(_rows_for, versions, [use_cache] * len(versions)),
                                       strict=True):
                rows.extend(result)
                if progress:
                    progress(version)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["_order"] = frame["release"].map(Version)
    frame = frame.sort_values(["_order", "backend"]).drop(columns="_order").reset_index(drop=True)
    return HandlerMatrix(frame)
