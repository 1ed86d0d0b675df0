"""How handler maps and diffs look: rich renderables for the terminal, HTML for JupyterLab.

The gap rows (a tag one loop handles and the other does not, or any death) are
highlighted in both; the side-by-side source shows the deciding lines of each loop.
Both show the verdict word first and, when anything could not be read or understood,
each such part with its file and line: a partial map never looks complete.
"""

from __future__ import annotations

import html
import textwrap

from forensics.handlers.model import CLEAN, DIES, FINDINGS, HANDLED, NOT_READ, NOT_UNDERSTOOD

FATE_STYLE = {HANDLED: "green", DIES: "bold red", NOT_READ: "bold magenta", NOT_UNDERSTOOD: "bold magenta"}
FATE_COLOUR = {HANDLED: "#e6f4ea", DIES: "#fce8e6", NOT_READ: "#eeeeee", NOT_UNDERSTOOD: "#eeeeee"}
VERDICT_STYLE = {FINDINGS: "bold red", CLEAN: "bold green"}  # inconclusive: bold yellow
VERDICT_COLOUR = {FINDINGS: "#d93025", CLEAN: "#188038"}  # inconclusive: #b06000


def _verdict_text(subject: str, verdict: str, unreadable: list):
    from rich.text import Text

    text = Text(f"{subject}: {verdict}", style=VERDICT_STYLE.get(verdict, "bold yellow"))
    if unreadable:
        text.append(f" ({len(unreadable)} part(s) not read or not understood)", style="bold yellow")
    return text


def _unreadable_text(unreadable: list):
    from rich.text import Text

    text = Text()
    if unreadable:
        text.append("not read or not understood (nothing here is called clean):\n", style="bold yellow")
    for entry in unreadable:
        text.append(f"  [{entry.kind}] {entry}\n", style="yellow")
    return text


def _verdict_html(subject: str, verdict: str, unreadable: list) -> str:
    colour = VERDICT_COLOUR.get(verdict, "#b06000")
    head = f"<p><b style='color:{colour}'>{html.escape(subject)}: {html.escape(verdict)}</b>"
    if unreadable:
        head += f" ({len(unreadable)} part(s) not read or not understood)"
    head += "</p>"
    if unreadable:
        items = "".join(
            f"<li><code>{html.escape(u.where)}</code> [{html.escape(u.kind)}] "
            f"{html.escape(u.backend or 'shared')}: {html.escape(u.reason)}</li>"
            for u in unreadable
        )
        head += f"<div class='pd-unreadable'><b>Not read or not understood</b><ul>{items}</ul></div>"
    return head


def _excerpt(source: str, limit: int | None = None) -> str:
    """The deciding lines, dedented; in the terminal cut to ``limit`` lines."""
    text = textwrap.dedent(source).strip("\n")
    lines = text.splitlines()
    if limit is not None and len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more lines)"]
    return "\n".join(lines)


def _fate_style(fate: str) -> str:
    return FATE_STYLE.get(fate, "yellow")


def _confirmations(diff) -> dict[str, str]:
    """tag -> sandbox word, for the confirmed findings shown beside the static verdict."""
    return {f"{f.backend}:{f.receiver_role}:{f.tag}": f.confirmation for f in diff.findings}


def diff_renderable(diff):
    from rich.console import Group
    from rich.syntax import Syntax
    from rich.table import Table
    from rich.text import Text

    confirmations = _confirmations(diff)
    title = f"sglang {diff.version}: {diff.a} vs {diff.b} receiver loops, aligned by tag"
    table = Table(title=title, show_lines=True, expand=True)
    table.add_column("role / tag", style="bold", no_wrap=True)
    table.add_column(diff.a, ratio=1)
    table.add_column(diff.b, ratio=1)
    for row in diff.rows:
        cells = []
        for name in (diff.a, diff.b):
            cell = row.cells[name]
            text = Text(cell.fate, style=_fate_style(cell.fate))
            if cell.fate == HANDLED and cell.summary:
                text.append(f" - {cell.summary}")
            elif cell.detail:
                text.append(f" - {cell.detail}")
            text.append(f"\n{cell.location}", style="dim")
            if not cell.sent:
                text.append("  (never sent by this backend)", style="dim")
            confirmation = confirmations.get(f"{name}:{row.role}:{row.tag}")
            if cell.fate == DIES and confirmation:
                text.append(f"\nstatic: dies; sandbox: {confirmation}", style="bold")
            parts = [text]
            if cell.source:
                parts.append(Syntax(_excerpt(cell.source, 10), "python", word_wrap=True, theme="ansi_dark"))
            cells.append(Group(*parts))
        label = Text(f"{row.role}\n{row.tag}" + ("\nGAP" if row.gap else ""), style="bold red" if row.gap else "bold")
        table.add_row(label, *cells)
    notes = []
    for name in (diff.a, diff.b):
        for role, protection in diff.protection.get(name, {}).items():
            notes.append(
                f"{name} {role}: daemon={protection['daemon']}, wrapper={protection['wrapper']}, "
                f"per-message try={protection['per_message_try']}, started at {protection['started_at']}"
            )
    verdict = _verdict_text(f"sglang {diff.version} {diff.a} vs {diff.b}", diff.verdict, diff.unreadable)
    headline = Text("\n".join(f"- {sentence}" for sentence in diff.headline()), style="bold")
    return Group(verdict, headline, table, _unreadable_text(diff.unreadable), Text("\n".join(notes), style="dim"))


