"""The postmortem as one self-contained HTML file: inline CSS, plots embedded as SVG data."""

from __future__ import annotations

import base64
import html as _html

from forensics.redact import redact_text

from .blocks import PLACEHOLDER_MARK, Bullets, Para, Placeholder, Plot, Sub, Table
from .postmortem import Postmortem

CSS = """
body { font-family: "DejaVu Sans", sans-serif; font-size: 10pt; margin: 1.5em; color: #111; }
h1 { font-size: 16pt; } h2 { font-size: 13pt; border-bottom: 1px solid #999; margin-top: 1.4em; }
h3 { font-size: 11pt; }
table { border-collapse: collapse; margin: 0.4em 0 0.8em 0; }
/* break-word, not anywhere: short cells (backend, tag, fate) keep their words whole; only a token
   too long for a line of its own is broken. */
th, td { border: 1px solid #bbb; padding: 2px 5px; text-align: left; vertical-align: top;
         font-size: 8.5pt; overflow-wrap: break-word; }
th { background: #eee; }
td.mono, li.mono { font-family: "DejaVu Sans Mono", monospace; }
.placeholder { border: 2px dashed #c60; background: #fff6e8; padding: 0.4em 0.8em; margin: 0.5em 0; }
.placeholder .mark { color: #c60; font-weight: bold; }
figure { margin: 0.5em 0; } figure img { max-width: 100%; }
figcaption { font-style: italic; font-size: 9pt; }
@page { size: A4; margin: 1.5cm; }
"""


def _e(value: object) -> str:
    """Text, redacted, then escaped for HTML."""
    return _html.escape(redact_text(" ".join(str(value).split())), quote=True)


def render(pm: Postmortem) -> str:
    out = ['<!DOCTYPE html>', '<html lang="en">', '<head>', '<meta charset="utf-8">',
           f"<title>{_e(pm.title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
           f"<h1>{_e(pm.title)}</h1>", '<table class="facts">']
    out += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pm.facts] + ["</table>"]
    out.append("<nav><p>Contents: " + ", ".join(f'<a href="#{s.key}">{_e(s.title)}</a>' for s in pm.sections)
               + "</p></nav>")
    for section in pm.sections:
        out.append(f'<section id="{section.key}"><h{section.level}>{_e(section.title)}</h{section.level}>')
        for block in section.blocks:
            out.append(_block(block, section.key))
        out.append("</section>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


def _block(block, key: str) -> str:
    if isinstance(block, Para):
        return f"<p>{_e(block.text)}</p>"
    if isinstance(block, Sub):
        return f"<h3>{_e(block.text)}</h3>"
    if isinstance(block, Bullets):
        tag = "ol" if block.numbered else "ul"
        css = ' class="mono"' if key == "kill-chain" else ""
        return f"<{tag}>" + "".join(f"<li{css}>{_e(i)}</li>" for i in block.items) + f"</{tag}>"
    if isinstance(block, Table):
        head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in block.headers) + "</tr>"
        body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in block.rows)
        note = f"<p><em>{_e(block.note)}</em></p>" if block.note else ""
        return f"<table>{head}{body}</table>{note}"
    if isinstance(block, Placeholder):
        facts = ("<p>Facts from the evidence to start from:</p><ul>" + "".join(f"<li>{_e(f)}</li>" for f in block.facts)
                 + "</ul>") if block.facts else "<p>(the evidence backs no fact here)</p>"
        return (f'<div class="placeholder"><p><span class="mark">[{PLACEHOLDER_MARK}]</span> {_e(block.prompt)}</p>'
                f"{facts}</div>")
    if isinstance(block, Plot):
        data = base64.b64encode(redact_text(block.svg).encode("utf-8")).decode("ascii")
        return (f'<figure id="plot-{_e(block.name)}"><img alt="{_e(block.caption)}" '
                f'src="data:image/svg+xml;base64,{data}"><figcaption>{_e(block.caption)}</figcaption></figure>')
    raise TypeError(f"unknown block {block!r}")
