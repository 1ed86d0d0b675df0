"""How an :class:`~forensics.evidence.Evidence` shows itself: JupyterLab HTML and a rich renderable.

What a responder looks at first: which deployment, when it was collected and over which window,
the engines, every frame with its row count (and those never collected), and the gaps, each with
its reason and fix, highlighted because a missing piece is what can make a verdict INCONCLUSIVE.
Every text passes through :func:`~forensics.redact.redact_text` (collectors redact already; a
display must not be the place where something slips through) and, in HTML, ``html.escape``.
"""

from __future__ import annotations

import html
from typing import Any

from forensics.redact import redact_text

# The functions take an Evidence and read only its attributes (deployment, frames, gaps,
# window, collected_at, known_frames): this module sits below forensics.evidence, which
# imports it for its displays, so it never imports that module back.
Evidence = Any

_CELL = "text-align:left;vertical-align:top;padding:1px 8px"
_GAP_ROW = "background:#fdd"  # nothing of the piece was read
_PARTIAL_ROW = "background:#fff3cd"  # some of it was read and kept


def _text(value: Any) -> str:
    return "" if value is None else redact_text(str(value))


def _e(value: Any) -> str:
    return html.escape(_text(value), quote=True)


def headline(evidence: Evidence) -> str:
    """``Evidence 'pd-prod-7' (sglang 0.5.15, nixl)``."""
    deployment = evidence.deployment
    about = [f"sglang {_text(deployment['sglang'])}"] if deployment.get("sglang") else []
    about += [_text(deployment["backend"])] if deployment.get("backend") else []
    text = f"Evidence {_text(deployment.get('name') or 'unnamed')!r}"
    return text + (f" ({', '.join(about)})" if about else "")


def when_text(evidence: Evidence) -> str:
    """When it was collected and the window the logs and history cover (ISO UTC, as recorded)."""
    since, until = evidence.window.get("since"), evidence.window.get("until")
    return (f"collected {_text(evidence.collected_at or 'at an unknown time')}; window "
            f"{_text(since or 'from the start of each log')} to {_text(until or 'the collection')}")


def engine_rows(evidence: Evidence) -> list[tuple[str, str, str, str]]:
    """(name, role, host, url) per engine: the engines frame, else the deployment's list."""
    frame = evidence.frames.get("engines")
    if frame is not None and len(frame):
        records = frame.to_dict(orient="records")
    else:
        records = list(evidence.deployment.get("engines") or [])
    return [tuple(_text(record.get(key)) for key in ("name", "role", "host", "url")) for record in records]


def frame_rows(evidence: Evidence) -> list[tuple[str, int]]:
    """(frame name, row count) for every collected frame: the documented ones first, in their order."""
    known = evidence.known_frames
    names = [name for name in known if name in evidence.frames]
    names += sorted(name for name in evidence.frames if name not in known)
    return [(name, len(evidence.frames[name])) for name in names if evidence.frames[name] is not None]


def missing_frames(evidence: Evidence) -> list[str]:
    return [name for name in evidence.known_frames if evidence.frames.get(name) is None]


def gaps_title(evidence: Evidence) -> str:
    count = len(evidence.gaps)
    if not count:
        return "no gaps: every piece asked for was read"
    return f"{count} gap(s): evidence that could not be read (a verdict may be INCONCLUSIVE for it)"


def to_html(evidence: Evidence) -> str:
    def table(head: tuple[str, ...], rows: list[tuple[list[str], str]]) -> str:
        header = "".join(f"<th style='{_CELL}'>{html.escape(h)}</th>" for h in head)
        body = "".join(f"<tr{f' style={style!r}' if style else ''}>"
                       + "".join(f"<td style='{_CELL}'>{c}</td>" for c in cells) + "</tr>" for cells, style in rows)
        return f"<table style='border-collapse:collapse'><tr>{header}</tr>{body}</table>"

    parts = [f"<b>{_e(headline(evidence))}</b>", f"<div><small>{_e(when_text(evidence))}"]
    inventory = evidence.deployment.get("inventory")
    if inventory:
        parts.append(f"; inventory <code>{_e(inventory)}</code>")
    parts.append(f"; {len(evidence.commands)} command(s) run</small></div>")
    engines = engine_rows(evidence)
    if engines:
        parts.append("<div><b>Engines</b></div>" + table(
            ("name", "role", "host", "url"),
            [([_e(name), _e(role), _e(host), f"<code>{_e(url)}</code>"], "") for name, role, host, url in engines]))
    frames = frame_rows(evidence)
    parts.append("<div><b>Frames</b></div>" + table(
        ("frame", "rows"), [([f"<code>{_e(name)}</code>", str(rows)], "") for name, rows in frames]))
    missing = missing_frames(evidence)
    if missing:
        parts.append(f"<div><small>not collected: {_e(', '.join(missing))}</small></div>")
    colour = "#d93025" if evidence.gaps else "#188038"
    parts.append(f"<div><b style='color:{colour}'>{_e(gaps_title(evidence))}</b></div>")
    if evidence.gaps:
        parts.append(table(
            ("piece", "target", "reason", "fix", "read"),
            [([_e(gap.piece), _e(gap.target), f"<b>{_e(gap.reason)}</b>", _e(gap.fix),
               "partly" if gap.partial else "nothing"], _PARTIAL_ROW if gap.partial else _GAP_ROW)
             for gap in evidence.gaps]))
    return f"<div class='pd-evidence' style='text-align:left'>{''.join(parts)}</div>"


def renderable(evidence: Evidence):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list = [Text(headline(evidence), style="bold"), Text(when_text(evidence), style="dim")]
    engines = engine_rows(evidence)
    if engines:
        table = Table(box=None, padding=(0, 1), header_style="bold", title="engines", title_justify="left")
        for column in ("name", "role", "host", "url"):
            table.add_column(column, no_wrap=column in ("name", "role"))
        for row in engines:
            table.add_row(*row)
        parts.append(table)
    frames = Table(box=None, padding=(0, 1), header_style="bold", title="frames", title_justify="left")
    frames.add_column("frame", no_wrap=True)
    frames.add_column("rows", justify="right")
    for name, rows in frame_rows(evidence):
        frames.add_row(name, str(rows))
    parts.append(frames)
    parts.append(Text(gaps_title(evidence), style="bold red" if evidence.gaps else "green"))
    for gap in evidence.gaps:
        parts.append(Text(f"  {'partial ' if gap.partial else ''}{_text(gap)}",
                          style="yellow" if gap.partial else "red"))
    return Group(*parts)