# JupyterLab's table CSS right-aligns cells (``.jp-RenderedHTMLCommon td {text-align: right}``):
# every cell and excerpt says its alignment inline, which no stylesheet overrides.
LEFT = "text-align:left;vertical-align:top"
CODE = "text-align:left;margin:4px 0;white-space:pre-wrap;font-family:monospace"


def _headline_html(diff) -> str:
    colour = VERDICT_COLOUR.get(diff.verdict, "#b06000")
    items = "".join(f"<li>{html.escape(sentence)}</li>" for sentence in diff.headline())
    return (f"<div class='pd-findings' style='{LEFT};border-left:4px solid {colour};padding:2px 8px'>"
            f"<b>Findings</b><ul style='margin:2px 0'>{items}</ul></div>")


def diff_html(diff) -> str:
    confirmations = _confirmations(diff)
    out = [
        f"<div class='pd-handler-diff' style='{LEFT}'>",
        "<style>.pd-handler-diff td, .pd-handler-diff th, .pd-handler-diff pre {text-align:left !important}</style>",
        _verdict_html(f"sglang {diff.version} {diff.a} vs {diff.b}", diff.verdict, diff.unreadable),
        _headline_html(diff),
        f"<h4 style='{LEFT}'>sglang {html.escape(diff.version)}: {html.escape(diff.a)} vs {html.escape(diff.b)} "
        "receiver loops, aligned by tag (GAP: a frame one backend really gets and does not handle, which the "
        "other treats differently)</h4>",
        "<table style='border-collapse:collapse;width:100%;font-size:12px;table-layout:fixed'>",
        f"<tr><th style='{LEFT};width:18%'>role / tag</th>"
        f"<th style='{LEFT}'>{html.escape(diff.a)}</th><th style='{LEFT}'>{html.escape(diff.b)}</th></tr>",
    ]
    for row in diff.rows:
        border = "3px solid #d93025" if row.gap else "1px solid #ddd"
        out.append(f"<tr style='border:{border};vertical-align:top'>")
        gap_mark = " <b style='color:#d93025'>GAP</b>" if row.gap else ""
        out.append(f"<td style='{LEFT}'><b>{html.escape(row.role)}</b><br><code>{html.escape(row.tag)}</code>"
                   f"{gap_mark}<br><small>sent by: {html.escape(', '.join(row.senders))}</small></td>")
        for name in (diff.a, diff.b):
            cell = row.cells[name]
            colour = FATE_COLOUR.get(cell.fate, "#fef7e0")
            words = html.escape(cell.summary if cell.fate == HANDLED and cell.summary else cell.detail)
            confirmation = confirmations.get(f"{name}:{row.role}:{row.tag}")
            confirmed = ""
            if cell.fate == DIES and confirmation:
                confirmed = f"<br><b>static: dies; sandbox: {html.escape(confirmation)}</b>"
            never = "<br><small>(never sent by this backend)</small>" if not cell.sent else ""
            source = f"<pre style='{CODE}'>{html.escape(_excerpt(cell.source))}</pre>" if cell.source else ""
            out.append(
                f"<td style='{LEFT};background:{colour}'><b>{html.escape(cell.fate)}</b> {words}"
                f"<br><small>{html.escape(cell.location)}</small>{never}{confirmed}{source}</td>"
            )
        out.append("</tr>")
    out.append("</table><ul>")
    for name in (diff.a, diff.b):
        for role, protection in diff.protection.get(name, {}).items():
            out.append(
                f"<li>{html.escape(name)} {role}: daemon={protection['daemon']}, "
                f"wrapper={html.escape(str(protection['wrapper']))}, per-message try={protection['per_message_try']}, "
                f"started at <code>{html.escape(protection['started_at'])}</code></li>"
            )
    out.append("</ul></div>")
    return "".join(out)


