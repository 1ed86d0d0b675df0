"""The verdict as a terminal shows it by default: what it is in the first lines, then one line per
source, the kill chain once, the next steps, in at most ``MAX_LINES`` lines at 80 columns.

The full panel (every reason, every signal's sentence, every gap) is ``diagnose --verbose``; the
JSON has all of it. The verdict's reasons for WEDGED repeat its signals, which the kill chain
says in order, so the terse view says each fact once: a source's line names its signals, the
kill chain tells the story, the next steps say what to do.
"""

from __future__ import annotations

import textwrap

from .signals import SOURCES

MAX_LINES = 24  # non-blank lines at 80 columns (issue: a 40-row terminal keeps the verdict on screen)


def terse_lines(verdict, width: int = 80, head_style: str = "bold") -> list[tuple[str, str]]:
    """(text, rich style) per line, each at most ``width`` characters; the verdict's line in ``head_style``."""
    width = max(40, width)
    head = verdict.verdict + (f"  {verdict.deployment}" if verdict.deployment else "")
    head += f"  (exit {int(verdict.exit_status)})"
    out: list[tuple[str, str]] = [(_cut(head, width), head_style)]
    # WEDGED's reasons after the first are its signals' sentences, DOWN's are its kill chain: said below.
    reasons = verdict.reasons[:1] if verdict.verdict == "WEDGED" else [
        r for r in verdict.reasons if r not in verdict.kill_chain][:3]
    for reason in reasons:
        out += [(line, "") for line in _clip(reason, width, 2, indent="  ")]
    out.append(("Sources", "bold"))
    out += [(line, "") for line in _source_lines(verdict, width)]
    steps = verdict.kill_chain
    if steps:
        out.append(("Kill chain", "bold"))
        per_step = 2 if len(steps) <= 4 else 1
        for i, step in enumerate(steps, 1):
            out += [(line, "") for line in _clip(f"{i}. {step}", width, per_step, indent="  ", hang="     ")]
    if verdict.next_steps:
        out.append(("Next", "bold"))
        budget = MAX_LINES - len(out) - 1 - 1  # the header above, the closing hint below
        per_step = max(1, min(3, budget // max(1, len(verdict.next_steps))))
        for i, step in enumerate(verdict.next_steps, 1):
            out += [(line, "") for line in _clip(f"{i}. {step}", width, per_step, indent="  ", hang="     ")]
    out.append((_cut("every reason, signal and gap: --verbose; all of it: --json", width), "dim"))
    return out


def _source_lines(verdict, width: int) -> list[str]:
    """One line per source: the signals it gave (by name and engine), or why it gave none."""
    lines = []
    for source in SOURCES:
        found = [s for s in verdict.signals if s.source == source and s.kind != "context"]
        gaps = [g for g in verdict.gaps if g.piece == source]
        if found:
            names = list(dict.fromkeys(f"{s.name} ({s.engine})" for s in found))
            text = f"{_worst_kind(found)} " + ", ".join(names)
        elif gaps:
            text = f"not read: {gaps[0].reason}" + (f" (+{len(gaps) - 1} more)" if len(gaps) > 1 else "")
        elif any(s.source == source for s in verdict.signals):
            text = "history only (before the current processes)"
        elif source not in verdict.sources_read:
            text = "not collected"
        else:
            text = "nothing found" if source != "processes" else "every engine process running"
        lines.append(_cut(f"  {source:<9} {text}", width))
    return lines


def _worst_kind(signals) -> str:
    """The worst kind among a source's signals, as the line's first word."""
    for kind in ("down", "wedge", "degraded", "healthy"):
        if any(s.kind == kind for s in signals):
            return kind + ":"
    return ""


def _clip(text: str, width: int, lines: int, *, indent: str = "", hang: str | None = None) -> list[str]:
    """``text`` wrapped to ``width`` in at most ``lines`` lines, the last cut with an ellipsis."""
    wrapped = textwrap.wrap(" ".join(text.split()), width=width, initial_indent=indent,
                            subsequent_indent=hang if hang is not None else indent,
                            break_long_words=True, break_on_hyphens=False)
    if len(wrapped) <= lines:
        return wrapped
    kept = wrapped[:lines]
    kept[-1] = (kept[-1] + " " + wrapped[lines].strip())[: width - 1] + "…"  # some of what is cut, then "…"
    return kept


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
