"""How handler maps and diffs look: rich renderables for the terminal, HTML for JupyterLab.

The gap rows (a tag one loop handles and the other does not, or any death) are
highlighted in both; the side-by-side source shows the deciding lines of each loop.
"""

from __future__ import annotations

import html
import textwrap

from forensics.handlers.model import DIES, HANDLED

FATE_STYLE = {HANDLED: "green", DIES: "bold red"}
FATE_COLOUR = {HANDLED: "#e6f4ea", DIES: "#fce8e6"}


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
        label = Text(f"{row.role}\n{row.tag}", style="bold red" if row.gap else "bold")
        table.add_row(label, *cells)
    notes = []
    for name in (diff.a, diff.b):
        for role, protection in diff.protection.get(name, {}).items():
            notes.append(
                f"{name} {role}: daemon={protection['daemon']}, wrapper={protection['wrapper']}, "
                f"per-message try={protection['per_message_try']}, started at {protection['started_at']}"
            )
    return Group(table, Text("\n".join(notes), style="dim"))


def diff_html(diff) -> str:
    confirmations = _confirmations(diff)
    out = [
        "<div class='pd-handler-diff'>",
        f"<h4>sglang {html.escape(diff.version)}: {html.escape(diff.a)} vs {html.escape(diff.b)} "
        "receiver loops, aligned by tag</h4>",
        "<table style='border-collapse:collapse;width:100%;font-size:12px'>",
        "<tr><th style='text-align:left'>role / tag</th>"
        f"<th style='text-align:left'>{html.escape(diff.a)}</th><th style='text-align:left'>{html.escape(diff.b)}</th></tr>",
    ]
    for row in diff.rows:
        border = "3px solid #d93025" if row.gap else "1px solid #ddd"
        out.append(f"<tr style='border:{border};vertical-align:top'>")
        gap_mark = " <b style='color:#d93025'>GAP</b>" if row.gap else ""
        out.append(f"<td><b>{html.escape(row.role)}</b><br><code>{html.escape(row.tag)}</code>{gap_mark}<br>"
                   f"<small>sent by: {html.escape(', '.join(row.senders))}</small></td>")
        for name in (diff.a, diff.b):
            cell = row.cells[name]
            colour = FATE_COLOUR.get(cell.fate, "#fef7e0")
            words = html.escape(cell.summary if cell.fate == HANDLED and cell.summary else cell.detail)
            confirmation = confirmations.get(f"{name}:{row.role}:{row.tag}")
            confirmed = ""
            if cell.fate == DIES and confirmation:
                confirmed = f"<br><b>static: dies; sandbox: {html.escape(confirmation)}</b>"
            never = "<br><small>(never sent by this backend)</small>" if not cell.sent else ""
            source = f"<pre style='margin:4px 0;white-space:pre-wrap'>{html.escape(_excerpt(cell.source))}</pre>" if cell.source else ""
            out.append(
                f"<td style='background:{colour}'><b>{html.escape(cell.fate)}</b> {words}"
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
    for column in ("backend", "role", "loop", "dispatch (in order)", "unknown frame", "daemon", "wrapper", "try"):
        table.add_column(column)
    for backend in handler_map.backends.values():
        for loop in backend.loops:
            dispatch = " > ".join("/".join(b.tags) or b.kind for b in loop.branches)
            worst = loop.foreign if loop.foreign.kills else loop.foreign_short
            table.add_row(
                backend.backend + (f" (from {loop.inherited_from})" if loop.inherited_from else ""),
                loop.role,
                f"{loop.file}:{loop.line}",
                dispatch,
                Text(worst.fate, style=_fate_style(worst.fate)),
                str(loop.daemon),
                loop.wrapper,
                str(loop.per_message_try),
            )
    findings = handler_map.findings
    lines = Text()
    for finding in findings:
        lines.append(f"[{finding.severity}] ", style="bold red" if finding.severity == "critical" else "yellow")
        lines.append(finding.summary + "\n")
    for gap in handler_map.gaps:
        lines.append(f"[gap] {gap}\n", style="dim")
    return Group(table, lines)


def map_html(handler_map) -> str:
    rows = []
    for backend in handler_map.backends.values():
        for loop in backend.loops:
            worst = loop.foreign if loop.foreign.kills else loop.foreign_short
            dispatch = " &gt; ".join(html.escape("/".join(b.tags) or b.kind) for b in loop.branches)
            rows.append(
                f"<tr><td>{html.escape(backend.backend)}</td><td>{loop.role}</td>"
                f"<td><code>{html.escape(loop.file)}:{loop.line}</code></td><td>{dispatch}</td>"
                f"<td style='background:{FATE_COLOUR.get(worst.fate, '#fef7e0')}'>{html.escape(worst.fate)}</td>"
                f"<td>{loop.daemon}</td><td>{html.escape(loop.wrapper)}</td><td>{loop.per_message_try}</td></tr>"
            )
    findings = "".join(
        f"<li><b>{html.escape(f.severity)}</b> {html.escape(f.summary)}</li>" for f in handler_map.findings
    )
    gaps = "".join(f"<li><i>gap</i> {html.escape(str(g))}</li>" for g in handler_map.gaps)
    return (
        f"<h4>sglang {html.escape(handler_map.version)}: receiver loops</h4><table>"
        "<tr><th>backend</th><th>role</th><th>loop</th><th>dispatch</th><th>unknown frame</th><th>daemon</th>"
        f"<th>wrapper</th><th>try</th></tr>{''.join(rows)}</table><ul>{findings}{gaps}</ul>"
    )
