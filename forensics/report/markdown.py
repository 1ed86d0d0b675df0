"""The postmortem as Markdown (GitHub-flavoured tables); plots are files beside it under ``plots/``."""

from __future__ import annotations

from forensics.redact import redact_text

from .blocks import PLACEHOLDER_MARK, Bullets, Para, Placeholder, Plot, Sub, Table
from .postmortem import Postmortem


def _t(value: object) -> str:
    """One line of text, redacted."""
    return redact_text(" ".join(str(value).split()))


def _cell(value: object) -> str:
    return _t(value).replace("|", "\\|") or " "


def render(pm: Postmortem) -> tuple[str, dict[str, str]]:
    """The Markdown text and the plot files it links (relative path to SVG text)."""
    out: list[str] = [f"# {_t(pm.title)}", ""]
    out += ["| | |", "|---|---|"] + [f"| {_cell(k)} | {_cell(v)} |" for k, v in pm.facts] + [""]
    out += ["Contents: " + ", ".join(f"[{_t(s.title)}](#{s.key})" for s in pm.sections), ""]
    files: dict[str, str] = {}
    for section in pm.sections:
        out += [f'<a id="{section.key}"></a>', "", f"{'#' * section.level} {_t(section.title)}", ""]
        for block in section.blocks:
            if isinstance(block, Para):
                out += [_t(block.text), ""]
            elif isinstance(block, Sub):
                out += [f"### {_t(block.text)}", ""]
            elif isinstance(block, Bullets):
                out += [f"{i}. {_t(item)}" if block.numbered else f"- {_t(item)}"
                        for i, item in enumerate(block.items, 1)] + [""]
            elif isinstance(block, Table):
                out += ["| " + " | ".join(_cell(h) for h in block.headers) + " |",
                        "|" + "---|" * len(block.headers)]
                out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in block.rows]
                out += [""] + ([f"_{_t(block.note)}_", ""] if block.note else [])
            elif isinstance(block, Placeholder):
                out += [f"> **[{PLACEHOLDER_MARK}]** {_t(block.prompt)}", ">"]
                if block.facts:
                    out += ["> Facts from the evidence to start from:", ">"]
                    out += [f"> - {_t(fact)}" for fact in block.facts]
                else:
                    out += ["> (the evidence backs no fact here)"]
                out += [""]
            elif isinstance(block, Plot):
                path = f"plots/{block.name}.svg"
                files[path] = redact_text(block.svg)
                out += [f"![{_t(block.caption)}]({path})", "", f"_Figure: {_t(block.caption)}_", ""]
    text = "\n".join(out).rstrip("\n") + "\n"
    return redact_text(text), files