def map_renderable(handler_map):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"sglang {handler_map.version}: receiver loops", show_lines=False)
    for column in ("backend", "role", "loop", "understood", "dispatch (in order)", "unknown frame", "daemon",
                   "wrapper", "try"):
        table.add_column(column)
    for backend in handler_map.backends.values():
        for loop in backend.loops:
            dispatch = " > ".join("/".join(b.tags) or b.kind for b in loop.branches)
            worst = loop.foreign if loop.foreign.kills else loop.foreign_short
            table.add_row(
                backend.backend + (f" (from {loop.inherited_from})" if loop.inherited_from else ""),
                loop.role,
                f"{loop.file}:{loop.line}",
                Text("yes", style="green") if loop.understood else Text("NO", style="bold yellow"),
                dispatch,
                Text(worst.fate, style=_fate_style(worst.fate)),
                str(loop.daemon),
                loop.wrapper,
                str(loop.per_message_try),
            )
    for name in sorted({u.backend for u in handler_map.unreadable if u.backend and u.backend not in handler_map.backends}):
        first = next(u for u in handler_map.unreadable if u.backend == name)
        table.add_row(name, "", first.where, Text("NOT READ", style="bold magenta"), first.reason, "", "", "", "")
    findings = handler_map.findings
    lines = Text()
    for finding in findings:
        lines.append(f"[{finding.severity}] ", style="bold red" if finding.severity == "critical" else "yellow")
        lines.append(finding.summary + "\n")
        if finding.caveat:
            lines.append(f"    (not decisive: {finding.caveat})\n", style="yellow")
    for gap in _gaps_not_unreadable(handler_map):
        lines.append(f"[gap] {gap}\n", style="dim")
    verdict = _verdict_text(f"sglang {handler_map.version} ({handler_map.root})", handler_map.verdict,
                            handler_map.unreadable)
    return Group(verdict, table, _unreadable_text(handler_map.unreadable), lines)


def _gaps_not_unreadable(handler_map) -> list:
    """Gaps not already listed as unreadable (a parse error is both)."""
    said = {(u.file, u.reason) for u in handler_map.unreadable}
    return [g for g in handler_map.gaps if (g.file, g.reason) not in said]


def map_html(handler_map) -> str:
    rows = []
    for backend in handler_map.backends.values():
        for loop in backend.loops:
            worst = loop.foreign if loop.foreign.kills else loop.foreign_short
            dispatch = " &gt; ".join(html.escape("/".join(b.tags) or b.kind) for b in loop.branches)
            understood = "yes" if loop.understood else "<b style='color:#b06000'>NO</b>"
            rows.append(
                f"<tr><td>{html.escape(backend.backend)}</td><td>{loop.role}</td>"
                f"<td><code>{html.escape(loop.file)}:{loop.line}</code></td><td>{understood}</td><td>{dispatch}</td>"
                f"<td style='background:{FATE_COLOUR.get(worst.fate, '#fef7e0')}'>{html.escape(worst.fate)}</td>"
                f"<td>{loop.daemon}</td><td>{html.escape(loop.wrapper)}</td><td>{loop.per_message_try}</td></tr>"
            )
    for name in sorted({u.backend for u in handler_map.unreadable if u.backend and u.backend not in handler_map.backends}):
        first = next(u for u in handler_map.unreadable if u.backend == name)
        rows.append(
            f"<tr><td>{html.escape(name)}</td><td></td><td><code>{html.escape(first.where)}</code></td>"
            f"<td style='background:#eeeeee'><b>NOT READ</b></td><td colspan='5'>{html.escape(first.reason)}</td></tr>"
        )
    findings = "".join(
        f"<li><b>{html.escape(f.severity)}</b> {html.escape(f.summary)}"
        + (f" <i>(not decisive: {html.escape(f.caveat)})</i>" if f.caveat else "") + "</li>"
        for f in handler_map.findings
    )
    gaps = "".join(f"<li><i>gap</i> {html.escape(str(g))}</li>" for g in _gaps_not_unreadable(handler_map))
    verdict = _verdict_html(f"sglang {handler_map.version} ({handler_map.root})", handler_map.verdict,
                            handler_map.unreadable)
    return (
        f"<h4>sglang {html.escape(handler_map.version)}: receiver loops</h4>{verdict}"
        "<style>.pd-handler-map td, .pd-handler-map th {text-align:left !important}</style>"
        "<table class='pd-handler-map'>"
        "<tr><th>backend</th><th>role</th><th>loop</th><th>understood</th><th>dispatch</th><th>unknown frame</th>"
        f"<th>daemon</th><th>wrapper</th><th>try</th></tr>{''.join(rows)}</table><ul>{findings}{gaps}</ul>"
    )
